"""Attention and its variants, each a few DSL lines over one shared softmax-weighted sum.

Layout: ``q[B, H, M, D]``, ``k, v[B, HKV, N, D]`` (``HKV = H`` except for GQA). Masks are aligned to
the bottom right (query ``i`` sits at key position ``i + N - M``), so the same kernels serve prefill
(``M = N``) and decode (``M = 1``).
"""
from __future__ import annotations

import tensorfuse as tf
from tensorfuse import dsl as T

Q = T.Tensor["B", "H", "M", "D", "bf16"]
KV = T.Tensor["B", "H", "N", "D", "bf16"]
KV_GROUPED = T.Tensor["B", "HKV", "N", "D", "bf16"]


def softmax_attend(s, value, j, empty=None, sink=None):
    """softmax of the scores ``s`` over ``j``, applied to ``value``: the chain max → sum → sum.
    ``empty``: what a row whose scores are all ``-inf`` gives (default: 0/0, NaN, as the math
    says). ``sink``: a score outside the keys that takes a share of the softmax and attends to
    nothing (gpt-oss's per-head sinks): ``o / (l + exp(sink - m))``, the weights summing below 1."""
    m = T.max(s, over=j)
    p = T.exp(s - m)
    l = T.sum(p, over=j)  # noqa: E741 - the name used in the attention literature
    o = T.sum(p * value, over=j)
    total = l if sink is None else l + T.exp(sink - m)
    return o / total if empty is None else T.where(l > 0.0, o / total, empty)


def scores(q, k, b, h, hk, i, j, d, scale):
    return T.sum(q[b, h, i, d] * k[b, hk, j, d], over=d) * scale


def key_position(i):
    """Position among the keys of query ``i`` (bottom-right alignment)."""
    return i + T.size("N") - T.size("M")


@tf.kernel
def attention(q: Q, k: KV, v: KV, scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def causal_attention(q: Q, k: KV, v: KV, scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    s = T.where(key_position(i) >= j, s, -T.inf)
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def alibi_attention(q: Q, k: KV, v: KV, scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    slope = T.exp2(-8.0 * (h + 1) / T.size("H"))
    s = scores(q, k, b, h, h, i, j, d, scale) + slope * (j - key_position(i))
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def softcap_attention(q: Q, k: KV, v: KV, scale: T.f32, cap: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = cap * T.tanh(scores(q, k, b, h, h, i, j, d, scale) / cap)
    s = T.where(key_position(i) >= j, s, -T.inf)
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def sliding_window_attention(q: Q, k: KV, v: KV, scale: T.f32, window: T.i32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    keep = (key_position(i) >= j) & (key_position(i) - j < window)
    return softmax_attend(T.where(keep, s, -T.inf), v[b, h, j, e], j)


@tf.kernel
def prefix_lm_attention(q: Q, k: KV, v: KV, scale: T.f32, prefix: T.i32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    keep = (key_position(i) >= j) | (j < prefix)
    return softmax_attend(T.where(keep, s, -T.inf), v[b, h, j, e], j)


@tf.kernel
def document_attention(q: Q, k: KV, v: KV, doc: T.Tensor["B", "N", "i32"], scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    same_document = doc[b, key_position(i)] == doc[b, j]
    return softmax_attend(T.where(same_document, s, -T.inf), v[b, h, j, e], j)


@tf.kernel
def gqa_attention(q: Q, k: KV_GROUPED, v: KV_GROUPED, scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = scores(q, k, b, h, hk, i, j, d, scale)
    return softmax_attend(s, v[b, hk, j, e], j)


@tf.kernel
def gqa_causal_attention(q: Q, k: KV_GROUPED, v: KV_GROUPED, scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = scores(q, k, b, h, hk, i, j, d, scale)
    s = T.where(key_position(i) >= j, s, -T.inf)
    return softmax_attend(s, v[b, hk, j, e], j)


@tf.kernel
def static_cache_attention(q: Q, k: KV_GROUPED, v: KV_GROUPED, length: T.Tensor["B", "i32"],
                           scale: T.f32):
    """Grouped-query attention over a static (preallocated) cache of ``N`` slots per sequence,
    filled to ``length[b]`` keys: the ``M`` queries are the last ``M`` filled positions, causal
    among themselves (decode: ``M = 1``). The length lives in device memory, so a decode step
    captured in a CUDA graph replays while the cache fills; keys past it are never read (the
    cluster decode sweeps ``j < length[b]``: ``schedule_templates.key_range``). A length past
    ``N`` reads the ``N`` slots; a length of 0 or less leaves the row without keys (0/0, NaN)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = scores(q, k, b, h, hk, i, j, d, scale)
    s = T.where(j <= length[b] - T.size("M") + i, s, -T.inf)
    return softmax_attend(s, v[b, hk, j, e], j)


@tf.kernel
def neighborhood_attention(q: Q, k: KV, v: KV, scale: T.f32, radius: T.i32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    near = T.abs(key_position(i) - j) <= radius
    return softmax_attend(T.where(near, s, -T.inf), v[b, h, j, e], j)


@tf.kernel
def neighborhood_attention_2d(q: Q, k: KV, v: KV, scale: T.f32, width: T.i32, radius: T.i32,
                              dilation: T.i32):
    """Tokens of a ``width``-wide image, row-major; each query sees the keys within ``radius``
    steps of ``dilation`` pixels along both axes (a (2·radius+1)² kernel). Compiled with its
    tokens visited in 2-D patches (``schedule_templates.token_tiling``)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    dy, dx = i // width - j // width, i % width - j % width
    near = (T.abs(dy) <= radius * dilation) & (T.abs(dx) <= radius * dilation) & \
        (dy % dilation == 0) & (dx % dilation == 0)
    return softmax_attend(T.where(near, s, -T.inf), v[b, h, j, e], j)


@tf.kernel
def neighborhood_attention_3d(q: Q, k: KV, v: KV, scale: T.f32, height: T.i32, width: T.i32,
                              radius: T.i32, causal: T.i32):
    """Tokens of a video of ``height × width`` frames, frame-major; each query sees the keys
    within ``radius`` along time, rows and columns — only past and present frames where
    ``causal`` is 1."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    frame = height * width
    dt = i // frame - j // frame
    dy = (i // width) % height - (j // width) % height
    dx = i % width - j % width
    near = (T.abs(dt) <= radius) & (T.abs(dy) <= radius) & (T.abs(dx) <= radius) & \
        ((causal == 0) | (dt >= 0))
    return softmax_attend(T.where(near, s, -T.inf), v[b, h, j, e], j)


ATTENTION_VARIANTS = {
    "attention": attention, "causal_attention": causal_attention,
    "alibi_attention": alibi_attention, "softcap_attention": softcap_attention,
    "sliding_window_attention": sliding_window_attention,
    "prefix_lm_attention": prefix_lm_attention, "document_attention": document_attention,
    "gqa_attention": gqa_attention, "gqa_causal_attention": gqa_causal_attention,
    "neighborhood_attention": neighborhood_attention,
    "neighborhood_attention_2d": neighborhood_attention_2d,
    "neighborhood_attention_3d": neighborhood_attention_3d,
}
