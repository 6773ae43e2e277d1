"""Kernels written the way a user writes them — in their own tensors' layouts, not shaped for the
library's templates — through ``tf.compile`` defaults, against the best torch alternative in the
same process on the same GPU. Each implementation's output is checked against a float64
reference of the math as written on a slice of rows, before and after it is timed.

    python -m benchmarks.user_kernels [--only NAME,…] [--tune TRIALS]

Rows: ``benchmark`` = ``user/<name>``; CSV ``benchmarks/results/<date>-<device>-user-kernels.csv``
(with ``--tune``: ``…-user-kernels-tuned.csv``, the defaults, the alternatives and
``tensorfuse tuned`` of each kernel).
"""

import math

import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels import softmax_attend
from benchmarks.common import (FLEX, SDPA, SDPA_CUDNN, SDPA_FLASH, TENSORFUSE, TORCH_COMPILE,
                               TORCH_EAGER)
from benchmarks.kernel_suite import Case, Recorded, main, rows_case


# ---- attention on the layouts transformers and Megatron keep ([B, S, H, D], [S, B, H, D]) ----

@tf.kernel
def bshd_causal(q: T.Tensor["B", "M", "H", "D", "bf16"], k: T.Tensor["B", "N", "H", "D", "bf16"],
                v: T.Tensor["B", "N", "H", "D", "bf16"], scale: T.f32):
    b, i, h, j, d, e = T.axes("b i h j d e")
    s = T.sum(q[b, i, h, d] * k[b, j, h, d], over=d) * scale
    s = T.where(i + T.size("N") - T.size("M") >= j, s, -T.inf)
    return softmax_attend(s, v[b, j, h, e], j)


@tf.kernel
def sbhd_causal(q: T.Tensor["M", "B", "H", "D", "bf16"], k: T.Tensor["N", "B", "H", "D", "bf16"],
                v: T.Tensor["N", "B", "H", "D", "bf16"], scale: T.f32):
    i, b, h, j, d, e = T.axes("i b h j d e")
    s = T.sum(q[i, b, h, d] * k[j, b, h, d], over=d) * scale
    s = T.where(i + T.size("N") - T.size("M") >= j, s, -T.inf)
    return softmax_attend(s, v[j, b, h, e], j)


def gqa_causal_bshd_kernel(dtype: str = "bf16"):
    """GQA-causal attention on [B, S, H, D] queries and a [B, S, HKV, D] cache, in ``dtype`` (the
    tests interpret it in float32). Its annotations name this function's locals: the module has
    no ``from __future__ import annotations``, which would make them strings."""
    Q, KV = T.Tensor["B", "M", "H", "D", dtype], T.Tensor["B", "N", "HKV", "D", dtype]

    def bshd_gqa_causal(q: Q, k: KV, v: KV, scale: T.f32):
        b, i, h, j, d, e = T.axes("b i h j d e")
        hk = h // (T.size("H") // T.size("HKV"))
        s = T.sum(q[b, i, h, d] * k[b, j, hk, d], over=d) * scale
        s = T.where(i + T.size("N") - T.size("M") >= j, s, -T.inf)
        return softmax_attend(s, v[b, j, hk, e], j)
    return tf.kernel(bshd_gqa_causal)


bshd_gqa_causal = gqa_causal_bshd_kernel()


