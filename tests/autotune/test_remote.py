"""Measuring on workers through TVM's RPC tracker, on the CPU: a tracker and two workers that run
the Triton candidates in Triton's interpreter (the GPU path, without the GPU), a job that loses
one of them mid-way and finishes on the other, requests without the secret refused, databases
merged, and two jobs on one database serialised."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import tensorfuse as tf
from tensorfuse import kernels as K
from tensorfuse.autotune import tune
from tensorfuse.autotune.database import RECORDS, DatabaseLock, merge_databases
from tensorfuse.autotune.remote import MEASURE, SECRET_ENV, Tracker, start_local_workers
from tensorfuse.errors import TuningError

pytest.importorskip("triton", reason="the workers run Triton candidates")
SECRET = "a-secret-for-this-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _records(db) -> list:
    path = os.path.join(db, RECORDS)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture
def fleet():
    """A tracker on 127.0.0.1 and two workers with key ``ci`` (interpreted Triton)."""
    port = _free_port()
    env = dict(os.environ, **{SECRET_ENV: SECRET, "TRITON_INTERPRET": "1"})
    procs = [subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host",
                               "127.0.0.1", "--port", str(port), "--port-end", str(port + 1),
                               "--silent"], start_new_session=True)]
    time.sleep(1.5)
    workers = [subprocess.Popen([sys.executable, "-m", "tensorfuse.cli", "worker", "--tracker",
                                 f"127.0.0.1:{port}", "--key", "ci", "--port", str(_free_port())],
                                env=env, start_new_session=True, stdout=subprocess.PIPE,
                                text=True) for _ in range(2)]
    tracker = Tracker("127.0.0.1", port, "ci", SECRET)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if tracker.free_workers() == 2:
                break
        except (OSError, RuntimeError):
            pass
        time.sleep(0.5)
    else:
        raise AssertionError("the workers did not register")
    yield tracker, workers
    for proc in procs + workers:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_job_measures_on_two_workers_and_goes_on_when_one_dies(fleet, tmp_path):
    tracker, workers = fleet
    db = str(tmp_path / "db")
    job = subprocess.Popen(
        [sys.executable, "-m", "tensorfuse.cli", "tune", "tensorfuse.kernels:softmax",
         "--target", "cuda:sm_80", "--trials", "24", "--trials-per-iter", "4", "--size", "M=16",
         "--size", "N=256", "--database", db, "--tracker", f"127.0.0.1:{tracker.port}",
         "--key", "ci"], env=dict(os.environ, **{SECRET_ENV: SECRET}),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while len(_records(db)) < 6 and time.time() < deadline and job.poll() is None:
        time.sleep(0.05)
    assert job.poll() is None, job.communicate()[0][-3000:]
    os.killpg(workers[0].pid, signal.SIGKILL)   # a machine lost mid-job
    output = job.communicate(timeout=300)[0]
    assert job.returncode == 0, output[-3000:]
    records = _records(db)
    # and one more where the best, timed again beside the defaults, lost to them: the defaults
    # are then recorded as the best (a dying worker's neighbours time noisily)
    kept = "the defaults are recorded as the best" in output
    assert len(records) == 24 + kept, output[-3000:]
    assert "speedup" in output
    (measured,) = [line for line in output.splitlines() if line.startswith("measured on")]
    assert measured.count(":pid") == 2, measured   # both did work, the lost one before it went
    failed = [r for r in records if r[1][1] is None or float(r[1][1][0]) > 1e9]
    assert len(failed) <= 1, output[-3000:]   # at most the candidate in flight on the lost one


def test_requests_without_the_secret_are_refused(fleet):
    tracker, _ = fleet
    session = tracker.session(timeout=30)
    reply = json.loads(session.get_function(MEASURE)(b"anything", "not-the-signature"))
    assert reply["secs"] is None and reply["error"].startswith("refused")


def test_a_job_needs_the_secret_and_a_tracker(monkeypatch, tmp_path):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(TuningError, match=SECRET_ENV):
        tune(K.softmax, "cuda:sm_80", trials=4, tracker="127.0.0.1:1", progress=False,
             database=str(tmp_path), M=16, N=256)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with pytest.raises(TuningError, match="no tracker answers at 127.0.0.1:1"):
        tune(K.softmax, "cuda:sm_80", trials=4, tracker="127.0.0.1:1", progress=False,
             database=str(tmp_path), M=16, N=256)
    with pytest.raises(TuningError, match="a CPU job measures in this process"):
        tune(K.softmax, "llvm", trials=4, tracker="127.0.0.1:1", progress=False, M=16, N=256)
    with pytest.raises(TuningError, match="give one of them"):
        tune(K.softmax, "cuda:sm_80", trials=4, tracker="127.0.0.1:1", gpus="all",
             progress=False, M=16, N=256)


def test_local_workers_need_the_gpus_they_are_asked_for():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(TuningError, match="visible GPU"):
        start_local_workers("all", print)


def test_each_local_worker_sees_only_its_gpu_from_its_start(monkeypatch):
    """A worker's GPU is chosen by its environment when it starts (set later, once CUDA has
    started in it, the worker measured on the job's GPU: two workers on one GPU, each trial
    twice as slow) — the visible GPUs of the job mapped through, its name and the secret."""
    import subprocess as sp

    import torch

    from tensorfuse.autotune import remote

    started = []

    class Recorded:
        def __init__(self, command, env, **_):
            started.append((command, env))
            self.pid = -1

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sp, "Popen", Recorded)
    monkeypatch.setattr(remote, "InProcessTracker", lambda: type("T", (), {"port": 1})())
    for visible, want in ((None, ["1", "2"]), ("5,3,7", ["3", "7"])):
        started.clear()
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        tracker = start_local_workers("all", lambda _: None)
        assert [env["CUDA_VISIBLE_DEVICES"] for _, env in started] == want
        assert [env["TENSORFUSE_WORKER"].endswith(f":gpu{g}") for g, (_, env) in
                zip((1, 2), started)] == [True, True]
        assert all(env[SECRET_ENV] == tracker.secret and "--gpu" not in command
                   for command, env in started)


def test_databases_tuned_apart_merge_into_one(tmp_path):
    sizes = dict(M=64, N=256)
    first, second, into = (str(tmp_path / n) for n in ("a", "b", "merged"))
    tune(K.softmax, "llvm", trials=4, database=first, progress=False, **sizes)
    tune(K.softmax, "llvm", trials=3, database=second, progress=False, **sizes)
    assert merge_databases([first, second], into, say=lambda _: None) == 7
    assert merge_databases([first, second], into, say=lambda _: None) == 0   # nothing twice
    assert len(_records(into)) == 7
    lines = []
    summary = tune(K.softmax, "llvm", trials=7, database=into, progress=lines.append, **sizes)
    assert summary.tasks[0].trials_this_job == 0   # one workload: all 7 count


def test_two_jobs_on_one_database_take_turns(tmp_path):
    db = str(tmp_path / "db")
    lines = []
    lock = DatabaseLock(db)
    lock.__enter__()
    releaser = threading.Timer(2.0, lock.__exit__)
    releaser.start()
    started = time.time()
    summary = tune(K.softmax, "llvm", trials=2, database=db, progress=lines.append, M=64, N=256)
    assert time.time() - started >= 2.0 and summary.tasks[0].trials == 2
    assert any("in use by pid" in line and "starts when that one ends" in line for line in lines)
    with DatabaseLock(db):
        with pytest.raises(TuningError, match="in use by pid"):
            DatabaseLock(db, wait=False).__enter__()


def test_the_job_s_own_tracker_serves_workers_and_stops():
    """--gpus runs the tracker in the job's process (TVM's Tracker class starts another Python)."""
    from tensorfuse.autotune.remote import InProcessTracker

    own = InProcessTracker()
    worker = subprocess.Popen([sys.executable, "-m", "tensorfuse.cli", "worker", "--tracker",
                               f"127.0.0.1:{own.port}", "--key", "own", "--port",
                               str(_free_port())], env=dict(os.environ, **{SECRET_ENV: SECRET}),
                              start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        tracker = Tracker("127.0.0.1", own.port, "own", SECRET, expected=1, local=[worker])
        assert tracker.wait_for(limit=120) == 1
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        own.terminate()
    assert not own.state.thread.is_alive()


def test_the_job_hands_out_each_candidate_once_compiled(monkeypatch, tmp_path):
    """--gpus: a batch's candidates go to this process's GPU and the workers as their compiles
    finish (on this machine's CPUs; the workers find them in Triton's on-disk cache), with what
    was made for them; run() returns at once, and one that fails to compile still goes out."""
    import threading

    import torch
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from tensorfuse.autotune.remote import RemoteRunner
    from tensorfuse.autotune.runner import TritonRunner

    events, release = [], threading.Event()

    def compiled_in_turn(self, items):   # the second compiles first; the first never does
        events.append(("compiling", [spec for _, spec in items]))
        release.wait(10)
        yield items[1][0], "kernel 2"
        raise RuntimeError("the compile pool failed")

    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(TritonRunner._cls, "compiled_in_turn", compiled_in_turn)  # derived_object
    monkeypatch.setattr(TritonRunner._cls, "close", lambda self: events.append(("closed",)))
    monkeypatch.setattr(RemoteRunner._cls, "_start", lambda self: None)   # no measuring threads
    runner = RemoteRunner({}, Tracker("", 0, "", "", here=0), lambda line: None)
    runner.payloads = {"softmax": b"task"}
    inputs = []
    for n in (1, 2):
        path = tmp_path / f"c{n}.json"
        path.write_text(json.dumps({"task": "softmax", "knobs": {"block_n": 1024 * n}}))
        inputs.append(RunnerInput(str(path), "cuda", []))
    futures = runner.run(inputs)
    assert len(futures) == 2 and runner.work.qsize() == 0   # nothing compiled yet
    release.set()
    handed = [runner.work.get(timeout=10) for _ in range(2)]
    assert [(item[1], item[5]) for item in handed] == [({"block_n": 2048}, "kernel 2"),
                                                       ({"block_n": 1024}, None)]
    assert events == [("compiling", [("softmax", {"block_n": 1024}),
                                     ("softmax", {"block_n": 2048})])]
    runner.close()
    assert events[-1] == ("closed",)


def test_kernels_measured_on_workers_take_turns():
    """Through workers, several kernels' batches are scheduled round robin (one kernel's search
    runs while another's batch is measured: the runner's futures come back at once); measured
    in the job's process, by expected gain."""
    from tensorfuse.autotune.job import _scheduler
    from tensorfuse.autotune.measurer import Measurer

    through, here = Measurer([], None, Tracker("", 0, "", "", here=0), None), \
        Measurer([], None, None, None)
    assert _scheduler(["a", "b"], through) == "round-robin"
    assert _scheduler(["a", "b"], here) == "gradient"
    assert _scheduler(["a"], here) == "round-robin"


