"""Scans written as reductions up to each output's position (the kernels of
:mod:`benchmarks.scan_kernels` and more: an epilogue that reads the position, a condition beside
the position's, the mask written as a 0/1 factor, a product, a long row cut into parts, a scan
stage before the row template's), as
``tf.compile`` makes them for sm_90a, run by Triton's interpreter against torch in float64,
outputs poisoned; prints each case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.scan_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.scan_kernels import (cumulative_sum, gated_recurrence, log_cumulative_sum_exp,
                                     long_cumulative_sum, running_max, segment_offsets,
                                     selective_scan, sum_to_the_end)
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


@tf.kernel
def running_mean(x: T.Tensor["B", "N", "f32"]):
    """The mean of each row so far: the epilogue reads the position."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j <= i, x[b, j], 0.0), over=j) / (i + 1)


@tf.kernel
def cumulative_sum_within_lengths(x: T.Tensor["B", "N", "f32"], n: T.Tensor["B", "i32"]):
    """A cumulative sum of each row's first ``n[b]`` values (the padding after them adds
    nothing), the mask written as a 0/1 factor."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(x[b, j] * T.where((j <= i) & (j < n[b]), 1.0, 0.0), over=j)


@tf.kernel
def discounted_returns(r: T.Tensor["B", "N", "f32"], gamma: T.f32):
    """Each step's return: its reward and the later ones discounted by ``gamma`` a step
    (``G_t = r_t + γ·G_{t+1}``), the discount a power of the distance."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j >= i, gamma ** (j - i) * r[b, j], 0.0), over=j)


@tf.kernel
def moving_average_exponential(x: T.Tensor["B", "N", "bf16"], alpha: T.f32):
    """An exponential moving average, ``y_i = α·x_i + (1 − α)·y_{i−1}``, written as its sum."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j <= i, alpha * (1.0 - alpha) ** (i - j) * x[b, j], 0.0), over=j)


@tf.kernel
def decayed_within_lengths(x: T.Tensor["B", "N", "f32"], n: T.Tensor["B", "i32"], tau: T.f32):
    """A leaky sum of each row's first ``n[b]`` inputs, discounted by exp(−(i − j)/τ): past
    them it adds nothing but still decays."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where((j <= i) & (j < n[b]), T.exp(-T.cast(i - j, "f32") / tau) * x[b, j],
                         0.0), over=j)


@tf.kernel
def long_leaky_sum(x: T.Tensor["N", "f32"]):
    """A leaky integrator over one long sequence (its rows cut into parts, whose totals
    compose in order): exp(−0.001·(i − j)) a term."""
    j = T.axis("j", "N")
    i = T.axis("i", "N")
    return T.sum(T.where(j <= i, T.exp(-0.001 * (i - j)) * x[j], 0.0), over=j)


@tf.kernel
def sum_up_to_two_ahead(x: T.Tensor["B", "N", "f32"]):
    """Each position's sum up to two positions past it: the row's first two terms are in no
    output's sweep and start the first part's carry (found by ``band_fuzz_check``: they were
    missing)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j <= i + 2, x[b, j], 0.0), over=j)


@tf.kernel
def long_max_from_five_back(x: T.Tensor["N", "f32"]):
    """Each position's maximum from five positions before it to the end of one long row (cut
    into parts: the row's last five terms start the last part's carry)."""
    j = T.axis("j", "N")
    i = T.axis("i", "N")
    return T.max(T.where(j >= i - 5, x[j], -T.inf), over=j)


@tf.kernel
def survival(p: T.Tensor["B", "N", "f32"]):
    """The probability of surviving every step so far: a cumulative product."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.prod(T.where(j <= i, 1.0 - p[b, j], 1.0), over=j)


@tf.kernel
def lagged_maximum(x: T.Tensor["B", "N", "f32"]):
    """The largest value up to two positions back (the offset on the other side of the
    comparison): −∞'s stand-in, the lowest float, where there is none."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.max(T.where(j + 2 <= i, x[b, j], -T.inf), over=j)


@tf.kernel
def running_argmax(x: T.Tensor["B", "N", "f32"]):
    """Where each row's largest value so far is (ties to the first): an arg reduction's value
    and index scanned together."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.argmax(T.where(j <= i, x[b, j], -T.inf), over=j)


