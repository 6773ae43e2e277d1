"""Kernels reducing with ``T.logsumexp``, an arg reduction or ``T.prod`` as ``tf.compile`` makes
them for sm_90a (the first two written as reductions the templates keep:
:mod:`tensorfuse.schedule_templates.monoid_rewrites`; products kept by the row template itself),
run by Triton's interpreter against torch in float64 at ragged sizes and large value ranges:
logsumexp over a row (some rows −∞ throughout: −∞ out, as the math gives), down the columns of
bf16 data far from zero, under a mask with a temperature, beside a sum of the same row; argmax
over a vocabulary-wide row with ties (the first index wins) and over rows of −∞, NaN and +∞
(one pass: the index resets where the maximum moves), written by hand, over integers, and over
the channels of NCHW logits; argmin down the columns, and the largest value with its index;
the count of elements equal to a row's maximum and the weight there, and down columns (sums
reset where the maximum moves); products of rows (a zero and negative factors among them) and
down columns; users' monoids over rows: compound growth, and two of two components (the two
largest values; a sum with its count). Outputs are poisoned (NaN, or −1 for indices) before
each run; prints each case's relative error over the finite values as JSON (infinite where a
−∞ is not where the reference has it, or an index differs).

    TRITON_INTERPRET=1 python -m tests.schedule_templates.gpu_monoids_check SEED
"""

import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


