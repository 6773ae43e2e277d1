"""Kernels of model variants no issue lists, written as a new user would write them — decode over
an int8 KV cache with a scale per key (quantised caches, serving), differential attention (two
causal softmaxes over one value cache, their difference: the DIFF Transformer's), retention's
causal decay (no softmax: RetNet's parallel form), cross-entropy with label smoothing and with
ignored targets (padding), and a Dice loss per row — through ``tf.compile`` defaults against the
best torch alternative in the same process, each checked against a float64 reference first (the
harness of :mod:`benchmarks.kernel_suite`).

    python -m benchmarks.variant_kernels [--only NAME,…] [--tune TRIALS]

Rows: ``benchmark`` = ``user/<name>``; CSV
``benchmarks/results/<date>-<device>-variant-kernels.csv``.
"""

import torch
import torch.nn.functional as F

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.attention import reference
from benchmarks.common import SDPA, TENSORFUSE, TORCH_COMPILE, TORCH_EAGER
from benchmarks.kernel_suite import Case, Recorded, main, rows_case
from benchmarks.serving_kernels import causal


@tf.kernel
def int8_kv_decode(q: T.Tensor["B", "H", "D", "bf16"], k: T.Tensor["B", "HKV", "N", "D", "i8"],
                   ks: T.Tensor["B", "HKV", "N", "f32"], v: T.Tensor["B", "HKV", "N", "D", "i8"],
                   vs: T.Tensor["B", "HKV", "N", "f32"], scale: T.f32):
    """GQA decode over an int8 cache, each key's and value's row with its own scale."""
    b, h, j, d, e = T.axes("b h j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = T.sum(q[b, h, d] * k[b, hk, j, d], over=d) * ks[b, hk, j] * scale
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.cast(T.sum(p * vs[b, hk, j] * v[b, hk, j, e], over=j) / T.sum(p, over=j), "bf16")


@tf.kernel
def diff_attention(q1: T.Tensor["B", "H", "S", "D", "bf16"], k1: T.Tensor["B", "H", "S", "D", "bf16"],
                   q2: T.Tensor["B", "H", "S", "D", "bf16"], k2: T.Tensor["B", "H", "S", "D", "bf16"],
                   v: T.Tensor["B", "H", "S", "E", "bf16"], lam: T.f32, scale: T.f32):
    """Differential attention: two causal softmaxes over one value cache, the second weighted by
    λ and subtracted."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s1 = T.where(j <= i, T.sum(q1[b, h, i, d] * k1[b, h, j, d], over=d) * scale, float("-inf"))
    s2 = T.where(j <= i, T.sum(q2[b, h, i, d] * k2[b, h, j, d], over=d) * scale, float("-inf"))
    p1 = T.exp(s1 - T.max(s1, over=j))
    p2 = T.exp(s2 - T.max(s2, over=j))
    o1 = T.sum(p1 * v[b, h, j, e], over=j) / T.sum(p1, over=j)
    o2 = T.sum(p2 * v[b, h, j, e], over=j) / T.sum(p2, over=j)
    return T.cast(o1 - lam * o2, "bf16")


@tf.kernel
def retention_causal(q: T.Tensor["B", "H", "S", "D", "bf16"], k: T.Tensor["B", "H", "S", "D", "bf16"],
                     v: T.Tensor["B", "H", "S", "D", "bf16"], gamma: T.Tensor["H", "f32"]):
    """Retention's parallel form: scores decayed by γ per head over the distance, causal, no
    softmax."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d)
    decay = T.where(j <= i, T.exp((i - j) * T.log(gamma[h])), 0.0)
    return T.cast(T.sum(s * decay * v[b, h, j, e], over=j), "bf16")


@tf.kernel
def label_smoothed_ce(x: T.Tensor["M", "V", "bf16"], t: T.Tensor["M", "i32"], eps: T.f32):
    """Cross-entropy per row with label smoothing ε (PyTorch's): (1 − ε)·NLL + ε·mean NLL."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    lse = T.log(T.sum(T.exp(x[i, j] - m), over=j)) + m
    mean = T.sum(x[i, j], over=j) / T.size("V")
    return (1.0 - eps) * (lse - x[i, t[i]]) + eps * (lse - mean)


@tf.kernel
def ce_ignore_index(x: T.Tensor["M", "V", "bf16"], t: T.Tensor["M", "i32"]):
    """Cross-entropy per row, 0 where the target is negative (padding's ignore index)."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    lse = T.log(T.sum(T.exp(x[i, j] - m), over=j)) + m
    return T.where(t[i] >= 0, lse - x[i, T.max(t[i], 0)], 0.0)


@tf.kernel
def dice_rows(p: T.Tensor["M", "N", "bf16"], t: T.Tensor["M", "N", "bf16"]):
    """A Dice loss per row (segmentation masks flattened): 1 − 2·Σ p·t / (Σ p + Σ t)."""
    i, j = T.axes("i j")
    inter = T.sum(p[i, j] * t[i, j], over=j)
    total = T.sum(p[i, j] + t[i, j], over=j)
    return 1.0 - 2.0 * inter / (total + 1e-6)


# ---- float64 references and torch alternatives (shared with the tests) ----

def int8_kv_inputs(generator, B, H, HKV, N, D, device="cpu"):
    q = torch.randn(B, H, D, generator=generator).to(device, torch.bfloat16)
    k, v = (torch.randint(-127, 128, (B, HKV, N, D), generator=generator,
                          dtype=torch.int8).to(device) for _ in range(2))
    ks, vs = ((torch.rand(B, HKV, N, generator=generator) / 64 + 1e-3).to(device)
              for _ in range(2))
    return q, k, ks, v, vs


def int8_kv_dequantised(q, k, ks, v, vs, scale, dtype=torch.float64):
    """Decode over the cache dequantised in ``dtype`` (the reference in float64; the torch
    alternative in bf16 through SDPA)."""
    group = q.shape[1] // k.shape[1]
    kd = (k.to(dtype) * ks[..., None].to(dtype)).repeat_interleave(group, 1)
    vd = (v.to(dtype) * vs[..., None].to(dtype)).repeat_interleave(group, 1)
    if dtype == torch.float64:
        s = torch.einsum("bhd,bhnd->bhn", q.double(), kd) * scale
        return torch.einsum("bhn,bhnd->bhd", torch.softmax(s, -1), vd)
    return F.scaled_dot_product_attention(q[:, :, None], kd, vd, scale=scale)[:, :, 0]


def diff_reference(q1, k1, q2, k2, v, lam, scale, rows):
    """Differential attention in float64 at query ``rows``."""
    return reference(q1, k1, v, scale, None, causal, rows) - \
        lam * reference(q2, k2, v, scale, None, causal, rows)


def retention_reference(q, k, v, gamma, rows):
    """Retention's parallel form in float64 at query ``rows``."""
    S = k.shape[2]
    dist = (rows.to(q.device)[:, None] - torch.arange(S, device=q.device)[None]).double()
    decay = torch.where(dist >= 0, gamma.double()[:, None, None] ** dist.clamp(min=0), 0.0)
    s = q[:, :, rows].double() @ k.double().transpose(-1, -2)
    return (s * decay) @ v.double()


def smoothed_ce(x, t, eps):
    x32 = x.float() if x.dtype != torch.float64 else x
    return F.cross_entropy(x32, t.long(), label_smoothing=eps, reduction="none")


def ignoring_ce(x, t):
    x32 = x.float() if x.dtype != torch.float64 else x
    return F.cross_entropy(x32, t.long(), ignore_index=-100, reduction="none")


def dice(p, t):
    p32, t32 = (a.float() if a.dtype != torch.float64 else a for a in (p, t))
    return 1.0 - 2.0 * (p32 * t32).sum(-1) / ((p32 + t32).sum(-1) + 1e-6)


def targets(generator, M, V, ignored: bool = False):
    t = torch.randint(0, V, (M,), generator=generator, dtype=torch.int32)
    if ignored:   # a padded tail and holes
        t[M - M // 8:] = -100
        t[::13] = -100
    return t


# ---- the suite's cases ----

def _int8_kv_case(generator, B=8, H=32, HKV=8, N=16384, D=128) -> Case:
    q, k, ks, v, vs = int8_kv_inputs(generator, B, H, HKV, N, D, "cuda")
    scale = D ** -0.5

    def eager(q, k, ks, v, vs):   # dequantise to bf16, then SDPA
        return int8_kv_dequantised(q, k, ks, v, vs, scale, torch.bfloat16)
    f, compiled = Recorded(int8_kv_decode), torch.compile(eager)
    ref = int8_kv_dequantised(q, k, ks, v, vs, scale)
    return Case("int8_kv_decode", f"B{B} H{H}/{HKV} N{N} D{D} int8 cache",
                lambda: f(q, k, ks, v, vs, scale),
                {TORCH_COMPILE: lambda: compiled(q, k, ks, v, vs),
                 TORCH_EAGER: lambda: eager(q, k, ks, v, vs)},
                ref, lambda out: out, bytes=2 * k.numel() + 8 * ks.numel() + 4 * q.numel(),
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, HKV=HKV, N=N, D=D)})


def _diff_attention_case(generator, B=2, H=16, S=4096, D=64, E=128) -> Case:
    q1, k1, q2, k2 = (torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
                      for _ in range(4))
    v = torch.randn(B, H, S, E, generator=generator).to("cuda", torch.bfloat16)
    lam, scale = 0.6, D ** -0.5

    def sdpa():   # as a user writes it in torch: two SDPA calls (cuDNN or flash), the difference
        return F.scaled_dot_product_attention(q1, k1, v, is_causal=True, scale=scale) - lam * \
            F.scaled_dot_product_attention(q2, k2, v, is_causal=True, scale=scale)
    f, compiled = Recorded(diff_attention), torch.compile(sdpa)
    rows = torch.arange(0, S, 37)
    return Case("diff_attention", f"B{B} H{H} S{S} D{D} E{E} causal",
                lambda: f(q1, k1, q2, k2, v, lam, scale),
                {SDPA: sdpa, TORCH_COMPILE: compiled},
                diff_reference(q1, k1, q2, k2, v, lam, scale, rows), lambda out: out[:, :, rows],
                flops=B * H * S * S * (D + E) * 2,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D, E=E)})


