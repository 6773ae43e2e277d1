"""The elementwise template (:mod:`tensorfuse.schedule_templates.elementwise`): programs without
reductions — activations, broadcasts, the gradients of means — as one pass of Triton tiles
rather than TVM's default schedule: which programs it takes and why it refuses the others, what
``tf.compile`` picks, sizes as arguments, the sm_90a code's vector loads and stores, and its
numbers against float64 in Triton's interpreter and on a GPU."""
import re
import warnings

import pytest

import tensorfuse as tf
from benchmarks.window_kernels import avg_pool_3x3_stride_2
from tensorfuse import dsl as T
from tensorfuse.errors import NoTemplateWarning, TargetError
from tensorfuse.schedule_templates.elementwise import plan_elementwise
from tensorfuse.schedule_templates.elementwise import unrolled
from tests.schedule_templates.elementwise_check import (CASES, avg_pool_3x3, complex_magnitude,
                                                        gelu_tanh, global_avg_pool, max_pool_2x2,
                                                        maxout, rotary, token_mean, two_outputs)


def test_the_plan_inlines_intermediates_and_keeps_the_outputs_axes():
    plan = plan_elementwise(two_outputs.program)
    assert [a.name for a in plan.axes] == ["i", "j"]
    assert [c.name for c, _ in plan.outputs] == [c.name for c in two_outputs.program.outputs]
    assert "sigmoid" in plan.describe() and "bias[j]" in plan.describe()


