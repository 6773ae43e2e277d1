"""Reductions up to each output's position as scans (``schedule_templates/scan.py``): what the
plan reads off the math and why it refuses the rest, the kernels' numbers on the CPU target and
in Triton's interpreter (:mod:`tests.schedule_templates.scan_check`) against float64, rows cut
into parts where they are few (looking back at the parts before them), one build for every
size with ``dynamic=True``, code for sm_90a and gfx942, and on a GPU against torch."""
import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import NoTemplateWarning, TargetError
from tensorfuse.schedule_templates.scan import MAX_PARTS, PROGRAMS, plan_scan
from tensorfuse.targets.triton import scan_lookback
from tensorfuse.targets.triton.scan import stages
from tensorfuse.targets.triton.scan_kernel import ScanKernel
from benchmarks.scan_kernels import (cumulative_sum, log_cumulative_sum_exp, long_cumulative_sum,
                                     running_max, segment_offsets, sum_to_the_end)
from tests.helpers import (fresh_seed, gpu_error, poisoned_call, relative_error,
                           run_interpreted)
from tests.schedule_templates.scan_check import (CASES, F32, LONG, TOLERANCES,
                                                 decayed_within_lengths, discounted_returns,
                                                 gated_recurrence,
                                                 long_leaky_sum, max_drawdown,
                                                 moving_average_exponential, running_mean,
                                                 survival)


@pytest.mark.parametrize("name", sorted(set(CASES) - set(LONG)))
def test_each_matches_float64_on_the_cpu(name):
    """The kernels as written (N² terms on the CPU target: the long ones are left to the GPU
    paths) against torch's scans in float64."""
    kernel, case = CASES[name]
    args, want = case(torch.Generator().manual_seed(fresh_seed()))
    (out,) = poisoned_call(tf.compile(kernel, target="llvm"), kernel.program, args, want)
    tolerance = 2e-2 if out.dtype == torch.bfloat16 else TOLERANCES.get(name, F32)
    assert relative_error(out, want) < tolerance


def test_the_triton_kernels_match_float64_in_the_interpreter():
    """f32 results to :data:`F32`, the integers and extrema exactly; the bf16 one to its rounding
    (the interpreter truncates to bf16 where a GPU rounds)."""
    seed = fresh_seed()
    errors = run_interpreted("tests.schedule_templates.scan_check", seed)
    assert set(errors) == set(CASES)
    for name, error in errors.items():
        bf16 = CASES[name][0].program.outputs[0].dtypes[0] == "bf16"
        tolerance = 1e-2 if bf16 else TOLERANCES.get(name, F32)
        assert error < tolerance, f"{name}: {error:.1e} (TENSORFUSE_SEED={seed})"
    assert errors["segment_offsets"] == 0 and errors["running_max"] == 0
    assert errors["long_max_from_five_back"] == 0


def test_a_discounted_sum_is_scanned_as_decay_and_sum_pairs():
    """A sum whose terms read the position only through a power of the distance — c^(j − i),
    exp(λ·(i − j)), exp(−(i − j)/τ) — is a scan of (decay, sum) pairs: the factor a step in the
    scan's direction, the value without it; any other use of the position is refused."""
    from tensorfuse.dsl.printer import to_text

    found = {k.name: plan_scan(k.program) for k in (discounted_returns, long_leaky_sum,
                                                      moving_average_exponential,
                                                      decayed_within_lengths)}
    assert [(p.direction, to_text(p.decay), to_text(p.values[0]), p.result_component)
            for p in found.values()] == [
        ("suffix", "gamma", "r[b, j]", 1), ("prefix", "exp(-0.001)", "x[j]", 1),
        ("prefix", "1.0 - alpha", "alpha * x[b, j]", 1),
        ("prefix", "1.0 / exp(1.0 / tau)", "x[b, j]", 1)]
    assert "sum of r[b, j] discounted by gamma a step over j >= i (suffix scan" in \
        found["discounted_returns"].describe()

    def refused(body):
        def kernel(x: T.Tensor["B", "N", "f32"], gamma: T.f32):
            b, j = T.axes("b j")
            i = T.axis("i", "N")
            return T.sum(body(x, b, i, j, gamma), over=j)
        with pytest.raises(TargetError) as caught:
            plan_scan(tf.kernel(kernel).program)
        return caught.value.message

    assert "discounts from the output's own position only" in refused(
        lambda x, b, i, j, g: T.where(j < i, g ** (i - j) * x[b, j], 0.0))
    assert "read i beside comparing it (beyond a factor c^(i − j) or exp(A(i) − B(j)) of a " \
        "discounted sum)" in \
        refused(lambda x, b, i, j, g: T.where(j <= i, T.cast(i - j, "f32") * x[b, j], 0.0))
    assert "read i beside comparing it" in refused(   # two factors reading i
        lambda x, b, i, j, g: T.where(j <= i, g ** (i - j) * g ** (i - j) * x[b, j], 0.0))


