"""Scans written as reductions up to each output's position (the kernels of
:mod:`benchmarks.scan_kernels` and more: an epilogue that reads the position, a condition beside
the position's, the mask written as a 0/1 factor, a product, a long row cut into parts), as
``tf.compile`` makes them for sm_90a, run by Triton's interpreter against torch in float64,
outputs poisoned; prints each case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.scan_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.scan_kernels import (cumulative_sum, log_cumulative_sum_exp, long_cumulative_sum,
                                     running_max, segment_offsets, sum_to_the_end)
from tests.helpers import poisoned_main


@tf.kernel
def running_mean(x: T.Tensor["B", "N", "f32"]):
    """The mean of each row so far: the epilogue reads the position."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j <= i, x[b, j], 0.0), over=j) / (i + 1)


@tf.kernel
def cumulative_sum_within_lengths(x: T.Tensor["B", "N", "f32"], n: T.Tensor["B", "i32"]):
    """A cumulative sum of each row's first ``n[b]`` values (the padding after them adds
    nothing), the mask written as a 0/1 factor."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(x[b, j] * T.where((j <= i) & (j < n[b]), 1.0, 0.0), over=j)


@tf.kernel
def survival(p: T.Tensor["B", "N", "f32"]):
    """The probability of surviving every step so far: a cumulative product."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.prod(T.where(j <= i, 1.0 - p[b, j], 1.0), over=j)


def cumsum_case(generator, B=3, N=1000):
    x = (torch.randn(B, N, generator=generator) * 10).bfloat16()
    return dict(x=x), torch.cumsum(x.double(), -1)


def long_case(generator, N=150001):   # cut into parts: their totals start the later ones
    x = torch.randn(N, generator=generator) * 100 + 3
    return dict(x=x), torch.cumsum(x.double(), 0)


def running_max_case(generator, B=2, S=333, D=45):
    x = torch.randn(B, S, D, generator=generator) * 1e3
    return dict(x=x), torch.cummax(x.double(), 1).values


def logcumsumexp_case(generator, B=3, N=777):
    x = torch.randn(B, N, generator=generator) * 30
    return dict(x=x), torch.logcumsumexp(x.double(), -1)


def offsets_case(generator, G=5000):
    lengths = torch.randint(0, 10**5, (G,), generator=generator, dtype=torch.int32)
    return dict(lengths=lengths), (torch.cumsum(lengths.double(), 0) - lengths.double())


def to_the_end_case(generator, B=4, N=999):
    r = torch.randn(B, N, generator=generator) * 50
    return dict(r=r), torch.flip(torch.cumsum(torch.flip(r.double(), (-1,)), -1), (-1,))


def running_mean_case(generator, B=3, N=500):
    x = torch.randn(B, N, generator=generator) * 7 + 2
    return dict(x=x), torch.cumsum(x.double(), -1) / torch.arange(1, N + 1)


def lengths_case(generator, B=4, N=600):
    x = torch.randn(B, N, generator=generator) * 10
    n = torch.randint(0, N + 1, (B,), generator=generator, dtype=torch.int32)
    kept = x.double() * (torch.arange(N)[None, :] < n[:, None])
    return dict(x=x, n=n), torch.cumsum(kept, -1)


def survival_case(generator, B=3, N=400):
    p = torch.rand(B, N, generator=generator) * 0.02
    return dict(p=p), torch.cumprod(1 - p.double(), -1)


CASES = {"cumulative_sum": (cumulative_sum, cumsum_case),
         "long_cumulative_sum": (long_cumulative_sum, long_case),
         "running_max": (running_max, running_max_case),
         "log_cumulative_sum_exp": (log_cumulative_sum_exp, logcumsumexp_case),
         "segment_offsets": (segment_offsets, offsets_case),
         "sum_to_the_end": (sum_to_the_end, to_the_end_case),
         "running_mean": (running_mean, running_mean_case),
         "cumulative_sum_within_lengths": (cumulative_sum_within_lengths, lengths_case),
         "survival": (survival, survival_case)}


def _compiled(name, kernel):
    made = tf.compile(kernel, target="cuda:sm_90a")
    assert made.schedule_origin().startswith("scan template"), made.schedule_origin()
    return made


if __name__ == "__main__":
    poisoned_main(CASES, _compiled)
