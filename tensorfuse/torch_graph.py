"""Compiled kernels as PyTorch custom operators, so that ``torch.compile`` can put them in a graph.

A kernel's Python call path (argument checks, the cache of builds, launch) is opaque to Dynamo:
traced, it would break the graph or fail under ``fullgraph=True``. So every kernel that
``tensorfuse.compile`` or ``Schedule.compile`` hands out gets a ``torch.library.custom_op`` of its
own (``torch.ops.tensorfuse.<kernel name>_<n>``) whose schema lists the DSL program's parameters in
order, whose real implementation is the kernel's ordinary call, and whose fake implementation
gives the outputs' shapes and dtypes from the program (checking the arguments as a call would, so
a wrong shape is reported while tracing). Called inside ``torch.compile``, the kernel routes itself
to that operator (:class:`GraphCallable`); called eagerly, it runs as before. The operator also
makes the kernel usable with ``torch.library.opcheck``, AOT autograd and CUDA graphs
(``mode="reduce-overhead"``).
"""
from __future__ import annotations

import itertools
import re
import sys
from contextvars import ContextVar

import numpy as np

from .binding import EmptyCall, bind_call, out_overlaps_an_argument, output_shape
from .dsl import dtypes as dt
from .dsl.program import Program, ScalarParam
from .interop import fill, is_torch, torch_dtype
from .errors import TargetError

_NUMBERS = itertools.count()
# What makes a kernel's operator differentiable (``kernel -> object with backward,
# setup_context and training_op``): installed by :mod:`tensorfuse.autograd`, which compiles
# backward kernels — a layer above this one, so it is handed down rather than imported.
DIFFERENTIATION: list = []


def _schema_type(p) -> str:
    if not isinstance(p, ScalarParam):
        return "Tensor"
    if dt.is_int(p.dtype):
        return "SymInt"   # an int Dynamo made symbolic must still fit the schema
    return "bool" if p.dtype == "bool" else "float"


def schema(program: Program) -> str:
    """The operator's schema: the program's parameters in order, its outputs as tensors."""
    params = ", ".join(f"{_schema_type(p)} {p.name}" for p in program.params)
    outs = ["Tensor"] * len(program.outputs)
    return f"({params}) -> {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ')'}"


def fake_outputs(program: Program, device: str, args: tuple):
    """The outputs a call of ``program`` on ``args`` gives, as empty tensors (fake
    implementations: shapes, dtypes and device, the arguments checked as a call would)."""
    import torch

    try:
        bound = bind_call(program, args, {}, device)
    except EmptyCall as empty:
        return empty.result
    place = next(bound.arrays[p.name].device for p in program.tensor_params)
    outs = tuple(torch.empty(output_shape(c, bound.dims), dtype=torch_dtype(c.dtypes[0]),
                             device=place) for c in program.outputs)
    return outs[0] if len(outs) == 1 else outs


# Set while a custom operator's implementation runs: its outputs must have the strides its fake
# implementation gave them (row-major), so a kernel does not lay an output out in its input's
# memory order then (:mod:`tensorfuse.memory_order`) — Inductor indexes the outputs by the fake's
IN_OPERATOR: ContextVar[bool] = ContextVar("tensorfuse_in_operator", default=False)


def kernel_op(qualname: str, program: Program, run, device: str):
    """A custom operator ``qualname`` taking ``program``'s parameters and returning its outputs,
    ``run(*args)`` its implementation (its outputs row-major, as the fake implementation's)."""
    import torch

    def real(*args):
        token = IN_OPERATOR.set(True)
        try:
            return run(*args)
        except EmptyCall as empty:
            return empty.result
        finally:
            IN_OPERATOR.reset(token)

    op = torch.library.custom_op(qualname, real, mutates_args=(), schema=schema(program))
    op.register_fake(lambda *args: fake_outputs(program, device, args))
    return op


