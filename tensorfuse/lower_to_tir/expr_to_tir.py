"""Translate DSL expressions into TVM ``PrimExpr``s.

Half-precision loads are widened to f32 (the compute type), literals take the type of the expression
they meet, and every axis, scalar, dimension, intermediate value and placeholder is looked up in the
maps the caller provides (so the same translation serves plain blocks and rolled ones).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

from tvm import tirx

from ..dsl import dtypes as dt
from ..dsl.expr import (Axis, Binary, Cast, Compare, Const, DimSize, Expr, Load, Ref, Scalar, Symbol,
                        Unary, Where, reads_data)
from ..errors import DSLError
from .vector_math import binds_variables, fast_exp

_UNARY: dict[str, Callable] = {
    "neg": lambda x: -x, "exp": tirx.exp, "exp2": tirx.exp2, "log": tirx.log, "log2": tirx.log2,
    "tanh": tirx.tanh, "sqrt": tirx.sqrt, "rsqrt": tirx.rsqrt, "sigmoid": tirx.sigmoid,
    "abs": tirx.abs, "erf": tirx.erf, "floor": tirx.floor, "ceil": tirx.ceil,
    "round": tirx.nearbyint, "not": tirx.Not,
    "sin": tirx.sin, "cos": tirx.cos,
}
_BINARY: dict[str, Callable] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": tirx.Div, "floordiv": tirx.floordiv, "mod": tirx.floormod, "pow": tirx.power,
    "max": tirx.max, "min": tirx.min, "and": tirx.And, "or": tirx.Or,
}
_COMPARE = {"lt": tirx.LT, "le": tirx.LE, "gt": tirx.GT, "ge": tirx.GE, "eq": tirx.EQ, "ne": tirx.NE}


def constant(value, dtype: str) -> tirx.PrimExpr:
    """A TIR constant of DSL type ``dtype`` (infinities included)."""
    tvm_dtype = dt.to_tvm(dtype)
    if isinstance(value, float) and math.isinf(value):
        if not dt.is_float(dt.resolve(dtype)):
            raise DSLError(f"infinity has no {dt.resolve(dtype)} value")
        inf = tirx.infinity(tvm_dtype)
        return inf if value > 0 else -inf
    if dt.resolve(dtype) == "bool":
        return tirx.IntImm("bool", int(bool(value)))
    return tirx.const(value, tvm_dtype)


@dataclass
class Scope:
    """What names mean while translating: axes, tensors, intermediates, scalars, sizes, symbols."""

    axes: dict[int, tirx.PrimExpr] = field(default_factory=dict)
    params: dict[str, tirx.Buffer] = field(default_factory=dict)
    computes: dict[str, list[tirx.Buffer]] = field(default_factory=dict)
    compute_index: dict[str, Callable] = field(default_factory=dict)  # name -> f(scope) -> indices
    scalars: dict[str, tirx.Var] = field(default_factory=dict)
    dims: dict[str, tirx.PrimExpr] = field(default_factory=dict)
    symbols: dict[str, tirx.PrimExpr] = field(default_factory=dict)
    index_dtype: str = "int32"
    # f32 exp as arithmetic the CPU vectorises (vector_math.py); "bound": its argument and
    # intermediates bound once each (Let), which MetaSchedule's flop count does not read
    vector_math: bool | str = False

    def child(self, **updates) -> "Scope":
        """A copy with some maps extended (the originals are left alone)."""
        new = Scope(dict(self.axes), self.params, dict(self.computes), dict(self.compute_index),
                    self.scalars, self.dims, dict(self.symbols), self.index_dtype,
                    self.vector_math)
        for key, extra in updates.items():
            getattr(new, key).update(extra)
        return new


def cast_to(x: tirx.PrimExpr, dtype: str) -> tirx.PrimExpr:
    target = dt.to_tvm(dtype)
    return x if str(x.ty) == target else tirx.Cast(target, x)


def bf16_rounded(make: Callable[[], tirx.PrimExpr]) -> tirx.PrimExpr:
    """Float32 ``x = make()`` rounded to the nearest bfloat16 (ties to even; NaN kept, past the
    largest finite one infinity), still float32: the cast to bf16 made explicit, because TVM's
    ``BF16ComputeLegalize`` computes bf16 values in float32 and drops a cast to bf16 whose value
    is read as float32 — ``x − f32(bf16(x))``, the rounding's rest, came out 0 on the CPU.
    ``x`` is read three times: where it binds variables (an ``exp`` written as arithmetic, its
    steps bound once: :func:`.vector_math.fast_exp`), each read is made anew — the same
    bindings twice in one tree are ill-formed TensorIR (a bf16 cast of a softmax's weights in
    a gradient failed to build on the CPU), and the value cannot be bound itself where it reads
    a 16-bit float (:func:`.vector_math.fast_exp` says why)."""
    x = make()
    first, anew = [x], binds_variables(x)

    def read() -> tirx.PrimExpr:   # x, then x again, or a new making of it where it binds
        return first.pop() if first else make() if anew else x

    def bits() -> tirx.PrimExpr:
        return tirx.reinterpret("uint32", read())
    odd = tirx.bitwise_and(tirx.shift_right(bits(), tirx.const(16, "uint32")),
                           tirx.const(1, "uint32"))
    rounded = tirx.bitwise_and(bits() + tirx.const(0x7FFF, "uint32") + odd,
                               tirx.const(0xFFFF0000, "uint32"))
    return tirx.Select(read() != read(), read(), tirx.reinterpret("float32", rounded))


def lower(e: Expr, scope: Scope, want: str | None = None) -> tirx.PrimExpr:
    """``e`` as a PrimExpr of type ``want`` (default: the type of ``e``)."""
    own = dt.resolve(e.dtype) if not (want and e.dtype in (dt.WEAK_INT, dt.WEAK_FLOAT)) else want
    return cast_to(_lower(e, scope, own), want or own)


def _lower(e: Expr, scope: Scope, own: str) -> tirx.PrimExpr:
    if isinstance(e, Const):
        return constant(e.value, own)
    if isinstance(e, Axis):
        return scope.axes[e.uid]
    if isinstance(e, Scalar):
        return scope.scalars[e.name]
    if isinstance(e, Symbol):
        return scope.symbols[e.name]
    if isinstance(e, DimSize):
        return cast_to(scope.dims[e.name], "i64" if scope.index_dtype == "int64" else "i32")
    if isinstance(e, Load):
        buf = scope.params[e.param.name]
        idx = [lower(i, scope, _index_type(scope)) for i in e.indices]
        # a gathered index (data) is clamped into its dimension: a lane a T.where discards, or
        # a bad value on an unchecked call, reads inside the tensor (index_checks)
        idx = [tirx.max(tirx.min(x, extent - 1), 0) if reads_data(i) else x
               for x, i, extent in zip(idx, e.indices, buf.shape)]
        return cast_to(tirx.BufferLoad(buf, idx), dt.compute_dtype(e.param.dtype))
    if isinstance(e, Ref):
        bufs = scope.computes[e.compute.name]
        indexer = scope.compute_index.get(e.compute.name)
        idx = indexer(scope) if indexer else [scope.axes[a.uid] for a in e.compute.axes]
        return tirx.BufferLoad(bufs[e.component], idx)
    if isinstance(e, Unary):
        arg_type = own if e.op != "not" else "bool"
        if e.op == "exp" and scope.vector_math and arg_type == "f32":
            return fast_exp(lower(e.a, scope, arg_type), bound=scope.vector_math == "bound")
        return _UNARY[e.op](lower(e.a, scope, arg_type))
    if isinstance(e, Binary):
        operand = "bool" if e.op in ("and", "or") else own
        return _BINARY[e.op](lower(e.a, scope, operand), lower(e.b, scope, operand))
    if isinstance(e, Compare):
        common = dt.resolve(dt.promote(e.a.dtype, e.b.dtype)) if "bool" not in (e.a.dtype, e.b.dtype) \
            else "bool"
        return _COMPARE[e.op](lower(e.a, scope, common), lower(e.b, scope, common))
    if isinstance(e, Where):
        return tirx.Select(lower(e.cond, scope, "bool"), lower(e.a, scope, own), lower(e.b, scope, own))
    if isinstance(e, Cast):
        inner = dt.resolve(e.a.dtype)
        if own == "bf16" and inner == "f32":
            return cast_to(bf16_rounded(lambda: lower(e.a, scope, inner)), own)
        return cast_to(lower(e.a, scope, inner), own)
    raise DSLError(f"cannot translate {type(e).__name__} to TensorIR", e.loc)


def _index_type(scope: Scope) -> str:
    return "i64" if scope.index_dtype == "int64" else "i32"