@tf.kernel
def _row_sum(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    return T.sum(x[i, j], over=j)


@tf.kernel
def _row_and_column(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    return x[i, j] * 2.0, x[i, 0] + 1.0


@pytest.mark.parametrize("kernel, why", [(_row_sum, "reduce: not an elementwise program"),
                                         (_row_and_column, "run over different axes")])
def test_programs_it_does_not_take_are_refused_with_the_reason(kernel, why):
    with pytest.raises(TargetError, match=why):
        plan_elementwise(kernel.program)


@pytest.mark.parametrize("kernel", [tf.grad(token_mean), gelu_tanh])
def test_tf_compile_runs_programs_without_reductions_on_it_unwarned(kernel):
    pytest.importorskip("triton", reason="the template generates Triton kernels")
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoTemplateWarning)   # not TVM's default schedule
        made = tf.compile(kernel, target="cuda:sm_90a")
    assert made.schedule_origin() == "elementwise template (one flat pass over the outputs)"


def test_sm90a_code_loads_and_stores_vectors_along_the_innermost_axis():
    pytest.importorskip("triton", reason="the template generates Triton kernels")
    ptx = tf.compile(gelu_tanh, target="cuda:sm_90a").ptx(M=8192, N=4096)
    assert {"ld.global.v4.b32", "st.global.v4.b32"} <= set(
        re.findall(r"(?:ld|st)\.global[.\w]*", ptx))
    # a broadcast's gradient: its stores are vectors even where its rows are 56 wide
    backward = tf.compile(tf.grad(global_avg_pool), target="cuda:sm_90a")
    assert "st.global.v4" in backward.ptx(B=64, C=256, H=56, W=56)


def test_a_feature_read_at_d_plus_half_modulo_d_is_loaded_by_vectors():
    """Rotary embeddings' partner feature: x[…, (d + D/2) % D] is a remainder of non-negative
    values, written as Triton's % (its floor-modulo helper hid the contiguity: a load a lane)
    and loaded once for both branches of its where."""
    pytest.importorskip("triton", reason="the template generates Triton kernels")
    made = tf.compile(rotary, target="cuda:sm_90a")
    sizes = dict(B=4, S=4096, H=32, D=128)
    assert "_floormod" not in made.source(**sizes).split("def rotary_elementwise")[1]
    assert made.source(**sizes).count("tl.load(x + ") == 2
    loads = set(re.findall(r"ld\.global[.\w]*", made.ptx(**sizes)))
    assert loads == {"ld.global.v4.b32"}


@tf.kernel
def _softmax_of_8(x: T.Tensor["M", 8, "f32"]):
    i, e = T.axes("i e")
    m = T.max(x[i, e], over=e)
    return T.exp(x[i, e] - m) / T.sum(T.exp(x[i, e] - m), over=e)


@tf.kernel
def _window_of_25(x: T.Tensor["M", 25, "f32"]):
    i, k = T.axes("i k")
    return T.max(x[i, k], over=k)


def test_a_program_takes_fewer_elements_the_more_tensors_an_element_reads():
    """One load an element (a pooled gradient's broadcast): 4096 a program; four (rotary, a
    2×2 window written out): 1024; nine (a 3×3 window of stride 2 written out): 256 (the
    measurements in ``targets.triton.elementwise``)."""
    from tensorfuse.targets.triton.elementwise import tile_shape

    pooled = tf.compile(tf.grad(global_avg_pool), target="cuda:sm_90a")
    assert tile_shape(pooled.plan, dict(B=64, C=512, H=56, W=56)) == (64, 64)
    turned = tf.compile(rotary, target="cuda:sm_90a")
    assert tile_shape(turned.plan, dict(B=4, S=4096, H=32, D=128)) == (8, 128)
    sizes = dict(B=32, C=128, H=56, P=2, W=56, Q=2)
    window = tf.compile(max_pool_2x2, target="cuda:sm_90a").for_sizes(**sizes)
    assert tile_shape(window.plan, sizes) == (16, 64)
    strided = tf.compile(avg_pool_3x3_stride_2, target="cuda:sm_90a")
    sizes = strided.program.with_derived_sizes(dict(B=64, C=64, H=112, W=112))
    assert tile_shape(strided.plan, sizes) == (4, 64)


@tf.kernel
def _group_norm_output(x: T.Tensor["B", "P", "G", "C", "bf16"], w: T.Tensor["G", "C", "bf16"],
                       mean: T.Tensor["B", "G", "f32"], rstd: T.Tensor["B", "G", "f32"]):
    """A channels-last group norm's output stage: x streamed, three tables read from cache."""
    b, p, g, c = T.axes("b p g c")
    return T.cast((x[b, p, g, c] - mean[b, g]) * rstd[b, g] * w[g, c], "bf16")


def test_tables_read_from_cache_do_not_shrink_the_programs():
    """Loads of tensors of at most 1/1024 of the outputs (statistics per group, a weight per
    channel) are not streams: one stream and three such tables take 4096 elements a program,
    not 1024; at small sizes (the tables 1/64 of the outputs) they count again, and where the
    sizes are arguments they are compared as such (a guard, not a failure)."""
    from tensorfuse.dsl.symbolic_sizes import symbolic
    from tensorfuse.targets.triton.elementwise import distinct_loads, tile_shape

    made = tf.compile(_group_norm_output, target="cuda:sm_90a")
    big = dict(B=16, P=4096, G=32, C=16)
    assert distinct_loads(made.plan, big) == 1
    assert tile_shape(made.plan, big) == (256, 16)
    small = dict(B=2, P=4, G=32, C=16)
    assert distinct_loads(made.plan, small) == 4 and tile_shape(made.plan, small) == (64, 16)
    with symbolic(big, {"P"}) as (sym, guards):
        assert distinct_loads(made.plan, sym) == 1
    assert guards.items   # the comparison with P is kept as the build's guard


def test_reductions_over_a_few_elements_are_written_out():
    """A 3×3 window of literal extents at compile time, a 2×2 one of named sizes at the call's
    sizes; not a reduction whose terms read another (a softmax of 8) nor one of 25 terms."""
    pytest.importorskip("triton", reason="the template generates Triton kernels")
    made = tf.compile(avg_pool_3x3, target="cuda:sm_90a")
    assert made.schedule_origin(B=2, C=3, H=4, W=5).endswith(
        "out_sum over p, q written out (9 terms)")
    pooled = tf.compile(max_pool_2x2, target="cuda:sm_90a")
    assert pooled.schedule_origin(B=32, C=128, H=56, P=2, W=56, Q=2) == (
        "elementwise template (one flat pass over the outputs); out_max over p, q written out "
        "(4 terms)")
    assert pooled.schedule_origin(B=2, C=3, H=4, P=5, W=6, Q=5).startswith(
        "p, q swept as one axis")
    assert unrolled(_softmax_of_8.program) is None
    assert unrolled(_window_of_25.program) is None
    program, note = unrolled(max_pool_2x2.program, dict(P=2, Q=2))
    assert not any(c.is_reduction for c in program.computes) and "4 terms" in note


def test_one_small_reduction_of_a_named_extent_is_written_out_at_the_sizes_that_allow_it():
    """Maxout (the max of each K consecutive features): K=4 written out, K=64 the row template's
    sweep — both from one tf.compile; a literal pair (|z| of (real, imaginary)) too, ahead of
    the row template that also takes it."""
    pytest.importorskip("triton", reason="the template generates Triton kernels")
    made = tf.compile(maxout, target="cuda:sm_90a")
    assert made.schedule_origin(M=64, N=128, K=4).endswith("out_max over k written out (4 terms)")
    assert made.schedule_origin(M=64, N=128, K=64) == "template defaults"
    assert "tl.split" not in made.source(M=64, N=128, K=64)
    pairs = tf.compile(complex_magnitude, target="cuda:sm_90a")
    assert pairs.schedule_origin(M=64, N=4096).endswith("out_sum over c written out (2 terms)")


def test_a_windows_terms_along_the_innermost_axis_are_one_contiguous_load_split_in_registers():
    """A 2×2 window's columns x[…, j, 0] and x[…, j, 1] (each alone a load every other element,
    one element a lane): one load of the tile's 2·columns elements, split in two; maxout's four
    terms: one load split twice. Vector loads on sm_90a and gfx942."""
    pytest.importorskip("triton", reason="the template generates Triton kernels")
    sizes = dict(B=32, C=128, H=56, P=2, W=56, Q=2)
    pooled = tf.compile(max_pool_2x2, target="cuda:sm_90a").for_sizes(**sizes)
    source = pooled.source(**sizes)
    assert source.count("tl.load(") == 2 and source.count("tl.split(") == 2   # one a row pair
    loads = set(re.findall(r"ld\.global[.\w]*", pooled.ptx(**sizes)))
    assert loads == {"ld.global.v4.b32"}, loads
    window = tf.compile(maxout, target="cuda:sm_90a").for_sizes(M=64, N=1024, K=4)
    source = window.source(M=64, N=1024, K=4)
    assert source.count("tl.load(") == 1 and source.count("tl.split(") == 3
    assert set(re.findall(r"ld\.global[.\w]*", window.ptx(M=64, N=1024, K=4))) == \
        {"ld.global.v4.b32"}
    amd = tf.compile(max_pool_2x2, target="rocm:gfx942").for_sizes(**sizes)
    assembly = amd.compiled(**sizes).asm["amdgcn"]
    assert "global_load_dwordx4" in assembly and "global_load_ushort" not in assembly


def test_a_size_seen_twice_becomes_an_argument_of_one_build():
    pytest.importorskip("triton", reason="the template generates Triton kernels")
    made = tf.compile(tf.grad(token_mean), target="cuda:sm_90a")
    first, second = made.source(B=2, S=37, D=19), made.source(B=2, S=53, D=19)
    assert first != second   # exact sizes until a size is seen at a second value …
    made.source(B=2, S=71, D=19)
    builds = made.cache_info()
    assert any(len(b.sizes) >= 2 for b in builds), [b.describe() for b in builds]


def test_tuning_it_says_it_has_nothing_to_tune():
    from tensorfuse.autotune.tasks import make_task
    from tensorfuse.errors import TuningError
    from tensorfuse.targets import get_target

    hopper = get_target("cuda:sm_90a")
    with pytest.raises(TuningError, match="elementwise template on cuda:sm_90a .no reductions."):
        make_task(gelu_tanh, dict(M=64, N=128), hopper)
    # reductions written out: at compile time (literal extents), at the call's sizes (named)
    with pytest.raises(TuningError, match=r"\(out_sum over p, q written out \(9 terms\)\)"):
        make_task(avg_pool_3x3, dict(B=2, C=3, H=4, W=5), hopper)
    with pytest.raises(TuningError, match="out_max over p, q written out .4 terms"):
        make_task(max_pool_2x2, dict(B=2, C=3, H=4, P=2, W=5, Q=2), hopper)
    # a 5×5 window is a sweep: tf.compile's flat row kernel, which has knobs
    assert make_task(max_pool_2x2, dict(B=2, C=3, H=4, P=5, W=5, Q=5), hopper).template


def test_programs_match_float64_in_the_triton_interpreter():
    from tests.helpers import check_interpreted

    check_interpreted("tests.schedule_templates.elementwise_check", CASES)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_programs_match_float64_on_the_gpu(name):
    import torch

    from tests.helpers import gpu_case, relative_error

    kernel, case = CASES[name]
    args, wants, seed = gpu_case(case)
    made = tf.compile(kernel, dynamic=True if name.endswith("sizes_as_arguments") else None)
    got = made(**args)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, wants):
        assert relative_error(g, w.cuda()) < 2e-2, seed
    again = made(**args)   # a repeated call: the fast call the first one kept
    again = again if isinstance(again, tuple) else (again,)
    assert made._fast, "no fast call kept"
    for g, w in zip(again, got):
        assert torch.equal(g, w), seed


