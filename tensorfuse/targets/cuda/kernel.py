"""Cluster kernels as callables: arguments checked like every tensorfuse kernel, torch or NumPy in
and out, one generated source and TVM CUDA module per set of sizes."""
from __future__ import annotations

import ctypes
from typing import Callable

from ...binding import CallBinder, check_named_sizes, output_shape, split_scalars
from ...interop import deliver, device_index, raw_stream, torch_arguments, torch_output
from ...torch_graph import GraphCallable
from .. import TargetSpec
from ..codegen import cuda_to_ptx
from ..signature_call import SignatureCall, call_layout, fast_call_applies, try_fast_call
from .module import KernelEntry, cuda_module


def pointer(x):
    """A tensor as a kernel argument: TVM's CUDA module takes raw device pointers for ``handle``
    arguments (a DLPack tensor there is the address of its descriptor, not of its data)."""
    return ctypes.c_void_p(x.data_ptr())


_CUDA = 2   # DLPack's device type of a CUDA GPU


def on_torch_stream(index: int, launch, *args) -> None:
    """``launch(*args)`` with TVM's current stream on CUDA device ``index`` set to torch's current
    one there (:func:`~tensorfuse.interop.raw_stream`), and set back after: what
    ``tvm_ffi.use_raw_stream`` does, without a context object and a device per call (and
    ``tvm_ffi.use_torch_stream``, which builds a ``torch.cuda.Stream`` per call, was a fifth of a
    Hopper attention call's Python under cProfile: ``tools/profile_call.py``). TVM keeps the stream
    per thread."""
    from tvm_ffi import core

    previous = core._env_set_current_stream(_CUDA, index, raw_stream(index))
    try:
        launch(*args)
    finally:
        core._env_set_current_stream(_CUDA, index, previous)


class Functions:
    """A built TVM module's kernels by name, each looked up once (``module[name]`` asks the
    runtime every time)."""

    def __init__(self, module):
        self.module = module
        self.found: dict = {}

    def __getitem__(self, name: str):
        function = self.found.get(name)
        if function is None:
            function = self.found[name] = self.module[name]
        return function


class Launches:
    """Generated source, its entry points, the plan and knobs it was written from, and
    ``run(module, values, out, device)`` which launches them (``out``: the output tensor, or the
    tuple of them for a program of several outputs); ``module`` is built on the first
    call. ``more``: further ``(source, entries)`` built as modules of their own (kernels whose
    sources cannot share one translation unit); ``run`` then gets the tuple of all modules.
    Launches with no ``entries`` (and no ``more``) launch through the driver themselves
    (:class:`~.module.DriverLaunch`): no TVM module is built and ``run`` gets ``()``.
    ``parts``: the :class:`~.parts.Part` s the source was assembled from (none: written whole).
    ``strided``: the tensors ``run`` reads through tensor maps of their own strides, taken as
    the caller gives them where TMA can read them (:func:`~tensorfuse.interop.tma_servable`);
    every other tensor reaches ``run`` contiguous."""

    def __init__(self, source: str, entries: list[KernelEntry], knobs, run, why: str = "",
                 plan=None, more: tuple = (), origin: str | None = None, parts: tuple = (),
                 strided: tuple[str, ...] = ()):
        self.source, self.entries, self.knobs, self.run = source, entries, knobs, run
        self.strided = tuple(strided)   # tensors ``run`` reads by their own strides
        self.parts = tuple(parts)
        self.why = why   # how a default was chosen, where that depends on the GPU
        self.origin = origin   # where the knobs come from, when not the template defaults
        self.plan = plan
        self.more = tuple(more)
        self.module = None

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.source,) + tuple(source for source, _ in self.more)

    def build(self, target: TargetSpec, built: dict | None = None) -> None:
        """The module(s), once. ``built``: modules already loaded, by source and entry points —
        launches at other sizes whose source is the same (the Hopper kernels take their sizes
        as arguments) share them instead of loading the cubin again (a new prompt length took
        6–12 ms of host time, most of it that load: ``benchmarks.dynamic``)."""
        if self.module is None and not self.entries and not self.more:
            self.module = ()
        if self.module is None:
            built = {} if built is None else built
            modules = []
            for source, entries in ((self.source, self.entries),) + self.more:
                key = (source, tuple(e.name for e in entries), target.name)
                if key not in built:
                    built[key] = Functions(cuda_module(source, entries, target))
                modules.append(built[key])
            self.module = tuple(modules) if self.more else modules[0]


