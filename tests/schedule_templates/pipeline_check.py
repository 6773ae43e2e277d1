"""Kernels of training and serving pipelines no issue lists (``benchmarks.pipeline_kernels``) as
``tf.compile`` makes them for sm_90a, run by Triton's interpreter against float64 references in
torch (never the project's lowering), at ragged sizes and large value ranges: a KL divergence and
an entropy of soft-maxed rows (chains of dependent reductions in one sweep), sigmoid attention (a
weighted sum with no normaliser), groups of features scaled by their absolute maximum, a global
average pool over two axes, a log-sum-exp down the strided axis, causal squared-ReLU attention (a
masked weighted sum), RetNet's retention (the mask around the whole product, a decay a head),
latent queries shared by the batch and attention pooling by a query vector (the floor's stages),
cosine-similarity attention (norms stored, then attention), a mixture of experts' layer (weights
gathered by each token's expert, tokens sorted by expert or not, and over a batch of sequences), a
soft-argmax (nested sums over an image's pixels, merged), a mean absolute deviation and min-p's
kept mass (reductions reading another's final value: held to rows of one block). Outputs are poisoned (NaN) before each
run. Prints each case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.pipeline_check SEED
"""
import functools

import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.pipeline_kernels import (attention_pool, cosine_attention, expert_linear,
                                         global_avg_pool, soft_argmax,
                                         group_quant_scale,
                                         kl_divergence_rows, latent_cross_attention,
                                         logsumexp_pool, mean_absolute_deviation,
                                         min_p_mass, relu2_causal_attention,
                                         retention, sigmoid_attention, softmax_entropy)
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


def _log_softmax(x):
    return torch.log_softmax(x.double(), -1)


def kl_case(generator, M=37, V=1000):
    """Rows of 1000; logits spread ±40 and shifted by 500 (the running maxima
    move, the references the fusion corrects from)."""
    a = (torch.randn(M, V, generator=generator) * 10 + 500).bfloat16()
    b = (torch.randn(M, V, generator=generator) * 10 - 300).bfloat16()
    la, lb = _log_softmax(a), _log_softmax(b)
    return dict(a=a, b=b), (la.exp() * (la - lb)).sum(-1)


def entropy_case(generator, M=37, V=1000):
    x = (torch.randn(M, V, generator=generator) * 3 + 200).bfloat16()
    log_p = _log_softmax(x)
    return dict(x=x), -(log_p.exp() * log_p).sum(-1)


def sigmoid_attention_case(generator, B=2, H=3, S=77, D=32):
    q, k, v = ((torch.randn(B, H, S, D, generator=generator) * 2).bfloat16() for _ in range(3))
    scale, bias = D ** -0.5, -4.3
    s = q.double() @ k.double().transpose(-1, -2) * scale + bias
    return dict(q=q, k=k, v=v, scale=scale, bias=bias), torch.sigmoid(s) @ v.double()


def group_quant_case(generator, M=37, G=5, K=128):
    x = (torch.randn(M, G, K, generator=generator) * 100).bfloat16()
    xd = x.double()
    return dict(x=x), xd * (448.0 / xd.abs().amax(-1, keepdim=True).clamp_min(1e-4))


def global_pool_case(generator, B=3, C=37, H=7, W=9):
    x = (torch.randn(B, C, H, W, generator=generator) * 4 + 3).bfloat16()
    return dict(x=x), x.double().mean((2, 3))


def logsumexp_pool_case(generator, B=3, S=77, D=300):
    x = (torch.randn(B, S, D, generator=generator) * 8 + 100).bfloat16()
    return dict(x=x), x.double().logsumexp(1)


def relu2_case(generator, B=2, H=3, S=77, D=32):
    q, k, v = ((torch.randn(B, H, S, D, generator=generator) * 2).bfloat16() for _ in range(3))
    r = torch.relu(q.double() @ k.double().transpose(-1, -2) * 0.125)
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    return dict(q=q, k=k, v=v, scale=0.125), torch.where(causal, r * r, 0.0) @ v.double()


def latent_cross_case(generator, L=37, B=3, S=77, D=32):
    q = (torch.randn(L, D, generator=generator) * 3).bfloat16()
    k, v = ((torch.randn(B, S, D, generator=generator) * 3).bfloat16() for _ in range(2))
    s = q.double() @ k.double().transpose(-1, -2) * 0.25
    return dict(q=q, k=k, v=v, scale=0.25), torch.softmax(s, -1) @ v.double()


def retention_case(generator, B=2, H=3, S=77, D=32):
    """Decays from 0.5 to 0.999 (scores decayed to 1e-23 across the rows), ragged S."""
    q, k, v = ((torch.randn(B, H, S, D, generator=generator) * 2).bfloat16() for _ in range(3))
    gamma = torch.tensor([0.5, 0.97, 0.999])[:H]
    gaps = (torch.arange(S)[:, None] - torch.arange(S)[None, :]).double()
    decay = torch.where(gaps >= 0, gamma.double()[:, None, None] ** gaps, 0.0)
    return dict(q=q, k=k, v=v, gamma=gamma), \
        (q.double() @ k.double().transpose(-1, -2) * decay) @ v.double()


