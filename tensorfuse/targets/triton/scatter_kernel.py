"""The scatter-add template's kernels as a callable (``schedule_templates.scatter``): arguments
checked like every tensorfuse kernel, torch or NumPy in and out, one source per sizes, an f32
accumulator zeroed per call, launched on torch's current stream."""
from __future__ import annotations

from dataclasses import dataclass

from ...binding import CallBinder, check_named_sizes, output_buffers, split_scalars
from ...interop import deliver, torch_arguments
from ...torch_graph import GraphCallable
from ...dsl.symbolic_sizes import size_arguments
from .launch import compile_for, interpreting, launch_device, load_kernel, signature
from .launcher import Launches, Step
from .scatter import BLOCK, compacts, extent, grids, scatter_source, scratch_shapes, slots
from .size_builds import SizeBuilds, size_values, with_size_arguments

ORIGIN = "scatter-add template (atomic adds into an f32 accumulator)"


@dataclass(frozen=True)
class ScatterKnobs:
    """The template's one setting (what a build is keyed by beside its sizes)."""

    block: int = BLOCK


class ScatterKernel(GraphCallable):
    """A :class:`~tensorfuse.schedule_templates.scatter.ScatterPlan` run as two Triton kernels:
    the terms added into the accumulator, then the outputs written from it."""

    def __init__(self, plan, target, dynamic: "bool | None" = None):
        self.plan, self.target = plan, target
        self.program = plan.program
        self.outputs = [c for c, _ in plan.outputs]
        self.description = ORIGIN
        self.args = [p.name for p in self.program.tensor_params] + \
            [p.name for p in self.program.scalar_params] + ["acc"] + \
            [f"out_{c.name}" for c in self.outputs]
        self._built: dict = {}
        self._scratch_shapes: dict = {}
        self._calls = None
        self._device_checked = False
        # sizes seen at a second value become arguments (tf.compile's dynamic=)
        self.sizes = SizeBuilds(dynamic, {p.name for p in self.program.params})

    def __repr__(self) -> str:
        return f"<ScatterKernel {self.program.name} for {self.target.name}>"

    @property
    def _name(self) -> str:
        return f"{self.program.name}_scatter"

    def build(self, **dims):
        """(source, its kernels in launch order, launches, argument names) at these sizes, made
        once; a source written with sizes as arguments serves every size within its
        guards (:mod:`.size_builds`)."""
        key = tuple(sorted(dims.items()))
        if key not in self._built:
            check_named_sizes(self.program, dims, complete=True)
            varying = self.sizes.varying(dims)
            made = self.sizes.find(dims, ScatterKnobs(), (), varying) if varying else None
            if made is None:
                made = self.sizes.write(dims, ScatterKnobs(), (), varying, self._emit)
            self._built[key] = self._assembled(made, dims)
        return self._built[key]

    def _kernel_names(self, dims: dict) -> list[str]:
        """The kernels a build at ``dims`` has, in launch order."""
        return [f"{self._name}_{k}" for k in
                (("claims",) if compacts(self.plan, dims) else ()) + ("terms", "outputs")]

    def _assembled(self, made, dims: dict) -> tuple:
        """:meth:`build`'s answer from the source ``made`` (a :class:`.size_builds.Build`)."""
        fns = [made.fn if n.endswith("_terms") else load_kernel(made.source, n)
               for n in self._kernel_names(dims)]
        steps = [Step(fn, grid, made.args, self._pointers)
                 for fn, grid in zip(fns, grids(self.plan, dims))]
        launches = Launches(steps, dict(BLOCK_M=BLOCK, BLOCK_N=1, BLOCK_K=1), 4, 1)
        return made.source, fns, launches, made.args

    @property
    def _pointers(self) -> set:
        """The arguments that are tensors."""
        return (set(self.args) | {"owner"}) - {p.name for p in self.program.scalar_params}

    def _emit(self, sizes: dict) -> tuple:
        """(source, the terms kernel, argument names) at ``sizes`` (ints, or some of them
        symbolic: read as arguments)."""
        args = self.args + (["owner"] if compacts(self.plan, sizes) else []) + \
            size_arguments(sizes)
        source = scatter_source(self.plan, self._name, sizes, args)
        return source, load_kernel(source, f"{self._name}_terms"), args

    def source(self, **dims) -> str:
        dims, _ = split_scalars(self.program, dims)
        return self.build(**dims)[0]

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        return self.plan.describe()

    def schedule_origin(self, **dims) -> str:
        """The template; at given sizes also whether its sums go through slots."""
        dims, _ = split_scalars(self.program, dims)
        if not dims or not compacts(self.plan, dims):
            return self.description
        return (f"{self.description}; slots for the {slots(self.plan, dims)} positions "
                f"{self.plan.index} takes, of {self.plan.axis.name}'s "
                f"{extent(self.plan.axis, dims)} elements")

    def cache_info(self) -> list:
        """The sources this kernel wrote and the sizes each serves (:class:`.size_builds.Build`)."""
        return list(self.sizes.builds)

    def compiled(self, which: str = "terms", **dims):
        """Compile one of the kernels (``claims``, ``terms``, ``outputs``) without a GPU
        (``.asm``: ptx/cubin or amdgcn)."""
        dims, _ = split_scalars(self.program, dims)
        _, fns, _, args = self.build(**dims)
        names = self._kernel_names(dims)
        if f"{self._name}_{which}" not in names:
            raise ValueError(f"{self!r} at these sizes has no {which!r} kernel: "
                             f"{', '.join(n.rsplit('_', 1)[1] for n in names)}")
        sig = signature(self.program, self.outputs, [])
        sig = {n: sig.get(n, "*i32" if n == "owner" else "*fp32")
               for n in self.args + ["owner"]}
        sig, divisible = with_size_arguments({n: sig[n] for n in args if n in sig}, dims, args)
        return compile_for(fns[names.index(f"{self._name}_{which}")], sig,
                           dict(BLOCK_M=BLOCK, BLOCK_N=1, BLOCK_K=1), self.target, 4, 1,
                           divisible)

    def ptx(self, which: str = "terms", **dims) -> str:
        return self.compiled(which, **dims).asm["ptx"]

    def _prepare(self, args, kwargs):
        if self._calls is None:
            self._calls = CallBinder(self.program, "cpu" if interpreting() else "cuda")
        bound = self._calls(args, kwargs, False)
        device = launch_device(self, bound)
        launches = self.build(**bound.dims)[2]
        values = torch_arguments(self.program, bound, device)
        values.update({n: v for n, v in size_values(bound.dims).items() if n not in values})
        values.update(self._scratch(bound.dims, device))
        outs, given = output_buffers(self.outputs, bound, device)
        values.update({f"out_{c.name}": o for c, o in zip(self.outputs, outs)})
        return launches, values, outs, given, bound

    def _scratch(self, dims: dict, device) -> dict:
        """The call's buffers beside its arguments and outputs (``scatter.scratch_shapes``)."""
        import torch

        key = tuple(sorted(dims.items()))
        if key not in self._scratch_shapes:   # decided once per sizes, not on every call
            self._scratch_shapes[key] = scratch_shapes(self.plan, dims)
        shapes = self._scratch_shapes[key]
        made = {"acc": torch.zeros(shapes["acc"], dtype=torch.float32, device=device)}
        if "owner" in shapes:   # no slot claimed: the slots' count, the accumulator's rows
            made["owner"] = torch.full(shapes["owner"], shapes["acc"][0], dtype=torch.int32,
                                       device=device)
        return made

    def invoke(self, key, args: tuple, kwargs: dict):
        launches, values, outs, given, bound = self._prepare(args, kwargs)
        launches(values)
        made = [deliver(o, g, bound.framework) for o, g in zip(outs, given)]
        return made[0] if len(made) == 1 else tuple(made)

    def warm(self, *args, **kwargs) -> None:
        launches, values = self._prepare(args, kwargs)[:2]
        launches.warm(values)