def test_tuning_refuses_a_window_written_out_at_the_jobs_sizes_and_tunes_a_wide_one():
    from tensorfuse.autotune.tasks import make_task
    from tensorfuse.errors import TuningError
    from tensorfuse.targets import get_target

    hopper = get_target("cuda:sm_90a")
    with pytest.raises(TuningError, match="out_max over k written out .4 terms"):
        make_task(maxout, dict(M=64, N=128, K=4), hopper)
    assert make_task(maxout, dict(M=64, N=128, K=64), hopper).template == "row_reduction"


def test_a_shifted_read_under_a_where_is_masked_inside_its_tensor():
    """Mamba's causal convolution reads x[b, c, t - k] where t >= k selects it: at t < k that
    element is outside the tensor (before its start, for the first channel), so the loads with
    k > 0 are masked by the index's range, not only discarded by the where."""
    from benchmarks.unlisted_kernels import causal_conv1d

    pytest.importorskip("triton", reason="the template generates Triton kernels")
    sizes = dict(B=8, C=64, L=2048, K=4)
    made = tf.compile(causal_conv1d, target="cuda:sm_90a").for_sizes(**sizes)
    loads = [line for line in made.source(**sizes).splitlines() if "tl.load(x +" in line]
    assert len(loads) == 4 and sum(">= 0)" in line for line in loads) == 3, loads


def test_index_ranges_over_axes_and_literals():
    from tensorfuse.dsl.expr import Axis, Const, binary
    from tensorfuse.targets.triton.expr import index_range

    t, k = Axis("t", "L"), Axis("k", 4)
    assert index_range(binary("sub", t, k), {"L": 100}) == (-3, 99)
    assert index_range(binary("add", t, Const(2, "i32")), {"L": 100}) == (2, 101)
    assert index_range(binary("mod", binary("add", t, Const(50, "i32")), Const(100, "i32")),
                       {"L": 100}) == (0, 99)
    assert index_range(binary("sub", t, k), {}) == (-3, None)   # L an argument: its top unknown
