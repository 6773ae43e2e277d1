"""Small expression utilities for the algebra: constant-folding constructors, substitution, queries.

The algebra builds its corrections as ordinary DSL expressions, so they print readably, evaluate in
NumPy and lower to TensorIR like any kernel code.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

from ..dsl import dtypes as dt
from ..dsl.expr import (Axis, Binary, Const, Expr, Ref, Symbol, Unary, binary, compare, unary,
                        walk, where)

ONE_KEY = ("one",)


def const(value: float) -> Const:
    return Const(float(value), dt.WEAK_FLOAT, None)


def is_const(e: Expr, value: float | None = None) -> bool:
    return isinstance(e, Const) and (value is None or e.value == value)


def add(a: Expr, b: Expr) -> Expr:
    if is_const(a, 0):
        return b
    if is_const(b, 0):
        return a
    if is_const(a) and is_const(b):
        return const(a.value + b.value)
    if isinstance(b, Unary) and b.op == "neg":
        return sub(a, b.a)
    return binary("add", a, b, a.loc)


def neg(a: Expr) -> Expr:
    if is_const(a):
        return const(-a.value)
    if isinstance(a, Unary) and a.op == "neg":
        return a.a
    return unary("neg", a, a.loc)


def sub(a: Expr, b: Expr) -> Expr:
    if is_const(b, 0):
        return a
    if a.key() == b.key():
        return const(0.0)
    if is_const(a, 0):
        return neg(b)
    if is_const(a) and is_const(b):
        return const(a.value - b.value)
    if _is_neg(a) and _is_neg(b):
        return sub(b.a, a.a)
    if _is_neg(b):
        return add(a, b.a)
    return binary("sub", a, b, a.loc)


def _is_neg(e: Expr) -> bool:
    return isinstance(e, Unary) and e.op == "neg"


def mul(a: Expr, b: Expr) -> Expr:
    if is_const(a, 1):
        return b
    if is_const(b, 1):
        return a
    if is_const(a, 0) or is_const(b, 0):
        return const(0.0)
    if is_const(a) and is_const(b):
        return const(a.value * b.value)
    if is_const(b, -1):
        return neg(a)
    if is_const(a, -1):
        return neg(b)
    return binary("mul", a, b, a.loc)


def div(a: Expr, b: Expr) -> Expr:
    if is_const(b, 1):
        return a
    if is_const(a) and is_const(b) and b.value != 0:
        return const(a.value / b.value)
    return binary("div", a, b, a.loc)


def simplify(e: Expr) -> Expr:
    """Fold constants bottom-up (``x·1``, ``x − x``, ``exp(0)``, ...) so corrections read well."""
    def replace(n: Expr):
        if isinstance(n, Binary) and n.op in _FOLD:
            return _FOLD[n.op](simplify(n.a), simplify(n.b))
        if isinstance(n, Unary):
            inner = simplify(n.a)
            if n.op == "neg":
                return neg(inner)
            if n.op in ("exp", "exp2") and is_const(inner, 0):
                return const(1.0)
            return None if inner is n.a else unary(n.op, inner, n.loc)
        return None

    return substitute(e, replace)


def product_basis(a: Expr, b: Expr) -> Expr:
    """``a * b`` with the operands in a canonical order, so equal products get equal keys."""
    if is_const(a, 1):
        return b
    if is_const(b, 1):
        return a
    if repr(a.key()) > repr(b.key()):
        a, b = b, a
    return binary("mul", a, b, a.loc)


def substitute(e: Expr, replace: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``e`` bottom-up; ``replace(node)`` returns a replacement or ``None`` to keep it."""
    memo: dict[int, Expr] = {}

    def go(node: Expr) -> Expr:
        if node.uid in memo:
            return memo[node.uid]
        repl = replace(node)
        if repl is not None:
            out = repl
        else:
            kids = node.children()
            new = [go(k) for k in kids]
            out = node if all(a is b for a, b in zip(kids, new)) else node.rebuild(new)
        memo[node.uid] = out
        return out

    return go(e)


def rewrite_computes(program, replace: Callable[[Expr], Expr | None], axes=None,
                     over=None, bodies=None, expand=None) -> dict:
    """``program``'s computes rebuilt in order (by name): ``replace`` substituted in their
    bodies (:func:`substitute`), a read of another compute pointing at its rebuilt one, and
    ``axes(c)`` / ``over(c)`` where given for their axes, ``bodies(c, rebuilt bodies)`` for
    their bodies (asked before ``over(c)``, which may depend on what it found) — what a
    rewrite of a whole program (packing rows, lifting or flattening axes, a band's window,
    nested reductions) builds its new program from. ``expand(c)``, where given and not None,
    replaces ``c`` by computes of its own making (reading no other compute), the last one
    standing for ``c``."""
    from ..dsl.program import Compute

    made: dict = {}

    def node(n: Expr):
        if isinstance(n, Ref):
            return Ref(made[n.compute.name], n.component, n.loc)
        return replace(n)

    for c in program.computes:   # in dependency order: what a body reads is rebuilt first
        stages = expand(c) if expand else None
        if stages:
            made.update({s.name: s for s in stages[:-1]})
            made[c.name] = stages[-1]
            continue
        rebuilt = tuple(substitute(b, node) for b in c.bodies)
        made[c.name] = Compute(c.name, axes(c) if axes else c.axes,
                               bodies(c, rebuilt) if bodies else rebuilt, c.dtypes, c.monoid,
                               over(c) if over else c.over, c.loc, c.is_output)
    return made


