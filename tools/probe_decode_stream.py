"""What it takes to stream decode's keys and values at the copy ceiling (issue 18's B=4 bar).

The cluster decode kernel streams each (batch, kv-head) pair's keys and values, split over a
cluster, in blocks of 32 rows per warp. At B=4 (32 pairs) it runs 64 CTAs (clusters of 2: 32
clusters of 4 do not fit at once) and reaches ~2.65 TB/s where the split update reaches ~2.97.
This probe runs the kernel's access pattern with nothing else — no scores, no merge — for
several ways of copying a block and several grids, so that what limits the stream shows apart
from what the kernel computes:

- ``cp.async``: 16-byte copies by every lane (the kernel's copies today);
- ``bulk/row``: one bulk copy (``cp.async.bulk``, the TMA unit) per 256-byte row, each lane
  one row, counted on an mbarrier (keeps the kernel's skewed rows);
- ``bulk/block``: one bulk copy per 8 KB block of keys and one of values, issued by one lane.

Each CTA records its start and end (``%globaltimer``) and its SM, so that a grid's time can be
told apart into the CTAs' own times and their spread.

    python tools/probe_decode_stream.py [--csv PATH]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics

import torch

from benchmarks.common import bench_graph
from tensorfuse.targets import get_target
from tensorfuse.targets.cuda.dsm import HELPERS as DSM_HELPERS
from tensorfuse.targets.cuda.module import DriverLaunch
from tensorfuse.targets.cuda.tma import BULK_HELPERS, MBARRIER_HELPERS

MODES = {"cp.async": 0, "bulk/row": 1, "bulk/block": 2}
ROW_BYTES, KEYS = 256, 32768          # D = 128 bf16; keys per pair


def source(mode: int, warps: int, stages: int) -> str:
    """The streaming kernel ``tf_stream``: grid pairs × cluster, ``warps`` warps a CTA."""
    return f"""#include <cuda_bf16.h>
{DSM_HELPERS}{MBARRIER_HELPERS}{BULK_HELPERS}
#define WARPS {warps}
#define STAGES {stages}
#define MODE {mode}
#define ROWB {ROW_BYTES}
#define RS (MODE == 2 ? ROWB : ROWB + 16)   // a row's stride in shared memory
#define BLK (32 * RS)

