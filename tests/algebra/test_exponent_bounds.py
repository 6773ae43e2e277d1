"""A member that exponentiates against a running maximum over elements the maximum's mask leaves
out can overflow in the fused pass where the unfused program does not: warned (or refused under
strict) when the fusion is planned; the same chain with matching masks is not."""
from __future__ import annotations

import warnings

import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.algebra import plan_chain
from tensorfuse.errors import FusedPrecisionWarning, RollingUpdateError


def _kernel(same_mask: bool):
    @tf.kernel
    def masked(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        v = T.max(T.where(j % 2 == 0, x[i, j], -T.inf), over=j)
        keep = (j % 2 == 0) if same_mask else (j % 3 == 1)
        r = T.sum(T.where(keep, T.exp(x[i, j] - v), 0.0), over=j)
        return v, r

    return masked


def test_unbounded_exponential_is_warned_and_refused_under_strict():
    kernel = _kernel(same_mask=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan_chain(kernel.program, ("v", "r"), "j")
    assert any(issubclass(w.category, FusedPrecisionWarning) and "mask leaves out" in
               str(w.message) for w in caught)
    with pytest.raises(RollingUpdateError, match="overflow in the fused pass"):
        plan_chain(kernel.program, ("v", "r"), "j", strict=True)


def test_matching_masks_are_not_warned():
    kernel = _kernel(same_mask=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan_chain(kernel.program, ("v", "r"), "j", strict=True)
    assert not [w for w in caught if issubclass(w.category, FusedPrecisionWarning)]
