"""Kernels as users write them that no issue or benchmark lists — label-smoothed and focal
cross-entropy, a softmax's entropy, the KL divergence of two logit rows, fp8 block scales, an
NCHW instance norm, a mean of squared GEMM outputs, cosine attention (its norms as stages), a
log-sum-exp pool then a layer norm, a causally masked softmax over given scores, an RMS over two
axes, a nearest codebook distance, an embedding bag, a roll, a product, a log-sum-exp written
with ``T.logsumexp``, an argmin over channels, a gradient clipped per row, a masked variance
over tokens, a softmax over heads, a chain's two outputs, a gather at an argmax, a mean NLL over
all tokens, a causal sliding max, a depthwise 3 × 3 convolution, grouped-query attention with a
float32 bias on [B, S, H, D], an fp16 softmax over a temperature per batch element, a masked
variance over long left-padded rows — each against a float64 torch reference (never the
project's lowering), outputs poisoned, at ragged sizes and large value ranges: through Triton's
interpreter as ``tf.compile`` makes them for sm_90a (this module's ``__main__``) and through the
CPU target (:mod:`tests.schedule_templates.test_user_written`).

    TRITON_INTERPRET=1 python -m tests.schedule_templates.user_written_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


@tf.kernel
def smoothed_cross_entropy(x: T.Tensor["M", "V", "bf16"], t: T.Tensor["M", "i64"], eps: T.f32):
    """Cross-entropy with label smoothing: the target's loss and the mean over the vocabulary's."""
    i, v = T.axes("i v")
    m = T.max(x[i, v], over=v)
    lse = m + T.log(T.sum(T.exp(x[i, v] - m), over=v))
    mean = T.sum(x[i, v], over=v) / T.size("V")
    return (1.0 - eps) * (lse - x[i, t[i]]) + eps * (lse - mean)


@tf.kernel
def softmax_entropy(x: T.Tensor["M", "V", "f32"]):
    """The entropy of each row's softmax, from the softmax-weighted sum of the logits."""
    i, v = T.axes("i v")
    m = T.max(x[i, v], over=v)
    l = T.sum(T.exp(x[i, v] - m), over=v)
    px = T.sum(T.exp(x[i, v] - m) * x[i, v], over=v) / l
    return m + T.log(l) - px


@tf.kernel
def kl_logits(p: T.Tensor["M", "V", "bf16"], q: T.Tensor["M", "V", "bf16"]):
    """KL(softmax(p) ‖ softmax(q)) per row: two softmax chains and a weighted sum of both."""
    i, v = T.axes("i v")
    mp = T.max(p[i, v], over=v)
    lp = T.sum(T.exp(p[i, v] - mp), over=v)
    mq = T.max(q[i, v], over=v)
    lq = T.sum(T.exp(q[i, v] - mq), over=v)
    cross = T.sum(T.exp(p[i, v] - mp) * (p[i, v] - q[i, v]), over=v) / lp
    return cross - (mp + T.log(lp)) + (mq + T.log(lq))


@tf.kernel
def block_fp8_scale(x: T.Tensor["M", "G", "K", "bf16"]):
    """x divided by its fp8 scale per block of 128 (e4m3's largest, 448, over the block's)."""
    i, g, k = T.axes("i g k")
    amax = T.max(T.abs(x[i, g, k]), over=k)
    s = T.max(amax, 1e-4) / 448.0
    return T.cast(x[i, g, k] / s, "bf16")


@tf.kernel
def instance_norm_nchw(x: T.Tensor["B", "C", "H", "W", "bf16"], w: T.Tensor["C", "bf16"],
                       bias: T.Tensor["C", "bf16"]):
    """Instance norm of NCHW activations: over the pixels (two axes), per channel and image."""
    b, c, h, ww = T.axes("b c h w")
    n = T.size("H") * T.size("W")
    mean = T.sum(x[b, c, h, ww], over=(h, ww)) / n
    var = T.sum((x[b, c, h, ww] - mean) * (x[b, c, h, ww] - mean), over=(h, ww)) / n
    return (x[b, c, h, ww] - mean) * T.rsqrt(var + 1e-5) * w[c] + bias[c]


