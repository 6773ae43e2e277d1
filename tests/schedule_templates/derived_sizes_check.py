"""Kernels over axes whose sizes they derive from the tensors' (``T.axis("o", (T.size("L") −
3) // 2 + 1)``; the kernels of :mod:`benchmarks.window_kernels`): a max pool of window 3 and
stride 2 over a ragged length, a 3 × 3 average pool of stride 2 over both spatial axes, a
depthwise convolution without padding (``L − K + 1`` outputs), a softmax over a row's even
positions (the row template sweeping a derived axis) and a nearest 2× upsampling (axes of twice
the input's sizes), as ``tf.compile`` makes them for
sm_90a, run by Triton's interpreter against torch in float64, outputs poisoned; prints each
case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.derived_sizes_check SEED
"""
import torch
import torch.nn.functional as F

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.window_kernels import (avg_pool_3x3_stride_2, depthwise_conv_valid,
                                       max_pool_stride_2)
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


def max_pool_case(generator, B=3, C=5, L=1000):
    x = (torch.randn(B, C, L, generator=generator) * 50).bfloat16()
    return dict(x=x), F.max_pool1d(x.double(), 3, 2)


def avg_pool_case(generator, B=2, C=3, H=37, W=30):
    x = torch.randn(B, C, H, W, generator=generator) * 1e3 + 7
    return dict(x=x), F.avg_pool2d(x.double(), 3, 2)


def conv_case(generator, B=2, C=6, L=777, K=5):
    x = torch.randn(B, C, L, generator=generator) * 10
    w = torch.randn(C, K, generator=generator)
    return dict(x=x, w=w), F.conv1d(x.double(), w.double()[:, None], groups=C)


@tf.kernel
def softmax_of_every_second(x: T.Tensor["B", "L", "f32"]):
    """A softmax over the even positions of each row: the row template sweeps a derived axis."""
    b = T.axis("b", "B")
    o = T.axis("o", (T.size("L") + 1) // 2)
    m = T.max(x[b, o * 2], over=o)
    e = T.exp(x[b, o * 2] - m)
    return e / T.sum(e, over=o)


@tf.kernel
def upsample_nearest_2x(x: T.Tensor["B", "C", "H", "W", "bf16"]):
    """``F.interpolate(x, scale_factor=2)``: axes of twice the input's sizes (derived sizes
    ``H_`` and ``W_``: a size is no function of itself)."""
    b, c = T.axes("b c")
    h = T.axis("h", T.size("H") * 2)
    w = T.axis("w", T.size("W") * 2)
    return x[b, c, h // 2, w // 2]


def upsample_case(generator, B=2, C=3, H=17, W=9):
    x = torch.randn(B, C, H, W, generator=generator).bfloat16()
    return dict(x=x), F.interpolate(x.double(), scale_factor=2, mode="nearest")


def every_second_case(generator, B=7, L=3001):
    x = torch.randn(B, L, generator=generator) * 30
    return dict(x=x), torch.softmax(x[:, ::2].double(), -1)


CASES = {"max_pool_stride_2": (max_pool_stride_2, max_pool_case),
         "avg_pool_3x3_stride_2": (avg_pool_3x3_stride_2, avg_pool_case),
         "depthwise_conv_valid": (depthwise_conv_valid, conv_case),
         "softmax_of_every_second": (softmax_of_every_second, every_second_case),
         "upsample_nearest_2x": (upsample_nearest_2x, upsample_case)}


if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