@tf.kernel
def max_drawdown(x: T.Tensor["B", "N", "f32"]):
    """The largest fall from a running peak: a scan, then a reduction of it (two stages)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    peak = T.max(T.where(j <= i, x[b, j], -T.inf), over=j)
    return T.max(peak - x[b, i], over=i)


@tf.kernel
def softmax_of_cumulative_sums(x: T.Tensor["B", "N", "f32"]):
    """A softmax over a row's cumulative sums: a scan, then the row template."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    c = T.sum(T.where(j <= i, x[b, j], 0.0), over=j)
    m = T.max(c, over=i)
    e = T.exp(c - m)
    return e / T.sum(e, over=i)


def cumsum_case(generator, B=3, N=1000):
    x = (torch.randn(B, N, generator=generator) * 10).bfloat16()
    return dict(x=x), torch.cumsum(x.double(), -1)


def long_case(generator, N=150001):   # cut into parts: their totals start the later ones
    x = torch.randn(N, generator=generator) * 100 + 3
    return dict(x=x), torch.cumsum(x.double(), 0)


def running_max_case(generator, B=2, S=333, D=45):
    x = torch.randn(B, S, D, generator=generator) * 1e3
    return dict(x=x), torch.cummax(x.double(), 1).values


def logcumsumexp_case(generator, B=3, N=2777):   # several blocks: the carry is read
    x = torch.randn(B, N, generator=generator) * 30
    return dict(x=x), torch.logcumsumexp(x.double(), -1)


def offsets_case(generator, G=5000):
    lengths = torch.randint(0, 10**5, (G,), generator=generator, dtype=torch.int32)
    return dict(lengths=lengths), (torch.cumsum(lengths.double(), 0) - lengths.double())


def to_the_end_case(generator, B=4, N=2999):   # several blocks: r is read in each
    r = torch.randn(B, N, generator=generator) * 50
    return dict(r=r), torch.flip(torch.cumsum(torch.flip(r.double(), (-1,)), -1), (-1,))


def running_mean_case(generator, B=3, N=500):
    x = torch.randn(B, N, generator=generator) * 7 + 2
    return dict(x=x), torch.cumsum(x.double(), -1) / torch.arange(1, N + 1)


def lengths_case(generator, B=4, N=600):
    x = torch.randn(B, N, generator=generator) * 10
    n = torch.randint(0, N + 1, (B,), generator=generator, dtype=torch.int32)
    kept = x.double() * (torch.arange(N)[None, :] < n[:, None])
    return dict(x=x, n=n), torch.cumsum(kept, -1)


def survival_case(generator, B=3, N=400):
    p = torch.rand(B, N, generator=generator) * 0.02
    return dict(p=p), torch.cumprod(1 - p.double(), -1)


def lagged_case(generator, B=2, N=700):
    x = torch.randn(B, N, generator=generator) * 100
    lowest = torch.finfo(torch.float32).min   # max's identity: what the CPU target gives too
    lagged = torch.full_like(x, lowest).double()
    lagged[:, 2:] = torch.cummax(x.double(), -1).values[:, :-2]
    return dict(x=x), lagged


def running_argmax_case(generator, B=2, N=12000):   # cut into parts: totals of two components
    x = torch.randint(-5000, 5000, (B, N), generator=generator).float()   # ties in every row
    first = torch.empty(B, N, dtype=torch.float64)
    for b, row in enumerate(x.tolist()):   # the first position of each running maximum
        best = 0
        for i, value in enumerate(row):
            best = i if value > row[best] else best
            first[b, i] = best
    return dict(x=x), first


def drawdown_case(generator, B=3, N=2000):
    x = torch.cumsum(torch.randn(B, N, generator=generator), -1)   # a random walk
    return dict(x=x), (torch.cummax(x.double(), -1).values - x.double()).max(-1).values


def _discounted(x, factor, reverse: bool):
    """Σ factor^|i − j|·x[j] over j from i on (``reverse``) or up to i, in float64, by the
    recurrence."""
    x = x.double()
    out = torch.empty_like(x)
    acc = torch.zeros(x.shape[:-1], dtype=torch.float64)
    steps = range(x.shape[-1] - 1, -1, -1) if reverse else range(x.shape[-1])
    for t in steps:
        acc = x[..., t] + factor * acc
        out[..., t] = acc
    return out


