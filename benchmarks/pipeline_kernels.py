"""Kernels of training and serving pipelines no issue lists, written as a new user would write
them — a distillation loss (KL divergence of two soft-maxed rows over a vocabulary), the entropy
of a policy's soft-maxed logits, sigmoid attention (no normaliser: Apple's), fp8-style scaling
of groups of 128 features by their absolute maximum (DeepSeek's), a CNN's global average pool,
a log-sum-exp pool over tokens (a reduction down the strided axis), causal attention by squared
ReLU (Primer's), RetNet's retention (causal scores decayed a head, the mask around the whole
product), Perceiver's latent queries shared by the batch, attention pooling by a
learned query vector, cosine-similarity attention (Swin v2's: q·k over the norms) and a linear
layer of int8 weights with a scale per channel (weight-only quantisation, serving), a mixture
of experts' layer with one expert a token (its weights gathered by the token's expert), a
keypoint head's soft-argmax (sums over an image written nested), a mean absolute deviation per
row and min-p sampling's kept mass (reductions that read another's final value: held to rows of
one block at 4096 columns, the floor's two passes over a vocabulary) — through
``tf.compile`` defaults against the best torch alternative in the same process, each checked
against a float64 reference first (the harness of :mod:`benchmarks.kernel_suite`).

    python -m benchmarks.pipeline_kernels [--only NAME,…] [--tune TRIALS]

Rows: ``benchmark`` = ``user/<name>``; CSV
``benchmarks/results/<date>-<device>-pipeline-kernels.csv``.
"""
import math

import torch
import torch.nn.functional as F

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.common import SDPA, TENSORFUSE, TORCH_COMPILE, TORCH_EAGER
from benchmarks.kernel_suite import Case, Recorded, main, rows_case


@tf.kernel
def kl_divergence_rows(a: T.Tensor["M", "V", "bf16"], b: T.Tensor["M", "V", "bf16"]):
    """Distillation's loss per row: ``KL(softmax(a) ‖ softmax(b))`` over the vocabulary."""
    i, v = T.axes("i v")
    ma = T.max(a[i, v], over=v)
    la = T.sum(T.exp(a[i, v] - ma), over=v)
    mb = T.max(b[i, v], over=v)
    lb = T.sum(T.exp(b[i, v] - mb), over=v)
    log_pa = a[i, v] - ma - T.log(la)
    log_pb = b[i, v] - mb - T.log(lb)
    return T.sum(T.exp(log_pa) * (log_pa - log_pb), over=v)


@tf.kernel
def softmax_entropy(x: T.Tensor["M", "V", "bf16"]):
    """A policy's entropy per row, ``−Σ p log p`` of ``p = softmax(x)`` (an RL objective's
    bonus)."""
    i, v = T.axes("i v")
    m = T.max(x[i, v], over=v)
    l = T.sum(T.exp(x[i, v] - m), over=v)
    log_p = x[i, v] - m - T.log(l)
    return -T.sum(T.exp(log_p) * log_p, over=v)


