"""A fused chain compiled to Triton: callable like any compiled kernel (torch or NumPy in and out)."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from ...binding import CallBinder, check_named_sizes, split_scalars
from ...dsl import dtypes as dt
from ...interop import data_key, deliver, kept_copies, torch_arguments, torch_output
from ...torch_graph import GraphCallable
from .launch import assembly_of, compile_for, interpreting, launch_device, load_kernel, signature
from ..signature_call import try_fast_call
from .launcher import (Launches, PartCounters, Step, current_stream, output_specs,
                       remember_fast_call)
from .row_grid import MASK_ARGS, block_k, grid, launch_grid, merge_chunks, merged_apart
from .column_sums import finish_grid, partial_names, scratch_shapes
from .rowtile import kernel_source
from .size_builds import SizeBuilds, size_values, with_size_arguments
from .view_strides import call_views

# a lookup of tuning records (records.template_records): knobs, where from, and the sizes they
# were tuned at where those are not the call's (another size of its bucket)
Tuned = Callable[[dict], "tuple[dict, str, dict | None] | None"]


class TritonKernel(GraphCallable):
    """Calls the generated kernel; one plan and source per shape signature.

    The template hands it everything that is decided rather than written: ``planner`` makes the
    plan for a shape and the block schedule for a call (``schedule_templates.tile_plan``),
    ``knobs(plan)`` chooses tile sizes, warps and pipeline stages (the template's defaults), and
    ``tuned(dims)``, where the compile entry point gives one, returns the knobs of the best tuning
    record for these sizes and where it came from (:meth:`schedule_origin` says which was used).
    This class only emits, compiles and launches."""

    def __init__(self, planner, target, knobs: Callable, description: str, fusion=None,
                 tuned: Tuned | None = None, tiling: "dict | bool" = True,
                 dynamic: "bool | None" = False, refuse: Callable | None = None,
                 given: dict | None = None):
        self.planner, self.target = planner, target
        # knobs given when the template was applied (the rest its defaults): what
        # schedule_origin() says of them
        self.given = {n: v for n, v in (given or {}).items() if v is not None}
        self.tiling = tiling   # the visiting order: True chooses, False keeps the flat one
        self.program, self.chain = planner.program, planner.chain
        self.fusion = fusion
        self.knobs = knobs
        self.tuned = tuned
        # (plan, default knobs) -> why the template's defaults should not run those sizes (a
        # TargetError: tf.compile's floor takes them), or None
        self.refuse = refuse
        self._origin: dict = {}
        self.description = description
        self._built: dict = {}
        self._serving: dict = {}   # build key -> the Build that serves those sizes
        self._masks: dict = {}
        self._masks_held: tuple = ()   # the tensors the kept lists were made from
        self._launch_plans: dict = {}
        self._fast: dict = {}
        self._calls: CallBinder | None = None
        self._int_scalar = {p.name: dt.is_int(p.dtype) for p in self.program.scalar_params}
        self._device_checked = False
        self.sizes = SizeBuilds(dynamic, {p.name for p in self.program.params})

    def __repr__(self) -> str:
        return f"<TritonKernel {self.program.name} for {self.target.name}: {self.description}>"

    # -- building --------------------------------------------------------------------------------
    def build(self, scalars: dict | None = None, views: tuple = (), **dims):
        """(plan, knobs, source, kernel function, argument names) for these sizes; ``scalars``:
        the call's scalar values, where tuning records are kept per value of some of them (a
        window, a prefix length: ``tuned.scalar_names``) and so the knobs may differ; ``views``:
        the views the call passes (:func:`.view_strides.call_views`), read by their strides.
        The plan is made at these sizes (the launch's grid and outputs); the source may be one
        written with sizes as arguments that serves them (:mod:`.size_builds`)."""
        origin = self._build_key(dims, scalars)   # where the knobs come from: the same for views
        key = origin + views
        if key not in self._built:
            check_named_sizes(self.program, dims, complete=True)
            untiled = self.planner.plan(dims)
            knobs = self.knobs(untiled)
            self._origin[origin] = "template defaults" if not self.given else (
                "the knobs given (" + ", ".join(f"{n}={v}" for n, v in self.given.items()) +
                "), the rest template defaults")
            found = self.tuned(dims, scalars) if self.tuned is not None else None
            if found is not None:   # a record without row tiles (tuned before they were a knob)
                # ran one tile a program, whatever today's default for these sizes
                defaults, knobs = knobs, replace(knobs, **{"row_tiles": 1, **found[0]})
                self._origin[origin] = f"tuned record ({found[1]})"
            refused = self.refuse(untiled, knobs) if found is None and self.refuse else None
            if refused:
                from ...errors import TargetError

                raise TargetError(refused)
            plan = self.planner.tile(untiled, knobs, scalars, self.tiling)
            why = self._not_running(plan, knobs) if found is not None and found[2] else None
            if why:   # a record of other sizes of the bucket whose knobs cannot run these
                self._origin[origin] = ("template defaults (the record of the nearest tuned "
                                        f"sizes does not fit these: {why})")
                knobs = defaults
                plan = self.planner.tile(untiled, knobs, scalars, self.tiling)
            keyed = origin[len(dims):]
            varying = self.sizes.varying(dims)
            made = self.sizes.find(dims, knobs, keyed, varying, views) if varying else None
            if made is None:
                made = self.sizes.write(dims, knobs, keyed, varying, lambda sizes: self._emit(
                    plan if sizes is dims else self.planner.tile(
                        self.planner.plan(sizes), knobs, scalars, self.tiling), knobs), views)
            self._built[key] = (plan, knobs, made.source, made.fn, made.args)
            self._serving[key] = made
        return self._built[key]

    @staticmethod
    def _not_running(plan, knobs) -> str | None:
        """Why ``knobs`` cannot be launched at ``plan``'s sizes (a grid CUDA refuses), or None."""
        from ...errors import TargetError

        try:
            launch_grid(plan, knobs, *((knobs.splits,) if knobs.splits > 1 else ()))
        except TargetError as exc:
            return str(exc)
        return None

    def _emit(self, plan, knobs) -> tuple:
        """(source, kernel function, argument names) of ``plan`` (made at sizes that are ints, or
        some of them symbolic: :mod:`tensorfuse.dsl.symbolic_sizes`)."""
        source, args = kernel_source(plan, knobs, self._name, interpreter=interpreting(),
                                     nvidia=self.target.kind == "cuda")
        return source, load_kernel(source, self._name), args

    @property
    def _name(self) -> str:
        """The generated kernel's name (the second kernel of a plan with sums down the rows:
        this with ``_sums``; of one whose split parts are merged apart: with ``_merge``)."""
        return f"{self.program.name}_fused"

    def cache_info(self) -> list:
        """The sources this kernel wrote (:class:`.size_builds.Build`: the sizes each serves,
        exactly or as arguments under its guards)."""
        return list(self.sizes.builds)

    def _build_key(self, dims: dict, scalars: dict | None) -> tuple:
        key = tuple(sorted(dims.items()))
        names = self._keyed_scalars()
        return key + tuple((n, (scalars or {}).get(n)) for n in names) if names else key

    def _keyed_scalars(self) -> tuple[str, ...]:
        """Scalars whose values the kernel is built for: those tuning records are kept per (a
        window) and those the visiting order of a map-shaped mask depends on (a width)."""
        return tuple(dict.fromkeys(getattr(self.tuned, "scalar_names", ())
                                   + self.planner.layout_scalars))

    def schedule_origin(self, **dims) -> str:
        """Where the knobs at these sizes (and scalar values, given by name among them: a
        window, a prefix length) come from: the template defaults or a tuned record."""
        dims, scalars = split_scalars(self.program, dims)
        self.build(scalars, **dims)
        return self._origin[self._build_key(dims, scalars)]

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        """The row-tile plan at these sizes, where its knobs come from and the build that serves
        them (exactly, or with sizes as arguments under its guards)."""
        plan, knobs = self.build(scalars, **dims)[:2]
        served = self._serving[self._build_key(dims, scalars)]
        merged = (f"\n  parts merged by a second kernel: {merge_chunks(plan)} programs a row "
                  "tile, one per feature chunk") if merged_apart(plan, knobs) else ""
        return (f"{plan.describe(knobs)}{merged}\n"
                f"  knobs from: {self.schedule_origin(**dims, **(scalars or {}))}\n"
                f"  built: {served.describe()}")

    def source(self, **dims) -> str:
        """The generated Triton source (scalars a kernel is built per given by name among the
        sizes, as for :meth:`compiled`)."""
        dims, scalars = split_scalars(self.program, dims)
        return self.build(scalars, **dims)[2]

    def compiled(self, views: tuple = (), **dims):
        """Compile without a GPU; ``.asm`` holds ptx/cubin (CUDA) or amdgcn/hsaco (ROCm). Scalars
        a kernel is built per (a map's width) may be given by name among the sizes; ``views``:
        the kernel for calls passing these views (:func:`.view_strides.call_views`)."""
        dims, scalars = split_scalars(self.program, dims)
        plan, knobs, _, fn, names = self.build(scalars, views, **dims)
        outs = [c for c, _, _ in plan.outputs]
        mask_args = list(MASK_ARGS) if plan.block_listed else []
        sig, divisible = with_size_arguments(signature(self.program, outs, mask_args), dims,
                                             names)
        if knobs.splits > 1 or plan.column_sums:   # the parts' states and the sums' partial
            # rows in f32, the parts' arrival counters in i32
            sig = {n: sig.get(n, "*i32" if n == "part_count" else "*fp32") for n in names}
        constexprs = {"BLOCK_M": knobs.block_m, "BLOCK_N": knobs.block_n, "BLOCK_K": block_k(plan)}
        return compile_for(fn, sig, constexprs, self.target, knobs.num_warps, knobs.num_stages,
                           divisible)

    def assembly(self, **dims) -> str:
        return assembly_of(self.compiled(**dims), self.target)

    # -- calling ---------------------------------------------------------------------------------
    def _binder(self) -> CallBinder:
        if self._calls is None:
            self._calls = CallBinder(self.program, "cpu" if interpreting() else "cuda")
        return self._calls

    def _launches(self, bound) -> tuple:
        """(plan, Launches, scratch layout, knobs, outputs, counters, views) for a bound call's
        signature and views, made once: the kernels, grids and argument names of each launch,
        the constexprs, where the split update's parts leave their states (offsets into one f32
        buffer per call), each output's argument name, shape and dtype, the parts' arrival
        counters where the last part merges, and the views it reads in place
        (:func:`.view_strides.call_views`)."""
        ints = tuple((v == 1, v % 16 == 0) for n, v in bound.scalars.items()
                     if self._int_scalar.get(n))
        views = call_views(self.program, bound.arrays)
        key = bound.signature + ints + views
        keyed = self._keyed_scalars()
        if keyed:   # records kept per value of these: the knobs or the tiling may differ
            key += tuple(bound.scalars[n] for n in keyed)
        made = self._launch_plans.get(key)
        if made is None:
            plan, knobs, source, fn, names = self.build(bound.scalars, views, **bound.dims)
            meta = dict(BLOCK_M=knobs.block_m, BLOCK_N=knobs.block_n, BLOCK_K=block_k(plan))
            pointers = {p.name for p in self.program.tensor_params} | {
                f"out_{c.name}" for c, _, _ in plan.outputs} | set(MASK_ARGS)
            split = knobs.splits > 1   # the parts on the grid's third axis, the last merging
            apart = merged_apart(plan, knobs)   # ... or a kernel of its own, a chunk a program
            counted = split and not apart
            pointers |= set(partial_names(plan))
            steps = [Step(fn, launch_grid(plan, knobs, *((knobs.splits,) if split else ())),
                          names, pointers | ({"part_count"} if counted else set()))]
            if apart:
                steps.append(Step(load_kernel(source, f"{self._name}_merge"),
                                  launch_grid(plan, knobs, merge_chunks(plan)), names, pointers))
            if plan.column_sums:   # the kernel that adds the sums' partial rows up
                steps.append(Step(load_kernel(source, f"{self._name}_sums"), finish_grid(plan),
                                  names, pointers))
            outputs = output_specs([c for c, _, _ in plan.outputs], bound.dims)
            counters = PartCounters(math.prod(grid(plan, knobs))) if counted else None
            made = (plan, Launches(steps, meta, knobs.num_warps, knobs.num_stages),
                    self._scratch_layout(plan, knobs) if split or plan.column_sums else None,
                    knobs, outputs, counters, views)
            self._launch_plans[key] = made
        return made

    def _scratch_layout(self, plan, knobs) -> tuple[list, int]:
        """Where each split part leaves its states and references for the merge, and each sum
        down the rows its partial rows: (name, shape, offset) in one f32 buffer, each at a
        128-byte boundary, and the buffer's length."""
        rows, batch = grid(plan, knobs)
        rows_pad = rows * knobs.block_m
        shapes = scratch_shapes(plan, knobs)   # the sums' partial rows, where it has sums
        if knobs.splits > 1:
            shapes += [(f"part_{sp.member.name}_{sp.k}",
                        (batch, knobs.splits, rows_pad, block_k(plan) *
                         plan.feature_chunks(plan.state_feature(sp))
                         if sp.contraction is not None else 1)) for sp in plan.states]
            shapes += [(f"part_ref_{d}", (batch, knobs.splits, rows_pad, 1))
                       for d in sorted({d for s in plan.chain.schemes.values() for d in s.deps})]
        layout, offset = [], 0
        for name, shape in shapes:
            layout.append((name, shape, offset))
            offset += -(-math.prod(shape) // 32) * 32
        return layout, offset

    @staticmethod
    def _scratch(layout, device, as_tensors: bool) -> tuple[object, dict]:
        """One buffer for the split parts' states (the first call hands Triton's JIT views of
        it; later calls its addresses) and the buffer, to keep alive across the launch."""
        import torch

        places, total = layout
        flat = torch.empty(total, dtype=torch.float32, device=device)
        if as_tensors:
            return flat, {n: flat[o:o + math.prod(shape)].view(shape) for n, shape, o in places}
        base = flat.data_ptr()
        return flat, {n: base + 4 * o for n, _, o in places}

    def _prepare(self, args, kwargs, key=False):
        """Everything a launch needs: the launches, the argument values by name, the output
        buffers and what the caller gave for them, and the bound call (``key``: the call's
        signature key, when the caller made it already)."""
        bound = self._binder()(args, kwargs, key)
        device = launch_device(self, bound)
        plan, launches, scratch, knobs, outputs, counters, views = self._launches(bound)
        values = torch_arguments(self.program, bound, device, views=dict(views))
        # read by a kernel written with sizes as arguments (a parameter of the same name wins:
        # that size is never an argument, SizeBuilds)
        values.update({n: v for n, v in size_values(bound.dims).items() if n not in values})
        outs, results = [], []
        for k, (name, shape, dtype) in enumerate(outputs):
            given = bound.outs[k] if bound.outs is not None else None
            buf = torch_output(shape, dtype, given, device)
            values[name] = buf
            outs.append(buf)
            results.append(given)
        keep = None
        if scratch is not None:
            keep, places = self._scratch(scratch, device, launches.steps[0].compiled is None
                                         or interpreting())
            values.update(places)
            if counters is not None:
                values["part_count"] = counters.on(device, current_stream(device))
        elif plan.block_listed:
            values.update(self._block_lists(plan, knobs, values, bound, device))
        return launches, values, outs, results, bound, keep

    def _block_lists(self, plan, knobs, values, bound, device) -> dict:
        int_tensors = {p.name: values[p.name] for p in self.program.tensor_params
                       if not dt.is_float(p.dtype)}
        key = (tuple(sorted(bound.dims.items())), tuple(sorted(bound.scalars.items())),
               tuple(int_tensors), data_key(int_tensors.values()))
        if key not in self._masks:
            lists = self.planner.block_lists(plan, knobs, bound.dims, int_tensors, bound.scalars,
                                             device)
            kept = kept_copies(lists)
            if kept is None:
                return dict(zip(MASK_ARGS, lists))
            # held with the lists: their memory cannot go to a new mask meanwhile (data_key)
            self._masks = {key: dict(zip(MASK_ARGS, kept))}
            self._masks_held = tuple(int_tensors.values())
        return self._masks[key]

    def invoke(self, key, args: tuple, kwargs: dict):
        """A call whose signature key the caller made (``False``: not made). A signature seen
        before runs on its :class:`~.launcher.FastCall`; otherwise the arguments are bound
        (checked once per signature), the launches made, and a fast call kept for next time."""
        key, fast, done = try_fast_call(self._fast, key, args, kwargs)
        if done is not None:
            return done
        launches, values, outs, results, bound, _keep = self._prepare(args, kwargs, key)
        launches(values)
        if key is not None and (fast is None or fast.stale):
            self._remember_fast(key, args, kwargs, bound, launches)
        if len(outs) == 1 and results[0] is None and bound.framework == "torch":
            return outs[0]
        final = [deliver(buf, given, bound.framework) for buf, given in zip(outs, results)]
        return final[0] if len(final) == 1 else tuple(final)

    def _remember_fast(self, key, args, kwargs, bound, launches) -> None:
        """Keep a fast call for this signature where one applies: torch tensors on the GPU in,
        new outputs out, compiled kernels Triton lets us launch directly, no per-call block
        lists."""
        plan, _, scratch, _, outputs, counters, views = self._launches(bound)
        if plan.block_listed and scratch is None:   # block lists made per call
            return
        # the scalars tuning records are kept per (a window) are guarded: another value may have
        # other knobs, so it takes the checked path
        remember_fast_call(self._fast, key, self.program, args, bound, self._calls, outputs,
                           launches, scratch, counters, self._keyed_scalars(), views)

    def warm(self, *args, **kwargs) -> None:
        """Compile for these arguments without launching (a tuning batch compiles its
        candidates this way under ``compile_pool.compiled_ahead``, on all the CPUs)."""
        launches, values, _, _, _, _keep = self._prepare(args, kwargs)
        launches.warm(values)

    def benchmark(self, *args, repeat: int = 100, **kwargs) -> float:
        """Median milliseconds of a launch (triton.testing.do_bench: events, warm-up, L2 flush)."""
        import triton

        launches, values, _, _, _, _keep = self._prepare(args, kwargs)
        launches(values)   # the first launch of a signature compiles it
        return float(triton.testing.do_bench(lambda: launches(values), rep=repeat,
                                             return_mode="median"))