def finite_shift(top: Expr, acc: str) -> Expr:
    """``where(|top| < ∞, top, 0)``: what a logsumexp written for the templates takes its sum
    relative to (:mod:`tensorfuse.schedule_templates.monoid_rewrites`) — its maximum ``top``,
    or 0 where that is infinite, never the NaN of ``x − ∞``."""
    return where(compare("lt", unary("abs", top), Const(math.inf, acc)), top, Const(0.0, acc))


def rewritten_program(program, params: list, made: dict, name: str | None = None):
    """The program of ``made`` (:func:`rewrite_computes`' computes, in order) reading ``params``:
    its outputs those of ``program`` rebuilt, its axes the ones the computes use, its sizes'
    constraints and derived sizes ``program``'s; named ``name`` (default ``program``'s) — what a
    rewrite of a whole program returns."""
    from ..dsl.program import Program

    computes = list(made.values())
    used = {a.uid: a for c in computes for a in c.axes + c.over}
    return Program(name or program.name, params, computes,
                   [made[c.name] for c in program.outputs],
                   sorted(used.values(), key=lambda a: a.uid), list(program.size_constraints),
                   program.loc)


def nodes(e: Expr) -> list[Expr]:
    found: list[Expr] = []
    walk(e, found.append)
    return found


def factors(e: Expr) -> list[Expr]:
    """The factors of a product (``e`` itself when it is not one)."""
    if isinstance(e, Binary) and e.op == "mul":
        return factors(e.a) + factors(e.b)
    return [e]


def conjuncts(e: Expr) -> list[Expr]:
    """The terms of a conjunction ``a & b & …`` in order (``e`` itself when it is not one)."""
    if isinstance(e, Binary) and e.op == "and":
        return conjuncts(e.a) + conjuncts(e.b)
    return [e]


def has_axis(e: Expr, axis: Axis) -> bool:
    return any(a.uid == axis.uid for a in e.axes)


def refs_to(e: Expr, names: Iterable[str]) -> set[str]:
    names = set(names)
    return {n.compute.name for n in nodes(e) if isinstance(n, Ref) and n.compute.name in names}


def symbols_in(e: Expr) -> set[str]:
    return {n.name for n in nodes(e) if isinstance(n, Symbol)}


def float_dtype(e: Expr) -> str:
    d = dt.resolve(e.dtype)
    return d if dt.is_float(d) else "f32"


def as_binary(e: Expr, op: str) -> bool:
    return isinstance(e, Binary) and e.op == op


_FOLD = {"add": add, "sub": sub, "mul": mul, "div": div}


def linear_in(e: Expr, axis: Axis) -> tuple[Expr, Expr] | None:
    """``(coefficient, rest)`` with ``e == coefficient · axis + rest`` and neither depending on
    ``axis`` — through sums, negations, and products and quotients by factors free of it — or
    None where ``e`` is not linear in ``axis`` that way (a product of two terms reading it, a
    function of it, a load indexed by it). Integer index arithmetic is split as the reals: the
    kernels convert index values below 2^24 to f32 exactly."""
    if not has_axis(e, axis):
        return const(0.0), e
    if isinstance(e, Axis):
        return const(1.0), const(0.0)
    if isinstance(e, Unary) and e.op == "neg":
        inner = linear_in(e.a, axis)
        return None if inner is None else (neg(inner[0]), neg(inner[1]))
    if not isinstance(e, Binary) or e.op not in ("add", "sub", "mul", "div"):
        return None
    if e.op in ("add", "sub"):
        a, b = linear_in(e.a, axis), linear_in(e.b, axis)
        if a is None or b is None:
            return None
        combine = add if e.op == "add" else sub
        return combine(a[0], b[0]), combine(a[1], b[1])
    if e.op == "mul" and not has_axis(e.a, axis):
        inner = linear_in(e.b, axis)
        return None if inner is None else (mul(e.a, inner[0]), mul(e.a, inner[1]))
    if not has_axis(e.b, axis):   # a product or quotient by a factor free of the axis
        inner = linear_in(e.a, axis)
        if inner is None:
            return None
        by = mul if e.op == "mul" else div
        return by(inner[0], e.b), by(inner[1], e.b)
    return None