@tf.kernel
def logit_second_moment(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["N", "K", "bf16"]):
    """The mean of squared outputs of a linear layer per row: a sum over a GEMM's columns."""
    i, n, k = T.axes("i n k")
    y = T.sum(x[i, k] * w[n, k], over=k)
    return T.sum(y * y, over=n) / T.size("N")


@tf.kernel
def cosine_attention(q: T.Tensor["B", "H", "S", "D", "bf16"],
                     k: T.Tensor["B", "H", "S", "D", "bf16"],
                     v: T.Tensor["B", "H", "S", "D", "bf16"], tau: T.f32):
    """Attention over cosine similarities with a temperature (the norms inside the score)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    qn = T.rsqrt(T.sum(q[b, h, i, d] * q[b, h, i, d], over=d) + 1e-6)
    kn = T.rsqrt(T.sum(k[b, h, j, d] * k[b, h, j, d], over=d) + 1e-6)
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * qn * kn * tau
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)


@tf.kernel
def lse_pool_layernorm(x: T.Tensor["B", "S", "D", "bf16"]):
    """A log-sum-exp pool over tokens, then a layer norm over the pooled features."""
    b, s, d = T.axes("b s d")
    m = T.max(x[b, s, d], over=s)
    pooled = m + T.log(T.sum(T.exp(x[b, s, d] - m), over=s))
    mu = T.sum(pooled, over=d) / T.size("D")
    var = T.sum((pooled - mu) * (pooled - mu), over=d) / T.size("D")
    return (pooled - mu) * T.rsqrt(var + 1e-5)


@tf.kernel
def masked_scores_softmax(s: T.Tensor["B", "H", "S", "S", "f32"]):
    """A causally masked softmax over given scores (the mask written as ``j <= i``)."""
    b, h, i, j = T.axes("b h i j")
    x = T.where(j <= i, s[b, h, i, j], -1e30)
    m = T.max(x, over=j)
    e = T.exp(x - m)
    return e / T.sum(e, over=j)


@tf.kernel
def focal_loss(x: T.Tensor["M", "V", "f32"], t: T.Tensor["M", "i32"], gamma: T.f32):
    """The focal loss of each row's target: ``-(1 - p)^γ log p``, γ a scalar."""
    i, v = T.axes("i v")
    m = T.max(x[i, v], over=v)
    logp = x[i, t[i]] - m - T.log(T.sum(T.exp(x[i, v] - m), over=v))
    p = T.exp(logp)
    return -((1.0 - p) ** gamma) * logp


@tf.kernel
def rms_over_heads(x: T.Tensor["B", "S", "H", "D", "bf16"]):
    """RMS of each token over all heads and dims (two reduced axes, innermost pair)."""
    b, s, h, d = T.axes("b s h d")
    ms = T.sum(x[b, s, h, d] * x[b, s, h, d], over=(h, d)) / (T.size("H") * T.size("D"))
    return x[b, s, h, d] * T.rsqrt(ms + 1e-6)


@tf.kernel
def token_l2_distance_min(x: T.Tensor["B", "N", "D", "bf16"], c: T.Tensor["K", "D", "bf16"]):
    """Per token, the distance to its nearest codebook entry (VQ): a min over a GEMM-like sum."""
    b, n, k, d = T.axes("b n k d")
    dist = T.sum((x[b, n, d] - c[k, d]) * (x[b, n, d] - c[k, d]), over=d)
    return T.min(dist, over=k)


@tf.kernel
def embedding_bag_mean(table: T.Tensor["V", "D", "bf16"], idx: T.Tensor["B", "L", "i32"]):
    """An embedding bag: the mean of the rows an index tensor picks (a gather)."""
    b, l, d = T.axes("b l d")
    return T.sum(table[idx[b, l], d], over=l) / T.size("L")


@tf.kernel
def roll_diff(x: T.Tensor["B", "L", "f32"], shift: T.i32):
    """x minus x rolled along its axis by a scalar shift (a modular index)."""
    b, t = T.axes("b t")
    return x[b, t] - x[b, (t + shift) % T.size("L")]


@tf.kernel
def survival(h: T.Tensor["B", "T", "f32"]):
    """A survival probability: the product of ``1 − hazard`` over the time steps."""
    b, t = T.axes("b t")
    return T.prod(1.0 - h[b, t], over=t)