class ClusterFastCall(SignatureCall):
    """A repeated call of a generated-CUDA kernel with one signature: the parameters read from
    their places among the arguments, new outputs, the launches' ``run`` on torch's current
    stream — none of the checked path's binding, conversions and lookups (``None`` where a call
    needs that path after all: :class:`~tensorfuse.targets.signature_call.SignatureCall`). The
    launches are the ones made for the signature (and the guarded scalars' values), built."""

    def __init__(self, params: list, outputs: list, launches: Launches, device,
                 likes: list | None = None, guards: list | None = None, strided=()):
        super().__init__(params, outputs, device, likes, guards, strided)
        self.run, self.module = launches.run, launches.module
        self.driver = launches.module == ()   # driver launches take torch's stream themselves
        self.index = device_index(device)

    def __call__(self, args: tuple, kwargs: dict):
        made = self.values_and_outputs(args, kwargs)
        if made is None:
            return None
        values, outs = made
        out = outs[0] if self.single else tuple(outs)
        values = dict(zip(self.names, values))
        if self.driver:
            self.run(self.module, values, out, self.device)
        else:
            on_torch_stream(self.index, self.run, self.module, values, out, self.device)
        return out


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
        self._fast: dict = {}   # signature key -> its ClusterFastCall
        self._modules: dict = {}   # the modules loaded, by source (Launches.build)
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
            # the sizes in one order, whatever order the caller gave them in: a source written
            # from them (its size macros) must be the same text for the same sizes — a tuning
            # worker binding a call's sizes wrote other sources than the job had built ahead,
            # and rebuilt every candidate (1.3 s each on the H200, `benchmarks.tuning`)
            dims = dict(sorted(dims.items()))
            self._launches[key] = (self.layout(dims, scalars) if self.keyed_scalars
                                   else self.layout(dims))
        return self._launches[key]

    def forget_built(self) -> None:
        """Drop the modules built so far and the fast calls holding them: the next call builds
        each launches' current ``source`` again (a benchmark timing another revision's source on
        the same launches — a fast call keeps the module it was made with)."""
        for launches in self._launches.values():
            launches.module = None
        self._fast.clear()
        self._modules.clear()

    def cache_info(self) -> list:
        """The sources written so far (:class:`~tensorfuse.targets.triton.size_builds.Build`),
        each with the sizes it served: the kernels read their sizes as arguments, so sizes whose
        plan decides the same share one source (and one loaded module)."""
        from ..triton.size_builds import Build

        found: dict = {}
        names = set(self.program.dim_names())   # a key's other entries: scalars it was made for
        for key, launches in self._launches.items():
            sizes = {n: v for n, v in key if n in names}
            if launches.sources not in found:
                found[launches.sources] = Build("\n".join(launches.sources), None, [],
                                                by=self.description.split(" (")[0])
            found[launches.sources].sizes.append(sizes)
        return list(found.values())

    def fits(self, scalars: dict | None = None, **dims) -> bool:
        """Whether this kernel runs these sizes (at these values of its keyed scalars) and is
        the one to prefer there (``tf.compile``'s choice; an explicit schedule runs it wherever
        it can)."""
        from ...errors import ScheduleError, TargetError

        if not self.preferred(dims):   # before the launches: no source, no record lookup
            return False
        try:
            self.launches(scalars, **dims)
        except (ScheduleError, TargetError):
            return False
        return True

    def source(self, **dims) -> str:
        """The generated CUDA C++ (of every module, in launch order); scalar values may be given
        by name among the sizes."""
        dims, scalars = split_scalars(self.program, dims)
        return "\n// ---- the next module ----\n".join(self.launches(scalars, **dims).sources)

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        """The template plan at these sizes and the knobs chosen for them (and why); scalar
        values given as ``scalars`` or by name among the sizes."""
        dims, named = split_scalars(self.program, dims)
        scalars = {**(named or {}), **(scalars or {})} or None
        made = self.launches(scalars, **dims)   # a map's scalars: its visiting order
        return f"{made.plan.describe()}\n  knobs: {made.knobs}" + (
            f" ({made.why})" if made.why else "")

    def parts(self, **dims) -> tuple:
        """The parts (:class:`~.parts.Part`) the source at these sizes is assembled from: role,
        name and the plan fields each reads; empty for a kernel written whole."""
        dims, scalars = split_scalars(self.program, dims)
        return self.launches(scalars, **dims).parts

    def assembly(self, **dims) -> str:
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
        launches.build(self.target, self._modules)
        values = torch_arguments(self.program, bound, device, launches.strided)
        given = list(bound.outs) if bound.outs is not None else [None] * len(self.outputs)
        outs = [torch_output(output_shape(c, bound.dims), c.dtypes[0], g, device)
                for c, g in zip(self.outputs, given)]
        out = outs[0] if len(outs) == 1 else tuple(outs)

        def run():
            on_torch_stream(device_index(device), launches.run, launches.module, values, out,
                            device)

        return run, outs, given, bound, launches

    def invoke(self, key, args: tuple, kwargs: dict):
        """A call whose signature key the caller made (``False``: not made). A signature seen
        before runs on its :class:`ClusterFastCall`; otherwise the arguments are bound (checked
        once per signature), the launches made, and a fast call kept for next time."""
        key, fast, done = try_fast_call(self._fast, key, args, kwargs)
        if done is not None:
            return done
        run, outs, given, bound, launches = self._prepare(args, kwargs, key)
        run()
        if key is not None and (fast is None or fast.stale) and \
                fast_call_applies(bound, self._calls.target_device):
            outputs = [(c.name, output_shape(c, bound.dims), c.dtypes[0]) for c in self.outputs]
            params, likes, guards = call_layout(self.program, args, bound,
                                                self._calls.scalar_kinds, outputs,
                                                self.keyed_scalars)
            self._fast[key] = ClusterFastCall(params, outputs, launches, bound.torch_device,
                                              likes, guards, launches.strided)
        made = [deliver(o, g, bound.framework) for o, g in zip(outs, given)]
        return made[0] if len(made) == 1 else tuple(made)

    def benchmark(self, *args, repeat: int = 100, **kwargs) -> float:
        """Median milliseconds of a call's launches (triton.testing.do_bench)."""
        import triton

        run = self._prepare(args, kwargs)[0]
        return float(triton.testing.do_bench(run, rep=repeat, return_mode="median"))
