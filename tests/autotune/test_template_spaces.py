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
    (K.matmul, dict(M=512, K=1024, N=768), "cuda:sm_80", "contraction"),   # GEMMs off Hopper
    (K.linear, dict(M=100, K=100, N=30), "cuda:sm_90a", "contraction"),   # rows TMA cannot copy
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

    with pytest.raises(TuningError,
                       match=r"runs on the elementwise template on cuda:sm_90a \(no reductions\)"):
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


@pytest.mark.parametrize("name, sizes", [
    ("group_norm", dict(B=2, G=4, C=8, P=256)),
    ("paged_decode", dict(B=2, H=8, HKV=2, D=64, PAGES=40, PAGE=16, NP=8))])
def test_a_chain_swept_over_several_axes_tunes_its_flat_program(name, sizes, tmp_path,
                                                                monkeypatch):
    """A group norm's sums over (c, p), a paged cache's (page, slot): tf.compile runs them as one
    axis of the product (``flat_sweeps``), so the task is that flat program's — its template's
    knobs — and a record of it is what compile's flat kernel finds at those sizes."""
    import benchmarks.user_kernels as U
    from tests.autotune.test_scalar_records import _record

    monkeypatch.setenv("TENSORFUSE_CACHE", str(tmp_path))
    kernel = getattr(U, name)
    task = make_task(kernel, sizes, tf.get_target("cuda:sm_90a"))
    assert task.template in ("row_reduction", "attention") and task.choices()
    assert task.name.startswith(f"{name}[") and task.kernel.program is not kernel.program
    compiled = tf.compile(kernel, "cuda:sm_90a")
    assert "tuned record" not in compiled.schedule_origin(**sizes)
    first = {n: v[-1] for n, v in task.choices().items()}
    for knobs in ({**first, **{n: v[0] for n, v in task.choices().items()}}, first):
        if task.unfit(knobs) is None:
            break
    _record(task, knobs, 1e-4)
    origin = tf.compile(kernel, "cuda:sm_90a").schedule_origin(**sizes)
    assert "swept as one axis" in origin and "tuned record (0.1 ms when tuned" in origin, origin
    assert "tuned record" not in tf.compile(kernel, "cuda:sm_90a").schedule_origin(
        **dict(sizes, B=3))   # other sizes: the defaults


def test_a_kernel_run_as_stages_tunes_each_templated_stage(tmp_path, monkeypatch):
    """A max-pool then an L2 norm over what it pooled: no template takes it whole, tf.compile runs
    it as two row kernels; tuning it makes a task per stage (the stage program's name and sizes),
    and each record is what that stage's kernel finds."""
    import benchmarks.user_kernels as U
    from tensorfuse.autotune.tasks import make_tasks
    from tensorfuse.errors import TuningError
    from tests.autotune.test_scalar_records import _record

    monkeypatch.setenv("TENSORFUSE_CACHE", str(tmp_path))
    sizes, target = dict(B=4, S=64, D=512), tf.get_target("cuda:sm_90a")
    with pytest.raises(TuningError, match="fits no GPU template"):
        make_task(U.max_pool_l2, sizes, target)   # not whole
    tasks = make_tasks(U.max_pool_l2, sizes, target)
    assert [t.name for t in tasks] == ["max_pool_l2_pooled[B=4,D=512,S=64]",
                                      "max_pool_l2_out[B=4,D=512]"]
    for task in tasks:
        knobs = {n: v[0] for n, v in task.choices().items()}
        assert task.unfit(knobs) is None
        _record(task, knobs, 2e-4)
    origin = tf.compile(U.max_pool_l2, "cuda:sm_90a").schedule_origin(**sizes)
    assert origin.startswith("staged: 2 kernels") and origin.count("tuned record (0.2 ms") == 2, \
        origin


