"""What a decode call costs the host through ``tf.compile`` (issue 18's cluster decode as the
default on sm_90a), against the split-update template it replaced and SDPA:

- a repeated call (one signature): host µs a call (``benchmarks.common.host_us``) and GPU time;
- a cache that grows by one key a step (a new signature each step, as a KV cache gives):
  µs a step for 32 steps, first calls included — no kernel may be compiled per step.

    python tools/probe_decode_calls.py [--batch 1] [--keys 4096]
"""
from __future__ import annotations

import argparse
import math
import time

import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.cluster import split_update_decode
from benchmarks.common import bench_graph, host_us


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--keys", type=int, default=4096)
    args = parser.parse_args(argv)
    B, HQ, HKV, N, D, steps = args.batch, 32, 8, args.keys, 128, 32
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, HQ, 1, D, device="cuda", generator=g).to(torch.bfloat16)
    cache = [torch.randn(B, HKV, N + steps, D, device="cuda", generator=g).to(torch.bfloat16)
             for _ in range(2)]
    grown = [tuple(c[:, :, :n].contiguous() for c in cache) for n in range(N, N + steps)]
    k, v = grown[0]
    scale = 1 / math.sqrt(D)
    compiled = tf.compile(K.gqa_attention, "cuda")
    print("tf.compile runs:", compiled.for_sizes(B=B, H=HQ, HKV=HKV, M=1, N=N, D=D).description)
    sdpa = lambda q, k, v, scale: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q, k, v, scale=scale, enable_gqa=True)
    for name, f in (("tf.compile", compiled), ("split update", split_update_decode()), ("sdpa", sdpa)):
        f(q, k, v, scale=scale)
        torch.cuda.synchronize()
        host = host_us(lambda: f(q, k, v, scale=scale))
        gpu = bench_graph(lambda: f(q, k, v, scale=scale)) * 1e3
        torch.cuda.synchronize()
        start = time.perf_counter()
        for kk, vv in grown[1:]:
            f(q, kk, vv, scale=scale)
        torch.cuda.synchronize()
        per_step = (time.perf_counter() - start) / (steps - 1) * 1e6
        print(f"{name:13s} B={B} N={N}: host {host:6.1f} us a call, GPU {gpu:6.1f} us; "
              f"a growing cache: {per_step:7.1f} us a step (new signature each step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
