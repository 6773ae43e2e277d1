"""Kernels written as users of other tools write them: attention in base two (Triton's tutorial:
scores scaled by log2 e, ``exp2``: the benchmark's kernel), the softmax's weights rounded to bf16 before ``@ v``
(torch's ``softmax(s).to(v.dtype)``), a maximum guarded for padded rows without keys
(``where(m > -inf, m, 0)``), a T5 relative-position bias clamped under the causal mask, a
temperature per sequence, differential attention (two softmaxes subtracted), cross-entropy with
PaLM's z-loss, SigLIP's pairwise sigmoid loss, Gemma's RMS norm (``1 + w``), a softmax over the
head axis, a spatial softmax over two axes, a log-sum-exp down the batch — against float64 torch
references (never the project's lowering), outputs poisoned: through Triton's interpreter as
``tf.compile`` makes them for sm_90a (this module's ``__main__``) and through the CPU target
(:mod:`tests.schedule_templates.test_user_written`).

    TRITON_INTERPRET=1 python -m tests.schedule_templates.user_written_forms_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels import softmax_attend
from benchmarks.unlisted_kernels import attention_base_two as base_two_attention
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted
from tests.schedule_templates.user_written_check import _randn

Q = T.Tensor["B", "H", "S", "D", "bf16"]


@tf.kernel
def rounded_weights_attention(q: Q, k: Q, v: Q, scale: T.f32):
    """The causal softmax's weights rounded to bf16, then their weighted sum of the values."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.where(j <= i, T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale, float("-inf"))
    p = T.exp(s - T.max(s, over=j))
    w = T.cast(p / T.sum(p, over=j), "bf16")
    return T.sum(w * v[b, h, j, e], over=j)


@tf.kernel
def padded_guarded_attention(q: Q, k: Q, v: Q, keep: T.Tensor["B", "S", "bool"], scale: T.f32):
    """Attention over the keys a padding mask keeps, the maximum guarded for a sequence with
    none (its rows 0)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.where(keep[b, j], T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale, float("-inf"))
    m = T.max(s, over=j)
    p = T.exp(s - T.where(m > float("-inf"), m, 0.0))
    l = T.sum(p, over=j)  # noqa: E741 - the name used in the attention literature
    return T.where(l > 0.0, T.sum(p * v[b, h, j, e], over=j) / l, 0.0)


@tf.kernel
def relative_bias_attention(q: Q, k: Q, v: Q, table: T.Tensor["H", "R", "f32"], scale: T.f32):
    """A learned bias per head and relative distance, clamped to the table's last bucket, read
    under the causal mask (the distance is negative only where the mask drops it)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    bucket = T.minimum(i - j, T.size("R") - 1)
    s = T.where(j <= i, T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
                + table[h, bucket], float("-inf"))
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def sequence_temperature_attention(q: Q, k: Q, v: Q, tau: T.Tensor["B", "f32"]):
    """Causal attention whose scores are divided by a temperature per sequence."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) / tau[b]
    return softmax_attend(T.where(j <= i, s, float("-inf")), v[b, h, j, e], j)


@tf.kernel
def differential_attention(q1: Q, k1: Q, q2: Q, k2: Q, v: Q, lam: T.f32, scale: T.f32):
    """The DIFF Transformer's attention: two causal softmaxes' outputs subtracted."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s1 = T.where(j <= i, T.sum(q1[b, h, i, d] * k1[b, h, j, d], over=d) * scale, float("-inf"))
    s2 = T.where(j <= i, T.sum(q2[b, h, i, d] * k2[b, h, j, d], over=d) * scale, float("-inf"))
    return softmax_attend(s1, v[b, h, j, e], j) - lam * softmax_attend(s2, v[b, h, j, e], j)


@tf.kernel
def z_loss_cross_entropy(x: T.Tensor["M", "V", "bf16"], t: T.Tensor["M", "i32"]):
    """Cross-entropy plus PaLM's z-loss, 1e-4 · lse², per row."""
    i, v = T.axes("i v")
    m = T.max(x[i, v], over=v)
    lse = T.log(T.sum(T.exp(x[i, v] - m), over=v)) + m
    picked = T.sum(T.where(v == t[i], x[i, v], 0.0), over=v)
    return lse - picked + 1e-4 * lse * lse


@tf.kernel
def siglip_loss(x: T.Tensor["N", "D", "bf16"], y: T.Tensor["N", "D", "bf16"], t: T.f32,
                bias: T.f32):
    """SigLIP's loss per image: −Σ_j log σ(±(x_i·y_j · t + bias)), + on the diagonal."""
    i, j, d = T.axes("i j d")
    z = T.sum(x[i, d] * y[j, d], over=d) * t + bias
    return -T.sum(T.log(T.sigmoid(T.where(i == j, 1.0, -1.0) * z)), over=j)


@tf.kernel
def gemma_rmsnorm(x: T.Tensor["M", "D", "bf16"], w: T.Tensor["D", "bf16"]):
    """Gemma's RMS norm: the weight applied as 1 + w, stored as bf16."""
    i, d = T.axes("i d")
    r = T.rsqrt(T.sum(x[i, d] * x[i, d], over=d) / T.size("D") + 1e-6)
    return T.cast(x[i, d] * r * (1.0 + w[d]), "bf16")


@tf.kernel
def softmax_over_heads(s: T.Tensor["B", "H", "S", "f32"]):
    """A softmax across the heads (the middle axis) at every position."""
    b, h, i = T.axes("b h i")
    m = T.max(s[b, h, i], over=h)
    return T.exp(s[b, h, i] - m) / T.sum(T.exp(s[b, h, i] - m), over=h)


