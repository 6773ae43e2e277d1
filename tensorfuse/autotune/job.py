"""A tuning job: MetaSchedule with TVM's XGBoost cost model over our templates' spaces.

>>> summary = tensorfuse.tune(softmax, target="llvm", trials=32, M=256, N=1024)
>>> print(summary)          # per kernel: trials, best latency, speedup over the defaults

Records go to this device's database (see :mod:`.database`) as they are measured, so a job that
is interrupted — Ctrl-C, ``kill -9`` — loses at most the batch in flight; running the same job
again counts the trials already recorded and runs only the rest. Several kernels in one job share
the trial budget through TVM's task schedulers (:func:`_scheduler`); a budget that covers their
spaces measures every setting that fits (:mod:`.every_setting`).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
import tvm

from ..dsl.program import TracedKernel, is_kernel
from ..errors import TuningError
from ..targets import TargetSpec, get_target
from .database import DatabaseLock, default_database_dir, open_database
from .measurer import Measurer
from .pruning import fitting_settings
from .tasks import TuningTask, make_tasks, tuning_target


@dataclass
class TaskResult:
    """How one kernel's tuning went."""

    name: str
    template: str
    trials: int = 0              # records in the database for it now (all jobs)
    trials_this_job: int = 0
    failures_this_job: int = 0   # candidates that did not build, run, or match the defaults
    best_secs: float | None = None      # the best record, timed here like the defaults
    default_secs: float | None = None
    errors: list[str] = field(default_factory=list)
    settings: tuple[int, int] | None = None   # (knob settings that fit the GPU, in all)
    kept_defaults: bool = False  # the best record lost to the defaults when timed again

    @property
    def speedup(self) -> float | None:
        if self.best_secs is None or self.default_secs is None:
            return None
        return self.default_secs / self.best_secs


@dataclass
class TuningSummary:
    """What a job did; ``str()`` is the table printed at its end."""

    target: str
    database: str
    tasks: list[TaskResult]
    seconds: float
    interrupted: bool = False
    asked: int = 0               # the trial budget of the job
    workers: list[str] = field(default_factory=list)   # where candidates were measured
    workers_ready_s: float | None = None   # when the workers were there, into the job

    @property
    def exhausted(self) -> bool:
        """The search stopped short of the budget because it had no new candidates left."""
        return not self.interrupted and sum(t.trials for t in self.tasks) < self.asked

    def table(self) -> str:
        rows = [("kernel", "template", "trials", "failed", "best ms", "default ms", "speedup")]
        for t in self.tasks:
            rows.append((t.name, t.template, f"{t.trials} (+{t.trials_this_job})",
                         str(t.failures_this_job), _ms(t.best_secs), _ms(t.default_secs),
                         (f"{t.speedup:.2f}x" if t.speedup else "-")
                         + (" (defaults kept)" if t.kept_defaults else "")))
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def __str__(self) -> str:
        state = "interrupted" if self.interrupted else "done"
        failures = [f"{t.name}: {t.failures_this_job} candidate(s) failed, first: {t.errors[0]}"
                    for t in self.tasks if t.errors]
        lines = [f"tuning {state} on {self.target} in {self.seconds:.0f} s; database "
                 f"{self.database}", self.table(), *failures]
        if self.exhausted:
            recorded = sum(t.trials for t in self.tasks)
            spaces = [f"{t.name}: {t.settings[0]} settings fit the GPU, of {t.settings[1]}"
                      for t in self.tasks if t.settings]
            lines.append(f"the space is exhausted: {recorded} of the {self.asked} trials asked "
                         "were run, and the search found no candidate it had not measured"
                         + (f" ({'; '.join(spaces)})" if spaces else ""))
        if self.workers:
            ready = "" if self.workers_ready_s is None else \
                f" (ready {self.workers_ready_s:.1f} s into the job)"
            lines.append(f"measured on {', '.join(self.workers)}{ready}")
        return "\n".join(lines)


def _ms(secs: float | None) -> str:
    return "-" if secs is None else f"{secs * 1e3:.4g}"


