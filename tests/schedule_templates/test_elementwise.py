"""The elementwise template (:mod:`tensorfuse.schedule_templates.elementwise`): programs without
reductions — activations, broadcasts, the gradients of means — as one pass of Triton tiles
rather than TVM's default schedule: which programs it takes and why it refuses the others, what
``tf.compile`` picks, sizes as arguments, the sm_90a code's vector loads and stores, and its
numbers against float64 in Triton's interpreter and on a GPU."""
import re
import warnings

import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import NoTemplateWarning, TargetError
from tensorfuse.schedule_templates.elementwise import plan_elementwise
from tests.schedule_templates.elementwise_check import (CASES, gelu_tanh, global_avg_pool,
                                                        token_mean, two_outputs)


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

    with pytest.raises(TuningError, match="no reductions: it runs on the elementwise template"):
        make_task(gelu_tanh, dict(M=64, N=128), get_target("cuda:sm_90a"))


def test_programs_match_float64_in_the_triton_interpreter():
    from tests.helpers import check_interpreted

    check_interpreted("tests.schedule_templates.elementwise_check", CASES)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_programs_match_float64_on_the_gpu(name):
    from tests.helpers import gpu_case, relative_error

    kernel, case = CASES[name]
    args, wants, seed = gpu_case(case)
    made = tf.compile(kernel, dynamic=True if name.endswith("sizes_as_arguments") else None)
    got = made(**args)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, wants):
        assert relative_error(g, w.cuda()) < 2e-2, seed