@tf.kernel
def sigmoid_attention(q: T.Tensor["B", "H", "S", "D", "bf16"],
                      k: T.Tensor["B", "H", "S", "D", "bf16"],
                      v: T.Tensor["B", "H", "S", "D", "bf16"], scale: T.f32, bias: T.f32):
    """Sigmoid attention: each score through a sigmoid (a bias of −log S), no normaliser."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale + bias
    return T.cast(T.sum(T.sigmoid(s) * v[b, h, j, e], over=j), "bf16")


@tf.kernel
def group_quant_scale(x: T.Tensor["M", "G", "K", "bf16"]):
    """Each group of K features (128: DeepSeek's fp8 blocks) scaled so that its largest
    magnitude is fp8 e4m3's largest value, 448."""
    i, g, k = T.axes("i g k")
    amax = T.max(T.abs(x[i, g, k]), over=k)
    return T.cast(x[i, g, k] * (448.0 / T.maximum(amax, 1e-4)), "bf16")


@tf.kernel
def global_avg_pool(x: T.Tensor["B", "C", "H", "W", "bf16"]):
    """A CNN's global average pool over each channel's pixels (NCHW)."""
    b, c, h, w = T.axes("b c h w")
    return T.cast(T.mean(x[b, c, h, w], over=(h, w)), "bf16")


@tf.kernel
def logsumexp_pool(x: T.Tensor["B", "S", "D", "bf16"]):
    """A smooth maximum over tokens: the log-sum-exp of each feature down the sequence."""
    b, s, d = T.axes("b s d")
    m = T.max(x[b, s, d], over=s)
    return T.cast(m + T.log(T.sum(T.exp(x[b, s, d] - m), over=s)), "bf16")


@tf.kernel
def relu2_causal_attention(q: T.Tensor["B", "H", "S", "D", "bf16"],
                           k: T.Tensor["B", "H", "S", "D", "bf16"],
                           v: T.Tensor["B", "H", "S", "D", "bf16"], scale: T.f32):
    """Causal attention weighted by squared ReLU scores (Primer's), no normaliser."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    r = T.maximum(T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale, 0.0)
    return T.cast(T.sum(T.where(i >= j, r * r, 0.0) * v[b, h, j, e], over=j), "bf16")


@tf.kernel
def retention(q: T.Tensor["B", "H", "S", "D", "bf16"], k: T.Tensor["B", "H", "S", "D", "bf16"],
              v: T.Tensor["B", "H", "S", "D", "bf16"], gamma: T.Tensor["H", "f32"]):
    """RetNet's retention in its parallel form: causal scores decayed by ``γ_h^(i−j)`` a head,
    no normaliser — the mask written around the whole product, as the paper's ``(QKᵀ ⊙ D) V``."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d)
    decay = gamma[h] ** T.cast(i - j, "f32")
    return T.cast(T.sum(T.where(j <= i, s * decay * v[b, h, j, e], 0.0), over=j), "bf16")


@tf.kernel
def latent_cross_attention(q: T.Tensor["L", "D", "bf16"], k: T.Tensor["B", "S", "D", "bf16"],
                           v: T.Tensor["B", "S", "D", "bf16"], scale: T.f32):
    """Perceiver's cross-attention: learned latent queries, shared by the batch, over each
    sequence's tokens."""
    b, l, j, d, e = T.axes("b l j d e")
    s = T.sum(q[l, d] * k[b, j, d], over=d) * scale
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.cast(T.sum(p * v[b, j, e], over=j) / T.sum(p, over=j), "bf16")


@tf.kernel
def attention_pool(x: T.Tensor["B", "S", "D", "bf16"], w: T.Tensor["D", "bf16"]):
    """Attention pooling by a learned query vector: the tokens' features averaged with the
    softmax of their scores against ``w``."""
    b, s, d, e = T.axes("b s d e")
    a = T.sum(x[b, s, d] * w[d], over=d)
    m = T.max(a, over=s)
    p = T.exp(a - m)
    return T.cast(T.sum(p * x[b, s, e], over=s) / T.sum(p, over=s), "bf16")


@tf.kernel
def cosine_attention(q: T.Tensor["B", "H", "S", "D", "bf16"],
                     k: T.Tensor["B", "H", "S", "D", "bf16"],
                     v: T.Tensor["B", "H", "S", "D", "bf16"], tau: T.f32):
    """Attention by cosine similarity (Swin Transformer v2's): ``q·k / (|q| |k|)`` times a
    learned temperature, soft-maxed over the keys."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    nq = T.sqrt(T.sum(q[b, h, i, d] * q[b, h, i, d], over=d))
    nk = T.sqrt(T.sum(k[b, h, j, d] * k[b, h, j, d], over=d))
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) / (nq * nk) * tau
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.cast(T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j), "bf16")


@tf.kernel
def gated_attention(q: T.Tensor["B", "H", "S", "D", "bf16"],
                    k: T.Tensor["B", "H", "S", "D", "bf16"],
                    v: T.Tensor["B", "H", "S", "D", "bf16"],
                    gate: T.Tensor["B", "H", "S", "D", "bf16"], scale: T.f32):
    """Causal attention whose output is gated by a sigmoid of the query's own projection
    (Qwen3-Next's gated attention)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.where(i >= j, T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale, -T.inf)
    m = T.max(s, over=j)
    p = T.exp(s - m)
    o = T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)
    return T.cast(o * T.sigmoid(gate[b, h, i, e]), "bf16")


@tf.kernel
def w8a16_linear(w: T.Tensor["N", "K", "i8"], s: T.Tensor["N", "f32"],
                 x: T.Tensor["B", "K", "bf16"]):
    """A linear layer of int8 weights, a scale per output channel (weight-only quantisation)."""
    b, n, k = T.axes("b n k")
    return T.cast(T.sum(w[n, k] * x[b, k], over=k) * s[n], "bf16")


@tf.kernel
def expert_linear(x: T.Tensor["T", "K", "bf16"], w: T.Tensor["E", "N", "K", "bf16"],
                  expert: T.Tensor["T", "i32"]):
    """A mixture of experts' layer with one expert a token (top-1 routing), each token's row
    multiplied by its own expert's weights — computed in f32, as users write it."""
    t, n, k = T.axes("t n k")
    return T.cast(T.sum(T.cast(x[t, k], "f32") * T.cast(w[expert[t], n, k], "f32"), over=k),
                  "bf16")


@tf.kernel
def soft_argmax(x: T.Tensor["B", "C", "H", "W", "f32"]):
    """A keypoint head's soft-argmax: each channel's expected row and column under a softmax
    over its pixels, the sums over the image written nested (a row's, then the rows')."""
    b, c, h, w = T.axes("b c h w")
    m = T.max(T.max(x[b, c, h, w], over=w), over=h)
    p = T.exp(x[b, c, h, w] - m)
    z = T.sum(T.sum(p, over=w), over=h)
    row = T.sum(T.sum(p * T.cast(h, "f32"), over=w), over=h) / z
    col = T.sum(T.sum(p * T.cast(w, "f32"), over=w), over=h) / z
    return row, col


@tf.kernel
def mean_absolute_deviation(x: T.Tensor["M", "N", "bf16"]):
    """Each row's mean absolute deviation from its mean (a robust spread): ``|x − mean|`` reads
    the mean's final value, which no running correction carries — one kernel where a block holds
    the row (the deviations held to it), the floor's two passes over wider rows."""
    i, j = T.axes("i j")
    mean = T.sum(T.cast(x[i, j], "f32"), over=j) / T.size("N")
    return T.sum(T.abs(T.cast(x[i, j], "f32") - mean), over=j) / T.size("N")


@tf.kernel
def min_p_mass(x: T.Tensor["M", "V", "bf16"], min_p: T.f32):
    """Min-p sampling's kept probability mass per row: the softmax's mass on the tokens whose
    probability is at least ``min_p`` times the largest (a threshold on the row's final max)."""
    i, v = T.axes("i v")
    m = T.max(x[i, v], over=v)
    z = T.cast(x[i, v], "f32") - m
    kept = T.sum(T.where(z >= T.log(min_p), T.exp(z), 0.0), over=v)
    return kept / T.sum(T.exp(z), over=v)


def _logits(generator, M, V, spread=4.0):
    return (torch.randn(M, V, generator=generator) * spread).to("cuda", torch.bfloat16)


def _kl_case(generator, M=2048, V=128256) -> Case:
    a, b = _logits(generator, M, V), _logits(generator, M, V)

    def eager(a, b):
        la, lb = (F.log_softmax(t.float() if t.dtype != torch.float64 else t, -1)
                  for t in (a, b))
        return (la.exp() * (la - lb)).sum(-1)
    return rows_case("kl_divergence_rows", kl_divergence_rows, eager, a, {"b": b},
                     f"M{M} V{V} (over V)")


def _entropy_case(generator, M=4096, V=128256) -> Case:
    x = _logits(generator, M, V)

    def eager(t):
        log_p = F.log_softmax(t.float() if t.dtype != torch.float64 else t, -1)
        return -(log_p.exp() * log_p).sum(-1)
    return rows_case("softmax_entropy", softmax_entropy, eager, x, {}, f"M{M} V{V} (over V)")


def _mad_case(generator, M=8192, N=4096) -> Case:
    x = (torch.randn(M, N, generator=generator) * 3 + 5).to("cuda", torch.bfloat16)

    def eager(t):
        t32 = t.float() if t.dtype != torch.float64 else t
        return (t32 - t32.mean(-1, keepdim=True)).abs().mean(-1)
    return rows_case("mean_absolute_deviation", mean_absolute_deviation, eager, x, {},
                     f"M{M} N{N} (over N)")


def _min_p_case(generator, M=256, V=128256) -> Case:
    x = _logits(generator, M, V)

    def eager(t, min_p):
        p = torch.softmax(t.float() if t.dtype != torch.float64 else t, -1)
        return torch.where(p >= min_p * p.amax(-1, keepdim=True), p, 0).sum(-1)
    return rows_case("min_p_mass", min_p_mass, eager, x, {"min_p": 0.05}, f"M{M} V{V} (over V)")


def _sigmoid_attention_case(generator, B=2, H=16, S=4096, D=128) -> Case:
    q, k, v = (torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
               for _ in range(3))
    scale, bias = D ** -0.5, -float(torch.log(torch.tensor(float(S))))

    def eager(q, k, v):
        return torch.sigmoid((q @ k.transpose(-1, -2)).float() * scale + bias).to(v.dtype) @ v
    f, compiled = Recorded(sigmoid_attention), torch.compile(eager)
    rows = torch.arange(0, S, 37)
    qd, kd, vd = q[:, :, rows].double(), k.double(), v.double()
    ref = torch.sigmoid(qd @ kd.transpose(-1, -2) * scale + bias) @ vd
    return Case("sigmoid_attention", f"B{B} H{H} S{S} D{D}",
                lambda: f(q, k, v, scale, bias),
                {TORCH_COMPILE: lambda: compiled(q, k, v), TORCH_EAGER: lambda: eager(q, k, v)},
                ref, lambda out: out[:, :, rows], flops=4 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D)})


