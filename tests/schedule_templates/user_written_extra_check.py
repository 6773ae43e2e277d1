"""Further kernels as users write them, each probing another way a plan may go wrong: a
classifier's logits (a GEMM) then their softmax, a row's range (a max and a min together), int8
quantisation by the row's absolute max (two outputs, one of them int8), a dot product with the
second operand read transposed, causal attention with ALiBi slopes from a tensor, attention
pooling by a learned query (the same tensor as keys and values), an argmax within groups of 8
(index arithmetic over two axes), a softmax of scores plus a bias shared by the batch, a
soft-capped cross-entropy, a cosine-similarity matrix (a contraction and two norms), a layer
norm over two axes, a sum of a row read backwards — and reductions whose terms depend on another
reduction of the same row in ways no correction can carry (a sum of the values above the row's
mean, a sum of the values' excess over the mean, a count above half the max: two passes, never
one rolled pass), a boolean output, a mean of log-sum-exps, the variance under a softmax, a
multi-class margin loss, a sum shifted by the global max — against float64 torch references
(never the project's lowering), outputs poisoned: through Triton's interpreter as ``tf.compile``
makes them for sm_90a (this module's ``__main__``) and through the CPU target
(:mod:`tests.schedule_templates.test_user_written`).

    TRITON_INTERPRET=1 python -m tests.schedule_templates.user_written_extra_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tests.helpers import clear_of, poisoned_main
from tests.schedule_templates.staged_floor import interpreted
from tests.schedule_templates.user_written_check import _randn


@tf.kernel
def classifier_softmax(x: T.Tensor["B", "D", "bf16"], w: T.Tensor["C", "D", "bf16"],
                       bias: T.Tensor["C", "f32"]):
    """Class probabilities: a linear layer's logits (a GEMM over d) plus a bias, softmaxed."""
    b, c, d = T.axes("b c d")
    z = T.sum(x[b, d] * w[c, d], over=d) + bias[c]
    m = T.max(z, over=c)
    e = T.exp(z - m)
    return e / T.sum(e, over=c)


def _classifier_case(g):
    # logits of ~30 (not ~90: float32's rounding of a logit then moved the probabilities by
    # ~1e-5, the float32 tolerance — one seed in ~500)
    x, w = _randn(g, 19, 96, scale=1.0), _randn(g, 37, 96)
    bias = _randn(g, 37, dtype=torch.float32)
    z = x.double() @ w.double().T + bias.double()
    return dict(x=x, w=w, bias=bias), torch.softmax(z, 1)


@tf.kernel
def row_range(x: T.Tensor["M", "N", "f32"]):
    """Each row's range: its max and its min in one pass."""
    i, j = T.axes("i j")
    return T.max(x[i, j], over=j) - T.min(x[i, j], over=j)


def _range_case(g):
    x = _randn(g, 33, 517, dtype=torch.float32) * 100
    return dict(x=x), (x.double().amax(1) - x.double().amin(1))


@tf.kernel
def quantize_rows(x: T.Tensor["M", "N", "bf16"]):
    """int8 quantisation by the row's absolute max: the scale and the rounded values."""
    i, j = T.axes("i j")
    scale = T.max(T.abs(x[i, j]), over=j) / 127.0
    return scale, T.cast(T.round(x[i, j] / scale), "i8")


def _quant_case(g):
    x = _randn(g, 21, 300) * 5
    xd = x.double()
    s = xd.abs().amax(1) / 127
    return dict(x=x), (s, torch.round(xd / s[:, None]))


@tf.kernel
def transposed_dot(x: T.Tensor["M", "N", "f32"], y: T.Tensor["N", "M", "f32"]):
    """A dot product of each row with a column of a second operand (read transposed)."""
    i, j = T.axes("i j")
    return T.sum(x[i, j] * y[j, i], over=j)


def _transposed_case(g):
    x, y = _randn(g, 45, 70, dtype=torch.float32), _randn(g, 70, 45, dtype=torch.float32)
    return dict(x=x, y=y), (x.double() * y.double().T).sum(1)