@tf.kernel
def two_head_dims_causal(q: T.Tensor["B", "H", "M", "DQK", "bf16"],
                         k: T.Tensor["B", "H", "N", "DQK", "bf16"],
                         v: T.Tensor["B", "H", "N", "DV", "bf16"], scale: T.f32):
    """q·k over DQK, p·v over DV (DeepSeek's 192 and 128)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    s = T.where(i + T.size("N") - T.size("M") >= j, s, -T.inf)
    return softmax_attend(s, v[b, h, j, e], j)


# ---- rows reduced over an axis that is not the innermost ----

@tf.kernel
def log_softmax_channels(x: T.Tensor["B", "C", "P", "bf16"]):
    """Per-pixel class log-probabilities of a segmentation map: over C of [B, C, P]."""
    b, c, p = T.axes("b c p")
    m = T.max(x[b, c, p], over=c)
    return x[b, c, p] - m - T.log(T.sum(T.exp(x[b, c, p] - m), over=c))


@tf.kernel
def qk_norm_bshd(x: T.Tensor["B", "S", "H", "D", "bf16"], w: T.Tensor["D", "bf16"], eps: T.f32):
    """RMS norm over the head dim of [B, S, H, D] queries (QK-norm)."""
    b, s, h, d = T.axes("b s h d")
    ms = T.sum(x[b, s, h, d] * x[b, s, h, d], over=d) / T.size("D")
    return x[b, s, h, d] * T.rsqrt(ms + eps) * w[d]


@tf.kernel
def layernorm_channels(x: T.Tensor["B", "D", "S", "bf16"], w: T.Tensor["D", "bf16"],
                       bias: T.Tensor["D", "bf16"], eps: T.f32):
    """Layer norm over the channels of [B, D, S] (a 1-D convolution's activations)."""
    b, d, s = T.axes("b d s")
    mean = T.sum(x[b, d, s], over=d) / T.size("D")
    var = T.sum((x[b, d, s] - mean) * (x[b, d, s] - mean), over=d) / T.size("D")
    return (x[b, d, s] - mean) * T.rsqrt(var + eps) * w[d] + bias[d]


@tf.kernel
def group_norm(x: T.Tensor["B", "G", "C", "P", "bf16"], w: T.Tensor["G", "C", "bf16"],
               bias: T.Tensor["G", "C", "bf16"], eps: T.f32):
    """Group norm of [B, C, H·W] activations viewed as [B, G, C/G, P]: over two axes at once."""
    b, g, c, p = T.axes("b g c p")
    n = T.size("C") * T.size("P")
    mean = T.sum(x[b, g, c, p], over=(c, p)) / n
    var = T.sum((x[b, g, c, p] - mean) * (x[b, g, c, p] - mean), over=(c, p)) / n
    return (x[b, g, c, p] - mean) * T.rsqrt(var + eps) * w[g, c] + bias[g, c]


@tf.kernel
def max_pool_l2(x: T.Tensor["B", "S", "D", "bf16"]):
    """A sentence embedding: max over the tokens of [B, S, D], then L2-normalised over D."""
    b, s, d = T.axes("b s d")
    pooled = T.max(x[b, s, d], over=s)
    return pooled * T.rsqrt(T.sum(pooled * pooled, over=d) + 1e-12)


@tf.kernel
def channel_stats(x: T.Tensor["N", "C", "bf16"]):
    """Batch-norm statistics of channels-last activations [N = B·H·W, C]: every channel's mean
    and variance over the outer axis, a few row tiles over a long sweep."""
    n, c = T.axes("n c")
    mean = T.sum(x[n, c], over=n) / T.size("N")
    var = T.sum((x[n, c] - mean) * (x[n, c] - mean), over=n) / T.size("N")
    return mean, var


# ---- decode: many query heads on one cache, and a paged cache ----

@tf.kernel
def mqa_decode(q: T.Tensor["B", "H", "D", "bf16"], k: T.Tensor["B", "N", "D", "bf16"],
               v: T.Tensor["B", "N", "D", "bf16"], scale: T.f32):
    """Multi-query decode: every query head of a token reads the one [B, N, D] cache."""
    b, h, j, d, e = T.axes("b h j d e")
    s = T.sum(q[b, h, d] * k[b, j, d], over=d) * scale
    return softmax_attend(s, v[b, j, e], j)


@tf.kernel
def gqa_decode(q: T.Tensor["B", "H", "D", "bf16"], k: T.Tensor["B", "HKV", "N", "D", "bf16"],
               v: T.Tensor["B", "HKV", "N", "D", "bf16"], scale: T.f32):
    """GQA decode written without a query axis, over a [B, HKV, N, D] cache (transformers')."""
    b, h, j, d, e = T.axes("b h j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = T.sum(q[b, h, d] * k[b, hk, j, d], over=d) * scale
    return softmax_attend(s, v[b, hk, j, e], j)


@tf.kernel
def gqa_decode_bnhd(q: T.Tensor["B", "H", "D", "bf16"], k: T.Tensor["B", "N", "HKV", "D", "bf16"],
                    v: T.Tensor["B", "N", "HKV", "D", "bf16"], scale: T.f32):
    """GQA decode over a [B, N, HKV, D] cache (FlashAttention's kv-cache layout)."""
    b, h, j, d, e = T.axes("b h j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = T.sum(q[b, h, d] * k[b, j, hk, d], over=d) * scale
    return softmax_attend(s, v[b, j, hk, e], j)


@tf.kernel
def paged_decode(q: T.Tensor["B", "H", "D", "bf16"],
                 k_pages: T.Tensor["PAGES", "PAGE", "HKV", "D", "bf16"],
                 v_pages: T.Tensor["PAGES", "PAGE", "HKV", "D", "bf16"],
                 table: T.Tensor["B", "NP", "i32"], scale: T.f32):
    """GQA decode over a paged cache: sequence b's key p·PAGE + t is slot t of page table[b, p]."""
    b, h, p, t, d, e = T.axes("b h p t d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = T.sum(q[b, h, d] * k_pages[table[b, p], t, hk, d], over=d) * scale
    return softmax_attend(s, v_pages[table[b, p], t, hk, e], (p, t))


@tf.kernel
def gqa_causal_grouped_axes(q: T.Tensor["B", "G", "R", "S", "D", "bf16"],
                            k: T.Tensor["B", "G", "S", "D", "bf16"],
                            v: T.Tensor["B", "G", "S", "D", "bf16"], scale: T.f32):
    """Causal GQA with each kv-head's query heads as an axis of their own (einops' ``b (g r) s
    d``, q broadcast against k)."""
    b, g, r, i, j, d, e = T.axes("b g r i j d e")
    s = T.where(i >= j, T.sum(q[b, g, r, i, d] * k[b, g, j, d], over=d) * scale, -T.inf)
    return softmax_attend(s, v[b, g, j, e], j)


@tf.kernel
def mqa_causal_one_cache(q: T.Tensor["B", "H", "S", "D", "bf16"], k: T.Tensor["B", "S", "D", "bf16"],
                         v: T.Tensor["B", "S", "D", "bf16"], scale: T.f32):
    """Causal multi-query attention with the keys and values written without a head axis."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.where(i >= j, T.sum(q[b, h, i, d] * k[b, j, d], over=d) * scale, -T.inf)
    return softmax_attend(s, v[b, j, e], j)


@tf.kernel
def cross_attention_lengths(q: T.Tensor["B", "H", "M", "D", "bf16"],
                            k: T.Tensor["B", "H", "N", "D", "bf16"],
                            v: T.Tensor["B", "H", "N", "D", "bf16"],
                            lengths: T.Tensor["B", "i32"], scale: T.f32):
    """Cross-attention to encoder states padded to N, sequence b's first lengths[b] valid."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    return softmax_attend(T.where(j < lengths[b], s, -T.inf), v[b, h, j, e], j)


# ---- ragged rows ----

@tf.kernel
def segment_mean(x: T.Tensor["R", "D", "bf16"], starts: T.Tensor["G", "i32"],
                 lengths: T.Tensor["G", "i32"]):
    """Mean of each segment of rows starts[g] .. starts[g] + lengths[g] (at most 128) of [R, D]:
    pooling a batch packed without padding."""
    g, d = T.axes("g d")
    r = T.axis("r", 128)
    total = T.sum(T.where(r < lengths[g], x[starts[g] + r, d], 0.0), over=r)
    return total / T.max(lengths[g], 1)


@tf.kernel
def embedding(table: T.Tensor["V", "D", "bf16"], tokens: T.Tensor["M", "i32"]):
    """Rows of a table picked by token ids (its gradient, ``tf.grad(embedding)``, is a
    scatter-add of the incoming rows by token)."""
    i, d = T.axes("i d")
    return table[tokens[i], d]


def _attention_case(name: str, kernel, layout: str, B: int, H: int, HKV: int, S: int, D: int,
                    generator) -> Case:
    """Causal attention on tensors in ``layout`` (``"bshd"`` or ``"sbhd"``): tensorfuse on them as
    they are; SDPA (cuDNN, flash) on ``[B, H, S, D]`` views of them (a transpose, no copy), its
    output returned as a view in the same layout — what a model calling SDPA does."""
    def make(heads):
        shape = (B, S, heads, D) if layout == "bshd" else (S, B, heads, D)
        return torch.randn(*shape, generator=generator).to("cuda", torch.bfloat16)

    q, k, v = make(H), make(HKV), make(HKV)
    to_bhsd = (lambda x: x.transpose(1, 2)) if layout == "bshd" else \
        (lambda x: x.permute(1, 2, 0, 3))
    from_bhsd = (lambda x: x.transpose(1, 2)) if layout == "bshd" else \
        (lambda x: x.permute(2, 0, 1, 3))
    scale = D ** -0.5
    f = Recorded(kernel)
    rows = torch.cat([torch.arange(64), torch.arange(S - 64, S)])
    # float64 reference of the checked rows, per (batch, head)
    qr, kr, vr = (to_bhsd(x).double() for x in (q, k, v))
    if HKV != H:
        kr, vr = (x.repeat_interleave(H // HKV, dim=1) for x in (kr, vr))
    s = qr[:, :, rows] @ kr.transpose(-1, -2) * scale
    s = s.masked_fill(rows.cuda()[:, None] < torch.arange(S, device="cuda")[None], -math.inf)
    ref = torch.softmax(s, -1) @ vr                       # [B, H, rows, D]
    pick = (lambda out: to_bhsd(out)[:, :, rows])

    def sdpa(backend):
        from torch.nn.attention import sdpa_kernel

        def call():
            with sdpa_kernel(backend):
                return from_bhsd(torch.nn.functional.scaled_dot_product_attention(
                    to_bhsd(q), to_bhsd(k), to_bhsd(v), is_causal=True, scale=scale,
                    enable_gqa=HKV != H))
        return call

    from torch.nn.attention import SDPBackend

    alternatives = {SDPA_CUDNN: sdpa(SDPBackend.CUDNN_ATTENTION),
                    SDPA_FLASH: sdpa(SDPBackend.FLASH_ATTENTION)}
    if D % 64:   # a head dim the Hopper template pads: the Triton template beside it
        triton = tf.compile(kernel).template
        alternatives[f"{TENSORFUSE} triton"] = lambda: triton(q, k, v, scale=scale)
    return Case(name, f"B{B} S{S} H{H}/{HKV} D{D} [{layout.upper()}]",
                lambda: f(q, k, v, scale=scale), alternatives,
                ref, pick, flops=2 * B * H * S * S * D,    # causal: half of 4·B·H·S²·D
                notes={TENSORFUSE: f.schedule_origin(B=B, M=S, N=S, H=H, D=D,
                                                     **({"HKV": HKV} if HKV != H else {}))})


def _two_head_dims_case(generator, B=2, H=16, S=4096, DQK=192, DV=128) -> Case:
    """Causal attention with q·k over 192 and p·v over 128 on [B, H, S, D]; SDPA takes
    different head dims for v on its cuDNN backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k = (torch.randn(B, H, S, DQK, generator=generator).to("cuda", torch.bfloat16)
            for _ in range(2))
    v = torch.randn(B, H, S, DV, generator=generator).to("cuda", torch.bfloat16)
    scale = DQK ** -0.5
    f = Recorded(two_head_dims_causal)
    rows = torch.cat([torch.arange(64), torch.arange(S - 64, S)])
    s = q[:, :, rows].double() @ k.double().transpose(-1, -2) * scale
    s = s.masked_fill(rows.cuda()[:, None] < torch.arange(S, device="cuda")[None], -math.inf)
    ref = torch.softmax(s, -1) @ v.double()

    def sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                        scale=scale)
        return call

    return Case("causal_dqk192_dv128", f"B{B} S{S} H{H} Dqk{DQK} Dv{DV}",
                lambda: f(q, k, v, scale=scale),
                {SDPA_CUDNN: sdpa(SDPBackend.CUDNN_ATTENTION), "sdpa": sdpa(
                    [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                     SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH])},
                ref, lambda out: out[:, :, rows], flops=B * H * S * S * (DQK + DV),
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, M=S, N=S, DQK=DQK, DV=DV)})


def _grouped_axes_case(generator, B=2, G=8, R=4, S=4096, D=128) -> Case:
    """Causal GQA, 32 query heads as [B, G=8, R=4, S, D] over [B, G, S, D] keys; SDPA on the
    [B, G·R, S, D] view of q (no copy) with ``enable_gqa``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(B, G, R, S, D, generator=generator).to("cuda", torch.bfloat16)
    k, v = (torch.randn(B, G, S, D, generator=generator).to("cuda", torch.bfloat16)
            for _ in range(2))
    scale = D ** -0.5
    f = Recorded(gqa_causal_grouped_axes)
    rows = torch.cat([torch.arange(64), torch.arange(S - 64, S)])
    s = q[:, :, :, rows].double() @ k.double()[:, :, None].transpose(-1, -2) * scale
    s = s.masked_fill(rows.cuda()[:, None] < torch.arange(S, device="cuda")[None], -math.inf)
    ref = torch.softmax(s, -1) @ v.double()[:, :, None]

    def sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q.flatten(1, 2), k, v, is_causal=True, scale=scale,
                    enable_gqa=True).unflatten(1, (G, R))
        return call
    return Case("gqa_causal_grouped_axes", f"B{B} S{S} G{G}×R{R} D{D} [BGRSD]",
                lambda: f(q, k, v, scale=scale),
                {SDPA_CUDNN: sdpa(SDPBackend.CUDNN_ATTENTION),
                 SDPA_FLASH: sdpa(SDPBackend.FLASH_ATTENTION)},
                ref, lambda out: out[:, :, :, rows], flops=2 * B * G * R * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, G=G, R=R, S=S, D=D)})


def _one_cache_case(generator, B=2, H=16, S=4096, D=128) -> Case:
    """Causal MQA, 16 query heads over one [B, S, D] cache; SDPA on its [B, 1, S, D] view
    with ``enable_gqa``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
    k, v = (torch.randn(B, S, D, generator=generator).to("cuda", torch.bfloat16)
            for _ in range(2))
    scale = D ** -0.5
    f = Recorded(mqa_causal_one_cache)
    rows = torch.cat([torch.arange(64), torch.arange(S - 64, S)])
    s = q[:, :, rows].double() @ k.double()[:, None].transpose(-1, -2) * scale
    s = s.masked_fill(rows.cuda()[:, None] < torch.arange(S, device="cuda")[None], -math.inf)
    ref = torch.softmax(s, -1) @ v.double()[:, None]

    def sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k[:, None], v[:, None], is_causal=True, scale=scale, enable_gqa=True)
        return call
    return Case("mqa_causal_one_cache", f"B{B} H{H}/1 S{S} D{D} [BSD cache]",
                lambda: f(q, k, v, scale=scale),
                {SDPA_CUDNN: sdpa(SDPBackend.CUDNN_ATTENTION),
                 SDPA_FLASH: sdpa(SDPBackend.FLASH_ATTENTION)},
                ref, lambda out: out[:, :, rows], flops=2 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D)})


def _log_softmax_case(generator, B=8, C=150, P=65536) -> Case:
    x = (torch.randn(B, C, P, generator=generator) * 4).to("cuda", torch.bfloat16)
    return rows_case("log_softmax_channels", log_softmax_channels,
                      lambda t: torch.log_softmax(t.float(), 1).to(t.dtype), x, {},
                      f"B{B} C{C} P{P} (over C)")


def _qk_norm_case(generator, B=8, S=4096, H=32, D=128) -> Case:
    x = torch.randn(B, S, H, D, generator=generator).to("cuda", torch.bfloat16)
    w = torch.rand(D, generator=generator).to("cuda", torch.bfloat16) + 0.5

    def eager(t, weight, eps):
        t32 = t.float()
        return (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + eps)
                * weight.float()).to(t.dtype)
    return rows_case("qk_norm_bshd", qk_norm_bshd, eager, x, {"w": w, "eps": 1e-6},
                      f"B{B} S{S} H{H} D{D} [BSHD] (over D)")


def _layernorm_channels_case(generator, B=8, D=1024, S=4096) -> Case:
    x = (torch.randn(B, D, S, generator=generator) * 2 + 3).to("cuda", torch.bfloat16)
    w = (torch.rand(D, generator=generator) + 0.5).to("cuda", torch.bfloat16)
    bias = torch.randn(D, generator=generator).to("cuda", torch.bfloat16)

    def eager(t, weight, shift, eps):   # what a model does: layer_norm on a transposed view
        return torch.nn.functional.layer_norm(t.transpose(1, 2), (t.shape[1],), weight, shift,
                                              eps).transpose(1, 2)
    return rows_case("layernorm_channels", layernorm_channels, eager, x,
                      {"w": w, "bias": bias, "eps": 1e-5}, f"B{B} D{D} S{S} (over D)")


def _group_norm_case(generator, B=16, G=32, C=16, P=4096) -> Case:
    x = (torch.randn(B, G, C, P, generator=generator) * 2 + 1).to("cuda", torch.bfloat16)
    w = (torch.rand(G, C, generator=generator) + 0.5).to("cuda", torch.bfloat16)
    bias = torch.randn(G, C, generator=generator).to("cuda", torch.bfloat16)

    def eager(t, weight, shift, eps):   # what a model does: group_norm on [B, channels, pixels]
        flat = t.reshape(t.shape[0], -1, t.shape[-1])
        return torch.nn.functional.group_norm(flat, t.shape[1], weight.reshape(-1),
                                              shift.reshape(-1), eps).reshape(t.shape)
    return rows_case("group_norm", group_norm, eager, x, {"w": w, "bias": bias, "eps": 1e-5},
                      f"B{B} G{G} C/G{C} P{P} (over C/G and P)")


def _max_pool_l2_case(generator, B=64, S=512, D=4096) -> Case:
    x = (torch.randn(B, S, D, generator=generator) * 3).to("cuda", torch.bfloat16)

    def eager(t):
        pooled = t.float().amax(1)
        return (pooled * torch.rsqrt((pooled * pooled).sum(-1, keepdim=True) + 1e-12)).to(t.dtype)
    return rows_case("max_pool_l2", max_pool_l2, eager, x, {}, f"B{B} S{S} D{D} (max over S)")


def _channel_stats_case(generator, N=32 * 56 * 56, C=256) -> Case:
    """A ResNet stage's activations, batch 32 (channels last); torch's var_mean over dim 0."""
    x = (torch.randn(N, C, generator=generator) * 2 + 1).to("cuda", torch.bfloat16)

    def eager(t):
        var, mean = torch.var_mean(t.float() if t.dtype != torch.float64 else t, 0, correction=0)
        return torch.stack([mean, var])
    f, compiled = Recorded(channel_stats), torch.compile(eager)
    return Case("channel_stats", f"N{N} C{C} (over N)", lambda: f(x),
                {TORCH_COMPILE: lambda: compiled(x), TORCH_EAGER: lambda: eager(x)},
                eager(x.double()), lambda out: torch.stack(out) if isinstance(out, tuple) else out,
                bytes=x.numel() * x.element_size() + 2 * C * 4,
                notes={TENSORFUSE: f.schedule_origin(N=N, C=C)})


def _segment_mean_case(generator, G=2048, D=1024, longest=128) -> Case:
    """Segments of 1 to 128 rows packed without gaps; torch's own segment_reduce and an
    index_add_ over segment ids (eager and compiled) as the alternatives."""
    lengths = torch.randint(1, longest + 1, (G,), generator=generator)
    starts = lengths.cumsum(0) - lengths
    x = torch.randn(int(lengths.sum()), D, generator=generator).to("cuda", torch.bfloat16)
    lengths, starts = lengths.cuda(), starts.cuda()
    ids = torch.repeat_interleave(torch.arange(G, device="cuda"), lengths)

    def scattered(t, at):
        acc = torch.float64 if t.dtype == torch.float64 else torch.float32
        total = torch.zeros(G, t.shape[1], device=t.device, dtype=acc).index_add_(0, at,
                                                                                  t.to(acc))
        return (total / lengths[:, None]).to(t.dtype)

    compiled = torch.compile(scattered)
    f = Recorded(segment_mean)
    starts32, lengths32 = starts.to(torch.int32), lengths.to(torch.int32)
    moved = (x.numel() + G * D) * x.element_size()
    return Case("segment_mean", f"R{x.shape[0]} D{D} G{G} (1..{longest} rows each)",
                lambda: f(x, starts32, lengths32),
                {TORCH_COMPILE: lambda: compiled(x, ids),
                 TORCH_EAGER: lambda: scattered(x, ids),
                 "torch segment_reduce": lambda: torch.segment_reduce(x, "mean",
                                                                      lengths=lengths, axis=0)},
                scattered(x.double(), ids), lambda out: out, bytes=moved,
                notes={TENSORFUSE: f.schedule_origin(R=x.shape[0], D=D, G=G)})


def _decode_sdpa(q4, k4, v4, scale, gqa: bool):
    """SDPA on [B, H, 1, D] queries (label → call), one per backend that takes the case."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def on(backend):
        def call():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q4, k4, v4, scale=scale, enable_gqa=gqa)[:, :, 0]
        return call
    return {SDPA_CUDNN: on(SDPBackend.CUDNN_ATTENTION), SDPA_FLASH: on(SDPBackend.FLASH_ATTENTION),
            SDPA: on([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                      SDPBackend.CUDNN_ATTENTION])}


def _decode_reference(q, keys, values, scale):
    """float64 ``softmax(q·kᵀ)·v`` of [B, H, D] queries over [B, HKV, N, D] keys and values, each
    group of H / HKV consecutive heads on one kv-head."""
    B, H, D = q.shape
    grouped = q.double().reshape(B, keys.shape[1], H // keys.shape[1], D)
    s = torch.einsum("bgrd,bgnd->bgrn", grouped, keys.double()) * scale
    return torch.einsum("bgrn,bgnd->bgrd", torch.softmax(s, -1), values.double()).reshape(B, H, D)


def _mqa_decode_case(generator, B=16, H=64, N=16384, D=128) -> Case:
    q = torch.randn(B, H, D, generator=generator).to("cuda", torch.bfloat16)
    k, v = (torch.randn(B, N, D, generator=generator).to("cuda", torch.bfloat16)
            for _ in range(2))
    scale = D ** -0.5
    f = Recorded(mqa_decode)
    ref = _decode_reference(q, k[:, None], v[:, None], scale)
    return Case("mqa_decode", f"B{B} H{H}/1 N{N} D{D}", lambda: f(q, k, v, scale=scale),
                _decode_sdpa(q[:, :, None], k[:, None], v[:, None], scale, gqa=True),
                ref, lambda out: out, bytes=2 * k.numel() * k.element_size(),
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, N=N, D=D)})


def _gqa_decode_case(generator, B=8, H=32, HKV=8, N=32768, D=128) -> Case:
    q = torch.randn(B, H, D, generator=generator).to("cuda", torch.bfloat16)
    k, v = (torch.randn(B, HKV, N, D, generator=generator).to("cuda", torch.bfloat16)
            for _ in range(2))
    scale = D ** -0.5
    f = Recorded(gqa_decode)
    return Case("gqa_decode", f"B{B} H{H}/{HKV} N{N} D{D}", lambda: f(q, k, v, scale=scale),
                _decode_sdpa(q[:, :, None], k, v, scale, gqa=True),
                _decode_reference(q, k, v, scale), lambda out: out,
                bytes=2 * k.numel() * k.element_size(),
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, HKV=HKV, N=N, D=D)})