def _group_quant_case(generator, M=8192, K=7168, group=128) -> Case:
    x = (torch.randn(M, K // group, group, generator=generator) * 3).to("cuda", torch.bfloat16)

    def eager(t):
        t32 = t.float() if t.dtype != torch.float64 else t
        return (t32 * (448.0 / t32.abs().amax(-1, keepdim=True).clamp_min(1e-4))).to(t.dtype)
    return rows_case("group_quant_scale", group_quant_scale, eager, x, {},
                     f"M{M} K{K} groups of {group}")


def _global_pool_case(generator, B=64, C=512, H=28, W=28) -> Case:
    x = (torch.randn(B, C, H, W, generator=generator) + 1).to("cuda", torch.bfloat16)

    def eager(t):
        return (t.float() if t.dtype != torch.float64 else t).mean((2, 3)).to(t.dtype)
    return rows_case("global_avg_pool", global_avg_pool, eager, x, {},
                     f"B{B} C{C} H{H} W{W} (over H, W)")


def _logsumexp_pool_case(generator, B=64, S=512, D=4096) -> Case:
    x = (torch.randn(B, S, D, generator=generator) * 4).to("cuda", torch.bfloat16)

    def eager(t):
        return (t.float() if t.dtype != torch.float64 else t).logsumexp(1).to(t.dtype)
    return rows_case("logsumexp_pool", logsumexp_pool, eager, x, {}, f"B{B} S{S} D{D} (over S)")


def _relu2_case(generator, B=2, H=16, S=4096, D=128) -> Case:
    q, k, v = (torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
               for _ in range(3))
    scale = D ** -0.5
    causal = torch.ones(S, S, dtype=torch.bool, device="cuda").tril()

    def eager(q, k, v):
        r = torch.relu((q @ k.transpose(-1, -2)).float() * scale)
        return torch.where(causal, r * r, 0.0).to(v.dtype) @ v
    f, compiled = Recorded(relu2_causal_attention), torch.compile(eager)
    rows = torch.arange(0, S, 37)
    r = torch.relu(q[:, :, rows].double() @ k.double().transpose(-1, -2) * scale)
    ref = torch.where(causal[rows], r * r, 0.0) @ v.double()
    return Case("relu2_causal_attention", f"B{B} H{H} S{S} D{D} causal",
                lambda: f(q, k, v, scale),
                {TORCH_COMPILE: lambda: compiled(q, k, v), TORCH_EAGER: lambda: eager(q, k, v)},
                ref, lambda out: out[:, :, rows], flops=2 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D)})


