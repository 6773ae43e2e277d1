"""Reductions over a band of positions around each output's own (a rolling maximum along a row
and down a sequence, a trailing moving sum, a centred window weighted by distance, a band that
ends before the position, a moving average of 100, a rolling log-sum-exp, a centred arg-maximum
with ties, a band under a lengths condition, a rolling mean and the standard deviation about
it), as ``tf.compile`` makes them for sm_90a — two scans of segments of the band's width (the
band template, along a row or down a middle axis); with terms that read the position, or
several reductions over one band, rewritten over a window axis of the band's width
(``TEMPLATES`` says which) —,
run by Triton's interpreter against torch in float64, outputs poisoned; prints each case's
relative error as JSON.

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
def rolling_max_over_time(x: T.Tensor["B", "S", "C", "f32"]):
    """Each channel's largest of the last 50 steps of [B, S, C]: the band down the middle axis,
    the channels side by side."""
    b = T.axis("b", "B")
    i = T.axis("i", "S")
    j, c = T.axes("j c")
    return T.max(T.where((j <= i) & (j > i - 50), x[b, j, c], -T.inf), over=j)


@tf.kernel
def over_time_within_lengths(x: T.Tensor["B", "S", "C", "f32"], lengths: T.Tensor["B", "i32"]):
    """The sum of the last 30 steps of each channel within each sequence's first lengths[b]:
    a band down the middle axis under a condition on the outer rows alone."""
    b = T.axis("b", "B")
    i = T.axis("i", "S")
    j, c = T.axes("j c")
    return T.sum(T.where((j <= i) & (j > i - 30) & (j < lengths[b]), x[b, j, c], 0.0), over=j)


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


@tf.kernel
def moving_average(x: T.Tensor["B", "N", "bf16"]):
    """The mean of the last 100 values (a width that is no power of two; fewer at the start,
    still divided by 100), stored bf16."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.cast(T.sum(T.where((j <= i) & (j > i - 100), x[b, j], 0.0), over=j) / 100.0, "bf16")


@tf.kernel
def rolling_logsumexp(x: T.Tensor["B", "N", "f32"]):
    """log Σ exp over the 37 positions from 30 back to 6 on: a band around the position."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.logsumexp(T.where((j >= i - 30) & (j <= i + 6), x[b, j], -T.inf), over=j)


@tf.kernel
def centred_argmax(x: T.Tensor["B", "N", "f32"]):
    """Where the largest of the 9 values around each position is (ties to the first)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.argmax(T.where((j >= i - 4) & (j <= i + 4), x[b, j], -T.inf), over=j)


