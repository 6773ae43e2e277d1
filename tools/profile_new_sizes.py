"""Where the host's time goes in a first call at a new size whose build exists (``tf.compile``
defaults): the wall time of first calls at new sizes of a bucket already built (no profiler
running), then cProfile's top functions over first calls at other new sizes of it, for
a Triton row kernel (softmax widths), the Hopper attention (causal prompt lengths) and the
cluster decode (a cache one key longer each call).

    PYTHONPATH=. python tools/profile_new_sizes.py [--calls 8] [--top 25] [--phases]

``--phases``: instead of cProfile, the host milliseconds of each phase of the Hopper attention's
first calls (block lists, the persistent schedule's pick, launches, TMA maps, kept memory),
timed by wrapping those functions.
"""
import argparse
import collections
import cProfile
import functools
import importlib
import math
import pstats
import time

import torch

import tensorfuse as tf
import tensorfuse.kernels as K


def cases(calls: int):
    """(name, warm-up sizes, new sizes, inputs(size), call(inputs)) of each case."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    softmax = tf.compile(K.softmax)
    yield ("softmax widths", [3008, 3024], [3040 + 16 * k for k in range(2 * calls)],
           lambda n: (torch.randn(4096, n, **bf16),), softmax)
    causal = tf.compile(K.causal_attention)
    yield ("causal prompt lengths", [5000, 5100], [5200 + 100 * k for k in range(2 * calls)],
           lambda n: tuple(torch.randn(1, 16, n, 128, **bf16) for _ in range(3)),
           lambda q, k, v: causal(q, k, v, 1 / math.sqrt(128)))
    decode = tf.compile(K.gqa_attention)
    yield ("decode cache lengths", [4096, 4097], [4098 + k for k in range(2 * calls)],
           lambda n: (torch.randn(8, 32, 1, 128, **bf16),
                      *(torch.randn(8, 8, n, 128, **bf16) for _ in range(2))),
           lambda q, k, v: decode(q, k, v, 1 / math.sqrt(128)))


def phases() -> collections.defaultdict:
    """Wrap the Hopper attention's first-call phases with timers; the milliseconds by phase."""
    spent: collections.defaultdict = collections.defaultdict(float)

    def timed(owner, name: str, label: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] += (time.perf_counter() - start) * 1e3
        setattr(owner, name, wrapper)

    attention = importlib.import_module("tensorfuse.schedule_templates.hopper_attention")
    tma = importlib.import_module("tensorfuse.targets.cuda.tma")
    kernel = importlib.import_module("tensorfuse.targets.cuda.kernel")
    timed(attention, "block_lists_and_counts", "block lists")
    timed(attention, "pick_persistent", "schedule pick")
    timed(kernel.ClusterKernel, "launches", "launches")
    timed(tma.DeviceMaps, "get", "TMA maps")
    for module in ("tensorfuse.interop", "tensorfuse.targets.cuda.tma",
                   "tensorfuse.schedule_templates.block_bounds"):
        timed(importlib.import_module(module), "kept_empty", "kept memory")
    return spent


def _wall(call, arguments) -> float:
    """The wall milliseconds of one call, the GPU idle before and finished after."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    call(*arguments)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--phases", action="store_true",
                        help="the host time of each first call by phase, instead of cProfile")
    args = parser.parse_args()
    spent = phases() if args.phases else None
    for name, warm, new, inputs, call in cases(args.calls):
        for n in warm:
            call(*inputs(n))
        made = [inputs(n) for n in new]   # made before anything is timed
        timed, profiled = made[:args.calls], made[args.calls:]
        walls = []   # (first, second) call's wall milliseconds at each new size
        for arguments in timed:
            walls.append(tuple(_wall(call, arguments) for _ in range(2)))
        print(f"== {name}: first calls {', '.join(f'{w:.2f}' for w, _ in walls)} ms; over the "
              f"second call at the same size {', '.join(f'{w - s:.2f}' for w, s in walls)} ms")
        if spent is not None:
            for arguments in profiled:
                torch.cuda.synchronize()
                spent.clear()
                start = time.perf_counter()
                call(*arguments)
                host = (time.perf_counter() - start) * 1e3
                torch.cuda.synchronize()
                print(f"  host {host:.2f} ms: " + ", ".join(f"{label} {ms:.2f}" for label, ms
                                                            in sorted(spent.items())))
            continue
        profile = cProfile.Profile()
        for arguments in profiled:
            profile.enable()
            call(*arguments)
            profile.disable()
            torch.cuda.synchronize()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
