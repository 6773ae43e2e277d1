"""The DSL's other monoids on the GPU templates — ``T.logsumexp`` and the arg reductions written as
reductions they keep (:mod:`tensorfuse.schedule_templates.monoid_rewrites`; an arg reduction's
index a state that resets where its extremum moves), ``T.prod`` and a user's ``T.Monoid`` of one
or several components kept by the row template itself (``tl.reduce`` with a combine function
written from the monoid: :mod:`tensorfuse.targets.triton.reductions`); before, a program
reducing with them ran on TVM's default GPU schedule. The rewrites' math on the CPU
target against the monoids as the CPU lowering computes them (unfused, rolled and split; rows of
−∞, +∞ and NaN included), ``tf.compile``'s routes, the sm_90a code of a product, and the Triton
kernels in the interpreter against float64 (:mod:`.gpu_monoids_check`)."""
import numpy as np
import pytest
import torch
import tvm

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.binding import bind_call
from tensorfuse.schedule_templates import lower_program
from tensorfuse.schedule_templates.fusion import Fusion
from tensorfuse.schedule_templates.monoid_rewrites import rewritten_monoids
from tensorfuse.widened_kernel import RewrittenKernel
from tests.helpers import (check_interpreted, fresh_seed, gpu_case, poisoned_call,
                           runs_a_template)
from tests.schedule_templates.gpu_monoids_check import (CASES, SUM_COUNT, argmax_rows,
                                                        best_and_where, compound_rows, error,
                                                        lse_and_sum, lse_rows, prod_rows,
                                                        top_two_margin)

LLVM = tvm.target.Target({"kind": "llvm"})


