"""GPU template spaces, checked without a GPU: MetaSchedule samples the knobs, the Triton builder
compiles each candidate for sm_90a (or reports why not), the cost model's features see the
knobs; on the GPU, a short job tunes attention and compile then uses the record."""
import json

import numpy as np
import pytest
import tvm

import tensorfuse as tf
from tensorfuse import kernels as K
from tensorfuse.autotune.tasks import knob_space, knobs_of, make_task

pytest.importorskip("triton", reason="the GPU templates generate Triton kernels")

ATTENTION = dict(B=1, H=2, M=512, N=512, D=64)


def _candidates(task, count):
    space = knob_space(task.choices())
    out = []
    for seed in range(count):
        sch = tvm.s_tir.Schedule(task.mod, seed=seed + 1)
        space(sch)
        out.append(sch.mod)
    return out


@pytest.mark.parametrize("kernel, sizes, target, template", [
    (K.causal_attention, ATTENTION, "cuda:sm_80", "attention"),
    (K.sliding_window_attention, ATTENTION, "cuda:sm_90a", "hopper_attention"),  # what compile
    (K.layernorm, dict(M=256, N=4096), "cuda:sm_90a", "row_reduction"),          # runs there
    (K.gqa_attention, dict(B=2, H=8, HKV=2, M=1, N=4096, D=64), "cuda:sm_80", "attention"),
    (K.gqa_attention, dict(B=2, H=8, HKV=2, M=4, N=4096, D=64), "cuda:sm_90a", "attention"),
    (K.gqa_attention, dict(B=2, H=8, HKV=2, M=1, N=4096, D=64), "cuda:sm_90a", "cluster_decode"),
])
def test_sampled_knobs_come_from_the_template_and_build(kernel, sizes, target, template):
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from tensorfuse.autotune.builder import TritonBuilder

    task = make_task(kernel, sizes, tf.get_target(target))
    assert task.template == template
    choices = task.choices()
    candidates = _candidates(task, 6)
    picked = [knobs_of(m) for m in candidates]
    for knobs in picked:
        assert set(knobs) == set(choices)
        assert all(knobs[k] in choices[k] for k in knobs)
    assert len({json.dumps(k, sort_keys=True) for k in picked}) > 1  # the decisions vary
    # tuning prunes the settings the template refuses (pruning.py); the others build
    fit = [m for m in candidates if task.unfit(knobs_of(m)) is None][:2]
    assert fit
    builder = TritonBuilder({task.name: task})
    results = builder.build([BuilderInput(m, task.target.tvm_target) for m in fit])
    for mod, result in zip(fit, results):
        assert result.error_msg is None, result.error_msg
        with open(result.artifact_path) as f:
            assert json.load(f) == {"task": task.name, "knobs": knobs_of(mod)}


def test_a_candidate_that_cannot_compile_is_reported():
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from tensorfuse.autotune.builder import TritonBuilder
    from tensorfuse.schedule_templates.annotations import KNOB_PREFIX

    task = make_task(K.causal_attention, ATTENTION, tf.get_target("cuda:sm_80"))
    sch = tvm.s_tir.Schedule(task.mod)
    sch.annotate(sch.get_sblock("root"), KNOB_PREFIX + "block_n", 48)  # not a power of two
    (result,) = TritonBuilder({task.name: task}).build([BuilderInput(sch.mod,
                                                                    task.target.tvm_target)])
    assert result.artifact_path is None and "build failed" in result.error_msg


def test_a_failed_build_reports_what_it_was_raised_from_within_its_limit():
    """A front-end error names the failing line; the builder's report also says what failed
    there (the exception it was raised from), keeping the beginning and the end of long ones."""
    from tensorfuse.autotune.builder import failure

    try:
        try:
            raise ValueError("the reduction's combine function")
        except ValueError as inner:
            raise RuntimeError("at 32:16: c_l_0 = tl.sum(_t1, axis=1)") from inner
    except RuntimeError as outer:
        report = failure(outer)
        clipped = failure(RuntimeError("x" * 5000), limit=200)
    assert report.startswith("RuntimeError: at 32:16") and \
        "caused by ValueError: the reduction's combine function" in report
    assert len(clipped) <= 203 and clipped.startswith("RuntimeError: xxx") and clipped.endswith("x")


def test_knob_features_order_candidates():
    from tensorfuse.autotune.features import knob_features

    small = knob_features(dict(block_m=64, block_n=32, num_warps=4, num_stages=2, splits=1))
    large = knob_features(dict(block_m=128, block_n=128, num_warps=8, num_stages=3, splits=1))
    assert len(small) == len(large) and small != large
    assert np.all(np.isfinite(small + large))


def test_kernels_without_a_template_are_refused_for_gpu_tuning():
    from tensorfuse.errors import TuningError

    with pytest.raises(TuningError, match="does not fit the attention template"):
        make_task(K.ffn_gelu, dict(M=128, K=4096, N=14336, O=4096), tf.get_target("cuda:sm_80"))
    with pytest.raises(TuningError, match="runs on the hopper_ffn template"):
        make_task(K.ffn_gelu, dict(M=1024, K=4096, N=14336, O=4096), tf.get_target("cuda:sm_90a"))
    from tensorfuse import dsl as T

    @tf.kernel
    def double(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        return x[i, j] * 2.0

    with pytest.raises(TuningError, match="fits no GPU template"):
        make_task(double, dict(M=128, N=512), tf.get_target("cuda:sm_90a"))


@pytest.mark.gpu
def test_tuning_attention_on_the_gpu(tmp_path, monkeypatch, rng):
    """On the H100 prefill attention is a hopper_attention task, tuned at the window it is called
    with; compile uses that record for calls with that window."""
    from tensorfuse.autotune import tune
    from tensorfuse.kernels.reference import TOLERANCE, random_inputs, reference, relative_error

    monkeypatch.setenv("TENSORFUSE_CACHE", str(tmp_path))
    sizes = dict(B=1, H=4, M=1024, N=1024, D=128)
    summary = tune(K.sliding_window_attention, "cuda", trials=8, progress=False,
                   scalars={"window": 96}, **sizes)
    (task,) = summary.tasks
    assert task.trials == 8 and task.best_secs > 0 and task.name.endswith("{window=96}")
    compiled = tf.compile(K.sliding_window_attention, "cuda")
    assert "tuned record" in compiled.schedule_origin(**sizes, window=96)
    assert "tuned record" not in compiled.schedule_origin(**sizes, window=512)
    tensors, scalars = random_inputs(K.sliding_window_attention, sizes, rng, {"window": 96})
    out = compiled(**tensors, **scalars)
    ref = reference(K.sliding_window_attention, tensors, scalars)
    assert relative_error(out, ref) <= TOLERANCE["bf16"]


@pytest.mark.gpu
def test_tuning_on_a_worker_per_gpu(tmp_path, monkeypatch):
    """--gpus all: the job's own tracker and one worker per GPU measure; the job writes."""
    from tensorfuse.autotune import tune

    monkeypatch.setenv("TENSORFUSE_CACHE", str(tmp_path))
    summary = tune(K.softmax, "cuda", trials=8, progress=False, gpus="all", M=512, N=2048)
    (task,) = summary.tasks
    assert task.trials == 8 and task.failures_this_job == 0 and task.best_secs > 0
    assert summary.workers and all(":gpu" in w for w in summary.workers)
    assert tf.compile(K.softmax, "cuda").schedule_origin(M=512, N=2048).startswith("tuned record")
