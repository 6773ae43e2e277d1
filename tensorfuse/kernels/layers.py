"""The layers of a transformer block as DSL kernels, for any storage dtype: attention (causal or
not, grouped heads, a boolean or an additive mask, a logit soft-cap), RMSNorm, and the SwiGLU
MLP with ``nn.Linear`` weights. The model integrations (:mod:`tensorfuse.integrations`) compile these for
the tensors they meet; each variant is made once per dtype.

Layout as transformers hands it to an attention function: ``q[B, H, M, D]``,
``k, v[B, HKV, N, D]`` with ``H`` a multiple of ``HKV``; a causal mask is aligned to the bottom
right (query ``i`` sits at key position ``i + N - M``: prefill and decode alike); a boolean mask
``mask[B, 1, M, N]`` (``True``: attend) replaces it where the model made one (padding, packed
sequences, a cache longer than what it holds).
"""
import functools  # no ``from __future__ import annotations``: the DSL reads the annotations

import tensorfuse as tf
from tensorfuse import dsl as T

from .attention import key_position, scores, softmax_attend
from .ffn import swiglu_linear_output
from .rows import rms_normalize


def attention_kernel(dtype: str, causal: bool, masked: bool, softcap: bool,
                     sinks: str | None = None):
    """Softmax attention over grouped heads for ``dtype`` tensors: ``causal`` keeps keys up to
    the query's position, ``masked`` takes a ``mask[B, 1, M, N]`` (bool) argument too (a row it
    empties gives 0), ``softcap`` bounds the scores as ``cap * tanh(s / cap)`` (Gemma 2) before
    masking, ``sinks`` (their dtype) takes a ``sinks[H]`` argument: a score per head outside the
    keys that shares the softmax and attends to nothing (gpt-oss; not with ``softcap``). One
    kernel per variant however it is asked for (``sinks`` given or left out), so that its builds
    are shared and its ``cache_info()`` found."""
    return _attention_kernel(dtype, bool(causal), bool(masked), bool(softcap), sinks or None)


@functools.lru_cache(maxsize=None)
def _attention_kernel(dtype: str, causal: bool, masked: bool, softcap: bool, sinks):
    if sinks and softcap:
        raise ValueError("attention_kernel: sinks with a soft-cap are not a variant this makes")
    Q = T.Tensor["B", "H", "M", "D", dtype]
    KV = T.Tensor["B", "HKV", "N", "D", dtype]
    MASK = T.Tensor["B", 1, "M", "N", "bool"]
    SINKS = T.Tensor["H", sinks or "f32"]

    def body(q, k, v, mask, scale, cap, sink=None):
        b, h, i, j, d, e = T.axes("b h i j d e")
        hk = h // (T.size("H") // T.size("HKV"))
        s = scores(q, k, b, h, hk, i, j, d, scale)
        if softcap:
            s = cap * T.tanh(s / cap)
        if causal:
            s = T.where(key_position(i) >= j, s, -T.inf)
        sink = None if sink is None else sink[h]
        if not masked:
            out = softmax_attend(s, v[b, hk, j, e], j, sink=sink)
        else:   # a row the mask empties: 0, as SDPA's kernels
            s = T.where(mask[b, 0, i, j], s, -T.inf)
            out = softmax_attend(s, v[b, hk, j, e], j, empty=0.0, sink=sink)
        # sinks of a wider dtype (float32 beside bf16 activations) would widen the output; the
        # cast only there (a decode with it took another template: 64 µs against 30 on the H200,
        # benchmarks.attention_sinks)
        return out if sink is None or sinks == dtype else T.cast(out, dtype)

    name = "attention" + "_causal" * causal + "_masked" * masked + \
        "_softcap" * softcap + (f"_sinks_{sinks}" if sinks else "") + f"_{dtype}"
    if sinks and masked:
        def fn(q: Q, k: KV, v: KV, mask: MASK, sinks: SINKS, scale: T.f32):
            return body(q, k, v, mask, scale, None, sinks)
    elif sinks:
        def fn(q: Q, k: KV, v: KV, sinks: SINKS, scale: T.f32):
            return body(q, k, v, None, scale, None, sinks)
    elif masked and softcap:
        def fn(q: Q, k: KV, v: KV, mask: MASK, scale: T.f32, cap: T.f32):
            return body(q, k, v, mask, scale, cap)
    elif masked:
        def fn(q: Q, k: KV, v: KV, mask: MASK, scale: T.f32):
            return body(q, k, v, mask, scale, None)
    elif softcap:
        def fn(q: Q, k: KV, v: KV, scale: T.f32, cap: T.f32):
            return body(q, k, v, None, scale, cap)
    else:
        def fn(q: Q, k: KV, v: KV, scale: T.f32):
            return body(q, k, v, None, scale, None)
    return tf.kernel(fn, name=name)


@functools.lru_cache(maxsize=None)
def additive_mask_attention_kernel(dtype: str, mask_dtype: str, one_mask: bool):
    """Softmax attention over grouped heads for ``dtype`` tensors with an additive (float) mask
    ``mask[B, 1, M, N]`` of ``mask_dtype`` added to the scores — its values matter, not only
    where it is −∞: a relative bias, or padding and causality as transformers writes them (0
    and the dtype's lowest value). ``one_mask``: one ``[1, 1, M, N]`` mask serves every sequence
    (read at batch 0, not expanded). On sm_90a a 16-bit mask is read by the Hopper template as
    tiles of the scores (``schedule_templates.score_tiles``)."""
    Q = T.Tensor["B", "H", "M", "D", dtype]
    KV = T.Tensor["B", "HKV", "N", "D", dtype]
    MASK = T.Tensor[1 if one_mask else "B", 1, "M", "N", mask_dtype]

    def fn(q: Q, k: KV, v: KV, mask: MASK, scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        hk = h // (T.size("H") // T.size("HKV"))
        s = scores(q, k, b, h, hk, i, j, d, scale) + mask[0 if one_mask else b, 0, i, j]
        return softmax_attend(s, v[b, hk, j, e], j)

    name = f"attention_additive{'_one' * one_mask}_{mask_dtype}_mask_{dtype}"
    return tf.kernel(fn, name=name)


@functools.lru_cache(maxsize=None)
def rmsnorm_kernel(dtype: str):
    """``x * rsqrt(mean(x²) + eps) * weight`` over the last axis of ``x[M, N]``, computed in f32
    (Llama's RMSNorm, with one rounding instead of two)."""
    def rmsnorm(x: T.Tensor["M", "N", dtype], weight: T.Tensor["N", dtype], eps: T.f32):
        return rms_normalize(x, weight, eps)
    return tf.kernel(rmsnorm, name=f"rmsnorm_{dtype}")


@functools.lru_cache(maxsize=None)
def swiglu_mlp_kernel(dtype: str):
    """Llama's MLP ``down(silu(gate(x)) * up(x))`` with ``nn.Linear`` weights (``[out, in]``): one
    fused GEMM chain (the gate, the up projection and the gating in one epilogue)."""
    def swiglu_mlp(x: T.Tensor["M", "K", dtype], gate_proj: T.Tensor["N", "K", dtype],
                   up_proj: T.Tensor["N", "K", dtype], down_proj: T.Tensor["O", "N", dtype]):
        return swiglu_linear_output(x, gate_proj, up_proj, down_proj)
    return tf.kernel(swiglu_mlp, name=f"swiglu_mlp_{dtype}")
