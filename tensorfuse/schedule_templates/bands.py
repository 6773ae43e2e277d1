"""Reductions over a band of positions around each output's own — a rolling maximum, a moving
sum, a local average: ``T.max(T.where((j <= i) & (j > i - 64), x[b, j], -T.inf), over=j)`` —
as reductions over a window axis of the band's width.

Written so, the reduction runs over every position ``j`` of the row and masks all but the band:
N terms an output where the band has W (the contraction template took a rolling maximum of 64
over rows of 65536 as every (i, j) pair: 1000× the work). :func:`band_window` finds the band —
two conditions on the reduction's one axis ``j`` against an axis ``i`` of its result of ``j``'s
extent, ``j ≤ i + hi`` and ``j ≥ i + lo`` with integer offsets (either side, ``<`` and ``>`` as
one less and more), gating the monoid's identity as a scan's condition does
(:mod:`.scan`) — and rewrites the reduction over a new axis ``k`` of ``hi − lo + 1`` elements,
``j = i + lo + k``, the positions before the row's start or past its end left out; everything
else of the program as it was (the original conditions stay: true inside the band). The
row-reduction template then sweeps ``k`` for rows ``(…, i)``, W terms an output."""
from __future__ import annotations

from ..algebra import inline_elementwise
from ..algebra.exprs import rewrite_computes, rewritten_program
from ..dsl.expr import Axis, Const, DimSize, compare, where
from ..dsl.program import Program
from .scan import peeled, relations


def band_window(program: Program) -> tuple[Program, str] | None:
    """``program`` with its one reduction over a band of positions rewritten over a window axis
    of the band's width, and a note saying so; else ``None``."""
    reductions = [c for c in program.computes if c.is_reduction]
    if len(reductions) != 1 or reductions[0].arity != 1 or len(reductions[0].over) != 1:
        return None
    total = reductions[0]
    j = total.over[0]
    _, conditions = peeled(inline_elementwise(total.bodies[0]), total)
    found = relations(conditions, j, total)
    for i in {r[1].uid: r[1] for r in found}.values():
        upper = [shift for _, axis, (direction, shift) in found
                 if axis.uid == i.uid and direction == "prefix"]
        lower = [shift for _, axis, (direction, shift) in found
                 if axis.uid == i.uid and direction == "suffix"]
        if upper and lower and min(upper) >= max(lower):
            return _windowed(program, total, j, i, max(lower), min(upper))
    return None


def _windowed(program: Program, total, j: Axis, i: Axis, lo: int, hi: int):
    """The rewrite: ``j = i + lo + k`` over ``k`` of ``hi − lo + 1`` elements, out-of-row
    positions the monoid's identity."""
    width = hi - lo + 1
    k = Axis(f"{j.name}_window", width, j.loc)
    at = (i + lo if lo > 0 else i - (-lo) if lo else i) + k
    extent = Const(j.extent, "i32") if isinstance(j.extent, int) else DimSize(j.extent)
    inside = compare("ge", at, Const(0, "i32")) & compare("lt", at, extent)
    identity = Const(total.monoid.identity_value(0, total.dtypes[0]), total.dtypes[0])
    made = rewrite_computes(
        program, lambda n: at if isinstance(n, Axis) and n.uid == j.uid else None,
        over=lambda c: (k,) if c is total else c.over,
        bodies=lambda c, b: (where(inside, b[0], identity),) if c is total else b)
    offset = f" {'+' if lo > 0 else '-'} {abs(lo)}" if lo else ""
    note = (f"{total.name} over the band {j.name} = {i.name}{offset} + {k.name} as a window "
            f"axis {k.name} of {width} (not every {j.name} of the row)")
    return rewritten_program(program, list(program.params), made), note
