"""Reductions that read another's final value in a way no running correction carries, as
``tf.compile`` makes them for sm_90a, run by Triton's interpreter against float64 references in
torch (never the project's lowering), outputs poisoned: held to rows of one block where a block
holds the row (a mean absolute deviation over each sequence's first ``n[i]`` elements: the
count, the mean and the deviations in one sweep), the floor's two passes where it does not (a
sum above the mean over rows of 20000), and where a member reads a value kept relative to
another (a count of the softmax's probabilities above 1 %: the denominator is corrected as the
maximum moves, so no block holds its value).

    TRITON_INTERPRET=1 python -m tests.schedule_templates.held_rows_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tests.helpers import poisoned_main
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


def _masked_mad_case(g, M=9, N=500):
    x = torch.randn(M, N, generator=g) * 2 + 50
    n = torch.randint(1, N + 1, (M,), generator=g, dtype=torch.int32)
    want = torch.stack([(x[r, :n[r]].double() - x[r, :n[r]].double().mean()).abs().mean()
                        for r in range(M)])
    return dict(x=x, n=n), want


def _wide_case(g, M=5, N=20000):
    x = torch.randn(M, N, generator=g) * 3 + 100
    xd = x.double()
    return dict(x=x), torch.where(xd > xd.mean(1, keepdim=True), xd, 0.0).sum(1)


def _probable_case(g, M=9, N=777):
    x = torch.randn(M, N, generator=g) * 4
    return dict(x=x), (torch.softmax(x.double(), 1) > 0.01).double().sum(1)


CASES = {"masked_mad": (masked_mad, _masked_mad_case),
         "above_mean_sum_wide": (above_mean_sum, _wide_case),
         "count_probable": (count_probable, _probable_case)}

if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
