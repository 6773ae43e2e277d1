"""Reductions over ranges of several axes — an integral image, a running maximum over a grid,
a 3-D prefix sum, a cumulative sum of row sums, a suffix-and-prefix table under a mask, a box
and a maximum filter (a band an axis) — as
``tf.compile`` makes them for sm_90a (nested, a scan an axis: ``schedule_templates/
nested_scans.py``), run by Triton's interpreter against torch in float64, outputs poisoned;
prints each case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.nested_scans_check SEED
"""
import torch
import torch.nn.functional as F

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.scan_kernels import integral_image
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


@tf.kernel
def integral_image_bf16(x: T.Tensor["H", "W", "bf16"]):
    j, l = T.axes("j l")
    i, k = T.axis("i", "H"), T.axis("k", "W")
    return T.cast(T.sum(T.where((l <= k) & (j <= i), x[j, l], 0.0), over=(l, j)), "bf16")


@tf.kernel
def running_grid_max(x: T.Tensor["B", "H", "W", "f32"]):
    b, j, l = T.axes("b j l")
    i, k = T.axis("i", "H"), T.axis("k", "W")
    return T.max(T.where((j <= i) & (l <= k), x[b, j, l], float("-inf")), over=(j, l))


@tf.kernel
def prefix_sum_3d(x: T.Tensor["D", "H", "W", "f32"]):
    a, j, l = T.axes("a j l")
    c, i, k = T.axis("c", "D"), T.axis("i", "H"), T.axis("k", "W")
    return T.sum(T.where((a <= c) & (j <= i) & (l <= k), x[a, j, l], 0.0), over=(a, j, l))


@tf.kernel
def cumulative_row_sums(x: T.Tensor["B", "N", "C", "f32"]):
    """The running sum over the sequence of each position's sum over its channels."""
    b, j, l = T.axes("b j l")
    i = T.axis("i", "N")
    return T.sum(T.where(j <= i, x[b, j, l], 0.0), over=(j, l))


@tf.kernel
def masked_corner_sums(x: T.Tensor["B", "H", "W", "f32"], keep: T.Tensor["B", "bool"]):
    """From each pixel down to the last row and back to the first column, for kept images
    (0 for the others)."""
    b, j, l = T.axes("b j l")
    i, k = T.axis("i", "H"), T.axis("k", "W")
    return T.sum(T.where(keep[b] & (j >= i) & (l <= k), x[b, j, l], 0.0), over=(j, l))


@tf.kernel
def box_filter_5(x: T.Tensor["B", "H", "W", "f32"]):
    """The mean of the 5 × 5 pixels around each (zeros past the edges): a band an axis."""
    b, j, l = T.axes("b j l")
    i, k = T.axis("i", "H"), T.axis("k", "W")
    near = (j >= i - 2) & (j <= i + 2) & (l >= k - 2) & (l <= k + 2)
    return T.sum(T.where(near, x[b, j, l], 0.0), over=(j, l)) / 25.0


@tf.kernel
def max_filter_3(x: T.Tensor["B", "H", "W", "f32"]):
    b, j, l = T.axes("b j l")
    i, k = T.axis("i", "H"), T.axis("k", "W")
    near = (j > i - 2) & (j < i + 2) & (l > k - 2) & (l < k + 2)
    return T.max(T.where(near, x[b, j, l], float("-inf")), over=(j, l))


def _image(generator, B=2, H=37, W=1100):
    x = torch.randn(B, H, W, generator=generator) * 10 + 1
    return dict(x=x), x.double().cumsum(1).cumsum(2)


def _image_bf16(generator, H=70, W=300):
    x = (torch.rand(H, W, generator=generator) * 4).bfloat16()
    return dict(x=x), x.double().cumsum(0).cumsum(1)


def _grid_max(generator, B=3, H=40, W=333):
    x = torch.randn(B, H, W, generator=generator) * 1e3
    return dict(x=x), x.double().cummax(1).values.cummax(2).values


def _cube(generator, D=5, H=9, W=130):
    x = torch.randn(D, H, W, generator=generator)
    return dict(x=x), x.double().cumsum(0).cumsum(1).cumsum(2)


def _row_sums(generator, B=3, N=1500, C=24):
    x = torch.randn(B, N, C, generator=generator)
    return dict(x=x), x.double().sum(2).cumsum(1)


def _corners(generator, B=4, H=30, W=200):
    x = torch.randn(B, H, W, generator=generator)
    keep = torch.rand(B, generator=generator) > 0.3
    keep[0], keep[1] = True, False
    table = x.double().flip(1).cumsum(1).flip(1).cumsum(2)
    return dict(x=x, keep=keep), torch.where(keep[:, None, None], table, 0.0)


def _box(generator, B=2, H=45, W=1500):
    x = torch.randn(B, H, W, generator=generator) * 10
    padded = F.pad(x[:, None].double(), (2, 2, 2, 2))
    return dict(x=x), F.avg_pool2d(padded, 5, 1)[:, 0]


def _max_filter(generator, B=3, H=30, W=700):
    x = torch.randn(B, H, W, generator=generator) * 100
    padded = F.pad(x[:, None].double(), (1, 1, 1, 1), value=-torch.inf)
    return dict(x=x), F.max_pool2d(padded, 3, 1)[:, 0]


CASES = {"integral_image": (integral_image, _image),
         "integral_image_bf16": (integral_image_bf16, _image_bf16),
         "running_grid_max": (running_grid_max, _grid_max),
         "prefix_sum_3d": (prefix_sum_3d, _cube),
         "cumulative_row_sums": (cumulative_row_sums, _row_sums),
         "masked_corner_sums": (masked_corner_sums, _corners),
         "box_filter_5": (box_filter_5, _box), "max_filter_3": (max_filter_3, _max_filter)}


def _compiled(name, kernel):
    made = tf.compile(kernel, target="cuda:sm_90a")
    assert "written as one reduction an axis" in getattr(made, "note", ""), made
    return interpreted(kernel)   # (the stages' kernels picked as on a GPU)


if __name__ == "__main__":
    poisoned_main(CASES, _compiled)