@tf.kernel
def lse_direct(x: T.Tensor["M", "V", "f32"]):
    """A log-sum-exp written with ``T.logsumexp``."""
    i, v = T.axes("i v")
    return T.logsumexp(x[i, v], over=v)


@tf.kernel
def argmin_channels(x: T.Tensor["B", "C", "P", "f32"]):
    """The channel of each pixel's smallest value: an argmin down a strided axis."""
    b, c, p = T.axes("b c p")
    return T.argmin(x[b, c, p], over=c)


@tf.kernel
def clipped_norm_scale(g: T.Tensor["M", "N", "f32"], max_norm: T.f32):
    """Each row of a gradient scaled down to an L2 norm of at most ``max_norm``."""
    i, j = T.axes("i j")
    n = T.sqrt(T.sum(g[i, j] * g[i, j], over=j))
    return g[i, j] * T.minimum(1.0, max_norm / (n + 1e-6))


@tf.kernel
def masked_var_tokens(x: T.Tensor["B", "S", "D", "f32"], mask: T.Tensor["B", "S", "f32"]):
    """The variance over the tokens a mask keeps, per feature (its count per sequence)."""
    b, s, d = T.axes("b s d")
    cnt = T.sum(mask[b, s], over=s)
    mean = T.sum(x[b, s, d] * mask[b, s], over=s) / cnt
    return T.sum(mask[b, s] * (x[b, s, d] - mean) * (x[b, s, d] - mean), over=s) / cnt


@tf.kernel
def softmax_middle_axis_weighted(x: T.Tensor["B", "H", "S", "f32"], w: T.Tensor["H", "f32"]):
    """A softmax over the heads (a middle axis) of scores scaled per head."""
    b, h, s = T.axes("b h s")
    y = x[b, h, s] * w[h]
    m = T.max(y, over=h)
    e = T.exp(y - m)
    return e / T.sum(e, over=h)


@tf.kernel
def softmax_and_max(x: T.Tensor["M", "N", "f32"]):
    """Two outputs of one chain: each row's maximum and its softmax."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    e = T.exp(x[i, j] - m)
    return m, e / T.sum(e, over=j)




@tf.kernel
def gather_at_argmax(s: T.Tensor["M", "N", "f32"], v: T.Tensor["M", "N", "f32"]):
    """The value at each row's argmax of another tensor (an index a reduction makes)."""
    i, j = T.axes("i j")
    a = T.argmax(s[i, j], over=j)
    return v[i, a]




@tf.kernel
def nll_mean(x: T.Tensor["M", "V", "bf16"], t: T.Tensor["M", "i64"]):
    """The mean negative log-likelihood over all tokens: a row chain, then a sum over rows."""
    i, v = T.axes("i v")
    m = T.max(x[i, v], over=v)
    lse = m + T.log(T.sum(T.exp(x[i, v] - m), over=v))
    return T.sum(lse - x[i, t[i]], over=i) / T.size("M")




@tf.kernel
def sliding_max(x: T.Tensor["B", "L", "f32"]):
    """A causal max over the last four steps (the taps before the start never win)."""
    b = T.axes("b")
    t = T.axis("t", "L")
    k = T.axis("k", 4)
    return T.max(T.where(t >= k, x[b, t - k], -1e30), over=k)




@tf.kernel
def temp_softmax(x: T.Tensor["B", "S", "N", "f16"], temp: T.Tensor["B", "f32"]):
    """A softmax of fp16 scores over a temperature per batch element (float32)."""
    b, s, n = T.axes("b s n")
    y = x[b, s, n] / temp[b]
    m = T.max(y, over=n)
    e = T.exp(y - m)
    return e / T.sum(e, over=n)




@tf.kernel
def depthwise3x3(x: T.Tensor["B", "C", "H", "W", "f32"], w: T.Tensor["C", 3, 3, "f32"]):
    """A depthwise 3 × 3 convolution of NCHW with zero padding, written out."""
    b, c = T.axes("b c")
    i, j = T.axis("i", "H"), T.axis("j", "W")
    p, q = T.axis("p", 3), T.axis("q", 3)
    inside = (i + p >= 1) & (i + p - 1 < T.size("H")) & (j + q >= 1) & (j + q - 1 < T.size("W"))
    return T.sum(T.where(inside, x[b, c, i + p - 1, j + q - 1], 0.0) * w[c, p, q], over=(p, q))




