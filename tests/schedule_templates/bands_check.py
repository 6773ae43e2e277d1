"""Reductions over a band of positions around each output's own (a rolling maximum, a trailing
moving sum, a centred window weighted by distance, a band that ends before the position), as
``tf.compile`` makes them for sm_90a — rewritten over a window axis of the band's width —, run by
Triton's interpreter against torch in float64, outputs poisoned; prints each case's relative
error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.bands_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tests.helpers import poisoned_main


@tf.kernel
def rolling_max(x: T.Tensor["B", "N", "f32"]):
    """The largest of the last 64 values (fewer at the row's start)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.max(T.where((j <= i) & (j > i - 64), x[b, j], -T.inf), over=j)


@tf.kernel
def moving_sum(x: T.Tensor["B", "N", "C", "bf16"]):
    """The sum of the last 8 steps of each channel of [B, N, C] (the band down the middle
    axis; computed in f32, stored bf16)."""
    b = T.axis("b", "B")
    i = T.axis("i", "N")
    j, c = T.axes("j c")
    return T.sum(T.where((i - 8 < j) & (j <= i), x[b, j, c], 0.0), over=j)


@tf.kernel
def centred_weighted(x: T.Tensor["B", "N", "f32"]):
    """A centred window of 7 weighted by closeness (the terms read the position too)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    near = 4.0 - T.abs(T.cast(i - j, "f32"))
    return T.sum(T.where((j >= i - 3) & (j <= i + 3), near * x[b, j], 0.0), over=j)


@tf.kernel
def lagged_band_min(x: T.Tensor["B", "N", "f32"]):
    """The smallest of the values 5 to 2 positions back: a band that ends before the position
    (+∞'s stand-in, the highest float, where it holds none)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.min(T.where((j + 2 <= i) & (j >= i - 5), x[b, j], T.inf), over=j)


def _windows(x, lo: int, hi: int):
    """``x[..., i + lo … i + hi]`` of each position along the last axis, NaN outside the row."""
    n = x.shape[-1]
    at = torch.arange(n)[:, None] + torch.arange(lo, hi + 1)[None, :]
    inside = (at >= 0) & (at < n)
    return torch.where(inside, x[..., at.clamp(0, n - 1)], torch.nan), at


def rolling_max_case(generator, B=3, N=3000):
    x = torch.randn(B, N, generator=generator) * 100
    w, _ = _windows(x.double(), -63, 0)
    return dict(x=x), torch.nan_to_num(w, nan=-torch.inf).amax(-1)


def moving_sum_case(generator, B=2, N=500, C=37):
    x = (torch.randn(B, N, C, generator=generator) * 10).bfloat16()
    w, _ = _windows(x.double().transpose(1, 2), -7, 0)
    return dict(x=x), torch.nan_to_num(w).sum(-1).transpose(1, 2)


def centred_case(generator, B=3, N=700):
    x = torch.randn(B, N, generator=generator) * 10
    w, at = _windows(x.double(), -3, 3)
    near = 4.0 - (torch.arange(N)[:, None] - at).abs().double()
    return dict(x=x), (torch.nan_to_num(w) * near).sum(-1)


def lagged_case(generator, B=2, N=400):
    x = torch.randn(B, N, generator=generator) * 100
    w, _ = _windows(x.double(), -5, -2)
    highest = torch.finfo(torch.float32).max   # min's identity: what the CPU target gives too
    return dict(x=x), torch.nan_to_num(w, nan=torch.inf).amin(-1).clamp(max=highest)


CASES = {"rolling_max": (rolling_max, rolling_max_case),
         "moving_sum": (moving_sum, moving_sum_case),
         "centred_weighted": (centred_weighted, centred_case),
         "lagged_band_min": (lagged_band_min, lagged_case)}


def _compiled(name, kernel):
    from tests.schedule_templates.staged_floor import interpreted

    made = tf.compile(kernel, target="cuda:sm_90a")
    assert "as a window axis" in made.describe_plan(**dict.fromkeys(
        kernel.program.dim_names(), 1000)), name
    return interpreted(kernel)


if __name__ == "__main__":
    poisoned_main(CASES, _compiled)
