"""A NumPy interpreter for expressions and whole programs.

It is the float64 reference for generated tests (any program, including generated chains of
reductions, can be checked against it) and the evaluator the algebra uses to check derived
corrections numerically. It is written for clarity, not speed.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from . import dtypes as dt
from .expr import (Axis, Binary, Cast, Compare, Const, DimSize, Expr, Load, Reduce, Ref, Scalar,
                   Symbol, Unary, Where, order_axes)
from ..errors import DSLError

_UNARY = {
    "neg": np.negative, "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2,
    "tanh": np.tanh, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "abs": np.abs, "floor": np.floor,
    "ceil": np.ceil, "round": np.rint, "not": np.logical_not, "sin": np.sin, "cos": np.cos,
}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "floordiv": np.floor_divide, "mod": np.mod, "pow": np.power, "max": np.maximum,
    "min": np.minimum, "and": np.logical_and, "or": np.logical_or,
}
_COMPARE = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
            "eq": np.equal, "ne": np.not_equal}


def _erf(x):
    from scipy.special import erf

    return erf(x)


_UNARY["erf"] = _erf


def _np_dtype(d: str, precise: bool):
    d = dt.resolve(d)
    if d == "bool":
        return np.bool_
    if dt.is_int(d):
        return np.int64
    return np.float64 if precise else dt.to_numpy(d)


def _apply(e: Expr, args: list, precise: bool):
    """Apply the operation of node ``e`` to already evaluated children."""
    with np.errstate(all="ignore"):
        if isinstance(e, Unary):
            return _UNARY[e.op](args[0])
        if isinstance(e, Binary):
            a, b = args
            if e.op == "div" and dt.is_float(e.dtype) and (
                    precise or not (np.asarray(a).dtype.kind == np.asarray(b).dtype.kind == "f")):
                a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            out = _BINARY[e.op](a, b)
            return out if e.op not in ("pow",) or dt.is_float(e.dtype) else out.astype(np.float64)
        if isinstance(e, Compare):
            return _COMPARE[e.op](*args)
        if isinstance(e, Where):
            return np.where(*args)
        if isinstance(e, Cast):
            return np.asarray(args[0]).astype(_np_dtype(e.dtype, precise))
    raise DSLError(f"cannot evaluate {type(e).__name__} here")


def evaluate_plain(e: Expr, env: Mapping[str, object], precise: bool = True):
    """Evaluate an expression over named values (symbols, scalars and sizes) that all have one
    shape."""
    if isinstance(e, (Symbol, Scalar, DimSize)):
        return env[e.name]
    if isinstance(e, Const):
        return np.asarray(e.value, _np_dtype(e.dtype, precise))
    return _apply(e, [evaluate_plain(c, env, precise) for c in e.children()], precise)


def evaluate_scalar(e: Expr, env: Mapping[str, float]) -> float:
    return float(evaluate_plain(e, env))


def _expand(arr: np.ndarray, have: tuple, want: tuple) -> np.ndarray:
    """View ``arr`` (dims = ``have`` axes) with a dim per ``want`` axis (size 1 where missing)."""
    arr = np.asarray(arr)
    if [a.uid for a in have] == [a.uid for a in want]:
        return arr
    positions = {a.uid: k for k, a in enumerate(have)}
    order = [positions[a.uid] for a in want if a.uid in positions]
    arr = np.transpose(arr, order) if order != sorted(order) else arr
    shape, it = [], iter(arr.shape)
    for a in want:
        shape.append(next(it) if a.uid in positions else 1)
    return arr.reshape(shape)


class Interpreter:
    """Evaluates expressions of one program on concrete arrays, broadcasting by axis."""

    def __init__(self, tensors: Mapping[str, np.ndarray], scalars: Mapping[str, float],
                 dims: Mapping[str, int], axis_sizes: Mapping[int, int], precise: bool = True):
        self.tensors, self.scalars, self.dims = tensors, scalars, dims
        self.axis_sizes, self.precise = axis_sizes, precise
        self.values: dict[str, list[np.ndarray]] = {}
        self.symbols: dict[str, tuple[np.ndarray, tuple]] = {}

    def eval(self, e: Expr) -> np.ndarray:
        """Value of ``e`` as an array with one dimension per axis of ``e`` (size 1 if broadcast)."""
        want = e.axes
        if isinstance(e, Axis):
            return np.arange(self.axis_sizes[e.uid], dtype=np.int64)
        if isinstance(e, Const):
            return np.asarray(e.value, _np_dtype(e.dtype, self.precise))
        if isinstance(e, Scalar):
            return np.asarray(self.scalars[e.name], _np_dtype(e.dtype, self.precise))
        if isinstance(e, DimSize):
            return np.asarray(self.dims[e.name], np.int64)
        if isinstance(e, Symbol):
            arr, have = self.symbols[e.name]
            return _expand(arr, have, want)
        if isinstance(e, Ref):
            return _expand(self.values[e.compute.name][e.component], e.compute.axes, want)
        if isinstance(e, Load):
            idx = [_expand(self.eval(i), i.axes, want) for i in e.indices]
            data = np.asarray(self.tensors[e.param.name])
            if self.precise and dt.is_float(e.param.dtype):
                data = data.astype(np.float64)
            if not idx:
                return data
            full = np.broadcast_arrays(*idx)
            return data[tuple(full)]
        if isinstance(e, Reduce):
            return self.reduce(e.spec.monoid, e.spec.bodies, e.spec.over, want)[e.index]
        kids = [_expand(self.eval(c), c.axes, want) for c in e.children()]
        return _apply(e, kids, self.precise)

    def reduce(self, monoid, bodies, over, want) -> list[np.ndarray]:
        full = order_axes([a for b in bodies for a in b.axes] + list(want))
        arrays = [np.broadcast_to(_expand(self.eval(b), b.axes, full),
                                  tuple(self.axis_sizes[a.uid] for a in full)) for b in bodies]
        over_pos = [k for k, a in enumerate(full) if any(a is o for o in over)]
        keep = [a for a in full if not any(a is o for o in over)]
        moved = [np.moveaxis(x, over_pos, list(range(-len(over_pos), 0))) for x in arrays]
        flat = [x.reshape(x.shape[:len(keep)] + (-1,)) for x in moved]
        fast = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}
        if monoid.name in fast and monoid.arity == 1:
            res = [fast[monoid.name](flat[0], axis=-1)]
        else:
            res = self._fold(monoid, flat, [dt.resolve(b.dtype) for b in bodies])
        return [_expand(r, tuple(keep), want) for r in res]

    def _fold(self, monoid, flat, dtypes) -> list[np.ndarray]:
        from .expr import Symbol as Sym

        acc_syms = [Sym(f"__acc{k}", d) for k, d in enumerate(dtypes)]
        new_syms = [Sym(f"__new{k}", d) for k, d in enumerate(dtypes)]
        combined = monoid.combine_exprs(acc_syms, new_syms)
        shape = flat[0].shape[:-1]
        acc = [np.full(shape, monoid.identity_value(k, d), dtype=_np_dtype(d, self.precise))
               for k, d in enumerate(dtypes)]
        for t in range(flat[0].shape[-1]):
            env = {s.name: a for s, a in zip(acc_syms, acc)}
            env.update({s.name: x[..., t] for s, x in zip(new_syms, flat)})
            acc = [np.asarray(evaluate_plain(c, env, self.precise)) for c in combined]
        return acc


def axis_sizes_for(program, dims: Mapping[str, int]) -> dict[int, int]:
    sizes = {}
    for a in program.axes:
        sizes[a.uid] = a.extent if isinstance(a.extent, int) else dims[a.extent]
    return sizes


def run_program(program, tensors: Mapping[str, np.ndarray], scalars: Mapping[str, float] = {},
                precise: bool = True) -> list[np.ndarray]:
    """Evaluate ``program`` on NumPy inputs (float64 throughout when ``precise``)."""
    dims: dict[str, int] = {}
    for p in program.tensor_params:
        shape = np.shape(tensors[p.name])
        for d, n in zip(p.dims, shape):
            if isinstance(d, str):
                dims.setdefault(d, n)
    dims = program.with_derived_sizes(dims)   # sizes the kernel derives (T.axis("o", ...))
    interp = Interpreter(tensors, scalars, dims, axis_sizes_for(program, dims), precise)
    for c in program.computes:
        if c.is_reduction:
            interp.values[c.name] = interp.reduce(c.monoid, c.bodies, c.over, c.axes)
        else:
            interp.values[c.name] = [np.broadcast_to(
                _expand(interp.eval(c.bodies[0]), c.bodies[0].axes, c.axes),
                tuple(interp.axis_sizes[a.uid] for a in c.axes))]
    return [np.asarray(interp.values[c.name][0]) for c in program.outputs]
