"""Arg reductions over the columns of a contraction, as users write them — a nearest centroid
(k-means' assignment, a codebook's entry: ``argmin_j Σ_d (x − c)²``), a greedy choice over an LM
head's logits (``argmax_v h·Wᵀ`` on the tensor cores, the columns split into parts), the best
match's score and index together — run through the contraction template for sm_90a by Triton's
interpreter at ragged sizes, outputs poisoned (−1, NaN) before each run, against float64 in
torch (never the project's lowering).

An index is checked by what it picks: the float64 score at the chosen column against the best
float64 score of the row (relative to the scores' largest magnitude) — rounding may pick another
column of a near tie, never a worse one. Ties of exactly equal scores (centroids repeated) must
pick the first column, as the DSL's arg monoids do: counted as wrong picks.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.arg_columns_check SEED
"""
import json
import os
import sys

import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.unlisted_kernels import nearest_centroid
from tests.helpers import poisoned_call
from tests.schedule_templates.staged_floor import interpreted


@tf.kernel
def greedy_token(h: T.Tensor["M", "D", "bf16"], w: T.Tensor["V", "D", "bf16"]):
    i, v, d = T.axes("i v d")
    return T.argmax(T.sum(h[i, d] * w[v, d], over=d), over=v)


@tf.kernel
def best_match(x: T.Tensor["M", "D", "bf16"], y: T.Tensor["N", "D", "bf16"]):
    i, j, d = T.axes("i j d")
    score, at = T.max_argmax(T.sum(x[i, d] * y[j, d], over=d), over=j)
    return score, at


@tf.kernel
def top1_router(x: T.Tensor["M", "D", "bf16"], w: T.Tensor["E", "D", "bf16"]):
    """A mixture of experts' top-1 routing: the chosen expert's softmax probability and its
    index over a few experts — the chain fused in one row tile, the index (the same for every
    row) reduced in one tuple with the row's logits."""
    i, e, d = T.axes("i e d")
    logits = T.sum(x[i, d] * w[e, d], over=d)
    return 1.0 / T.sum(T.exp(logits - T.max(logits, over=e)), over=e), T.argmax(logits, over=e)


def _centroids(generator, M=333, K=300, D=20):
    x = torch.randn(M, D, generator=generator) * 4
    c = torch.randn(K, D, generator=generator) * 4
    # repeated centroids, the first of equal distances wins: 30 apart (other lanes of a block
    # of columns) and 256 apart (the same lane of the next block: 256 columns a block here)
    c[40:50], c[266:276] = c[10:20], c[10:20]
    x[:30] = c[10:40].clone()   # rows sitting on centroids (distance 0, repeated or not)
    return dict(x=x, c=c), torch.cdist(x.double(), c.double()) ** 2


def _logits(generator, M=37, V=3000, D=64):
    h, w = ((torch.randn(n, D, generator=generator) * 2).bfloat16() for n in (M, V))
    # rows of the weights repeated in another part of the columns (3 parts of 1000): a row of
    # h equal to one of them scores it highest (|w|² ≈ 256 against ≈ 110 at most elsewhere)
    w[2510:2520] = w[10:20]
    h[:10] = w[10:20]
    return dict(h=h, w=w), -(h.double() @ w.double().T)   # argmax as argmin of the negation


def _experts(generator, M=45, E=6, D=64):
    x, w = ((torch.randn(n, D, generator=generator) * 2).bfloat16() for n in (M, E))
    x[:3] = w[2]   # rows on an expert: its logit far ahead, its probability near 1
    return dict(x=x, w=w), -(x.double() @ w.double().T)


def _matches(generator, M=37, N=1000, D=48):
    x, y = ((torch.randn(n, D, generator=generator) * 3).bfloat16() for n in (M, N))
    return dict(x=x, y=y), -(x.double() @ y.double().T)


CASES = {"nearest_centroid": (nearest_centroid, _centroids),
         "greedy_token": (greedy_token, _logits),
         "best_match": (best_match, _matches),
         "top1_router": (top1_router, _experts)}


def picked(at: torch.Tensor, scores: torch.Tensor) -> float:
    """How much worse the float64 score of each row's chosen column is than the row's best,
    relative to the scores' largest magnitude (``scores``: lower is better); inf for an index
    out of range (a poisoned output left as it was)."""
    at = at.long()
    if ((at < 0) | (at >= scores.shape[1])).any():
        return float("inf")
    chosen = scores.gather(1, at[:, None])[:, 0]
    return float((chosen - scores.min(1).values).max() / scores.abs().max())


def first_of_ties(at: torch.Tensor, scores: torch.Tensor) -> int:
    """Rows whose exact best score several columns share that did not pick the first of them."""
    best = scores.min(1, keepdim=True).values
    tied = (scores == best).sum(1) > 1
    first = (scores == best).int().argmax(1)
    return int((tied & (at.long() != first)).sum())


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    generator = torch.Generator().manual_seed(int(sys.argv[1]))
    found = {}
    for name, (kernel, case) in CASES.items():
        args, scores = case(generator)
        shapes = torch.empty(scores.shape[0], dtype=torch.int32)
        want = (torch.empty(scores.shape[0]).double(), shapes) \
            if name in ("best_match", "top1_router") else shapes
        outs = poisoned_call(interpreted(kernel), kernel.program, args, want)
        at = outs[-1]
        found[name] = {"worse": picked(at, scores), "ties_missed": first_of_ties(at, scores)}
        if name == "best_match":   # the score itself: float64 max of the products
            best = -scores.min(1).values
            found[name]["score"] = float((outs[0].double() - best).abs().max() / best.abs().max())
        if name == "top1_router":   # the chosen expert's probability
            best = torch.softmax(-scores, 1).max(1).values
            found[name]["score"] = float((outs[0].double() - best).abs().max() / best.abs().max())
    print(json.dumps(found))


if __name__ == "__main__":
    main()