@tf.kernel
def gqa_bias_bshd(q: T.Tensor["B", "S", "H", "D", "bf16"],
                  k: T.Tensor["B", "S", "G", "D", "bf16"],
                  v: T.Tensor["B", "S", "G", "D", "bf16"], bias: T.Tensor["S", "S", "f32"],
                  scale: T.f32):
    """Causal grouped-query attention on [B, S, H, D] with a float32 bias per (i, j)."""
    b, i, h, j, d, e = T.axes("b i h j d e")
    g = h // (T.size("H") // T.size("G"))
    s = T.sum(q[b, i, h, d] * k[b, j, g, d], over=d) * scale + bias[i, j]
    s = T.where(j <= i, s, -T.inf)
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, j, g, e], over=j) / T.sum(p, over=j)


def masked_variance(mask_dtype: str):
    """The variance of each row's values a mask of ``mask_dtype`` keeps, its mean divided by
    the mask's count (an integer sum for an integer mask)."""
    @tf.kernel
    def masked_var_rows(x: T.Tensor["B", "S", "f32"], mask: T.Tensor["B", "S", mask_dtype]):
        b, s = T.axes("b s")
        cnt = T.sum(mask[b, s], over=s)
        mean = T.sum(x[b, s] * mask[b, s], over=s) / cnt
        return T.sum(mask[b, s] * (x[b, s] - mean) * (x[b, s] - mean), over=s) / cnt
    return masked_var_rows


masked_var_rows = masked_variance("f32")


# ---- cases: (arguments, float64 reference) on fresh inputs, ragged sizes ----

def _randn(g, *shape, scale=3.0, dtype=torch.bfloat16):
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _smoothed_case(g, M=37, V=300):
    x, t = _randn(g, M, V), torch.randint(0, V, (M,), generator=g)
    xd = x.double()
    lse = torch.logsumexp(xd, -1)
    want = 0.9 * (lse - xd.gather(1, t[:, None])[:, 0]) + 0.1 * (lse - xd.mean(-1))
    return dict(x=x, t=t, eps=0.1), want


def _entropy_case(g, M=37, V=300):
    x = _randn(g, M, V, dtype=torch.float32)
    xd = x.double()
    return dict(x=x), -(xd.softmax(-1) * xd.log_softmax(-1)).sum(-1)


def _kl_case(g, M=37, V=300):
    p, q = _randn(g, M, V), _randn(g, M, V)
    pd, qd = p.double(), q.double()
    return dict(p=p, q=q), (pd.softmax(-1) * (pd.log_softmax(-1) - qd.log_softmax(-1))).sum(-1)


def _fp8_case(g):
    x = _randn(g, 37, 5, 128, scale=100)
    xd = x.double()
    return dict(x=x), xd / (xd.abs().amax(-1, keepdim=True).clamp_min(1e-4) / 448)


def _instance_norm_case(g):
    x, w, b = _randn(g, 3, 5, 7, 9) + 2, _randn(g, 5, scale=1), _randn(g, 5, scale=1)
    xd = x.double()
    var, mean = torch.var_mean(xd, (2, 3), keepdim=True, correction=0)
    return dict(x=x, w=w, bias=b), \
        (xd - mean) / (var + 1e-5).sqrt() * w.double()[:, None, None] + b.double()[:, None, None]


def _second_moment_case(g):
    x, w = _randn(g, 37, 64, scale=1), _randn(g, 45, 64, scale=1)
    y = x.double() @ w.double().T
    return dict(x=x, w=w), (y * y).mean(-1)


