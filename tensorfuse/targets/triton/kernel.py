"""A fused chain compiled to Triton: callable like any compiled kernel (torch or NumPy in and out)."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ...binding import bind_call, check_named_sizes, output_shape
from ...dsl import dtypes as dt
from ...interop import deliver, torch_arguments, torch_output
from .launch import compile_for, interpreting, load_kernel, signature
from .rowtile import block_k, grid, kernel_source

Tuned = Callable[[dict], "tuple[dict, str] | None"]


class TritonKernel:
    """Calls the generated kernel; one plan and source per shape signature.

    The template hands it everything that is decided rather than written: ``planner`` makes the
    plan for a shape and the block schedule for a call (``schedule_templates.tile_plan``),
    ``knobs(plan)`` chooses tile sizes, warps and pipeline stages (the template's defaults), and
    ``tuned(dims)``, where the compile entry point gives one, returns the knobs of the best tuning
    record for these sizes and where it came from (:meth:`schedule_origin` says which was used).
    This class only emits, compiles and launches."""

    def __init__(self, planner, target, knobs: Callable, description: str, fusion=None,
                 tuned: Tuned | None = None):
        self.planner, self.target = planner, target
        self.program, self.chain = planner.program, planner.chain
        self.fusion = fusion
        self.knobs = knobs
        self.tuned = tuned
        self._origin: dict = {}
        self.description = description
        self._built: dict = {}
        self._masks: dict = {}
        self._device_checked = False

    def __repr__(self) -> str:
        return f"<TritonKernel {self.program.name} for {self.target.name}: {self.description}>"

    # -- building --------------------------------------------------------------------------------
    def build(self, **dims):
        """(plan, knobs, source, kernel function, argument names) for these sizes."""
        key = tuple(sorted(dims.items()))
        if key not in self._built:
            check_named_sizes(self.program, dims, complete=True)
            plan = self.planner.plan(dims)
            knobs = self.knobs(plan)
            self._origin[key] = "template defaults"
            found = self.tuned(dims) if self.tuned is not None else None
            if found is not None:
                knobs = replace(knobs, **found[0])
                self._origin[key] = f"tuned record ({found[1]})"
            name = f"{self.program.name}_fused"
            made = kernel_source(plan, knobs, name, interpreter=interpreting())
            if knobs.splits > 1:  # a kernel per split part, then a merge kernel
                source, args, merge_args = made
                fns = (load_kernel(source, f"{name}_part"), load_kernel(source, f"{name}_merge"))
                self._built[key] = (plan, knobs, source, fns, (args, merge_args))
            else:
                source, args = made
                self._built[key] = (plan, knobs, source, load_kernel(source, name), args)
        return self._built[key]

    def schedule_origin(self, **dims) -> str:
        """Where the knobs at these sizes come from: the template defaults or a tuned record."""
        self.build(**dims)
        return self._origin[tuple(sorted(dims.items()))]

    def source(self, **dims) -> str:
        """The generated Triton source."""
        return self.build(**dims)[2]

    def compiled(self, **dims):
        """Compile without a GPU; ``.asm`` holds ptx/cubin (CUDA) or amdgcn/hsaco (ROCm). With
        splits, the part kernel (the one that sweeps the axis)."""
        plan, knobs, _, fn, names = self.build(**dims)
        outs = [c for c, _, _ in plan.outputs]
        mask_args = ["bm_partial_num", "bm_partial_idx", "bm_full_num", "bm_full_idx"] \
            if plan.mask is not None else []
        sig = signature(self.program, outs, mask_args)
        if knobs.splits > 1:
            fn = fn[0]
            sig = {n: sig.get(n, "*fp32") for n in names[0]}
        constexprs = {"BLOCK_M": knobs.block_m, "BLOCK_N": knobs.block_n, "BLOCK_K": block_k(plan)}
        return compile_for(fn, sig, constexprs, self.target, knobs.num_warps, knobs.num_stages)

    def ptx(self, **dims) -> str:
        return self.compiled(**dims).asm["ptx"]

    # -- calling ---------------------------------------------------------------------------------
    def _launch_args(self, args, kwargs):
        import torch

        if interpreting():
            bound = bind_call(self.program, args, kwargs, "cpu")
            device = torch.device("cpu")
        else:
            if not self._device_checked:
                self.target.device()  # a clear error when the GPU is missing
                self._device_checked = True
            bound = bind_call(self.program, args, kwargs, "cuda")
            device = bound.torch_device or torch.device("cuda", torch.cuda.current_device())
        plan, knobs, _, fn, names = self.build(**bound.dims)
        values = torch_arguments(self.program, bound, device)
        outs, results = [], []
        for k, (c, _, _) in enumerate(plan.outputs):
            given = bound.outs[k] if bound.outs is not None else None
            buf = torch_output(output_shape(c, bound.dims), c.dtypes[0], given, device)
            values[f"out_{c.name}"] = buf
            outs.append(buf)
            results.append(given)
        meta = dict(BLOCK_M=knobs.block_m, BLOCK_N=knobs.block_n, BLOCK_K=block_k(plan),
                    num_warps=knobs.num_warps, num_stages=knobs.num_stages)
        if knobs.splits > 1:
            values.update(self._split_buffers(plan, knobs, device))
            part_fn, merge_fn = fn
            part_args, merge_args = names
            rows, batch = grid(plan, knobs)
            part = part_fn[(rows, batch, knobs.splits)]
            merge = merge_fn[(rows, batch)]
            first, second = [values[n] for n in part_args], [values[n] for n in merge_args]

            def launch(*_, **kw):
                part(*first, **kw)
                merge(*second, **kw)

            return launch, [], meta, outs, results, bound
        if plan.mask is not None:
            values.update(self._block_lists(plan, knobs, values, bound, device))
        launch = fn[grid(plan, knobs)]
        call = [values[n] for n in names]
        return launch, call, meta, outs, results, bound

    def _split_buffers(self, plan, knobs, device) -> dict:
        """Where each part leaves its states and references for the merge (f32)."""
        import torch

        rows, batch = grid(plan, knobs)
        rows_pad = rows * knobs.block_m
        buffers = {}
        for sp in plan.states:
            width = block_k(plan) if sp.contraction is not None else 1
            buffers[f"part_{sp.member.name}_{sp.k}"] = torch.empty(
                (batch, knobs.splits, rows_pad, width), dtype=torch.float32, device=device)
        for d in {d for s in plan.chain.schemes.values() for d in s.deps}:
            buffers[f"part_ref_{d}"] = torch.empty((batch, knobs.splits, rows_pad, 1),
                                                   dtype=torch.float32, device=device)
        return buffers

    def _block_lists(self, plan, knobs, values, bound, device) -> dict:
        int_tensors = {p.name: values[p.name] for p in self.program.tensor_params
                       if not dt.is_float(p.dtype)}
        key = (tuple(sorted(bound.dims.items())), tuple(sorted(bound.scalars.items())),
               tuple((n, t.data_ptr(), t._version) for n, t in int_tensors.items()))
        if key not in self._masks:
            lists = self.planner.block_lists(plan, knobs, bound.dims, int_tensors, bound.scalars,
                                             device)
            self._masks = {key: dict(zip(("bm_partial_num", "bm_partial_idx", "bm_full_num",
                                          "bm_full_idx"), lists))}
        return self._masks[key]

    def __call__(self, *args, **kwargs):
        launch, call, meta, outs, results, bound = self._launch_args(args, kwargs)
        launch(*call, **meta)
        final = [deliver(buf, given, bound.framework) for buf, given in zip(outs, results)]
        return final[0] if len(final) == 1 else tuple(final)

    def benchmark(self, *args, repeat: int = 100, **kwargs) -> float:
        """Median milliseconds of a launch (triton.testing.do_bench: events, warm-up, L2 flush)."""
        import triton

        launch, call, meta, _, _, _ = self._launch_args(args, kwargs)
        return float(triton.testing.do_bench(lambda: launch(*call, **meta), rep=repeat,
                                             return_mode="median"))