def _retention_case(generator, B=2, H=16, S=4096, D=128) -> Case:
    """RetNet's decays, ``1 − 2^(−5−h)`` over 16 heads; torch builds the decay matrix ``D``
    ``[H, S, S]`` (zero above the diagonal) and multiplies it into the scores."""
    q, k, v = (torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
               for _ in range(3))
    gamma = 1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float32, device="cuda"))
    steps = torch.arange(S, device="cuda")
    gaps = (steps[:, None] - steps[None, :]).float()
    decay = torch.where(gaps >= 0, gamma[:, None, None] ** gaps, 0.0)

    def eager(q, k, v):
        return (((q @ k.transpose(-1, -2)).float() * decay).to(v.dtype) @ v)
    f, compiled = Recorded(retention), torch.compile(eager)
    rows = torch.arange(0, S, 37)
    ref = (q[:, :, rows].double() @ k.double().transpose(-1, -2) *
           decay[:, rows].double()) @ v.double()
    return Case("retention", f"B{B} H{H} S{S} D{D} causal, decayed",
                lambda: f(q, k, v, gamma),
                {TORCH_COMPILE: lambda: compiled(q, k, v), TORCH_EAGER: lambda: eager(q, k, v)},
                ref, lambda out: out[:, :, rows], flops=2 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D)})


