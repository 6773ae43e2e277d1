"""Which kernel cuBLAS runs for a GEMM shape (name, grid, block, shared memory: from the torch
profiler's trace) and, for it and ``tf.compile``'s kernel, the time per call with the SM clock and
board power sampled while each runs back to back for a while — so that a difference in speed can
be told apart into work per clock and clock (a GEMM at this size runs at the power limit).

    python tools/probe_gemm_clocks.py [--shapes 8192x14336x4096,8192x8192x8192] [--seconds 2]
                                      [--attention 4096,16384]

``--attention``: the same for variants of attention (bf16, B=2, H=16, D=128: full and causal)
against cuDNN (SDPA), instead of the GEMMs; ``--ffn M,...``: the GELU FFN (K=4096, N=14336) against
torch eager.
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


def report(label: str, calls: dict, flops: float, seconds: float) -> None:
    """Each of ``calls``' kernels, then two rounds of each run back to back with its clock."""
    for name, fn in calls.items():
        for k in kernels_of(fn):
            print(f"{label} {name}: {k}")
    for round_ in range(2):
        for name, fn in calls.items():
            ms, mhz, watts = sampled(fn, seconds)
            tflops = flops / ms / 1e9
            print(f"{label} {name:10s} round {round_}: {ms:.4f} ms {tflops:6.1f} TFLOP/s "
                  f"SM {mhz:6.0f} MHz {watts:5.0f} W  {tflops / mhz * 1e3:6.1f} GFLOP/clock",
                  flush=True)


def attention(sizes: str, seconds: float) -> None:
    """Full and causal attention (the benchmark's cases: B=2, H=16, D=128), ``tf.compile``
    against SDPA's cuDNN backend."""
    from torch.nn.attention import SDPBackend

    from benchmarks.attention import make_case, sdpa_call, variants

    gen = torch.Generator().manual_seed(0)
    for S in (int(s) for s in sizes.split(",")):
        for name in ("full", "causal"):
            spec = variants(S)[name]
            case = make_case(name, spec, S, gen, check_rows=16)
            f = tf.compile(spec[0])
            report(f"{name} S={S}",
                   {"cudnn": sdpa_call(case, SDPBackend.CUDNN_ATTENTION),
                    "tensorfuse": lambda f=f, c=case: f(c.q, c.k, c.v, scale=c.scale, **c.args)},
                   case.flops, seconds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8192x14336x4096,8192x4096x14336,8192x8192x8192")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--attention", default=None, metavar="S,...")
    ap.add_argument("--ffn", default=None, metavar="M,...")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    if args.ffn:
        F = torch.nn.functional
        f = tf.compile(K.ffn_gelu)
        for M in (int(m) for m in args.ffn.split(",")):
            x = torch.randn(M, 4096, device="cuda", dtype=torch.bfloat16)
            w1 = torch.randn(4096, 14336, device="cuda", dtype=torch.bfloat16) * 0.02
            w2 = torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
            report(f"ffn_gelu M={M}",
                   {"eager": lambda: F.gelu(x @ w1, approximate="tanh") @ w2,
                    "tensorfuse": lambda: f(x, w1, w2)}, 4.0 * M * 4096 * 14336, args.seconds)
        return 0
    if args.attention:
        attention(args.attention, args.seconds)
        return 0
    f = tf.compile(K.matmul)
    for shape in args.shapes.split(","):
        M, Kd, N = (int(v) for v in shape.split("x"))
        x = torch.randn(M, Kd, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(Kd, N, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        report(shape, {"cublas": lambda: x @ w, "tensorfuse": lambda: f(x, w, out=out)},
               2.0 * M * N * Kd, args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
