"""Masks that only bound the swept axis (``lo[g] <= r < hi[g]``): each program sweeps the blocks
between its bounds, read in the kernel, with no block lists made per call; loads under a
``T.where`` branch fetch only where it is taken. Plans and sources on the CPU, numbers against
float64 on the CPU target, under Triton's interpreter and on the GPU (also replayed from a CUDA
graph after the lengths change)."""
import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.schedule_templates.sweep_bounds import sweep_bounds
from benchmarks.unlisted_kernels import lengths_mean_pool
from benchmarks.user_kernels import cross_attention_lengths, segment_mean
from tests.helpers import fresh_seed, gpu_case, relative_error, run_interpreted, templated
from tests.schedule_templates.sweep_bounds_check import (CASES, ROW_TILES, ragged_logsumexp,
                                                         ragged_pool_logsumexp, varlen_rms_scale,
                                                         varlen_softmax, window_sum)


def test_comparisons_of_the_swept_axis_with_values_over_the_other_axes_are_bounds():
    g, r, i = T.axes("g r i")
    ln = ragged_pool_logsumexp.program.tensor_params[1][g]
    both = sweep_bounds((r >= ln) & (ln + 5 > r), r, [g])
    assert [len(both.lo), len(both.hi)] == [1, 1]
    assert sweep_bounds(r <= ln - 1, r, [g]).hi[0] is ln   # r <= n - 1: r < n
    assert sweep_bounds(r < i, r, [g]) is None             # i is neither a batch axis nor a row
    assert sweep_bounds(r < i, r, [g, i]) is not None
    assert sweep_bounds((r < ln) | (r > 3), r, [g]) is None   # not a conjunction
    assert sweep_bounds(r + 1 < ln, r, [g]) is None        # not the axis itself
    assert sweep_bounds(None, r, [g]) is None


@tf.kernel
def _even_keys_softmax_sum(x: T.Tensor["B", "S", "bf16"], lengths: T.Tensor["B", "i32"]):
    """A bound and a parity on the swept axis: not only bounds."""
    b, s = T.axes("b s")
    return T.sum(T.where((s < lengths[b]) & (s % 2 == 0), x[b, s], 0.0), over=s)


@pytest.mark.parametrize("kernel, sizes, bounded", [
    (segment_mean, dict(R=5000, D=1024, G=64), True),
    (window_sum, dict(G=9, R=700, D=40), True),
    (ragged_pool_logsumexp, dict(G=9, R=700, D=40), True),
    (ragged_logsumexp, dict(B=7, S=3000), True),
    (varlen_softmax, dict(B=3, M=5, S=3000), True),
    (varlen_rms_scale, dict(B=3, S=700, D=40), True),
    (_even_keys_softmax_sum, dict(B=7, S=3000), False),
    # the Triton attention template: its lists spare full blocks the scores' compare and select
    (cross_attention_lengths, dict(B=2, H=8, M=2048, N=3000, D=64), False)])
def test_only_a_bounded_sweep_goes_without_block_lists_and_says_so(kernel, sizes, bounded):
    made = templated(kernel)
    plan, source = made.describe_plan(**sizes), made.source(**sizes)
    assert ("no block lists" in plan) == bounded, plan
    assert ("bm_partial_num" in source) != bounded and ("hi_n = " in source) == bounded, source


def test_loads_under_a_branch_fetch_only_where_it_is_taken_unless_it_varies_along_them():
    """The segment's rows are masked by the segment's length (the mask is constant along the
    columns, the loads' vectors); the row log-sum-exp's mask runs along its contiguous columns:
    its loads keep only their edge mask (vectors, not one element a lane)."""
    rows = templated(segment_mean).source(R=5000, D=1024, G=64)
    load = next(line for line in rows.splitlines() if "tl.load(x +" in line)
    cond = next(line.split(" = ")[0].strip() for line in rows.splitlines()
                if "< _t" in line and "offs_n" in line)
    assert f"mask={cond}" in load, rows
    along = templated(ragged_logsumexp).source(B=7, S=3000)
    load = next(line for line in along.splitlines() if "tl.load(x +" in line)
    assert "mask=(offs_n[None, :] < 3000)," in load, along


