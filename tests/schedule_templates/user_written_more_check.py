"""More kernels as users write them, each probing what a template may get wrong beside the math:
cross-entropy with torch's ``ignore_index`` (a gather at −100 under a guard), a mean down the
outermost axis, a global norm over every element, a softmax of int8 scores dequantised per row,
an L1 normalisation, a residual sum and its RMS norm as two outputs, argmaxes over repeated
values along and across rows (torch takes the first), a SwiGLU of a row's two halves (an axis
declared over half the row, reading both halves), an unbiased variance of values far from 0,
pairwise squared distances, log-sum-exps of values up to ±3·10⁴ and over a middle axis, a
softmax under a boolean padding mask, a softmax of one element, a sum over the outermost and
innermost axes, a softmax down the columns, an fp16 standard deviation around 1000,
cross-entropy over GPT-2's 50257 words, causal attention at head dim 20, a bottom-right
causal mask (fewer queries than keys), an int32 max of negative values, an int8 sum past int8's
range, a product of signed values with a zero, an RMS norm with an f32 weight into fp16 — against
float64 torch references (never the project's lowering), outputs poisoned: through Triton's
interpreter as ``tf.compile`` makes them for sm_90a (this module's ``__main__``) and through the
CPU target (:mod:`tests.schedule_templates.test_user_written`).

    TRITON_INTERPRET=1 python -m tests.schedule_templates.user_written_more_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted
from tests.schedule_templates.user_written_check import _randn


@tf.kernel
def ce_ignore_index(x: T.Tensor["M", "V", "bf16"], t: T.Tensor["M", "i64"]):
    """Cross-entropy per row, 0 where the target is torch's ignore_index (−100)."""
    i, v = T.axes("i v")
    m = T.max(x[i, v], over=v)
    lse = m + T.log(T.sum(T.exp(x[i, v] - m), over=v))
    return T.where(t[i] >= 0, lse - x[i, t[i]], 0.0)


@tf.kernel
def mean_over_batch(x: T.Tensor["B", "S", "D", "f32"]):
    """A mean down the outermost axis."""
    b, s, d = T.axes("b s d")
    return T.sum(x[b, s, d], over=b) / T.size("B")


@tf.kernel
def global_norm(x: T.Tensor["M", "N", "f32"]):
    """The L2 norm of every element together (a gradient's global norm)."""
    i, j = T.axes("i j")
    return T.sqrt(T.sum(x[i, j] * x[i, j], over=(i, j)))


@tf.kernel
def int8_softmax(x: T.Tensor["M", "N", "i8"], scale: T.Tensor["M", "f32"]):
    """A softmax of int8 scores dequantised by a scale per row."""
    i, j = T.axes("i j")
    y = T.cast(x[i, j], "f32") * scale[i]
    m = T.max(y, over=j)
    e = T.exp(y - m)
    return e / T.sum(e, over=j)


@tf.kernel
def l1_normalize(x: T.Tensor["M", "N", "bf16"]):
    """Rows divided by their L1 norm."""
    i, j = T.axes("i j")
    return x[i, j] / T.max(T.sum(T.abs(x[i, j]), over=j), 1e-12)


@tf.kernel
def add_rmsnorm(x: T.Tensor["M", "N", "bf16"], r: T.Tensor["M", "N", "bf16"],
                w: T.Tensor["N", "bf16"]):
    """The residual sum and its RMS norm: two outputs, as LLM blocks fuse them."""
    i, j = T.axes("i j")
    h = x[i, j] + r[i, j]
    ms = T.sum(h * h, over=j) / T.size("N")
    return T.cast(h, "bf16"), h * T.rsqrt(ms + 1e-6) * w[j]


@tf.kernel
def argmax_repeated(x: T.Tensor["M", "N", "bf16"]):
    """Each row's argmax over values that repeat (torch: the first)."""
    i, j = T.axes("i j")
    return T.argmax(x[i, j], over=j)


@tf.kernel
def argmax_down_columns(x: T.Tensor["M", "N", "f32"]):
    """Each column's argmax over repeated values, down a strided axis."""
    i, j = T.axes("i j")
    return T.argmax(x[i, j], over=i)