def test_a_decay_that_varies_along_the_sequence_is_scanned_by_its_steps():
    """``exp(A(i) − B(j))`` (a gated linear recurrence written with the running sum of its
    gates' logarithms): each position's decay is ``exp(B(j) − B(j ∓ 1))``, the neighbour
    clamped into the row (nothing read outside it); the output scales the scan by
    ``exp(A(i) − B(i))``, left out where that is 1."""
    from tensorfuse.dsl.printer import to_text
    from tests.schedule_templates.scan_check import gated_suffix

    prefix, suffix = (plan_scan(k.program) for k in (gated_recurrence, gated_suffix))
    assert (prefix.direction, to_text(prefix.decay), to_text(prefix.values[0])) == (
        "prefix", "exp(c[b, j, d] - c[b, max(j - 1, 0), d])", "u[b, j, d]")
    assert to_text(prefix.outputs[0][1]) == "out", to_text(prefix.outputs[0][1])
    assert (suffix.direction, to_text(suffix.decay)) == (
        "suffix", "exp(c[b, j] - c[b, min(j + 1, T.size('L') - 1)])")
    assert to_text(suffix.outputs[0][1]) == "out * exp(g[b, i] - c[b, i])"


def test_a_selective_scan_sums_its_states_against_c_in_the_scans_tile():
    """Mamba's ``Σ_n C[b, i, n] · h[b, i, d, n]`` over the scanned states ``h``: one kernel —
    the states of a tile's rows (every ``n`` of its channels, padded to a power of two) added
    up against ``C`` before the store — where the floor stored every state (768 MiB at B2
    L4096 D1536 N16) for a second kernel; it compiles for sm_90a (a row in parts too) and
    gfx942."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    made = tf.compile(CASES["selective_scan"][0], target="cuda:sm_90a")
    dims = dict(B=2, L=4096, D=1536, N=16)
    plan = made.describe_plan(**dims)
    assert plan.startswith("scan plan of selective_scan: h[i] = sum of dx[b, j, d] * bm[b, j, "
                           "n] discounted by exp(c[b, j, d] - c[b, max(j - 1, 0), d]) a step"), plan
    assert "outputs: out (of cm[b, i, n] * h summed over n in each tile)" in plan
    for sizes in (dims, dict(B=1, L=1 << 16, D=64, N=12)):
        for which in made._kernels(sizes):
            assert ".visible .entry" in made.ptx(which, **sizes)
    amd = tf.compile(CASES["selective_scan"][0], target="rocm:gfx942")
    assert "amdgcn" in amd.compiled(amd._kernels(dims)[-1], **dims).asm


def test_sums_each_a_scan_of_its_own_run_as_a_stage_each_not_n_squared_together():
    """An exponentially weighted variance's two discounted sums: the row template would take
    them together and sweep every prefix; ``tf.compile`` says why it stages them instead, two
    scans."""
    from tests.schedule_templates.scan_check import ew_variance

    with pytest.warns(NoTemplateWarning, match="each a scan of their own"):
        made = tf.compile(ew_variance, target="cuda:sm_90a")
    plan = made.describe_plan(B=64, N=16384, alpha=0.05)
    assert plan.count("scan plan of") == 2 and "row-tile plan" not in plan, plan


def test_a_condition_on_equal_keys_is_said_to_bound_no_range():
    """Positions within a packed segment (``seg[j] == seg[i]``): equal keys need not be
    neighbours, so no scan reads it; the plan says so, not that a band has no constant width."""
    @tf.kernel
    def segment_positions(seg: T.Tensor["N", "i32"]):
        j = T.axis("j", "N")
        i = T.axis("i", "N")
        return T.sum(T.where((j <= i) & (seg[j] == seg[i]), 1, 0), over=j)

    plan = tf.compile(segment_positions, target="cuda:sm_90a").describe_plan(N=4096)
    assert "not the scan template (at any sizes): out keeps the terms where seg[j] == seg[i]: " \
           "a condition tying j to the output's own position that bounds no range of j" in plan


def test_the_plan_reads_the_scan_off_the_math():
    plan = plan_scan(cumulative_sum.program)
    assert (plan.direction, plan.shift, plan.axis.name, plan.out_axis.name) == \
        ("prefix", 0, "j", "i")
    assert [a.name for a in plan.rows] == ["b"] and plan.along_rows
    assert plan.monoid.name == "sum" and plan.conditions == () and len(plan.values) == 1
    # the other axis the output keeps is innermost: tiles of rows side by side
    down = plan_scan(running_max.program)
    assert [a.name for a in down.rows] == ["b", "d"] and not down.along_rows
    assert down.monoid.name == "max"
    exclusive = plan_scan(segment_offsets.program)   # g < h: the value read one position back
    assert (exclusive.direction, exclusive.shift, exclusive.rows) == ("prefix", -1, ())
    suffix = plan_scan(sum_to_the_end.program)       # j >= i: swept from the end
    assert (suffix.direction, suffix.shift) == ("suffix", 0)
    assert plan_scan(survival.program).monoid.name == "prod"
    mean = plan_scan(running_mean.program)   # the epilogue reads the position
    assert "i" in repr(mean.outputs[0][1])
    lengths = plan_scan(CASES["cumulative_sum_within_lengths"][0].program)
    assert len(lengths.conditions) == 1 and "n[b]" in repr(lengths.conditions[0])
    assert "over j <= i (prefix scan, rows b)" in plan.describe()
    index = plan_scan(CASES["running_argmax"][0].program)   # the value and its index
    assert index.monoid.name == "argmax" and [repr(v) for v in index.values][1] == "j"
    lagged = plan_scan(CASES["lagged_maximum"][0].program)   # j + 2 <= i: up to i − 2
    assert (lagged.direction, lagged.shift) == ("prefix", -2)
    assert "over j <= i - 2 (prefix scan" in lagged.describe()


@tf.kernel
def weighted_by_distance(r: T.Tensor["B", "N", "f32"], gamma: T.f32):
    """Each step's sum to the end weighted by the distance: the terms read i (as j − i, not
    as a power of it)."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j >= i, r[b, j] * gamma * T.cast(j - i, "f32"), 0.0), over=j)


