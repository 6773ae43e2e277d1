"""Kernels over windows whose count the kernel derives from the input's size, as a user writes
them (``T.axis("o", (T.size("L") - 3) // 2 + 1)``): a max pool of window 3 and stride 2, a
ResNet stem's 3 × 3 average pool of stride 2, a depthwise convolution without padding — through
``tf.compile`` defaults against torch eager (``F.max_pool1d``, ``F.avg_pool2d``, ``F.conv1d``)
and ``torch.compile`` in the same process, each checked against a float64 reference first (the
harness of :mod:`benchmarks.user_kernels`).

    python -m benchmarks.window_kernels [--only NAME,…]

Rows: ``benchmark`` = ``user/<name>``; GB/s of the input read and the output written; CSV
``benchmarks/results/<date>-<device>-window-kernels.csv``.
"""
import torch
import torch.nn.functional as F

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.kernel_suite import Case, main, rows_case


@tf.kernel
def max_pool_stride_2(x: T.Tensor["B", "C", "L", "bf16"]):
    """``F.max_pool1d(x, 3, 2)``: windows of 3 that overlap, ``(L − 3) // 2 + 1`` of them."""
    b, c = T.axes("b c")
    o = T.axis("o", (T.size("L") - 3) // 2 + 1)
    k = T.axis("k", 3)
    return T.max(x[b, c, o * 2 + k], over=k)


@tf.kernel
def avg_pool_3x3_stride_2(x: T.Tensor["B", "C", "H", "W", "f32"]):
    """``F.avg_pool2d(x, 3, 2)``: the mean of each 3 × 3 window, every second row and column."""
    b, c = T.axes("b c")
    p = T.axis("p", (T.size("H") - 3) // 2 + 1)
    q = T.axis("q", (T.size("W") - 3) // 2 + 1)
    r, s = T.axis("r", 3), T.axis("s", 3)
    return T.mean(x[b, c, p * 2 + r, q * 2 + s], over=(r, s))


@tf.kernel
def depthwise_conv_valid(x: T.Tensor["B", "C", "L", "f32"], w: T.Tensor["C", "K", "f32"]):
    """A depthwise convolution without padding: ``L − K + 1`` outputs a channel."""
    b, c = T.axes("b c")
    o = T.axis("o", T.size("L") - T.size("K") + 1)
    k = T.axis("k", "K")
    return T.sum(x[b, c, o + k] * w[c, k], over=k)


def _max_pool_case(generator, B=32, C=256, L=16384) -> Case:
    x = torch.randn(B, C, L, generator=generator).to("cuda", torch.bfloat16)
    return rows_case("max_pool_stride_2", max_pool_stride_2, lambda t: F.max_pool1d(t, 3, 2),
                     x, {}, f"B{B} C{C} L{L} window 3 stride 2")


def _avg_pool_case(generator, B=64, C=64, H=112, W=112) -> Case:
    x = torch.randn(B, C, H, W, generator=generator).cuda()
    return rows_case("avg_pool_3x3_stride_2", avg_pool_3x3_stride_2,
                     lambda t: F.avg_pool2d(t, 3, 2), x, {},
                     f"B{B} C{C} H{H} W{W} f32 3x3 stride 2")


def _conv_case(generator, B=16, C=1024, L=4096, K=4) -> Case:
    x = torch.randn(B, C, L, generator=generator).cuda()
    w = torch.randn(C, K, generator=generator).cuda()

    def eager(t, weights):
        return F.conv1d(t, weights[:, None], groups=t.shape[1])
    return rows_case("depthwise_conv_valid", depthwise_conv_valid, eager, x, {"w": w},
                     f"B{B} C{C} L{L} K{K} f32")


WINDOW_KERNELS = {"max_pool_stride_2": _max_pool_case, "avg_pool_3x3_stride_2": _avg_pool_case,
                  "depthwise_conv_valid": _conv_case}

if __name__ == "__main__":
    main(WINDOW_KERNELS, "window-kernels", __doc__)
