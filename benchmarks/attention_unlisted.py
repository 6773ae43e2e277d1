"""Attention variants no issue lists — the ways users combine masks and scores — written in the
DSL, with what the float64 check needs of each: its extra inputs and the same score and mask as
PyTorch functions (``benchmarks.attention.reference``). Used by the Hopper template's check
(``python -m benchmarks.hopper_attention --check``): each is planned, generated and checked like
the library's variants.

Each entry: name → (kernel, make, heads), ``make(B, H, HKV, M, N, dtype)`` → ``(extra args,
score_mod, mask_mod)``; ``heads`` the query and kv-head counts the check uses.
"""
from __future__ import annotations

import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels.attention import key_position, scores, softmax_attend

Q = T.Tensor["B", "H", "M", "D", "bf16"]
KV = T.Tensor["B", "H", "N", "D", "bf16"]
KV_GROUPED = T.Tensor["B", "HKV", "N", "D", "bf16"]
CAP, WINDOW = 30.0, 97


@tf.kernel
def table_bias_attention(q: Q, k: KV, v: KV, table: T.Tensor["H", "R", "bf16"], scale: T.f32):
    """A learned relative-position bias per head (T5-style, a table of 2N − 1 entries): the score
    reads a tensor of its own size, whose index leaves it at the padding keys of a ragged last
    block."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale) + table[h, key_position(i) - j + T.size("N") - 1]
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def causal_table_attention(q: Q, k: KV, v: KV, table: T.Tensor["H", "R", "bf16"],
                           scale: T.f32):
    """The bias table under a causal mask."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale) + table[h, key_position(i) - j + T.size("N") - 1]
    return softmax_attend(T.where(key_position(i) >= j, s, -T.inf), v[b, h, j, e], j)


@tf.kernel
def key_padding_attention(q: Q, k: KV, v: KV, valid: T.Tensor["B", "N", "i32"], scale: T.f32):
    """Padded batches: keys marked invalid per batch row (a mask reading a tensor per key)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    return softmax_attend(T.where(valid[b, j] > 0, s, -T.inf), v[b, h, j, e], j)


@tf.kernel
def causal_key_padding_attention(q: Q, k: KV, v: KV, valid: T.Tensor["B", "N", "i32"],
                                 scale: T.f32):
    """Causal and padded: an index condition and a tensor condition in one mask."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    keep = (key_position(i) >= j) & (valid[b, j] > 0)
    return softmax_attend(T.where(keep, s, -T.inf), v[b, h, j, e], j)


@tf.kernel
def softcap_window_attention(q: Q, k: KV, v: KV, scale: T.f32, cap: T.f32, window: T.i32):
    """Gemma-2's local layers: a soft-capped score in a causal sliding window."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = cap * T.tanh(scores(q, k, b, h, h, i, j, d, scale) / cap)
    kp = key_position(i)
    return softmax_attend(T.where((kp >= j) & (kp - j < window), s, -T.inf), v[b, h, j, e], j)


@tf.kernel
def alibi_gqa_attention(q: Q, k: KV_GROUPED, v: KV_GROUPED, scale: T.f32):
    """ALiBi slopes per query head on grouped kv-heads, causal."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    slope = T.exp2(-8.0 * T.cast(h + 1, "f32") / T.cast(T.size("H"), "f32"))
    s = scores(q, k, b, h, hk, i, j, d, scale) + slope * T.cast(j - key_position(i), "f32")
    return softmax_attend(T.where(key_position(i) >= j, s, -T.inf), v[b, hk, j, e], j)


@tf.kernel
def head_scaled_attention(q: Q, k: KV, v: KV, factor: T.Tensor["B", "H", "bf16"]):
    """A learned temperature per batch row and head: a scale read from a tensor (not folded)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * factor[b, h]
    return softmax_attend(s, v[b, h, j, e], j)


def _valid(B: int, N: int) -> torch.Tensor:
    """Per batch row, a padded tail and a few holes; row 0 keeps every key."""
    valid = torch.ones(B, N, dtype=torch.int32, device="cuda")
    for b in range(1, B):
        valid[b, N - N // (b + 2):] = 0
        valid[b, 1:N // 3:7] = 0
    return valid


def _table(H: int, N: int, dtype):
    table = torch.randn(H, 2 * N - 1, device="cuda").to(dtype)
    return table, lambda s, b, h, q, kv: s + table.double()[h, q - kv + N - 1]


def _causal(b, h, q, kv):
    return q >= kv


def _make_table(causal: bool):
    def make(B, H, HKV, M, N, dtype):
        table, score = _table(H, N, dtype)
        return {"table": table}, score, _causal if causal else None
    return make


def _make_padding(causal: bool):
    def make(B, H, HKV, M, N, dtype):
        valid = _valid(B, N)
        keep = lambda b, h, q, kv: valid.bool()[b, kv] & ((q >= kv) if causal else True)  # noqa
        return {"valid": valid}, None, keep
    return make


def _make_softcap_window(B, H, HKV, M, N, dtype):
    return ({"cap": CAP, "window": WINDOW}, lambda s, b, h, q, kv: CAP * torch.tanh(s / CAP),
            lambda b, h, q, kv: (q >= kv) & (q - kv < WINDOW))


def _make_alibi_gqa(B, H, HKV, M, N, dtype):
    slope = lambda h: torch.exp2(-8.0 * (h + 1) / H)  # noqa: E731
    return {}, lambda s, b, h, q, kv: s + slope(h) * (kv - q), _causal


def _make_head_scaled(B, H, HKV, M, N, dtype):
    factor = (torch.rand(B, H, device="cuda") * 2.0 - 0.5).to(dtype)   # some negative, some ~0
    return ({"factor": factor}, lambda s, b, h, q, kv: s * factor.double()[b, h], None)


# name → (kernel, make, (query heads, kv heads)); the check passes ``scale`` = 1/√D to kernels
# that take one (head_scaled reads its factor from a tensor: its reference gets scale 1)
UNLISTED = {
    "table_bias": (table_bias_attention, _make_table(False), (4, 4)),
    "causal_table": (causal_table_attention, _make_table(True), (4, 4)),
    "key_padding": (key_padding_attention, _make_padding(False), (4, 4)),
    "causal_key_padding": (causal_key_padding_attention, _make_padding(True), (4, 4)),
    "softcap_window": (softcap_window_attention, _make_softcap_window, (4, 4)),
    "alibi_gqa": (alibi_gqa_attention, _make_alibi_gqa, (8, 2)),
    "head_scaled": (head_scaled_attention, _make_head_scaled, (4, 4)),
}
