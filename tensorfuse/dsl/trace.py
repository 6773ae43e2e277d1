"""Turn a Python kernel function into a :class:`Program` by running it once on symbolic parameters.

The function's local variable names become the names of the computes (and so of the TensorIR blocks
and buffers): ``m = T.max(s, over=j)`` gives a compute called ``m``. Every named value, every
reduction and every output is a compute; unnamed elementwise sub-expressions are inlined into the
compute that uses them.
"""
from __future__ import annotations

import inspect
import sys
from typing import Callable

from . import dtypes as dt
from . import program as prog
from .expr import (Axis, Const, DimSize, Expr, Load, Reduce, Ref, Scalar, Symbol, user_location,
                   walk)
from .program import Compute, Program, ScalarParam, TensorParam
from .types import ScalarType, TensorType
from ..errors import AxisError, DSLError, SourceLocation


def _def_location(fn: Callable) -> SourceLocation:
    code = fn.__code__
    import linecache

    return SourceLocation(code.co_filename, code.co_firstlineno,
                          linecache.getline(code.co_filename, code.co_firstlineno))


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:   # a name the enclosing function has not assigned yet
        return False
    return True


def _annotation(fn: Callable, name: str, raw, loc, scope: dict | None = None
                ) -> TensorType | ScalarType:
    if isinstance(raw, str):   # ``from __future__ import annotations``: evaluated here
        # in the function's module, the names its body closes over and the ``scope`` it was
        # defined in: a kernel defined inside a function sees that function's local imports and
        # names, as its body does
        closed = {n: c.cell_contents for n, c in
                  zip(fn.__code__.co_freevars, fn.__closure__ or ()) if _filled(c)}
        try:
            raw = eval(raw, fn.__globals__, {**(scope or {}), **closed})  # noqa: S307
        except Exception as exc:  # pragma: no cover - message path
            raise DSLError(f"parameter {name}: cannot evaluate annotation {raw!r}: {exc}", loc)
    if isinstance(raw, (TensorType, ScalarType)):
        return raw
    if raw is inspect.Parameter.empty:
        raise DSLError(f"parameter {name} needs a type annotation: a tensor "
                       '(T.Tensor["M", "N", "f32"]) or a scalar (T.f32)', loc)
    raise DSLError(f"parameter {name}: annotation {raw!r} is not a tensorfuse type; use "
                   'T.Tensor["M", "N", "f32"] or a scalar type such as T.f32', loc)


def make_params(fn: Callable, scope: dict | None = None) -> list:
    loc = _def_location(fn)
    params = []
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise DSLError(f"kernels take named parameters only, not *{name} / **{name}", loc)
        ann = _annotation(fn, name, p.annotation, loc, scope)
        if isinstance(ann, TensorType):
            params.append(TensorParam(name, ann.dims, ann.dtype, loc))
        else:
            params.append(ScalarParam(name, ann.dtype, loc))
    return params


def _run_capturing_locals(fn: Callable, args: list) -> tuple[object, list[dict]]:
    """Call ``fn``; return its result and the local variables of ``fn`` and of every user helper it
    called, each taken when that frame returned (``fn``'s first), so values computed in helpers keep
    the names the helpers gave them."""
    from .expr import _is_internal

    kernel_locals: dict = {}
    helper_locals: list[dict] = []
    target = fn.__code__
    previous = sys.getprofile()

    def profiler(frame, event, arg):
        if event == "return":
            if frame.f_code is target:
                kernel_locals.update(frame.f_locals)
            elif not _is_internal(frame.f_code.co_filename) and frame.f_code.co_name != "<lambda>":
                helper_locals.append(dict(frame.f_locals))
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(profiler)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(previous)
    return result, [kernel_locals] + helper_locals


def trace(fn: Callable, name: str | None = None, scope: dict | None = None) -> Program:
    """Trace ``fn`` into a Program. Raises a :class:`~tensorfuse.errors.DSLError` naming the line of
    ``fn`` that is at fault. ``scope``: the local names where ``fn`` was defined (its annotations,
    when they are strings, may use them)."""
    prog.axis_binding_sites.clear()
    prog.axis_size_constraints.clear()
    params = make_params(fn, scope)
    proxies = [p if isinstance(p, TensorParam) else Scalar(p.name, p.dtype, p.loc) for p in params]
    try:
        result, local_vars = _run_capturing_locals(fn, proxies)
    except NameError as exc:
        loc = _failing_user_line(exc)
        raise AxisError(f"{exc}; if it is an index variable, declare it first with "
                        f"T.axes(\"...\")", loc) from None
    constraints = list(prog.axis_size_constraints)
    builder = _ProgramBuilder(params, local_vars, _def_location(fn))
    return builder.build(name or fn.__name__, result, constraints)


