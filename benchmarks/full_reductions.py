"""Values reduced over every axis, as a user writes them: the largest magnitude of a tensor (an fp8
scale), the sum of squares of a flat parameter vector (a gradient norm's square), a language
model's cross-entropy averaged over its tokens (a logsumexp per row, then the mean over rows) —
outputs over no axis, through ``tf.compile`` defaults (one row swept in parts:
:mod:`tensorfuse.schedule_templates.unit_rows`) against torch eager and ``torch.compile`` in the
same process, each checked against a float64 reference first (the harness of
:mod:`benchmarks.user_kernels`).

    python -m benchmarks.full_reductions [--only NAME,…]

Rows: ``benchmark`` = ``user/<name>``; CSV
``benchmarks/results/<date>-<device>-full-reductions.csv``.
"""
import torch
import torch.nn.functional as F

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.kernel_suite import Case, main, rows_case


@tf.kernel
def amax(x: T.Tensor["M", "N", "bf16"]):
    """The largest magnitude of a tensor: the scale of its fp8 copy."""
    i, j = T.axes("i j")
    return T.max(T.abs(x[i, j]), over=(i, j))


@tf.kernel
def sum_of_squares(g: T.Tensor["N", "f32"]):
    """A flat gradient's squared norm (clipping by the global norm)."""
    j = T.axes("j")
    return T.sum(g[j] * g[j], over=j)


@tf.kernel
def mean_cross_entropy(logits: T.Tensor["M", "V", "bf16"], target: T.Tensor["M", "i32"]):
    """A language model's loss: each token's cross-entropy, averaged over the tokens."""
    i, v = T.axes("i v")
    lse = T.logsumexp(logits[i, v], over=v)
    return T.cast(T.sum(lse - logits[i, target[i]], over=i) / T.size("M"), "f32")


def _amax_case(generator, M=8192, N=8192) -> Case:
    x = (torch.randn(M, N, generator=generator) * 3).to("cuda", torch.bfloat16)
    x[M // 3, N // 5] = -77.0   # the largest magnitude a negative value
    return rows_case("amax", amax, lambda t: t.abs().amax(), x, {}, f"{M}x{N} bf16")


def _sum_of_squares_case(generator, N=64 << 20) -> Case:
    g = torch.randn(N, generator=generator).cuda()
    return rows_case("sum_of_squares", sum_of_squares, lambda t: (t * t).sum(), g, {},
                     f"N{N} f32")


def _mean_cross_entropy_case(generator, M=8192, V=32000) -> Case:
    logits = (torch.randn(M, V, generator=generator) * 4).to("cuda", torch.bfloat16)
    target = torch.randint(0, V, (M,), generator=generator).to("cuda", torch.int32)

    def eager(t, labels):
        return F.cross_entropy(t.float() if t.dtype != torch.float64 else t, labels.long())
    return rows_case("mean_cross_entropy", mean_cross_entropy, eager, logits,
                     {"target": target}, f"M{M} V{V} bf16")


FULL_REDUCTIONS = {
    "amax": _amax_case,
    "sum_of_squares": _sum_of_squares_case,
    "mean_cross_entropy": _mean_cross_entropy_case,
}

if __name__ == "__main__":
    main(FULL_REDUCTIONS, "full-reductions", __doc__)
