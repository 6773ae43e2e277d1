"""What the per-CTA timeline probes share (``probe_gemm_timeline.py``,
``probe_decode_timeline.py``): the device functions that read the global timer and the SM, and
the summary of an event's times across CTAs."""
import statistics

CLOCK = """__device__ __forceinline__ unsigned long long tf_gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned tf_smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
"""


def print_quantiles(name: str, values, t0: int, width: int = 14) -> None:
    """One line: the least, median and greatest of ``values`` (ns timer reads; 0: not read) in
    µs from ``t0``."""
    us = sorted((v - t0) / 1e3 for v in values if v)
    if us:
        print(f"  {name:{width}s} min {us[0]:7.2f}  median {statistics.median(us):7.2f}  "
              f"max {us[-1]:7.2f}")
