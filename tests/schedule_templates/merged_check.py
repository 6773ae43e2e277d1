"""Nested reductions as users write them — a mean of means, maxima three deep, rows' sums that are an
output beside their sum, a GEMM's row sums, a triangle's sum — as ``tf.compile`` makes them for
sm_90a (merged: ``schedule_templates/merged_reductions.py``), run by Triton's interpreter against
float64 references in torch, outputs poisoned; prints each case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.merged_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


@tf.kernel
def mean_of_means(x: T.Tensor["B", "H", "W", "f32"]):
    b, h, w = T.axes("b h w")
    return T.mean(T.mean(x[b, h, w], over=w), over=h)


@tf.kernel
def three_deep(x: T.Tensor["A", "B", "C", "D", "f32"]):
    a, b, c, d = T.axes("a b c d")
    return T.max(T.max(T.max(x[a, b, c, d], over=d), over=c), over=b)


@tf.kernel
def not_merged(x: T.Tensor["B", "H", "W", "f32"], s: T.Tensor["H", "f32"]):
    """A maximum of sums, a sum of squared sums, and a sum of scaled maxima: none merges."""
    b, h, w = T.axes("b h w")
    row = T.sum(x[b, h, w], over=w)
    return (T.max(row, over=h) + T.sum(row * row, over=h) +
            T.sum(T.max(x[b, h, w], over=w) * s[h], over=h))


@tf.kernel
def inner_kept(x: T.Tensor["B", "H", "W", "f32"]):
    """Each row's sum, and their sum: the rows' sums are an output of their own."""
    b, h, w = T.axes("b h w")
    row = T.sum(x[b, h, w], over=w)
    return row, T.sum(row * 2.0, over=h)


@tf.kernel
def score_sums(q: T.Tensor["M", "D", "bf16"], k: T.Tensor["N", "D", "bf16"]):
    """Each query's scores summed over the keys: the inner sum a GEMM (stays nested)."""
    i, j, d = T.axes("i j d")
    return T.sum(T.sum(q[i, d] * k[j, d], over=d), over=j)


@tf.kernel
def triangle_sums(x: T.Tensor["B", "H", "W", "f32"]):
    """The lower triangle's sum, written nested: the inner sum's condition reads the outer
    axis."""
    b, h, w = T.axes("b h w")
    return T.sum(T.sum(T.where(w <= h, x[b, h, w], 0.0), over=w), over=h)


def _mean_case(generator, B=3, H=7, W=45):
    x = torch.randn(B, H, W, generator=generator) * 100 + 30
    return dict(x=x), x.double().mean((1, 2))


def _three_deep_case(generator, A=3, B=5, C=6, D=77):
    x = torch.randn(A, B, C, D, generator=generator) * 1000
    return dict(x=x), x.double().amax((1, 2, 3))


def _not_merged_case(generator, B=3, H=7, W=45):
    x, s = torch.randn(B, H, W, generator=generator), torch.randn(H, generator=generator)
    row = x.double().sum(2)
    return dict(x=x, s=s), row.amax(1) + (row * row).sum(1) + \
        (x.double().amax(2) * s.double()).sum(1)


def _inner_kept_case(generator, B=3, H=7, W=45):
    x = torch.randn(B, H, W, generator=generator) * 10
    row = x.double().sum(2)
    return dict(x=x), (row, (row * 2).sum(1))


def _score_sums_case(generator, M=37, N=45, D=32):
    q, k = (torch.randn(n, D, generator=generator).bfloat16() for n in (M, N))
    return dict(q=q, k=k), (q.double() @ k.double().T).sum(1)


def _triangle_case(generator, B=3, H=37):
    x = torch.randn(B, H, H, generator=generator)
    return dict(x=x), torch.tril(x.double()).sum((1, 2))


CASES = {"mean_of_means": (mean_of_means, _mean_case),
         "three_deep": (three_deep, _three_deep_case),
         "not_merged": (not_merged, _not_merged_case),
         "inner_kept": (inner_kept, _inner_kept_case),
         "score_sums": (score_sums, _score_sums_case),
         "triangle_sums": (triangle_sums, _triangle_case)}

if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