@tf.kernel
def band_within_lengths(x: T.Tensor["B", "N", "f32"], lengths: T.Tensor["B", "i32"]):
    """The sum of the last 20 values of each row's first ``lengths[b]`` (a further condition)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where((j <= i) & (j > i - 20) & (j < lengths[b]), x[b, j], 0.0), over=j)


@tf.kernel
def rolling_mean_and_std(x: T.Tensor["B", "N", "f32"]):
    """The mean of the last 20 values and the standard deviation about it (Bollinger bands;
    zeros before the row's start count): two reductions over one band, the second reading the
    first."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    band = (j <= i) & (j > i - 20)
    mean = T.sum(T.where(band, x[b, j], 0.0), over=j) / 20.0
    var = T.sum(T.where(band, (x[b, j] - mean) ** 2, 0.0), over=j) / 20.0
    return mean, T.sqrt(var)


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


def rolling_max_over_time_case(generator, B=2, S=700, C=70):
    x = torch.randn(B, S, C, generator=generator) * 100
    w, _ = _windows(x.double().transpose(1, 2), -49, 0)
    return dict(x=x), torch.nan_to_num(w, nan=-torch.inf).amax(-1).transpose(1, 2)


def over_time_within_lengths_case(generator, B=3, S=500, C=45):
    x = torch.randn(B, S, C, generator=generator) * 10
    lengths = torch.randint(0, S + 1, (B,), generator=generator, dtype=torch.int32)
    w, at = _windows(x.double().transpose(1, 2), -29, 0)             # [B, C, S, 30]
    w = torch.where(at[None, None] < lengths[:, None, None, None], w, torch.nan)
    return dict(x=x, lengths=lengths), torch.nan_to_num(w).sum(-1).transpose(1, 2)


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


def moving_average_case(generator, B=3, N=2500):
    x = (torch.randn(B, N, generator=generator) * 10).bfloat16()
    w, _ = _windows(x.double(), -99, 0)
    return dict(x=x), torch.nan_to_num(w).sum(-1) / 100


def rolling_logsumexp_case(generator, B=2, N=1500):
    x = torch.randn(B, N, generator=generator) * 30
    w, _ = _windows(x.double(), -30, 6)
    return dict(x=x), torch.logsumexp(torch.nan_to_num(w, nan=-torch.inf), -1)


def centred_argmax_case(generator, B=2, N=3000):
    x = torch.randint(-40, 40, (B, N), generator=generator).float()   # ties in every window
    w, at = _windows(x.double(), -4, 4)
    first = torch.nan_to_num(w, nan=-torch.inf).argmax(-1)   # torch: the first of ties
    return dict(x=x), at[torch.arange(N)[None, :], first].double()


def band_within_lengths_case(generator, B=4, N=1100):
    x = torch.randn(B, N, generator=generator) * 10
    lengths = torch.randint(0, N + 1, (B,), generator=generator, dtype=torch.int32)
    w, at = _windows(x.double(), -19, 0)
    w = torch.where(at[None] < lengths[:, None, None], w, torch.nan)
    return dict(x=x, lengths=lengths), torch.nan_to_num(w).sum(-1)


def rolling_mean_and_std_case(generator, B=3, N=1200):
    x = torch.randn(B, N, generator=generator) * 10 + 100   # far from zero: centring matters
    w, _ = _windows(x.double(), -19, 0)
    mean = torch.nan_to_num(w).sum(-1) / 20
    var = torch.where(w.isnan(), 0.0, (w - mean[..., None]) ** 2).sum(-1) / 20
    return dict(x=x), (mean, var.sqrt())


CASES = {"rolling_max": (rolling_max, rolling_max_case),
         "moving_sum": (moving_sum, moving_sum_case),
         "rolling_max_over_time": (rolling_max_over_time, rolling_max_over_time_case),
         "over_time_within_lengths": (over_time_within_lengths, over_time_within_lengths_case),
         "centred_weighted": (centred_weighted, centred_case),
         "lagged_band_min": (lagged_band_min, lagged_case),
         "moving_average": (moving_average, moving_average_case),
         "rolling_logsumexp": (rolling_logsumexp, rolling_logsumexp_case),
         "centred_argmax": (centred_argmax, centred_argmax_case),
         "band_within_lengths": (band_within_lengths, band_within_lengths_case),
         "rolling_mean_and_std": (rolling_mean_and_std, rolling_mean_and_std_case)}
# the template each takes on the GPU: a band is the band template's (along a row, or down a middle
# axis with the rows side by side); with terms that read the position, or several reductions over
# one band, a window axis for the row template
WINDOW_AXIS = ("centred_weighted", "rolling_mean_and_std")
TEMPLATES = {name: "as a window axis" if name in WINDOW_AXIS else "band template"
             for name in CASES}


def _compiled(name, kernel):
    from tests.schedule_templates.staged_floor import interpreted

    made = tf.compile(kernel, target="cuda:sm_90a")
    assert TEMPLATES[name] in made.describe_plan(**dict.fromkeys(
        kernel.program.dim_names(), 1000)), name
    return interpreted(kernel)


if __name__ == "__main__":
    poisoned_main(CASES, _compiled)
