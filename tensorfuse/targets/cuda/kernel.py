"""Cluster kernels as callables: arguments checked like every tensorfuse kernel, torch or NumPy in
and out, one generated source and TVM CUDA module per set of sizes."""
from __future__ import annotations

from typing import Callable

from ...binding import CallBinder, check_named_sizes, output_shape, split_scalars
from ...interop import current_stream, deliver, torch_arguments, torch_output
from ...torch_graph import GraphCallable
from .. import TargetSpec
from ..codegen import cuda_to_ptx
from .module import KernelEntry, cuda_module


def pointer(x):
    """A tensor as a kernel argument: TVM's CUDA module takes raw device pointers for ``handle``
    arguments (a DLPack tensor there is the address of its descriptor, not of its data)."""
    import ctypes

    return ctypes.c_void_p(x.data_ptr())


_FFI_DEVICES: dict = {}


def torch_stream(device):
    """A context in which TVM's launches go on torch's current stream on ``device`` (a torch CUDA
    device): ``tvm_ffi.use_raw_stream`` with the stream read by :func:`current_stream` and the
    FFI device made once. ``tvm_ffi.use_torch_stream`` builds a ``torch.cuda.Stream`` and parses
    a device per call — a fifth of a Hopper attention call's Python under cProfile
    (tools/profile_call.py); the call's host time without the profiler moved within its
    run-to-run noise (RESULTS.md, session 29)."""
    import torch
    import tvm_ffi

    index = device.index if device.index is not None else torch.cuda.current_device()
    ffi_device = _FFI_DEVICES.get(index)
    if ffi_device is None:
        ffi_device = _FFI_DEVICES[index] = tvm_ffi.device(f"cuda:{index}")
    return tvm_ffi.use_raw_stream(ffi_device, current_stream(device))


class Launches:
    """Generated source, its entry points, the plan and knobs it was written from, and
    ``run(module, values, out, device)`` which launches them (``out``: the output tensor, or the
    tuple of them for a program of several outputs); ``module`` is built on the first
    call. ``more``: further ``(source, entries)`` built as modules of their own (kernels whose
    sources cannot share one translation unit); ``run`` then gets the tuple of all modules."""

    def __init__(self, source: str, entries: list[KernelEntry], knobs, run, why: str = "",
                 plan=None, more: tuple = (), origin: str | None = None):
        self.source, self.entries, self.knobs, self.run = source, entries, knobs, run
        self.why = why   # how a default was chosen, where that depends on the GPU
        self.origin = origin   # where the knobs come from, when not the template defaults
        self.plan = plan
        self.more = tuple(more)
        self.module = None

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.source,) + tuple(source for source, _ in self.more)

    def build(self, target: TargetSpec) -> None:
        """The module(s), once."""
        if self.module is None:
            modules = tuple(cuda_module(source, entries, target) for source, entries in
                            ((self.source, self.entries),) + self.more)
            self.module = modules if self.more else modules[0]


class ClusterKernel(GraphCallable):
    """A kernel made of generated CUDA launches. ``layout`` turns the sizes into a
    :class:`Launches`. Launches go on torch's current stream."""

    def __init__(self, program, target: TargetSpec, layout: Callable[[dict], Launches],
                 description: str, origin: str = "cluster template",
                 preferred: Callable[[dict], bool] | None = None, keyed_scalars: tuple = (),
                 choice_scalars: tuple = ()):
        self.program, self.target, self.layout = program, target, layout
        self.description, self.origin = description, origin
        # scalars whose values pick the tuning record (``layout(dims, scalars)`` then)
        self.keyed_scalars = tuple(keyed_scalars)
        # scalars whose values decide whether ``tf.compile`` runs this kernel at all (its layout
        # refuses the values it should not run: ``fits``); they are among ``keyed_scalars``
        self.choice_scalars = tuple(choice_scalars)
        # where ``tf.compile`` should pick this kernel over its other templates (all sizes it runs)
        self.preferred = preferred or (lambda dims: True)
        self.outputs = list(program.outputs)
        self._launches: dict = {}
        self._calls = CallBinder(program, "cuda")
        self._device_checked = False

    def __repr__(self) -> str:
        return f"<ClusterKernel {self.program.name} for {self.target.name}: {self.description}>"

    def launches(self, scalars: dict | None = None, **dims) -> Launches:
        """The launches at these sizes (and, where tuning records are kept per value of some
        scalars, at the call's ``scalars``)."""
        key = tuple(sorted(dims.items()))
        if self.keyed_scalars:
            key += tuple((n, (scalars or {}).get(n)) for n in self.keyed_scalars)
        if key not in self._launches:
            check_named_sizes(self.program, dims, complete=True)
            self._launches[key] = (self.layout(dims, scalars) if self.keyed_scalars
                                   else self.layout(dims))
        return self._launches[key]

    def fits(self, scalars: dict | None = None, **dims) -> bool:
        """Whether this kernel runs these sizes (at these values of its keyed scalars) and is
        the one to prefer there (``tf.compile``'s choice; an explicit schedule runs it wherever
        it can)."""
        from ...errors import ScheduleError, TargetError

        try:
            self.launches(scalars, **dims)
        except (ScheduleError, TargetError):
            return False
        return self.preferred(dims)

    def source(self, **dims) -> str:
        """The generated CUDA C++ (of every module, in launch order); scalar values may be given
        by name among the sizes."""
        dims, scalars = split_scalars(self.program, dims)
        return "\n// ---- the next module ----\n".join(self.launches(scalars, **dims).sources)

    def ptx(self, **dims) -> str:
        """nvcc's PTX for the target (works without a GPU)."""
        dims, scalars = split_scalars(self.program, dims)
        return "\n".join(cuda_to_ptx(source, self.target)
                         for source in self.launches(scalars, **dims).sources)

    def schedule_origin(self, **dims) -> str:
        """Where the knobs at these sizes (and scalar values given by name among them) come
        from: the template defaults or a tuned record."""
        dims, scalars = split_scalars(self.program, dims)
        launches = self.launches(scalars, **dims)
        return f"{launches.origin or self.origin} ({launches.knobs})" + (
            f"; {launches.why}" if launches.why else "")

    def _prepare(self, args, kwargs, key=False):
        import torch

        if not self._device_checked:
            self.target.device()  # a clear error when there is no GPU
            self._device_checked = True
        bound = self._calls(args, kwargs, key)
        device = bound.torch_device or torch.device("cuda", torch.cuda.current_device())
        launches = self.launches(bound.scalars, **bound.dims)
        launches.build(self.target)
        values = torch_arguments(self.program, bound, device)
        given = list(bound.outs) if bound.outs is not None else [None] * len(self.outputs)
        outs = [torch_output(output_shape(c, bound.dims), c.dtypes[0], g, device)
                for c, g in zip(self.outputs, given)]
        out = outs[0] if len(outs) == 1 else tuple(outs)

        def run():
            with torch_stream(device):
                launches.run(launches.module, values, out, device)

        return run, outs, given, bound

    def invoke(self, key, args: tuple, kwargs: dict):
        """A call whose signature key the caller made (``False``: not made)."""
        run, outs, given, bound = self._prepare(args, kwargs, key)
        run()
        made = [deliver(o, g, bound.framework) for o, g in zip(outs, given)]
        return made[0] if len(made) == 1 else tuple(made)

    def benchmark(self, *args, repeat: int = 100, **kwargs) -> float:
        """Median milliseconds of a call's launches (triton.testing.do_bench)."""
        import triton

        run, _, _, _ = self._prepare(args, kwargs)
        return float(triton.testing.do_bench(run, rep=repeat, return_mode="median"))
