"""Where a tuning job's candidates are built and measured: TVM's builder and runner for the
CPU, the GPU templates' own (:mod:`.builder`, :mod:`.runner`) in the job's process, or workers
through TVM's RPC tracker (:mod:`.remote`); and the defaults' and best records' timings every job
reports, measured the same way."""
from __future__ import annotations

import os

import numpy as np
import tvm

from ..inputs import random_inputs as numpy_inputs
from ..targets import TargetSpec
from .tasks import TuningTask, tuning_target


class Measurer:
    """Builds and measures a job's candidates: here (TVM's builder and runner for the CPU, the
    GPU templates' in this process), or on the workers of ``remote`` (:mod:`.remote`). A
    context: the runner's sessions end with it."""

    def __init__(self, tasks, spec: TargetSpec, remote, say):
        self.tasks, self.spec, self.remote, self.say = tasks, spec, remote, say
        self._cpu_inputs: dict = {}   # task name -> TVM arrays for timing it here

    def __enter__(self) -> "Measurer":
        from tvm.s_tir import meta_schedule as ms

        from .builder import CpuBuilder, TritonBuilder, without_startup_check
        from .runner import TritonRunner

        workers = max(1, os.cpu_count() or 1)
        by_key = {t.name: t for t in self.tasks}
        if self.spec.kind == "llvm":
            self.builder = CpuBuilder(by_key, workers)
            config = ms.runner.EvaluatorConfig(number=3, repeat=3, min_repeat_ms=20,
                                               enable_cpu_cache_flush=False)
            with without_startup_check(ms.runner.LocalRunner):
                self.runner = ms.runner.LocalRunner(timeout_sec=60, evaluator_config=config)
        else:
            self.builder = TritonBuilder(by_key, compile_ahead=False)
            if self.remote is None:
                self.runner = TritonRunner(by_key)
            else:
                from .remote import RemoteRunner

                self.runner = RemoteRunner(by_key, self.remote, self.say)
        return self

    def __exit__(self, *exc) -> None:
        if hasattr(self.runner, "close"):
            self.runner.close()

    def workers(self) -> list[str]:
        counts = getattr(self.runner, "workers", None)
        busy = getattr(self.runner, "busy", {})
        return [f"{name} ({n}" + (f", {busy[name]:.1f} s measuring)" if name in busy else ")")
                for name, n in sorted(counts.items())] if counts else []

    def times(self, tasks: list, db, tuned: bool) -> list[float | None]:
        """Seconds per call of each task's template defaults (what ``compile`` gives untuned)
        or best record, measured in the same way for both: through the job's runner for GPU
        templates, all in one batch (compiled together, spread over the job's GPUs; checked
        against the defaults, on the task's inputs), here for the CPU."""
        from tvm.s_tir.meta_schedule.arg_info import ArgInfo
        from tvm.s_tir.meta_schedule.runner import RunnerInput

        from .lookup import best_record, replay
        from .tasks import knobs_of

        secs: list[float | None] = [None] * len(tasks)
        batch, where = [], []
        for index, task in enumerate(tasks):
            found = best_record(db, task.mod) if tuned else None
            if tuned and found is None:
                continue
            scheduled = replay(found[0], task.mod) if tuned else None
            if not task.target.is_gpu:   # the same inputs for both: masks may depend on data
                if task.name not in self._cpu_inputs:
                    self._cpu_inputs[task.name] = _cpu_inputs(task)
                secs[index] = _time_here(task, scheduled, self._cpu_inputs[task.name])
                continue
            try:
                built = self.builder.artifact(task.name, knobs_of(scheduled) if tuned else {})
            except Exception:  # noqa: BLE001 - a record the template no longer builds: no time
                continue
            batch.append(RunnerInput(built.artifact_path, "cuda",
                                     ArgInfo.from_prim_func(task.mod["main"])))
            where.append(index)
        for index, future in zip(where, self.runner.run(batch) if batch else []):
            ran = future.result()
            if ran.error_msg is None:
                secs[index] = float(np.mean([float(x) for x in ran.run_secs]))
        return secs


def _cpu_inputs(task: TuningTask) -> list:
    """Fresh random inputs for timing a CPU task: TVM arrays, outputs appended (as the workload
    takes them)."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    tensors, _ = numpy_inputs(task.kernel, task.dims, np.random.default_rng())
    dev = tvm.cpu(0)
    args = [tvm.runtime.tensor(tensors[p.name], dev) for p in task.kernel.program.tensor_params]
    outputs = ArgInfo.from_prim_func(task.mod["main"])[len(args):]
    return args + [tvm.runtime.empty([int(n) for n in o.shape], str(o.dtype), dev)
                   for o in outputs]


def _time_here(task: TuningTask, scheduled, inputs: list) -> float:
    """Seconds per call of a CPU task's defaults (``scheduled`` None) or of a tuned schedule
    (a fused chain's: the candidate of the record's knobs)."""
    from ..schedule_templates.default import apply_default_schedule
    from .tasks import knobs_of

    if task.template == "cpu_fused":
        mod = task.candidate(knobs_of(scheduled) if scheduled is not None else None)
    else:
        mod = scheduled if scheduled is not None else apply_default_schedule(task.mod,
                                                                             task.target)
    lib = tvm.compile(mod, target=tuning_target(task.target))
    timer = lib.mod.time_evaluator("main", tvm.cpu(0), number=3, repeat=5, min_repeat_ms=20)
    return float(np.median(timer(*inputs).results))
