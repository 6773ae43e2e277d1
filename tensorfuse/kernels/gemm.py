"""GEMMs: a plain matrix product, ``torch.nn.Linear`` (weight stored ``[out, in]``, with bias), and
the gated pair of a SwiGLU block ``silu(x·w1) ⊙ (x·w3)``.

``x[M, K]``; ``matmul`` takes ``w[K, N]``, ``linear`` and ``swiglu_gate`` take weights as
``torch.nn.Linear`` keeps them, ``[N, K]`` (read as they are, without a transposed copy).
"""
from __future__ import annotations

import tensorfuse as tf
from tensorfuse import dsl as T


@tf.kernel
def matmul(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["K", "N", "bf16"]):
    i, j, k = T.axes("i j k")
    return T.sum(x[i, k] * w[k, j], over=k)


@tf.kernel
def linear(x: T.Tensor["M", "K", "bf16"], weight: T.Tensor["N", "K", "bf16"],
           bias: T.Tensor["N", "bf16"]):
    i, j, k = T.axes("i j k")
    return T.sum(x[i, k] * weight[j, k], over=k) + bias[j]


@tf.kernel
def swiglu_gate(x: T.Tensor["M", "K", "bf16"], w1: T.Tensor["N", "K", "bf16"],
                w3: T.Tensor["N", "K", "bf16"]):
    i, j, k = T.axes("i j k")
    return T.silu(T.sum(x[i, k] * w1[j, k], over=k)) * T.sum(x[i, k] * w3[j, k], over=k)


GEMM_KERNELS = {"matmul": matmul, "linear": linear, "swiglu_gate": swiglu_gate}
