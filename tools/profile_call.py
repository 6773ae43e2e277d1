"""Where a call of a generated-CUDA kernel spends the host's time, and what the GPU does meanwhile
(``tf.compile``'s Hopper attention, FFN and GEMM kernels). For each case:

- host microseconds per call on the fast path (a signature seen before: ``ClusterFastCall``)
  and on the checked path (every call bound and checked: the fast path switched off);
- GPU milliseconds three ways: ``do_bench`` of the call (L2 flushed before each; the host's
  share counts where the GPU waits for it), ``do_bench`` of one call replayed from a CUDA graph
  (L2 flushed, the host's share gone: what the eager time would be with a free host), and
  ``do_bench_cudagraph`` (calls back to back in one graph: L2 warm);
- with ``--profile``, cProfile's top functions over a few hundred fast calls.

    PYTHONPATH=. python tools/profile_call.py [--only neighbourhood,causal] [--profile]
"""
import argparse
import cProfile
import math
import pstats

import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.common import bench, bench_graph, bench_replayed, host_us
from tensorfuse.targets.cuda import kernel as cuda_kernel


def cases():
    """(name, callable) of each case: a tf.compile kernel called as a user would."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    D = 128
    q, k, v = (torch.randn(1, 16, 4096, D, **bf16) for _ in range(3))
    scale = 1 / math.sqrt(D)
    nb = tf.compile(K.neighborhood_attention_2d)
    yield "neighbourhood 64x64 k7", lambda: nb(q, k, v, scale, width=64, radius=3, dilation=1)
    causal = tf.compile(K.causal_attention)
    yield "causal S=4096 B1 H16", lambda: causal(q, k, v, scale)
    x = torch.randn(128, 4096, **bf16)
    w1, w2 = torch.randn(4096, 14336, **bf16) / 64, torch.randn(14336, 4096, **bf16) / 128
    ffn = tf.compile(K.ffn_gelu)
    yield "ffn gelu M=128", lambda: ffn(x, w1, w2)
    a, b = torch.randn(1024, 4096, **bf16), torch.randn(4096, 4096, **bf16) / 64
    mm = tf.compile(K.matmul)
    yield "matmul 1024x4096x4096", lambda: mm(a, b)


def checked_path():
    """Switch the generated-CUDA kernels' fast path off (no fast call is made; those made are
    dropped by the caller)."""
    cuda_kernel.fast_call_applies = lambda bound, device: False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    made = [(name, call) for name, call in cases()
            if not args.only or any(part in name for part in args.only.split(","))]
    print(f"{'case':26s} {'host fast':>10s} {'host checked':>13s} {'eager ms':>9s} "
          f"{'replayed ms':>12s} {'graph ms':>9s}", flush=True)
    fast = {}
    for name, call in made:
        call()
        fast[name] = host_us(call, calls=300, warm=20)
    timings = {name: (bench(call), bench_replayed(call), bench_graph(call))
               for name, call in made}
    if args.profile:
        for name, call in made:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(300):
                call()
            profile.disable()
            torch.cuda.synchronize()
            print(f"==== {name}: cProfile of 300 calls")
            pstats.Stats(profile).sort_stats("tottime").print_stats(16)
    checked_path()
    for name, call in made:
        for kernel in _kernels(call):
            kernel._fast.clear()
        slow = host_us(call, calls=300, warm=20)
        eager, replayed, graph = timings[name]
        print(f"{name:26s} {fast[name]:9.1f}u {slow:12.1f}u {eager:9.4f} {replayed:12.4f} "
              f"{graph:9.4f}", flush=True)


def _kernels(call):
    """The kernels a case's closure calls (their fast calls are cleared for the checked path)."""
    found = []
    for cell in call.__closure__ or ():
        obj = cell.cell_contents
        if hasattr(obj, "_fast"):
            found.append(obj)
            found += [k for k in getattr(obj, "ahead", ()) if hasattr(k, "_fast")]
    return found


if __name__ == "__main__":
    main()