def discounted_case(generator, B=3, N=2500):
    r = torch.randn(B, N, generator=generator) * 10
    return dict(r=r, gamma=0.99), _discounted(r, 0.99, True)


def exponential_average_case(generator, B=4, N=3000):
    x = (torch.randn(B, N, generator=generator) * 5 + 20).bfloat16()
    return dict(x=x, alpha=0.05), 0.05 * _discounted(x, 0.95, False)


def lengths_decay_case(generator, B=4, N=2100):
    x = torch.randn(B, N, generator=generator) * 10
    n = torch.randint(0, N + 1, (B,), generator=generator, dtype=torch.int32)
    kept = torch.where(torch.arange(N)[None] < n[:, None].long(), x.double(), 0.0)
    return dict(x=x, n=n, tau=300.0), _discounted(kept, float(torch.exp(torch.tensor(
        -1 / 300.0, dtype=torch.float64))), False)


def leaky_case(generator, N=150_000):
    x = torch.randn(N, generator=generator)
    return dict(x=x), _discounted(x, float(torch.exp(torch.tensor(-0.001, dtype=torch.float64))),
                                  False)


def ahead_case(generator, B=3, N=2500):
    x = torch.randn(B, N, generator=generator) * 10
    c = torch.cumsum(x.double(), -1)
    return dict(x=x), torch.cat([c[:, 2:], c[:, -1:].expand(B, 2)], -1)


def from_five_back_case(generator, N=150_001):
    x = torch.randn(N, generator=generator) * 10
    m = torch.flip(torch.cummax(torch.flip(x.double(), (0,)), 0).values, (0,))
    return dict(x=x), torch.cat([m[:1].expand(5), m[:-5]])


@tf.kernel
def cumulative_sum_f64(x: T.Tensor["B", "N", "f64"]):
    """A cumulative sum in float64: loaded, carried and stored in float64."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j <= i, x[b, j], 0.0), over=j)


def cumsum_f64_case(generator, B=3, N=2500):
    x = torch.randn(B, N, generator=generator, dtype=torch.float64) * 1e3 + 1e-3
    return dict(x=x), torch.cumsum(x, -1)


def softmax_of_sums_case(generator, B=3, N=900):
    x = torch.randn(B, N, generator=generator) * 0.3
    return dict(x=x), torch.softmax(torch.cumsum(x.double(), -1), -1)


@tf.kernel
def linear_recurrence(log_a: T.Tensor["B", "L", "D", "f32"], u: T.Tensor["B", "L", "D", "f32"]):
    """The gated recurrence from its gates' logarithms: their running sums (scans), then the
    sum decayed by their differences (a scan whose decay varies) — three stages."""
    b = T.axis("b", "B")
    i = T.axis("i", "L")
    k, j, d = T.axes("k j d")
    c = T.sum(T.where(k <= i, log_a[b, k, d], 0.0), over=k)
    cj = T.sum(T.where(k <= j, log_a[b, k, d], 0.0), over=k)
    return T.sum(T.where(j <= i, T.exp(c - cj) * u[b, j, d], 0.0), over=j)


@tf.kernel
def gated_suffix(g: T.Tensor["B", "L", "f32"], c: T.Tensor["B", "L", "f32"],
                 u: T.Tensor["B", "L", "f32"]):
    """From each position to the end, ``Σ_{j ≥ i} exp(g_i − c_j)·u_j``: a suffix whose decay
    varies, its scale at the output ``exp(g_i − c_i)``."""
    b, j = T.axes("b j")
    i = T.axis("i", "L")
    return T.sum(T.where(j >= i, T.exp(g[b, i] - c[b, j]) * u[b, j], 0.0), over=j)


@tf.kernel
def gated_within_lengths(c: T.Tensor["B", "L", "f32"], u: T.Tensor["B", "L", "f32"],
                         n: T.Tensor["B", "i32"]):
    """The gated recurrence of each row's first ``n[b]`` inputs: past them it still decays."""
    b, j = T.axes("b j")
    i = T.axis("i", "L")
    return T.sum(T.where((j <= i) & (j < n[b]), T.exp(c[b, i] - c[b, j]) * u[b, j], 0.0),
                 over=j)


