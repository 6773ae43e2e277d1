"""Measuring tuning candidates on other GPUs — of this machine or of others — through TVM's RPC
tracker and servers.

Why TVM's RPC rather than Ray or a protocol of our own: it is already a dependency (the one
MetaSchedule's own ``RPCRunner`` uses), and its tracker does what a fleet needs — workers register under a key (one key per GPU model: ``h100``), a job asks the tracker
for free workers of its key, and a worker that dies drops out of the tracker's list. GPU
candidates are not TVM modules but template knobs (Triton compiles on the GPU's host; the Hopper
template's cubins come from nvcc), so a worker is a TVM RPC server with one function of ours
registered, :data:`MEASURE`: it gets the task (the program, sizes, scalars, template) and the
knobs, builds the candidate there, checks it against the template defaults on fresh inputs and
times it — the same measurement as the local runner (:func:`.runner.measure`).

- ``tensorfuse worker --tracker HOST:PORT --key KEY [--gpu N]`` starts a worker; ``python -m
  tvm.exec.rpc_tracker --host HOST`` the tracker. Both bind to 127.0.0.1 unless told otherwise.
- ``tensorfuse tune ... --tracker HOST:PORT --key KEY`` measures through them; ``--gpus all``
  (or ``0,1``) measures on the first GPU in the job's own process from the start, and starts a
  private tracker (a thread of the job) and a worker per other GPU, which join once registered
  (~8 s on the H100 host, most of it importing TVM) and are stopped after the job.
- One process — the job — owns the database: workers only measure, so records from many hosts of
  one GPU model land in one database (and ``tensorfuse merge`` joins databases tuned apart).

Trust: a TVM RPC server runs what it is sent (TVM's documentation says so: trusted networks
only); requests to :data:`MEASURE` must also carry an HMAC of the job's secret
(``TENSORFUSE_TUNING_SECRET``, which the workers and the job share), so a worker only unpickles
requests of jobs holding that secret. Across hosts, tunnel the tracker and workers over SSH or
keep them on a private network.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import hmac
import json
import os
import pickle
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerFuture, RunnerInput, RunnerResult

from ..errors import TuningError

MEASURE = "tensorfuse.autotune.measure"
SECRET_ENV = "TENSORFUSE_TUNING_SECRET"
ATTEMPTS = 3   # a candidate whose worker died is measured again elsewhere, this many times
# where a job's time goes, for benchmarks.tuning: (time, event, ...) tuples when a list
TIMELINE: list | None = None


def mark(*event) -> None:
    """Note an event of the job on :data:`TIMELINE` (nothing when it is None)."""
    if TIMELINE is not None:
        TIMELINE.append((time.time(), *event))


def sign(payload: bytes, secret: str) -> str:
    return hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest()


def task_payload(task) -> bytes:
    """What a worker needs to rebuild ``task``: the program (pickled by value: a kernel defined
    in a notebook has no module the worker could import), sizes, target, template and scalars."""
    import cloudpickle

    return cloudpickle.dumps((task.kernel.program, task.kernel.name, task.dims, task.target.name,
                              task.template, task.fusion, task.scalars))


# -- the worker's side ---------------------------------------------------------------------------
_TASKS: dict = {}   # digest of a task payload -> (task, inputs)


def register() -> None:
    """Make :data:`MEASURE` callable over RPC (the server's init callback), and serve sessions in
    the server's own process, one at a time (:func:`_serve_in_process`)."""
    import tvm
    from tvm.rpc import server

    tvm.register_global_func(MEASURE, _measure_request, override=True)
    server._serving = _serve_in_process


def _serve_in_process(sock, addr, opts, load_library) -> None:
    """One RPC session, served in this process. TVM's server forks a process per session, and
    CUDA cannot be used in a process forked from one that has touched it (torch refuses: "Cannot
    re-initialize CUDA in forked subprocess" — every candidate failed that way on the H100); a
    job holds its session for the whole job anyway, and a long-lived process keeps its compiled
    candidates and inputs from one job's batches to the next."""
    from tvm.rpc import server
    from tvm.support import utils

    work_path = utils.tempdir()
    cwd = os.getcwd()
    os.chdir(work_path.path)
    try:
        server._serve_loop(sock, load_library, work_path)
    finally:
        os.chdir(cwd)
        work_path.remove()
        sock.close()


def _measure_request(payload, signature) -> str:
    """A request of a job: ``pickle((task payload, knobs, repeat_ms))`` signed with the secret.
    Returns JSON: ``{"secs": ..., "error": ..., "worker": ...}``."""
    payload = bytes(payload)
    secret = os.environ.get(SECRET_ENV, "")
    if not secret or not hmac.compare_digest(sign(payload, secret), str(signature)):
        return json.dumps({"secs": None, "worker": _worker_name(),
                           "error": "refused: the request is not signed with this worker's "
                                    f"secret ({SECRET_ENV})"})
    task_bytes, knobs, repeat_ms = pickle.loads(payload)
    from .runner import measure

    try:
        started = time.time()
        task, inputs = _task(task_bytes)
        secs = measure(task, knobs, inputs, repeat_ms)
        return json.dumps({"secs": secs, "error": None, "worker": _worker_name(),
                           "took": time.time() - started})
    except Exception as exc:  # noqa: BLE001 - a failed candidate, reported to the job
        return json.dumps({"secs": None, "error": f"{type(exc).__name__}: {exc}"[:2000],
                           "worker": _worker_name()})


def _task(task_bytes: bytes):
    digest = hashlib.sha256(task_bytes).hexdigest()
    if digest not in _TASKS:
        from types import SimpleNamespace

        from ..dsl.expr import advance_uids
        from ..targets import get_target
        from .runner import reference_inputs
        from .tasks import TuningTask

        program, name, dims, target, template, fusion, scalars = pickle.loads(task_bytes)
        advance_uids(program)
        kernel = SimpleNamespace(program=program, name=name)
        task = TuningTask(kernel, dims, get_target(target), template, fusion, scalars)
        _TASKS[digest] = (task, reference_inputs(task))
    return _TASKS[digest]


WORKER_ENV = "TENSORFUSE_WORKER"   # the worker's name in reports (set by :func:`serve`)


def _worker_name() -> str:
    return os.environ.get(WORKER_ENV) or socket.gethostname()


def serve(tracker: str, key: str, host: str = "127.0.0.1", port: int = 9091,
          gpu: int | None = None) -> None:
    """Run a worker until killed: a TVM RPC server registered with ``tracker`` under ``key``,
    in this process (``tvm.rpc.Server`` would start a second one and import everything again)."""
    from tvm.rpc.server import _popen_start_rpc_server

    if not os.environ.get(SECRET_ENV):
        raise TuningError(f"a worker needs the secret of the jobs it serves in {SECRET_ENV} "
                          "(any string; give the job the same one)")
    import torch

    if gpu is not None:
        if torch.cuda.is_initialized():
            raise TuningError(f"--gpu {gpu}: CUDA has started in this process already, so it "
                              "would measure on the GPUs it sees; set CUDA_VISIBLE_DEVICES="
                              f"{gpu} in the worker's environment instead")
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    os.environ.setdefault(WORKER_ENV, f"{socket.gethostname()}:" + (
        f"gpu{gpu}" if gpu is not None else f"pid{os.getpid()}"))
    tracker_host, tracker_port = parse_address(tracker)
    bound = _popen_start_rpc_server(host, port, port + 100, tracker_addr=(tracker_host,
                                                                          tracker_port),
                                    key=key, silent=True, server_init_callback=register)
    print(f"tensorfuse worker {_worker_name()} on {host}:{bound}, key {key!r}, tracker "
          f"{tracker}, measuring on {_device_said()}", flush=True)
    threading.Event().wait()   # the server's threads serve; SIGTERM or SIGKILL end it


def _device_said() -> str:
    """The GPU this process measures on, by name and PCI bus (which one, among equal GPUs)."""
    import torch

    if not torch.cuda.is_available():
        return "no GPU (CUDA not available)"
    props = torch.cuda.get_device_properties(0)
    bus = getattr(props, "pci_bus_id", None)
    return f"{props.name}" + (f" (PCI bus {bus})" if bus is not None else "")


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise TuningError(f"a tracker address is HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


# -- the job's side -----------------------------------------------------------------------------
@dataclass
class Tracker:
    """Where a job's workers are: the tracker's address, their key and the shared secret."""

    host: str
    port: int
    key: str
    secret: str
    local: list = field(default_factory=list)   # processes this job started (--gpus)
    here: int | None = None     # the GPU this process measures on itself (--gpus)
    expected: int = 0           # how many workers this job started, to wait for
    logs: str = ""              # where they write

    def wait_for(self, limit: float = 120.0) -> int:
        """The number of free workers, once those this job started have registered."""
        deadline = time.time() + limit
        while True:
            free = self.free_workers()
            if free >= self.expected:
                return free
            if time.time() > deadline or any(p.poll() is not None for p in self.local
                                             if isinstance(p, subprocess.Popen)):
                raise TuningError(f"{self.expected - free} of the local workers did not start "
                                  f"within {limit:.0f} s (their logs: {self.logs})")
            time.sleep(0.2)

    def session(self, timeout: float):
        """A session with a free worker of this key (None when none is free within
        ``timeout`` seconds)."""
        import tvm.rpc

        done: dict = {}

        def ask():
            try:
                done["session"] = tvm.rpc.connect_tracker(self.host, self.port).request(
                    self.key, priority=1, session_timeout=0)
            except Exception as exc:  # noqa: BLE001 - reported by the caller
                done["error"] = exc

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        asker.join(timeout)
        return done.get("session")

    def free_workers(self) -> int:
        import tvm.rpc

        if not self.port:
            return 0
        summary = tvm.rpc.connect_tracker(self.host, self.port).summary()
        info = summary.get("queue_info", {}).get(self.key, {})
        return int(info.get("free", 0))


def connect(address: str, key: str) -> Tracker:
    """The tracker at ``address`` with workers registered under ``key`` (the job's secret from
    :data:`SECRET_ENV`)."""
    secret = os.environ.get(SECRET_ENV, "")
    if not secret:
        raise TuningError(f"measuring on workers needs the secret they were started with in "
                          f"{SECRET_ENV}")
    host, port = parse_address(address)
    tracker = Tracker(host, port, key, secret)
    try:
        socket.create_connection((host, port), timeout=10).close()   # TVM retries for 60 s
        free = tracker.free_workers()
    except (OSError, RuntimeError) as exc:
        raise TuningError(f"no tracker answers at {address} ({exc}); start one with python -m "
                          "tvm.exec.rpc_tracker --host 127.0.0.1 --port 9190") from None
    if free == 0:
        raise TuningError(f"the tracker at {address} has no free worker with key {key!r}; start "
                          f"them with tensorfuse worker --tracker {address} --key {key}")
    return tracker


def start_local_workers(gpus: "str | list[int]", say) -> Tracker:
    """Measuring on the GPUs in ``gpus`` ("all" or indices) of this machine for one job: the
    job's own process measures on the first (from the start: no worker to wait for), and a
    private tracker on 127.0.0.1 gets one worker per other GPU, which join as they register
    (:func:`stop_local_workers` ends them)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    indices = list(range(count)) if gpus == "all" else [int(g) for g in gpus]
    if not indices or any(not 0 <= g < count for g in indices) or len(set(indices)) < len(
            indices):
        raise TuningError(f"--gpus {gpus}: this machine has {count} visible GPU(s)")
    say(f"measuring on {len(indices)} GPU(s) of this machine: {indices} (GPU {indices[0]} in "
        "this process)")
    if len(indices) == 1:
        return Tracker("", 0, "", "", here=indices[0])
    import tempfile

    server = InProcessTracker()
    key = f"local-{secrets.token_hex(4)}"
    secret = secrets.token_hex(16)
    tracker = Tracker("127.0.0.1", server.port, key, secret, local=[server], here=indices[0],
                      expected=len(indices) - 1)
    logs = tempfile.mkdtemp(prefix="tensorfuse-workers-")
    for gpu in indices[1:]:
        with open(os.path.join(logs, f"gpu{gpu}.log"), "w") as log:
            tracker.local.append(subprocess.Popen(
                [sys.executable, "-m", "tensorfuse.cli", "worker", "--tracker",
                 f"127.0.0.1:{server.port}", "--key", key, "--port", str(9100 + 100 * gpu)],
                env=worker_environment(gpu, secret), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
    tracker.logs = logs
    return tracker


def worker_environment(gpu: int, secret: str) -> dict:
    """The environment of a local worker for GPU ``gpu`` (an index among this process's visible
    GPUs): that GPU alone visible from its start — set any later and it is too late once CUDA
    has started in the worker (the job's two GPUs then measured on one, each trial twice as
    slow) —, the job's secret, and the worker's name in reports."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    device = visible.split(",")[gpu].strip() if visible else str(gpu)
    return dict(os.environ, **{SECRET_ENV: secret, "CUDA_VISIBLE_DEVICES": device,
                               WORKER_ENV: f"{socket.gethostname()}:gpu{gpu}"})


class InProcessTracker:
    """TVM's RPC tracker on 127.0.0.1, served by a thread of this process. ``tvm.rpc.tracker
    .Tracker`` starts a second Python that imports TVM first — 10 s of the 18 s the H100 host
    took before a job's first worker registered; the job has TVM imported already."""

    def __init__(self):
        from tvm.rpc.tracker import PopenTrackerServerState

        self.state = PopenTrackerServerState("127.0.0.1", port=9190, port_end=9390, silent=True)
        self.port = self.state.port

    def terminate(self) -> None:
        """Stop the tracker's thread (TVM's own stop request, with the key it made)."""
        import struct

        from tvm.rpc import base
        from tvm.rpc.base import TrackerCode

        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            base.recvall(sock, 4)
            base.sendjson(sock, [TrackerCode.STOP, self.state.stop_key])
            base.recvjson(sock)
        self.state.thread.join(10)


def stop_local_workers(tracker: Tracker) -> None:
    for proc in tracker.local:
        if isinstance(proc, subprocess.Popen):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.terminate()


@derived_object
class RemoteRunner(PyRunner):
    """Hands a batch's candidates to every free worker of the tracker's key, one thread and one
    RPC session per worker, each taking the next candidate when done with one. A worker that
    dies mid-job is dropped: its candidate goes back to the queue for the others (up to
    :data:`ATTEMPTS` times), and the job goes on with those left."""

    def __init__(self, tasks_by_key: dict, tracker: Tracker, say, repeat_ms: int = 50,
                 wait_s: float = 900.0):
        super().__init__()
        self.tasks_by_key, self.tracker, self.say = tasks_by_key, tracker, say
        self.repeat_ms, self.wait_s = repeat_ms, wait_s
        self.work: queue.Queue = queue.Queue()
        self.payloads = {k: task_payload(t) for k, t in tasks_by_key.items()}
        self.workers: dict = {}    # worker name -> candidates measured
        self.busy: dict = {}       # worker name -> seconds spent measuring them
        self.threads: list = []
        self.closed = False
        self.lock = threading.Lock()
        self.active = 0            # threads holding a session
        self.ready = None          # when the workers were all there
        self.here = None           # the runner of this process's GPU (--gpus)

    def _start(self) -> None:
        if self.threads:
            return
        if self.tracker.here is not None:   # this process's own GPU, from the first batch on
            self._thread(self._serve_here)
        if self.tracker.port:
            self._thread(self._join_workers)
        else:
            self.ready = time.time()

    def _thread(self, target) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _join_workers(self) -> None:
        """A session thread per worker, once they have registered (the first batches may run
        on this process's GPU meanwhile)."""
        try:
            count = self.tracker.wait_for()
        except TuningError as exc:
            self.say(f"  {exc.message}; going on without them")
            self._fail_queued_if_alone()
            return
        for _ in range(max(1, count)):
            self._thread(self._serve)
        self.ready = time.time()

    def run(self, runner_inputs: list[RunnerInput]) -> list[RunnerFuture]:
        """Futures for a batch, at once: its candidates are handed out as they are compiled
        (:meth:`_feed`), so the search can go on (another kernel's batch, with several) while
        the GPUs measure."""
        self._start()
        futures, items = [], []
        for item in runner_inputs:
            with open(item.artifact_path, encoding="utf-8") as f:
                spec = json.load(f)
            payload = pickle.dumps((self.payloads[spec["task"]], spec["knobs"], self.repeat_ms))
            done: concurrent.futures.Future = concurrent.futures.Future()
            items.append(((spec["task"], spec["knobs"], payload, done), (spec["task"],
                                                                          spec["knobs"])))
            futures.append(RunnerFuture(f_done=done.done,
                                        f_result=lambda done=done: self._result(done)))
        mark("batch", items[0][1][0] if items else None, len(items))
        if self._here_runner() is None:
            for (key, knobs, payload, done), _ in items:
                self.work.put((key, knobs, payload, done, 0, None))
        else:   # not one of self.threads, which close() counts: it ends with its batch
            threading.Thread(target=self._feed, args=(items,), daemon=True).start()
        return futures

    def _feed(self, items: list) -> None:
        """Hand out a batch's candidates as they are compiled on this machine's CPUs (for this
        process and, through Triton's on-disk cache, the local workers); any not handed out when
        something fails go out as they are (compiled where they are measured)."""
        import torch

        torch.cuda.set_device(self.tracker.here)   # the inputs warming makes: this GPU's
        left = {id(tag): tag for tag, _ in items}
        try:
            for tag, kernel in self.here.compiled_in_turn(items):
                del left[id(tag)]
                self.work.put((*tag, 0, kernel))
                mark("compiled", tag[0])
        except Exception as exc:  # noqa: BLE001 - the candidates still go out, reported
            self.say(f"  compiling ahead failed ({type(exc).__name__}: {exc}); the rest of "
                     "the batch compiles where it is measured")
        finally:
            for key, knobs, payload, done in left.values():
                self.work.put((key, knobs, payload, done, 0, None))

    def _result(self, done) -> RunnerResult:
        try:
            return done.result(timeout=self.wait_s)
        except concurrent.futures.TimeoutError:
            return RunnerResult(None, f"no worker measured this candidate within {self.wait_s} s "
                                      "(are any left? the tracker's key: "
                                      f"{self.tracker.key})")

    def _serve(self) -> None:
        session, measure = None, None
        while not self.closed:
            if session is None:
                session = self.tracker.session(timeout=30)
                if session is None:   # none free now: ask again, unless no worker is left
                    self._fail_queued_if_alone()
                    continue
                measure = session.get_function(MEASURE)
                with self.lock:
                    self.active += 1
            try:
                item = self.work.get(timeout=1.0)
            except queue.Empty:
                continue   # until the job closes the runner
            if item is None:
                return
            key, knobs, payload, done, attempts, _ = item
            started = time.time()
            try:
                reply = json.loads(measure(payload, sign(payload, self.tracker.secret)))
            except Exception as exc:  # noqa: BLE001 - the worker or its connection died
                session, measure = None, None
                with self.lock:
                    self.active -= 1
                if attempts + 1 < ATTEMPTS:
                    self.work.put((key, knobs, payload, done, attempts + 1, None))
                else:
                    done.set_result(RunnerResult(None, f"worker lost {ATTEMPTS} times: {exc}"))
                self.say(f"  a worker was lost ({type(exc).__name__}); going on with the others")
                continue
            name = reply.get("worker", "?")
            self._count(name, started, key, reply.get("took"))
            if reply["error"] is not None:
                done.set_result(RunnerResult(None, f"on {name}: {reply['error']}"))
            else:
                done.set_result(RunnerResult([reply["secs"]], None))

    def _serve_here(self) -> None:
        """Measure on this process's GPU (``tracker.here``), as the local runner does."""
        import torch

        torch.cuda.set_device(self.tracker.here)
        here = self._here_runner()
        name = f"{socket.gethostname()}:gpu{self.tracker.here} (this process)"
        with self.lock:
            self.active += 1
        while True:
            item = self.work.get()
            if item is None:
                return
            key, knobs, _, done, _, kernel = item
            started = time.time()
            done.set_result(here.measure_one(key, knobs, kernel))
            self._count(name, started, key)

    def _count(self, name: str, started: float, key: str, inside: float | None = None) -> None:
        mark("measured", name, key, started, inside)
        with self.lock:
            self.workers[name] = self.workers.get(name, 0) + 1
            self.busy[name] = self.busy.get(name, 0.0) + time.time() - started

    def _here_runner(self):
        """The runner measuring on this process's GPU (``tracker.here``), or None."""
        if self.tracker.here is None:
            return None
        with self.lock:
            if self.here is None:
                from .runner import TritonRunner

                self.here = TritonRunner(self.tasks_by_key, self.repeat_ms)
            return self.here

    def _fail_queued_if_alone(self) -> None:
        """No session for this thread, and none held by any other: every worker is gone, so
        the queued candidates fail now (with the reason) instead of waiting out ``wait_s``."""
        with self.lock:
            if self.active:
                return
        while True:
            try:
                item = self.work.get_nowait()
            except queue.Empty:
                return
            if item is None:
                self.work.put(None)
                return
            item[3].set_result(RunnerResult(None, "no worker with key "
                                                  f"{self.tracker.key!r} is left at the tracker"))

    def close(self) -> None:
        self.closed = True
        for _ in self.threads:
            self.work.put(None)
        if self.here is not None:
            self.here.close()