@tf.kernel
def swiglu_rms(x: T.Tensor["M", "N2", "bf16"]):
    """SwiGLU of a row's two halves, then the RMS of the result: an axis over half the row."""
    i = T.axes("i")
    half = T.size("N2") // 2
    j = T.axis("j", half)
    a, b = x[i, j], x[i, j + half]
    y = a * T.sigmoid(a) * b
    return T.sqrt(T.sum(y * y, over=j) / half)


@tf.kernel
def unbiased_var(x: T.Tensor["M", "N", "f32"]):
    """torch.var's default: the squared deviations over N − 1."""
    i, j = T.axes("i j")
    mean = T.sum(x[i, j], over=j) / T.size("N")
    return T.sum((x[i, j] - mean) * (x[i, j] - mean), over=j) / (T.size("N") - 1)


@tf.kernel
def pairwise_sqdist(x: T.Tensor["N", "D", "f32"], y: T.Tensor["M", "D", "f32"]):
    """Squared distances between two point sets, nothing reduced after."""
    i, j, d = T.axes("i j d")
    return T.sum((x[i, d] - y[j, d]) * (x[i, d] - y[j, d]), over=d)


@tf.kernel
def lse_wide_range(x: T.Tensor["M", "N", "f32"]):
    """A log-sum-exp of values up to ±3·10⁴."""
    i, j = T.axes("i j")
    return T.logsumexp(x[i, j], over=j)


@tf.kernel
def lse_middle(x: T.Tensor["A", "B", "C", "f32"]):
    """A log-sum-exp over the middle of three axes."""
    a, b, c = T.axes("a b c")
    return T.logsumexp(x[a, b, c], over=b)


@tf.kernel
def padded_softmax(x: T.Tensor["B", "S", "N", "bf16"], keep: T.Tensor["B", "N", "bool"]):
    """A softmax over the keys a boolean padding mask keeps."""
    b, s, n = T.axes("b s n")
    y = T.where(keep[b, n], x[b, s, n], -T.inf)
    m = T.max(y, over=n)
    e = T.exp(y - m)
    return e / T.sum(e, over=n)


@tf.kernel
def softmax_f32(x: T.Tensor["M", "N", "f32"]):
    """A softmax, here of a single element."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    e = T.exp(x[i, j] - m)
    return e / T.sum(e, over=j)


@tf.kernel
def sum_outer_inner(x: T.Tensor["B", "S", "D", "f32"]):
    """A sum over the outermost and innermost axes, the middle kept."""
    b, s, d = T.axes("b s d")
    return T.sum(x[b, s, d], over=(b, d))


@tf.kernel
def column_softmax(x: T.Tensor["N", "M", "bf16"]):
    """A softmax down the columns (over the outer axis)."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=i)
    e = T.exp(x[i, j] - m)
    return e / T.sum(e, over=i)


@tf.kernel
def std_fp16(x: T.Tensor["M", "N", "f16"]):
    """The standard deviation of fp16 values around 1000."""
    i, j = T.axes("i j")
    mean = T.sum(x[i, j], over=j) / T.size("N")
    return T.sqrt(T.sum((x[i, j] - mean) * (x[i, j] - mean), over=j) / T.size("N"))


@tf.kernel
def cross_entropy(x: T.Tensor["M", "V", "bf16"], t: T.Tensor["M", "i64"]):
    """Cross-entropy per row (here over GPT-2's vocabulary of 50257)."""
    i, v = T.axes("i v")
    m = T.max(x[i, v], over=v)
    return m + T.log(T.sum(T.exp(x[i, v] - m), over=v)) - x[i, t[i]]


@tf.kernel
def causal_attention_d20(q: T.Tensor["B", "H", "S", "D", "bf16"],
                         k: T.Tensor["B", "H", "S", "D", "bf16"],
                         v: T.Tensor["B", "H", "S", "D", "bf16"]):
    """Causal attention at a head dim of 20 (not a multiple of 8)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.where(j <= i, T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * 0.2, -T.inf)
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)


@tf.kernel
def causal_bottom_right(q: T.Tensor["B", "M", "D", "f32"], k: T.Tensor["B", "N", "D", "f32"],
                        v: T.Tensor["B", "N", "D", "f32"]):
    """Attention of M queries on N ≥ M keys, causal aligned at the bottom right (a decode of
    several new tokens)."""
    b, i, j, d, e = T.axes("b i j d e")
    s = T.sum(q[b, i, d] * k[b, j, d], over=d) * 0.25
    s = T.where(j <= i + T.size("N") - T.size("M"), s, -T.inf)
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, j, e], over=j) / T.sum(p, over=j)


@tf.kernel
def int_max(x: T.Tensor["M", "N", "i32"]):
    """The int32 maximum of each row (all negative here: no identity of 0 may win)."""
    i, j = T.axes("i j")
    return T.max(x[i, j], over=j)


@tf.kernel
def int8_sum(x: T.Tensor["M", "N", "i8"]):
    """An int8 row sum, far past int8's range."""
    i, j = T.axes("i j")
    return T.sum(x[i, j], over=j)


