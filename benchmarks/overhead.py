"""What a call costs when the GPU work is short: wall clock per call (the host's share included)
and GPU time (CUDA-graph replay), tensorfuse beside torch, in one process.

    python -m benchmarks.overhead [--calls 2000]

Rows ``overhead/<case>``: ``ms`` is the wall-clock time per call over ``calls`` back-to-back
calls (synchronised once at the end), ``note`` holds the GPU time of one call replayed from a CUDA
graph (or why it could not be captured) and the ratio of the two.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from benchmarks.common import Row, bench_graph

CALLS = 20000   # back-to-back calls per timing (2000 moved by up to 1.5x between runs)


def wall_ms(fn, calls: int) -> float:
    """Milliseconds per call of ``calls`` calls issued back to back, synchronised at the end
    (``run`` takes the median of three such runs, interleaved with the other implementations)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / calls


def graph_ms(fn) -> tuple[float | None, str]:
    try:
        return bench_graph(fn, rep_ms=100), ""
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot be captured is a finding
        return None, f"not capturable: {type(exc).__name__}: {str(exc)[:80]}"


def cases():
    """(name, shape, {implementation: callable}) for each case."""
    import torch.nn.functional as F

    import tensorfuse as tf
    import tensorfuse.kernels as K

    x = torch.randn(4, 128, device="cuda", dtype=torch.bfloat16)
    softmax = tf.compile(K.softmax, "cuda")
    yield "softmax", "4x128 bf16", {"tensorfuse": _calling(softmax, lambda: softmax(x)),
                                    "torch": lambda: torch.softmax(x, -1)}
    for b, hq, hkv in ((4, 64, 8), (4, 32, 32), (1, 32, 8)):
        q = torch.randn(b, hq, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, 4096, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        kernel = K.gqa_attention if hq != hkv else K.attention
        f = tf.compile(kernel, "cuda")
        scale = 128 ** -0.5
        yield ("decode", f"B{b} H{hq}/{hkv} N4096 bf16",
               {"tensorfuse": _calling(f, lambda f=f, q=q, k=k, v=v: f(q, k, v, scale=scale)),
                "sdpa": lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                    q, k, v, scale=scale, enable_gqa=hq != hkv)})


def _calling(kernel, fn):
    fn.kernel = kernel   # the compiled kernel a timed callable calls (diagnose reads it)
    return fn


def run(calls: int = CALLS, log=print) -> list[Row]:
    rows = []
    log(f"{'case':34s} {'impl':11s} {'wall us/call':>13s} {'GPU us':>8s}")
    for name, shape, impls in cases():
        for fn in impls.values():
            fn()  # build and check the first call outside the timing
        walls: dict = {impl: [] for impl in impls}
        for _ in range(3):   # interleaved: the host's speed drifts between runs
            for impl, fn in impls.items():
                walls[impl].append(wall_ms(fn, calls))
        for impl, fn in impls.items():
            wall = sorted(walls[impl])[1]
            gpu, why = graph_ms(fn)
            note = why or f"graph {gpu * 1e3:.1f} us; wall/graph {wall / gpu:.2f}"
            rows.append(Row(f"overhead/{name}", shape, impl, wall, 0.0, 0.0, 0.0, note))
            log(f"{name + ' ' + shape:34s} {impl:11s} {wall * 1e3:13.1f} "
                f"{(f'{gpu * 1e3:8.1f}' if gpu else '       -')}  {why}")
    return rows


def profile(calls: int, top: int = 18) -> None:
    """cProfile of ``calls`` tensorfuse calls of each case: where the host's time goes."""
    import cProfile
    import pstats

    for name, shape, impls in cases():
        fn = impls["tensorfuse"]
        fn()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            fn()
        profiler.disable()
        torch.cuda.synchronize()
        print(f"--- {name} {shape}: {calls} calls")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def diagnose(calls: int = 200) -> None:
    """Which path tensorfuse's calls took: the fast call (and how often it declined), or the
    checked path; and Triton's launch hooks, which every launch must honour."""
    import triton

    print("triton launch hooks:", triton.knobs.runtime.launch_enter_hook,
          triton.knobs.runtime.launch_exit_hook)
    for name, shape, impls in cases():
        fn = impls["tensorfuse"]
        for _ in range(calls):
            fn()
        kernel = getattr(fn, "kernel", None)
        template = getattr(kernel, "template", kernel)
        fast = [(f.calls, f.declined) for f in getattr(template, "_fast", {}).values()]
        print(f"{name} {shape}: {type(template).__name__}, fast calls (ran, declined): {fast}")


def breakdown(calls: int = 20000) -> None:
    """Microseconds per call of each piece of the small softmax's fast call, apart, interleaved
    (the host's speed drifts): what each costs and what is left to save (one line each)."""
    import tensorfuse as tf
    import tensorfuse.kernels as K
    from tensorfuse.binding import signature_key
    from tensorfuse.targets.triton.launcher import _triton, hook, launch_raw
    from tensorfuse.torch_graph import compiling

    x = torch.randn(4, 128, device="cuda", dtype=torch.bfloat16)
    f = tf.compile(K.softmax, "cuda")
    f(x)
    f(x)
    fast = next(iter(f._fast.values()))   # the AutoKernel's fast call for this signature
    raw, kernel, grid, index = fast.steps[0]
    out = torch.empty_like(x)
    args = [[x.data_ptr(), out.data_ptr()][k] for k in index] + fast.constexprs
    runtime, active = _triton()
    stream = active.get_current_stream(fast.current_device())
    enter, leave = hook(runtime.launch_enter_hook), hook(runtime.launch_exit_hook)
    pieces = {
        "whole call f(x)": lambda: f(x),
        "fast call only": lambda: fast((x,), {}),
        "signature_key": lambda: signature_key((x,), {}),
        "compiling()": compiling,
        "torch.empty(device=fast.device)": lambda: torch.empty((4, 128), dtype=torch.bfloat16,
                                                               device=fast.device),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "current stream": lambda: active.get_current_stream(fast.current_device()),
        "launch_raw (Triton's C launcher)": lambda: launch_raw(raw, kernel, grid, stream, args,
                                                               enter, leave),
        "torch.softmax": lambda: torch.softmax(x, -1),
        "out.copy_(x) (a launch of torch's)": lambda: out.copy_(x),
    }
    times: dict = {name: [] for name in pieces}
    for _ in range(3):
        for name, fn in pieces.items():
            times[name].append(wall_ms(fn, calls) * 1e3)
    for name, ts in times.items():
        print(f"{name:40s} {sorted(ts)[1]:7.2f} us   ({min(ts):.2f}-{max(ts):.2f})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--csv", default=None, help="write the rows here")
    parser.add_argument("--profile", action="store_true", help="print where the host time goes")
    parser.add_argument("--diagnose", action="store_true", help="print which call path ran")
    parser.add_argument("--breakdown", action="store_true",
                        help="time the pieces of the small softmax's call apart")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("the overhead benchmark needs an NVIDIA GPU", file=sys.stderr)
        return 2
    if args.profile:
        profile(args.calls)
        return 0
    if args.diagnose:
        diagnose()
        return 0
    if args.breakdown:
        breakdown()
        return 0
    rows = run(args.calls)
    if args.csv:
        from benchmarks.common import write_csv

        write_csv(rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
