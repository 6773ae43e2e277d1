"""Pairwise reductions as users write them — distances between point sets, a max-plus product, a
weighted and scaled distance, distances per batch, and reductions of them over the columns (a
Gaussian kernel's sum, nearest neighbours, kernel regression, an exponential kernel's sum over
tensor-core products) — with their float64 references (torch, never the project's lowering),
run through the contraction template for sm_90a by Triton's interpreter at ragged sizes (rows,
columns and the contracted axis masked; up to 8 indices each loaded where it is used, more in
tiles split in registers) and large value ranges, outputs poisoned (NaN) before each run.
Prints each case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.pairwise_check SEED [dynamic]
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.unlisted_kernels import (gaussian_kernel_sum, manhattan_distances,
                                         nearest_neighbour, squared_distances)
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


@tf.kernel
def batched_nearest_neighbour(x: T.Tensor["B", "M", "D", "f32"],
                              y: T.Tensor["B", "N", "D", "f32"]):
    """Each point's squared distance to its nearest neighbour in another set, per batch item
    (a Chamfer distance's half): a minimum over the columns of the pairs' sums."""
    b, i, j, d = T.axes("b i j d")
    d2 = T.sum((x[b, i, d] - y[b, j, d]) * (x[b, i, d] - y[b, j, d]), over=d)
    return T.min(d2, over=j)


@tf.kernel
def kernel_regression(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"],
                      v: T.Tensor["N", "f32"], bandwidth: T.f32):
    """Nadaraya-Watson regression: a Gaussian kernel's weighted mean of the values, two sums
    over the columns and their ratio."""
    i, j, d = T.axes("i j d")
    d2 = T.sum((x[i, d] - y[j, d]) * (x[i, d] - y[j, d]), over=d)
    weight = T.exp(-d2 / bandwidth)
    return T.sum(weight * v[j], over=j) / T.sum(weight, over=j)


@tf.kernel
def exp_kernel_sum(x: T.Tensor["M", "D", "bf16"], y: T.Tensor["N", "D", "bf16"],
                   v: T.Tensor["N", "f32"], scale: T.f32):
    """An exponential kernel's sum, ``Σ_j exp(scale · x_i·y_j) v_j`` (random-feature and
    unnormalised attention): the tensor cores' products, then a sum over the columns."""
    i, j, d = T.axes("i j d")
    s = T.sum(x[i, d] * y[j, d], over=d)
    return T.sum(T.exp(s * scale) * v[j], over=j)


@tf.kernel
def product_statistics(x: T.Tensor["M", "D", "bf16"], y: T.Tensor["N", "D", "bf16"],
                       v: T.Tensor["N", "f32"]):
    """Three reductions over the columns of the tensor cores' products: each a state of the
    tile's size beside the accumulator (the widest tiles would spill them)."""
    i, j, d = T.axes("i j d")
    s = T.sum(x[i, d] * y[j, d], over=d)
    return T.max(s, over=j), T.sum(s * v[j], over=j), T.min(s, over=j)


@tf.kernel
def nearest_other(x: T.Tensor["N", "D", "f32"]):
    """Each point's squared distance to its nearest other point of the same set: one tensor on
    both sides, the diagonal excluded by the axes' indices."""
    i, j, d = T.axes("i j d")
    d2 = T.sum((x[i, d] - x[j, d]) * (x[i, d] - x[j, d]), over=d)
    return T.min(T.where(i == j, float("inf"), d2), over=j)


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


def nearest_coordinate_case(generator, M=37, N=45, D=23):
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
    """One kernel: each row block sweeps the columns, the pairs' distances (3 terms a pair)
    summed through the kernel into the row's state."""
    x, y = (torch.rand(n, D, generator=generator) * 2 for n in (M, N))
    b = torch.randn(N, generator=generator) * 100
    d2 = torch.cdist(x.double(), y.double()) ** 2
    return dict(x=x, y=y, b=b), torch.exp(-d2) @ b.double()


def batched_nearest_case(generator, B=2, M=37, N=300, D=21):
    """N=300: several blocks of columns, the last ragged; D=21: several blocks of indices."""
    x, y = _points(generator, B, M, D), _points(generator, B, N, D)
    return dict(x=x, y=y), (torch.cdist(x.double(), y.double()) ** 2).amin(-1)


def nearest_case(generator, M=37, N=600, D=3):
    x, y = (torch.rand(n, D, generator=generator) * 4 for n in (M, N))
    return dict(x=x, y=y), (torch.cdist(x.double(), y.double()) ** 2).amin(-1)


def nearest_other_case(generator, N=300, D=7):
    x = torch.rand(N, D, generator=generator) * 4
    d2 = torch.cdist(x.double(), x.double()) ** 2
    return dict(x=x), (d2 + torch.diag(torch.full((N,), float("inf"), dtype=torch.float64))
                       ).amin(-1)


def regression_case(generator, M=37, N=300, D=5):
    x, y = (torch.rand(n, D, generator=generator) * 3 for n in (M, N))
    v = torch.randn(N, generator=generator) * 100
    weight = torch.exp(-torch.cdist(x.double(), y.double()) ** 2 / 2.0)
    return dict(x=x, y=y, v=v, bandwidth=2.0), (weight @ v.double()) / weight.sum(-1)


def exp_sum_case(generator, M=37, N=300, D=40):
    x, y = ((torch.randn(n, D, generator=generator) * 2).bfloat16() for n in (M, N))
    v = torch.randn(N, generator=generator)
    return dict(x=x, y=y, v=v, scale=0.05), \
        torch.exp(x.double() @ y.double().T * 0.05) @ v.double()


def statistics_case(generator, M=37, N=300, D=40):
    x, y = ((torch.randn(n, D, generator=generator) * 2).bfloat16() for n in (M, N))
    v = torch.randn(N, generator=generator)
    s = x.double() @ y.double().T
    return dict(x=x, y=y, v=v), (s.amax(-1), s @ v.double(), s.amin(-1))


CASES = {"squared_distances": (squared_distances, squared_case),
         "manhattan_distances": (manhattan_distances, manhattan_case),
         "chebyshev_distances": (chebyshev_distances, chebyshev_case),
         "max_plus": (max_plus, max_plus_case),
         "nearest_coordinate": (nearest_coordinate, nearest_coordinate_case),
         "weighted_distances": (weighted_distances, weighted_case),
         "batched_distances": (batched_distances, batched_case),
         "gaussian_kernel_sum": (gaussian_kernel_sum, gaussian_case),
         "batched_nearest_neighbour": (batched_nearest_neighbour, batched_nearest_case),
         "nearest_neighbour": (nearest_neighbour, nearest_case),
         "nearest_other": (nearest_other, nearest_other_case),
         "kernel_regression": (kernel_regression, regression_case),
         "exp_kernel_sum": (exp_kernel_sum, exp_sum_case),
         "product_statistics": (product_statistics, statistics_case)}
# f32: sums of up to 23 f32 terms (their rounding, 2⁻²⁴ each); bf16: one rounding (2⁻⁹)
TOLERANCE = dict.fromkeys(CASES, 1e-5) | {"manhattan_distances": 8e-3,
                                          "product_statistics": 8e-3}   # bf16 outputs

if __name__ == "__main__":   # a second argument "dynamic": every size a kernel argument
    import sys

    dynamic = True if sys.argv[2:] == ["dynamic"] else None
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel, dynamic=dynamic))