def tune(kernels: "TracedKernel | Iterable[TracedKernel | tuple[TracedKernel, dict]]",
         target: "str | TargetSpec" = "auto", trials: int = 64, *, database: str | None = None,
         trials_per_iter: int | None = None, progress: "bool | Callable[[str], None]" = True,
         seed: int | None = None, scalars: dict | None = None,
         gpus: "str | list[int] | None" = None, tracker: str | None = None,
         key: str = "tensorfuse", **dims: int) -> TuningSummary:
    """Tune ``kernels`` on ``target`` with MetaSchedule and the XGBoost cost model.

    ``kernels``: a kernel, or a list of kernels or ``(kernel, sizes)`` pairs; sizes not given in
    a pair come from ``**dims``; a pair's dict may hold scalar values too. ``scalars``: the values
    of scalar parameters to tune at (``{"window": 2048}``; with several kernels, those that have
    them) — the values you call with, since a window or a prefix length changes which blocks
    exist; records are kept per value of such scalars, and ``compile`` uses them for calls with
    those values (or the nearest, and says so); scalars not given take their usual defaults.
    ``trials``: the budget of measured candidates for the whole job
    (trials already in the database count; the template defaults are measured first; with
    several kernels the task scheduler hands out whole batches of ``trials_per_iter``, so the
    last one may pass the budget by less than a batch; a budget that covers every setting of
    the kernels' spaces that fits the GPU measures them all, each kernel's in one batch, with
    no search). ``database``: a folder (default: this
    device's, the one ``compile`` reads). ``progress``: print a line per batch to stderr, or
    pass a function. Where candidates are measured (:mod:`.remote`): this process's GPU by
    default; ``gpus="all"`` (or a list of indices) one worker per GPU of this machine;
    ``tracker="host:port"`` the workers registered there under ``key`` (the secret they share
    with the job in ``TENSORFUSE_TUNING_SECRET``) — this process then needs no GPU, and it alone
    writes the database. Returns the summary (also printed when ``progress`` is on)."""
    start = time.time()
    spec = get_target(target)
    if not isinstance(trials, int) or trials < 1:
        raise TuningError(f"trials must be a positive integer, got {trials!r}")
    if gpus is not None and tracker is not None:
        raise TuningError("gpus= starts workers on this machine, tracker= uses running ones: "
                          "give one of them")
    if spec.kind == "llvm" and (gpus is not None or tracker is not None):
        raise TuningError("workers (gpus=, tracker=) measure GPU templates; a CPU job measures "
                          "in this process")
    if tracker is None:
        _check_device(spec)
    say = _reporter(progress)
    remote = _workers(gpus, tracker, key, say)   # local ones start while the tasks are made
    try:
        return _job(kernels, spec, trials, database, trials_per_iter, seed, scalars, dims,
                    remote, say, start)
    finally:
        if remote is not None and remote.local:
            from .remote import stop_local_workers

            stop_local_workers(remote)


def _workers(gpus, tracker: str | None, key: str, say):
    """The workers a job measures on (:mod:`.remote`), or None for this process's GPU."""
    if gpus is not None:
        from .remote import start_local_workers

        return start_local_workers(gpus, say)
    if tracker is not None:
        from .remote import connect

        return connect(tracker, key)
    return None


