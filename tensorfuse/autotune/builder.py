"""Builders for tuning candidates: the CPU's built on threads in this process
(:class:`CpuBuilder`), the GPU templates compiled by Triton in this process
(:class:`TritonBuilder`).

TVM's ``LocalBuilder`` is not used. Its default build function imports
``tvm.s_tir.tensor_intrin`` in every fresh worker, which parses all of TVM's CUDA and ROCm tensor
intrinsics as TVMScript: 24–31 s on the 2-core CI machine (``python -X importtime``:
``tensor_intrin.cuda`` 18 s). And it starts a fresh process pool for every batch, each worker
importing TVM (5 s). Our candidates are already scheduled (nothing left to tensorize):
:func:`build_candidate` builds them without that import.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from contextlib import contextmanager

import tvm
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.ir.utils import derived_object

from .scalars import SCALARS_ATTR
from .tasks import TASK_ATTR, knobs_of, task_label


def build_candidate(mod: tvm.IRModule, target: tvm.target.Target, _params=None):
    """Compile one scheduled candidate (runs in a builder worker)."""
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return build(mod, target=target)


_SANITY = threading.Lock()


@contextmanager
def without_startup_check(tvm_class):
    """Construct TVM's ``LocalRunner`` without its start-up check: it starts a process pool only
    to look up its worker functions there — 4.7 s of a 30 s four-trial CPU job on 2 cores
    (cProfile of ``tune(K.softmax, "llvm", trials=4)``). The functions are TVM's defaults,
    importable in every worker; a worker that could not find one fails its trials, and the job
    says so."""
    cls = tvm_class._cls   # the Python class behind TVM's derived object
    with _SANITY:
        saved = cls._sanity_check
        cls._sanity_check = lambda self: None
        try:
            yield
        finally:
            cls._sanity_check = saved


@derived_object
class CpuBuilder(PyBuilder):
    """A CPU job's builder: candidates of the CPU template (schedules of the workload) built as
    they are, and candidates of a fused chain (``cpu_fused``: knobs that change the lowering)
    lowered for their knobs here, where the kernel is known — both built in a pool of threads in
    this process and exported as TVM's builder exports, for TVM's runner. TVM's ``LocalBuilder``
    starts a fresh process pool for every batch, each worker importing TVM (5 s on the 2-core
    CI machine): a CPU job's pools took longer than its builds (``tests/autotune/test_tuning.py``'s
    three-job test, 39 s with it, 23 s with this). A build that crashes the process takes the job
    with it — the database keeps every finished batch (a job resumes from it)."""

    def __init__(self, tasks_by_key: dict, workers: int):
        super().__init__()
        self.tasks_by_key = tasks_by_key
        self.workers = workers

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        from concurrent.futures import ThreadPoolExecutor

        if not build_inputs:
            return []
        with ThreadPoolExecutor(max(1, min(len(build_inputs), self.workers))) as pool:
            return list(pool.map(self._build, build_inputs))

    @staticmethod
    def _fused(mod: tvm.IRModule) -> bool:
        from ..schedule_templates.annotations import TEMPLATE_ATTR

        attrs = mod["main"].attrs
        return attrs is not None and str(attrs.get(TEMPLATE_ATTR, "")) == "cpu_fused"

    def _build(self, item: BuilderInput) -> BuilderResult:
        from tvm.s_tir.meta_schedule.builder.local_builder import default_export

        try:
            mod = item.mod
            if self._fused(mod):   # the chain lowered for the candidate's knobs
                mod = self.tasks_by_key[task_key(mod)].candidate(knobs_of(mod))
            return BuilderResult(default_export(build_candidate(mod, item.target)), None)
        except Exception as exc:  # noqa: BLE001 - reported per candidate, counted by the job
            return BuilderResult(None, f"build failed: {failure(exc)}")


def failure(exc: BaseException, limit: int = 2000) -> str:
    """``Type: message`` of ``exc`` and of the exceptions it was raised from or during (Triton's
    front-end errors print the failing line of the source; what failed there is the cause), at
    most ``limit`` characters: the beginning and the end where longer."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    text = "\ncaused by ".join(parts)
    half = limit // 2
    return text if len(text) <= limit else f"{text[:half]}\n…\n{text[-half:]}"


@derived_object
class TritonBuilder(PyBuilder):
    """Makes each candidate's kernel from its knobs (Triton templates; ``hopper_attention``'s
    cubin by nvcc); the artifact is a small JSON file naming the task and the knobs, which
    :class:`~.runner.TritonRunner` runs.

    ``compile_ahead``: also compile for the target here (works without a GPU). A tuning job, which
    runs where the GPU is, leaves it off: the runner's first launch compiles anyway, specialised
    to the real arguments, and compiling ahead as well cost a second compile per candidate
    (measured on the H100: 1–2.6 s each); its errors (e.g. too much shared memory) are then
    reported by the runner. Without it, a Triton candidate is not even planned here: the
    runner makes it as it compiles it, off the search's thread (planning and writing 530
    candidates held the job's main thread 9.4 s of a 65-s job on the 2-GPU host)."""

    def __init__(self, tasks_by_key: dict, compile_ahead: bool = True):
        super().__init__()
        self.tasks_by_key = tasks_by_key
        self.compile_ahead = compile_ahead

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        """Each candidate's kernel, prepared in parallel threads (nvcc runs outside the
        interpreter lock for most of its time; Triton's offline compiles take turns,
        ``targets.triton.launch.compile_for``); in turn where there is nothing to prepare (a
        job's Triton candidates: naming one is a few calls into TVM, which a pool of threads
        only makes contend for the interpreter lock)."""
        from concurrent.futures import ThreadPoolExecutor

        if not any(self._prepares(t) for t in self.tasks_by_key.values()):
            return [self._build_one(item) for item in build_inputs]
        with ThreadPoolExecutor(max(1, min(len(build_inputs), os.cpu_count() or 1))) as pool:
            return list(pool.map(self._build_one, build_inputs))

    def _prepares(self, task) -> bool:
        """Whether this builder plans (and compiles) ``task``'s candidates, or only names them
        for the runner, which makes them."""
        return self.compile_ahead or not task.space.made_by_runner

    def _build_one(self, item: BuilderInput) -> BuilderResult:
        try:
            return self.artifact(task_key(item.mod), knobs_of(item.mod))
        except Exception as exc:  # noqa: BLE001 - reported per candidate, counted by the job
            return BuilderResult(None, f"build failed: {failure(exc)}")

    def artifact(self, key: str, knobs: dict) -> BuilderResult:
        """The candidate of task ``key`` with ``knobs`` (``{}``: the template defaults), prepared
        (bad knobs fail here), as an artifact the runners take."""
        task = self.tasks_by_key[key]
        if self._prepares(task):
            task.space.prepare(task.candidate(knobs or None), self.compile_ahead)
        # a folder per artifact: MetaSchedule removes the artifact's folder once measured
        path = os.path.join(tempfile.mkdtemp(prefix="tensorfuse-candidate-"), "knobs.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"task": key, "knobs": knobs}, f)
        return BuilderResult(path, None)


def task_key(mod: tvm.IRModule) -> str:
    """The task a candidate belongs to (its name, from the workload's attributes)."""
    attrs = mod["main"].attrs
    return task_label(str(attrs[TASK_ATTR]), json.loads(str(attrs[SCALARS_ATTR])))
