"""A compiled kernel: callable on NumPy arrays and PyTorch tensors, one build per shape signature.

The kernel is built lazily: each new set of sizes (and index width) gets its own specialised
TensorIR, scheduled and compiled once, then cached. Code generation can be inspected without running
(``cuda_source()``, ``ptx()``, ``rocm_assembly()``), which is how GPU code is checked on machines
without the GPU.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import tvm

from .binding import BoundCall, bind_call, output_shape
from .dsl.program import Program, ScalarParam
from .errors import TargetError
from .interop import empty, to_tvm, to_user
from .targets import TargetSpec

Builder = Callable[[dict, str], tvm.IRModule]


class CompiledKernel:
    """A kernel ready to call: ``out = kernel(x, y, scale=0.5)``, or with ``out=`` arrays to fill."""

    def __init__(self, program: Program, target: TargetSpec, build: Builder, description: str):
        self.program = program
        self.target = target
        self.description = description
        self._build = build
        self._modules: dict[tuple, tvm.IRModule] = {}
        self._executables: dict[tuple, object] = {}

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
            self._modules[key] = self._build(dict(dims), index_dtype)
        return self._modules[key]

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
    def __call__(self, *args, **kwargs):
        device = self.target.device()
        bound = bind_call(self.program, args, kwargs, self.device_kind)
        run = self._executable(bound.dims, bound.index_dtype)[self.program.name]
        call_args = []
        for p in self.program.params:
            if isinstance(p, ScalarParam):
                call_args.append(bound.scalars[p.name])
            else:
                call_args.append(to_tvm(bound.arrays[p.name], device))
        results, views = self._outputs(bound, device)
        run(*call_args, *views)
        results = [self._finish(r, v, bound) for r, v in zip(results, views)]
        return results[0] if len(results) == 1 else tuple(results)

    def _outputs(self, bound: BoundCall, device):
        results, views = [], []
        for k, c in enumerate(self.program.outputs):
            if bound.outs is not None:
                results.append(bound.outs[k])
                views.append(to_tvm(bound.outs[k], device))
            else:
                r, v = empty(output_shape(c, bound.dims), c.dtypes[0], device, bound.framework,
                             bound.torch_device)
                results.append(r)
                views.append(v)
        return results, views

    @staticmethod
    def _finish(result, view, bound: BoundCall):
        if isinstance(result, np.ndarray):
            on_host = view.device.dlpack_device_type() == 1
            if not (on_host and np.shares_memory(result, np.from_dlpack(view))):
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

    def ptx(self, **dims: int) -> str:
        """PTX for the given sizes, compiled here with nvcc (no GPU needed)."""
        from .targets.codegen import cuda_to_ptx

        return cuda_to_ptx(self.cuda_source(**dims), self.target)

    def rocm_assembly(self, **dims: int) -> str:
        """AMDGPU assembly for the given sizes (code generation only; no AMD GPU needed)."""
        if self.target.kind != "rocm":
            raise TargetError(f"rocm_assembly() needs a ROCm target, this kernel is for "
                              f"{self.target.name}")
        return self._device_source(dims, "asm")
