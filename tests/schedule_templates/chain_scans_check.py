"""Chains of reductions over the positions up to (or from) each output's own, as users write
them — a causal log-normaliser written out (a running maximum and a sum of exponentials
relative to it), a prefix softmax in bf16, a running standard deviation (two independent
sums scanned together), a suffix normaliser within each row's length, one long row (in
parts), a normaliser down the middle axis, a softmax-weighted average of values so far, an
exclusive normaliser (its first range empty) — as ``tf.compile``
makes them for sm_90a (``schedule_templates/chain_scans.py``), run by Triton's interpreter
against float64 references in torch, outputs poisoned; prints each case's relative error as
JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.chain_scans_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.scan_kernels import causal_log_normaliser, running_std
from tests.helpers import poisoned_main, relative_error
from tests.schedule_templates.staged_floor import interpreted


@tf.kernel
def prefix_softmax(x: T.Tensor["B", "N", "bf16"]):
    """Each position's weight among the positions up to it."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    m = T.max(T.where(j <= i, x[b, j], -T.inf), over=j)
    s = T.sum(T.where(j <= i, T.exp(x[b, j] - m), 0.0), over=j)
    return T.cast(T.exp(x[b, i] - m) / s, "bf16")


@tf.kernel
def suffix_normaliser(x: T.Tensor["B", "N", "f32"], length: T.Tensor["B", "i32"]):
    """``log Σ exp(x_j)`` over the positions from each one's own to its row's length."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    keep = (j >= i) & (j < length[b])
    m = T.max(T.where(keep, x[b, j], -T.inf), over=j)
    return m + T.log(T.sum(T.where(keep, T.exp(x[b, j] - m), 0.0), over=j))


@tf.kernel
def normaliser_down_middle(x: T.Tensor["B", "N", "C", "f32"]):
    """Each channel's running log-sum-exp down the sequence of ``[B, N, C]`` (the scanned axis
    not innermost in memory)."""
    b = T.axis("b", "B")
    i = T.axis("i", "N")   # declared before c: the output is [B, N, C]
    j, c = T.axes("j c")
    m = T.max(T.where(j <= i, x[b, j, c], -T.inf), over=j)
    return m + T.log(T.sum(T.where(j <= i, T.exp(x[b, j, c] - m), 0.0), over=j))


@tf.kernel
def causal_attention_pool(s: T.Tensor["B", "N", "f32"], v: T.Tensor["B", "N", "E", "f32"]):
    """Each position's average of the values so far, weighted by a softmax of their scores: the
    weights' maximum and normaliser scanned again along each feature ``e``."""
    b = T.axis("b", "B")
    i = T.axis("i", "N")   # declared before e: the output is [B, N, E]
    j, e = T.axes("j e")
    m = T.max(T.where(j <= i, s[b, j], -T.inf), over=j)
    p = T.where(j <= i, T.exp(s[b, j] - m), 0.0)
    return T.sum(p * v[b, j, e], over=j) / T.sum(p, over=j)


@tf.kernel
def exclusive_normaliser(x: T.Tensor["B", "N", "f32"]):
    """``log Σ_{j < i} exp(x_j)``: the first position's range is empty (−∞)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    m = T.max(T.where(j < i, x[b, j], -T.inf), over=j)
    return m + T.log(T.sum(T.where(j < i, T.exp(x[b, j] - m), 0.0), over=j))


@tf.kernel
def running_range(x: T.Tensor["B", "N", "f32"]):
    """The largest value so far less the smallest: a maximum and a minimum scanned together."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.max(T.where(j <= i, x[b, j], -T.inf), over=j) - \
        T.min(T.where(j <= i, x[b, j], T.inf), over=j)


def _logits(generator, B, N, spread=30.0, offset=300.0):
    return torch.randn(B, N, generator=generator) * spread + offset


def log_normaliser_case(generator, B=3, N=400):
    """Logits spread ±30 about 300 (exp of them overflows f32 unless taken relative)."""
    x = _logits(generator, B, N)
    return dict(x=x), x.double() - torch.logcumsumexp(x.double(), -1)


def prefix_softmax_case(generator, B=3, N=333):
    x = _logits(generator, B, N, 4.0, 0.0).bfloat16()
    xd = x.double()
    return dict(x=x), (xd - torch.logcumsumexp(xd, -1)).exp()


def running_std_case(generator, B=3, N=300):
    x = torch.randn(B, N, generator=generator) * 3 + 1
    xd = x.double()
    n = torch.arange(1, N + 1, dtype=torch.float64)
    mean, square = xd.cumsum(-1) / n, (xd * xd).cumsum(-1) / n
    return dict(x=x), (square - mean * mean).clamp(min=0).sqrt()


def long_row_case(generator, B=1, N=7200):
    """One row of 7200: cut into two parts, the first part's states the second's carry."""
    x = _logits(generator, B, N, 10.0, 0.0)
    return dict(x=x), x.double() - torch.logcumsumexp(x.double(), -1)


def middle_case(generator, B=2, N=150, C=6):
    x = _logits(generator, B * C, N).view(B, C, N).transpose(1, 2).contiguous()
    return dict(x=x), torch.logcumsumexp(x.double(), 1)


def attention_pool_case(generator, B=2, N=100, E=5):
    s = _logits(generator, B, N, 5.0, 100.0)
    v = torch.randn(B, N, E, generator=generator)
    weights = torch.where(torch.arange(N)[:, None] >= torch.arange(N)[None, :],
                          s.double()[:, None, :], -torch.inf).softmax(-1)
    return dict(s=s, v=v), weights @ v.double()


def exclusive_case(generator, B=3, N=200):
    x = _logits(generator, B, N, 20.0, 0.0)
    lse = torch.logcumsumexp(x.double(), -1)
    return dict(x=x), torch.cat([torch.full((B, 1), -torch.inf, dtype=torch.float64),
                                 lse[:, :-1]], 1)


def range_case(generator, B=3, N=300):
    x = _logits(generator, B, N, 10.0, 0.0)
    return dict(x=x), torch.cummax(x.double(), -1).values - torch.cummin(x.double(), -1).values


def suffix_case(generator, B=4, N=300):
    """Row lengths from 1 to N; past a row's length its outputs are the empty sum's, −∞."""
    x = _logits(generator, B, N, 20.0, -50.0)
    length = torch.randint(1, N + 1, (B,), generator=generator).to(torch.int32)
    xd = x.double().masked_fill(torch.arange(N)[None, :] >= length[:, None].long(), -torch.inf)
    return dict(x=x, length=length), torch.logcumsumexp(xd.flip(-1), -1).flip(-1)


def error(out, want) -> float:
    """``relative_error`` over the finite references; an infinite one must come out as it is
    (an empty range's log-sum-exp: −∞), else the error is infinite."""
    out, infinite = out.double().cpu(), torch.isinf(want)
    if not torch.equal(out[infinite], want[infinite]):
        return float("inf")
    return relative_error(out[~infinite], want[~infinite])


CASES = {"causal_log_normaliser": (causal_log_normaliser, log_normaliser_case),
         "prefix_softmax": (prefix_softmax, prefix_softmax_case),
         "running_std": (running_std, running_std_case),
         "suffix_normaliser": (suffix_normaliser, suffix_case),
         "long_row": (causal_log_normaliser, long_row_case),
         "normaliser_down_middle": (normaliser_down_middle, middle_case),
         "causal_attention_pool": (causal_attention_pool, attention_pool_case),
         "exclusive_normaliser": (exclusive_normaliser, exclusive_case),
         "running_range": (running_range, range_case)}

if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel), error)