__device__ __forceinline__ unsigned long long now() {{
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
tf_stream(const char* __restrict__ k, const char* __restrict__ v, unsigned* __restrict__ sink,
          unsigned long long* __restrict__ times, int n, int cluster) {{
  extern __shared__ __align__(128) char dsmem[];
  __shared__ __align__(8) unsigned long long bars[WARPS][STAGES];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int pair = blockIdx.x / cluster, rank = blockIdx.x % cluster;
  const int chunk = ((n + cluster - 1) / cluster + 31) / 32 * 32;
  const int j_begin = rank * chunk, j_end = min(n, j_begin + chunk);
  const char* kb = k + (long)pair * n * ROWB;
  const char* vb = v + (long)pair * n * ROWB;
  char* kbuf = dsmem + warp * STAGES * 2 * BLK;
  char* vbuf = kbuf + STAGES * BLK;
  if (lane == 0)
    for (int s = 0; s < STAGES; ++s) tf_mbar_init(&bars[warp][s], 1);
  tf_mbar_init_fence();
  __syncthreads();
  const unsigned long long t0 = now();
  auto load = [&](int s, int j0) {{
#if MODE == 0
    #pragma unroll
    for (int p = lane; p < 32 * ROWB / 16; p += 32) {{
      const int r = p / (ROWB / 16), c = p % (ROWB / 16);
      tf_cp_async16_l2(kbuf + s * BLK + r * RS + c * 16, kb + (long)(j0 + r) * ROWB + c * 16);
      tf_cp_async16_l2(vbuf + s * BLK + r * RS + c * 16, vb + (long)(j0 + r) * ROWB + c * 16);
    }}
    tf_cp_async_commit();
#elif MODE == 1
    if (lane == 0) tf_mbar_expect(&bars[warp][s], 2 * 32 * ROWB);
    __syncwarp();
    tf_bulk_load(kbuf + s * BLK + lane * RS, kb + (long)(j0 + lane) * ROWB, ROWB, &bars[warp][s]);
    tf_bulk_load(vbuf + s * BLK + lane * RS, vb + (long)(j0 + lane) * ROWB, ROWB, &bars[warp][s]);
#else
    if (lane == 0) {{
      tf_mbar_expect(&bars[warp][s], 2 * 32 * ROWB);
      tf_bulk_load(kbuf + s * BLK, kb + (long)j0 * ROWB, 32 * ROWB, &bars[warp][s]);
      tf_bulk_load(vbuf + s * BLK, vb + (long)j0 * ROWB, 32 * ROWB, &bars[warp][s]);
    }}
#endif
  }};
  const int j_first = j_begin + warp * 32, j_step = WARPS * 32;
  #pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {{
    if (j_first + s * j_step < j_end) load(s, j_first + s * j_step);
#if MODE == 0
    else tf_cp_async_commit();
#endif
  }}
  unsigned acc = 0;
  int it = 0;
  for (int j0 = j_first; j0 < j_end; j0 += j_step, ++it) {{
    const int j_ahead = j0 + (STAGES - 1) * j_step;
    if (j_ahead < j_end) load((it + STAGES - 1) % STAGES, j_ahead);
#if MODE == 0
    else tf_cp_async_commit();
    tf_cp_async_wait<STAGES - 1>();
    __syncwarp();
#else
    tf_mbar_wait(&bars[warp][it % STAGES], (it / STAGES) & 1);
#endif
    // read the block once, as the kernel's scores and weighted sums do
    const char* kk = kbuf + (it % STAGES) * BLK;
    const char* vv = vbuf + (it % STAGES) * BLK;
    #pragma unroll 4
    for (int p = lane; p < 32 * ROWB / 16; p += 32) {{
      const int r = p / (ROWB / 16), c = p % (ROWB / 16);
      const uint4 a = *reinterpret_cast<const uint4*>(kk + r * RS + c * 16);
      const uint4 b = *reinterpret_cast<const uint4*>(vv + r * RS + c * 16);
      acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
    }}
    __syncwarp();
  }}
  __syncthreads();
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x == 0) {{
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    times[3 * blockIdx.x] = t0;
    times[3 * blockIdx.x + 1] = now();
    times[3 * blockIdx.x + 2] = smid;
  }}
}}
"""


def shared_bytes(mode: int, warps: int, stages: int) -> int:
    row = ROW_BYTES if mode == 2 else ROW_BYTES + 16
    return warps * stages * 2 * 32 * row


class Stream:
    """One compiled streaming kernel, launched with clusters through the driver (not as a
    programmatic dependent)."""

    def __init__(self, mode: int, warps: int, stages: int):
        self.warps, self.smem = warps, shared_bytes(mode, warps, stages)
        self.launch = DriverLaunch(source(mode, warps, stages), get_target("cuda:sm_90a"),
                                   "tf_stream", ("handle",) * 4 + ("int32",) * 2)

    def __call__(self, k, v, sink, times, pairs: int, cluster: int) -> None:
        self.launch([*(ctypes.c_void_p(t.data_ptr()) for t in (k, v, sink, times)), k.shape[1],
                     cluster], pairs * cluster, self.warps * 32, cluster, self.smem, k.device)


def spread(times: torch.Tensor) -> tuple[float, float, float, float, int]:
    """(grid µs from first start to last end, CTA µs min / median / max, distinct SMs)."""
    t = times.view(-1, 3).cpu().tolist()
    start, end = min(r[0] for r in t), max(r[1] for r in t)
    own = [(r[1] - r[0]) / 1e3 for r in t]
    return ((end - start) / 1e3, min(own), statistics.median(own), max(own),
            len({r[2] for r in t}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--csv", default=None)
    parser.add_argument("--grids", default="32x2,32x3,32x4,16x4,64x2",
                        help="pairs x cluster, comma-separated")
    parser.add_argument("--pipes", default="4x2,4x3,2x2,2x4",
                        help="warps x stages, comma-separated")
    args = parser.parse_args(argv)
    grids = [tuple(int(x) for x in g.split("x")) for g in args.grids.split(",")]
    pipes = [tuple(int(x) for x in p.split("x")) for p in args.pipes.split(",")]
    most = max(p for p, _ in grids)
    g = torch.Generator(device="cuda").manual_seed(0)
    k, v = (torch.randn(most, KEYS, 128, device="cuda", generator=g).to(torch.bfloat16)
            for _ in range(2))
    sink = torch.empty(most * 16 * 512, dtype=torch.int32, device="cuda")
    times = torch.zeros(most * 16 * 3, dtype=torch.int64, device="cuda")
    copy_out = torch.empty_like(k)
    copy_ms = bench_graph(lambda: copy_out.copy_(k))
    print(f"torch copy of the keys: {2 * k.numel() * 2 / copy_ms / 1e6:.0f} GB/s "
          "(reads + writes)")
    lines = ["mode,warps,stages,pairs,cluster,ctas,ms,gbps,grid_us,cta_min_us,cta_med_us,"
             "cta_max_us,sms"]
    print(f"{'mode':10} {'w':>2} {'s':>2} {'grid':>6} {'ms':>7} {'GB/s':>6}  "
          "CTA µs min/med/max  SMs")
    for mode_name, mode in MODES.items():
        for warps, stages in pipes:
            if shared_bytes(mode, warps, stages) > 227 * 1024:
                continue
            try:
                kernel = Stream(mode, warps, stages)
            except Exception as exc:  # noqa: BLE001
                print(f"{mode_name} {warps}x{stages}: {type(exc).__name__}: {exc}"[:300])
                continue
            for pairs, cluster in grids:
                kp, vp = k[:pairs], v[:pairs]
                run = lambda: kernel(kp, vp, sink, times, pairs, cluster)  # noqa: E731
                try:
                    ms = bench_graph(run)
                    times.zero_()
                    run()
                    torch.cuda.synchronize()
                except Exception as exc:  # noqa: BLE001
                    print(f"{mode_name} {warps}x{stages} {pairs}x{cluster}: {exc}"[:300])
                    continue
                nbytes = 2 * kp.numel() * 2
                grid_us, lo, med, hi, sms = spread(times[:3 * pairs * cluster])
                gbps = nbytes / ms / 1e6
                print(f"{mode_name:10} {warps:2} {stages:2} {pairs:3}x{cluster:<2} {ms:7.4f} "
                      f"{gbps:6.0f}  {lo:6.1f}/{med:6.1f}/{hi:6.1f} {sms:4}")
                lines.append(f"{mode_name},{warps},{stages},{pairs},{cluster},"
                             f"{pairs * cluster},{ms:.5f},{gbps:.1f},{grid_us:.1f},{lo:.1f},"
                             f"{med:.1f},{hi:.1f},{sms}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
