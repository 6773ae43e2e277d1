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
         "normalised": (normalised, normalised_case)}


def made(name, kernel):
    """``tf.compile``'s kernel for sm_90a with its inner kernels run by the interpreter, behind
    the rewrite that gives the user's shape [] back (stages' kernels likewise)."""
    from tensorfuse.widened_kernel import RewrittenKernel

    outer = tf.compile(kernel, "cuda:sm_90a")
    if isinstance(outer, RewrittenKernel):
        return RewrittenKernel(kernel.program, interpreted(kernel), outer.note)
    return interpreted(kernel)


if __name__ == "__main__":
    poisoned_main(CASES, made)