def test_the_local_runner_returns_results_in_the_batch_s_order(monkeypatch, tmp_path):
    """Candidates compile (and are measured) in whatever order their compiles finish; the
    results MetaSchedule gets back are still in the order of its batch."""
    from tvm.s_tir.meta_schedule.runner import RunnerInput, RunnerResult

    from tensorfuse.autotune.runner import TritonRunner

    monkeypatch.setattr(TritonRunner._cls, "compiled_in_turn",   # the last compiles first
                        lambda self, items: ((tag, f"kernel {tag}") for tag, _ in items[::-1]))
    monkeypatch.setattr(TritonRunner._cls, "measure_one", lambda self, key, knobs, kernel=None:
                        RunnerResult([knobs["block_n"] * 1e-6], kernel))
    inputs = []
    for n in range(5):
        path = tmp_path / f"c{n}.json"
        path.write_text(json.dumps({"task": "softmax", "knobs": {"block_n": n}}))
        inputs.append(RunnerInput(str(path), "cuda", []))
    results = [f.result() for f in TritonRunner({}).run(inputs)]
    assert [float(r.run_secs[0]) for r in results] == [n * 1e-6 for n in range(5)]
    # the candidate each was measured with, handed back in error_msg by the stand-in
    assert [r.error_msg for r in results] == [f"kernel {n}" for n in range(5)]


def test_the_contraction_template_tunes_on_workers(fleet, tmp_path, monkeypatch):
    """A GEMM off Hopper (the contraction template: tile shape, depth, warps, stages, groups)
    tuned through the tracker, each candidate checked against the defaults by the runner."""
    tracker, _ = fleet
    monkeypatch.setenv(SECRET_ENV, SECRET)
    db = str(tmp_path / "db")
    summary = tune(K.matmul, "cuda:sm_80", trials=6, trials_per_iter=3, database=db,
                   tracker=f"127.0.0.1:{tracker.port}", key="ci", progress=False,
                   M=64, K=96, N=80)
    (task,) = summary.tasks
    assert task.template == "contraction" and task.trials_this_job == 6, task
    assert task.failures_this_job == 0 and task.best_secs is not None, task.errors
    knobs = [r for r in _records(db) if r[1][1] is not None]
    assert knobs and all("block_k" in json.dumps(r) for r in knobs)