def test_a_value_read_by_a_branch_and_its_condition_is_loaded_once():
    """``where(x > 0, x, 0)``: the condition varies along x's vectors, so no branch masks the
    load, and the branch shares the condition's (a second load of x read every byte twice)."""
    from tests.schedule_templates.gpu_monoids_check import mean_of_the_positive

    source = tf.compile(mean_of_the_positive, target="cuda:sm_90a").source(M=64, N=64)
    assert source.count("tl.load(x + ") == 1, source


@pytest.mark.parametrize("name", list(CASES))
def test_bounded_sweeps_match_float64_on_the_cpu_target(name):
    kernel, case = CASES[name]
    seed = fresh_seed()
    args, want = case(torch.Generator().manual_seed(seed))
    assert relative_error(tf.compile(kernel, target="cpu")(**args), want) < 2e-2, seed


def test_bounded_sweeps_match_float64_in_the_interpreter():
    seed = fresh_seed()
    errors = run_interpreted("tests.schedule_templates.sweep_bounds_check", seed)
    assert set(errors) == set(CASES) | set(ROW_TILES), errors
    assert max(errors.values()) < 2e-2, (errors, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_bounded_sweeps_match_float64_on_the_gpu(name):
    kernel, case = CASES[name]
    args, want, seed = gpu_case(case)
    assert relative_error(tf.compile(kernel)(**args), want) < 2e-2, seed


@pytest.mark.gpu
def test_a_graph_replayed_after_the_lengths_change_sums_the_new_segments():
    """The bounds are read by the kernel at each replay: a captured call sums the windows the
    tensors hold when it is replayed (block lists made at capture would keep the old ones)."""
    args, _, seed = gpu_case(CASES["window_sum"][1])
    made = tf.compile(window_sum)
    made(**args)
    graph, out = torch.cuda.CUDAGraph(), None
    with torch.cuda.graph(graph):
        out = made(**args)
    x, lo, hi = args["x"], args["lo"], args["hi"]
    for shift in (0, 37, -300):
        lo.copy_((lo.long() + shift).to(torch.int32))
        hi.copy_((hi.long() - shift).to(torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        want = torch.stack([x[k, max(int(a), 0):max(int(b), 0)].double().sum(0)
                            for k, (a, b) in enumerate(zip(lo.cpu(), hi.cpu()))])
        assert relative_error(out, want) < 2e-2, (shift, seed)


def test_a_ragged_sweep_defaults_to_whole_rows_by_short_blocks_and_tunes_around_them():
    """Segments of 1-128 rows of 1024: tiles of the whole row by 16-row blocks, three ahead
    (``row_reduction.BOUNDED_ROWS``); 32 sequences' tokens (32 whole-row tiles would leave most
    SMs idle): 64-row tiles by blocks of 128. Tuning tries blocks of 16-64 and narrower tiles."""
    from tensorfuse.schedule_templates.row_reduction import default_knobs, knob_choices
    from tensorfuse.targets import get_target

    hopper = get_target("cuda:sm_90a")
    plan = templated(segment_mean).planner.plan(dict(R=140000, D=1024, G=2048))
    knobs = default_knobs(plan, hopper)
    assert (knobs.block_m, knobs.block_n, knobs.num_stages) == (1024, 16, 3), knobs
    choices = knob_choices(plan, hopper)
    assert {16, 32, 64, 128} <= set(choices["block_n"]), choices
    assert {256, 512, 1024} <= set(choices["block_m"]), choices
    few = templated(lengths_mean_pool).planner.plan(dict(B=32, S=2048, D=1024))
    knobs = default_knobs(few, hopper)
    assert (knobs.block_m, knobs.block_n, knobs.num_stages) == (64, 128, 3), knobs
