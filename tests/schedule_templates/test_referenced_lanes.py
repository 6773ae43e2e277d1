"""A variance's sums kept per lane (``Knobs.lanes``): which chains may (a sum over moving sums
alone), the kernel's shape (no reduction across the warps in the sweep, the references set in
the first block), the numbers through Triton's interpreter
(:mod:`tests.schedule_templates.referenced_lanes_check`) and the sm_90a build."""
import pytest

import tensorfuse.kernels as K
from benchmarks.user_kernels import channel_stats
from tests.helpers import ptxas_spills
from tests.schedule_templates.referenced_lanes_check import CASES, template
from tests.schedule_templates.user_written_check import masked_var_rows

pytest.importorskip("triton", reason="the templates generate Triton kernels")


def _plan(kernel, **dims):
    return template(kernel, dict(block=64)).planner.plan(dims)


def test_a_variance_keeps_its_sums_per_lane_a_softmax_does_not():
    from tensorfuse.targets.triton.row_states import referenced_lanes

    lanes = referenced_lanes(_plan(K.layernorm, M=5, N=640))
    assert {name for name, _ in lanes} == {"mean_sum", "var_sum"}, lanes
    # the count of a variance (a state constant along the row) stays one value a row
    assert ("var_sum", 2) not in lanes, lanes
    # a softmax's sum is kept relative to a maximum: its corrections are exponentials of the
    # maximum's moves, not a sum's
    assert not referenced_lanes(_plan(K.softmax, M=5, N=640))
    # a masked mean divides by the mask's count: a first block masked whole would fix the
    # reference at 0 / 1, far from the data
    assert not referenced_lanes(_plan(masked_var_rows, B=5, S=600))


def test_the_sweep_reduces_nothing_across_the_warps_and_sets_the_reference_once():
    sizes = dict(N=100352, C=256)
    knobs = dict(rows=32, block=128, num_warps=4, num_stages=3, splits=66)
    lanes, blocks = (template(channel_stats, knobs, lanes=on).source(**sizes) for on in (1, 0))
    loop = lanes.split("for start_n in")[1].split("\n    st_mean_sum_0 = tl.sum")[0]
    before, after = loop.split("if seen == 0:")
    # the sums reduced across the row for the reference alone, in the first block alone
    summing = [line for line in after.splitlines() if "tl.sum(" in line]
    assert "tl.sum(" not in before and summing, loop
    assert all(line.strip().startswith("newref_mean_sum = ") for line in summing), loop
    assert blocks.split("for start_n in")[1].count("tl.sum(") >= 3
    assert "lanes=1" in template(channel_stats, knobs).describe_plan(**sizes)


def test_variances_with_their_sums_per_lane_match_float64_in_the_interpreter():
    from tests.helpers import check_interpreted

    check_interpreted("tests.schedule_templates.referenced_lanes_check", CASES)


def test_the_lanes_compile_for_sm90a_without_spills():
    kernel = template(channel_stats, dict(rows=32, block=128, num_warps=4, num_stages=3,
                                          splits=66))
    assert ptxas_spills(kernel.ptx(N=100352, C=256)) == [0]


def test_tuning_tries_the_lanes_where_a_chain_has_them():
    from tensorfuse.schedule_templates.row_reduction import knob_choices
    from tensorfuse.targets import get_target

    spec = get_target("cuda:sm_90a")
    assert knob_choices(_plan(K.layernorm, M=5, N=640), spec)["lanes"] == (0, 1)
    assert knob_choices(_plan(K.softmax, M=5, N=640), spec)["lanes"] == (0,)
