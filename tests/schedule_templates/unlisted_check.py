"""Kernels no issue lists (``benchmarks.unlisted_kernels``) as ``tf.compile`` makes them for
sm_90a, run by Triton's interpreter against float64 references in torch (never the project's
lowering), at ragged sizes and large value ranges: attention with a bias [H, S, S] on
[B, S, H, D] (the attention template: the Hopper kernel refuses it), a router's softmax over 8
experts (many narrow rows a program), the columns of a matrix L2-normalised and NCHW batch-norm
statistics, a masked mean over tokens (its count recomputed along the features: rows, not a
carried feature axis), Mamba's causal depthwise convolution (written out, its taps before the
start masked), a mixture of experts' combine (written out over 8 experts), cosine similarities
(stages: a GEMM and the norms), a layer norm and a mean over two axes written with ``T.mean``,
attention with its log-sum-exp as a second output (float32 and bf16), a linear layer of int8
weights, the means of byte images, byte dot products (past int8 in i32) and where each column's
largest byte is. Outputs are poisoned
(NaN) before each run. Prints each case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.unlisted_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.unlisted_kernels import (batch_norm_stats_nchw, biased_attention_bshd,
                                         causal_conv1d, cosine_similarity, l2_normalize_columns,
                                         masked_mean_pool, moe_combine, router_softmax)
from benchmarks.pipeline_kernels import w8a16_linear
from tests.dsl.test_byte_tensors import byte_column_argmax, byte_dots, pixel_means
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


def biased_attention_case(generator, B=2, S=37, H=3, D=16, width=3.0):
    q, k, v = ((torch.randn(B, S, H, D, generator=generator) * width).bfloat16()
               for _ in range(3))
    bias = (torch.randn(H, S, S, generator=generator) * width).bfloat16()
    # rows masked whole at bf16's lowest value, as transformers writes masks: the math weighs
    # their keys equally (a fused exponent of a·log2e − b·log2e overflowed there to NaN)
    bias[:, :5] = torch.finfo(torch.bfloat16).min
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
    s = qd @ kd.transpose(-1, -2) * 0.25 + bias.double()
    want = (torch.softmax(s, -1) @ vd).transpose(1, 2)
    return dict(q=q, k=k, v=v, bias=bias, scale=0.25), want


def router_case(generator, M=333, E=8):
    x = torch.randn(M, E, generator=generator) * 20
    return dict(logits=x), torch.softmax(x.double(), -1)


def columns_case(generator, N=300, D=45):
    x = (torch.randn(N, D, generator=generator) * 4).bfloat16()
    xd = x.double()
    return dict(x=x), xd * torch.rsqrt((xd * xd).sum(0, keepdim=True) + 1e-12)


def batch_norm_case(generator, B=3, C=5, H=7, W=9):
    x = (torch.randn(B, C, H, W, generator=generator) * 3 + 2).bfloat16()
    var, mean = torch.var_mean(x.double(), (0, 2, 3), correction=0)
    return dict(x=x), (mean, var)


def masked_mean_case(generator, B=3, S=37, D=300):
    """D=300: the rows (b, d) in ragged tiles; lengths 1 to S."""
    x = (torch.randn(B, S, D, generator=generator) * 4 + 2).bfloat16()
    lengths = torch.randint(1, S + 1, (B,), generator=generator)
    mask = (torch.arange(S)[None, :] < lengths[:, None]).bfloat16()
    xd, md = x.double(), mask.double()
    return dict(x=x, mask=mask), (xd * md[..., None]).sum(1) / md.sum(1, keepdim=True)


def causal_conv_case(generator, B=2, C=5, L=77, K=4):
    """Mamba's short convolution: the first K−1 positions read taps before the start (zeros; the
    loads masked, not read outside the tensor)."""
    x = (torch.randn(B, C, L, generator=generator) * 4).bfloat16()
    w = torch.randn(C, K, generator=generator).bfloat16()
    padded = torch.nn.functional.pad(x.double(), (K - 1, 0))
    want = torch.nn.functional.conv1d(padded, w.double().flip(-1)[:, None, :], groups=C)
    return dict(x=x, w=w), want


def moe_combine_case(generator, T=37, E=8, D=50):
    y = (torch.randn(T, E, D, generator=generator) * 4).bfloat16()
    gate = torch.softmax(torch.randn(T, E, generator=generator) * 3, -1)
    return dict(y=y, gate=gate), (y.double() * gate.double()[..., None]).sum(1)


def cosine_case(generator, M=37, N=29, D=48):
    x = (torch.randn(M, D, generator=generator) * 4 + 1).bfloat16()
    y = (torch.randn(N, D, generator=generator) * 4 - 1).bfloat16()
    xd, yd = x.double(), y.double()
    return dict(x=x, y=y), (xd / xd.norm(dim=-1, keepdim=True)) @ (yd / yd.norm(dim=-1,
                                                                              keepdim=True)).T


@tf.kernel
def layernorm_with_mean(x: T.Tensor["R", "D", "bf16"], w: T.Tensor["D", "bf16"]):
    """A layer norm as a user writes it with ``T.mean`` (over a named size)."""
    r, d = T.axes("r d")
    mu = T.mean(x[r, d], over=d)
    var = T.mean((x[r, d] - mu) * (x[r, d] - mu), over=d)
    return T.cast((x[r, d] - mu) * T.rsqrt(var + 1e-5) * w[d], "bf16")


def layernorm_case(generator, R=333, D=300):
    x = (torch.randn(R, D, generator=generator) * 4 + 3).bfloat16()
    w = torch.randn(D, generator=generator).bfloat16()
    want = torch.nn.functional.layer_norm(x.double(), (D,), eps=1e-5) * w.double()
    return dict(x=x, w=w), want


@tf.kernel
def mean_over_two_axes(x: T.Tensor["B", 16, "P", "bf16"]):
    """A mean over a literal-sized and a named axis: its count a product of two sizes."""
    b, g, p = T.axes("b g p")
    return T.mean(x[b, g, p], over=(g, p))


def two_axes_case(generator, B=5, P=45):
    x = (torch.randn(B, 16, P, generator=generator) * 4 + 3).bfloat16()
    return dict(x=x), x.double().mean((1, 2))


def attention_and_logsumexp(lse_dtype):
    """Attention written with its log-sum-exp as a second output, stored as ``lse_dtype``
    (``None``: as written, which stores it in the inputs' dtype)."""
    @tf.kernel
    def attention_and_lse(q: T.Tensor["B", "H", "M", "D", "bf16"],
                          k: T.Tensor["B", "H", "N", "D", "bf16"],
                          v: T.Tensor["B", "H", "N", "D", "bf16"], scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
        m = T.max(s, over=j)
        p = T.exp(s - m)
        l = T.sum(p, over=j)
        lse = m + T.log(l)
        return T.cast(T.sum(p * v[b, h, j, e], over=j) / l, "bf16"), \
            lse if lse_dtype is None else T.cast(lse, lse_dtype)
    return attention_and_lse



def attention_logsumexp_case(generator, B=2, H=3, M=37, N=77, D=64):
    q = (torch.randn(B, H, M, D, generator=generator) * 3).bfloat16()
    k, v = ((torch.randn(B, H, N, D, generator=generator) * 3).bfloat16() for _ in range(2))
    s = q.double() @ k.double().transpose(-1, -2) * 0.1
    return dict(q=q, k=k, v=v, scale=0.1), (torch.softmax(s, -1) @ v.double(),
                                            torch.logsumexp(s, -1))


def w8a16_case(generator, B=37, N=77, K=300):
    """The GEMM template at B=37 (a ragged tile), bytes over their whole range."""
    w = torch.randint(-128, 128, (N, K), generator=generator, dtype=torch.int8)
    s = torch.rand(N, generator=generator) / 64
    x = (torch.randn(B, K, generator=generator) * 4).bfloat16()
    return dict(w=w, s=s, x=x), (x.double() @ w.double().T) * s.double()


def pixel_means_case(generator, B=3, C=3, P=1000):
    img = torch.randint(0, 256, (B, C, P), generator=generator, dtype=torch.uint8)
    return dict(img=img), (img.double() / 255).mean(-1)


def byte_dots_case(generator, M=37, N=300):
    """Bytes over their whole range: products past int8's, sums past int16's."""
    x, y = (torch.randint(-128, 128, (M, N), generator=generator, dtype=torch.int8)
            for _ in range(2))
    return dict(x=x, y=y), (x.double() * y.double()).sum(-1)


def byte_argmax_case(generator, M=300, N=45):
    x = torch.randint(-128, 128, (M, N), generator=generator, dtype=torch.int8)
    return dict(x=x), x.argmax(0).double()


@tf.kernel
def cross_entropy_ignored(logits: T.Tensor["M", "V", "bf16"], target: T.Tensor["M", "i64"]):
    """The mean cross-entropy over the tokens whose target is not ignored (-100, as torch's
    ``ignore_index``): the count of kept tokens a sum of a mask the row template's block lists
    sort into partial and full blocks (in a full block the count is its columns)."""
    i, v = T.axes("i v")
    kept = target[i] >= 0
    lse = T.logsumexp(logits[i, v], over=v)
    loss = T.sum(T.where(kept, lse - logits[i, T.maximum(target[i], 0)], 0.0), over=i)
    return loss / T.maximum(T.sum(T.where(kept, 1.0, 0.0), over=i), 1.0)


def ignored_case(generator, M=333, V=300):
    logits = (torch.randn(M, V, generator=generator) * 4).bfloat16()
    target = torch.randint(0, V, (M,), generator=generator)
    target[40:200] = -100   # whole blocks ignored, whole blocks kept, and blocks mixed
    target[::7] = -100
    lse = torch.logsumexp(logits.double(), -1)
    kept = target >= 0
    loss = torch.where(kept, lse - logits.double()[torch.arange(M), target.clamp(min=0)], 0.0)
    return dict(logits=logits, target=target), loss.sum() / kept.sum()


CASES = {"biased_attention_bshd": (biased_attention_bshd, biased_attention_case),
         "router_softmax": (router_softmax, router_case),
         "l2_normalize_columns": (l2_normalize_columns, columns_case),
         "batch_norm_stats_nchw": (batch_norm_stats_nchw, batch_norm_case),
         "masked_mean_pool": (masked_mean_pool, masked_mean_case),
         "causal_conv1d": (causal_conv1d, causal_conv_case),
         "moe_combine": (moe_combine, moe_combine_case),
         "cosine_similarity": (cosine_similarity, cosine_case),
         "layernorm_with_mean": (layernorm_with_mean, layernorm_case),
         "mean_over_two_axes": (mean_over_two_axes, two_axes_case),
         "attention_and_f32_logsumexp": (attention_and_logsumexp("f32"), attention_logsumexp_case),
         "attention_and_bf16_logsumexp": (attention_and_logsumexp(None),
                                          attention_logsumexp_case),
         "w8a16_linear": (w8a16_linear, w8a16_case),
         "pixel_means": (pixel_means, pixel_means_case),
         "byte_dots": (byte_dots, byte_dots_case),
         "byte_column_argmax": (byte_column_argmax, byte_argmax_case),
         "cross_entropy_ignored": (cross_entropy_ignored, ignored_case)}

if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
