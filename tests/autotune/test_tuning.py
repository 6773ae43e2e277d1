"""Tuning jobs on the CPU target: results in the database, compile uses them, resume after Ctrl-C
or kill -9 with nothing lost or corrupted, clear errors."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import tensorfuse as tf
from tensorfuse import kernels as K
from tensorfuse.autotune import open_database, repair_database, tune
from tensorfuse.autotune.database import RECORDS, WORKLOADS
from tensorfuse.errors import TuningError
from tensorfuse.kernels.reference import TOLERANCE, random_inputs, reference, relative_error

SIZES = dict(M=64, N=256)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache folder, so the device's default database is a fresh one."""
    monkeypatch.setenv("TENSORFUSE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _records(path) -> list:
    with open(os.path.join(path, RECORDS)) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_tune_records_trials_and_compile_uses_the_best(cache, rng):
    lines = []
    summary = tune(K.softmax, "llvm", trials=8, progress=lines.append, **SIZES)
    (task,) = summary.tasks
    assert task.trials == 8 and task.trials_this_job == 8 and task.failures_this_job == 0
    assert task.best_secs > 0 and task.default_secs > 0
    assert len(_records(summary.database)) == 8
    assert any("8 trials" in line for line in lines)
    assert "softmax[M=64,N=256]" in summary.table()

    compiled = tf.compile(K.softmax, "llvm")
    assert compiled.schedule_origin(**SIZES).startswith("tuned record")
    assert compiled.schedule_origin(M=32, N=256) == "template defaults"  # other sizes: untuned
    tensors, scalars = random_inputs(K.softmax, SIZES, rng)
    out = compiled(**tensors, **scalars, out=np.full((64, 256), np.nan).astype(tensors["x"].dtype))
    assert relative_error(out, reference(K.softmax, tensors, scalars)) <= TOLERANCE["bf16"]


def test_a_kernel_that_derives_a_size_finds_its_records(cache, rng):
    """A SwiGLU over a row's halves derives ``J = N2 // 2``: its task is keyed with it, as a
    call binds its sizes (keyed by the sizes given alone, a call never found the records)."""
    from tests.schedule_templates.user_written_more_check import swiglu_rms

    summary = tune(swiglu_rms, "llvm", trials=4, progress=False, M=16, N2=256)
    assert [t.name for t in summary.tasks] == ["swiglu_rms[J=128,M=16,N2=256]"]
    compiled = tf.compile(swiglu_rms, "llvm")
    assert compiled.schedule_origin(M=16, N2=256).startswith("tuned record")
    x = torch.from_numpy(rng.standard_normal((16, 256)).astype(np.float32) * 3).bfloat16()
    a, b = x.double()[:, :128], x.double()[:, 128:]
    want = (torch.nn.functional.silu(a) * b).pow(2).mean(1).sqrt()
    assert float((compiled(x).double() - want).abs().max() / want.abs().max()) < 2e-2


def test_a_kernel_reading_past_a_dimension_is_not_tuned(cache):
    from tests.dsl.test_index_bounds import next_step_difference

    with pytest.raises(TuningError, match=r"x\[b, t \+ 1\] reads dimension 1 of x \(L=9\)"):
        tune(next_step_difference, "llvm", trials=2, progress=False, B=2, L=9)


def test_scalar_parameters_and_several_kernels_share_the_budget(cache, rng):
    summary = tune([K.layernorm, K.rmsnorm], "llvm", trials=12, trials_per_iter=4,
                   progress=False, **SIZES)
    # the task scheduler hands out whole batches: the budget may be passed by less than one
    assert 12 <= sum(t.trials_this_job for t in summary.tasks) < 12 + 4
    assert all(t.trials_this_job > 0 for t in summary.tasks)
    compiled = tf.compile(K.layernorm, "llvm")
    assert compiled.schedule_origin(**SIZES).startswith("tuned record")
    tensors, scalars = random_inputs(K.layernorm, SIZES, rng)
    scalars["eps"] = 1e-3  # the workload was tuned with another eps: the trace still applies
    out = compiled(**tensors, **scalars)
    assert relative_error(out, reference(K.layernorm, tensors, scalars)) <= TOLERANCE["bf16"]


def test_a_second_job_counts_what_is_recorded(cache):
    first = tune(K.softmax, "llvm", trials=6, progress=False, **SIZES)
    again = tune(K.softmax, "llvm", trials=10, progress=False, **SIZES)
    assert again.tasks[0].trials_this_job == 4 and again.tasks[0].trials == 10
    done = tune(K.softmax, "llvm", trials=10, progress=False, **SIZES)
    assert done.tasks[0].trials_this_job == 0
    records = _records(first.database)
    assert len(records) == 10
    assert len({json.dumps(r[1]) for r in records}) == 10  # no candidate measured twice


def _job(db: str, trials: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tensorfuse.cli", "tune", "tensorfuse.kernels:softmax",
         "--target", "llvm", "--trials", str(trials), "--size", "M=64", "--size", "N=256",
         "--database", db, "--trials-per-iter", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_records(db: str, count: int, job: subprocess.Popen, limit: float = 240) -> None:
    start = time.time()
    while time.time() - start < limit and job.poll() is None:
        path = os.path.join(db, RECORDS)
        if os.path.exists(path) and len(open(path).read().splitlines()) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"the job wrote fewer than {count} records: {job.communicate()[0][-2000:]}")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_an_interrupted_job_resumes_with_nothing_lost(tmp_path, how):
    """8 trials in all, batches of 4, interrupted part-way (after the first batch's records and
    a random moment of the second), then resumed to the end."""
    TRIALS = 8
    db = str(tmp_path / "db")
    started = time.time()
    job = _job(db, TRIALS)
    _wait_for_records(db, 4, job)
    time.sleep(np.random.default_rng().uniform(0, 1.5))  # a random moment in the next batch
    job.send_signal(how)
    output = job.communicate(timeout=120)[0]
    if how == signal.SIGINT:
        # 130 (stopped), 0 (it had finished), or ended by the signal itself where it lands as
        # the interpreter exits, its handlers gone (what a shell reports as 130 too)
        assert job.returncode in (130, 0, -signal.SIGINT), output
    kept = _records(db)
    assert 4 <= len(kept) <= TRIALS
    resumed = _job(db, TRIALS)
    output = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, output
    records = _records(db)
    assert len(records) == TRIALS, output
    assert records[:len(kept)] == kept  # what was there before is untouched
    assert "speedup" in output
    print(f"{TRIALS} trials with an interruption: {time.time() - started:.0f} s")


def test_a_torn_last_line_is_dropped_with_a_backup(tmp_path):
    db = str(tmp_path / "db")
    tune(K.softmax, "llvm", trials=4, database=db, progress=False, **SIZES)
    with open(os.path.join(db, RECORDS), "a") as f:
        f.write('[0, [["Sample')  # what kill -9 mid-write leaves
    with pytest.warns(UserWarning, match="dropped 1 torn line"):
        database = open_database(db)
    assert len(database) == 4
    backups = [d for d in os.listdir(db) if d.startswith("backup-")]
    assert backups and os.path.getsize(os.path.join(db, backups[0], RECORDS)) > 0
    assert not repair_database(db).changed


def test_a_corrupt_workload_table_is_refused_not_rewritten(tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    (db / WORKLOADS).write_text('garbage\n["x", "y"]\n')
    (db / RECORDS).write_text("")
    with pytest.raises(TuningError, match="not the last one"):
        open_database(str(db))
    assert (db / WORKLOADS).read_text() == 'garbage\n["x", "y"]\n'


@pytest.mark.parametrize("call, message", [
    (lambda: tune(K.softmax, "llvm", trials=4, M=64), "tuning softmax: size N not given"),
    (lambda: tune(K.softmax, "llvm", trials=4, M=64, N=8, Q=3), "no size named Q"),
    (lambda: tune(K.softmax, "llvm", trials=0, **SIZES), "positive integer"),
    (lambda: tune(K.softmax, "rocm:gfx942", trials=4, **SIZES), "cannot run here"),
    (lambda: tune("softmax", "llvm", trials=4, **SIZES), "takes @tensorfuse.kernel"),
])
def test_bad_jobs_say_what_is_wrong(cache, call, message):
    with pytest.raises(TuningError, match=message):
        call()


def test_cuda_without_a_gpu_is_refused(cache):
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("this machine has a GPU")
    with pytest.raises(TuningError, match="none is visible"):
        tune(K.softmax, "cuda", trials=4, **SIZES)


def test_lookups_never_write_the_database(cache):
    """compile may run while a job is appending: a torn last line is skipped, not repaired."""
    summary = tune(K.softmax, "llvm", trials=4, progress=False, **SIZES)
    path = os.path.join(summary.database, RECORDS)
    with open(path, "a") as f:
        f.write('[0, [["Sample')  # a line being written right now
    before = open(path).read()
    assert tf.compile(K.softmax, "llvm").schedule_origin(**SIZES).startswith("tuned record")
    assert open(path).read() == before
    assert not [d for d in os.listdir(summary.database) if d.startswith("backup-")]


def test_cpu_candidates_are_built_for_the_cpu_compile_builds_for():
    """A CPU job builds and times its candidates for the same vector units as ``tf.compile``
    (``mcpu``), with the core count MetaSchedule's parallel rules read: built for x86-64's
    SSE2 they ran 10× slower than the kernels they stood for, and their vector widths were
    chosen for another ISA."""
    from tensorfuse.autotune.tasks import tuning_target

    spec = tf.get_target("llvm")
    made = tuning_target(spec).export()
    assert made["mcpu"] == spec.tvm_target.export().get("mcpu", "generic")
    assert int(made["num-cores"]) == max(1, os.cpu_count() or 1)


def test_a_chain_fused_on_the_cpu_tunes_its_chunk_and_rows(cache, rng):
    """Attention runs fused on the CPU (``cpu_fused``): the job samples the chunk and the block of
    rows, which change the lowering; each candidate is lowered for its knobs and built here, timed
    by TVM's runner; ``tf.compile`` then lowers with the best record's knobs, and its result
    matches float64."""
    from tensorfuse.autotune.tasks import make_task

    dims = dict(B=1, H=2, M=67, N=67, D=16)
    task = make_task(K.causal_attention, dims, tf.get_target("llvm"))
    assert task.template == "cpu_fused"
    assert task.choices() == {"chunk": (32, 64, 128, 256), "rows": (1, 2, 4)}
    assert task.space.defaults() == {"chunk": 128, "rows": 4}
    summary = tune(K.causal_attention, "llvm", trials=6, progress=False, **dims)
    (result,) = summary.tasks
    assert result.template == "cpu_fused" and result.failures_this_job == 0
    assert result.trials == 6 and result.best_secs > 0 and result.default_secs > 0
    compiled = tf.compile(K.causal_attention, "llvm")
    origin = compiled.schedule_origin(**dims)
    assert re.match(r"tuned record \(rolling_update\(m, [lo], [lo], axis=j, chunk=\d+(, rows=\d)?\); "
                    r"[\d.]+ ms when tuned", origin), origin
    tensors, scalars = random_inputs(K.causal_attention, dims, rng)
    want = reference(K.causal_attention, tensors, scalars)
    assert relative_error(compiled(**tensors, **scalars), want) <= TOLERANCE["bf16"]


def test_a_best_record_that_loses_to_the_defaults_when_timed_again_gives_way(cache):
    """A job's last step times the defaults and its best record again, side by side; where the
    record is slower, the defaults are recorded as faster than it (on its own time scale), so
    ``tf.compile`` keeps them — a noisy batch must not make a tuned kernel slower."""
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord

    from tensorfuse.autotune.database import default_database_dir
    from tensorfuse.autotune.job import _keep_defaults_that_win
    from tensorfuse.autotune.lookup import best_record, replay
    from tensorfuse.autotune.tasks import knob_space, knobs_of, make_task, tuning_target

    spec = tf.get_target("llvm")
    dims = dict(B=1, H=2, M=40, N=40, D=16)
    task = make_task(K.causal_attention, dims, spec)
    db = open_database(default_database_dir(spec))

    def record(knobs, secs):
        sch = tvm.s_tir.Schedule(task.mod)
        knob_space(task.choices(), knobs)(sch)
        db.commit_tuning_record(TuningRecord(sch.trace, db.commit_workload(task.mod), [secs],
                                             tuning_target(spec),
                                             ArgInfo.from_prim_func(task.mod["main"])))

    record({"chunk": 128, "rows": 4}, 2e-3)   # the defaults, measured first
    record({"chunk": 64, "rows": 2}, 1e-3)    # a lucky batch
    assert not _keep_defaults_that_win(task, db, 1.0e-3, 1.01e-3)   # within the margin
    assert _keep_defaults_that_win(task, db, 1.0e-3, 1.5e-3)
    found, secs = best_record(db, task.mod)
    assert knobs_of(replay(found, task.mod)) == {"chunk": 128, "rows": 4}
    assert secs == pytest.approx(1e-3 / 1.5)
    assert not _keep_defaults_that_win(task, db, 1.0e-3, 1.5e-3)   # the defaults are the best
    origin = tf.compile(K.causal_attention, "llvm").schedule_origin(**dims)
    assert "chunk=128, rows=4)" in origin and origin.startswith("tuned record")
    rows = make_task(K.softmax, SIZES, spec)   # the CPU template's records stay as measured
    assert not _keep_defaults_that_win(rows, db, 1.0e-3, 2.0e-3)