def test_each_logsumexp_becomes_a_maximum_a_sum_and_their_value():
    program, note = rewritten_monoids(lse_and_sum.program)
    kinds = [(c.name, c.monoid.name if c.monoid else None) for c in program.computes]
    assert kinds == [("out0_max", "max"), ("out0_sum_exp", "sum"), ("out0", None),
                     ("out1", "sum")]
    assert [c.name for c in program.outputs] == ["out0", "out1"] and "out0 written as" in note
    assert rewritten_monoids(tf.kernel(_no_rewrite).program) is None

    @tf.kernel
    def taken_names(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        out_max = T.max(x[i, j], over=j)
        return T.logsumexp(x[i, j] - out_max, over=j)

    names = [c.name for c in rewritten_monoids(taken_names.program)[0].computes]
    assert len(set(names)) == len(names) and "out_max_2" in names   # no name taken twice


def test_an_arg_reduction_becomes_its_extremum_and_the_first_index_holding_it():
    program, note = rewritten_monoids(best_and_where.program)
    kinds = [(c.name, c.monoid.name if c.monoid else None) for c in program.computes]
    assert kinds == [("out0_argmax_value", "max"), ("out0_argmax_index", "min"), ("out0", None),
                     ("out1", None)]
    assert "out0_argmax written as the extremum" in note

    @tf.kernel
    def scored(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        return T.argmax(x[i, j] - 0.5 * j, over=j)

    # a multiply-add the two kernels might round apart: the pair stays whole (on TVM's schedule)
    assert rewritten_monoids(scored.program) is None


def _no_rewrite(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    return T.sum(x[i, j], over=j)


def _run(program, x, fusion=()):
    fn = tvm.compile(lower_program(program, fusion, None, "int32"), target=LLVM)[program.name]
    dtypes = [np.int32 if c.dtypes[0] == "i32" else np.float32 for c in program.outputs]
    outs = [tvm.runtime.tensor(np.full(x.shape[0], -1 if d is np.int32 else np.nan, d))
            for d in dtypes]
    fn(tvm.runtime.tensor(x), *outs)
    return [o.numpy() for o in outs]


@pytest.mark.parametrize("fused", [None, (8, 1), (8, 3)])
def test_the_logsumexp_rewrite_is_the_logsumexp_unfused_rolled_and_split(fused):
    """On the CPU target, as written and fused: rows of −∞ give −∞ (an empty sum's log), a row
    holding +∞ gives +∞ — never NaN — and finite rows their logsumexp to float32 rounding."""
    program, _ = rewritten_monoids(lse_rows.program)
    names = tuple(c.name for c in program.computes if c.is_reduction)
    x = (np.random.default_rng(5).standard_normal((6, 77)) * 50).astype(np.float32)
    x[2], x[4, 5] = -np.inf, np.inf
    (got,) = _run(program, x, () if fused is None else (Fusion(names, "j", *fused),))
    want = torch.logsumexp(torch.tensor(x, dtype=torch.float64), -1).numpy()
    assert got[2] == -np.inf and got[4] == np.inf
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)


@pytest.mark.parametrize("fused", [None, (8, 1), (8, 3)])
def test_the_arg_rewrite_gives_what_the_pair_gives(fused):
    """The pair's value and index as the CPU lowering computes the monoid — ties to the first
    index, NaN never taken, a row of infinities, a row of NaN given the first index —
    and the rewritten program's on the same rows, as written and fused into one pass by TensorIR
    (the index reset where the maximum moves, compared with its running value itself — a row
    of +∞ too: rolled, and split in three parts)."""
    x = np.random.default_rng(6).integers(-3, 4, (7, 41)).astype(np.float32)   # ties
    x[2] = -np.inf
    x[3, :5] = np.nan
    x[4] = np.nan
    x[5, 30] = np.inf
    want = _run(best_and_where.program, x)
    program, _ = rewritten_monoids(best_and_where.program)
    names = tuple(c.name for c in program.computes if c.is_reduction)
    got = _run(program, x, () if fused is None else (Fusion(names, "j", *fused),))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # a row of NaN, a row of −∞: nothing beat the pair's identity, so the first index (as
    # torch.argmax gives a row of −∞), never the identity's own, out of the row
    assert want[1][4] == want[1][2] == 0


def test_tf_compile_takes_them_to_the_templates_on_gpus_and_leaves_the_cpu_its_own():
    made = tf.compile(lse_rows, target="cuda:sm_90a")
    assert isinstance(made, RewrittenKernel)
    assert made.schedule_origin(M=4096, N=8192).startswith("out written as max + log Σ exp")
    assert "row-reduction template (rolling_update(out_max, out_sum_exp" in made.description
    assert "row-reduction template" in tf.compile(lse_rows, target="cuda:sm_80").description
    assert not isinstance(tf.compile(lse_rows, target="llvm"), RewrittenKernel)
    arg = tf.compile(argmax_rows, target="cuda:sm_90a")
    assert isinstance(arg, RewrittenKernel)
    assert "row-reduction template (rolling_update(out_argmax_value, out_argmax_index" in \
        arg.description   # one pass: the index resets where the maximum moves
    assert "default GPU schedule" not in arg.schedule_origin(M=64, V=128256)


def test_a_reset_compares_with_the_maximums_value_itself():
    """The index's state reads the maximum's running state (exact: +∞ too), never its reference
    (the largest finite number where the maximum is infinite), and is kept as an integer."""
    source = tf.compile(argmax_rows, target="cuda:sm_90a").source(M=64, V=128256)
    assert "== st_out_argmax_value_0)" in source and "(old_out_argmax_value == " in source
    assert "tl.full([BLOCK_M, 1], 2147483647, tl.int32)" in source   # an index kept as one


@pytest.mark.parametrize("kernel", [prod_rows, compound_rows])
def test_a_product_or_a_users_monoid_is_a_state_of_the_row_template(kernel):
    """``tl.reduce`` with a combine function written from the monoid's own combine expression,
    defined once in the source that calls it; Triton compiles it for sm_90a."""
    made = tf.compile(kernel, target="cuda:sm_90a")
    assert "row-reduction template (rolling_update(out" in made.description
    source = made.source(M=4096, N=8192)
    name = f"_tf_combine_{kernel.program.computes[0].monoid.name}_"
    assert "tl.reduce(" in source and source.count(f"def {name}") == 1
    assert "_tf_combine_" not in tf.compile(lse_rows, target="cuda:sm_90a").source(M=64, N=64)
    assert "mul.f32" in made.ptx(M=4096, N=8192)


def test_a_users_monoid_of_two_components_is_reduced_as_a_tuple():
    """One function (a tuple back) combines the running components with a block's, per lane
    in a row swept in blocks, and folds the lanes together after the sweep in one ``tl.reduce``
    of the tuple; Triton compiles it for sm_90a; a member others depend on is refused."""
    import re

    made = tf.compile(top_two_margin, target="cuda:sm_90a")
    assert "row-reduction template (rolling_update(out_top_two" in made.description
    source = made.source(M=64, N=17003)
    (name,) = re.findall(r"def (_tf_combine_top_two_\w+)\(a0, a1, b0, b1\):", source)
    states = "st_out_top_two_0, st_out_top_two_1"
    assert f"{states} = {name}({states}, c_out_top_two_0, c_out_top_two_1)" in source
    assert f"{states} = tl.reduce(({states},), 1, {name}, keep_dims=True)" in source
    assert ".visible .entry" in made.ptx(M=64, N=17003)

    @tf.kernel
    def centred(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        total = T.reduce((x[i, j], 1.0), over=j, monoid=SUM_COUNT)
        return T.sum(x[i, j] - total[0] / total[1], over=j)

    from tensorfuse.algebra import plan_chain
    from tensorfuse.errors import TargetError
    from tensorfuse.schedule_templates.tile_plan import plan_rowtile

    names = [c.name for c in centred.program.computes if c.is_reduction]
    with pytest.raises(TargetError, match="where no other member depends on it"):
        plan_rowtile(centred.program, plan_chain(centred.program, names, "j"), dict(M=8, N=64))


@pytest.mark.parametrize("name", ["at_the_maximum", "first_of_the_largest", "class_per_pixel",
                                  "mean_of_the_positive", "argmax_rows", "most_counted",
                                  "heatmap_peak", "nearest_cell"])
def test_resets_and_tuples_compile_for_sm90a_at_the_interpreters_sizes(name):
    """Triton's interpreter does not check the types a loop carries: each path the interpreter
    runs (states per lane, split parts, strided rows) is compiled for sm_90a too."""
    kernel, case = CASES[name]
    args, _ = case(torch.Generator().manual_seed(0))
    dims = bind_call(kernel.program, (), args, "cpu").dims
    assert ".visible .entry" in tf.compile(kernel, target="cuda:sm_90a").ptx(**dims)


@pytest.mark.parametrize("name", ["heatmap_peak", "nearest_cell"])
def test_an_arg_reduction_over_two_axes_is_the_row_major_index_on_the_cpu(name):
    """The CPU target folds the (value, index) pair itself over both axes — the index the
    element's row-major place in the block, ties to the first — as the GPU's rewrite does in
    the interpreter (:mod:`.gpu_monoids_check`)."""
    kernel, case = CASES[name]
    args, want = case(torch.Generator().manual_seed(fresh_seed()))
    outs = poisoned_call(tf.compile(kernel, target="llvm"), kernel.program, args, want)
    wants = list(want) if isinstance(want, (tuple, list)) else [want]
    assert max(error(o, w) for o, w in zip(outs, wants)) < 1e-6


def test_an_arg_reduction_needs_the_sizes_of_the_axes_it_numbers():
    with pytest.raises(tf.errors.AxisError, match="axis k's size must be known"):
        @tf.kernel
        def unsized(x: T.Tensor["M", "f32"]):
            i, k = T.axes("i k")
            return T.argmax(x[i] + 0.0 * k, over=(i, k))


def test_two_user_monoids_of_one_name_keep_their_own_combines():
    from tensorfuse.targets.triton.reductions import combine_function

    plus = T.Monoid("mine", lambda a, b: a + b, (0.0,))
    times = T.Monoid("mine", lambda a, b: a * b, (1.0,))
    assert combine_function(plus) != combine_function(times)


def test_the_triton_kernels_match_float64_in_the_interpreter():
    check_interpreted("tests.schedule_templates.gpu_monoids_check", CASES)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_on_the_gpu_matches_float64(name):
    """The interpreter's cases on the GPU: each stage a template, outputs poisoned, infinities
    where the reference has them and every index the reference's."""
    kernel, case = CASES[name]
    args, want, seed = gpu_case(case)
    made = tf.compile(kernel)
    origin = made.schedule_origin(**bind_call(kernel.program, (), args, "cuda").dims)
    assert "default GPU schedule" not in origin, origin
    inner = made.inner if isinstance(made, RewrittenKernel) else made
    if not hasattr(inner, "kernels"):   # one kernel: the template runs these sizes
        assert runs_a_template(inner, args), inner
    outs = poisoned_call(made, kernel.program, args, want)
    wants = list(want) if isinstance(want, (tuple, list)) else [want]
    worst = max(error(o.cpu(), w) for o, w in zip(outs, wants))
    assert worst < 2e-2, f"{name}: {worst:.1e} (TENSORFUSE_SEED={seed})"
