"""Kernels of inference serving no issue lists, written as a new user would write them —
attention over a packed QKV tensor (a fused projection's ``[B, S, 3, H, D]``), speculative
decoding's few query tokens over a GQA cache (causal among themselves), rotary embeddings
applied inside causal attention (from float32 tables, and from bf16 ones as transformers casts
them), a residual add fused with RMSNorm (both written), and int8
quantisation of rows by their absolute maximum — through ``tf.compile`` defaults against the
best torch alternative in the same process, each checked against a float64 reference first (the
harness of :mod:`benchmarks.kernel_suite`).

    python -m benchmarks.serving_kernels [--only NAME,…] [--tune TRIALS]

Rows: ``benchmark`` = ``user/<name>``; CSV
``benchmarks/results/<date>-<device>-serving-kernels.csv``.
"""

import functools

import torch
import torch.nn.functional as F

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels import softmax_attend
from benchmarks.attention import reference
from benchmarks.common import SDPA, TENSORFUSE, TORCH_COMPILE, TORCH_EAGER
from benchmarks.kernel_suite import Case, Recorded, main


@tf.kernel
def packed_qkv_causal(qkv: T.Tensor["B", "S", "THREE", "H", "D", "bf16"], scale: T.f32):
    """Causal attention over one ``[B, S, 3, H, D]`` tensor: q, k and v its three slices."""
    b, i, j, h, d, e = T.axes("b i j h d e")
    s = T.where(j <= i, T.sum(qkv[b, i, 0, h, d] * qkv[b, j, 1, h, d], over=d) * scale,
                float("-inf"))
    return softmax_attend(s, qkv[b, j, 2, h, e], j)


@tf.kernel
def speculative_decode(q: T.Tensor["B", "H", "M", "D", "bf16"],
                       k: T.Tensor["B", "HKV", "N", "D", "bf16"],
                       v: T.Tensor["B", "HKV", "N", "D", "bf16"], scale: T.f32):
    """M draft tokens per sequence over a GQA cache whose last M keys are theirs: token i sees
    the cache up to its own key."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = T.where(j <= T.size("N") - T.size("M") + i,
                T.sum(q[b, h, i, d] * k[b, hk, j, d], over=d) * scale, float("-inf"))
    return softmax_attend(s, v[b, hk, j, e], j)


def rope_attention_kernel(tables: str, name: str):
    """Causal attention with rotary embeddings (rotate-half) applied to q and k where the scores
    are made, from ``cos``/``sin`` tables in ``tables`` (float32: the products are float32;
    bf16, as transformers casts them to q's dtype: bf16 products, the operands stored first on
    sm_90a)."""
    Q, TABLE = T.Tensor["B", "H", "S", "D", "bf16"], T.Tensor["S", "D", tables]

    def rope(q: Q, k: Q, v: Q, cos: TABLE, sin: TABLE, scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        half = T.size("D") // 2
        sign = T.where(d < half, -1.0, 1.0)
        qr = q[b, h, i, d] * cos[i, d] + sign * q[b, h, i, (d + half) % T.size("D")] * sin[i, d]
        kr = k[b, h, j, d] * cos[j, d] + sign * k[b, h, j, (d + half) % T.size("D")] * sin[j, d]
        s = T.where(j <= i, T.sum(qr * kr, over=d) * scale, float("-inf"))
        return softmax_attend(s, v[b, h, j, e], j)
    rope.__name__ = rope.__qualname__ = name
    return tf.kernel(rope)


rope_attention = rope_attention_kernel("f32", "rope_attention")
rope_attention_bf16_tables = rope_attention_kernel("bf16", "rope_attention_bf16_tables")


@tf.kernel
def add_rmsnorm(x: T.Tensor["M", "D", "bf16"], r: T.Tensor["M", "D", "bf16"],
                w: T.Tensor["D", "bf16"], eps: T.f32):
    """The residual stream's add, written, and its RMSNorm: both outputs of one pass."""
    i, d = T.axes("i d")
    y = x[i, d] + r[i, d]
    ms = T.sum(y * y, over=d) / T.size("D")
    return T.cast(y, "bf16"), T.cast(y * T.rsqrt(ms + eps) * w[d], "bf16")


@tf.kernel
def absmax_quant(x: T.Tensor["M", "K", "bf16"]):
    """Rows quantised to int8 by their largest magnitude (round half to even), and the scales."""
    i, k = T.axes("i k")
    scale = T.max(T.max(T.abs(x[i, k]), over=k), 1e-8) / 127.0
    return T.cast(T.round(x[i, k] / scale), "i8"), scale


# ---- float64 references and torch alternatives (shared with the tests) ----

def causal(b, h, query, key):
    """The causal mask of :func:`benchmarks.attention.reference` (queries aligned to the last
    keys: speculative decoding's draft tokens see the cache up to their own key)."""
    return key <= query


def rotated(t, cos, sin):
    """transformers' ``apply_rotary_pos_emb`` (rotate-half) on ``[B, H, S, D]``."""
    half = t.shape[-1] // 2
    return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin


