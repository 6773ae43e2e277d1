"""Time two generated Triton sources of one template kernel against each other, alternating in one
process (same plan, knobs and inputs; only the source differs): a change to code generation
measured apart from run-to-run drift.

    python -m benchmarks.ab_source KERNEL OTHER_SOURCE.py [--rounds 7] [--knobs 64,64,4,3]

The sizes are attention prefill at S=4096 (B=2, H=16, D=128). Prints the median milliseconds of
each and their ratio.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from benchmarks.common import alternated


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kernel")
    parser.add_argument("other")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--knobs", default="64,64,4,3")
    args = parser.parse_args(argv)
    import tensorfuse as tf
    import tensorfuse.kernels as K
    from tensorfuse.targets.triton.launch import load_kernel

    kernel = K.ALL[args.kernel]
    tile_m, tile_n, warps, stages = (int(v) for v in args.knobs.split(","))
    sizes = {d: v for d, v in dict(B=2, H=16, HKV=4, M=4096, N=4096, D=128).items()
             if d in kernel.program.dim_names()}
    made = []
    for source in (None, open(args.other).read()):
        sch = tf.schedule(kernel, "cuda")
        sch.rolling_update("m", "l", "o", axis="j")
        sch.apply_template("attention", tile_m=tile_m, tile_n=tile_n, num_warps=warps,
                           num_stages=stages)
        f = sch.compile()
        key = tuple(sorted(sizes.items()))
        plan, knobs, src, fn, names = f.build(**sizes)
        if source is not None:
            f._built[key] = (plan, knobs, source, load_kernel(source, f"{kernel.name}_fused"),
                             names)
        made.append(f)
    q = torch.randn(sizes["B"], sizes["H"], sizes["M"], sizes["D"], device="cuda",
                    dtype=torch.bfloat16)
    kv = [torch.randn(sizes["B"], sizes.get("HKV", sizes["H"]), sizes["N"], sizes["D"],
                      device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    from benchmarks.attention import variants

    extra = {"scale": sizes["D"] ** -0.5}
    extra.update(next(v[1] for v in variants(4096).values() if v[0] is kernel))
    outs = [f(q, *kv, **extra) for f in made]
    err = float((outs[0].float() - outs[1].float()).abs().max())
    times = list(alternated({k: (lambda f=f: f(q, *kv, **extra)) for k, f in enumerate(made)},
                            args.rounds, rep_ms=200).values())
    now, other = (statistics.median(t) for t in times)
    print(f"{args.kernel}: this checkout {now:.4f} ms, {args.other} {other:.4f} ms, "
          f"ratio {now / other:.4f} (max |difference| of the outputs {err:.2e})")
    print("rounds:", [f"{a:.4f}/{b:.4f}" for a, b in zip(*times)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
