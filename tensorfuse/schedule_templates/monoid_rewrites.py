"""Reductions whose monoid no GPU template keeps as a running state, written as ones they do.

- ``T.logsumexp`` (one monoid, ``log(eᵃ + eᵇ)`` folded element by element) becomes its maximum
  ``m``, ``Σ exp(x − m)`` and ``log(Σ) + m`` — the chain softmax, cross-entropy and attention
  write themselves, which the row template fuses into one pass. Where ``m`` is ±∞ (a row of
  −∞, an infinite element) the sum is taken relative to 0: −∞ or +∞ as logsumexp gives them,
  never the NaN of ``x − m``.
- ``T.argmax`` / ``T.argmin`` and ``T.max_argmax`` (a (value, index) pair) become the extremum
  of the values (NaN left out, as the pair's comparisons leave it) and the smallest index
  holding it, where the pair ran on TVM's untiled default schedule: one pass of the row
  template, the index reset where the extremum moves (a ``reset`` scheme, compared with the
  extremum's running value itself: ``schemes.dependency_symbols``); where no template takes it whole, two
  row reductions (the floor's stages). Not where the values add to a product
  (:func:`_contractible`): two kernels might round them differently; nor over the columns of
  a contraction's sums, which the contraction template keeps as pairs in one pass.

Each keeps the original's value: the CPU lowering computes the monoids as written, and the
rewritten programs are checked against it and against float64 (``tests/schedule_templates/
test_monoid_rewrites.py``).
"""
from __future__ import annotations

import math

import numpy as np

from ..algebra import inline_elementwise
from ..algebra.exprs import finite_shift, substitute
from ..dsl import dtypes as dt
from ..dsl.expr import Binary, Const, Ref, binary, compare, unary, where
from ..dsl.monoid import MAX, MIN, SUM
from ..dsl.program import Compute, Program, fresh_name
from ..errors import ScheduleError

EXTREMA = {"argmax": MAX, "argmin": MIN}


def rewritten_monoids(program: Program) -> tuple[Program, str] | None:
    """``program`` with each logsumexp and arg reduction written as above (the reductions it
    adds named after the original), and a note naming them; ``None`` where it has none (or an
    arg reduction is itself an output)."""
    logsumexps = [c.name for c in program.computes if c.is_reduction and
                  c.monoid.name == "logsumexp" and c.arity == 1]
    args = [c.name for c in program.computes if c.is_reduction and c.monoid.name in EXTREMA
            and not _contractible(inline_elementwise(c.bodies[0]))]
    if args:   # those the contraction template keeps as they are
        args = [n for n in args if n not in _over_contraction_columns(program)]
    if not logsumexps and not args or any(c.name in args for c in program.outputs):
        return None
    taken = {c.name for c in program.computes} | {p.name for p in program.params}
    made: dict[tuple[str, int], Compute] = {}   # (name, component) -> (compute, its component)
    computes: list[Compute] = []

    def read(n):
        if not isinstance(n, Ref):
            return None
        compute, component = made[(n.compute.name, n.component)]
        return Ref(compute, component, n.loc)

    for c in program.computes:
        bodies = tuple(substitute(b, read) for b in c.bodies)
        if c.name in logsumexps:
            added = _logsumexp(c, bodies[0], taken)
            made[(c.name, 0)] = (added[-1], 0)
        elif c.name in args:
            added = _arg(c, bodies, taken)
            made[(c.name, 0)], made[(c.name, 1)] = (added[0], 0), (added[1], 0)
        else:
            added = [Compute(c.name, c.axes, bodies, c.dtypes, c.monoid, c.over, c.loc,
                             c.is_output)]
            made.update({(c.name, k): (added[0], k) for k in range(c.arity)})
        computes += added
    parts = [f"{', '.join(logsumexps)} written as max + log Σ exp(· − max)"] if logsumexps else []
    parts += [f"{', '.join(args)} written as the extremum, then the first index holding it"] \
        if args else []
    note = "; ".join(parts) + " (monoids no GPU template keeps as a running state)"
    outputs = [made[(c.name, 0)][0] for c in program.outputs]
    return Program(program.name, list(program.params), computes, outputs, list(program.axes),
                   list(program.size_constraints), program.loc), note


def _over_contraction_columns(program: Program) -> set:
    """The arg reductions the contraction template keeps as (value, index) states over the
    columns of its sums (a nearest centroid: ``argmin_j Σ_d (x − c)²``), where it plans the
    program: written out, the index would read the extremum — two passes over the columns, the
    sums stored between them."""
    from .contraction_plan import plan_contraction

    try:
        plan = plan_contraction(program)
    except ScheduleError:
        return set()
    return {r.name for r in plan.over_columns if r.monoid in EXTREMA}


def _contractible(e) -> bool:
    """Whether ``e`` adds to a product: a compiler may fuse them into one multiply-add in one
    kernel and not in another, and the index's kernel must compute every value to the bits the
    extremum's kernel did (its comparison is equality)."""
    if isinstance(e, Binary) and e.op in ("add", "sub") and any(
            isinstance(x, Binary) and x.op == "mul" for x in (e.a, e.b)):
        return True
    return any(_contractible(x) for x in e.children())


def _logsumexp(c: Compute, body, taken: set) -> list[Compute]:
    acc = "f64" if "f64" in (dt.resolve(body.dtype), c.dtypes[0]) else "f32"
    top = Compute(fresh_name(f"{c.name}_max", taken), c.axes, (body,), (acc,), MAX, c.over,
                  c.loc)
    shift = finite_shift(Ref(top, 0, c.loc), acc)
    sum_exp = Compute(fresh_name(f"{c.name}_sum_exp", taken), c.axes,
                      (unary("exp", binary("sub", body, shift)),), (acc,), SUM, c.over, c.loc)
    value = binary("add", unary("log", Ref(sum_exp, 0, c.loc)), shift)
    return [top, sum_exp, Compute(c.name, c.axes, (value,), c.dtypes, None, (), c.loc,
                                  c.is_output)]


def _arg(c: Compute, bodies, taken: set) -> list[Compute]:
    values, index = bodies
    extremum = EXTREMA[c.monoid.name]
    none = Const(int(np.iinfo(np.int32).max), c.dtypes[1])   # the pair's identity: no index
    kept, found = values, index
    if not dt.is_int(dt.resolve(c.dtypes[0])):
        # NaN never wins a comparison of the pair's: left out of the extremum too (|v| ≤ ∞ is
        # false for NaN alone; v == v would be simplified away as always true), and its index
        # left out again where the extremum is ±∞ (integers have no NaN)
        finite_or_infinite = compare("le", unary("abs", values), Const(math.inf, c.dtypes[0]))
        beyond = -math.inf if extremum is MAX else math.inf
        kept = where(finite_or_infinite, values, Const(beyond, c.dtypes[0]))
        found = where(finite_or_infinite, index, none)
    top = Compute(fresh_name(f"{c.name}_value", taken), c.axes, (kept,), (c.dtypes[0],),
                  extremum, c.over, c.loc)
    # the extremum's own body compared: a reduction's reset where its extremum moves is derived
    # from that
    first = where(compare("eq", kept, Ref(top, 0, c.loc)), found, none)
    at = Compute(fresh_name(f"{c.name}_index", taken), c.axes, (first,), (c.dtypes[1],), MIN,
                 c.over, c.loc)
    return [top, at]
