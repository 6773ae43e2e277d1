"""Scans as a user writes them — a reduction over the positions up to each output's own
(``T.sum(T.where(j <= i, x[b, j], 0.0), over=j)``): a cumulative sum along rows and along one
long sequence (its rows cut into parts), a running maximum down the sequence axis of ``[B, S,
D]``, a log-cumulative-sum-exp, a segment's offsets from its lengths (an exclusive integer
prefix sum), a sum to the end (rewards-to-go) and discounted returns (γ^(j − i) a term; torch
has no such scan: its alternative is a product with the triangular matrix of the discounts,
made once) — through ``tf.compile`` defaults (the scan template,
:mod:`tensorfuse.schedule_templates.scan`) against torch eager (``cumsum``, ``cummax``,
``logcumsumexp``) and ``torch.compile`` in the same process; and a rolling maximum
over the last 64 positions and a moving average of the last 100, written as bands
(:mod:`tensorfuse.schedule_templates.bands`), against ``F.max_pool1d`` and ``F.avg_pool1d`` of
stride 1; a summed-area table over two axes (nested scans) against two ``cumsum`` calls; and
chains scanned together — a log-normaliser written out (a running maximum, then exponentials
relative to it) against ``x − logcumsumexp(x)``, a running standard deviation (two sums); a
gated linear recurrence written as its sum (a decay varying along the sequence) and Mamba's
selective scan (its states summed against C in the scan's tile) against ``exp(c)·cumsum(exp(−c)
·u)`` —
each checked against a float64 reference first (the
harness of :mod:`benchmarks.user_kernels`).

    python -m benchmarks.scan_kernels [--only NAME,…]

Rows: ``benchmark`` = ``user/<name>``; GB/s of the input read and the output written; CSV
``benchmarks/results/<date>-<device>-scan-kernels.csv``.
"""
import torch
import torch.nn.functional as F

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.kernel_suite import Case, main, rows_case


@tf.kernel
def cumulative_sum(x: T.Tensor["B", "N", "bf16"]):
    """``torch.cumsum(x, -1)``: each position's sum of the row up to it (in f32, stored bf16)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.cast(T.sum(T.where(j <= i, x[b, j], 0.0), over=j), "bf16")


@tf.kernel
def long_cumulative_sum(x: T.Tensor["N", "f32"]):
    """A cumulative sum of one long sequence: no rows to spread over the GPU."""
    j = T.axis("j", "N")
    i = T.axis("i", "N")
    return T.sum(T.where(j <= i, x[j], 0.0), over=j)


@tf.kernel
def running_max(x: T.Tensor["B", "S", "D", "f32"]):
    """``torch.cummax(x, 1).values``: each feature's largest value so far along the sequence,
    which is not the innermost axis."""
    b = T.axis("b", "B")
    t = T.axis("t", "S")   # declared before d: the output is [B, S, D]
    s, d = T.axes("s d")
    return T.max(T.where(s <= t, x[b, s, d], -T.inf), over=s)


@tf.kernel
def log_cumulative_sum_exp(x: T.Tensor["B", "N", "f32"]):
    """``torch.logcumsumexp(x, -1)``."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.logsumexp(T.where(j <= i, x[b, j], -T.inf), over=j)


@tf.kernel
def segment_offsets(lengths: T.Tensor["G", "i32"]):
    """Where each segment starts in a packed batch: the sum of the lengths before it."""
    g = T.axis("g", "G")
    h = T.axis("h", "G")
    return T.sum(T.where(g < h, lengths[g], 0), over=g)