@tf.kernel
def product(x: T.Tensor["M", "N", "f32"]):
    """A product of signed values, a zero in one row."""
    i, j = T.axes("i j")
    return T.prod(x[i, j], over=j)


@tf.kernel
def rmsnorm_into_fp16(x: T.Tensor["M", "N", "bf16"], w: T.Tensor["N", "f32"], eps: T.f32):
    """An RMS norm of bf16 rows by an f32 weight, stored as fp16."""
    i, j = T.axes("i j")
    r = T.rsqrt(T.sum(x[i, j] * x[i, j], over=j) / T.size("N") + eps)
    return T.cast(x[i, j] * r * w[j], "f16")


# ---- cases: (arguments, float64 reference) on fresh inputs, ragged sizes ----

def _ce_ignore_case(g, M=37, V=300):
    x, t = _randn(g, M, V), torch.randint(0, V, (M,), generator=g)
    t[::3] = -100
    return dict(x=x, t=t), torch.nn.functional.cross_entropy(x.double(), t, reduction="none",
                                                             ignore_index=-100)


def _mean_over_batch_case(g):
    x = _randn(g, 7, 5, 33, dtype=torch.float32) + 10
    return dict(x=x), x.double().mean(0)


def _global_norm_case(g):
    x = _randn(g, 37, 301, dtype=torch.float32)
    return dict(x=x), x.double().norm()


def _int8_softmax_case(g):
    x = torch.randint(-128, 128, (37, 300), generator=g).to(torch.int8)
    scale = torch.rand(37, generator=g) * 0.1
    return dict(x=x, scale=scale), (x.double() * scale.double()[:, None]).softmax(-1)


def _l1_case(g):
    x = _randn(g, 37, 300)
    return dict(x=x), x.double() / x.double().abs().sum(1, keepdim=True)


def _add_rmsnorm_case(g):
    x, r, w = _randn(g, 37, 300), _randn(g, 37, 300), _randn(g, 300, scale=1)
    h = x.double() + r.double()
    return dict(x=x, r=r, w=w), (h, h * torch.rsqrt(h.pow(2).mean(1, keepdim=True) + 1e-6)
                                 * w.double())


def _argmax_repeated_case(g):
    x = torch.randint(0, 5, (37, 3000), generator=g).to(torch.bfloat16)
    return dict(x=x), x.double().argmax(1).double()


def _argmax_columns_case(g):
    x = torch.randint(0, 4, (3000, 37), generator=g).float()
    return dict(x=x), x.double().argmax(0).double()


def _swiglu_case(g, M=37, N=150):
    x = _randn(g, M, 2 * N)
    a, b = x.double()[:, :N], x.double()[:, N:]
    return dict(x=x), (torch.nn.functional.silu(a) * b).pow(2).mean(1).sqrt()


def _unbiased_case(g):
    x = _randn(g, 37, 300, dtype=torch.float32) * 100 + 1000
    return dict(x=x), x.double().var(1)


def _pairwise_case(g):
    x, y = _randn(g, 37, 5, dtype=torch.float32), _randn(g, 41, 5, dtype=torch.float32)
    return dict(x=x, y=y), ((x.double()[:, None] - y.double()[None]) ** 2).sum(-1)


def _lse_wide_case(g):
    x = _randn(g, 37, 3000, scale=1e4, dtype=torch.float32)
    return dict(x=x), x.double().logsumexp(1)


def _lse_middle_case(g):
    x = _randn(g, 5, 300, 37, dtype=torch.float32)
    return dict(x=x), x.double().logsumexp(1)


def _padded_case(g):
    x, keep = _randn(g, 2, 5, 300), torch.rand(2, 300, generator=g) > 0.5
    keep[:, 0] = True
    return dict(x=x, keep=keep), \
        x.double().masked_fill(~keep[:, None, :], float("-inf")).softmax(-1)