class KernelOp:
    """The custom operator of one compiled kernel and the mapping of a call's arguments onto it.
    Where the kernel's differentiation has one, a second operator (``training``) runs the calls
    autograd records: it also returns what the backward reads besides the output."""

    def __init__(self, kernel):
        program: Program = kernel.program
        self.program = program
        self.names = [p.name for p in program.params]
        stem = re.sub(r"\W", "_", program.name)
        self.qualname = f"tensorfuse::{stem}_{next(_NUMBERS)}"
        device = {"llvm": "cpu"}.get(kernel.target.kind, kernel.target.kind)
        self.op = kernel_op(self.qualname, program, lambda *args: kernel.invoke(False, args, {}),
                            device)
        self.differentiation = self.training = None
        for make in DIFFERENTIATION:
            self.differentiation = make(kernel)
            self.op.register_autograd(self.differentiation.backward,
                                      setup_context=self.differentiation.setup_context)
            self.training = self.differentiation.training_op(f"{self.qualname}_train", device)

    def __call__(self, args: tuple, kwargs: dict):
        """Call the operator with ``args``/``kwargs`` as the kernel would take them (keyword
        arguments by parameter name; ``out=`` has no place in a graph). Errors here are builtin
        exceptions: Dynamo traces this code, and shows their message, not tensorfuse's own."""
        if "out" in kwargs:
            where = "inside torch.compile (a graph's operators return new tensors)" \
                if compiling() else "while autograd records the call (an input requires grad)"
            raise TypeError(f"{self.program.name}(): out= is not supported {where}; drop it and "
                            "use the result")
        ordered = list(args)
        for name in self.names[len(args):]:
            if name not in kwargs:
                raise TypeError(f"{self.program.name}() is missing argument {name!r}")
            ordered.append(kwargs[name])
        if self.training is not None and wants_grad(args, kwargs):
            made = self.training(*ordered)   # the outputs, then what the backward reads
            count = len(self.program.outputs)
            return made[0] if count == 1 else made[:count]
        return self.op(*ordered)