def _gqa_decode_bnhd_case(generator, B=1, H=32, HKV=8, N=32768, D=128) -> Case:
    """Batch-1 decode over a [B, N, HKV, D] cache, against SDPA on its [B, HKV, N, D] view."""
    q = torch.randn(B, H, D, generator=generator).to("cuda", torch.bfloat16)
    k, v = (torch.randn(B, N, HKV, D, generator=generator).to("cuda", torch.bfloat16)
            for _ in range(2))
    scale = D ** -0.5
    f = Recorded(gqa_decode_bnhd)
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    return Case("gqa_decode_bnhd", f"B{B} H{H}/{HKV} N{N} D{D} [BNHD]",
                lambda: f(q, k, v, scale=scale), _decode_sdpa(q[:, :, None], kt, vt, scale, True),
                _decode_reference(q, kt, vt, scale), lambda out: out,
                bytes=2 * k.numel() * k.element_size(),
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, HKV=HKV, N=N, D=D)})


def _paged_decode_case(generator, B=8, H=32, HKV=8, N=32768, D=128, PAGE=64) -> Case:
    """A paged cache (pages in a shuffled pool) against SDPA on the same keys in a contiguous
    [B, HKV, N, D] cache, and against gathering the pages first, then SDPA."""
    pages = B * N // PAGE
    q = torch.randn(B, H, D, generator=generator).to("cuda", torch.bfloat16)
    k_pages, v_pages = (torch.randn(pages, PAGE, HKV, D, generator=generator)
                        .to("cuda", torch.bfloat16) for _ in range(2))
    table = torch.randperm(pages, generator=generator).reshape(B, N // PAGE).to("cuda",
                                                                                 torch.int32)

    def gathered(pool):   # [B, HKV, N, D]
        return pool[table.long()].reshape(B, N, HKV, D).transpose(1, 2)

    k, v = gathered(k_pages).contiguous(), gathered(v_pages).contiguous()
    scale = D ** -0.5
    f = Recorded(paged_decode)
    ref = _decode_reference(q, k, v, scale)
    alternatives = {f"{label} (contiguous cache)": call for label, call in
                    _decode_sdpa(q[:, :, None], k, v, scale, gqa=True).items()}
    alternatives["torch gather + sdpa"] = lambda: torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None], gathered(k_pages), gathered(v_pages), scale=scale, enable_gqa=True)[:, :, 0]
    return Case("paged_decode", f"B{B} H{H}/{HKV} N{N} D{D} pages of {PAGE}",
                lambda: f(q, k_pages, v_pages, table, scale=scale), alternatives, ref,
                lambda out: out, bytes=2 * k.numel() * k.element_size(),
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, HKV=HKV, D=D, PAGES=pages,
                                                     PAGE=PAGE, NP=N // PAGE)})


def _cross_attention_case(generator, B=4, H=16, M=1024, N=8192, D=128) -> Case:
    """Cross-attention to encoder states padded to N, each sequence's first lengths[b] valid;
    SDPA takes the lengths as a boolean mask, FlexAttention as a mask_mod."""
    from torch.nn.attention.flex_attention import create_block_mask

    from benchmarks.attention import compiled_flex

    q = torch.randn(B, H, M, D, generator=generator).to("cuda", torch.bfloat16)
    k, v = (torch.randn(B, H, N, D, generator=generator).to("cuda", torch.bfloat16)
            for _ in range(2))
    lengths = torch.randint(N // 2, N + 1, (B,), generator=generator).to("cuda", torch.int32)
    scale = D ** -0.5
    f = Recorded(cross_attention_lengths)
    valid = torch.arange(N, device="cuda")[None, :] < lengths[:, None]       # [B, N]
    rows = torch.cat([torch.arange(64), torch.arange(M - 64, M)])
    s = q[:, :, rows].double() @ k.double().transpose(-1, -2) * scale
    ref = torch.softmax(s.masked_fill(~valid[:, None, None], -math.inf), -1) @ v.double()
    mask = valid[:, None, None]
    flex = compiled_flex()
    blocks = create_block_mask(lambda b, h, i, j: j < lengths[b], B, None, M, N, device="cuda")

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                scale=scale)
    return Case("cross_attention_lengths", f"B{B} H{H} M{M} N{N} D{D} (per-row lengths)",
                lambda: f(q, k, v, lengths, scale=scale),
                {SDPA: sdpa, FLEX: lambda: flex(q, k, v, block_mask=blocks, scale=scale)},
                ref, lambda out: out[:, :, rows],
                flops=4 * H * M * D * float(lengths.sum()),
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, M=M, N=N, D=D)})


