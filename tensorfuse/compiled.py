"""A compiled kernel: callable on NumPy arrays and PyTorch tensors, one build per shape signature.

The kernel is built lazily: each new set of sizes (and index width) gets its own specialised
TensorIR, scheduled and compiled once, then cached. Code generation can be inspected without running
(``cuda_source()``, ``assembly()``), which is how GPU code is checked on machines
without the GPU.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import tvm

from .binding import BoundCall, CallBinder, check_named_sizes, output_shape, split_scalars
from .dsl.program import Program, ScalarParam
from .errors import TargetError
from .interop import empty, is_torch, to_tvm, to_tvm_shared, to_user
from .schedule_templates.mask_bounds import bound_masked_loops
from .targets import TargetSpec
from .torch_graph import GraphCallable

Builder = Callable[[dict, str], "tvm.IRModule | tuple[tvm.IRModule, str]"]


class CompiledKernel(GraphCallable):
    """A kernel ready to call: ``out = kernel(x, y, scale=0.5)``, or with ``out=`` arrays to fill."""

    def __init__(self, program: Program, target: TargetSpec, build: Builder, description: str):
        self.program = program
        self.target = target
        self.description = description
        self._build = build
        self._modules: dict[tuple, tvm.IRModule] = {}
        self._origins: dict[tuple, str] = {}
        self._executables: dict[tuple, object] = {}
        self._calls = CallBinder(program, self.device_kind)

    def __repr__(self) -> str:
        return f"<CompiledKernel {self.program.name} for {self.target.name}: {self.description}>"

    @property
    def device_kind(self) -> str:
        return {"llvm": "cpu"}.get(self.target.kind, self.target.kind)

    # -- building --------------------------------------------------------------------------------
    def module(self, index_dtype: str = "int32", **dims: int) -> tvm.IRModule:
        """The scheduled TensorIR for the given sizes (sizes not given stay symbolic)."""
        key = (tuple(sorted(dims.items())), index_dtype)
        if key not in self._modules:
            check_named_sizes(self.program, dims, complete=False)
            built = self._build(dict(dims), index_dtype)
            if isinstance(built, tuple):  # (module, where its schedule came from)
                built, self._origins[key] = built
            if self.target.kind == "llvm":   # masked key loops cut at the mask's edges
                built = bound_masked_loops(built, self.program)
            self._modules[key] = built
        return self._modules[key]

    def cache_info(self) -> list:
        """The builds so far (:class:`~tensorfuse.targets.triton.size_builds.Build`): TVM builds
        a module per sizes (and index width), exactly."""
        from .targets.triton.size_builds import Build

        return [Build("", None, [], [dict(dims)]) for dims, _ in self._modules]

    def schedule_origin(self, **dims: int) -> str:
        """Where the schedule at these sizes comes from (template defaults or a tuned record);
        scalar values given by name among the sizes are passed over (they do not change it)."""
        dims, _ = split_scalars(self.program, dims)
        self.module(**dims)
        return self._origins.get((tuple(sorted(dims.items())), "int32"), self.description)

    def _executable(self, dims: dict, index_dtype: str):
        key = (tuple(sorted(dims.items())), index_dtype)
        if key not in self._executables:
            mod = self.module(index_dtype, **dims)
            if self.target.kind == "rocm":
                from .targets.codegen import build_rocm

                self._executables[key] = build_rocm(mod, self.target)
            else:
                with self.target.tvm_target:
                    self._executables[key] = tvm.compile(mod, target=self.target.tvm_target)
        return self._executables[key]

    def show(self, **dims: int) -> None:
        """Print the scheduled TensorIR as TVMScript."""
        print(self.module(**dims).script())

    def tvm_script(self, **dims: int) -> str:
        return self.module(**dims).script()

    # -- calling ---------------------------------------------------------------------------------
    def _prepare(self, args, kwargs, key=False):
        device = self.target.device()
        bound = self._calls(args, kwargs, key)
        executable = self._executable(bound.dims, bound.index_dtype)
        call_args = []
        for p in self.program.params:
            if isinstance(p, ScalarParam):
                call_args.append(bound.scalars[p.name])
            else:
                call_args.append(to_tvm(bound.arrays[p.name], device))
        results, views, shared = self._outputs(bound, device)
        return executable, device, bound, call_args, results, views, shared

    def invoke(self, key, args: tuple, kwargs: dict):
        """A call whose signature key the caller made (``False``: not made)."""
        executable, _, bound, call_args, results, views, shared = self._prepare(args, kwargs, key)
        executable[self.program.name](*call_args, *views)
        results = [self._finish(r, v, s, bound) for r, v, s in zip(results, views, shared)]
        return results[0] if len(results) == 1 else tuple(results)

    def benchmark(self, *args, repeat: int = 20, min_repeat_ms: int = 50, **kwargs) -> float:
        """Median time of one call in milliseconds, measured on the device by TVM's time evaluator
        (arguments as for a call; outputs are written to scratch buffers)."""
        executable, device, _, call_args, _, views, _ = self._prepare(args, kwargs)
        timer = executable.mod.time_evaluator(self.program.name, device, number=1, repeat=repeat,
                                              min_repeat_ms=min_repeat_ms)
        return float(np.median(timer(*call_args, *views).results)) * 1e3

    def _outputs(self, bound: BoundCall, device):
        """Output arrays to return, the TVM views the kernel writes, and whether each view writes
        straight into its array."""
        results, views, shared = [], [], []
        for k, c in enumerate(self.program.outputs):
            if bound.outs is not None:
                view, same = to_tvm_shared(bound.outs[k], device)
                results.append(bound.outs[k])
            else:
                result, view = empty(output_shape(c, bound.dims), c.dtypes[0], device,
                                     bound.framework, bound.torch_device)
                results.append(result)
                same = True
            views.append(view)
            shared.append(same)
        return results, views, shared

    @staticmethod
    def _finish(result, view, shared: bool, bound: BoundCall):
        if not shared:  # the kernel wrote a copy: bring it back into the caller's array
            if is_torch(result):
                import torch

                result.copy_(torch.from_dlpack(view))
            else:
                np.copyto(result, view.numpy())
            return result
        return to_user(result, bound.framework)

    # -- code generation for inspection -------------------------------------------------------
    def _device_source(self, dims: dict, fmt: str = "") -> str:
        lib = self._executable(dims, "int32")
        imports = lib.mod.imports
        if not imports:
            raise TargetError(f"target {self.target.name} produced no device code")
        return imports[0].inspect_source(fmt)

    def cuda_source(self, **dims: int) -> str:
        """The CUDA C++ TVM generated for the given sizes."""
        if self.target.kind != "cuda":
            raise TargetError(f"cuda_source() needs a CUDA target, this kernel is for "
                              f"{self.target.name}")
        return self._device_source(dims)

    def assembly(self, **dims: int) -> str:
        """The device assembly for the given sizes, made here without a GPU: PTX (nvcc) on a
        CUDA target, AMDGPU assembly on a ROCm one."""
        from .targets.codegen import cuda_to_ptx

        if self.target.kind == "rocm":
            return self._device_source(dims, "asm")
        return cuda_to_ptx(self.cuda_source(**dims), self.target)