def wants_grad(args: tuple, kwargs: dict) -> bool:
    """Whether autograd must record this call: grad mode on and a tensor argument that requires
    grad (the call then goes through the custom operator, whose backward is registered)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled():
        return False
    return any(getattr(a, "requires_grad", False) for a in args) or \
        any(getattr(a, "requires_grad", False) for a in kwargs.values())


def compiling() -> bool:
    """Whether torch.compile (Dynamo) is tracing this call (never, where PyTorch is not loaded)."""
    if not _IS_COMPILING:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        _IS_COMPILING.append(torch.compiler.is_compiling)   # looked up once: calls are hot
    return _IS_COMPILING[0]()


_IS_COMPILING: list = []


class GraphCallable:
    """Base of the kernel classes: ``kernel(...)`` runs :meth:`invoke`, or, while torch.compile
    traces the caller, the kernel's custom operator (when it has one: :func:`in_graph`)."""

    torch_op: KernelOp | None = None
    # calls whose tensors lie in another axis order than the program declares (a transposed
    # view): their route to the program in the tensors' memory order, where tf.compile gave the
    # kernel one (:class:`tensorfuse.memory_order.MemoryOrderRoutes`)
    routes = None

    def _route_call(self, key, args: tuple, kwargs: dict) -> tuple[bool, object]:
        """``(True, outputs)`` of a call run by its route (:attr:`routes`), whose fast call a
        kernel with fast calls keeps under ``key`` (in its ``_fast``) for the calls of its
        signature — not one made inside a custom operator, whose outputs are row-major where
        an eager call's follow its inputs' layout: the eager calls of the signature keep theirs;
        ``(False, None)`` where the call has no route."""
        routed = self.routes.route(args, kwargs, key) if self.routes is not None else None
        if routed is None:
            return False, None
        out = routed.invoke(key, args, kwargs)
        made = routed._fast.get(key) if key is not None else None
        calls = getattr(self, "_fast", None)
        if made is not None and calls is not None and not IN_OPERATOR.get():
            calls[key] = made
        return True, out

    def __call__(self, *args, **kwargs):
        op = self.torch_op
        try:
            if op is not None and (compiling() or wants_grad(args, kwargs)):
                return op(args, kwargs)
            if kwargs and "out" in kwargs and out_overlaps_an_argument(args, kwargs):
                return self._into_overlapping(args, kwargs)
            return self.invoke(False, args, kwargs)
        except EmptyCall as empty:   # every output empty: nothing launched
            return empty.result

    def _into_overlapping(self, args: tuple, kwargs: dict):
        """A call whose ``out=`` shares memory with an argument (``out=x``): computed into new
        arrays like the caller's, then copied into them (as torch's in-place ops; written in
        place, a GEMM's first tiles overwrote rows its other tiles had still to read). The
        binding checks the new arrays as it checks any ``out=``: their count, shapes and
        dtypes are the caller's."""
        given = kwargs["out"]
        many = isinstance(given, (tuple, list))
        fresh = [_empty_like(g) for g in (given if many else (given,))]
        self.invoke(False, args, {**kwargs, "out": fresh if many else fresh[0]})
        filled = [fill(g, f) for g, f in zip(given if many else (given,), fresh)]
        return tuple(filled) if many else filled[0]

    def assembly(self, *which, **dims) -> str:
        """The device assembly of the kernel at these sizes, made here without the GPU: PTX on
        a CUDA target, AMDGPU assembly on a ROCm one (each kernel kind overrides this)."""
        raise TargetError(f"{type(self).__name__} for {self.target.name} shows no assembly; "
                          "source(...) shows what it generates")

    def ptx(self, *which, **dims) -> str:
        """PTX of the kernel at these sizes (CUDA targets; :meth:`assembly` on any GPU)."""
        if self.target.kind != "cuda":
            raise TargetError(f"ptx() is for CUDA targets and this kernel is for "
                              f"{self.target.name}: assembly(...) gives its device assembly")
        return self.assembly(*which, **dims)

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        """The kernel's plan at these sizes (scalar values as ``scalars`` or by name among
        them); a kernel with no template plan to show says where its schedule comes from."""
        return self.schedule_origin(**dims, **(scalars or {}))

    def describe_call(self, *args, **kwargs) -> str:
        """The plan of a call on these arguments as they lie (nothing runs; no GPU needed):
        where a tensor in another axis order routes it, the program in their memory order and
        its plan (:mod:`tensorfuse.memory_order`); else the kernel's plan at the call's sizes
        and each tensor the call copies before the launch, and why."""
        from .interop import copy_reason, is_torch

        shaped = {n: v for n, v in kwargs.items() if n != "out"}
        devices = {a.device.type for a in (*args, *shaped.values()) if is_torch(a)}
        device = devices.pop() if len(devices) == 1 else \
            {"llvm": "cpu"}.get(self.target.kind, self.target.kind)
        bound = bind_call(self.program, args, shaped, device)
        routes = self.routes
        orders = routes.orders(args, kwargs) if routes is not None else None
        if orders is not None and routes.taken(orders, bound.dims):
            return routes.kernel_for(orders).describe_plan(bound.scalars, **bound.dims)
        lines = [self.describe_plan(bound.scalars, **bound.dims)]
        for name, x in bound.arrays.items():
            why = copy_reason(x) if is_torch(x) else None
            if why:
                lines.append(f"  {name} copied before each launch: {why}"
                             + (" (its program in memory order would run on a lesser schedule)"
                                if orders is not None and name in dict(orders.orders) else ""))
        return "\n".join(lines)

    def invoke(self, key, args: tuple, kwargs: dict):   # pragma: no cover - each class has one
        raise NotImplementedError

    def benchmark(self, *args, repeat: int = 100, **kwargs) -> float:
        """Median milliseconds of a whole call (``triton.testing.do_bench``): every launch and
        what the call does around them; kernels that can time their launches alone override it."""
        import triton

        return float(triton.testing.do_bench(lambda: self.invoke(False, args, kwargs),
                                             rep=repeat, return_mode="median"))


def _empty_like(x):
    """A new array of ``x``'s shape, dtype and framework (``x`` itself where it is none: the
    binding then says what an ``out=`` must be)."""
    if is_torch(x):
        import torch

        return torch.empty_like(x)
    return np.empty_like(x) if isinstance(x, np.ndarray) else x


def in_graph(kernel):
    """Give ``kernel`` its custom operator (once; nothing when PyTorch is not installed) and
    return it."""
    if getattr(kernel, "torch_op", None) is None:
        try:
            import torch  # noqa: F401
        except ImportError:
            return kernel
        kernel.torch_op = KernelOp(kernel)
    return kernel