@tf.kernel
def lse_rows(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    return T.logsumexp(x[i, j], over=j)


@tf.kernel
def lse_columns(x: T.Tensor["M", "N", "bf16"]):
    i, j = T.axes("i j")
    return T.logsumexp(x[i, j], over=i)


@tf.kernel
def lse_masked(x: T.Tensor["M", "N", "bf16"], lengths: T.Tensor["M", "i32"], t: T.f32):
    i, j = T.axes("i j")
    return T.logsumexp(T.where(j < lengths[i], x[i, j] * t, -T.inf), over=j)


@tf.kernel
def lse_and_sum(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    return T.logsumexp(x[i, j], over=j), T.sum(x[i, j], over=j)


def rows_case(generator, M=37, N=1001):
    x = torch.randn(M, N, generator=generator) * 50
    x[3] = -torch.inf   # a row of nothing
    return dict(x=x), torch.logsumexp(x.double(), -1)


def columns_case(generator, M=333, N=45):
    x = (torch.randn(M, N, generator=generator) * 20 + 300).bfloat16()
    return dict(x=x), torch.logsumexp(x.double(), 0)


def masked_case(generator, M=29, N=515):
    x = (torch.randn(M, N, generator=generator) * 8).bfloat16()
    lengths = torch.randint(0, N + 1, (M,), generator=generator, dtype=torch.int32)
    lengths[0] = 0   # nothing kept: −∞
    keep = torch.arange(N)[None, :] < lengths[:, None].long()
    want = torch.logsumexp(torch.where(keep, x.double() * 0.3, -torch.inf), -1)
    return dict(x=x, lengths=lengths, t=0.3), want


def both_case(generator, M=21, N=700):
    x = torch.randn(M, N, generator=generator) * 10 - 40
    return dict(x=x), (torch.logsumexp(x.double(), -1), x.double().sum(-1))


@tf.kernel
def argmax_rows(logits: T.Tensor["M", "V", "bf16"]):
    i, v = T.axes("i v")
    return T.argmax(logits[i, v], over=v)


@tf.kernel
def argmin_columns(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    return T.argmin(x[i, j] * x[i, j], over=i)


@tf.kernel
def best_and_where(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    return T.max_argmax(T.abs(x[i, j]) - j, over=j)


def argmax_case(generator, M=13, V=5003):
    x = (torch.randn(M, V, generator=generator) * 4).round().bfloat16()   # many ties
    return dict(logits=x), torch.argmax(x.double(), -1)   # torch's first index of the max


def first_largest(x: torch.Tensor) -> torch.Tensor:
    """The pair's argmax, written apart in float64: the first index of a row's largest value,
    NaN never chosen, and the first index where nothing beats the identity −FLT_MAX (a row of
    −∞ or NaN: as torch.argmax gives a row of −∞)."""
    values = x.double().nan_to_num(nan=-torch.inf, posinf=torch.inf, neginf=-torch.inf)
    best = values.max(-1, keepdim=True).values
    first = torch.where(values == best, torch.arange(x.shape[-1]), x.shape[-1]).min(-1).values
    return torch.where(best[:, 0] >= -torch.finfo(torch.float32).max, first, 0)


def argmax_specials_case(generator, M=9, V=3000):
    """Rows of −∞, of NaN, NaN before the values, +∞ twice, ties a block apart."""
    x = (torch.randn(M, V, generator=generator) * 4).round()
    x[0] = -torch.inf
    x[1, 300], x[1, 2900] = torch.inf, torch.inf
    x[2] = torch.nan
    x[3, :1500] = torch.nan
    x[4], x[4, 192], x[4, 2999] = 1.0, 5.0, 5.0
    x[5], x[5, 600] = -3.0e38, -torch.inf
    x[6], x[6, 900] = torch.nan, -torch.inf
    x = x.bfloat16()
    return dict(logits=x), first_largest(x)


@tf.kernel
def most_counted(counts: T.Tensor["M", "N", "i32"]):
    """An argmax over integers (no NaN to leave out)."""
    i, j = T.axes("i j")
    return T.argmax(counts[i, j], over=j)


def most_counted_case(generator, M=13, N=5003):
    counts = torch.randint(-50, 50, (M, N), generator=generator, dtype=torch.int32)   # ties
    return dict(counts=counts), torch.argmax(counts, -1)   # the first index of the maximum


@tf.kernel
def first_of_the_largest(x: T.Tensor["M", "N", "f32"]):
    """An argmax written by hand: N where nothing was found (the fallback a reset keeps only
    where something was seen before the maximum moved)."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    return T.min(T.where(x[i, j] == m, j, T.size("N")), over=j)


def first_of_the_largest_case(generator, M=70, N=17003):
    x = (torch.randn(M, N, generator=generator) * 4).round()
    x[1, 10], x[1, 16000] = torch.inf, torch.inf
    x[2, 16990] = 50.0   # the maximum moves in the last block
    return dict(x=x), first_largest(x).clamp(max=N)


@tf.kernel
def class_per_pixel(logits: T.Tensor["B", "C", "H", "W", "bf16"]):
    """A segmentation's prediction: the argmax over the channels of NCHW logits (a strided
    axis: the pixels are the contiguous rows)."""
    b, c, h, w = T.axes("b c h w")
    return T.argmax(logits[b, c, h, w], over=c)


def class_per_pixel_case(generator, B=2, C=19, H=33, W=35):
    x = (torch.randn(B, C, H, W, generator=generator) * 3).round().bfloat16()   # ties
    return dict(logits=x), first_largest(x.movedim(1, -1).reshape(-1, C)).reshape(B, H, W)


@tf.kernel
def heatmap_peak(heatmaps: T.Tensor["B", "K", "H", "W", "bf16"]):
    """A pose model's keypoints: each heatmap's peak over two axes, as its row-major index
    ``h · W + w`` (torch's argmax of the flattened map)."""
    b, k, h, w = T.axes("b k h w")
    return T.argmax(heatmaps[b, k, h, w], over=(h, w))


def heatmap_peak_case(generator, B=3, K=5, H=37, W=29):
    x = (torch.randn(B, K, H, W, generator=generator) * 2).round().bfloat16()   # ties
    return dict(heatmaps=x), first_largest(x.reshape(-1, H * W)).reshape(B, K)


@tf.kernel
def nearest_cell(cost: T.Tensor["H", "W", "C", "f32"]):
    """The cheapest (h, w) cell per channel: an argmin over two outer axes, and its cost."""
    h, w, c = T.axes("h w c")
    best = T.min(cost[h, w, c], over=(h, w))
    return T.argmin(cost[h, w, c], over=(h, w)), best


def nearest_cell_case(generator, H=23, W=41, C=19):
    x = (torch.randn(H, W, C, generator=generator) * 3).round()   # ties
    flat = x.double().reshape(H * W, C)
    return dict(cost=x), (first_largest(-flat.T), flat.min(0).values)


@tf.kernel
def maxima_down_columns(x: T.Tensor["N", "D", "f32"]):
    """How many rows hold each column's maximum (a sum reset where it moves, down a strided
    axis)."""
    n, d = T.axes("n d")
    m = T.max(x[n, d], over=n)
    return T.sum(T.where(x[n, d] == m, 1.0, 0.0), over=n)


def maxima_down_columns_case(generator, N=5000, D=48):
    x = (torch.randn(N, D, generator=generator) * 2).round()
    return dict(x=x), (x == x.max(0, keepdim=True).values).sum(0).double()


def argmin_case(generator, M=333, N=45):
    x = torch.randn(M, N, generator=generator) * 100
    return dict(x=x), torch.argmin(x.double() ** 2, 0)


def best_case(generator, M=21, N=700):
    x = torch.randn(M, N, generator=generator) * 30
    scores = x.double().abs() - torch.arange(N, dtype=torch.float64)
    best = scores.max(-1)
    return dict(x=x), (best.values, best.indices)


@tf.kernel
def at_the_maximum(x: T.Tensor["M", "N", "bf16"], w: T.Tensor["M", "N", "f32"]):
    """How many elements equal each row's maximum, and the weight there: sums that reset to 0
    where the maximum moves."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    ties = T.sum(T.where(x[i, j] == m, 1.0, 0.0), over=j)
    return ties, T.sum(T.where(x[i, j] == m, w[i, j], 0.0), over=j)


def at_the_maximum_case(generator, M=70, N=17003):
    """Rows swept in blocks, enough of them not to be split: states kept per lane."""
    x = (torch.randn(M, N, generator=generator) * 3).round()
    x[1, 10], x[1, 16999] = torch.inf, torch.inf
    x[2], x[2, 17001] = -2.0, 7.0   # the maximum moves in the last block
    x = x.bfloat16()
    w = torch.rand(M, N, generator=generator) + 0.5
    top = x.double() == x.double().max(-1, keepdim=True).values
    return dict(x=x, w=w), (top.sum(-1).double(), (w.double() * top).sum(-1))


@tf.kernel
def prod_rows(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    return T.prod(x[i, j], over=j)


@tf.kernel
def prod_columns(x: T.Tensor["M", "N", "bf16"]):
    i, j = T.axes("i j")
    return T.prod(1.0 + 0.01 * x[i, j], over=i)


# a user's monoid: compound growth, (1 + a)(1 + b) − 1
COMPOUND = T.Monoid("compound", lambda a, b: a + b + a * b, (0.0,))


@tf.kernel
def compound_rows(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    return T.reduce(0.01 * x[i, j], over=j, monoid=COMPOUND)


def _larger(a, b):
    return T.where(a > b, a, b)


def _smaller(a, b):
    return T.where(a < b, a, b)


# a user's monoid of two components: the two largest values seen
TOP_TWO = T.Monoid("top_two", lambda a1, a2, b1, b2: (
    _larger(a1, b1), _larger(_smaller(a1, b1), _larger(a2, b2))), (-T.inf, -T.inf), arity=2)
# ... and a sum with its count
SUM_COUNT = T.Monoid("sum_count", lambda s, n, t, m: (s + t, n + m), (0.0, 0.0), arity=2)


@tf.kernel
def top_two_margin(x: T.Tensor["M", "N", "bf16"]):
    """How far each row's largest value stands above its second."""
    i, j = T.axes("i j")
    best = T.reduce((x[i, j], -T.inf), over=j, monoid=TOP_TWO)
    return best[0] - best[1]


@tf.kernel
def mean_of_the_positive(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    kept = x[i, j] > 0.0
    total = T.reduce((T.where(kept, x[i, j], 0.0), T.where(kept, 1.0, 0.0)), over=j,
                     monoid=SUM_COUNT)
    return total[0] / total[1]


def top_two_case(generator, M=1, N=17003):
    """Swept in blocks per lane (two blocks a row: not split)."""
    x = (torch.randn(M, N, generator=generator) * 8).bfloat16()
    # a largest value of its own: bf16's ties at the top would make the margin 0 (and any
    # relative error 0/0)
    x[:, N // 3] = x.max(-1).values + 1
    top = x.double().topk(2, -1).values
    return dict(x=x), top[:, 0] - top[:, 1]


def mean_of_the_positive_case(generator, M=1, N=65536):
    """Few rows: the sweep split into parts, merged as the monoid combines."""
    x = torch.randn(M, N, generator=generator) * 5
    kept = x > 0
    return dict(x=x), (x.double() * kept).sum(-1) / kept.sum(-1)


def compound_case(generator, M=23, N=777):
    x = torch.randn(M, N, generator=generator)
    return dict(x=x), torch.prod(1.0 + 0.01 * x.double(), -1) - 1.0


def prod_rows_case(generator, M=19, N=1003):
    x = 1.0 + 0.02 * torch.randn(M, N, generator=generator)
    x[2, 7] = 0.0
    x[3, :3] = -1.5   # an odd count of negative factors
    return dict(x=x), torch.prod(x.double(), -1)


def prod_columns_case(generator, M=301, N=37):
    x = (torch.randn(M, N, generator=generator) * 3).bfloat16()
    return dict(x=x), torch.prod(1.0 + 0.01 * x.double(), 0)


CASES = {"lse_rows": (lse_rows, rows_case), "lse_columns": (lse_columns, columns_case),
         "lse_masked": (lse_masked, masked_case), "lse_and_sum": (lse_and_sum, both_case),
         "argmax_rows": (argmax_rows, argmax_case),
         "argmax_specials": (argmax_rows, argmax_specials_case),
         "first_of_the_largest": (first_of_the_largest, first_of_the_largest_case),
         "most_counted": (most_counted, most_counted_case),
         "class_per_pixel": (class_per_pixel, class_per_pixel_case),
         "heatmap_peak": (heatmap_peak, heatmap_peak_case),
         "nearest_cell": (nearest_cell, nearest_cell_case),
         "maxima_down_columns": (maxima_down_columns, maxima_down_columns_case),
         "argmin_columns": (argmin_columns, argmin_case),
         "best_and_where": (best_and_where, best_case),
         "at_the_maximum": (at_the_maximum, at_the_maximum_case),
         "prod_rows": (prod_rows, prod_rows_case),
         "prod_columns": (prod_columns, prod_columns_case),
         "compound_rows": (compound_rows, compound_case),
         "top_two_margin": (top_two_margin, top_two_case),
         "mean_of_the_positive": (mean_of_the_positive, mean_of_the_positive_case)}


def error(out, want) -> float:
    """The largest error over the finite values relative to their largest magnitude; infinite
    where ``out`` is not infinite exactly where ``want`` is."""
    if not want.dtype.is_floating_point:   # indices: each the same
        return 0.0 if torch.equal(out.long(), want.long()) else float("inf")
    out = out.double()
    finite = torch.isfinite(want)
    if not torch.equal(torch.isfinite(out), finite) or not torch.equal(out[~finite],
                                                                       want[~finite]):
        return float("inf")
    return float((out[finite] - want[finite]).abs().max() / want[finite].abs().max())


if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel), error)
