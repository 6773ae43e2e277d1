"""Nested reductions of one monoid merged into one over their axes
(``schedule_templates/merged_reductions.py``): which merge, which are left as written, and
what ``tf.compile`` then makes of a program written so (its numbers: the soft-argmax in
:mod:`.pipeline_check`, the nested group norm in :mod:`.staged_floor`, under Triton's
interpreter)."""
import warnings

import pytest

import tensorfuse as tf
from tensorfuse.dsl.printer import to_text
from tensorfuse.errors import NoTemplateWarning
from tensorfuse.schedule_templates.merged_reductions import merged_reductions
from tests.helpers import check_interpreted
from tests.schedule_templates.merged_check import (CASES, inner_kept, mean_of_means,
                                                   not_merged, score_sums, three_deep)


def test_merged_programs_match_float64_in_the_triton_interpreter():
    check_interpreted("tests.schedule_templates.merged_check", CASES)


def _reductions(program) -> dict:
    return {c.name: ([a.name for a in c.over], c.monoid.name, to_text(c.bodies[0]))
            for c in program.computes if c.is_reduction}


def test_a_mean_of_means_is_one_sum_over_both_axes_and_its_two_divisions():
    program, note = merged_reductions(mean_of_means.program)
    sums = _reductions(program)
    # the inner mean's division by W on each term, the outer's by H once
    assert list(sums.values()) == [(["h", "w"], "sum", "x[b, h, w] / T.size('W').astype('f32')")], \
        sums
    assert "over h of" in note and "over w merged into one reduction over both" in note


def test_reductions_nested_three_deep_merge_into_one_over_all_three_axes():
    program, _ = merged_reductions(three_deep.program)
    assert list(_reductions(program).values()) == [(["b", "c", "d"], "max", "x[a, b, c, d]")]


def test_other_monoids_and_terms_that_are_not_scaled_sums_stay_nested():
    assert merged_reductions(not_merged.program) is None


def test_an_inner_reduction_something_else_reads_is_kept_beside_the_merged_one():
    program, _ = merged_reductions(inner_kept.program)
    found = _reductions(program)
    assert found["row"] == (["w"], "sum", "x[b, h, w]"), found
    merged = [v for n, v in found.items() if n != "row"]
    assert merged == [(["h", "w"], "sum", "x[b, h, w] * 2.0")], found


def test_tf_compile_runs_a_soft_argmax_written_nested_as_one_kernel():
    """Sums over an image written a row, then the rows: the floor had cut it a stage a level
    (four kernels, the rows' maxima and sums stored between them); merged, one row-tile
    kernel sweeps the pixels as one axis, without a NoTemplateWarning."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from benchmarks.pipeline_kernels import soft_argmax

    with warnings.catch_warnings():
        warnings.simplefilter("error", NoTemplateWarning)
        made = tf.compile(soft_argmax, target="cuda:sm_90a")
    plan = made.describe_plan(B=8, C=17, H=64, W=48)
    assert plan.splitlines()[0].endswith("merged into one reduction over both (nested, each a "
                                         "kernel)"), plan
    assert "h, w swept as one axis of H × W elements" in plan and "stored between" not in plan
    assert "row-reduction template (rolling_update(m, row_sum_2, z, col_sum_2, axis=hw" in plan


def test_gemms_and_weighted_sums_of_them_stay_nested():
    """Attention's weighted sum of scores (``Σ_j s · decay · v[j, e]`` over ``s = Σ_d q·k``),
    a bilinear form (``Σ_j (Σ_i x·W) · y[j]``), a row's statistics of a GEMM's values (their
    weights read the outer axis) and a GEMM's row sums (the inner sum a GEMM): merged, the
    products would leave the tensor cores."""
    from benchmarks.contraction import bilinear_form
    from benchmarks.variant_kernels import retention_causal
    from tests.schedule_templates.pairwise_check import product_statistics

    for kernel in (bilinear_form, retention_causal, product_statistics, score_sums):
        assert merged_reductions(kernel.program) is None, kernel.program.name
