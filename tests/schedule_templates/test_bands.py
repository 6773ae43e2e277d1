"""Reductions over a band of positions around each output's own (``schedule_templates/bands.py``):
along a row, two scans of segments of the band's width (the band template); otherwise rewritten
over a window axis of the band's width. What each reads off the math and where it leaves a
program alone, the kernels against float64 on the CPU target (as written) and
in Triton's interpreter (:mod:`tests.schedule_templates.bands_check`), and on a GPU."""
import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import TargetError, TuningError
from tensorfuse.schedule_templates.bands import band_window, plan_band
from tests.helpers import fresh_seed, gpu_error, poisoned_call, relative_error, run_interpreted
from tests.schedule_templates.bands_check import (CASES, centred_weighted, moving_sum,
                                                  rolling_logsumexp, rolling_max,
                                                  rolling_max_over_time, rolling_mean_and_std)
from tests.schedule_templates.scan_check import F32, cumulative_sum_within_lengths, running_mean


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_matches_float64_on_the_cpu(name):
    kernel, case = CASES[name]
    args, want = case(torch.Generator().manual_seed(fresh_seed()))
    outs = poisoned_call(tf.compile(kernel, target="llvm"), kernel.program, args, want)
    for out, expected in zip(outs, want if isinstance(want, tuple) else (want,), strict=True):
        assert relative_error(out, expected) < (2e-2 if out.dtype == torch.bfloat16 else F32)


def test_the_triton_kernels_match_float64_in_the_interpreter():
    """f32 results to :data:`F32`, the extrema and the arg-maximum exactly; the bf16 ones to
    their rounding (the interpreter truncates to bf16 where a GPU rounds)."""
    seed = fresh_seed()
    errors = run_interpreted("tests.schedule_templates.bands_check", seed)
    assert set(errors) == set(CASES)
    for name, error in errors.items():
        bf16 = CASES[name][0].program.outputs[0].dtypes[0] == "bf16"
        assert error < (1e-2 if bf16 else F32), f"{name}: {error:.1e} (TENSORFUSE_SEED={seed})"
    assert errors["rolling_max"] == errors["lagged_band_min"] == errors["centred_argmax"] == 0
    assert errors["rolling_max_over_time"] == 0


def test_random_bands_and_discounted_scans_match_the_math_pair_by_pair():
    """Generated programs (``band_fuzz_check``: bands with offsets on either side and wider than
    the row, discounted sums either way, five monoids, a lengths condition or none, along a row
    or down a middle axis, ragged sizes) in the interpreter against every (i, j) pair in float64:
    within float32 rounding, arg-maxima exact (an empty window: the identity's index, as on the
    CPU target). It found a band down a middle axis under a lengths condition that did not
    compile (a tile of a mask on the scalar pointer of lengths[b])."""
    seed = fresh_seed()
    found = run_interpreted("tests.schedule_templates.band_fuzz_check", seed, 12)
    assert found["programs"] == 12
    assert found["worst"][0] < F32, f"{found['worst']} (TENSORFUSE_SEED={seed})"


def test_the_band_becomes_a_window_axis_of_its_width():
    program, note = band_window(rolling_max.program)
    (total,) = [c for c in program.computes if c.is_reduction]
    (window,) = total.over
    assert window.extent == 64 and window.name == "j_window"
    assert [a.name for a in total.axes] == ["b", "i"]
    assert note == "out over the band j = i - 63 + j_window as a window axis j_window of 64 " \
                   "(not every j of the row)"
    centred = band_window(centred_weighted.program)[0]   # i − 3 … i + 3, terms reading i
    assert [c.over[0].extent for c in centred.computes if c.is_reduction] == [7]
    plan = tf.compile(wide_centred, target="cuda:sm_90a").describe_plan(B=16, N=65536)
    assert plan.startswith("out over the band") and "row-reduction template" in plan
    assert "swept: j_window (65)" in plan