@tf.kernel
def alibi_causal(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                 v: T.Tensor["B", "H", "N", "D", "bf16"], slopes: T.Tensor["H", "f32"],
                 scale: T.f32):
    """Causal attention with ALiBi written out, its slopes a tensor per head."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale - slopes[h] * T.cast(i - j, "f32")
    s = T.where(i >= j, s, -T.inf)
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)


def _alibi_case(g, S=45, D=32):
    q, k, v = (_randn(g, 2, 3, S, D) for _ in range(3))
    slopes = torch.rand(3, generator=g) + 0.1
    s = q.double() @ k.double().transpose(-1, -2) * D ** -0.5
    idx = torch.arange(S)
    s = s - slopes.double()[None, :, None, None] * (idx[:, None] - idx[None, :]).double()
    s = s.masked_fill(idx[:, None] < idx[None, :], float("-inf"))
    return dict(q=q, k=k, v=v, slopes=slopes, scale=D ** -0.5), torch.softmax(s, -1) @ v.double()


@tf.kernel
def attention_pool(x: T.Tensor["B", "T", "D", "f32"], w: T.Tensor["D", "f32"]):
    """Attention pooling over tokens by a learned query: the tokens are keys and values."""
    b, t, d, e = T.axes("b t d e")
    s = T.sum(x[b, t, d] * w[d], over=d)
    m = T.max(s, over=t)
    p = T.exp(s - m)
    return T.sum(p * x[b, t, e], over=t) / T.sum(p, over=t)


def _pool_case(g):
    # scores of ~20 (not ~60): float32's rounding of a score moves its weight by |s|·2⁻²⁴·√D,
    # which at 60 reached the float32 tolerance (1e-5) one seed in ~250
    x = _randn(g, 3, 77, 40, dtype=torch.float32)
    w = _randn(g, 40, scale=1.0, dtype=torch.float32)
    s = (x.double() * w.double()).sum(-1)
    p = torch.softmax(s, 1)
    return dict(x=x, w=w), (p[..., None] * x.double()).sum(1)


@tf.kernel
def grouped_argmax(x: T.Tensor["M", "N", "f32"]):
    """The argmax within each group of 8 columns (an index over two axes)."""
    i = T.axis("i", T.size("M"))
    g = T.axis("g", T.size("N") // 8)
    j = T.axis("j", 8)
    return T.argmax(x[i, g * 8 + j], over=j)


def _grouped_case(g):
    x = _randn(g, 13, 64, dtype=torch.float32)
    return dict(x=x), x.view(13, 8, 8).argmax(-1).double()


@tf.kernel
def biased_softmax(x: T.Tensor["B", "M", "N", "f32"], bias: T.Tensor["M", "N", "f32"]):
    """A softmax of scores plus a bias shared by the batch."""
    b, i, j = T.axes("b i j")
    y = x[b, i, j] + bias[i, j]
    m = T.max(y, over=j)
    e = T.exp(y - m)
    return e / T.sum(e, over=j)


def _biased_case(g):
    x, bias = _randn(g, 3, 17, 130, dtype=torch.float32), _randn(g, 17, 130, dtype=torch.float32)
    return dict(x=x, bias=bias), torch.softmax(x.double() + bias.double(), -1)


@tf.kernel
def capped_ce(x: T.Tensor["M", "V", "bf16"], t: T.Tensor["M", "i32"], cap: T.f32):
    """Cross-entropy of soft-capped logits (Gemma-2's tanh cap)."""
    i, v = T.axes("i v")
    z = cap * T.tanh(T.cast(x[i, v], "f32") / cap)
    m = T.max(z, over=v)
    lse = m + T.log(T.sum(T.exp(z - m), over=v))
    return lse - cap * T.tanh(T.cast(x[i, t[i]], "f32") / cap)


def _capped_case(g):
    x = _randn(g, 11, 1000) * 40
    t = torch.randint(0, 1000, (11,), generator=g, dtype=torch.int32)
    z = 30 * torch.tanh(x.double() / 30)
    return dict(x=x, t=t, cap=30.0), torch.logsumexp(z, 1) - z[torch.arange(11), t.long()]


@tf.kernel
def cosine_matrix(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"]):
    """Cosine similarities of every row of x with every row of y."""
    i, j, d = T.axes("i j d")
    dot = T.sum(x[i, d] * y[j, d], over=d)
    norm_x = T.rsqrt(T.sum(x[i, d] * x[i, d], over=d))
    return dot * norm_x * T.rsqrt(T.sum(y[j, d] * y[j, d], over=d))


def _cosine_case(g):
    x, y = _randn(g, 23, 48, dtype=torch.float32), _randn(g, 31, 48, dtype=torch.float32)
    xd, yd = x.double(), y.double()
    unit_x, unit_y = xd / xd.norm(dim=1, keepdim=True), yd / yd.norm(dim=1, keepdim=True)
    return dict(x=x, y=y), unit_x @ unit_y.T


@tf.kernel
def layernorm_two_axes(x: T.Tensor["B", "S", "D", "bf16"]):
    """A layer norm over the last two axes together."""
    b, s, d = T.axes("b s d")
    mean = T.sum(T.cast(x[b, s, d], "f32"), over=(s, d)) / (T.size("S") * T.size("D"))
    c = T.cast(x[b, s, d], "f32") - mean
    var = T.sum(c * c, over=(s, d)) / (T.size("S") * T.size("D"))
    return c * T.rsqrt(var + 1e-5)


def _ln2_case(g):
    x = _randn(g, 3, 29, 70) * 3 + 7
    xd = x.double()
    mu = xd.mean((1, 2), keepdim=True)
    var = ((xd - mu) ** 2).mean((1, 2), keepdim=True)
    return dict(x=x), (xd - mu) / torch.sqrt(var + 1e-5)


@tf.kernel
def reversed_weighted(x: T.Tensor["M", "N", "f32"], w: T.Tensor["N", "f32"]):
    """A weighted sum of each row read backwards."""
    i, j = T.axes("i j")
    return T.sum(x[i, T.size("N") - 1 - j] * w[j], over=j)


def _reversed_case(g):
    x, w = _randn(g, 10, 300, dtype=torch.float32), _randn(g, 300, dtype=torch.float32)
    return dict(x=x, w=w), (x.double().flip(1) * w.double()).sum(1)



@tf.kernel
def above_mean_sum(x: T.Tensor["M", "N", "f32"]):
    """The sum of each row's values above its mean (two passes: no correction exists)."""
    i, j = T.axes("i j")
    m = T.sum(x[i, j], over=j) / T.size("N")
    return T.sum(T.where(x[i, j] > m, x[i, j], 0.0), over=j)


def _row_mean(xd):
    return xd.mean(1, keepdim=True)


def _above_case(g):
    x = clear_of(_randn(g, 17, 700, dtype=torch.float32) + 3, _row_mean)
    xd = x.double()
    return dict(x=x), torch.where(xd > _row_mean(xd), xd, 0.0).sum(1)


@tf.kernel
def relu_centered(x: T.Tensor["M", "N", "f32"]):
    """The sum of each row's excess over its mean (two passes)."""
    i, j = T.axes("i j")
    m = T.sum(x[i, j], over=j) / T.size("N")
    return T.sum(T.relu(x[i, j] - m), over=j)


def _relu_case(g):
    x = _randn(g, 17, 700, dtype=torch.float32) * 4 - 2
    xd = x.double()
    return dict(x=x), torch.relu(xd - xd.mean(1, keepdim=True)).sum(1)


@tf.kernel
def count_above_half_max(x: T.Tensor["M", "N", "f32"]):
    """How many of each row's values exceed half its max (two passes)."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    return T.sum(T.where(x[i, j] > 0.5 * m, 1, 0), over=j)


def _count_case(g):
    x = torch.rand(17, 700, generator=g) * 10
    xd = x.double()
    return dict(x=x), (xd > 0.5 * xd.amax(1, keepdim=True)).double().sum(1)


@tf.kernel
def above_mean_mask(x: T.Tensor["M", "N", "f32"]):
    """Which values lie above their row's mean, as booleans."""
    i, j = T.axes("i j")
    return x[i, j] > T.sum(x[i, j], over=j) / T.size("N")


def _mask_case(g):
    x = clear_of(_randn(g, 17, 300, dtype=torch.float32), _row_mean)
    xd = x.double()
    return dict(x=x), (xd > _row_mean(xd)).double()


@tf.kernel
def mean_of_lse(x: T.Tensor["M", "N", "f32"]):
    """The mean over rows of each row's log-sum-exp."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    lse = m + T.log(T.sum(T.exp(x[i, j] - m), over=j))
    return T.sum(lse, over=i) / T.size("M")


def _mean_lse_case(g):
    x = _randn(g, 37, 300, dtype=torch.float32) * 10
    return dict(x=x), torch.logsumexp(x.double(), 1).mean()


@tf.kernel
def softmax_variance(x: T.Tensor["M", "N", "f32"]):
    """The variance of the values under their row's softmax."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    p = T.exp(x[i, j] - m)
    l = T.sum(p, over=j)
    mu = T.sum(p * x[i, j], over=j) / l
    return T.sum(p * (x[i, j] - mu) * (x[i, j] - mu), over=j) / l


def _softvar_case(g):
    x = _randn(g, 17, 900, dtype=torch.float32) * 3
    xd = x.double()
    p = torch.softmax(xd, 1)
    mu = (p * xd).sum(1, keepdim=True)
    return dict(x=x), (p * (xd - mu) ** 2).sum(1)


@tf.kernel
def multi_margin(x: T.Tensor["M", "C", "f32"], t: T.Tensor["M", "i64"]):
    """torch's multi-class margin loss per row (the target's logit gathered)."""
    i, c = T.axes("i c")
    return (T.sum(T.maximum(1.0 - x[i, t[i]] + x[i, c], 0.0), over=c) - 1.0) / T.size("C")


def _margin_case(g):
    x = _randn(g, 23, 50, dtype=torch.float32)
    t = torch.randint(0, 50, (23,), generator=g)
    want = torch.nn.functional.multi_margin_loss(x.double(), t, reduction="none")
    return dict(x=x, t=t), want


@tf.kernel
def global_max_shift(x: T.Tensor["M", "N", "f32"]):
    """Row sums of exponentials shifted by the max of the whole tensor."""
    i, j = T.axes("i j")
    g = T.max(x[i, j], over=(i, j))
    return T.sum(T.exp(x[i, j] - g), over=j)


def _gmax_case(g):
    x = _randn(g, 19, 300, dtype=torch.float32) * 5
    xd = x.double()
    return dict(x=x), torch.exp(xd - xd.max()).sum(1)


CASES = {name: (globals()[name], case) for name, case in [
    ("classifier_softmax", _classifier_case), ("row_range", _range_case),
    ("quantize_rows", _quant_case), ("transposed_dot", _transposed_case),
    ("alibi_causal", _alibi_case), ("attention_pool", _pool_case),
    ("grouped_argmax", _grouped_case), ("biased_softmax", _biased_case),
    ("capped_ce", _capped_case), ("cosine_matrix", _cosine_case),
    ("layernorm_two_axes", _ln2_case), ("reversed_weighted", _reversed_case),
    ("above_mean_sum", _above_case), ("relu_centered", _relu_case),
    ("count_above_half_max", _count_case), ("above_mean_mask", _mask_case),
    ("mean_of_lse", _mean_lse_case), ("softmax_variance", _softvar_case),
    ("multi_margin", _margin_case), ("global_max_shift", _gmax_case)]}


if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
