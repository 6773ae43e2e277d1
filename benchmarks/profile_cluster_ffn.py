"""One launch of the cluster FFN's main kernel for a profiler (Nsight Compute):

    ncu -k tf_chain_main --launch-skip 1 --launch-count 1 --section SpeedOfLight \\
        python -m benchmarks.profile_cluster_ffn --kind gelu --m 1024 --mma wgmma

The first call compiles and runs once (skipped by ``--launch-skip 1``), the second is profiled.
"""
from __future__ import annotations

import argparse
import json

import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.cluster import FFN_SHAPE


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("gelu", "swiglu"), default="gelu")
    parser.add_argument("--m", type=int, default=1024)
    parser.add_argument("--knobs", default="{}", help='knobs as JSON, e.g. {"mma": "wgmma"}')
    args = parser.parse_args(argv)
    kernel = K.ffn_gelu if args.kind == "gelu" else K.ffn_swiglu
    sch = tf.schedule(kernel, "cuda")
    sch.cluster_distribute("n", **json.loads(args.knobs))
    f = sch.compile()
    Kd, N, O = FFN_SHAPE["K"], FFN_SHAPE["N"], FFN_SHAPE["O"]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(args.m, Kd, device="cuda", generator=g).to(torch.bfloat16)
    ws = [(torch.randn(Kd, N, device="cuda", generator=g) / Kd ** 0.5).to(torch.bfloat16)
          for _ in range(1 if args.kind == "gelu" else 2)]
    w2 = (torch.randn(N, O, device="cuda", generator=g) / N ** 0.5).to(torch.bfloat16)
    for _ in range(2):
        f(x, *ws, w2)
    torch.cuda.synchronize()
    print(f.schedule_origin(M=args.m, **FFN_SHAPE))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
