"""Kernels reducing with the DSL's other monoids, as a user writes them: greedy decoding's next
token (``T.argmax`` over a vocabulary, one pass: the index resets where the maximum moves), a
row's ``T.logsumexp``, a KL divergence between two distributions given as logits (two
logsumexps and a sum that reads them, one pass), the count of a row's maxima (one pass: it
resets to 0 where the maximum moves), the margin between a row's two largest logits (a user's
monoid of two components), a survival probability (``T.prod`` of
``1 − hazard``), a pose model's keypoints (``T.argmax`` over a heatmap's two axes) — through ``tf.compile`` defaults against torch eager and ``torch.compile`` in
the same process, each checked against a float64 reference first (the harness of
:mod:`benchmarks.user_kernels`).

    python -m benchmarks.monoid_kernels [--only NAME,…]

Rows: ``benchmark`` = ``user/<name>``; CSV
``benchmarks/results/<date>-<device>-monoid-kernels.csv``.
"""
import torch
import torch.nn.functional as F

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.kernel_suite import Case, main, rows_case


@tf.kernel
def greedy_token(logits: T.Tensor["B", "V", "bf16"]):
    """Greedy decoding: the first index of each row's largest logit."""
    b, v = T.axes("b v")
    return T.argmax(logits[b, v], over=v)


@tf.kernel
def row_logsumexp(x: T.Tensor["M", "V", "f32"]):
    """A row's log-partition function."""
    i, v = T.axes("i v")
    return T.logsumexp(x[i, v], over=v)


@tf.kernel
def kl_divergence(p: T.Tensor["M", "V", "bf16"], q: T.Tensor["M", "V", "bf16"]):
    """KL(softmax(p) ‖ softmax(q)) per row, written with the log-partition functions."""
    i, v = T.axes("i v")
    log_p = p[i, v] - T.logsumexp(p[i, v], over=v)
    log_q = q[i, v] - T.logsumexp(q[i, v], over=v)
    return T.sum(T.exp(log_p) * (log_p - log_q), over=v)


@tf.kernel
def maxima_count(x: T.Tensor["M", "V", "bf16"]):
    """How many logits tie for each row's largest (one pass: the count resets to 0 where the
    maximum moves)."""
    i, v = T.axes("i v")
    m = T.max(x[i, v], over=v)
    return T.sum(T.where(x[i, v] == m, 1.0, 0.0), over=v)


def _larger(a, b):
    return T.where(a > b, a, b)


# a user's monoid of two components: the two largest values seen
TOP_TWO = T.Monoid("top_two", lambda a1, a2, b1, b2: (
    _larger(a1, b1), _larger(T.where(a1 < b1, a1, b1), _larger(a2, b2))), (-T.inf, -T.inf),
    arity=2)


@tf.kernel
def top_two_margin(logits: T.Tensor["M", "V", "bf16"]):
    """How far each row's largest logit stands above its second (a confidence margin), with a
    user's monoid of two components."""
    i, v = T.axes("i v")
    best = T.reduce((logits[i, v], -T.inf), over=v, monoid=TOP_TWO)
    return best[0] - best[1]


@tf.kernel
def survival(hazard: T.Tensor["M", "N", "f32"]):
    """The probability of surviving every step: Π (1 − hazard)."""
    i, t = T.axes("i t")
    return T.prod(1.0 - hazard[i, t], over=t)


@tf.kernel
def heatmap_peak(heatmaps: T.Tensor["B", "K", "H", "W", "bf16"]):
    """A pose model's keypoints: each heatmap's peak over both of its axes, as the row-major
    index ``h · W + w``."""
    b, k, h, w = T.axes("b k h w")
    return T.argmax(heatmaps[b, k, h, w], over=(h, w))


def _exactly(want: torch.Tensor):
    """What of an output of indices the harness compares with the reference: each index as
    it is where it equals ``want``'s, far off where not — an index off by one must fail, not
    pass as a small relative error."""
    def pick(out):
        return want.double() + (out.long() != want).double() * 1e9
    return pick


def _greedy_case(B: int, generator, V=128256) -> Case:
    logits = (torch.randn(B, V, generator=generator) * 3).to("cuda", torch.bfloat16)
    want = torch.argmax(logits.double(), -1)   # the first index of the maximum
    return rows_case(f"greedy_token_b{B}", greedy_token, lambda t: torch.argmax(t, -1).int(),
                     logits, {}, f"B{B} V{V}", _exactly(want))


def _logsumexp_case(generator, M=4096, V=32000) -> Case:
    x = (torch.randn(M, V, generator=generator) * 5).cuda()
    return rows_case("row_logsumexp", row_logsumexp, lambda t: torch.logsumexp(t, -1), x, {},
                     f"M{M} V{V} f32")


def _kl_case(generator, M=4096, V=32000) -> Case:
    p, q = ((torch.randn(M, V, generator=generator) * 2).to("cuda", torch.bfloat16)
            for _ in range(2))

    def eager(a, b):
        return F.kl_div(F.log_softmax(b.float(), -1), F.log_softmax(a.float(), -1),
                        reduction="none", log_target=True).sum(-1).to(a.dtype)
    return rows_case("kl_divergence", kl_divergence, eager, p, {"q": q}, f"M{M} V{V}")


def _maxima_count_case(generator, M=4096, V=32000) -> Case:
    x = (torch.randn(M, V, generator=generator) * 2).round().to("cuda", torch.bfloat16)

    def eager(t):
        return (t == t.amax(-1, keepdim=True)).sum(-1).float()
    return rows_case("maxima_count", maxima_count, eager, x, {}, f"M{M} V{V}")


def _top_two_case(generator, M=4096, V=32000) -> Case:
    x = (torch.randn(M, V, generator=generator) * 3).to("cuda", torch.bfloat16)

    def eager(t):
        top = t.topk(2, -1).values
        return (top[:, 0].float() - top[:, 1].float()).to(t.dtype)
    return rows_case("top_two_margin", top_two_margin, eager, x, {}, f"M{M} V{V}")


def _survival_case(generator, M=65536, N=1024) -> Case:
    hazard = (torch.rand(M, N, generator=generator) * 2e-3).cuda()
    return rows_case("survival", survival, lambda h: torch.prod(1.0 - h, -1), hazard, {},
                     f"M{M} N{N} f32")


def _heatmap_case(generator, B=64, K=17, H=64, W=48) -> Case:
    """COCO's 17 keypoints on 64 × 48 heatmaps (a 256 × 192 input), a batch of 64."""
    maps = (torch.randn(B, K, H, W, generator=generator) * 3).to("cuda", torch.bfloat16)
    want = maps.double().flatten(2).argmax(-1)
    return rows_case("heatmap_peak", heatmap_peak, lambda t: t.flatten(2).argmax(-1).int(),
                     maps, {}, f"B{B} K{K} H{H} W{W}", _exactly(want))


MONOID_KERNELS = {
    "greedy_token_b1": lambda g: _greedy_case(1, g),
    "greedy_token_b64": lambda g: _greedy_case(64, g),
    "greedy_token_b512": lambda g: _greedy_case(512, g),
    "row_logsumexp": _logsumexp_case,
    "kl_divergence": _kl_case,
    "maxima_count": _maxima_count_case,
    "top_two_margin": _top_two_case,
    "survival": _survival_case,
    "heatmap_peak": _heatmap_case,
}

if __name__ == "__main__":
    main(MONOID_KERNELS, "monoid-kernels", __doc__)
