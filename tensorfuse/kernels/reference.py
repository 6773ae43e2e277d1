"""Float64 NumPy references for the kernel library, written independently of the DSL. Random
inputs, scalar values and tolerances for checking them are in :mod:`tensorfuse.inputs` (re-exported
here: the tests and benchmarks read them with the references)."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..dsl import dtypes as dt
from ..inputs import TOLERANCE, default_scalars, random_inputs, relative_error

__all__ = ["REFERENCES", "reference", "TOLERANCE", "default_scalars", "random_inputs",
           "relative_error"]


def _softmax_attend(s: np.ndarray, v: np.ndarray) -> np.ndarray:
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    return np.einsum("bhij,bhje->bhie", p / p.sum(-1, keepdims=True), v)


def _scores(q, k, scale):
    return np.einsum("bhid,bhjd->bhij", q, k) * scale


def _key_pos(m, n):
    return np.arange(m)[:, None] + n - m, np.arange(n)[None, :]


def _expand_heads(k, h):
    return np.repeat(k, h // k.shape[1], axis=1)


def ref_attention(q, k, v, scale):
    return _softmax_attend(_scores(q, k, scale), v)


def ref_causal_attention(q, k, v, scale):
    i, j = _key_pos(q.shape[2], k.shape[2])
    return _softmax_attend(np.where(i >= j, _scores(q, k, scale), -np.inf), v)


def ref_alibi_attention(q, k, v, scale):
    h = q.shape[1]
    slope = 2.0 ** (-8.0 * (np.arange(h) + 1) / h)
    i, j = _key_pos(q.shape[2], k.shape[2])
    return _softmax_attend(_scores(q, k, scale) + slope[:, None, None] * (j - i), v)


def ref_softcap_attention(q, k, v, scale, cap):
    i, j = _key_pos(q.shape[2], k.shape[2])
    s = cap * np.tanh(_scores(q, k, scale) / cap)
    return _softmax_attend(np.where(i >= j, s, -np.inf), v)


def ref_sliding_window_attention(q, k, v, scale, window):
    i, j = _key_pos(q.shape[2], k.shape[2])
    keep = (i >= j) & (i - j < window)
    return _softmax_attend(np.where(keep, _scores(q, k, scale), -np.inf), v)


def ref_prefix_lm_attention(q, k, v, scale, prefix):
    i, j = _key_pos(q.shape[2], k.shape[2])
    keep = (i >= j) | (j < prefix)
    return _softmax_attend(np.where(keep, _scores(q, k, scale), -np.inf), v)


def ref_document_attention(q, k, v, doc, scale):
    i, j = _key_pos(q.shape[2], k.shape[2])
    same = doc[:, i[:, 0]][:, :, None] == doc[:, None, :]          # [B, M, N]
    return _softmax_attend(np.where(same[:, None], _scores(q, k, scale), -np.inf), v)


def ref_gqa_attention(q, k, v, scale):
    h = q.shape[1]
    return ref_attention(q, _expand_heads(k, h), _expand_heads(v, h), scale)


def ref_gqa_causal_attention(q, k, v, scale):
    h = q.shape[1]
    return ref_causal_attention(q, _expand_heads(k, h), _expand_heads(v, h), scale)


def ref_static_cache_attention(q, k, v, length, scale):
    """Per sequence: the slots below ``min(length, N)``, the query ``i`` at position
    ``length − M + i`` seeing the slots up to it (none: NaN, as 0/0)."""
    m, n = q.shape[2], k.shape[2]
    s = _scores(q, _expand_heads(k, q.shape[1]), scale)
    j = np.arange(n)[None, :]
    for b in range(q.shape[0]):
        keep = j <= int(length[b]) - m + np.arange(m)[:, None]
        s[b] = np.where(keep[None], s[b], -np.inf)
    with np.errstate(invalid="ignore"):
        return _softmax_attend(s, _expand_heads(v, q.shape[1]))


def ref_neighborhood_attention(q, k, v, scale, radius):
    i, j = _key_pos(q.shape[2], k.shape[2])
    return _softmax_attend(np.where(np.abs(i - j) <= radius, _scores(q, k, scale), -np.inf), v)


def ref_neighborhood_attention_2d(q, k, v, scale, width, radius, dilation):
    i, j = np.arange(q.shape[2])[:, None], np.arange(k.shape[2])[None, :]
    dy, dx = i // width - j // width, i % width - j % width
    near = (np.abs(dy) <= radius * dilation) & (np.abs(dx) <= radius * dilation) & \
        (dy % dilation == 0) & (dx % dilation == 0)
    return _softmax_attend(np.where(near, _scores(q, k, scale), -np.inf), v)


def ref_neighborhood_attention_3d(q, k, v, scale, height, width, radius, causal):
    i, j = np.arange(q.shape[2])[:, None], np.arange(k.shape[2])[None, :]
    frame = height * width
    dt = i // frame - j // frame
    dy = (i // width) % height - (j // width) % height
    dx = i % width - j % width
    near = (np.abs(dt) <= radius) & (np.abs(dy) <= radius) & (np.abs(dx) <= radius) & \
        ((causal == 0) | (dt >= 0))
    return _softmax_attend(np.where(near, _scores(q, k, scale), -np.inf), v)


def ref_softmax(x):
    p = np.exp(x - x.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def ref_log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def ref_layernorm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def ref_rmsnorm(x, weight, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def ref_cross_entropy(logits, target):
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    return lse - logits[np.arange(logits.shape[0]), target]


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_ffn_gelu(x, w1, w2):
    return _gelu(x @ w1) @ w2


def ref_ffn_swiglu(x, w1, w3, w2):
    gate = x @ w1
    return (gate / (1.0 + np.exp(-gate)) * (x @ w3)) @ w2


def ref_ffn_swiglu_linear(x, gate_proj, up_proj, down_proj):
    return ref_ffn_swiglu(x, gate_proj.T, up_proj.T, down_proj.T)


def ref_matmul(x, w):
    return x @ w


def ref_linear(x, weight, bias):
    return x @ weight.T + bias


def ref_swiglu_gate(x, w1, w3):
    gate = x @ w1.T
    return gate / (1.0 + np.exp(-gate)) * (x @ w3.T)


REFERENCES: dict[str, Callable] = {name[4:]: fn for name, fn in globals().items()
                                   if name.startswith("ref_")}


def reference(kernel, tensors: dict, scalars: dict) -> np.ndarray:
    """The float64 reference output of a library kernel."""
    fn = REFERENCES[kernel.name]
    args = []
    for p in kernel.program.params:
        if p.name in tensors:
            x = tensors[p.name]
            args.append(x.astype(np.float64) if dt.is_float(p.dtype) else x)
        else:
            args.append(scalars[p.name])
    return fn(*args)