def _embedding_backward_case(generator, V=128256, M=8192, D=4096, device="cuda") -> Case:
    """Llama-3's vocabulary, 8192 tokens: ``tf.grad(embedding)`` (the scatter-add template)
    against torch's embedding backward, eager and under torch.compile."""
    tokens = torch.randint(0, V, (M,), generator=generator).to(device, torch.int32)
    table = torch.randn(V, D, generator=generator).to(device, torch.bfloat16)
    d_out = torch.randn(M, D, generator=generator).to(device, torch.bfloat16)
    index = tokens.long()

    def eager(grad, ids):
        return torch.ops.aten.embedding_dense_backward(grad, ids, V, -1, False)
    f, compiled = Recorded(tf.grad(embedding)), torch.compile(eager)
    want = torch.zeros(V, D, dtype=torch.float64, device=device).index_add_(0, index,
                                                                             d_out.double())
    return Case("embedding_backward", f"V{V} M{M} D{D}",
                lambda: f(table=table, tokens=tokens, d_out=d_out),
                {TORCH_COMPILE: lambda: compiled(d_out, index),
                 TORCH_EAGER: lambda: eager(d_out, index)},
                want, lambda out: out,
                bytes=(M * D + V * D) * 2 + M * 4,
                notes={TENSORFUSE: f.schedule_origin(V=V, M=M, D=D)})


