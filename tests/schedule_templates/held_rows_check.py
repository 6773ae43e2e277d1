"""Reductions that read another's final value in a way no running correction carries, as
``tf.compile`` makes them for sm_90a, run by Triton's interpreter against float64 references in
torch (never the project's lowering), outputs poisoned: held to rows of one block where a block
holds the row (a mean absolute deviation over each sequence's first ``n[i]`` elements: the
count, the mean and the deviations in one sweep; an int32 count above half the max; two held
members over a max and a mean; deviations over the mean absolute deviation, an output along the
row reading a held member), the floor's two passes where it does not (a sum above the mean over
rows of 20000), and where a member reads a value kept relative to another (a count of the
softmax's probabilities above 1 %: the denominator is corrected as the maximum moves, so no
block holds its value).

    TRITON_INTERPRET=1 python -m tests.schedule_templates.held_rows_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tests.helpers import clear_of, poisoned_main
from tests.schedule_templates.staged_floor import interpreted
from tests.schedule_templates.user_written_extra_check import above_mean_sum


@tf.kernel
def masked_mad(x: T.Tensor["M", "N", "f32"], n: T.Tensor["M", "i32"]):
    """The mean absolute deviation of each row's first ``n[i]`` elements."""
    i, j = T.axes("i j")
    keep = j < n[i]
    count = T.sum(T.where(keep, 1.0, 0.0), over=j)
    mean = T.sum(T.where(keep, x[i, j], 0.0), over=j) / count
    return T.sum(T.where(keep, T.abs(x[i, j] - mean), 0.0), over=j) / count


@tf.kernel
def count_probable(x: T.Tensor["M", "N", "f32"]):
    """How many of each row's softmax probabilities exceed 1 %."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    l = T.sum(T.exp(x[i, j] - m), over=j)
    return T.sum(T.where(T.exp(x[i, j] - m) / l > 0.01, 1.0, 0.0), over=j)


@tf.kernel
def count_above_half_max(x: T.Tensor["M", "N", "f32"]):
    """How many of each row's values exceed half its max, as int32."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    return T.sum(T.where(x[i, j] > 0.5 * m, 1, 0), over=j)


@tf.kernel
def two_held(x: T.Tensor["M", "N", "f32"]):
    """A count above the mean plus the sum of the values within 10 % of the max."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    mean = T.sum(x[i, j], over=j) / T.size("N")
    above = T.sum(T.where(x[i, j] > mean, 1.0, 0.0), over=j)
    return above + T.sum(T.where(x[i, j] > 0.9 * m, x[i, j], 0.0), over=j)


@tf.kernel
def over_the_mad(x: T.Tensor["M", "N", "f32"]):
    """Each value's deviation from its row's mean over the row's mean absolute deviation."""
    i, j = T.axes("i j")
    mean = T.sum(x[i, j], over=j) / T.size("N")
    mad = T.sum(T.abs(x[i, j] - mean), over=j) / T.size("N")
    return (x[i, j] - mean) / mad


def _positive(g, M=7, N=333, *thresholds):
    x = clear_of(torch.rand(M, N, generator=g) * 10, *thresholds)
    return x, x.double()


def _mean(xd):
    return xd.mean(1, keepdim=True)


def _nine_tenths_of_max(xd):
    return 0.9 * xd.amax(1, keepdim=True)


def _half_max_case(g):
    x, xd = _positive(g)
    return dict(x=x), (xd > 0.5 * xd.amax(1, keepdim=True)).double().sum(1)


def _two_held_case(g):
    x, xd = _positive(g, 7, 333, _mean, _nine_tenths_of_max)
    return dict(x=x), (xd > _mean(xd)).double().sum(1) + \
        torch.where(xd > _nine_tenths_of_max(xd), xd, 0.0).sum(1)


def _over_the_mad_case(g):
    x, xd = _positive(g)
    centered = xd - xd.mean(1, keepdim=True)
    return dict(x=x), centered / centered.abs().mean(1, keepdim=True)


def _masked_mad_case(g, M=9, N=500):
    x = torch.randn(M, N, generator=g) * 2 + 50
    n = torch.randint(1, N + 1, (M,), generator=g, dtype=torch.int32)
    want = torch.stack([(x[r, :n[r]].double() - x[r, :n[r]].double().mean()).abs().mean()
                        for r in range(M)])
    return dict(x=x, n=n), want


def _wide_case(g, M=5, N=20000):
    x = clear_of(torch.randn(M, N, generator=g) * 3 + 100, _mean)
    xd = x.double()
    return dict(x=x), torch.where(xd > _mean(xd), xd, 0.0).sum(1)


def _one_percent(xd):
    """The value whose softmax probability in its row is 1 %."""
    return torch.logsumexp(xd, 1, keepdim=True) + torch.log(torch.tensor(0.01, dtype=xd.dtype))


def _probable_case(g, M=9, N=777):
    x = clear_of(torch.randn(M, N, generator=g) * 4, _one_percent)
    return dict(x=x), (torch.softmax(x.double(), 1) > 0.01).double().sum(1)


CASES = {"masked_mad": (masked_mad, _masked_mad_case),
         "count_above_half_max": (count_above_half_max, _half_max_case),
         "two_held": (two_held, _two_held_case),
         "over_the_mad": (over_the_mad, _over_the_mad_case),
         "above_mean_sum_wide": (above_mean_sum, _wide_case),
         "count_probable": (count_probable, _probable_case)}

if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
