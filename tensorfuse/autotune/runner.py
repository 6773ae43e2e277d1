"""Runs Triton tuning candidates on the local GPU, checking each against the template defaults.

Each task gets fresh random inputs once (never zeros); the defaults' outputs are the reference a
candidate must match before its time counts — a candidate that computes something else is a
failed trial, reported as such, not a fast one. Both may differ from the exact result by the
tests' tolerance for the output dtype, so they may differ from each other by twice that.
"""
from __future__ import annotations

import json

import numpy as np
from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerFuture, RunnerInput, RunnerResult
from tvm.ir.utils import derived_object

from ..inputs import TOLERANCE  # max |err| / max |ref| per output dtype
from ..inputs import random_inputs as numpy_inputs
from ..targets.triton.launch import interpreting


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

    def inputs(self, key: str):
        """:func:`reference_inputs` of a task, made once."""
        if key not in self._inputs:
            self._inputs[key] = reference_inputs(self.tasks_by_key[key])
        return self._inputs[key]

    def run(self, runner_inputs: list[RunnerInput]) -> list[RunnerFuture]:
        futures = []
        for item in runner_inputs:
            with open(item.artifact_path, encoding="utf-8") as f:
                spec = json.load(f)
            futures.append(done(self.measure_one(spec["task"], spec["knobs"])))
        return futures

    def measure_one(self, key: str, knobs: dict) -> RunnerResult:
        """:func:`measure` of one candidate of task ``key``, as MetaSchedule takes a result (a
        failed trial, counted by the job, where it does not run or match the defaults)."""
        try:
            secs = measure(self.tasks_by_key[key], knobs, self.inputs(key), self.repeat_ms)
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


def measure(task, knobs: dict, inputs, repeat_ms: int = 50) -> float:
    """Seconds per call of ``task``'s candidate with ``knobs``, after checking its outputs
    against the template defaults' (a ValueError when they differ: a failed trial, not a fast
    one). On this machine's GPU (``triton.testing.do_bench``: median, warm-up, L2 flush), or under
    Triton's interpreter (the CPU; tests) by wall clock."""
    args, reference, dtypes = inputs
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
