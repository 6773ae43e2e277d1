"""Values reduced over every axis (outputs of shape []): the CPU's TVM lowering takes them as they
are; on GPUs (schedule_templates.unit_rows) they are one row of an axis of one element, swept in
parts by the row template — checked against float64 on the CPU target, through Triton's
interpreter, in sm_90a code and on a GPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorfuse as tf
from benchmarks.full_reductions import amax
from tensorfuse import dsl as T
from tensorfuse.errors import NoTemplateWarning
from tensorfuse.schedule_templates.unit_rows import with_unit_row
from tests.helpers import check_interpreted, poisoned_call, relative_error
from tests.schedule_templates import unit_rows_check
from tests.schedule_templates.unit_rows_check import CASES


@pytest.mark.parametrize("name", sorted(CASES))
def test_on_the_cpu_they_match_float64_with_shape_nothing(name):
    """The interpreter check's cases on the CPU target: outputs of shape [] computed as written,
    into poisoned arrays of that shape (``out=``) and returned."""
    kernel, case = CASES[name]
    args, want = case(torch.Generator().manual_seed(3))
    made = tf.compile(kernel, "cpu")
    wants = list(want) if isinstance(want, tuple) else [want]
    for out, w in zip(poisoned_call(made, kernel.program, args, wants), wants):
        assert out.shape == w.shape and relative_error(out, w) <= 1e-5, name
    got = made(**args)
    got = got if isinstance(got, tuple) else (got,)
    assert [g.shape for g in got] == [w.shape for w in wants]


def test_the_triton_kernels_match_float64_in_the_interpreter():
    check_interpreted("tests.schedule_templates.unit_rows_check", CASES, tolerance=1e-5)


def test_on_gpus_one_row_swept_in_two_parts_an_sm():
    made = tf.compile(amax, "cuda:sm_90a")
    assert "(over every axis) as one row" in made.schedule_origin(M=8192, N=8192)
    flat = made.for_sizes(M=8192, N=8192)
    plan = flat.for_sizes(M=8192, N=8192).describe_plan(M=8192, N=8192)
    assert "rows one (1)" in plan and "splits=264" in plan, plan
    ptx = made.ptx(M=8192, N=8192)   # the parts' merge compiles for sm_90a
    assert "atom.global" in ptx and "ld.global.cg" in ptx


def test_a_value_over_axes_reading_one_over_none_runs_in_two_stages():
    """``x / Σx``: the sum over every axis (one row) stored, then the elementwise template's
    pass reading it — no rewrite of the whole program (its division reads the sum along axes
    the unit axis is not one of)."""
    @tf.kernel
    def normalised(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        return x[i, j] / T.sum(x[i, j], over=(i, j))

    assert with_unit_row(normalised.program) is None
    with pytest.warns(NoTemplateWarning, match="runs as 2 kernels"):
        origin = tf.compile(normalised, "cuda:sm_90a").schedule_origin(M=4096, N=4096)
    assert "[1] out_sum from x: out_sum (over every axis) as one row" in origin, origin
    assert "[2] out from x, out_sum: elementwise template" in origin, origin
    x = np.random.default_rng(0).random((7, 11)) + 0.5
    got = tf.compile(normalised, "cpu")(x.astype(np.float32))
    np.testing.assert_allclose(got, x / x.sum(), rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_on_the_gpu_they_match_float64(name):
    """The interpreter check's cases (unit_rows_check: ragged, outliers, poisoned outputs of
    shape []) as tf.compile runs them on the GPU."""
    kernel, case = CASES[name]
    args, want = case(torch.Generator().manual_seed(9))
    args = {n: a.cuda() for n, a in args.items()}
    wants = [w.cuda() for w in (want if isinstance(want, tuple) else (want,))]
    outs = poisoned_call(tf.compile(kernel, "cuda"), kernel.program, args, wants)
    for out, w in zip(outs, wants):
        assert out.shape == w.shape and relative_error(out, w) <= 1e-5, name


def test_each_part_sums_per_lane_and_reads_its_stretch_once():
    """A part of a long sum keeps a sum per lane, folded once before it stores its state (a sum of
    16M terms added in per-lane runs, not a tree per block), and its loads are marked read once
    (one row in all: nothing is read again by another row)."""
    made = tf.compile(unit_rows_check.sum_of_squares, "cuda:sm_90a")
    source = made.for_sizes(N=1 << 24).source(N=1 << 24)
    assert "st_out_0 = tl.full([BLOCK_M, BLOCK_N]" in source
    folded = source.index("st_out_0 = tl.sum(st_out_0, axis=1")
    assert folded < source.index("tl.store(part_out_0")
    assert "eviction_policy='evict_first'" in source and "evict_last" not in source


def test_the_plan_shows_the_rewrite_and_each_stage():
    """``describe_plan`` of a value over every axis says how it was rewritten and shows the row
    plan; a mean cross-entropy, two stages: each with its kernel and plan."""
    made = tf.compile(amax, "cuda:sm_90a")
    plan = made.describe_plan(M=8192, N=8192)
    assert plan.startswith("out, out_max (over every axis) as one row") and \
        "rows one (1)" in plan and "splits=264" in plan
    staged = tf.compile(unit_rows_check.mean_cross_entropy, "cuda:sm_90a")
    plan = staged.describe_plan(M=37, V=1003)
    # the first stage stores the log-sum-exp a row, not its max and sum for the second to combine
    assert "[1] lse from logits" in plan and "[2] out from logits, target, lse" in plan
    assert plan.count("row-tile plan of") == 2
