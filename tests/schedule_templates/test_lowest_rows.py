"""Rows whose values all sit at float32's lowest value (``finfo.min``: a float32 mask's padding)
are weighed equally by a fused softmax, as the math as written weighs them: the running
maximum's identity is that same value, and it stays the reference of the members that read it
only as ``exp(x − max)`` (:func:`tensorfuse.algebra.schemes.identity_keepable`). Against the 0
that replaced it, their terms underflowed and the row came out 0/0."""
import warnings

import numpy as np
import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.algebra import plan_chain
from tensorfuse.errors import FusedPrecisionWarning
from tests.helpers import check_interpreted
from tests.schedule_templates import lowest_rows_check as C


@pytest.mark.parametrize("fuse", ["rolling", "split"])
def test_the_fused_lowering_weighs_lowest_rows_equally(fuse):
    x = C.lowest_rows(torch.Generator().manual_seed(1), (4, 50))
    sch = tf.schedule(C.softmax_f32, "llvm")
    if fuse == "rolling":
        sch.rolling_update("m", "out_sum", axis="j", chunk=8)
    else:
        sch.split_update("m", "out_sum", axis="j", splits=3, chunk=8)
    out = torch.full_like(x, float("nan"))
    sch.compile()(x, out=out)
    want = torch.softmax(x.double(), -1)
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-7)
    assert torch.allclose(out[0].double(), torch.full((50,), 1 / 50, dtype=torch.float64))


def test_the_triton_templates_weigh_lowest_rows_equally():
    check_interpreted("tests.schedule_templates.lowest_rows_check", C.CASES, tolerance=1e-5)


def _kept(kernel, names) -> bool:
    return plan_chain(kernel.program, names, "j").schemes["m"].keeps_identity


def test_the_identity_stays_a_reference_only_for_members_it_bounds():
    @tf.kernel
    def other_tensor(x: C.ROWS, y: C.ROWS):        # exp(y − max x) is not bounded by 1
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        return T.sum(T.exp(y[i, j] - m), over=j)

    @tf.kernel
    def centred(x: C.ROWS):                         # (x − max)² corrects by shifts, not scales
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        return T.sum((x[i, j] - m) * (x[i, j] - m), over=j)

    @tf.kernel
    def masked_apart(x: C.ROWS):                    # the member reads what the max masks out
        i, j = T.axes("i j")
        m = T.max(T.where(j > 3, x[i, j], -T.inf), over=j)
        return T.sum(T.exp(x[i, j] - m), over=j)

    assert _kept(C.softmax_f32, ("m", "out_sum"))
    assert _kept(C.logsumexp_f32, ("m", "out_sum"))
    for kernel in (other_tensor, centred, masked_apart):
        names = [c.name for c in kernel.program.computes if c.is_reduction]
        with warnings.catch_warnings():   # masked_apart's own warning: it can overflow
            warnings.simplefilter("ignore", FusedPrecisionWarning)
            assert not _kept(kernel, names), kernel.name


def test_members_the_identity_does_not_bound_still_match_the_unfused_program():
    """exp(y − max x) over a row of x at the lowest value is +inf unfused: the member keeps 0 as
    its reference and its final correction overflows to the same +inf (never 0/0). Where x is
    real it lies above y, so no term overflows against a running maximum."""
    @tf.kernel
    def other_tensor(x: C.ROWS, y: C.ROWS):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        return T.sum(T.exp(y[i, j] - m), over=j)

    generator = torch.Generator().manual_seed(2)
    y = torch.randn((4, 40), generator=generator)
    x = torch.where(C.lowest_rows(generator, (4, 40)) == C.LOWEST, C.LOWEST, y + 1)
    sch = tf.schedule(other_tensor, "llvm")
    sch.rolling_update("m", "out", axis="j", chunk=8)
    out = sch.compile()(x, y).double()
    want = torch.exp(y.double() - x.double().max(-1, keepdim=True).values).sum(-1)
    assert torch.isinf(out[0]) and torch.isinf(want[0])
    np.testing.assert_allclose(out[1:].numpy(), want[1:].numpy(), rtol=1e-5)


@pytest.mark.parametrize("fuse", ["rolling", "split"])
def test_a_reference_that_reads_the_maximum_keeps_zero(fuse):
    """``w = max(x − v/2)`` keeps its elements apart from ``v`` (its value formula reads ``v``),
    and is itself the reference of ``Σ (x − w/2)``. While ``v`` has seen none of its elements (a
    masked prefix, a split part of masked elements) that reference must not be built from
    −FLT_MAX: ``max(x) + FLT_MAX/2`` would swallow every term of the later sum (found by the
    generated chains, 0.1 off on rows of two elements)."""
    @tf.kernel
    def two_levels(x: T.Tensor["M", "N", "f64"]):
        i, j = T.axes("i j")
        v = T.max(T.where(j >= 3, x[i, j], -T.inf), over=j)
        w = T.max(x[i, j] - 0.5 * v, over=j)
        return v, w, T.sum(x[i, j] - 0.5 * w, over=j)

    names = [c.name for c in two_levels.program.outputs]
    assert not plan_chain(two_levels.program, names, "j").schemes[names[0]].keeps_identity
    sch = tf.schedule(two_levels, "llvm")
    if fuse == "rolling":
        sch.rolling_update(*names, axis="j", chunk=1)
    else:
        sch.split_update(*names, axis="j", splits=3, chunk=1)
    x = torch.randn((5, 7), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    outs = sch.compile()(x)
    v = torch.where(torch.arange(7) >= 3, x, -torch.inf).max(-1).values
    w = (x - 0.5 * v[:, None]).max(-1).values
    want = (x - 0.5 * w[:, None]).sum(-1)
    torch.testing.assert_close(outs[2], want, rtol=1e-12, atol=1e-12)


@tf.kernel
def max_and_sum(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    return T.max(x[i, j], over=j), T.sum(x[i, j], over=j), T.argmax(x[i, j], over=j)


def test_special_values_as_docs_dsl_says():
    """docs/dsl.md's special values on the CPU target: the max of a row all −∞ is float32's
    lowest value and its argmax the first index (not the pair's identity, 2³¹ − 1); sums
    propagate NaN, argmax never picks it."""
    made = tf.compile(max_and_sum, "llvm")
    x = torch.randn(3, 40)
    x[0] = float("-inf")
    x[1, 7] = float("nan")
    largest, total, where = made(x)
    assert largest[0] == torch.finfo(torch.float32).min and where[0] == 0
    assert torch.isnan(total[1]) and where[1] != 7   # (max itself: unspecified, docs/dsl.md)
    assert largest[2] == x[2].max() and torch.isclose(total[2], x[2].sum())