def rope_angles(S: int, D: int, device="cpu"):
    angles = torch.arange(S)[:, None] * 10000.0 ** (-torch.arange(D // 2) / (D // 2))
    angles = torch.cat([angles, angles], -1)
    return angles.cos().to(device), angles.sin().to(device)


def added_rmsnorm(x, r, w, eps):
    y32 = x.float() + r.float() if x.dtype != torch.float64 else x + r
    norm = y32 * torch.rsqrt((y32 * y32).mean(-1, keepdim=True) + eps) * w.to(y32.dtype)
    return y32.to(x.dtype), norm.to(x.dtype)


def quantised(x):
    x32 = x.float() if x.dtype != torch.float64 else x
    scale = x32.abs().amax(-1).clamp_min(1e-8) / 127.0
    return torch.round(x32 / scale[:, None]).to(torch.int8), scale


# ---- the suite's cases ----

def _packed_qkv_case(generator, B=2, S=4096, H=16, D=128) -> Case:
    qkv = torch.randn(B, S, 3, H, D, generator=generator).to("cuda", torch.bfloat16)
    scale = D ** -0.5

    def sdpa():   # as a user writes it in torch: the slices as [B, H, S, D] views
        q, k, v = (qkv[:, :, n].transpose(1, 2) for n in range(3))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale).transpose(1, 2)
    f = Recorded(packed_qkv_causal)
    rows = torch.arange(0, S, 37)
    views = [qkv[:, :, n].transpose(1, 2) for n in range(3)]
    ref = reference(*views, scale, None, causal, rows).transpose(1, 2)
    return Case("packed_qkv_causal", f"B{B} S{S} H{H} D{D} [B, S, 3, H, D]",
                lambda: f(qkv, scale), {SDPA: sdpa}, ref, lambda out: out[:, rows],
                flops=2 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, S=S, THREE=3, H=H, D=D)})


def _speculative_case(generator, B=8, H=32, HKV=8, M=4, N=16384, D=128) -> Case:
    q = torch.randn(B, H, M, D, generator=generator).to("cuda", torch.bfloat16)
    k, v = (torch.randn(B, HKV, N, D, generator=generator).to("cuda", torch.bfloat16)
            for _ in range(2))
    scale = D ** -0.5
    seen = torch.arange(N, device="cuda")[None] <= torch.arange(M, device="cuda")[:, None] + N - M

    def sdpa():   # a boolean mask of the draft tokens' keys, grouped heads
        return F.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=scale,
                                              enable_gqa=True)
    f = Recorded(speculative_decode)
    ref = reference(q, k, v, scale, None, causal)
    return Case("speculative_decode", f"B{B} H{H}/{HKV} M{M} N{N} D{D}",
                lambda: f(q, k, v, scale), {SDPA: sdpa}, ref, lambda out: out,
                bytes=2 * k.numel() * 2 + 2 * q.numel() * 2,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, HKV=HKV, M=M, N=N, D=D)})


def _rope_attention_case(generator, B=2, H=16, S=4096, D=128, tables=torch.float32) -> Case:
    q, k, v = (torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
               for _ in range(3))
    cos, sin = (t.to(tables) for t in rope_angles(S, D, "cuda"))
    scale = D ** -0.5

    def eager(q, k, v):   # transformers' rotary, then SDPA (cuDNN or flash)
        qr, kr = (rotated(t, cos, sin).to(t.dtype) for t in (q, k))
        return F.scaled_dot_product_attention(qr, kr, v, is_causal=True, scale=scale)
    kernel = rope_attention if tables == torch.float32 else rope_attention_bf16_tables
    f, compiled = Recorded(kernel), torch.compile(eager)
    rows = torch.arange(0, S, 37)
    ref = reference(rotated(q.double(), cos.double(), sin.double()),
                    rotated(k.double(), cos.double(), sin.double()), v, scale, None, causal, rows)
    return Case(kernel.program.name, f"B{B} H{H} S{S} D{D} causal",
                lambda: f(q, k, v, cos, sin, scale),
                {TORCH_COMPILE: lambda: compiled(q, k, v), SDPA: lambda: eager(q, k, v)},
                ref, lambda out: out[:, :, rows], flops=2 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D)})


def _add_rmsnorm_case(generator, M=16384, D=4096) -> Case:
    x, r = (torch.randn(M, D, generator=generator).to("cuda", torch.bfloat16) for _ in range(2))
    w = (torch.rand(D, generator=generator) + 0.5).to("cuda", torch.bfloat16)
    f = Recorded(add_rmsnorm)
    compiled = torch.compile(added_rmsnorm)
    ref = torch.stack(added_rmsnorm(x.double(), r.double(), w.double(), 1e-6))
    return Case("add_rmsnorm", f"M{M} D{D}", lambda: f(x, r, w, 1e-6),
                {TORCH_COMPILE: lambda: compiled(x, r, w, 1e-6),
                 TORCH_EAGER: lambda: added_rmsnorm(x, r, w, 1e-6)},
                ref, lambda out: torch.stack(out) if isinstance(out, tuple) else out,
                bytes=4 * x.numel() * 2 + w.numel() * 2,
                notes={TENSORFUSE: f.schedule_origin(M=M, D=D)})


def _absmax_quant_case(generator, M=16384, K=4096) -> Case:
    x = (torch.randn(M, K, generator=generator) * 3).to("cuda", torch.bfloat16)
    f, compiled = Recorded(absmax_quant), torch.compile(quantised)
    q64, s64 = quantised(x.double())

    def dequantised(out):   # the rows as the int8 values and scales give them back
        q, s = out
        return q.double() * s.double()[:, None]
    return Case("absmax_quant", f"M{M} K{K} to int8", lambda: f(x),
                {TORCH_COMPILE: lambda: compiled(x), TORCH_EAGER: lambda: quantised(x)},
                q64.double() * s64[:, None], dequantised, bytes=x.numel() * 3 + M * 4,
                notes={TENSORFUSE: f.schedule_origin(M=M, K=K)})


SERVING = {
    "packed_qkv_causal": _packed_qkv_case,
    "speculative_decode": _speculative_case,
    "rope_attention": _rope_attention_case,
    "rope_attention_bf16_tables": functools.partial(_rope_attention_case, tables=torch.bfloat16),
    "add_rmsnorm": _add_rmsnorm_case,
    "absmax_quant": _absmax_quant_case,
}

if __name__ == "__main__":
    main(SERVING, "serving-kernels", __doc__)
