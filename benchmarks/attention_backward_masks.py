"""What a mask costs the attention backward template (issue 22): the same kernels on full attention
(no mask: a plain loop over every block), on a prefix-LM mask whose prefix covers every key (every
block whole, visited through the block lists) and on causal attention, at S=4096, bf16, B=2, H=16,
D=128 — and causal at other knob settings. Kernel time (``do_bench``) from the saved log-sum-exp.

    python -m benchmarks.attention_backward_masks [--csv PATH]
"""
from __future__ import annotations

import argparse

import torch

import tensorfuse as tf
from benchmarks.attention import variants
from benchmarks.common import Row, bench, write_csv


def run(S: int = 4096, B: int = 2, H: int = 16, D: int = 128, log=print) -> list[Row]:
    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.schedule_templates.attention_backward import (BackwardKnobs,
                                                                  plan_attention_backward)
    from tensorfuse.schedule_templates.attention_chain import with_logsumexp
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target
    from tensorfuse.targets.triton.attention_backward import AttentionBackwardKernels

    cases = [("full", {}, BackwardKnobs()), ("prefix_lm", {"prefix": S}, BackwardKnobs()),
             ("causal", {}, BackwardKnobs()),
             ("causal", {}, BackwardKnobs(64, 128, 128, 64, 8, 4)),
             ("causal", {}, BackwardKnobs(64, 128, 128, 64, 4, 3)),
             ("causal", {}, BackwardKnobs(64, 128, 128, 32, 8, 3)),
             ("causal", {}, BackwardKnobs(32, 128, 128, 64, 8, 3))]
    rows = []
    q, dout = (torch.randn(B, H, S, D, device="cuda").bfloat16() for _ in range(2))
    k, v = (torch.randn(B, H, S, D, device="cuda").bfloat16() for _ in range(2))
    scale = D ** -0.5
    for name, scalars, knobs in cases:
        kernel = variants(S, B=B, H=H)[name][0]
        values = {"scale": scale, **scalars}
        _, fusion = choose(kernel.program, get_target("cuda"))
        saving = tf.compile(ProgramKernel(with_logsumexp(kernel.program, fusion.names)))
        out, lse = saving(q, k, v, *values.values())
        plan = plan_attention_backward(kernel.program, fusion, dict(B=B, H=H, M=S, N=S, D=D))
        try:
            made = AttentionBackwardKernels(plan, knobs)
            ms = bench(lambda: made({"q": q, "k": k, "v": v}, values, out, dout, lse))
        except Exception as exc:  # noqa: BLE001 - a setting that does not fit
            log(f"{name} {knobs}: {type(exc).__name__}: {exc}"[:200])
            continue
        label = f"{name}{' (every block whole, through the mask)' if scalars else ''}"
        log(f"{label:40} {knobs.block_m1},{knobs.block_n1},{knobs.block_m2},{knobs.block_n2},"
            f"{knobs.num_warps},{knobs.num_stages}  {ms:8.3f} ms")
        rows.append(Row(f"attention_bwd_masks/{name}", f"B{B} H{H} S{S} D{D} bf16",
                        f"{label} knobs {knobs.block_m1},{knobs.block_n1},{knobs.block_m2},"
                        f"{knobs.block_n2},{knobs.num_warps},{knobs.num_stages}", ms, 0.0, 0.0,
                        0.0, ""))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--csv", default=None)
    args = parser.parse_args(argv)
    rows = run()
    if args.csv:
        write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