@tf.kernel
def spatial_softmax(x: T.Tensor["B", "C", "H", "W", "f32"]):
    """A softmax over each channel's feature map (two axes at once), as keypoint heads use."""
    b, c, h, w = T.axes("b c h w")
    m = T.max(x[b, c, h, w], over=(h, w))
    e = T.exp(x[b, c, h, w] - m)
    return e / T.sum(e, over=(h, w))


@tf.kernel
def logsumexp_down_batch(x: T.Tensor["B", "N", "f32"]):
    """A log-sum-exp over the outermost axis."""
    b, n = T.axes("b n")
    m = T.max(x[b, n], over=b)
    return T.log(T.sum(T.exp(x[b, n] - m), over=b)) + m


def _attention_inputs(g, S=45, D=16, count=3):
    return [_randn(g, 2, 3, S, D) for _ in range(count)]


def _attend(s, v) -> torch.Tensor:
    """float64 softmax attention; rows without a key give 0."""
    return torch.softmax(s, -1).nan_to_num(0.0) @ v.double()


def _causal(s):
    S = s.shape[-1]
    return s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))


def _scores(q, k):
    return q.double() @ k.double().transpose(-1, -2)


def _causal_case(g):
    """Causal attention's inputs and output (the base-two and rounded forms compute it)."""
    q, k, v = _attention_inputs(g)
    return dict(q=q, k=k, v=v, scale=0.2), _attend(_causal(_scores(q, k) * 0.2), v)


def _padded_case(g):
    q, k, v = _attention_inputs(g)
    keep = torch.rand(2, 45, generator=g) > 0.4
    keep[1] = False   # a sequence with no key: its rows 0
    s = (_scores(q, k) * 0.2).masked_fill(~keep[:, None, None, :], float("-inf"))
    return dict(q=q, k=k, v=v, keep=keep, scale=0.2), _attend(s, v)


def _relative_case(g, R=8):
    q, k, v = _attention_inputs(g)
    table = torch.randn(3, R, generator=g)
    i, j = torch.arange(45)[:, None], torch.arange(45)
    bias = table.double()[:, (i - j).clamp(0, R - 1)]
    return dict(q=q, k=k, v=v, table=table, scale=0.2), \
        _attend(_causal(_scores(q, k) * 0.2 + bias), v)


def _temperature_case(g):
    q, k, v = _attention_inputs(g)
    tau = torch.rand(2, generator=g) * 4 + 1
    s = _scores(q, k) / tau.double()[:, None, None, None]
    return dict(q=q, k=k, v=v, tau=tau), _attend(_causal(s), v)


def _differential_case(g):
    q1, k1, q2, k2, v = _attention_inputs(g, count=5)
    want = _attend(_causal(_scores(q1, k1) * 0.2), v) - \
        0.3 * _attend(_causal(_scores(q2, k2) * 0.2), v)
    return dict(q1=q1, k1=k1, q2=q2, k2=k2, v=v, lam=0.3, scale=0.2), want


def _z_loss_case(g, M=37, V=1000):
    x, t = _randn(g, M, V, scale=5.0), torch.randint(0, V, (M,), generator=g).to(torch.int32)
    lse = torch.logsumexp(x.double(), -1)
    return dict(x=x, t=t), lse - x.double()[torch.arange(M), t.long()] + 1e-4 * lse * lse


def _siglip_case(g, N=40, D=24):
    x, y = _randn(g, N, D, scale=1.0), _randn(g, N, D, scale=1.0)
    z = x.double() @ y.double().T * 2.0 - 1.0
    labels = 2 * torch.eye(N, dtype=torch.float64) - 1
    return dict(x=x, y=y, t=2.0, bias=-1.0), \
        -torch.nn.functional.logsigmoid(labels * z).sum(-1)


def _gemma_case(g, M=40, D=300):
    x, w = _randn(g, M, D, scale=2.0), _randn(g, D, scale=1.0)
    xd = x.double()
    return dict(x=x, w=w), \
        xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w.double())


def _heads_case(g):
    s = _randn(g, 2, 5, 33, scale=4.0, dtype=torch.float32)
    return dict(s=s), torch.softmax(s.double(), 1)


def _spatial_case(g):
    x = _randn(g, 2, 3, 7, 9, scale=3.0, dtype=torch.float32)
    return dict(x=x), torch.softmax(x.double().reshape(2, 3, -1), -1).reshape(2, 3, 7, 9)


def _down_batch_case(g):
    x = _randn(g, 70, 33, scale=5.0, dtype=torch.float32)
    return dict(x=x), torch.logsumexp(x.double(), 0)


CASES = {"base_two_attention": (base_two_attention, _causal_case),
         "rounded_weights_attention": (rounded_weights_attention, _causal_case),
         "padded_guarded_attention": (padded_guarded_attention, _padded_case),
         "relative_bias_attention": (relative_bias_attention, _relative_case),
         "sequence_temperature_attention": (sequence_temperature_attention, _temperature_case),
         "differential_attention": (differential_attention, _differential_case),
         "z_loss_cross_entropy": (z_loss_cross_entropy, _z_loss_case),
         "siglip_loss": (siglip_loss, _siglip_case),
         "gemma_rmsnorm": (gemma_rmsnorm, _gemma_case),
         "softmax_over_heads": (softmax_over_heads, _heads_case),
         "spatial_softmax": (spatial_softmax, _spatial_case),
         "logsumexp_down_batch": (logsumexp_down_batch, _down_batch_case)}


if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