@tf.kernel
def global_avg_pool(x: T.Tensor["B", "C", "H", "W", "bf16"]):
    """A CNN's global average pool: its gradient is a broadcast without reductions."""
    b, c, h, w = T.axes("b c h w")
    return T.sum(x[b, c, h, w], over=(h, w)) / (T.size("H") * T.size("W"))


def _avg_pool_backward_case(generator, B=64, C=512, H=56, W=56, device="cuda") -> Case:
    """``tf.grad(global_avg_pool)`` (the elementwise template: a broadcast of the incoming
    gradient) against what autograd runs for ``x.mean((2, 3))`` (the gradient expanded and
    divided: one kernel writing every element), eager and under torch.compile. (torch's
    ``adaptive_avg_pool2d`` backward measured 190x slower on the H200: not the alternative.)"""
    x = torch.randn(B, C, H, W, generator=generator).to(device, torch.bfloat16)
    d_out = torch.randn(B, C, generator=generator).to(device, torch.bfloat16)

    def eager(grad):
        return grad[:, :, None, None].expand(B, C, H, W) / (H * W)
    f, compiled = Recorded(tf.grad(global_avg_pool)), torch.compile(eager)
    want = (d_out.double() / (H * W))[:, :, None, None].expand(B, C, H, W)
    return Case("avg_pool_backward", f"B{B} C{C} H{H} W{W}",
                lambda: f(x=x, d_out=d_out),
                {TORCH_COMPILE: lambda: compiled(d_out), TORCH_EAGER: lambda: eager(d_out)},
                want, lambda out: out, bytes=(B * C * H * W + B * C) * 2,
                notes={TENSORFUSE: f.schedule_origin(B=B, C=C, H=H, W=W)})