def _failing_user_line(exc: BaseException) -> SourceLocation | None:
    import linecache

    tb = exc.__traceback__
    loc = None
    while tb is not None:
        f = tb.tb_frame
        if "tensorfuse" not in f.f_code.co_filename.split("/")[-2:-1]:
            loc = SourceLocation(f.f_code.co_filename, tb.tb_lineno,
                                 linecache.getline(f.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    return loc


class _ProgramBuilder:
    """Decides which expressions become computes and rewrites expressions to reference them."""

    def __init__(self, params, frames: list[dict], loc: SourceLocation):
        self.params = params
        self.loc = loc
        self.names: dict[int, str] = {}
        for local_vars in frames:
            for var, value in local_vars.items():
                if isinstance(value, Expr) and not isinstance(
                        value, (Axis, Const, Scalar, DimSize, Load)) and var.isidentifier():
                    self.names.setdefault(value.uid, var)
        self.taken = {p.name for p in params}
        self.computes: list[Compute] = []
        self.by_uid: dict[int, Compute] = {}      # expression uid -> compute holding it
        self.by_spec: dict[int, Compute] = {}     # reduction spec uid -> compute
        self.rewritten: dict[int, Expr] = {}
        self.context: str | None = None

    def _fresh(self, hint: str) -> str:
        name, k = hint, 1
        while name in self.taken:
            k += 1
            name = f"{hint}_{k}"
        self.taken.add(name)
        return name

    def build(self, name: str, result, constraints) -> Program:
        outs = result if isinstance(result, tuple) else (result,)
        if result is None or not outs:
            raise DSLError("the kernel returns nothing; return the output expression(s)", self.loc)
        for k, value in enumerate(outs):
            if not isinstance(value, Expr):
                raise DSLError(f"output {k} is a {type(value).__name__}, not a tensor expression",
                               self.loc)
            if not value.axes and not _reduces(value):
                raise DSLError(f"output {k} has no axes and reduces nothing (a number made of "
                               "scalars alone); an output is indexed by axes, or reduces over "
                               "them (T.sum(x[i, j], over=(i, j)): a tensor of shape [])",
                               value.loc)
        storages = [_output_dtype(v) for v in outs]
        for k, (value, storage) in enumerate(zip(outs, storages)):
            if value.uid not in self.names and not (isinstance(value, Reduce) and (
                    dt.resolve(value.dtype) != storage or value.spec.monoid.arity > 1)):
                self.names[value.uid] = "out" if len(outs) == 1 else f"out{k}"
        for k, value in enumerate(outs):  # materialise what the outputs need, in any order
            self._within(self.names.get(value.uid, "out" if len(outs) == 1 else f"out{k}"), value)
        outputs = [self._output(v, s, k, len(outs)) for k, (v, s) in enumerate(zip(outs, storages))]
        for a in {a.uid: a for c in self.computes for a in c.axes + c.over}.values():
            if a.extent is None:
                raise AxisError(f"the size of axis {a.name} is unknown: it never indexes a tensor "
                                f"dimension directly; declare it with T.axis(\"{a.name}\", size)",
                                a.loc)
        axes = sorted({a.uid: a for c in self.computes for a in c.axes + c.over}.values(),
                      key=lambda a: a.uid)
        self._check_sizes_are_bound(axes, constraints)
        return Program(name, self.params, self.computes, outputs, axes, constraints, self.loc)

    def _check_sizes_are_bound(self, axes: list[Axis], constraints: list) -> None:
        """Every named size an axis or ``T.size`` uses must be a dimension of a tensor parameter
        (sizes are bound from the call's tensors' shapes) or a size derived from those (the
        expressions among ``constraints``, each reading earlier ones): else an error naming the axis or
        expression, the size, and how to bind it — at definition, not as a bare KeyError at the
        first call."""
        known = {d for p in self.params if isinstance(p, TensorParam) for d in p.dims
                 if isinstance(d, str)}
        for name, expr, loc in constraints:   # derived sizes, in order
            if isinstance(expr, Expr):
                unbound = [n for n in prog.size_names(expr) if n not in known]
                if unbound:
                    raise AxisError(
                        f"size {name} reads T.size({unbound[0]!r}), which no tensor parameter "
                        f"has as a dimension (the named ones here: "
                        f"{', '.join(sorted(known)) or 'none'})", loc)
                known.add(name)
        where = ", ".join(sorted(known)) or "none"
        for a in axes:
            if isinstance(a.extent, str) and a.extent not in known:
                raise AxisError(
                    f"axis {a.name} has size {a.extent!r}, which no tensor parameter has as a "
                    f"dimension (sizes come from the call's tensors; the named ones here: "
                    f"{where}): give it a number, T.axis({a.name!r}, 16), or use a dimension "
                    f"a tensor has", a.loc)
        for c in self.computes:
            sizes: list[DimSize] = []
            for body in c.bodies:
                walk(body, lambda n: sizes.append(n) if isinstance(n, DimSize) else None)
            for n in sizes:
                if n.name not in known:
                    raise AxisError(
                        f"T.size({n.name!r}) in {c.name}: no tensor parameter has a dimension "
                        f"named {n.name!r} (the named ones: {where}), so no call can give its "
                        "value", n.loc or c.loc)

    def _output(self, value: Expr, storage: str, k: int, count: int) -> Compute:
        existing = None
        if isinstance(value, Reduce) and value.spec.monoid.arity == 1:
            existing = self.by_spec[value.spec.uid]
        elif value.uid in self.by_uid:
            existing = self.by_uid[value.uid]
        if existing is not None and existing.dtypes[0] == storage and not existing.is_output:
            compute = existing
        else:
            hint = self.names.get(value.uid, "out" if count == 1 else f"out{k}")
            body = existing.ref() if existing is not None else self._within(hint, value)
            named = existing is not None and value.uid in self.names and self.names[value.uid] == \
                existing.name
            compute = self._add(Compute(self._fresh(hint + "_out" if named else hint),
                                        value.axes, (body,), (storage,), loc=value.loc))
        compute.is_output = True
        return compute

    def _add(self, compute: Compute) -> Compute:
        self.computes.append(compute)
        return compute

    def _reduction(self, node: Reduce) -> Compute:
        spec = node.spec
        if spec.uid in self.by_spec:
            return self.by_spec[spec.uid]
        bodies = tuple(self._rewrite(b) for b in spec.bodies)
        hint = self.names.get(node.uid) or self._hint_for(spec)
        dtypes = spec.monoid.dtypes_for([dt.resolve(b.dtype) for b in spec.bodies])
        compute = self._add(Compute(self._fresh(hint), node.axes, bodies, tuple(dtypes),
                                    spec.monoid, spec.over, spec.loc))
        self.by_spec[spec.uid] = compute
        return compute

    def _hint_for(self, spec) -> str:
        """Name of an unnamed reduction: after the value it is part of (``out_sum``), else after
        its monoid and axes (``sum_j``)."""
        if self.context:
            return f"{self.context}_{spec.monoid.name}"
        return f"{spec.monoid.name}_{'_'.join(a.name for a in spec.over)}"

    def _within(self, name: str | None, expr: Expr) -> Expr:
        """Rewrite the top of a value called ``name`` (unnamed reductions inside are named after it)."""
        saved, self.context = self.context, name
        try:
            return self._rewrite(expr, top=True)
        finally:
            self.context = saved

    def _rewrite(self, expr: Expr, top: bool = False) -> Expr:
        """Replace reductions and named sub-expressions by references to their computes."""
        if expr.uid in self.rewritten and not top:
            return self.rewritten[expr.uid]
        if isinstance(expr, Reduce):
            compute = self._reduction(expr)
            out: Expr = Ref(compute, expr.index, expr.loc)
        elif not top and expr.uid in self.names and expr.uid not in self.by_uid and \
                not _is_index_like(expr):
            body = self._within(self.names[expr.uid], expr)
            compute = self._add(Compute(self._fresh(self.names[expr.uid]), expr.axes, (body,),
                                        (dt.resolve(expr.dtype),), loc=expr.loc))
            self.by_uid[expr.uid] = compute
            out = Ref(compute, 0, expr.loc)
        elif not top and expr.uid in self.by_uid:
            out = Ref(self.by_uid[expr.uid], 0, expr.loc)
        else:
            kids = expr.children()
            new = [self._rewrite(k) for k in kids]
            out = expr if all(a is b for a, b in zip(kids, new)) else expr.rebuild(new)
            if isinstance(out, Symbol):
                raise DSLError("a monoid placeholder escaped into a kernel", expr.loc)
        if not top:
            self.rewritten[expr.uid] = out
        return out


def _reduces(expr: Expr) -> bool:
    """Whether ``expr`` holds a reduction (an output over no axis is one: a loss's mean, a
    tensor's largest magnitude)."""
    found = []
    walk(expr, lambda n: found.append(n) if isinstance(n, Reduce) else None)
    return bool(found)


def _is_index_like(expr: Expr) -> bool:
    """Integer and boolean values without reductions (index arithmetic, masks) are recomputed where
    they are used rather than stored: cheap, and it keeps indices affine for TVM's analyses."""
    if dt.is_float(expr.dtype):
        return False
    found = []
    walk(expr, lambda n: found.append(n) if isinstance(n, (Reduce, Ref)) else None)
    return not found


def _output_dtype(value: Expr) -> str:
    """Outputs are stored in the widest floating type among the tensors they read; integer and
    boolean results keep their type; an explicit T.cast at the top decides for itself."""
    from .expr import Cast

    if isinstance(value, Cast):
        return value.dtype
    if not dt.is_float(value.dtype):
        return dt.resolve(value.dtype)
    storages: list[str] = []

    def visit(node):
        if isinstance(node, Load) and dt.is_float(node.param.dtype):
            storages.append(node.param.dtype)

    walk(value, visit)
    return dt.widest_storage(storages) or dt.resolve(value.dtype)