def _cosine_attention_case(g):
    q, k, v = (_randn(g, 2, 3, 37, 16) for _ in range(3))
    qd, kd = (t.double() / (t.double().pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() for t in (q, k))
    return dict(q=q, k=k, v=v, tau=10.0), \
        ((qd @ kd.transpose(-1, -2)) * 10.0).softmax(-1) @ v.double()


def _lse_pool_case(g):
    x = _randn(g, 3, 17, 40)
    pooled = torch.logsumexp(x.double(), 1)
    return dict(x=x), torch.nn.functional.layer_norm(pooled, pooled.shape[-1:], eps=1e-5)


def _masked_scores_case(g, S=37):
    s = _randn(g, 2, 3, S, S, dtype=torch.float32)
    kept = torch.ones(S, S, dtype=torch.bool).tril()
    return dict(s=s), s.double().masked_fill(~kept, -1e30).softmax(-1)


def _focal_case(g, M=37, V=300):
    x = _randn(g, M, V, dtype=torch.float32)
    t = torch.randint(0, V, (M,), generator=g).int()
    logp = x.double().log_softmax(-1).gather(1, t.long()[:, None])[:, 0]
    return dict(x=x, t=t, gamma=2.0), -((1 - logp.exp()) ** 2.0) * logp


def _rms_case(g):
    x = _randn(g, 2, 9, 4, 16)
    xd = x.double()
    return dict(x=x), xd * torch.rsqrt(xd.pow(2).mean((2, 3), keepdim=True) + 1e-6)


def _codebook_case(g):
    x, c = _randn(g, 2, 37, 16, scale=1), _randn(g, 29, 16, scale=1)
    return dict(x=x, c=c), \
        ((x.double()[:, :, None, :] - c.double()[None, None]) ** 2).sum(-1).amin(-1)


def _embedding_bag_case(g):
    table, idx = _randn(g, 50, 24), torch.randint(0, 50, (3, 7), generator=g).int()
    return dict(table=table, idx=idx), table.double()[idx.long()].mean(1)


def _roll_case(g):
    x = _randn(g, 3, 37, dtype=torch.float32)
    return dict(x=x, shift=5), x.double() - torch.roll(x.double(), -5, 1)


def _survival_case(g):
    h = torch.rand(3, 37, generator=g) * 0.1
    return dict(h=h), (1 - h.double()).prod(1)


def _logsumexp_case(g):
    x = _randn(g, 37, 300, dtype=torch.float32) * 10
    return dict(x=x), torch.logsumexp(x.double(), -1)


def _argmin_case(g):
    x = _randn(g, 2, 37, 45, dtype=torch.float32)
    return dict(x=x), x.double().argmin(1).double()


def _clipped_case(g):
    grad = _randn(g, 37, 300, dtype=torch.float32)
    gd = grad.double()
    norm = gd.pow(2).sum(-1, keepdim=True).sqrt()
    return dict(g=grad, max_norm=5.0), gd * torch.clamp(5.0 / (norm + 1e-6), max=1.0)


def _masked_var_case(g):
    x = _randn(g, 3, 37, 20, dtype=torch.float32) + 4
    mask = (torch.rand(3, 37, generator=g) > 0.3).float()
    xd, md = x.double(), mask.double()[..., None]
    count = md.sum(1)
    mean = (xd * md).sum(1) / count
    return dict(x=x, mask=mask), (md * (xd - mean[:, None]) ** 2).sum(1) / count


def _heads_softmax_case(g):
    x, w = _randn(g, 2, 12, 37, dtype=torch.float32), _randn(g, 12, dtype=torch.float32, scale=1)
    return dict(x=x, w=w), (x.double() * w.double()[None, :, None]).softmax(1)



def _softmax_and_max_case(g):
    x = _randn(g, 37, 300, dtype=torch.float32)
    return dict(x=x), (x.double().amax(-1), x.double().softmax(-1))


def _gather_at_argmax_case(g):
    s, v = _randn(g, 37, 300, dtype=torch.float32), _randn(g, 37, 300, dtype=torch.float32)
    return dict(s=s, v=v), v.double().gather(1, s.argmax(1, keepdim=True))[:, 0]


def _nll_case(g):
    x, t = _randn(g, 37, 300), torch.randint(0, 300, (37,), generator=g)
    return dict(x=x, t=t), torch.nn.functional.cross_entropy(x.double(), t)


def _sliding_max_case(g):
    x = _randn(g, 3, 37, dtype=torch.float32)
    padded = torch.cat([torch.full((3, 3), -1e30, dtype=torch.float64), x.double()], 1)
    return dict(x=x), padded.unfold(1, 4, 1).amax(-1)


def _depthwise_case(g):
    x, w = _randn(g, 2, 3, 11, 13, dtype=torch.float32), _randn(g, 3, 3, 3, scale=1,
                                                              dtype=torch.float32)
    return dict(x=x, w=w), torch.nn.functional.conv2d(x.double(), w.double()[:, None], padding=1,
                                                      groups=3)


def _gqa_bias_case(g, B=2, S=37, H=6, G=2, D=16):
    q, k, v = _randn(g, B, S, H, D), _randn(g, B, S, G, D), _randn(g, B, S, G, D)
    bias = _randn(g, S, S, dtype=torch.float32)
    qd = q.double().transpose(1, 2)
    kd, vd = (t.double().transpose(1, 2).repeat_interleave(H // G, 1) for t in (k, v))
    s = qd @ kd.transpose(-1, -2) * 0.25 + bias.double()
    s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    return dict(q=q, k=k, v=v, bias=bias, scale=0.25), (s.softmax(-1) @ vd).transpose(1, 2)


def _temperature_case(g):
    x = _randn(g, 2, 5, 300, dtype=torch.float16)
    temp = torch.rand(2, generator=g) + 0.5
    return dict(x=x, temp=temp), (x.double() / temp.double()[:, None, None]).softmax(-1)

def _left_padded_case(g, B=2, S=40000, mask_dtype=torch.float32):
    """Rows of 40000 swept in blocks, their first 9000 masked (left padding): a count of 0
    after the first block was a reference members divided by (0/0, every state NaN)."""
    x = _randn(g, B, S, dtype=torch.float32) + 50
    mask = (torch.rand(B, S, generator=g) > 0.3).to(mask_dtype)
    mask[:, :9000] = 0
    xd, md = x.double(), mask.double()
    count = md.sum(1)
    mean = (xd * md).sum(1) / count
    return dict(x=x, mask=mask), (md * (xd - mean[:, None]) ** 2).sum(1) / count


CASES = {"smoothed_cross_entropy": (smoothed_cross_entropy, _smoothed_case),
         "softmax_entropy": (softmax_entropy, _entropy_case),
         "kl_logits": (kl_logits, _kl_case),
         "block_fp8_scale": (block_fp8_scale, _fp8_case),
         "instance_norm_nchw": (instance_norm_nchw, _instance_norm_case),
         "logit_second_moment": (logit_second_moment, _second_moment_case),
         "cosine_attention": (cosine_attention, _cosine_attention_case),
         "lse_pool_layernorm": (lse_pool_layernorm, _lse_pool_case),
         "masked_scores_softmax": (masked_scores_softmax, _masked_scores_case),
         "focal_loss": (focal_loss, _focal_case),
         "rms_over_heads": (rms_over_heads, _rms_case),
         "token_l2_distance_min": (token_l2_distance_min, _codebook_case),
         "embedding_bag_mean": (embedding_bag_mean, _embedding_bag_case),
         "roll_diff": (roll_diff, _roll_case),
         "survival": (survival, _survival_case),
         "lse_direct": (lse_direct, _logsumexp_case),
         "argmin_channels": (argmin_channels, _argmin_case),
         "clipped_norm_scale": (clipped_norm_scale, _clipped_case),
         "masked_var_tokens": (masked_var_tokens, _masked_var_case),
         "softmax_middle_axis_weighted": (softmax_middle_axis_weighted, _heads_softmax_case),
         "softmax_and_max": (softmax_and_max, _softmax_and_max_case),
         "gather_at_argmax": (gather_at_argmax, _gather_at_argmax_case),
         "nll_mean": (nll_mean, _nll_case),
         "sliding_max": (sliding_max, _sliding_max_case),
         "depthwise3x3": (depthwise3x3, _depthwise_case),
         "gqa_bias_bshd": (gqa_bias_bshd, _gqa_bias_case),
         "temp_softmax": (temp_softmax, _temperature_case),
         "masked_var_rows": (masked_var_rows, _left_padded_case),
         "masked_var_int_rows": (masked_variance("i32"),
                                 lambda g: _left_padded_case(g, mask_dtype=torch.int32))}


if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
