"""The contraction template's kernels as callables: arguments checked like every tensorfuse
kernel, torch or NumPy in and out, a Triton source per shape signature (sizes seen at a second
value become arguments: :mod:`.size_builds`), launched on torch's current stream."""
from __future__ import annotations

import math

from ...binding import CallBinder, check_named_sizes, output_buffers, split_scalars
from ...errors import ScheduleError, TargetError
from ...interop import deliver, torch_arguments, torch_dtype
from ..signature_call import try_fast_call
from ...torch_graph import GraphCallable
from .combine_slices import combine_slices
from .contraction import (PARTIALS, combine_name, contraction_source, grid_of, partial_floats,
                          split_arguments, stage_grid, stage_name)
from .launch import assembly_of, compile_for, interpreting, launch_device, load_kernel, signature
from .launcher import Launches, Step, output_specs, remember_fast_call
from .size_builds import SizeBuilds, size_values, with_size_arguments
from .view_strides import call_views

ORIGIN = "contraction template defaults"
MAX_GRID_Y = 65535   # CUDA's limit on a grid's second dimension (the batch indices)


class ContractionKernel(GraphCallable):
    """A :class:`~tensorfuse.schedule_templates.contraction_plan.ContractionPlan` as GEMM tiles:
    ``knobs_at(sizes)`` gives the knobs at a call's sizes and where a tuning record gave them
    (None: the defaults, with the ``given`` ones fixed), or a
    :class:`~tensorfuse.errors.TargetError` where none run there."""

    def __init__(self, plan, target, knobs_at, given: dict, dynamic: "bool | None" = None):
        self.plan, self.target, self.knobs_at = plan, target, knobs_at
        self.program = plan.program
        self.given = dict(given)
        self.description = f"contraction template (GEMM tiles: rows {plan.rows.name}, columns " \
                           f"{plan.cols.name}, contracted {plan.k_names})"
        self.outputs = list(self.program.outputs)
        self.sizes = SizeBuilds(dynamic, {p.name for p in self.program.params})
        self._built: dict = {}
        self._origin: dict = {}   # per sizes: the template defaults, or a tuned record
        self._launches: dict = {}
        self._calls = None
        self._device_checked = False
        self._fast: dict = {}   # signature key -> its FastCall

    def __repr__(self) -> str:
        return f"<ContractionKernel {self.program.name} for {self.target.name}: " \
               f"{self.description}>"

    def build(self, views: tuple = (), **dims) -> tuple:
        """(knobs, the build serving these sizes): written once per build, a new size inside a
        build's guards costs nothing here; ``views``: the views a call passes
        (:func:`.view_strides.call_views`), read by their strides."""
        key = tuple(sorted(dims.items())) + views
        if key not in self._built:
            check_named_sizes(self.program, dims, complete=True)
            dims = dict(sorted(dims.items()))
            knobs, origin = self.knobs_at(dims)
            tiles, batch = grid_of(self.plan, knobs, dims)
            if batch > MAX_GRID_Y:
                raise TargetError(f"{batch} batch indices: a CUDA grid's second dimension "
                                  f"holds {MAX_GRID_Y}")
            self._origin[tuple(sorted(dims.items()))] = origin or ORIGIN
            varying = self.sizes.varying(dims)
            made = self.sizes.find(dims, knobs, (), varying, views) if varying else None
            if made is None:
                made = self.sizes.write(dims, knobs, (), varying,
                                        lambda sizes: self._emit(knobs, sizes), views)
            self._built[key] = (knobs, made)
        return self._built[key]

    def _emit(self, knobs, sizes: dict) -> tuple:
        source, args = contraction_source(self.plan.for_knobs(knobs), knobs, self._name, sizes,
                                          interpreter=interpreting())
        return source, load_kernel(source, self._name), args

    @property
    def _name(self) -> str:
        return f"{self.program.name}_gemm_tiles"

    def fits(self, scalars: dict | None = None, **dims) -> bool:
        """Whether these sizes run here (``tf.compile``'s choice: the knobs fit the GPU)."""
        try:
            self.build(**dims)
        except (ScheduleError, TargetError):
            return False
        return True

    def source(self, **dims) -> str:
        dims, _ = split_scalars(self.program, dims)
        return self.build(**dims)[1].source

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        dims, _ = split_scalars(self.program, dims)
        knobs, made = self.build(**dims)
        return f"{self.plan.for_knobs(knobs).describe()}\n  knobs: {knobs}\n  built: " \
               f"{made.describe()}"

    def schedule_origin(self, **dims) -> str:
        dims, _ = split_scalars(self.program, dims)
        knobs = self.build(**dims)[0]
        given = f"; given: {', '.join(sorted(self.given))}" if self.given else ""
        return f"{self._origin[tuple(sorted(dims.items()))]} ({knobs}){given}"

    def warm(self, *args, **kwargs) -> None:
        """Compile for these arguments without launching (a tuning batch compiles its
        candidates so, on all the CPUs)."""
        launches, values = self._prepare(args, kwargs)[:2]
        launches.warm(values)

    def cache_info(self) -> list:
        return list(self.sizes.builds)

    def compiled(self, kernel: str = "", **dims):
        """Compile without a GPU; ``.asm`` holds ptx/cubin (CUDA) or amdgcn/hsaco (ROCm); the
        tiles' kernel, or ``kernel="combine"``: the kernel that adds a split's parts."""
        dims, _ = split_scalars(self.program, dims)
        knobs, made = self.build(**dims)
        fn = load_kernel(made.source, f"{self._name}_{kernel}") if kernel else made.fn
        sig = signature(self.plan.for_knobs(knobs).program, self.outputs, [])
        sig.update(dict.fromkeys(split_arguments(knobs), "*fp32"))   # before the sizes, as
        sig, divisible = with_size_arguments(sig, dims, made.args)   # the kernel takes them
        return compile_for(fn, sig, _meta(knobs), self.target, knobs.num_warps,
                           knobs.num_stages, divisible)

    def assembly(self, **dims) -> str:
        return assembly_of(self.compiled(**dims), self.target)

    def _launch_for(self, dims: dict, views: tuple = ()) -> tuple[Launches, list]:
        """The launches at these sizes (for these views), and the tensors its staged sides are
        stored in (name, shape, dtype), made once per sizes."""
        import torch

        key = tuple(sorted(dims.items())) + views
        if key not in self._launches:
            knobs, made = self.build(views, **dims)
            plan = self.plan.for_knobs(knobs)
            pointers = {p.name for p in plan.program.tensor_params} | {
                f"out_{c.name}" for c in self.outputs} | set(split_arguments(knobs))
            steps = [Step(load_kernel(made.source, stage_name(self._name, k)),
                          stage_grid(plan, staged, knobs, dims), made.args, pointers)
                     for k, staged in enumerate(plan.staged)]
            tiles, batch = grid_of(plan, knobs, dims)
            steps.append(Step(made.fn, (tiles * knobs.splits, batch), made.args, pointers))
            stored = [(s.param.name, [plan.extent(a, dims) for a in s.axes],
                       torch_dtype(s.param.dtype)) for s in plan.staged]
            if knobs.splits > 1:   # the parts' tiles, added by a second kernel (in row slices)
                slices = 1 if plan.over_columns else combine_slices(knobs, tiles, batch)
                steps.append(Step(load_kernel(made.source, combine_name(self._name)),
                                  (tiles * slices, batch), made.args, pointers))
                stored.append((PARTIALS, [partial_floats(plan, knobs, dims)], torch.float32))
            self._launches[key] = (Launches(steps, _meta(knobs), knobs.num_warps,
                                            knobs.num_stages), stored)
        return self._launches[key]

    def _prepare(self, args, kwargs):
        """(launches, argument values by name, output buffers, the caller's ``out=``, the bound
        call, the tensors stored between the launches, the views read in place)."""
        if self._calls is None:
            self._calls = CallBinder(self.program, "cpu" if interpreting() else "cuda")
        bound = self._calls(args, kwargs, False)
        device = launch_device(self, bound)
        import torch

        views = call_views(self.program, bound.arrays)
        launches, stored = self._launch_for(bound.dims, views)
        values = torch_arguments(self.program, bound, device, views=dict(views))
        values.update({n: v for n, v in size_values(bound.dims).items() if n not in values})
        values.update({name: torch.empty(shape, dtype=dtype, device=device)
                       for name, shape, dtype in stored})
        outs, given = output_buffers(self.outputs, bound, device)
        values.update({f"out_{c.name}": o for c, o in zip(self.outputs, outs)})
        return launches, values, outs, given, bound, stored, views

    def invoke(self, key, args: tuple, kwargs: dict):
        """A call (``key``: its signature key, ``False`` when not made yet): a signature seen
        before runs on its :class:`~.launcher.FastCall`; otherwise the checked path, which keeps
        one for next time where it applies."""
        key, fast, done = try_fast_call(self._fast, key, args, kwargs)
        if done is not None:
            return done
        launches, values, outs, given, bound, stored, views = self._prepare(args, kwargs)
        if all(launches.steps[-1].grid):   # an empty output launches nothing
            launches(values)
            if key is not None and (fast is None or fast.stale):
                self._remember_fast(key, args, bound, launches, stored, views)
        made = [deliver(o, g, bound.framework) for o, g in zip(outs, given)]
        return made[0] if len(made) == 1 else tuple(made)

    def _remember_fast(self, key, args: tuple, bound, launches, stored: list,
                       views: tuple) -> None:
        """Keep a fast call for this signature where one applies: torch tensors on the GPU in,
        new outputs out, kernels Triton lets us launch directly; the staged sides and a split's
        partial tiles in the fast call's scratch, one buffer allocated per call as the checked
        path allocates them. The checked path's host work per call had exceeded a 21 µs kernel:
        a Gaussian kernel's sum at 4096² points took 0.032 ms a call through ``tf.compile``
        against 0.021 launched alone, and takes 0.022 with this (``python -m
        benchmarks.contraction --pairs``); a router's weight gradient split in 8 parts took
        0.050–0.075 ms through the checked path (``benchmarks.unlisted_kernels``); a paged
        latent decode's p·v, its probabilities staged, 0.245 ms a call for 0.085 of GPU time
        (the H100; ``--only paged_latent_decode``)."""
        remember_fast_call(self._fast, key, self.program, args, bound, self._calls,
                           output_specs(self.outputs, bound.dims), launches,
                           scratch_layout(stored) if stored else None, views=views)

    def benchmark(self, *args, repeat: int = 100, **kwargs) -> float:
        import triton

        launches, values = self._prepare(args, kwargs)[:2]
        launches(values)
        return float(triton.testing.do_bench(lambda: launches(values), rep=repeat,
                                             return_mode="median"))


def _meta(knobs) -> dict:
    return dict(BLOCK_M=knobs.block_m, BLOCK_N=knobs.block_n, BLOCK_K=knobs.block_k)


def scratch_layout(stored: list) -> tuple[list, int]:
    """The tensors a call stores between its kernels (``(name, shape, torch dtype)``) as places
    in one float32 buffer: ``([(name, shape, offset in floats)], floats in all)``, each at a
    128-byte boundary (a fast call hands the kernels addresses inside it)."""
    places, offset = [], 0
    for name, shape, dtype in stored:
        places.append((name, shape, offset))
        offset += -(-math.prod(shape) * dtype.itemsize // 128) * 32
    return places, offset
