"""Runs Triton tuning candidates on the local GPU, checking each against the template defaults.

Each task gets fresh random inputs once (never zeros); the defaults' outputs are the reference a
candidate must match before its time counts — a candidate that computes something else is a
failed trial, reported as such, not a fast one. Both may differ from the exact result by the
tests' tolerance for the output dtype, so they may differ from each other by twice that.
"""
from __future__ import annotations

import json
import os
import threading

import numpy as np
from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerFuture, RunnerInput, RunnerResult
from tvm.ir.utils import derived_object

from ..inputs import TOLERANCE  # max |err| / max |ref| per output dtype
from ..inputs import random_inputs as numpy_inputs
from ..targets.triton.launch import interpreting

COMPILE_AHEAD_ENV = "TENSORFUSE_COMPILE_AHEAD"


def done(result: RunnerResult) -> RunnerFuture:
    """A future already resolved (Triton runs synchronously in this process)."""
    return RunnerFuture(f_done=lambda: True, f_result=lambda: result)


@derived_object
class TritonRunner(PyRunner):
    """Times candidates on this machine's GPU (:func:`measure`)."""

    def __init__(self, tasks_by_key: dict, repeat_ms: int = 50):
        super().__init__()
        self.tasks_by_key = tasks_by_key
        self.repeat_ms = repeat_ms
        self._inputs: dict = {}
        self._lock = threading.Lock()
        self._pool = None   # helper processes compiling a batch ahead (made at the first)
        self._warmed: dict = {}   # this batch's candidates compiled ahead, to measure as they are

    def inputs(self, key: str):
        """:func:`reference_inputs` of a task, made once."""
        with self._lock:
            if key not in self._inputs:
                self._inputs[key] = reference_inputs(self.tasks_by_key[key])
            return self._inputs[key]

    def run(self, runner_inputs: list[RunnerInput]) -> list[RunnerFuture]:
        specs = []
        for item in runner_inputs:
            with open(item.artifact_path, encoding="utf-8") as f:
                spec = json.load(f)
            specs.append((spec["task"], spec["knobs"]))
        self.compile_ahead(specs)
        return [done(self.measure_one(key, knobs)) for key, knobs in specs]

    def compile_ahead(self, specs: list[tuple[str, dict]]) -> None:
        """Compile a batch's Triton candidates for their inputs on all the CPUs at once
        (:mod:`~tensorfuse.targets.triton.compile_pool`) before any is measured; each measurement
        then finds its kernel compiled (here, and through Triton's on-disk cache in the workers
        of this machine). A candidate that fails here is measured as usual, and fails there.
        ``TENSORFUSE_COMPILE_AHEAD=0`` turns this off (each candidate compiles at its first
        launch, in the measuring process)."""
        self._warmed = {}
        if len(specs) < 2 or interpreting() or os.environ.get(COMPILE_AHEAD_ENV) == "0":
            return
        from ..targets.triton.compile_pool import CompilePool, compiled_ahead

        if self._pool is None:
            self._pool = CompilePool()
        with compiled_ahead(self._pool):
            for key, knobs in specs:
                try:
                    candidate = self.tasks_by_key[key].candidate(knobs or None)
                    warm = getattr(candidate, "warm", None)   # Triton templates
                    if warm is not None:
                        warm(*self.inputs(key)[0])
                        # measured as it is: its launches and block lists are made already
                        self._warmed[_candidate_key(key, knobs)] = candidate
                except Exception:  # noqa: BLE001 - measured, and reported, as without this
                    continue

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def measure_one(self, key: str, knobs: dict) -> RunnerResult:
        """:func:`measure` of one candidate of task ``key``, as MetaSchedule takes a result (a
        failed trial, counted by the job, where it does not run or match the defaults)."""
        try:
            secs = measure(self.tasks_by_key[key], knobs, self.inputs(key), self.repeat_ms,
                           self._warmed.pop(_candidate_key(key, knobs), None))
            return RunnerResult([secs], None)
        except Exception as exc:  # noqa: BLE001 - a failed trial, counted by the job
            return RunnerResult(None, f"{type(exc).__name__}: {exc}"[:2000])


def reference_inputs(task):
    """(arguments, the defaults' outputs in f32, output dtypes) for measuring ``task``'s
    candidates: fresh random inputs (never zeros) at the task's scalar values."""
    args = random_inputs(task.kernel, task.dims, task.scalars)
    reference = _as_list(task.candidate(None)(*args))
    dtypes = [c.dtypes[0] for c in task.kernel.program.outputs]
    return args, [r.float() for r in reference], dtypes


def _candidate_key(key: str, knobs: dict) -> tuple:
    return key, json.dumps(knobs, sort_keys=True)


def measure(task, knobs: dict, inputs, repeat_ms: int = 50, kernel=None) -> float:
    """Seconds per call of ``task``'s candidate with ``knobs`` (``kernel``: that candidate, made
    already), after checking its outputs against the template defaults' (a ValueError when they
    differ: a failed trial, not a fast one). On this machine's GPU (``triton.testing.do_bench``:
    median, warm-up, L2 flush), or under Triton's interpreter (the CPU; tests) by wall clock."""
    args, reference, dtypes = inputs
    if kernel is None:
        kernel = task.candidate(knobs or None)
    outs = _as_list(kernel(*args))
    for got, want, dtype in zip(outs, reference, dtypes):
        err = float((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30))
        if not err <= 2 * TOLERANCE[dtype]:  # NaN fails too
            raise ValueError(f"wrong result (relative error {err:.3g} against the "
                             "template defaults)")
    if interpreting():
        import time

        times = []
        for _ in range(3):
            start = time.perf_counter()
            kernel(*args)
            times.append(time.perf_counter() - start)
        return float(np.median(times))
    return kernel.benchmark(*args, repeat=repeat_ms) * 1e-3


def random_inputs(kernel, dims: dict, scalars: dict | None = None) -> list:
    """Fresh random inputs (never zeros) as torch tensors on the GPU (on the CPU under Triton's
    interpreter), in call order, with the scalar values ``scalars`` (the others: their
    defaults)."""
    import torch

    from ..interop import torch_dtype, torch_from_numpy

    rng = np.random.default_rng()
    device = "cpu" if interpreting() else "cuda"
    generator = torch.Generator(device).manual_seed(int(rng.integers(2**62)))

    def on_device(shape: tuple, dtype: str):
        return torch.randn(shape, generator=generator, device=device, dtype=torch_dtype(dtype))

    tensors, scalars = numpy_inputs(kernel, dims, rng, scalars, real_tensor=on_device)
    return [(t if isinstance(t, torch.Tensor) else torch_from_numpy(t, device))
            if (t := tensors.get(p.name)) is not None else scalars[p.name]
            for p in kernel.program.params]


def _as_list(out) -> list:
    return list(out) if isinstance(out, tuple) else [out]
