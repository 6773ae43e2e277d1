"""Shared pieces of the benchmarks: timing, ceilings, correctness checks, result rows."""
from __future__ import annotations

import csv
import math
import os
import time
from dataclasses import asdict, dataclass

import torch


@dataclass
class Row:
    benchmark: str
    shape: str
    implementation: str
    ms: float
    tflops: float
    gbps: float
    fraction_of_ceiling: float
    note: str = ""


def bench(fn, rep_ms: int = 200) -> float:
    """Median milliseconds (CUDA events, warm-up, L2 flushed between runs: triton.testing)."""
    import triton

    return float(triton.testing.do_bench(fn, rep=rep_ms, return_mode="median"))


def bench_graph(fn, rep_ms: int = 200) -> float:
    """Median milliseconds of ``fn`` replayed from a CUDA graph (triton.testing): GPU time only.
    For calls whose host-side cost (argument checks, launches) is close to their GPU time — the
    FFN at M=128 — ``bench`` measures the host as much as the kernels (``benchmarks.overhead``)."""
    import triton

    return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))


def bench_replayed(fn, rep_ms: int = 200) -> float:
    """Median milliseconds of one call of ``fn`` captured in a CUDA graph and replayed under
    ``do_bench`` (L2 flushed before each replay, as ``bench``): the GPU time of an eager call
    whose host work never keeps the GPU waiting — between ``bench`` (where it may) and
    ``bench_graph`` (calls back to back: L2 warm between them)."""
    fn()   # built and compiled outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench(graph.replay, rep_ms)


def host_us(fn, calls: int = 50, warm: int = 1) -> float:
    """Host microseconds per call of ``fn``: ``calls`` calls issued back to back after ``warm``
    ones, the GPU drained before and after but not counted (what a call costs the host, where
    ``bench`` measures what the GPU waits for)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    spent = time.perf_counter() - start
    torch.cuda.synchronize()
    return spent / calls * 1e6


def alternated(calls: dict, rounds: int, timing=bench, rep_ms: int = 100) -> dict:
    """``calls`` (label → callable) timed by ``timing`` once per round, taking turns over
    ``rounds`` rounds, so that drift of the GPU's clocks over a run hits every label alike:
    label → the rounds' milliseconds."""
    times: dict = {label: [] for label in calls}
    for _ in range(rounds):
        for label, fn in calls.items():
            times[label].append(timing(fn, rep_ms=rep_ms))
    return times


def measure_ceilings() -> dict:
    """The device's copy bandwidth (bytes read + written) and bf16 GEMM rate, measured now."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    copy = 2 * n / ms / 1e9  # TB/s
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench(lambda: a @ b)
    gemm = 2 * 8192**3 / ms / 1e9  # TFLOP/s
    return {"copy_tbps": copy, "gemm_tflops": gemm}


def relative_error(out, ref) -> float:
    out, ref = out.float(), ref.float()
    finite = torch.isfinite(ref)
    if not torch.isfinite(out[finite]).all():
        return math.inf
    return float((out[finite] - ref[finite]).abs().max() / ref[finite].abs().max().clamp_min(1e-30))


def write_csv(rows: list[Row], path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        for r in rows:
            writer.writerow(asdict(r))
