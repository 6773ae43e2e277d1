"""Pairwise reductions as users write them — distances between point sets, a max-plus product, a
weighted and scaled distance, distances per batch — with their float64 references (torch, never
the project's lowering), run through the contraction template's pairwise tiles for sm_90a by
Triton's interpreter at ragged sizes (no size a multiple of its block: rows, columns and the
contracted axis all masked; contracted extents over 16, below which sums are written out in one
flat pass) and large value ranges, outputs poisoned (NaN) before each run. Prints each case's
relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.pairwise_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.unlisted_kernels import (gaussian_kernel_sum, manhattan_distances,
                                         squared_distances)
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


@tf.kernel
def chebyshev_distances(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"]):
    """The largest coordinate difference of every pair (a maximum, not a sum)."""
    i, j, d = T.axes("i j d")
    return T.max(T.abs(x[i, d] - y[j, d]), over=d)


@tf.kernel
def max_plus(a: T.Tensor["M", "K", "f32"], b: T.Tensor["K", "N", "f32"]):
    """The tropical (max, +) product of dynamic programming and shortest paths: ``b`` read
    along its outer axis."""
    i, j, k = T.axes("i j k")
    return T.max(a[i, k] + b[k, j], over=k)


@tf.kernel
def nearest_coordinate(x: T.Tensor["M", "D", "bf16"], y: T.Tensor["N", "D", "bf16"]):
    """The smallest coordinate gap of every pair (a minimum of bf16 points, in f32)."""
    i, j, d = T.axes("i j d")
    return T.cast(T.min(T.abs(x[i, d] - y[j, d]), over=d), "f32")


@tf.kernel
def weighted_distances(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"],
                       w: T.Tensor["D", "f32"], s: T.Tensor["M", "f32"],
                       bias: T.Tensor["N", "f32"]):
    """A diagonal-metric distance of scaled points, plus a per-column bias: a load of the
    contracted axis alone (``w``), of the rows alone (``s``) and one in the epilogue."""
    i, j, d = T.axes("i j d")
    diff = x[i, d] * s[i] - y[j, d]
    return T.sum(w[d] * diff * diff, over=d) + bias[j]


@tf.kernel
def batched_distances(x: T.Tensor["B", "M", "D", "f32"], y: T.Tensor["B", "N", "D", "f32"]):
    """Squared distances per batch item: the batch axis in the grid."""
    b, i, j, d = T.axes("b i j d")
    return T.sum((x[b, i, d] - y[b, j, d]) * (x[b, i, d] - y[b, j, d]), over=d)


def _points(generator, *shape, width=30.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=generator) * width + width / 3).to(dtype)


def squared_case(generator, M=37, N=45, D=21):
    x, y = _points(generator, M, D), _points(generator, N, D)
    return dict(x=x, y=y), torch.cdist(x.double(), y.double()) ** 2


def manhattan_case(generator, M=70, N=29, D=19):
    x, y = (_points(generator, n, D, dtype=torch.bfloat16) for n in (M, N))
    return dict(x=x, y=y), torch.cdist(x.double(), y.double(), p=1)


def chebyshev_case(generator, M=37, N=45, D=21):
    x, y = _points(generator, M, D), _points(generator, N, D)
    return dict(x=x, y=y), (x.double()[:, None] - y.double()[None]).abs().amax(-1)


def max_plus_case(generator, M=33, K=21, N=40):
    a, b = _points(generator, M, K), _points(generator, K, N, width=100.0)
    return dict(a=a, b=b), (a.double()[:, :, None] + b.double()[None]).amax(1)


def nearest_case(generator, M=37, N=45, D=23):
    x, y = (_points(generator, n, D, dtype=torch.bfloat16) for n in (M, N))
    return dict(x=x, y=y), (x.double()[:, None] - y.double()[None]).abs().amin(-1)


def weighted_case(generator, M=37, N=45, D=22):
    x, y = _points(generator, M, D), _points(generator, N, D)
    w = torch.rand(D, generator=generator) + 0.1
    s = torch.rand(M, generator=generator) * 2
    bias = _points(generator, N)
    diff = x.double()[:, None] * s.double()[:, None, None] - y.double()[None]
    return dict(x=x, y=y, w=w, s=s, bias=bias), (w.double() * diff * diff).sum(-1) + \
        bias.double()


def batched_case(generator, B=3, M=20, N=70, D=18):
    x, y = _points(generator, B, M, D), _points(generator, B, N, D)
    return dict(x=x, y=y), torch.cdist(x.double(), y.double()) ** 2


def gaussian_case(generator, M=37, N=45, D=3):
    """Stages: the pairs' distances (3 terms a pair, tiled all the same), then the row sum."""
    x, y = (torch.rand(n, D, generator=generator) * 2 for n in (M, N))
    b = torch.randn(N, generator=generator) * 100
    d2 = torch.cdist(x.double(), y.double()) ** 2
    return dict(x=x, y=y, b=b), torch.exp(-d2) @ b.double()


CASES = {"squared_distances": (squared_distances, squared_case),
         "manhattan_distances": (manhattan_distances, manhattan_case),
         "chebyshev_distances": (chebyshev_distances, chebyshev_case),
         "max_plus": (max_plus, max_plus_case),
         "nearest_coordinate": (nearest_coordinate, nearest_case),
         "weighted_distances": (weighted_distances, weighted_case),
         "batched_distances": (batched_distances, batched_case),
         "gaussian_kernel_sum": (gaussian_kernel_sum, gaussian_case)}
# f32: sums of up to 23 f32 terms (their rounding, 2⁻²⁴ each); bf16: one rounding (2⁻⁹)
TOLERANCE = dict.fromkeys(CASES, 1e-5) | {"manhattan_distances": 8e-3}

if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