def _job(kernels, spec, trials, database, trials_per_iter, seed, scalars, dims, remote, say,
         start) -> TuningSummary:
    tasks = _tasks(kernels, dims, spec, scalars or {})
    path = os.path.abspath(database or default_database_dir(spec))
    with DatabaseLock(path, say):
        db = open_database(path)
        results = [TaskResult(t.name, t.template, trials=_trials_recorded(db, t),
                              settings=fitting_settings(t)) for t in tasks]
        remaining = trials - sum(r.trials for r in results)
        say(f"tuning {len(tasks)} kernel(s) on {spec.name}: {trials} trials, "
            f"{max(remaining, 0)} to run; database {path}")
        for r in results:
            if r.settings and r.settings[0] < r.settings[1]:
                say(f"  {r.name}: {r.settings[1] - r.settings[0]} of {r.settings[1]} knob "
                    "settings need more shared memory or registers than the GPU has: left out")
        stop = threading.Event()
        # Ctrl-C is caught over the timing of the defaults and the best records too: there a
        # KeyboardInterrupt raised inside a TVM pass comes out as a RuntimeError, a traceback
        # instead of the interrupted job's status
        with Measurer(tasks, spec, remote, say) as measurer, _stop_on_ctrl_c(stop, say):
            if remaining > 0:
                try:
                    _run(tasks, results, db, spec, path, remaining, trials, trials_per_iter,
                         seed, say, stop, measurer)
                except Exception:  # noqa: BLE001 - MetaSchedule re-raises our stop
                    if not stop.is_set():
                        raise
                if stop.is_set():
                    say("interrupted: what was measured is in the database; run the job again "
                        "to go on from there")
            defaults = measurer.times(tasks, db, tuned=False)
            best = measurer.times(tasks, db, tuned=True)
            for task, result, default_secs, best_secs in zip(tasks, results, defaults, best):
                result.trials = _trials_recorded(db, task)   # db holds what the job added
                result.default_secs, result.best_secs = default_secs, best_secs
                result.kept_defaults = _keep_defaults_that_win(task, db, default_secs,
                                                               best_secs)
                if result.kept_defaults:   # what tf.compile runs now: the defaults
                    result.best_secs = default_secs
                    say(f"  {result.name}: the best record measured {best_secs * 1e3:.4g} ms "
                        f"against the defaults' {default_secs * 1e3:.4g} ms when both were timed "
                        "again: the defaults are recorded as the best, tf.compile keeps them")
    ready = getattr(measurer.runner, "ready", None)
    summary = TuningSummary(spec.name, path, results, time.time() - start, stop.is_set(),
                            asked=trials, workers=measurer.workers(),
                            workers_ready_s=None if ready is None else ready - start)
    say(str(summary))
    return summary