def _one_element_case(g):
    x = _randn(g, 1, 1, dtype=torch.float32)
    return dict(x=x), x.double().softmax(-1)


def _outer_inner_case(g):
    x = _randn(g, 3, 7, 33, dtype=torch.float32)
    return dict(x=x), x.double().sum((0, 2))


def _column_softmax_case(g):
    x = _randn(g, 300, 37)
    return dict(x=x), x.double().softmax(0)


def _std_case(g):
    x = (torch.randn(37, 5000, generator=g) + 1000).to(torch.float16)
    return dict(x=x), x.double().std(1, unbiased=False)


def _gpt2_case(g):
    x, t = _randn(g, 3, 50257), torch.randint(0, 50257, (3,), generator=g)
    return dict(x=x, t=t), torch.nn.functional.cross_entropy(x.double(), t, reduction="none")


def _attention_d20_case(g, S=37, D=20):
    q, k, v = (_randn(g, 2, 3, S, D) for _ in range(3))
    s = q.double() @ k.double().transpose(-1, -2) * 0.2
    s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    return dict(q=q, k=k, v=v), s.softmax(-1) @ v.double()


def _bottom_right_case(g, M=13, N=40, D=16):
    q = _randn(g, 2, M, D, dtype=torch.float32)
    k, v = (_randn(g, 2, N, D, dtype=torch.float32) for _ in range(2))
    s = q.double() @ k.double().transpose(-1, -2) * 0.25
    keep = torch.ones(M, N, dtype=torch.bool).tril(N - M)
    return dict(q=q, k=k, v=v), s.masked_fill(~keep, float("-inf")).softmax(-1) @ v.double()


def _int_max_case(g):
    x = torch.randint(-10 ** 9, -10 ** 6, (37, 3000), generator=g, dtype=torch.int32)
    return dict(x=x), x.double().amax(1)


def _int8_sum_case(g):
    x = torch.randint(100, 128, (37, 300), generator=g).to(torch.int8)
    return dict(x=x), x.double().sum(1)


def _product_case(g):
    x = (torch.rand(37, 20, generator=g) + 0.5) * \
        torch.where(torch.rand(37, 20, generator=g) > 0.5, 1.0, -1.0)
    x[3, 4] = 0
    return dict(x=x), x.double().prod(1)


def _rms_fp16_case(g):
    x, w = _randn(g, 37, 300), _randn(g, 300, dtype=torch.float32)
    xd = x.double()
    return dict(x=x, w=w, eps=1e-5), \
        xd * torch.rsqrt(xd.pow(2).mean(1, keepdim=True) + 1e-5) * w.double()


CASES = {"ce_ignore_index": (ce_ignore_index, _ce_ignore_case),
         "mean_over_batch": (mean_over_batch, _mean_over_batch_case),
         "global_norm": (global_norm, _global_norm_case),
         "int8_softmax": (int8_softmax, _int8_softmax_case),
         "l1_normalize": (l1_normalize, _l1_case),
         "add_rmsnorm": (add_rmsnorm, _add_rmsnorm_case),
         "argmax_repeated": (argmax_repeated, _argmax_repeated_case),
         "argmax_down_columns": (argmax_down_columns, _argmax_columns_case),
         "swiglu_rms": (swiglu_rms, _swiglu_case),
         "unbiased_var": (unbiased_var, _unbiased_case),
         "pairwise_sqdist": (pairwise_sqdist, _pairwise_case),
         "lse_wide_range": (lse_wide_range, _lse_wide_case),
         "lse_middle": (lse_middle, _lse_middle_case),
         "padded_softmax": (padded_softmax, _padded_case),
         "softmax_of_one": (softmax_f32, _one_element_case),
         "sum_outer_inner": (sum_outer_inner, _outer_inner_case),
         "column_softmax": (column_softmax, _column_softmax_case),
         "std_fp16": (std_fp16, _std_case),
         "cross_entropy_gpt2": (cross_entropy, _gpt2_case),
         "causal_attention_d20": (causal_attention_d20, _attention_d20_case),
         "causal_bottom_right": (causal_bottom_right, _bottom_right_case),
         "int_max": (int_max, _int_max_case),
         "int8_sum": (int8_sum, _int8_sum_case),
         "product": (product, _product_case),
         "rmsnorm_into_fp16": (rmsnorm_into_fp16, _rms_fp16_case)}


if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