SUITE = {
    "causal_sbhd": lambda g: _attention_case("causal_sbhd", sbhd_causal, "sbhd", 2, 16, 16, 4096,
                                             128, g),
    "causal_bshd_d64": lambda g: _attention_case("causal_bshd_d64", bshd_causal, "bshd", 2, 16,
                                                 16, 4096, 64, g),
    "gqa_causal_bshd": lambda g: _attention_case("gqa_causal_bshd", bshd_gqa_causal, "bshd", 2,
                                                 32, 8, 4096, 128, g),
    "causal_bshd_d256": lambda g: _attention_case("causal_bshd_d256", bshd_causal, "bshd", 2,
                                                  16, 16, 4096, 256, g),
    # head dims between 128-byte swizzle atoms: the Hopper template's tiles padded to 128
    "causal_bshd_d96": lambda g: _attention_case("causal_bshd_d96", bshd_causal, "bshd", 2, 16,
                                                 16, 4096, 96, g),
    "causal_bshd_d80": lambda g: _attention_case("causal_bshd_d80", bshd_causal, "bshd", 2, 16,
                                                 16, 4096, 80, g),
    "causal_dqk192_dv128": _two_head_dims_case,
    "gqa_causal_grouped_axes": _grouped_axes_case,
    "mqa_causal_one_cache": _one_cache_case,
    "cross_attention_lengths": _cross_attention_case,
    "mqa_decode": _mqa_decode_case,
    "gqa_decode": _gqa_decode_case,
    "gqa_decode_bnhd": _gqa_decode_bnhd_case,
    "paged_decode": _paged_decode_case,
    "log_softmax_channels": _log_softmax_case,
    "qk_norm_bshd": _qk_norm_case,
    "layernorm_channels": _layernorm_channels_case,
    "group_norm": _group_norm_case,
    "max_pool_l2": _max_pool_l2_case,
    "segment_mean": _segment_mean_case,
    "channel_stats": _channel_stats_case,
    "embedding_backward": _embedding_backward_case,
    "avg_pool_backward": _avg_pool_backward_case,
}


if __name__ == "__main__":
    main(SUITE, "user-kernels", __doc__)