def expert_linear_case(generator, T=77, K=40, N=45, E=5, routing="unsorted"):
    """Ragged sizes; experts drawn at random (one never drawn), "sorted" as a dispatch leaves
    them or "unsorted"; features ±300."""
    x = (torch.randn(T, K, generator=generator) * 300).bfloat16()
    w = torch.randn(E, N, K, generator=generator).bfloat16()
    expert = torch.randint(0, E - 1, (T,), generator=generator).to(torch.int32)
    if routing == "sorted":
        expert = expert.sort().values
    return dict(x=x, w=w, expert=expert), \
        torch.einsum("tk,tnk->tn", x.double(), w.double()[expert.long()])


@tf.kernel
def batched_experts(x: T.Tensor["B", "T", "K", "bf16"], w: T.Tensor["E", "N", "K", "bf16"],
                    expert: T.Tensor["B", "T", "i32"]):
    """The experts' layer over a batch of sequences: the gather reads the batch axis too."""
    b, t, n, k = T.axes("b t n k")
    return T.sum(x[b, t, k] * w[expert[b, t], n, k], over=k)


def batched_experts_case(generator, B=2, T_=37, K=40, N=45, E=5):
    x = (torch.randn(B, T_, K, generator=generator) * 4).bfloat16()
    w = torch.randn(E, N, K, generator=generator).bfloat16()
    expert = torch.randint(0, E, (B, T_), generator=generator).to(torch.int32)
    return dict(x=x, w=w, expert=expert), \
        torch.einsum("btk,btnk->btn", x.double(), w.double()[expert.long()])


def soft_argmax_case(generator, B=2, C=3, H=13, W=37):
    """Heatmaps spread ±40 and shifted by 500 (the maximum matters), ragged sizes."""
    x = torch.randn(B, C, H, W, generator=generator) * 40 + 500
    p = torch.softmax(x.double().flatten(2), -1).view(B, C, H, W)
    rows, cols = (torch.arange(n, dtype=torch.float64) for n in (H, W))
    return dict(x=x), ((p.sum(3) * rows).sum(2), (p.sum(2) * cols).sum(2))


def attention_pool_case(generator, B=3, S=77, D=300):
    x = (torch.randn(B, S, D, generator=generator) * 2).bfloat16()
    w = (torch.randn(D, generator=generator) / 4).bfloat16()
    p = torch.softmax(x.double() @ w.double(), -1)
    return dict(x=x, w=w), (p[..., None] * x.double()).sum(1)


def cosine_attention_case(generator, B=2, H=3, S=77, D=32):
    """Rows of q and k of norms from 0.05 to 500 (the scores divide by them)."""
    q, k, v = ((torch.randn(B, H, S, D, generator=generator) *
                torch.logspace(-2, 2, S)[:, None]).bfloat16() for _ in range(3))
    qd, kd = (t.double() / t.double().norm(dim=-1, keepdim=True) for t in (q, k))
    return dict(q=q, k=k, v=v, tau=12.5), \
        torch.softmax(qd @ kd.transpose(-1, -2) * 12.5, -1) @ v.double()


def mad_case(generator, M=37, N=1000):
    """Rows around 500 (the deviations small beside the values)."""
    x = (torch.randn(M, N, generator=generator) * 3 + 500).bfloat16()
    xd = x.double()
    return dict(x=x), (xd - xd.mean(-1, keepdim=True)).abs().mean(-1)


def min_p_case(generator, M=37, V=3000):
    """Logits spread ±40: a few tokens above the threshold in each row."""
    x = (torch.randn(M, V, generator=generator) * 10).bfloat16()
    p = torch.softmax(x.double(), -1)
    return dict(x=x, min_p=0.05), torch.where(p >= 0.05 * p.amax(-1, keepdim=True), p, 0).sum(-1)


CASES = {"kl_divergence_rows": (kl_divergence_rows, kl_case),
         "softmax_entropy": (softmax_entropy, entropy_case),
         "sigmoid_attention": (sigmoid_attention, sigmoid_attention_case),
         "group_quant_scale": (group_quant_scale, group_quant_case),
         "global_avg_pool": (global_avg_pool, global_pool_case),
         "logsumexp_pool": (logsumexp_pool, logsumexp_pool_case),
         "relu2_causal_attention": (relu2_causal_attention, relu2_case),
         "retention": (retention, retention_case),
         "soft_argmax": (soft_argmax, soft_argmax_case),
         "batched_experts": (batched_experts, batched_experts_case),
         "expert_linear_unsorted": (expert_linear, expert_linear_case),
         "expert_linear_sorted": (expert_linear, functools.partial(expert_linear_case,
                                                                   routing="sorted")),
         "latent_cross_attention": (latent_cross_attention, latent_cross_case),
         "attention_pool": (attention_pool, attention_pool_case),
         "cosine_attention": (cosine_attention, cosine_attention_case),
         "mean_absolute_deviation": (mean_absolute_deviation, mad_case),
         "min_p_mass": (min_p_mass, min_p_case)}

if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