@tf.kernel
def row_sum(x: T.Tensor["B", "N", "f32"]):
    b, j = T.axes("b j")
    return T.sum(x[b, j], over=j)


@tf.kernel
def other_extent(x: T.Tensor["B", "N", "f32"], y: T.Tensor["M", "f32"]):
    b, j, i = T.axes("b j i")
    return T.sum(T.where(j <= i, x[b, j], 0.0), over=j) + y[i]


@tf.kernel
def max_with_zeros(x: T.Tensor["B", "N", "f32"]):
    """The masked terms are 0, not max's identity: max(0, running max) — not a scan of x."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.max(T.where(j <= i, x[b, j], 0.0), over=j)


@tf.kernel
def sum_with_ones(x: T.Tensor["B", "N", "f32"]):
    """The masked terms are 1: each output adds N − i − 1 to the cumulative sum."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j <= i, x[b, j], 1.0), over=j)


@pytest.mark.parametrize("kernel, reason", [
    (weighted_by_distance, "the terms of out read i beside comparing it"),
    (max_with_zeros, "no condition comparing j"),
    (sum_with_ones, "no condition comparing j"),
    (tf.kernels.softmax, "2 reductions; a scan program has one"),
    (row_sum, "no condition comparing j with an axis of its result of the same extent"),
    (other_extent, "no condition comparing j"),
])
def test_what_is_not_a_scan_is_refused_with_the_reason(kernel, reason):
    with pytest.raises(TargetError, match=reason):
        plan_scan(kernel.program)
    made = tf.compile(kernel, target="cuda:sm_90a")
    assert not isinstance(made, ScanKernel)
    # said in the plan where the one reduction compares its axis as a scan does
    sizes = dict.fromkeys(kernel.program.dim_names(), 1000)
    scalars = {p.name: 0.9 for p in kernel.program.scalar_params}
    said = "not the scan template (at any sizes): the terms of out read i" in \
        made.describe_plan(scalars, **sizes)
    assert said == (kernel is weighted_by_distance)


def test_the_scan_template_takes_scans_on_gpus_and_the_cpu_keeps_its_own():
    made = tf.compile(cumulative_sum, target="cuda:sm_90a")
    assert isinstance(made, ScanKernel)
    assert made.schedule_origin().startswith("scan template")
    assert not isinstance(tf.compile(cumulative_sum, target="llvm"), ScanKernel)


