"""Which kernel cuBLAS runs for a GEMM shape (name, grid, block, shared memory: from the torch
profiler's trace) and, for it and ``tf.compile``'s kernel, the time per call with the SM clock and
board power sampled while each runs back to back for a while — so that a difference in speed can
be told apart into work per clock and clock (a GEMM at this size runs at the power limit).

    python tools/probe_gemm_clocks.py [--shapes 8192x14336x4096,8192x8192x8192] [--seconds 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import torch

import tensorfuse as tf
import tensorfuse.kernels as K


def kernels_of(fn) -> list[dict]:
    """The GPU kernels one call of ``fn`` launches: name, grid, block, shared memory, µs."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return [{"name": e["name"][:140], "grid": e["args"].get("grid"),
             "block": e["args"].get("block"),
             "smem": e["args"].get("shared memory"), "regs": e["args"].get("registers per thread"),
             "us": e.get("dur")} for e in events if e.get("cat") == "kernel"]


def sampled(fn, seconds: float) -> tuple[float, float, float]:
    """``fn`` back to back for ``seconds``: (ms per call, median SM MHz, median watts) with
    nvidia-smi sampling every 50 ms."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    start, calls = time.perf_counter(), 0
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            fn()
        calls += 10
        torch.cuda.synchronize()
    ev1.record()
    torch.cuda.synchronize()
    smi.terminate()
    lines = [x.split(",") for x in smi.communicate()[0].strip().splitlines() if "," in x]
    mhz = statistics.median(float(a) for a, _ in lines) if lines else float("nan")
    watts = statistics.median(float(b) for _, b in lines) if lines else float("nan")
    return ev0.elapsed_time(ev1) / calls, mhz, watts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8192x14336x4096,8192x4096x14336,8192x8192x8192")
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    f = tf.compile(K.matmul)
    for shape in args.shapes.split(","):
        M, Kd, N = (int(v) for v in shape.split("x"))
        x = torch.randn(M, Kd, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(Kd, N, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * M * N * Kd
        calls = {"cublas": lambda: x @ w, "tensorfuse": lambda: f(x, w, out=out)}
        for label, fn in calls.items():
            for k in kernels_of(fn):
                print(f"{shape} {label}: {k}")
        for round_ in range(2):
            for label, fn in calls.items():
                ms, mhz, watts = sampled(fn, args.seconds)
                tflops = flops / ms / 1e9
                print(f"{shape} {label:10s} round {round_}: {ms:.4f} ms {tflops:6.1f} TFLOP/s "
                      f"SM {mhz:6.0f} MHz {watts:5.0f} W  {tflops / mhz * 1e3:6.1f} GFLOP/clock",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
