"""Runs Triton tuning candidates on the local GPU, checking each against the template defaults.

Each task gets fresh random inputs once (never zeros); the defaults' outputs are the reference a
candidate must match before its time counts — a candidate that computes something else is a
failed trial, reported as such, not a fast one. Both may differ from the exact result by the
tests' tolerance for the output dtype, so they may differ from each other by twice that.
"""
from __future__ import annotations

import functools
import json
import os
import threading
from typing import Iterator

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
        results: dict = {}
        for index, kernel in self.compiled_in_turn(list(enumerate(specs))):
            results[index] = self.measure_one(*specs[index], kernel)
        return [done(results[index]) for index in range(len(specs))]

    def compiled_in_turn(self, items: list[tuple]) -> Iterator[tuple]:
        """``(tag, candidate)`` for ``items`` of ``(tag, (task key, knobs))``, each as soon as its
        Triton kernels are compiled: a batch compiles on all the CPUs at once
        (:func:`~tensorfuse.targets.triton.compile_pool.compiled_as_ready`) while the GPU
        measures what is ready (and this machine's workers find it in Triton's on-disk cache).
        The candidate is made already (measured as it is), or None where it could not be made
        here (measured, and reported, as without this). ``TENSORFUSE_COMPILE_AHEAD=0`` turns
        this off: in order, each compiled at its first launch, in the measuring process."""
        if len(items) < 2 or interpreting() or os.environ.get(COMPILE_AHEAD_ENV) == "0":
            yield from ((tag, None) for tag, _ in items)
            return
        from ..targets.triton.compile_pool import CompilePool, compiled_as_ready

        with self._lock:
            if self._pool is None:
                self._pool = CompilePool()

        def warm(item):
            key, knobs = item[1]
            task = self.tasks_by_key[key]
            candidate = task.candidate(knobs or None)
            warm_it = getattr(candidate, "warm", None)   # Triton templates
            if warm_it is not None:
                warm_it(*self.inputs(key)[0])
                return candidate   # its launches and block lists are made already
            return self._build_ahead(candidate, task)

        for (tag, _), candidate in compiled_as_ready(self._pool, items, warm):
            yield tag, candidate

    def _build_ahead(self, candidate, task):
        """A CUDA C++ candidate (cluster decode, the Hopper templates): its sources' ``nvcc``
        builds go to the pool's threads, all at once, into the on-disk cubin cache (where this
        machine's workers find them too). Built where it was measured, a tuning job's decode
        candidates took 1.0 s a trial on one H200 and 1.3 s with two GPUs measuring
        (``benchmarks.tuning --gpus-compare``); None where the candidate is not one."""
        launches = getattr(candidate, "launches", None)
        if launches is None:
            return None
        from ..targets.cuda.module import cubin_for

        for source in launches(task.scalars or None, **task.dims).sources:
            self._pool.build(functools.partial(cubin_for, source, candidate.target))
        return candidate

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def measure_one(self, key: str, knobs: dict, kernel=None) -> RunnerResult:
        """:func:`measure` of one candidate of task ``key`` (``kernel``: that candidate, made
        already), as MetaSchedule takes a result (a failed trial, counted by the job, where it
        does not run or match the defaults)."""
        try:
            secs = measure(self.tasks_by_key[key], knobs, self.inputs(key), self.repeat_ms,
                           kernel)
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


def measure(task, knobs: dict, inputs, repeat_ms: int = 50, kernel=None) -> float:
    """Seconds per call of ``task``'s candidate with ``knobs`` (``kernel``: that candidate, made
    already), after checking its outputs against the template defaults' (a ValueError when they
    differ: a failed trial, not a fast one). On this machine's GPU (``triton.testing.do_bench`` of
    the whole call: median, warm-up, L2 flush), or under Triton's interpreter (the CPU; tests)
    by wall clock."""
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
    import triton

    # the whole call, as tf.compile's kernel is called (binding, launches, outputs), so that a
    # setting is judged with the host work it brings: the suite's segment mean (H200,
    # ``benchmarks.user_kernels --tune``) takes 0.099 ms in its launches and 0.117 ms a call
    return float(triton.testing.do_bench(lambda: kernel(*args), rep=repeat_ms,
                                         return_mode="median")) * 1e-3


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