def test_a_scan_inside_a_larger_program_is_a_stage_of_its_own():
    """A running peak's largest fall: the contraction template refuses the scan (it would
    compute N² pairs), so the floor stores the scan's result and reduces it on the row
    template."""
    from tensorfuse.errors import ScheduleError
    from tensorfuse.schedule_templates.contraction_plan import plan_contraction

    with pytest.raises(ScheduleError, match="peak reduces over the positions up to each of its "
                                            "own: a scan, not a contraction"):
        plan_contraction(max_drawdown.program)
    plan = tf.compile(max_drawdown, target="cuda:sm_90a").describe_plan(B=64, N=8192)
    assert "[1] peak from x\nscan plan of max_drawdown_peak" in plan
    assert "[2] out from x, peak\nmax_drawdown_out at B=64, N=8192: row-reduction template" in plan


def test_tuning_a_scan_says_its_tiles_are_not_tuned():
    """Its tasks would otherwise come from the row template's dense form, records tf.compile
    never reads."""
    from tensorfuse.autotune.tasks import make_task
    from tensorfuse.errors import TuningError
    from tensorfuse.targets import get_target

    with pytest.raises(TuningError, match="scan template on cuda:sm_90a, whose tiles are not"):
        make_task(cumulative_sum, dict(B=64, N=4096), get_target("cuda:sm_90a"))