@tf.kernel
def ew_variance(x: T.Tensor["B", "N", "f32"], alpha: T.f32):
    """An exponentially weighted variance, ``E_w[x²] − E_w[x]²``: two sums discounted alike,
    each a scan of its own (a stage each)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    w = alpha * (1.0 - alpha) ** (i - j)
    m1 = T.sum(T.where(j <= i, w * x[b, j], 0.0), over=j)
    m2 = T.sum(T.where(j <= i, w * x[b, j] * x[b, j], 0.0), over=j)
    return m2 - m1 * m1


def _gates(generator, shape):
    """log a for gates a in [0.5, 1): running sums down to ~−0.3 a step."""
    return torch.log(0.5 + 0.5 * torch.rand(shape, generator=generator, dtype=torch.float64))


def gated_recurrence_case(generator, B=2, L=700, D=37):
    log_a = _gates(generator, (B, L, D))
    u = torch.randn(B, L, D, generator=generator, dtype=torch.float64)
    h, out = torch.zeros(B, D, dtype=torch.float64), []
    for t in range(L):   # the recurrence itself, step by step
        h = log_a[:, t].exp() * h + u[:, t]
        out.append(h)
    return log_a, u, torch.stack(out, 1)


def gated_case(generator):
    log_a, u, want = gated_recurrence_case(generator)
    return dict(c=log_a.cumsum(1).float(), u=u.float()), want


def linear_recurrence_case(generator):
    log_a, u, want = gated_recurrence_case(generator, L=300)
    return dict(log_a=log_a.float(), u=u.float()), want


def gated_suffix_case(generator, B=3, L=600):
    """``c`` a decreasing running sum, ``g`` near it: the suffix's terms decay from each
    position on."""
    c = -_gates(generator, (B, L)).cumsum(1)
    g = c + 0.1 * torch.randn(B, L, generator=generator, dtype=torch.float64)
    u = torch.randn(B, L, generator=generator, dtype=torch.float64)
    keep = torch.arange(L)[None, :] >= torch.arange(L)[:, None]   # [i, j]: j >= i
    weights = torch.where(keep, (g[:, :, None] - c[:, None, :]).exp(), 0.0)
    return dict(g=g.float(), c=c.float(), u=u.float()), (weights @ u[:, :, None])[..., 0]


def selective_scan_case(generator, B=2, L=300, D=6, N=5):
    """A state of 5 (padded to 8 rows in the tile); checked against the recurrence itself."""
    log_a = _gates(generator, (B, L, D))
    dx = torch.randn(B, L, D, generator=generator, dtype=torch.float64)
    bm, cm = (torch.randn(B, L, N, generator=generator, dtype=torch.float64) for _ in range(2))
    h, out = torch.zeros(B, D, N, dtype=torch.float64), []
    for t in range(L):
        h = log_a[:, t, :, None].exp() * h + dx[:, t, :, None] * bm[:, t, None, :]
        out.append((h * cm[:, t, None, :]).sum(-1))
    return dict(c=log_a.cumsum(1).float(), dx=dx.float(), bm=bm.float(), cm=cm.float()), \
        torch.stack(out, 1)


def gated_lengths_case(generator, B=3, L=300):
    c = _gates(generator, (B, L)).cumsum(1)
    u = torch.randn(B, L, generator=generator, dtype=torch.float64)
    n = torch.tensor([0, L // 2, L], dtype=torch.int32)
    kept = (torch.arange(L)[None, None, :] <= torch.arange(L)[None, :, None]) & \
        (torch.arange(L)[None, None, :] < n[:, None, None].long())   # [b, i, j]
    weights = torch.where(kept, (c[:, :, None] - c[:, None, :]).exp(), 0.0)
    return dict(c=c.float(), u=u.float(), n=n), (weights @ u[:, :, None])[..., 0]


def ew_variance_case(generator, B=3, N=400, alpha=0.05):
    x = torch.randn(B, N, generator=generator, dtype=torch.float64) * 3 + 1
    steps = torch.arange(N)
    weights = torch.where(steps[:, None] >= steps[None, :],
                          alpha * (1 - alpha) ** (steps[:, None] - steps[None, :]).double(), 0.0)
    m1, m2 = x @ weights.T, (x * x) @ weights.T
    return dict(x=x.float(), alpha=alpha), m2 - m1 * m1


CASES = {"cumulative_sum": (cumulative_sum, cumsum_case),
         "long_cumulative_sum": (long_cumulative_sum, long_case),
         "running_max": (running_max, running_max_case),
         "log_cumulative_sum_exp": (log_cumulative_sum_exp, logcumsumexp_case),
         "segment_offsets": (segment_offsets, offsets_case),
         "sum_to_the_end": (sum_to_the_end, to_the_end_case),
         "running_mean": (running_mean, running_mean_case),
         "cumulative_sum_within_lengths": (cumulative_sum_within_lengths, lengths_case),
         "survival": (survival, survival_case),
         "lagged_maximum": (lagged_maximum, lagged_case),
         "running_argmax": (running_argmax, running_argmax_case),
         "max_drawdown": (max_drawdown, drawdown_case),
         "softmax_of_cumulative_sums": (softmax_of_cumulative_sums, softmax_of_sums_case),
         "discounted_returns": (discounted_returns, discounted_case),
         "moving_average_exponential": (moving_average_exponential, exponential_average_case),
         "decayed_within_lengths": (decayed_within_lengths, lengths_decay_case),
         "long_leaky_sum": (long_leaky_sum, leaky_case),
         "sum_up_to_two_ahead": (sum_up_to_two_ahead, ahead_case),
         "long_max_from_five_back": (long_max_from_five_back, from_five_back_case),
         "cumulative_sum_f64": (cumulative_sum_f64, cumsum_f64_case),
         "gated_recurrence": (gated_recurrence, gated_case),
         "linear_recurrence": (linear_recurrence, linear_recurrence_case),
         "gated_suffix": (gated_suffix, gated_suffix_case),
         "selective_scan": (selective_scan, selective_scan_case),
         "gated_within_lengths": (gated_within_lengths, gated_lengths_case),
         "ew_variance": (ew_variance, ew_variance_case)}
# stages: a scan, then the row template; the gated recurrence's running sums, then its scan;
# the weighted variance's two sums, a scan each
STAGED = ("max_drawdown", "softmax_of_cumulative_sums", "linear_recurrence", "ew_variance")
# one row cut into parts: N² terms on a CPU
LONG = ("long_cumulative_sum", "long_leaky_sum", "long_max_from_five_back")
# float32 cumulative sums exponentiated: their absolute rounding is the softmax's relative
# error — over 900 terms reaching |c| ≈ 25, about ε·√N·|c| ≈ 4.5e-5 (on the CPU target as in
# the stages: 0.2–5e-6 over 12 seeds, 1.1e-5 on one CI draw, which 1e-5 had failed)
TOLERANCES = {"softmax_of_cumulative_sums": 5e-5,
              # a decay of exp(−0.001) rounded to float32 (3e-8 relative) reaches a sum through
              # the ~1000 steps it remembers: ~3e-5 of it, however it is computed (seen: 7e-6)
              "long_leaky_sum": 1e-4, "decayed_within_lengths": 1e-4,
              # float64 throughout: a float32 load or carry anywhere shows as ~1e-8
              "cumulative_sum_f64": 1e-12,
              # f32 decays multiplied over the ~100 steps a state remembers (and the running
              # sums of log a rounded, then differenced): a few 1e-6 of the result
              "gated_recurrence": 1e-4, "linear_recurrence": 1e-4, "gated_suffix": 1e-4,
              "selective_scan": 1e-4, "gated_within_lengths": 1e-4}
# float32 sums of up to thousands of terms of ±30 against float64, relative to the largest result:
# their rounding reaches 1e-6 on some draws (a lengths-masked cumulative sum of 600: 1.0e-6)
F32 = 1e-5


def _compiled(name, kernel):
    if name in STAGED:
        return interpreted(kernel)
    made = tf.compile(kernel, target="cuda:sm_90a")
    assert made.schedule_origin().startswith("scan template"), made.schedule_origin()
    return made


if __name__ == "__main__":
    poisoned_main(CASES, _compiled)
