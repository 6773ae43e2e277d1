"""Row reductions over the last dimension of ``x[M, N]``: softmax, norms, cross-entropy."""
from __future__ import annotations

import tensorfuse as tf
from tensorfuse import dsl as T

X = T.Tensor["M", "N", "bf16"]


@tf.kernel
def softmax(x: X):
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    p = T.exp(x[i, j] - m)
    l = T.sum(p, over=j)  # noqa: E741
    return p / l


@tf.kernel
def log_softmax(x: X):
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    l = T.sum(T.exp(x[i, j] - m), over=j)  # noqa: E741
    return x[i, j] - m - T.log(l)


@tf.kernel
def layernorm(x: X, weight: T.Tensor["N", "bf16"], bias: T.Tensor["N", "bf16"], eps: T.f32):
    i, j = T.axes("i j")
    mean = T.sum(x[i, j], over=j) / T.size("N")
    centered = x[i, j] - mean
    var = T.sum(centered * centered, over=j) / T.size("N")
    return centered * T.rsqrt(var + eps) * weight[j] + bias[j]


def rms_normalize(x, weight, eps):
    """``x * rsqrt(mean(x²) + eps) * weight`` over the last axis of ``x[M, N]``."""
    i, j = T.axes("i j")
    ms = T.sum(x[i, j] * x[i, j], over=j) / T.size("N")
    return x[i, j] * T.rsqrt(ms + eps) * weight[j]


@tf.kernel
def rmsnorm(x: X, weight: T.Tensor["N", "bf16"], eps: T.f32):
    return rms_normalize(x, weight, eps)


@tf.kernel
def cross_entropy(logits: T.Tensor["M", "V", "bf16"], target: T.Tensor["M", "i32"]):
    """Per-row loss ``logsumexp(logits[i]) - logits[i, target[i]]``, in f32."""
    i, j = T.axes("i j")
    m = T.max(logits[i, j], over=j)
    l = T.sum(T.exp(logits[i, j] - m), over=j)  # noqa: E741
    return T.cast(m + T.log(l) - logits[i, target[i]], "f32")


ROW_KERNELS = {"softmax": softmax, "log_softmax": log_softmax, "layernorm": layernorm,
               "rmsnorm": rmsnorm, "cross_entropy": cross_entropy}