def test_rows_too_few_for_the_gpu_are_cut_into_parts():
    """One long sequence: cut into parts — where the carry fits a published word, parts of
    the look-back's tile scanned in one pass, a row a program; a logsumexp (no such word) in
    parts of whole blocks, enough programs, their totals first; many rows: no parts, one
    kernel; rows one look-back part long: its tile and warps, one sweep a row."""
    parts = plan_scan(cumulative_sum.program).parts
    assert parts(1, 2**26, 1, 1024) == MAX_PARTS >= PROGRAMS - 8   # one row: the SMs busy
    assert parts(4096, 4096, 2, 1024) == 1
    assert parts(2, 10 * 1024, 2, 1024) == 2   # at least four blocks a part
    assert parts(32, 2**20, 2, 1024) == -(-PROGRAMS // 16)   # 16 programs along the rows
    long_ = tf.compile(long_cumulative_sum, target="cuda:sm_90a")
    tile = scan_lookback.BLOCK_N * scan_lookback.PART_BLOCKS
    assert f"cut into {2**26 // tile} parts of {tile} positions (one pass" in \
        long_.describe_plan(N=2**26)
    assert long_._kernels(dict(N=2**26)) == ["lookback"]
    assert long_._grids(dict(N=2**26)) == [(2**26 // tile,)]
    assert long_._num_warps(dict(N=2**26)) == scan_lookback.NUM_WARPS
    lcse = tf.compile(log_cumulative_sum_exp, target="cuda:sm_90a")
    assert lcse._kernels(dict(B=1, N=2**20)) == ["totals", "scan"]
    many = tf.compile(cumulative_sum, target="cuda:sm_90a")
    assert "parts" not in many.schedule_origin(B=4096, N=4096)
    assert many._kernels(dict(B=4096, N=4096)) == ["scan"]
    assert many._num_warps(dict(B=4096, N=4096)) == ScanKernel.num_warps
    assert many._kernels(dict(B=256, N=tile)) == ["scan"]
    assert many._num_warps(dict(B=256, N=tile)) == scan_lookback.NUM_WARPS


def test_parts_look_back_past_parts_holding_only_their_own_terms():
    """The look-back walks back over parts that published only their own terms until the
    row's first (the kernel launched a program at a time, the words set back before each;
    :mod:`tests.schedule_templates.scan_lookback_check`): exact for integer offsets and a
    maximum reaching back past the position, a suffix sum to float32's rounding."""
    errors = run_interpreted("tests.schedule_templates.scan_lookback_check", fresh_seed())
    assert errors["segment_offsets"] == 0 and errors["long_max_from_five_back"] == 0
    assert errors["sum_to_the_end"] < F32


def test_one_build_serves_every_size_and_the_gradient_is_a_scan_from_the_end():
    """``dynamic=True``: one source for three lengths (one cut into parts); autograd's backward
    of a running mean (``Σ_i where(j <= i, g[i] / (i + 1))``) is planned as a suffix scan, and
    that of discounted returns (``Σ_i where(j >= i, g[i], 0) · γ^(j − i)``) as a discounted
    prefix scan, those of a gated recurrence (decays that vary) as three scans."""
    found = run_interpreted("tests.schedule_templates.scan_calls_check")
    assert found["builds"] == 1 and found["error"] < F32
    assert found["gradient_error"] < F32 and found["backward"].startswith("scan template")
    assert found["discounted_gradient_error"] < F32
    assert found["discounted_backward"].startswith("scan template")
    # a decay that varies: three scans (by c at both positions, by u), not N² sweeps
    assert found["gated_gradient_error"] < TOLERANCES["gated_recurrence"]
    assert found["gated_backward"].count("scan template") == 3, found["gated_backward"]


@pytest.mark.parametrize("kernel, dims", [(cumulative_sum, dict(B=64, N=4096)),
                                          (running_max, dict(B=2, S=4096, D=16)),
                                          (segment_offsets, dict(G=2**20)),
                                          # its tensor is r: the kernel's own names kept apart
                                          (sum_to_the_end, dict(B=64, N=4096)),
                                          (CASES["running_argmax"][0], dict(B=2, N=2**20)),
                                          # (decay, sum) pairs; one row in parts, in order
                                          (discounted_returns, dict(B=64, N=4096)),
                                          (long_leaky_sum, dict(N=2**20)),
                                          # a decay a position, its neighbour's index clamped
                                          (gated_recurrence, dict(B=8, L=4096, D=1024)),
                                          (CASES["gated_suffix"][0], dict(B=1, L=2**20))])
def test_the_kernels_compile_for_sm90a_and_gfx942(kernel, dims):
    """Rows read and written in 16-byte vectors (a part starts at a whole block; an exclusive
    scan's terms, one position back, are read one by one) — along a row with a natively
    reduced monoid copied ahead into shared memory (``cp.async.cg``: 16 bytes), else loaded —,
    for sm_90a; and the code for gfx942."""
    made = tf.compile(kernel, target="cuda:sm_90a")
    ahead = stages(made.plan) > 1
    for which in made._kernels(dims):
        ptx = made.ptx(which, **dims)
        assert ".visible .entry" in ptx
        vectors = "cp.async.cg.shared.global" if ahead else "ld.global.v4"
        assert (vectors in ptx) == (made.plan.shift == 0), which
        assert ("cp.async" in ptx) == ahead
        assert "st.global.v4" in ptx or which == "totals"
    amd = tf.compile(kernel, target="rocm:gfx942")
    assert "amdgcn" in amd.compiled(amd._kernels(dims)[-1], **dims).asm


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_matches_float64_on_the_gpu(name):
    error, dtype, seed = gpu_error(*CASES[name])
    tolerance = 2e-2 if dtype == torch.bfloat16 else TOLERANCES[name] \
        if dtype == torch.float64 else max(1e-5, TOLERANCES.get(name, 0))
    assert error < tolerance, f"{name} (TENSORFUSE_SEED={seed})"


def test_values_computed_in_float64_stay_float64_or_leave_the_templates():
    """A float64 scan loads, carries and stores float64 (checked to 1e-12 in the interpreter
    run above); a float64 log-sum-exp, which the row template would keep in float32 (3e-8
    off), runs on TVM's default schedule in double, said once; an f64 tensor cast to f32 by
    the user still gets the templates."""
    import warnings

    @tf.kernel
    def lse_f64(x: T.Tensor["M", "N", "f64"]):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        return T.log(T.sum(T.exp(x[i, j] - m), over=j)) + m

    @tf.kernel
    def lse_cast(x: T.Tensor["M", "N", "f64"]):
        i, j = T.axes("i j")
        y = T.cast(x[i, j], "f32")
        m = T.max(y, over=j)
        return T.log(T.sum(T.exp(y - m), over=j)) + m

    with pytest.warns(NoTemplateWarning, match="computed in float64"):
        made = tf.compile(lse_f64, "cuda:sm_90a")
    assert "computed in float64" in made.schedule_origin(M=7, N=3000)
    assert "double" in made.cuda_source(M=7, N=3000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoTemplateWarning)
        made = tf.compile(lse_cast, "cuda:sm_90a")
    assert "row-reduction template" in made.describe_plan(M=7, N=3000)
    from tests.schedule_templates.scan_check import cumulative_sum_f64

    made = tf.compile(cumulative_sum_f64, "cuda:sm_90a")
    assert "tl.float64" in made.source(B=3, N=2500)
    ptx = made.ptx("scan", B=3, N=2500)   # sm_90a: double adds, nothing narrowed to f32
    assert "add.f64" in ptx and "cvt.rn.f32.f64" not in ptx