@contextlib.contextmanager
def _stop_on_ctrl_c(stop: threading.Event, say):
    """Ctrl-C asks the job to stop after the batch in flight (its records are then complete),
    or, once the batches are done, after the timing in flight; a second Ctrl-C stops at once.
    Outside the main thread, Ctrl-C is left alone."""
    def handler(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        say("stopping after the work in flight (Ctrl-C again to stop now)")

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _check_device(spec: TargetSpec) -> None:
    """Refuse a job this machine cannot measure (on its GPU, or its GPUs' workers)."""
    if spec.kind == "rocm":
        raise TuningError(f"tuning measures candidates on the device, and {spec.name} cannot run "
                          "here: this TVM build has no ROCm runtime and no AMD GPU is visible. "
                          "Code generation works without it (kernel.source(...) and "
                          "kernel.assembly(...)); tune on a machine with the GPU")
    if spec.kind == "cuda":
        if not tvm.cuda(0).exist:
            raise TuningError(f"tuning for {spec.name} needs the NVIDIA GPU it is for, and none "
                              "is visible on this machine; tune on the GPU machine, tune "
                              "target='llvm' here, or measure on workers (tracker=)")
        try:
            import torch
            import triton  # noqa: F401
        except ImportError as exc:
            raise TuningError(f"tuning GPU templates needs torch and triton ({exc})") from None
        if not torch.cuda.is_available():
            raise TuningError("tuning GPU templates runs candidates through PyTorch, whose build "
                              "here has no CUDA")


def _tasks(kernels, dims: dict, spec: TargetSpec, scalars: dict) -> list[TuningTask]:
    items = [kernels] if is_kernel(kernels) or isinstance(kernels, tuple) else list(kernels)
    if not items:
        raise TuningError("no kernels to tune")
    tasks, names, used = [], set(), set()
    for item in items:
        kernel, sizes = item if isinstance(item, tuple) else (item, {})
        if not is_kernel(kernel):
            raise TuningError(f"tune takes @tensorfuse.kernel functions, got "
                              f"{type(kernel).__name__}")
        own = {p.name for p in kernel.program.scalar_params}
        shared, shared_scalars = dims, scalars
        if len(items) > 1:  # sizes given for the whole job apply to the kernels that have them
            shared = {k: v for k, v in dims.items() if k in kernel.program.dim_names()}
            shared_scalars = {k: v for k, v in scalars.items() if k in own}
            used |= set(shared) | set(shared_scalars)
        for task in make_tasks(kernel, {**shared, **{k: v for k, v in sizes.items()
                                                     if k not in own}},
                               spec, {**shared_scalars, **{k: v for k, v in sizes.items()
                                                           if k in own}}):
            if task.name in names:
                raise TuningError(f"{task.name} is listed twice")
            names.add(task.name)
            tasks.append(task)
    if len(items) > 1 and (set(dims) | set(scalars)) - used:
        raise TuningError(f"no kernel in this job has a size or scalar named "
                          f"{', '.join(sorted((set(dims) | set(scalars)) - used))}")
    return tasks


def _reporter(progress) -> Callable[[str], None]:
    if callable(progress):
        return progress
    if progress:
        return lambda line: print(line, file=sys.stderr, flush=True)
    return lambda line: None


def _records_of(db, task: TuningTask) -> list:
    """The records of ``task`` in ``db`` (failed candidates included)."""
    if not db.has_workload(task.mod):
        return []
    workload = db.commit_workload(task.mod)  # the database's own object for an existing one
    return [r for r in db.get_all_tuning_records() if r.workload.same_as(workload)]


def _trials_recorded(db, task: TuningTask) -> int:
    """Records of ``task`` (for a fused CPU chain, the defaults recorded again where they won at
    a job's end count as a trial: :func:`_keep_defaults_that_win`)."""
    return len(_records_of(db, task))


REMATCH_MARGIN = 0.02   # the best record must lose by more than this to the defaults


def _keep_defaults_that_win(task: TuningTask, db, default_secs, best_secs) -> bool:
    """Where the best record, timed again at the job's end beside the template defaults, is
    slower than they are (by more than :data:`REMATCH_MARGIN`), record the defaults as faster
    than that record and return True: it won the search by a timing this machine's drift made
    (on the 2-core CPU machine a job picked a setting that its batch placed 2 % ahead and that
    called 12 % slower: ``benchmarks.cpu_tuning``). The defaults' time is recorded on the
    scale the best record was measured at — its recorded time × defaults / best, the last two
    measured side by side now — since the database ranks records by the times they were given,
    and timings taken minutes apart differ by more than the settings do.

    For the chains run fused on the CPU (``cpu_fused``: a dozen settings a few per cent apart,
    measured in a second process on a machine whose speed drifts by more) and the GPU
    templates: on the H200 six-trial jobs of ``benchmarks.user_kernels --tune`` left records 1–7 %
    slower than the defaults when both were timed again (192/128 attention: 0.299 ms against
    0.279), which ``tf.compile`` then ran. The CPU template's records stay as measured (they are
    many); there the summary's speedup column shows such a loss."""
    import tvm_ffi
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import TuningRecord

    from .lookup import best_record, replay

    if task.template == "cpu" or default_secs is None or best_secs is None or \
            best_secs <= default_secs * (1 + REMATCH_MARGIN):
        return False
    found, defaults = best_record(db, task.mod), task.default_schedule()
    if found is None or defaults is None or \
            tvm_ffi.structural_equal(replay(found[0], task.mod), defaults.mod):
        return False
    secs = found[1] * default_secs / best_secs
    db.commit_tuning_record(TuningRecord(defaults.trace, db.commit_workload(task.mod), [secs],
                                         tuning_target(task.target),
                                         ArgInfo.from_prim_func(task.mod["main"])))
    return True


def _run(tasks, results, db, spec, path, remaining, trials, trials_per_iter, seed, say,
         stop: threading.Event, measurer: Measurer) -> None:
    from tvm.s_tir import meta_schedule as ms

    from .features import KnobFeatures
    from .progress import Progress

    workers = max(1, os.cpu_count() or 1)
    per_iter = trials_per_iter or max(4, min(32, remaining // 2 or 1))
    # the CPU template's candidates differ in their loops; template candidates (the CPU's fused
    # chains too) only in their knobs
    by_loops = any(t.template == "cpu" for t in tasks)
    extractor = "per-store-feature" if by_loops else KnobFeatures()
    builder, runner = measurer.builder, measurer.runner
    # GPU templates' knob features are a handful of numbers per candidate: one XGBoost thread
    # trains on them in ~0.1 s, while one per core (MetaSchedule's default) spun for 4-6 s per
    # job on a 32-core host busy compiling and measuring (the job's stack samples)
    cost_model = ms.cost_model.XGBModel(extractor=extractor, num_warmup_samples=min(16, per_iter),
                                         num_tuning_cores=workers if by_loops else 1)
    callbacks = list(ms.measure_callback.MeasureCallback.create("default")) + [
        Progress(tasks, results, say, stop)]
    if not stop.is_set():
        _measure_defaults([(t, r) for t, r in zip(tasks, results) if r.trials == 0], db, builder,
                          runner, say)
    remaining = trials - sum(r.trials + r.trials_this_job for r in results)
    if remaining <= 0:
        return
    unmeasured = _covered_spaces(tasks, results, db, remaining, say)
    contexts = [_context(t, spec, per_iter, seed, u) for t, u in zip(tasks, unmeasured)]
    os.makedirs(os.path.join(path, "logs"), exist_ok=True)
    ms.tune_tasks(tasks=contexts, task_weights=[1.0] * len(tasks), work_dir=path,
                  max_trials_global=remaining,
                  max_trials_per_task=max(trials - r.trials - r.trials_this_job for r in results),
                  num_trials_per_iter=per_iter, builder=builder, runner=runner, database=db,
                  cost_model=cost_model, measure_callbacks=callbacks,
                  task_scheduler=_scheduler(tasks, measurer))


def _covered_spaces(tasks, results, db, remaining: int, say) -> list:
    """Per task, its fitting settings the database holds no record of — where the job's budget
    covers them all, for every task, to be measured at once
    (:class:`.every_setting.EverySetting`) — else None for each (the evolutionary search)."""
    from .pruning import fitting_settings_of, setting_key

    if not tasks or any(r.settings is None for r in results):
        return [None] * len(tasks)
    left = []
    for task in tasks:
        seen = _measured_settings(db, task)
        left.append([k for k in fitting_settings_of(task) if setting_key(k) not in seen])
    count = sum(len(settings) for settings in left)
    if count > remaining:
        return [None] * len(tasks)
    say(f"  the budget covers every setting that fits: {count} candidate(s), each kernel's in "
        "one batch")
    return left


def _measured_settings(db, task: TuningTask) -> set:
    """The knob settings of ``task`` the database holds records of (``setting_key``s); a record
    this version cannot replay counts as unmeasured."""
    from .lookup import replay
    from .pruning import setting_key
    from .tasks import knobs_of

    found = set()
    for record in _records_of(db, task):
        try:
            found.add(setting_key(knobs_of(replay(record, task.mod))))
        except Exception:  # noqa: BLE001 - measured again
            continue
    return found


def _scheduler(tasks, measurer: Measurer) -> str:
    """MetaSchedule's task scheduler for the job. Several kernels measured through workers
    (``gpus=``, ``tracker=``) take turns (round robin): the runner hands back a batch's futures at
    once, so one kernel's search runs while another's batch is measured — the gradient scheduler
    waits for every batch in flight before choosing the next kernel, leaving the GPUs idle during
    each search (a job of two kernels simulated with 0.15 s per measurement: a second GPU gave
    1.57x under the gradient scheduler, 1.73x round robin). Measured in the job's process (no
    overlap to gain), the gradient scheduler gives the trials to the kernels with the most to
    gain."""
    if len(tasks) == 1 or measurer.remote is not None:
        return "round-robin"
    return "gradient"


def _measure_defaults(pending: list, db, builder, runner, say) -> None:
    """Measure the template defaults of ``pending`` ``(task, result)`` pairs first — one batch,
    compiled together and spread over the job's GPUs — and record them like any candidate, so a
    short job can never leave a record slower than what ``compile`` had without one."""
    import shutil

    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.database import TuningRecord
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    made = [(task, result, sch) for task, result in pending
            if (sch := task.default_schedule()) is not None]
    if not made:
        return
    targets = [tuning_target(task.target) for task, _, _ in made]
    args = [ArgInfo.from_prim_func(task.mod["main"]) for task, _, _ in made]
    built = builder.build([BuilderInput(sch.mod, target)
                           for (_, _, sch), target in zip(made, targets)])
    inputs = [RunnerInput(b.artifact_path, {"llvm": "cpu"}.get(t.kind.name, t.kind.name), a)
              for b, t, a in zip(built, targets, args) if b.error_msg is None]
    futures = iter(runner.run(inputs) if inputs else [])
    for (task, result, sch), b, target, args_info in zip(made, built, targets, args):
        result.trials_this_job += 1
        run_secs, error = None, b.error_msg
        if error is None:
            ran = next(futures).result()
            run_secs, error = ran.run_secs, ran.error_msg
            shutil.rmtree(os.path.dirname(b.artifact_path), ignore_errors=True)
        if error is not None:
            result.failures_this_job += 1
            result.errors.append(f"template defaults: {error.strip().splitlines()[-1][:300]}")
        db.commit_tuning_record(TuningRecord(sch.trace, db.commit_workload(task.mod), run_secs,
                                             target, args_info))
        say(f"  {result.name}: template defaults measured"
            + (f" at {np.mean([float(x) for x in run_secs]) * 1e3:.4g} ms" if run_secs else
               f", failed: {result.errors[-1]}"))


def _context(task: TuningTask, spec: TargetSpec, per_iter: int, seed: int | None,
             settings: list | None = None):
    """A MetaSchedule TuneContext for ``task``: the evolutionary search, or with ``settings``
    (knob settings) exactly those, in one batch.

    Made through TVM's FFI constructor rather than ``TuneContext(...)``, whose ``__init__``
    imports every tensor intrinsic (24 s here; our spaces tensorize nothing)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.logging import get_logger, get_logging_func

    from ..schedule_templates.cpu import cpu_search_space
    from .pruning import FitsDevice
    from .tasks import knob_space

    if task.template == "cpu":
        space = ms.space_generator.ScheduleFn(
            cpu_search_space, sch_rules=[],
            postprocs=[ms.postproc.DisallowDynamicLoop(),
                       ms.postproc.RewriteParallelVectorizeUnroll(),
                       ms.postproc.RewriteReductionBlock()],
            mutator_probs={ms.mutator.MutateTileSize(): 0.8, ms.mutator.MutateUnroll(): 0.2})
    else:
        space = ms.space_generator.ScheduleFn(knob_space(task.choices()), sch_rules=[],
                                              postprocs=[FitsDevice(task)], mutator_probs={})
    if settings is not None:
        from .every_setting import EverySetting

        strategy = EverySetting(task, settings)
    else:
        strategy = ms.search_strategy.EvolutionarySearch(
            population_size=max(32, 4 * per_iter), init_min_unmeasured=max(16, 2 * per_iter),
            genetic_num_iters=2)
    context = ms.TuneContext.__new__(ms.TuneContext)
    context.__init_handle_by_constructor__(
        _ffi_api.TuneContext, task.mod, tuning_target(spec), space, strategy, task.name,
        max(1, os.cpu_count() or 1), -1 if seed is None else seed,
        get_logging_func(get_logger("tensorfuse.autotune")))
    _ffi_api.TuneContextInitialize(context)
    return context
