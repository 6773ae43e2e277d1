"""GEMM chains: the feed-forward block ``act(X·W1)·W2`` with GELU, and SwiGLU ``(silu(X·W1)⊙(X·W3))·W2``.

Weights are stored ``[in, out]``: ``x[M, K]``, ``w1[K, N]``, ``w2[N, O]`` — or, in
``ffn_swiglu_linear``, ``[out, in]`` as ``torch.nn.Linear`` keeps them.
"""
from __future__ import annotations

import tensorfuse as tf
from tensorfuse import dsl as T


@tf.kernel
def ffn_gelu(x: T.Tensor["M", "K", "bf16"], w1: T.Tensor["K", "N", "bf16"],
             w2: T.Tensor["N", "O", "bf16"]):
    i, k, n, o = T.axes("i k n o")
    h = T.gelu(T.sum(x[i, k] * w1[k, n], over=k))
    return T.sum(h * w2[n, o], over=n)


@tf.kernel
def ffn_swiglu(x: T.Tensor["M", "K", "bf16"], w1: T.Tensor["K", "N", "bf16"],
               w3: T.Tensor["K", "N", "bf16"], w2: T.Tensor["N", "O", "bf16"]):
    i, k, n, o = T.axes("i k n o")
    gate = T.sum(x[i, k] * w1[k, n], over=k)
    up = T.sum(x[i, k] * w3[k, n], over=k)
    h = T.silu(gate) * up
    return T.sum(h * w2[n, o], over=n)


def swiglu_linear_output(x, gate_proj, up_proj, down_proj):
    """``down(silu(gate(x)) * up(x))`` with ``[out, in]`` weights."""
    i, k, n, o = T.axes("i k n o")
    gate = T.sum(x[i, k] * gate_proj[n, k], over=k)
    up = T.sum(x[i, k] * up_proj[n, k], over=k)
    h = T.silu(gate) * up
    return T.sum(h * down_proj[o, n], over=n)


@tf.kernel
def ffn_swiglu_linear(x: T.Tensor["M", "K", "bf16"], gate_proj: T.Tensor["N", "K", "bf16"],
                      up_proj: T.Tensor["N", "K", "bf16"], down_proj: T.Tensor["O", "N", "bf16"]):
    """SwiGLU with the weights as ``torch.nn.Linear`` (and Llama's MLP) keeps them: ``[out, in]``."""
    return swiglu_linear_output(x, gate_proj, up_proj, down_proj)


FFN_KERNELS = {"ffn_gelu": ffn_gelu, "ffn_swiglu": ffn_swiglu,
               "ffn_swiglu_linear": ffn_swiglu_linear}