def _latent_cross_case(generator, L=256, B=32, S=4096, D=128) -> Case:
    q = torch.randn(L, D, generator=generator).to("cuda", torch.bfloat16)
    k, v = (torch.randn(B, S, D, generator=generator).to("cuda", torch.bfloat16)
            for _ in range(2))
    scale = D ** -0.5

    def sdpa():   # the latents broadcast over the batch (a view), one head
        return F.scaled_dot_product_attention(q.expand(B, 1, L, D), k[:, None], v[:, None],
                                              scale=scale)[:, 0]
    f = Recorded(latent_cross_attention)
    grid = _latent_on_one_cta_a_tile()
    s = q.double() @ k.double().transpose(-1, -2) * scale
    ref = torch.softmax(s, -1) @ v.double()
    return Case("latent_cross_attention", f"L{L} B{B} S{S} D{D}", lambda: f(q, k, v, scale),
                {SDPA: sdpa, "tensorfuse grid": lambda: grid(q, k, v, scale)}, ref,
                lambda out: out, flops=4 * B * L * S * D,
                notes={TENSORFUSE: f.schedule_origin(L=L, B=B, S=S, D=D)})


def _latent_on_one_cta_a_tile():
    """The latent cross-attention as ``tf.compile`` runs it (queries copied per sequence, the
    Hopper template) but on one CTA a tile (``schedule="grid"``) instead of the split schedule
    its few tiles get: what that choice gains."""
    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.schedule_templates.shared_queries import (SharedQueriesKernel,
                                                              lift_shared_queries)

    chain = ("m", "out_sum", "out_sum_2")
    shared = lift_shared_queries(latent_cross_attention.program, chain, "j")
    inner = tf.schedule(ProgramKernel(shared.program), "cuda:sm_90a").rolling_update(
        *chain, axis="j").apply_template("hopper_attention", schedule="grid").compile()
    return SharedQueriesKernel(latent_cross_attention.program, shared, inner,
                               tf.get_target("cuda:sm_90a"))


