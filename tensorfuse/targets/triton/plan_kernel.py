"""A Triton template's kernels for one plan as a callable: arguments checked like every
tensorfuse kernel, torch or NumPy in and out, one source per sizes (or sizes as arguments:
``dynamic=``), the call's scratch buffers made beside its arguments, launched on torch's
current stream. The scatter-add and scan templates are such kernels; each says what its
source, kernels, grids and scratch are."""
from __future__ import annotations

from ...binding import CallBinder, check_named_sizes, output_buffers, split_scalars
from ...dsl.symbolic_sizes import size_arguments
from ...interop import deliver, torch_arguments
from ...torch_graph import GraphCallable
from .launch import assembly_of, compile_for, interpreting, launch_device, load_kernel, signature
from .launcher import Launches, Step
from .size_builds import SizeBuilds, size_values, with_size_arguments
from .view_strides import call_views


class PlanKernel(GraphCallable):
    """The kernels of ``plan`` (with ``plan.program`` and ``plan.outputs``: (compute, expr)
    pairs) on ``target``. Subclasses give :attr:`scratch_names` (the call's arguments beside
    the program's: buffers, and the integers among them in :attr:`scalar_scratch`),
    :attr:`main_kernel` (the kernel every build launches), ``_knobs(dims)`` (what a build is
    keyed by beside its sizes: a dataclass), ``_kernels(dims)`` (the kernels a call at ``dims``
    launches, in order, by the last word of their names), ``_grids(dims)``, ``_meta(dims)``
    (the constexprs), ``_write(sizes, args)`` (the source, at sizes some of which may be
    symbolic) and ``_scratch(dims, device)`` (the values of the scratch arguments)."""

    scratch_names: tuple[str, ...] = ()
    scalar_scratch: tuple[str, ...] = ()
    suffix = "plan"         # the kernels' names: ``{program}_{suffix}_{kernel}``
    main_kernel = ""
    num_warps = 4

    def __init__(self, plan, target, dynamic: "bool | None" = None):
        self.plan, self.target = plan, target
        self.program = plan.program
        self.outputs = [c for c, _ in plan.outputs]
        self.args = [p.name for p in self.program.tensor_params] + \
            [p.name for p in self.program.scalar_params] + list(self.scratch_names) + \
            [f"out_{c.name}" for c in self.outputs]
        self._built: dict = {}
        self._calls = None
        self._device_checked = False
        # sizes seen at a second value become arguments (tf.compile's dynamic=)
        self.sizes = SizeBuilds(dynamic, {p.name for p in self.program.params})

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.program.name} for {self.target.name}>"

    @property
    def _name(self) -> str:
        return f"{self.program.name}_{self.suffix}"

    def build(self, views: tuple = (), **dims):
        """(source, its kernels in launch order, launches, argument names) at these sizes, made
        once; a source written with sizes as arguments serves every size within its
        guards (:mod:`.size_builds`); ``views``: the views a call passes
        (:func:`.view_strides.call_views`), read by their strides."""
        key = tuple(sorted(dims.items())) + views
        if key not in self._built:
            check_named_sizes(self.program, dims, complete=True)
            varying = self.sizes.varying(dims)
            knobs = self._knobs(dims)
            made = self.sizes.find(dims, knobs, (), varying, views) if varying else None
            if made is None:
                made = self.sizes.write(dims, knobs, (), varying, self._emit, views)
            self._built[key] = self._assembled(made, dims)
        return self._built[key]

    def _kernel_names(self, dims: dict) -> list[str]:
        return [f"{self._name}_{k}" for k in self._kernels(dims)]

    def _assembled(self, made, dims: dict) -> tuple:
        """:meth:`build`'s answer from the source ``made`` (a :class:`.size_builds.Build`)."""
        main = f"{self._name}_{self.main_kernel}"
        fns = [made.fn if n == main else load_kernel(made.source, n)
               for n in self._kernel_names(dims)]
        steps = [Step(fn, grid, made.args, self._pointers)
                 for fn, grid in zip(fns, self._grids(dims))]
        launches = Launches(steps, self._meta(dims), self._num_warps(dims), 1)
        return made.source, fns, launches, made.args

    @property
    def _pointers(self) -> set:
        """The arguments that are tensors."""
        return set(self.args) - {p.name for p in self.program.scalar_params} - \
            set(self.scalar_scratch)

    def _emit(self, sizes: dict) -> tuple:
        """(source, its main kernel, argument names) at ``sizes`` (ints, or some of them
        symbolic: read as arguments)."""
        args = self._arguments(sizes) + size_arguments(sizes)
        source = self._write(sizes, args)
        return source, load_kernel(source, f"{self._name}_{self.main_kernel}"), args

    def _arguments(self, sizes: dict) -> list[str]:
        """The kernels' arguments before the sizes."""
        return list(self.args)

    def source(self, **dims) -> str:
        dims, _ = split_scalars(self.program, dims)
        return self.build(**dims)[0]

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        return self.plan.describe()

    def cache_info(self) -> list:
        """The sources this kernel wrote and the sizes each serves (:class:`.size_builds.Build`)."""
        return list(self.sizes.builds)

    def _num_warps(self, dims: dict) -> int:
        """The warps of every kernel a call at ``dims`` launches."""
        return self.num_warps

    def _signature(self) -> dict:
        """Triton types of the arguments that are not the program's: f32 pointers, i32
        integers (a subclass may say otherwise)."""
        return {n: "i32" if n in self.scalar_scratch else "*fp32" for n in self.scratch_names}

    def compiled(self, which: str, **dims):
        """Compile one of the kernels (by the last word of its name) without a GPU (``.asm``:
        ptx/cubin or amdgcn)."""
        dims, _ = split_scalars(self.program, dims)
        _, fns, _, args = self.build(**dims)
        names = self._kernel_names(dims)
        if f"{self._name}_{which}" not in names:
            raise ValueError(f"{self!r} at these sizes has no {which!r} kernel: "
                             f"{', '.join(n.rsplit('_', 1)[1] for n in names)}")
        sig = {**signature(self.program, self.outputs, []), **self._signature()}
        sig, divisible = with_size_arguments({n: sig[n] for n in args if n in sig}, dims, args)
        return compile_for(fns[names.index(f"{self._name}_{which}")], sig, self._meta(dims),
                           self.target, self._num_warps(dims), 1, divisible)

    def assembly(self, which: str, **dims) -> str:
        return assembly_of(self.compiled(which, **dims), self.target)

    def _prepare(self, args, kwargs):
        if self._calls is None:
            self._calls = CallBinder(self.program, "cpu" if interpreting() else "cuda")
        bound = self._calls(args, kwargs, False)
        device = launch_device(self, bound)
        views = call_views(self.program, bound.arrays)
        launches = self.build(views, **bound.dims)[2]
        values = torch_arguments(self.program, bound, device, views=dict(views))
        values.update({n: v for n, v in size_values(bound.dims).items() if n not in values})
        values.update(self._scratch(bound.dims, device))
        outs, given = output_buffers(self.outputs, bound, device)
        values.update({f"out_{c.name}": o for c, o in zip(self.outputs, outs)})
        return launches, values, outs, given, bound

    def invoke(self, key, args: tuple, kwargs: dict):
        routed, out = self._route_call(key, args, kwargs)
        if routed:
            return out
        launches, values, outs, given, bound = self._prepare(args, kwargs)
        launches(values)
        made = [deliver(o, g, bound.framework) for o, g in zip(outs, given)]
        return made[0] if len(made) == 1 else tuple(made)

    def warm(self, *args, **kwargs) -> None:
        launches, values = self._prepare(args, kwargs)[:2]
        launches.warm(values)
