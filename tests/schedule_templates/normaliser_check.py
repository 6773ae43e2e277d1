"""A softmax's normaliser over the columns of the contraction template's sums — ``T.logsumexp``
of a GEMM's values past the 256 features the row-tile template holds (InfoNCE's and CLIP's
normaliser at D=300, the columns split into parts), of pairwise values (a Gaussian kernel's
log-sum), with masked columns (all of them: −∞), and as users write it by hand (``m`` unguarded:
NaN where every column is masked) — run through the contraction template for
sm_90a by Triton's interpreter at ragged sizes and wide value ranges, outputs poisoned, against
float64 in torch (never the project's lowering). Prints each case's error as JSON (for the
all-masked cases: the number of outputs that are not −∞, or not NaN by hand).

    TRITON_INTERPRET=1 python -m tests.schedule_templates.normaliser_check SEED
"""
import json
import os
import sys

import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.dsl.program import ProgramKernel
from tensorfuse.schedule_templates.contraction import triton_contraction
from tensorfuse.schedule_templates.monoid_rewrites import rewritten_monoids
from tests.helpers import poisoned_call, relative_error


@tf.kernel
def lse_scores(x: T.Tensor["M", "D", "bf16"], y: T.Tensor["N", "D", "bf16"], tau: T.f32):
    """The log of a contrastive loss's normaliser: ``log Σ_j exp(x_i·y_j / τ)``."""
    i, j, d = T.axes("i j d")
    return T.logsumexp(T.sum(x[i, d] * y[j, d], over=d) / tau, over=j)


@tf.kernel
def log_gaussian_sum(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"]):
    """A Gaussian kernel's sum in log space: ``log Σ_j exp(−‖x_i − y_j‖²)``."""
    i, j, d = T.axes("i j d")
    return T.logsumexp(-T.sum((x[i, d] - y[j, d]) * (x[i, d] - y[j, d]), over=d), over=j)


@tf.kernel
def masked_lse(x: T.Tensor["M", "D", "bf16"], y: T.Tensor["N", "D", "bf16"],
               keep: T.Tensor["N", "i32"]):
    """Only the kept columns' scores."""
    i, j, d = T.axes("i j d")
    s = T.sum(x[i, d] * y[j, d], over=d)
    return T.logsumexp(T.where(keep[j] != 0, s, -T.inf), over=j)


def _scores(generator, M=37, N=3000, D=300):
    x, y = ((torch.randn(n, D, generator=generator) * 0.5).bfloat16() for n in (M, N))
    return dict(x=x, y=y, tau=0.05), (x.double() @ y.double().T / 0.05).logsumexp(-1)


def _gaussian(generator, M=37, N=1000, D=3):
    x, y = (torch.rand(n, D, generator=generator) * 8 for n in (M, N))
    return dict(x=x, y=y), (-torch.cdist(x.double(), y.double()) ** 2).logsumexp(-1)


def _masked(generator, M=37, N=700, D=64):
    x, y = ((torch.randn(n, D, generator=generator) * 3).bfloat16() for n in (M, N))
    keep = (torch.rand(N, generator=generator) < 0.3).int()
    s = (x.double() @ y.double().T).masked_fill(~keep.bool(), float("-inf"))
    return dict(x=x, y=y, keep=keep), s.logsumexp(-1)


@tf.kernel
def by_hand(x: T.Tensor["M", "D", "bf16"], y: T.Tensor["N", "D", "bf16"],
            keep: T.Tensor["N", "i32"]):
    """The same as users write it: ``m + log Σ exp(s − m)``, ``m`` unguarded (a row of −∞ is
    NaN, as ``exp(−∞ − (−∞))`` makes it)."""
    i, j, d = T.axes("i j d")
    s = T.where(keep[j] != 0, T.sum(x[i, d] * y[j, d], over=d), -T.inf)
    m = T.max(s, over=j)
    return m + T.log(T.sum(T.exp(s - m), over=j))


CASES = {"lse_scores": (lse_scores, _scores), "log_gaussian_sum": (log_gaussian_sum, _gaussian),
         "masked_lse": (masked_lse, _masked), "by_hand": (by_hand, _masked)}


def on_the_contraction_template(kernel, target=None):
    """``kernel`` (a log-sum-exp of a contraction's values) as ``tf.compile`` writes it for the
    templates, on the contraction template for ``target`` (sm_90a by default) whatever its
    depth."""
    rewritten = rewritten_monoids(kernel.program)
    program = rewritten[0] if rewritten else kernel.program
    return triton_contraction(ProgramKernel(program), target or tf.get_target("cuda:sm_90a"))


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    generator = torch.Generator().manual_seed(int(sys.argv[1]))
    found = {}
    for name, (kernel, case) in CASES.items():
        args, want = case(generator)
        (out,) = poisoned_call(on_the_contraction_template(kernel), kernel.program, args, want)
        found[name] = relative_error(out, want)
    args, _ = _masked(generator)
    args["keep"].zero_()   # every column masked: −∞ everywhere
    (out,) = poisoned_call(on_the_contraction_template(masked_lse), masked_lse.program, args,
                           torch.empty(37))
    found["all_masked_not_minus_inf"] = int((out != float("-inf")).sum())
    (out,) = poisoned_call(on_the_contraction_template(by_hand), by_hand.program, args,
                           torch.empty(37))
    found["all_masked_by_hand_not_nan"] = int((out == out).sum())
    print(json.dumps(found))


if __name__ == "__main__":
    main()