@tf.kernel
def wide_centred(x: T.Tensor["B", "N", "f32"]):
    """A centred window of 65 weighted by closeness: the terms read the position, so a window
    axis (wide enough for the row template)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    near = 40.0 - T.abs(T.cast(i - j, "f32"))
    return T.sum(T.where((j >= i - 32) & (j <= i + 32), near * x[b, j], 0.0), over=j)


def test_a_band_along_the_rows_is_two_scans_of_segments_of_its_width():
    """Where the positions are the rows' innermost axis and the terms do not read the position,
    the band template: a tile of segments × the width, whatever the monoid."""
    plan = plan_band(rolling_max.program)
    assert (plan.low, plan.shift, plan.width, plan.conditions) == (-63, 0, 64, ())
    assert plan_band(rolling_logsumexp.program).width == 37
    made = tf.compile(rolling_max, target="cuda:sm_90a")
    assert made.describe_plan(B=16, N=65536) == (
        "band plan of rolling_max: out[i] = max of x[b, j] over j from i -63 to i +0 (64 "
        "positions: a suffix scan and a prefix scan of segments of 64, rows b); outputs: out\n"
        "  band template (each window a suffix scan and a prefix scan of segments); tiles of 64 "
        "segments × 64 positions (as 64)")
    # the aligned load and the store in 16-byte vectors (the other load is one position off)
    ptx = made.ptx("band", B=16, N=65536)
    assert ptx.count("ld.global.v4") >= 8 and ptx.count("st.global.v4") >= 8
    down = tf.compile(moving_sum, target="cuda:sm_90a")   # down [B, N, C]: channels side by side
    assert down.schedule_origin().endswith("tiles of 16 segments × 8 positions (as 8) × 32 rows "
                                           "side by side")
    over_time = tf.compile(rolling_max_over_time, target="cuda:sm_90a").ptx("band", B=8, S=4096,
                                                                           C=1024)
    assert over_time.count("ld.global") == over_time.count("ld.global.v4") > 0   # along C
    for kernel, why in ((centred_weighted, "read i beside bounding the band"),
                        (scalar_band, "reduces no band of j")):
        with pytest.raises(TargetError, match=why):
            plan_band(kernel.program)
    assert band_window(centred_weighted.program) is not None


def test_tuning_tunes_the_window_tf_compile_runs():
    """Its tasks are the rewritten program's (the row template over the window), whose records
    tf.compile's kernel reads — not the contraction template's of the band as written; a band
    along the rows runs on the band template, whose tiles are not tuned."""
    from tensorfuse.autotune.tasks import make_task
    from tensorfuse.targets import get_target

    task = make_task(wide_centred, dict(B=16, N=65536), get_target("cuda:sm_90a"))
    assert task.template == "row_reduction"
    assert [c.over[0].name for c in task.kernel.program.computes if c.is_reduction] == \
        ["j_window"]
    with pytest.raises(TuningError, match="runs on the band template on cuda:sm_90a, whose "
                                          "tiles are not tuned"):
        make_task(rolling_max, dict(B=16, N=65536), get_target("cuda:sm_90a"))


@tf.kernel
def scalar_band(x: T.Tensor["B", "N", "f32"], w: T.i32):
    """A band whose width is a scalar: no window axis of it; the plan says so."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.max(T.where((j <= i) & (j > i - w), x[b, j], -T.inf), over=j)


def test_a_band_of_a_scalars_width_is_reduced_as_written_and_the_plan_says_why():
    assert band_window(scalar_band.program) is None
    plan = tf.compile(scalar_band, target="cuda:sm_90a").describe_plan(B=4, N=1000, w=16)
    assert "not the scan template (at any sizes): out reduces over a band of positions whose " \
           "width is no integer constant (j > i - w): every j of the row is reduced" in plan


def test_reductions_over_one_band_share_its_window_axis():
    """A rolling mean and the deviation about it: both over one window axis (the row template
    fuses the pair over it); two different bands over one axis are left as written."""
    program, note = band_window(rolling_mean_and_std.program)
    windows = {c.name: c.over[0] for c in program.computes if c.is_reduction}
    assert len({a.uid for a in windows.values()}) == 1 and len(windows) == 2
    assert next(iter(windows.values())).extent == 20
    assert note.startswith("mean_sum, var_sum over the band j = i - 19 + j_window as a window")

    @tf.kernel
    def two_bands(x: T.Tensor["B", "N", "f32"]):
        b, j = T.axes("b j")
        i = T.axis("i", "N")
        near = T.sum(T.where((j <= i) & (j > i - 4), x[b, j], 0.0), over=j)
        return T.sum(T.where((j <= i) & (j > i - 9), x[b, j] - near, 0.0), over=j)

    assert band_window(two_bands.program) is None


@tf.kernel
def empty_band(x: T.Tensor["B", "N", "f32"]):
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where((j <= i - 5) & (j >= i), x[b, j], 0.0), over=j)


@pytest.mark.parametrize("kernel", [running_mean, cumulative_sum_within_lengths, empty_band,
                                    tf.kernels.softmax])
def test_what_is_no_band_is_left_as_it_is(kernel):
    """A scan (one side of the band), a band with no position in it, a chain."""
    assert band_window(kernel.program) is None


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_matches_float64_on_the_gpu(name):
    error, dtype, seed = gpu_error(*CASES[name])
    assert error < (2e-2 if dtype == torch.bfloat16 else 1e-5), f"{name} (TENSORFUSE_SEED={seed})"