def _attention_pool_case(generator, B=64, S=4096, D=1024) -> Case:
    x = torch.randn(B, S, D, generator=generator).to("cuda", torch.bfloat16)
    w = (torch.randn(D, generator=generator) / 8).to("cuda", torch.bfloat16)

    def eager(t, q):
        t32 = t.float() if t.dtype != torch.float64 else t
        p = torch.softmax(t32 @ q.to(t32.dtype), -1)
        return (p[..., None] * t32).sum(1).to(t.dtype)
    return rows_case("attention_pool", attention_pool, eager, x, {"w": w},
                     f"B{B} S{S} D{D} (over S)")


def _cosine_attention_case(generator, B=2, H=16, S=4096, D=128) -> Case:
    q, k, v = (torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
               for _ in range(3))
    tau = 10.0

    def eager(q, k, v):   # as a user writes it in torch: normalise, then SDPA (cuDNN or flash)
        return F.scaled_dot_product_attention(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v,
                                              scale=tau)
    f, compiled = Recorded(cosine_attention), torch.compile(eager)
    rows = torch.arange(0, S, 37)
    qd, kd = F.normalize(q[:, :, rows].double(), dim=-1), F.normalize(k.double(), dim=-1)
    ref = torch.softmax(qd @ kd.transpose(-1, -2) * tau, -1) @ v.double()
    return Case("cosine_attention", f"B{B} H{H} S{S} D{D}", lambda: f(q, k, v, tau),
                {TORCH_COMPILE: lambda: compiled(q, k, v), SDPA: lambda: eager(q, k, v)},
                ref, lambda out: out[:, :, rows], flops=4 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D)})


def _gated_attention_case(generator, B=2, H=16, S=4096, D=128) -> Case:
    q, k, v, gate = (torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
                     for _ in range(4))
    scale = D ** -0.5

    def eager(q, k, v, gate):   # as a user writes it in torch: SDPA, then the gate
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale) * \
            torch.sigmoid(gate)
    f, compiled = Recorded(gated_attention), torch.compile(eager)
    rows = torch.arange(0, S, 37)
    s = q[:, :, rows].double() @ k.double().transpose(-1, -2) * scale
    s = s.masked_fill(rows.cuda()[:, None] < torch.arange(S, device="cuda")[None], -math.inf)
    ref = (torch.softmax(s, -1) @ v.double()) * torch.sigmoid(gate[:, :, rows].double())
    return Case("gated_attention", f"B{B} H{H} S{S} D{D} causal", lambda: f(q, k, v, gate, scale),
                {TORCH_COMPILE: lambda: compiled(q, k, v, gate),
                 SDPA: lambda: eager(q, k, v, gate)},
                ref, lambda out: out[:, :, rows], flops=2 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D)})


def _w8a16_case(generator, B=16, N=8192, K=8192) -> Case:
    """A decode step's batch of 16 tokens (memory-bound: the bytes are the weights); GB/s."""
    w = torch.randint(-128, 128, (N, K), generator=generator, dtype=torch.int8).to("cuda")
    s = (torch.rand(N, generator=generator) / 64).to("cuda")
    x = torch.randn(B, K, generator=generator).to("cuda", torch.bfloat16)

    def eager(w, s, x):   # dequantise, then cuBLAS
        return (x @ w.to(x.dtype).T * s).to(x.dtype)
    f, compiled = Recorded(w8a16_linear), torch.compile(eager)
    ref = (x.double() @ w.double().T) * s.double()
    return Case("w8a16_linear", f"B{B} N{N} K{K} int8 weights", lambda: f(w, s, x),
                {TORCH_COMPILE: lambda: compiled(w, s, x), TORCH_EAGER: lambda: eager(w, s, x)},
                ref, lambda out: out, bytes=N * K + 4 * N + 2 * B * (K + N),
                notes={TENSORFUSE: f.schedule_origin(B=B, N=N, K=K)})


