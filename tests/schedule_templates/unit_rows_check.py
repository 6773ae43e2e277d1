"""Values reduced over every axis (benchmarks.full_reductions) as ``tf.compile`` makes them for
sm_90a — one row of an axis of one element, swept in parts — run by Triton's interpreter against
float64 references in torch, at ragged sizes and large value ranges, into NaN-filled outputs of
shape [] (the user's: the rewritten kernel writes them over one element). Prints each case's
relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.unit_rows_check SEED
"""
import torch

import tensorfuse as tf
from benchmarks.full_reductions import amax, mean_cross_entropy, sum_of_squares
from tests.helpers import poisoned_main
from tensorfuse import dsl as T
from tests.schedule_templates.staged_floor import interpreted


def amax_case(generator, M=37, N=3001):
    x = (torch.randn(M, N, generator=generator) * 50).bfloat16()
    x[M // 2, N // 3] = -3000.0   # the largest magnitude a negative value, far from the rest
    return dict(x=x), x.double().abs().max()


def sum_of_squares_case(generator, N=300007):
    """Long enough to be split in parts, ragged against every block."""
    g = torch.randn(N, generator=generator) * 1e3
    return dict(g=g), (g.double() ** 2).sum()


def mean_cross_entropy_case(generator, M=37, V=1003):
    logits = (torch.randn(M, V, generator=generator) * 8).bfloat16()
    target = torch.randint(0, V, (M,), generator=generator, dtype=torch.int32)
    return dict(logits=logits, target=target), \
        torch.nn.functional.cross_entropy(logits.double(), target.long())


@tf.kernel
def extremes(x: T.Tensor["M", "N", "bf16"]):
    """Two outputs over no axis."""
    i, j = T.axes("i j")
    return T.max(x[i, j], over=(i, j)), T.min(x[i, j], over=(i, j))


def extremes_case(generator, M=37, N=3001):
    x = (torch.randn(M, N, generator=generator) * 5).bfloat16()
    return dict(x=x), (x.double().max(), x.double().min())


@tf.kernel
def lse_and_mean(x: T.Tensor["M", "V", "f32"]):
    """An output per row and their mean over none: outputs over different axes, in stages."""
    i, v = T.axes("i v")
    lse = T.logsumexp(x[i, v], over=v)
    return lse, T.sum(lse, over=i) / T.size("M")


def lse_and_mean_case(generator, M=37, V=1003):
    x = torch.randn(M, V, generator=generator) * 10 + 100
    lse = torch.logsumexp(x.double(), 1)
    return dict(x=x), (lse, lse.mean())


@tf.kernel
def variance_all(x: T.Tensor["M", "N", "f32"]):
    """A sum over every axis that reads another's final value (rolled: a running mean)."""
    i, j = T.axes("i j")
    n = T.size("M") * T.size("N")
    mean = T.sum(x[i, j], over=(i, j)) / n
    return T.sum((x[i, j] - mean) * (x[i, j] - mean), over=(i, j)) / n


def variance_all_case(generator, M=37, N=3001):
    x = torch.randn(M, N, generator=generator) * 10 + 1000   # far from zero: a shifted sum
    return dict(x=x), x.double().var(unbiased=False)


@tf.kernel
def argmax_vector(x: T.Tensor["N", "f32"]):
    """An index over every axis: ties in different parts go to the first."""
    j = T.axes("j")
    return T.argmax(x[j], over=j)


def argmax_vector_case(generator, N=100003):
    x = torch.randn(N, generator=generator) * 3
    x[77777] = x[88888] = 50.0
    return dict(x=x), torch.tensor(77777.0, dtype=torch.float64)


@tf.kernel
def normalised(x: T.Tensor["M", "N", "f32"]):
    """A value over axes that reads one over none: two stages, the sum stored between them."""
    i, j = T.axes("i j")
    return x[i, j] / T.sum(x[i, j], over=(i, j))


@tf.kernel
def logsumexp_all(x: T.Tensor["N", "f32"]):
    """A rolled state over every axis: the parts' maxima differ, merged with their corrections."""
    j = T.axes("j")
    return T.logsumexp(x[j], over=j)


def logsumexp_all_case(generator, N=300007):
    x = torch.randn(N, generator=generator) * 30
    x[N - 3] = 400.0   # the largest in the last part: every other part's sum is rescaled
    return dict(x=x), torch.logsumexp(x.double(), 0)


def normalised_case(generator, M=37, N=3001):
    x = torch.rand(M, N, generator=generator) * 100 + 0.5
    return dict(x=x), x.double() / x.double().sum()


CASES = {"amax": (amax, amax_case), "sum_of_squares": (sum_of_squares, sum_of_squares_case),
         "mean_cross_entropy": (mean_cross_entropy, mean_cross_entropy_case),
         "logsumexp_all": (logsumexp_all, logsumexp_all_case),
         "extremes": (extremes, extremes_case), "lse_and_mean": (lse_and_mean, lse_and_mean_case),
         "variance_all": (variance_all, variance_all_case),
         "argmax_vector": (argmax_vector, argmax_vector_case),
         "normalised": (normalised, normalised_case)}

if __name__ == "__main__":   # behind the rewrite that gives the user's shape [] back
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