def _retention_case(generator, B=2, H=16, S=4096, D=128) -> Case:
    q, k, v = ((torch.randn(B, H, S, D, generator=generator) / 4).to("cuda", torch.bfloat16)
               for _ in range(3))
    gamma = (1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float32))).to("cuda")   # RetNet's
    dist = torch.arange(S, device="cuda")[:, None] - torch.arange(S, device="cuda")[None]
    decay = torch.where(dist >= 0, gamma[:, None, None] ** dist.clamp(min=0).float(), 0.0)

    def eager(q, k, v):   # the decay matrix per head, materialised once (as RetNet's code does)
        return ((q @ k.transpose(-1, -2)).float() * decay).to(v.dtype) @ v
    f, compiled = Recorded(retention_causal), torch.compile(eager)
    rows = torch.arange(0, S, 37)
    return Case("retention_causal", f"B{B} H{H} S{S} D{D} causal decay",
                lambda: f(q, k, v, gamma),
                {TORCH_COMPILE: lambda: compiled(q, k, v), TORCH_EAGER: lambda: eager(q, k, v)},
                retention_reference(q, k, v, gamma, rows), lambda out: out[:, :, rows],
                flops=2 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D)})


def _smoothed_ce_case(generator, M=8192, V=32768) -> Case:
    x = (torch.randn(M, V, generator=generator) * 3).to("cuda", torch.bfloat16)
    return rows_case("label_smoothed_ce", label_smoothed_ce, smoothed_ce, x,
                     {"t": targets(generator, M, V).cuda(), "eps": 0.1}, f"M{M} V{V}")


def _ignore_index_case(generator, M=8192, V=32768) -> Case:
    x = (torch.randn(M, V, generator=generator) * 3).to("cuda", torch.bfloat16)
    return rows_case("ce_ignore_index", ce_ignore_index, ignoring_ce, x,
                     {"t": targets(generator, M, V, ignored=True).cuda()},
                     f"M{M} V{V} (1/8 ignored)")


def _dice_case(generator, M=4096, N=65536) -> Case:
    p = torch.rand(M, N, generator=generator).to("cuda", torch.bfloat16)
    t = (torch.rand(M, N, generator=generator) > 0.7).to("cuda", torch.bfloat16)
    return rows_case("dice_rows", dice_rows, dice, p, {"t": t}, f"M{M} N{N}")


VARIANTS = {
    "int8_kv_decode": _int8_kv_case,
    "diff_attention": _diff_attention_case,
    "retention_causal": _retention_case,
    "label_smoothed_ce": _smoothed_ce_case,
    "ce_ignore_index": _ignore_index_case,
    "dice_rows": _dice_case,
}

if __name__ == "__main__":
    main(VARIANTS, "variant-kernels", __doc__)
