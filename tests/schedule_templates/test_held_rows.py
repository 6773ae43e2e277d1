"""Members no running correction carries (``Σ |x − mean|``, ``Σ where(x > max / 2, 1, 0)``),
held to rows of one block on the row-tile template: planned by the algebra only when asked,
one kernel where a block holds the row, the floor's stages where it does not, never a sweep of
several blocks or parts (:func:`tensorfuse.targets.triton.rowtile.held_refusal`); numbers in
:mod:`tests.schedule_templates.held_rows_check` (and the extra user-written kernels) through
Triton's interpreter."""
import warnings

import pytest

import tensorfuse as tf
from tensorfuse.algebra.chain import plan_chain
from tensorfuse.errors import RollingUpdateError, TargetError
from tensorfuse.schedule_templates.fusion import Fusion
from tensorfuse.schedule_templates.row_reduction import knob_choices, row_reduction
from tensorfuse.schedule_templates.tile_plan import plan_rowtile
from tensorfuse.targets import get_target
from tests.schedule_templates.held_rows_check import (count_probable, masked_mad,
                                                     over_the_mad, two_held)
from tests.schedule_templates.user_written_extra_check import above_mean_sum


def _plan(kernel, **sizes) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tf.compile(kernel, target="cuda:sm_90a").describe_plan(**sizes)


def test_the_algebra_holds_a_member_only_when_asked():
    program = above_mean_sum.program
    with pytest.raises(RollingUpdateError, match="cannot fuse out"):
        plan_chain(program, ["m_sum", "out"], "j")
    chain = plan_chain(program, ["m_sum", "out"], "j", held=True)
    assert list(chain.held) == ["out"] and chain.schemes["out"].kind == "held"
    assert chain.schemes["out"].deps == ("m_sum",)


def test_a_member_reading_a_value_kept_relative_to_another_is_not_held():
    """The softmax's denominator is corrected as the maximum moves: no running value of it is
    the value a held member would read."""
    with pytest.raises(RollingUpdateError, match="cannot fuse out"):
        plan_chain(count_probable.program, ["m", "l", "out"], "j", held=True)
    assert "stored between the stages" in _plan(count_probable, M=8192, N=4096)


def test_one_kernel_where_a_block_holds_the_row_and_stages_where_not():
    for kernel in (masked_mad, two_held, over_the_mad):
        one = _plan(kernel, M=8192, N=4096)
        assert "held to one block" in one and "block_n=4096" in one and "splits=1" in one
        assert "stage kernels" not in one
    wide = _plan(above_mean_sum, M=64, N=20000)
    assert "2 stage kernels" in wide and "needs each row of 20000 elements in one block" in wide


def test_knobs_that_sweep_a_row_in_blocks_or_parts_are_refused():
    """Given knobs (or a tuning record) of several blocks or parts would have the held member
    read its dependencies' partial values: refused where the kernel is made."""
    spec = get_target("cuda:sm_90a")
    fusion = Fusion(("m_sum", "out"), "j", 32, held=True)
    for knobs in (dict(block=1024), dict(splits=4)):
        made = row_reduction(above_mean_sum, fusion, spec, **knobs)
        with pytest.raises(TargetError, match="in one block"):
            made.source(M=64, N=4096)
    assert "tl.sum" in row_reduction(above_mean_sum, fusion, spec).source(M=64, N=4096)
    plan = plan_rowtile(above_mean_sum.program, plan_chain(above_mean_sum.program,
                                                           fusion.names, "j", held=True),
                        dict(M=8192, N=4096))
    choices = knob_choices(plan, spec)
    assert choices["block_n"] == (4096,) and choices["splits"] == (1,)


def test_held_rows_match_float64_in_the_triton_interpreter():
    from tests.helpers import check_interpreted
    from tests.schedule_templates.held_rows_check import CASES

    check_interpreted("tests.schedule_templates.held_rows_check", CASES, tolerance=1e-5)


def test_held_rows_compile_for_sm_90a():
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    ptx = tf.compile(masked_mad, target="cuda:sm_90a").ptx(M=8192, N=4096)
    assert ".entry" in ptx


def test_the_same_kernels_match_float64_on_the_cpu_target():
    """The CPU target never holds a member (its loops sweep chunks): the floor's passes there,
    numbers the same."""
    import torch

    from tests.helpers import fresh_seed, poisoned_call, relative_error
    from tests.schedule_templates.held_rows_check import CASES

    seed = fresh_seed()
    generator = torch.Generator().manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (kernel, case) in CASES.items():
            args, want = case(generator)
            out = poisoned_call(tf.compile(kernel, "llvm"), kernel.program, args, want)[0]
            assert relative_error(out, want) < 1e-5, f"{name} (TENSORFUSE_SEED={seed})"