@tf.kernel
def sum_to_the_end(r: T.Tensor["B", "N", "f32"]):
    """Rewards-to-go: each step's sum of the rewards from it to the episode's end."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j >= i, r[b, j], 0.0), over=j)


@tf.kernel
def rolling_max_64(x: T.Tensor["B", "N", "f32"]):
    """The largest of the last 64 values (fewer at the row's start): a band of positions."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.max(T.where((j <= i) & (j > i - 64), x[b, j], -T.inf), over=j)


@tf.kernel
def discounted_returns(r: T.Tensor["B", "N", "f32"], gamma: T.f32):
    """Each step's return, ``G_t = r_t + γ·G_{t+1}``, written as its sum: γ^(j − i)·r[b, j]
    over j from i on (a scan of decay and sum pairs)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j >= i, gamma ** (j - i) * r[b, j], 0.0), over=j)


@tf.kernel
def moving_average_100(x: T.Tensor["B", "N", "f32"]):
    """The mean of the last 100 values (fewer at the row's start, still divided by 100)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where((j <= i) & (j > i - 100), x[b, j], 0.0), over=j) / 100.0


@tf.kernel
def integral_image(x: T.Tensor["B", "H", "W", "f32"]):
    """A summed-area table: each pixel the sum of the rectangle from the origin to it (a scan
    along the rows, then one down them: :mod:`tensorfuse.schedule_templates.nested_scans`)."""
    b, j, l = T.axes("b j l")
    i, k = T.axis("i", "H"), T.axis("k", "W")
    return T.sum(T.where((j <= i) & (l <= k), x[b, j, l], 0.0), over=(j, l))


@tf.kernel
def causal_log_normaliser(x: T.Tensor["B", "N", "f32"]):
    """``x_i − log Σ_{j ≤ i} exp(x_j)``, the log-sum-exp written out (its maximum first)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    m = T.max(T.where(j <= i, x[b, j], -T.inf), over=j)
    s = T.sum(T.where(j <= i, T.exp(x[b, j] - m), 0.0), over=j)
    return x[b, i] - m - T.log(s)


@tf.kernel
def running_std(x: T.Tensor["B", "N", "f32"]):
    """The standard deviation of the positions up to each: two sums scanned together."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    s1 = T.sum(T.where(j <= i, x[b, j], 0.0), over=j)
    s2 = T.sum(T.where(j <= i, x[b, j] * x[b, j], 0.0), over=j)
    n = T.cast(i + 1, "f32")
    return T.sqrt(T.maximum(s2 / n - (s1 / n) * (s1 / n), 0.0))


@tf.kernel
def gated_recurrence(c: T.Tensor["B", "L", "D", "f32"], u: T.Tensor["B", "L", "D", "f32"]):
    """A gated linear recurrence ``h_i = a_i·h_{i−1} + u_i`` (minGRU's, an SSM's with a scalar
    state) written as its sum, ``c`` the running sum of ``log a``: ``Σ_{j ≤ i} exp(c_i − c_j)·u_j``
    — a discounted scan whose decay varies along the sequence."""
    b = T.axis("b", "B")
    i = T.axis("i", "L")   # declared before d: the output is [B, L, D]
    j, d = T.axes("j d")
    return T.sum(T.where(j <= i, T.exp(c[b, i, d] - c[b, j, d]) * u[b, j, d], 0.0), over=j)


@tf.kernel
def selective_scan(c: T.Tensor["B", "L", "D", "f32"], dx: T.Tensor["B", "L", "D", "f32"],
                   bm: T.Tensor["B", "L", "N", "f32"], cm: T.Tensor["B", "L", "N", "f32"]):
    """Mamba's selective scan: each channel's state of N, decayed by ``exp(c_i − c_j)`` (``c``
    the running sum of Δ·A), fed by ``Δ·x·B`` and read by ``C``: ``y[b, i, d] = Σ_n C[b, i, n]
    · h[b, i, d, n]``."""
    b = T.axis("b", "B")
    i = T.axis("i", "L")   # declared before d, n: the state is [B, L, D, N]
    d, n, j = T.axes("d n j")
    h = T.sum(T.where(j <= i, T.exp(c[b, i, d] - c[b, j, d]) * dx[b, j, d] * bm[b, j, n], 0.0),
              over=j)
    return T.sum(cm[b, i, n] * h, over=n)


def _cumsum_case(generator, B=256, N=32768) -> Case:
    x = torch.randn(B, N, generator=generator).to("cuda", torch.bfloat16)
    return rows_case("cumulative_sum", cumulative_sum, lambda t: torch.cumsum(t, -1), x, {},
                     f"B{B} N{N} bf16")


def _long_case(generator, N=2**26) -> Case:
    x = torch.randn(N, generator=generator).cuda()
    return rows_case("long_cumulative_sum", long_cumulative_sum, lambda t: torch.cumsum(t, 0),
                     x, {}, f"N{N} f32")


def _running_max_case(generator, B=16, S=4096, D=1024) -> Case:
    x = torch.randn(B, S, D, generator=generator).cuda()
    return rows_case("running_max", running_max, lambda t: torch.cummax(t, 1).values, x, {},
                     f"B{B} S{S} D{D} f32 (over S)")


def _logcumsumexp_case(generator, B=64, N=16384) -> Case:
    x = 4 * torch.randn(B, N, generator=generator).cuda()
    return rows_case("log_cumulative_sum_exp", log_cumulative_sum_exp,
                     lambda t: torch.logcumsumexp(t, -1), x, {}, f"B{B} N{N} f32")


def _offsets_case(generator, G=2**22) -> Case:
    # lengths below 512: the offsets (≤ 2.1e9) stay within int32, as the kernel's sum does
    lengths = torch.randint(1, 512, (G,), generator=generator, dtype=torch.int32).cuda()
    return rows_case("segment_offsets", segment_offsets,
                     lambda t: (torch.cumsum(t, 0) - t).to(t.dtype), lengths, {},
                     f"G{G} i32 (exclusive)")


def _to_the_end_case(generator, B=1024, N=4096) -> Case:
    r = torch.randn(B, N, generator=generator).cuda()
    return rows_case("sum_to_the_end", sum_to_the_end,
                     lambda t: torch.flip(torch.cumsum(torch.flip(t, (-1,)), -1), (-1,)), r, {},
                     f"B{B} N{N} f32 (suffix)")


def _rolling_max_case(generator, B=64, N=65536) -> Case:
    x = torch.randn(B, N, generator=generator).cuda()

    def eager(t):
        return F.max_pool1d(F.pad(t[:, None], (63, 0), value=-torch.inf), 64, 1)[:, 0]
    return rows_case("rolling_max_64", rolling_max_64, eager, x, {}, f"B{B} N{N} f32 window 64")


def _discounted_case(generator, B=1024, N=4096) -> Case:
    r = torch.randn(B, N, generator=generator).cuda()

    made = {}

    def eager(t, gamma):   # torch has no discounted scan: the triangular matrix of γ^(j − i)
        key = (t.shape[-1], t.dtype, gamma)
        if key not in made:   # made once, not timed
            steps = torch.arange(t.shape[-1], device=t.device, dtype=t.dtype)
            power = (steps[None, :] - steps[:, None]).clamp(min=0)
            made[key] = torch.where(steps[None, :] >= steps[:, None], gamma ** power, 0.0).T
        return t @ made[key]
    return rows_case("discounted_returns", discounted_returns, eager, r, dict(gamma=0.99),
                     f"B{B} N{N} f32 gamma 0.99")


def _moving_average_case(generator, B=64, N=65536) -> Case:
    x = torch.randn(B, N, generator=generator).cuda()

    def eager(t):   # zeros before the row's start count: divided by 100 throughout
        return F.avg_pool1d(F.pad(t[:, None], (99, 0)), 100, 1)[:, 0]
    return rows_case("moving_average_100", moving_average_100, eager, x, {},
                     f"B{B} N{N} f32 window 100")


def _integral_image_case(generator, B=16, H=1024, W=1024) -> Case:
    x = torch.randn(B, H, W, generator=generator).cuda()
    return rows_case("integral_image", integral_image, lambda t: t.cumsum(1).cumsum(2), x, {},
                     f"B{B} H{H} W{W} f32")


def _causal_normaliser_case(generator, B=64, N=16384) -> Case:
    """The log-normaliser written out (a running maximum, then exponentials relative to it:
    the chain's states scanned together, :mod:`tensorfuse.schedule_templates.chain_scans`)."""
    x = 4 * torch.randn(B, N, generator=generator).cuda()
    return rows_case("causal_log_normaliser", causal_log_normaliser,
                     lambda t: t - torch.logcumsumexp(t, -1), x, {}, f"B{B} N{N} f32")


def _running_std_case(generator, B=64, N=16384) -> Case:
    """Two sums up to each position (of x and x²) in one pass."""
    x = torch.randn(B, N, generator=generator).cuda() + 1

    def eager(t):
        n = torch.arange(1, t.shape[-1] + 1, device=t.device, dtype=t.dtype)
        mean, square = t.cumsum(-1) / n, (t * t).cumsum(-1) / n
        return (square - mean * mean).clamp(min=0).sqrt()
    return rows_case("running_std", running_std, eager, x, {}, f"B{B} N{N} f32")


def _gated_recurrence_case(generator, B=8, L=4096, D=1024) -> Case:
    """Gates ``a`` in [0.99, 1) (``c`` down to −41: torch's form, ``exp(c)·cumsum(exp(−c)·u)``,
    stays finite in f32 — it overflows past that, where the scan's per-step decays do not)."""
    a = 0.99 + 0.01 * torch.rand(B, L, D, generator=generator)
    c = torch.log(a).cumsum(1).cuda()
    u = torch.randn(B, L, D, generator=generator).cuda()

    def eager(c, u):
        return torch.exp(c) * torch.cumsum(torch.exp(-c) * u, 1)
    return rows_case("gated_recurrence", gated_recurrence, eager, c, {"u": u},
                     f"B{B} L{L} D{D} f32 (over L)")


def _selective_scan_case(generator, B=2, L=4096, D=1536, N=16) -> Case:
    """Mamba-130m's widths; decays in [0.99, 1) a step (torch's form, ``exp(c)·cumsum(exp(−c)
    ·…)`` over the [B, L, D, N] states, stays finite in f32 there)."""
    c = torch.log(0.99 + 0.01 * torch.rand(B, L, D, generator=generator)).cumsum(1).cuda()
    dx = torch.randn(B, L, D, generator=generator).cuda()
    bm, cm = (torch.randn(B, L, N, generator=generator).cuda() for _ in range(2))

    def eager(c, dx, bm, cm):
        h = torch.exp(c)[..., None] * torch.cumsum((torch.exp(-c) * dx)[..., None] *
                                                   bm[:, :, None, :], 1)
        return (cm[:, :, None, :] * h).sum(-1)
    return rows_case("selective_scan", selective_scan, eager, c,
                     {"dx": dx, "bm": bm, "cm": cm}, f"B{B} L{L} D{D} N{N} f32")


SCAN_KERNELS = {"cumulative_sum": _cumsum_case, "long_cumulative_sum": _long_case,
                "running_max": _running_max_case, "log_cumulative_sum_exp": _logcumsumexp_case,
                "segment_offsets": _offsets_case, "sum_to_the_end": _to_the_end_case,
                "rolling_max_64": _rolling_max_case, "moving_average_100": _moving_average_case,
                "discounted_returns": _discounted_case, "integral_image": _integral_image_case,
                "causal_log_normaliser": _causal_normaliser_case,
                "running_std": _running_std_case, "gated_recurrence": _gated_recurrence_case,
                "selective_scan": _selective_scan_case}

if __name__ == "__main__":
    main(SCAN_KERNELS, "scan-kernels", __doc__)