def _expert_linear_case(generator, T_=8192, K=2048, N=4096, E=8, routing="sorted") -> Case:
    """Tokens routed at random (``routing`` "sorted": then ordered by expert, as a dispatch's
    permutation leaves them; "unsorted": as they come). torch: a matmul an expert over its
    tokens (boolean indexing), and where sorted ``torch._grouped_mm`` over the experts' runs."""
    x = torch.randn(T_, K, generator=generator).to("cuda", torch.bfloat16)
    w = (torch.randn(E, N, K, generator=generator) / K ** 0.5).to("cuda", torch.bfloat16)
    expert = torch.randint(0, E, (T_,), generator=generator).to("cuda", torch.int32)
    if routing == "sorted":
        expert = expert.sort().values

    def eager(x, w, expert):
        out = torch.empty(x.shape[0], w.shape[1], device=x.device, dtype=x.dtype)
        for e in range(w.shape[0]):
            rows = expert == e
            out[rows] = x[rows] @ w[e].T
        return out
    f = Recorded(expert_linear)
    alternatives = {TORCH_EAGER: lambda: eager(x, w, expert)}
    if routing == "sorted" and hasattr(torch, "_grouped_mm"):
        ends = torch.bincount(expert, minlength=E).cumsum(0).to(torch.int32)
        alternatives[f"{TORCH_EAGER} grouped_mm"] = lambda: torch._grouped_mm(
            x, w.transpose(-1, -2), offs=ends)
    rows = torch.arange(0, T_, 37, device="cuda")
    ref = torch.einsum("tk,tnk->tn", x[rows].double(), w[expert[rows].long()].double())
    return Case(f"expert_linear_{routing}", f"T{T_} K{K} N{N} E{E} top-1, {routing}",
                lambda: f(x, w, expert), alternatives, ref, lambda out: out[rows],
                flops=2 * T_ * K * N, notes={TENSORFUSE: f.schedule_origin(T=T_, K=K, N=N, E=E)})


def _soft_argmax_case(generator, B=32, C=64, H=64, W=48) -> Case:
    """Heatmaps of 17-keypoint-style heads, spread ±8; GB/s of the heatmaps read once."""
    x = (torch.randn(B, C, H, W, generator=generator) * 8).to("cuda")
    rows, cols = (torch.arange(n, device="cuda", dtype=torch.float32) for n in (H, W))

    def eager(x):
        p = torch.softmax(x.flatten(2), -1).view_as(x)
        return (p.sum(3) * rows).sum(2), (p.sum(2) * cols).sum(2)
    f, compiled = Recorded(soft_argmax), torch.compile(eager)
    ref = eager(x.double())
    return Case("soft_argmax", f"B{B} C{C} H{H} W{W} f32", lambda: f(x),
                {TORCH_COMPILE: lambda: compiled(x), TORCH_EAGER: lambda: eager(x)},
                torch.stack([r.float() for r in ref]), lambda out: torch.stack(out),
                bytes=x.numel() * 4 + 2 * B * C * 4,
                notes={TENSORFUSE: f.schedule_origin(B=B, C=C, H=H, W=W)})


PIPELINE = {
    "kl_divergence_rows": _kl_case,
    "softmax_entropy": _entropy_case,
    "mean_absolute_deviation": _mad_case,
    "min_p_mass": _min_p_case,
    "sigmoid_attention": _sigmoid_attention_case,
    "group_quant_scale": _group_quant_case,
    "global_avg_pool": _global_pool_case,
    "logsumexp_pool": _logsumexp_pool_case,
    "relu2_causal_attention": _relu2_case,
    "retention": _retention_case,
    "latent_cross_attention": _latent_cross_case,
    "attention_pool": _attention_pool_case,
    "cosine_attention": _cosine_attention_case,
    "w8a16_linear": _w8a16_case,
    "gated_attention": _gated_attention_case,
    "soft_argmax": _soft_argmax_case,
    "expert_linear_sorted": _expert_linear_case,
    "expert_linear_unsorted": lambda generator: _expert_linear_case(generator,
                                                                    routing="unsorted"),
}

if __name__ == "__main__":
    main(PIPELINE, "pipeline-kernels", __doc__)