SUITE_TASKS = [("sbhd_causal", dict(B=2, M=4096, N=4096, H=16, D=128)),
               ("bshd_causal", dict(B=2, M=4096, N=4096, H=16, D=64)),
               ("bshd_causal", dict(B=2, M=4096, N=4096, H=16, D=256)),
               ("two_head_dims_causal", dict(B=2, M=4096, N=4096, H=16, DQK=192, DV=128)),
               ("cross_attention_lengths", dict(B=4, M=1024, N=8192, H=16, D=128)),
               # 64 batches of 16 heads on one cache: the split update; one batch of 8: the
               # cluster decode of the program lifted to four axes (32 or more heads take the
               # packed template: not tuned yet)
               ("mqa_decode", dict(B=64, H=16, N=4096, D=128)),
               ("mqa_decode", dict(B=1, H=8, N=131072, D=128)),
               ("paged_decode", dict(B=8, H=32, HKV=8, D=128, PAGES=4096, PAGE=64, NP=512)),
               ("log_softmax_channels", dict(B=8, C=150, P=65536)),
               ("group_norm", dict(B=16, G=32, C=16, P=4096)),
               ("max_pool_l2", dict(B=64, S=512, D=4096)),
               ("segment_mean", dict(R=131072, D=1024, G=2048))]


@pytest.mark.parametrize("name, sizes", SUITE_TASKS)
def test_the_defaults_are_a_point_of_every_suite_kernels_space(name, sizes):
    """A job measures the template defaults first and keeps them where nothing beats them
    (``_keep_defaults_that_win``): that needs them in the space (192-key blocks at head dim 64
    were not, and a six-trial job left a record 12 % slower than them)."""
    import benchmarks.user_kernels as U
    from tensorfuse.autotune.tasks import make_tasks

    for task in make_tasks(getattr(U, name), sizes, tf.get_target("cuda:sm_90a")):
        assert task.default_schedule() is not None, (task.name, task.space.defaults())


def test_a_gpu_record_slower_than_the_defaults_when_timed_again_gives_way(tmp_path, monkeypatch):
    """The Hopper template's job ends as the CPU's: a best record slower than the defaults when
    both are timed again is outranked by the defaults, which tf.compile then runs."""
    import benchmarks.user_kernels as U
    from tensorfuse.autotune import open_database
    from tensorfuse.autotune.database import default_database_dir
    from tensorfuse.autotune.job import _keep_defaults_that_win
    from tests.autotune.test_scalar_records import _record

    monkeypatch.setenv("TENSORFUSE_CACHE", str(tmp_path))
    sizes = dict(B=2, M=4096, N=4096, H=16, DQK=192, DV=128)
    task = make_task(U.two_head_dims_causal, sizes, tf.get_target("cuda:sm_90a"))
    defaults = knobs_of(task.default_schedule().mod)
    lucky = dict(defaults, pingpong=1 - defaults["pingpong"])   # another point, a lucky batch
    assert task.unfit(lucky) is None
    _record(task, defaults, 2e-3)
    _record(task, lucky, 1e-3)
    compiled = tf.compile(U.two_head_dims_causal, "cuda:sm_90a")
    assert "pingpong=False" in compiled.schedule_origin(**sizes)
    db = open_database(default_database_dir(task.target))
    assert _keep_defaults_that_win(task, db, 1.0e-3, 1.07e-3)
    origin = tf.compile(U.two_head_dims_causal, "cuda:sm_90a").schedule_origin(**sizes)
    assert origin.startswith("hopper_attention tuned record") and "pingpong=True" in origin, origin


def test_random_inputs_keep_indices_inside_and_lengths_positive():
    """What a tuning job measures on: a page table's entries index the pages; a length an axis
    is compared with (``j < lengths[b]``) lies in [1, N], so no row is left without keys (rows of
    −inf made every candidate of the suite's cross-attention fail its check against the
    defaults, NaN against NaN)."""
    import benchmarks.user_kernels as U
    from tensorfuse.inputs import random_inputs

    rng = np.random.default_rng()
    for _ in range(20):
        x, _ = random_inputs(U.cross_attention_lengths, dict(B=64, H=2, M=8, N=37, D=16), rng)
        assert x["lengths"].min() >= 1 and x["lengths"].max() <= 37
        x, _ = random_inputs(U.paged_decode, dict(B=2, H=8, HKV=2, D=64, PAGES=40, PAGE=16,
                                                   NP=64), rng)
        assert x["table"].min() >= 0 and x["table"].max() < 40
    seen = np.concatenate([random_inputs(U.cross_attention_lengths,
                                         dict(B=64, H=2, M=8, N=37, D=16), rng)[0]["lengths"]
                           for _ in range(5)])
    assert len(set(seen.tolist())) > 10   # spread over the range, not one value
