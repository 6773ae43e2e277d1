"""Cluster kernels as callables: arguments checked like every tensorfuse kernel, torch or NumPy in
and out, one generated source and TVM CUDA module per set of sizes."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...binding import bind_call, output_shape
from ...interop import is_torch
from .. import TargetSpec
from ..codegen import cuda_to_ptx
from ..triton.kernel import _from_numpy, _to_numpy
from .module import KernelEntry, cuda_module


class ClusterKernel:
    """A kernel made of generated CUDA launches. ``layout`` turns the sizes into a
    :class:`Launches` (source, entries, and a function that launches them on torch tensors)."""

    def __init__(self, program, target: TargetSpec, layout: Callable[[dict], "Launches"],
                 description: str):
        self.program, self.target, self.layout = program, target, layout
        self.description = description
        self._launches: dict = {}
        self._modules: dict = {}

    def __repr__(self) -> str:
        return f"<ClusterKernel {self.program.name} for {self.target.name}: {self.description}>"

    def launches(self, **dims) -> "Launches":
        key = tuple(sorted(dims.items()))
        if key not in self._launches:
            self._launches[key] = self.layout(dims)
        return self._launches[key]

    def source(self, **dims) -> str:
        """The generated CUDA C++."""
        return self.launches(**dims).source

    def ptx(self, **dims) -> str:
        """nvcc's PTX for the target (works without a GPU)."""
        return cuda_to_ptx(self.source(**dims), self.target)

    def schedule_origin(self, **dims) -> str:
        return f"cluster template ({self.launches(**dims).knobs})"

    def _prepare(self, args, kwargs):
        import torch

        self.target.device()  # a clear error when there is no GPU
        bound = bind_call(self.program, args, kwargs, "cuda")
        device = bound.torch_device or torch.device("cuda", torch.cuda.current_device())
        launches = self.launches(**bound.dims)
        key = tuple(sorted(bound.dims.items()))
        if key not in self._modules:
            self._modules[key] = cuda_module(launches.source, launches.entries, self.target)
        values = {}
        for p in self.program.params:
            if p.name in bound.scalars:
                values[p.name] = bound.scalars[p.name]
            else:
                x = bound.arrays[p.name]
                values[p.name] = (x if is_torch(x) else _from_numpy(x, device)).contiguous()
        out_c = next(c for c in self.program.computes if c.is_output)
        given = bound.outs[0] if bound.outs is not None else None
        if given is not None and is_torch(given) and given.is_contiguous():
            out = given
        else:
            out = torch.empty(output_shape(out_c, bound.dims), dtype=torch.bfloat16, device=device)
        module = self._modules[key]
        return (lambda: launches.run(module, values, out, device)), out, given, bound

    def __call__(self, *args, **kwargs):
        run, out, given, bound = self._prepare(args, kwargs)
        run()
        if given is None:
            return out if bound.framework == "torch" else _to_numpy(out)
        if given is not out:
            if is_torch(given):
                given.copy_(out)
            else:
                np.copyto(given, _to_numpy(out).astype(given.dtype))
        return given

    def benchmark(self, *args, repeat: int = 100, **kwargs) -> float:
        """Median milliseconds of a call's launches (triton.testing.do_bench)."""
        import triton

        run, _, _, _ = self._prepare(args, kwargs)
        return float(triton.testing.do_bench(run, rep=repeat, return_mode="median"))


class Launches:
    """Generated source, its entry points, the knobs used, and ``run(module, values, out,
    device)`` which launches them."""

    def __init__(self, source: str, entries: list[KernelEntry], knobs, run):
        self.source, self.entries, self.knobs, self.run = source, entries, knobs, run
