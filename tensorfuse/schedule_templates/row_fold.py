"""Grouped heads folded into one row tile: a head axis that the keys and values read only as
``h // G`` (grouped-query attention) puts the G heads of a group in the rows of one tile, so a
program reads its keys and values once for the whole group instead of once per head.

Used by the row-tile plan (:mod:`.tile_plan`) and by the attention backward, which reduces the
keys' and values' gradients over the same groups.
"""
from __future__ import annotations

from ..algebra.exprs import substitute
from ..dsl.evaluate import evaluate_plain
from ..dsl.expr import Axis, Binary, Const, Expr, Symbol

MAX_FOLDED_ROWS = 64


def group_of(e: Expr, axis: Axis, sizes: dict) -> set:
    """The divisors ``g`` of every use of ``axis`` in ``e`` as ``axis // g`` (0 for a bare use)."""
    found = set()

    def visit(n: Expr):
        if isinstance(n, Binary) and n.op == "floordiv" and isinstance(n.a, Axis) and \
                n.a.uid == axis.uid:
            resolved = substitute(n.b, lambda x: Const(sizes[x.name], "i32")
                                  if x.__class__.__name__ == "DimSize" else None)
            try:
                found.add(int(evaluate_plain(resolved, {})))
            except Exception:  # noqa: BLE001 - not a constant: no fold
                found.add(0)
            return
        if isinstance(n, Axis) and n.uid == axis.uid:
            found.add(0)
            return
        for c in n.children():
            visit(c)

    visit(e)
    return found


def row_fold(plan) -> tuple[Axis, int] | None:
    """``(head axis, G)`` to fold into ``plan``'s row tiles (a :class:`.tile_plan.RowTilePlan`,
    which imports this module), or None: with few query rows and a head axis that the column
    operands (keys, values) read only as ``h // G`` (grouped-query attention), the G heads of a
    group share one row tile, so each program reads its keys and values once for the whole
    group instead of once per head. Without a query axis the group is the rows, at any size
    (several row tiles where it is larger than one)."""
    unit = all(a.uid != plan.row.uid for a in plan.chain.common_axes)   # row_roles' own axis
    if not unit and plan.sizes_of(plan.row) * 2 > MAX_FOLDED_ROWS:
        return None
    col_side = plan.column_sides
    if not col_side:
        return None
    for a in plan.batch:
        groups = set().union(*(group_of(e, a, plan.sizes) for e in col_side))
        if len(groups) == 1 and (g := groups.pop()) > 1 and plan.sizes_of(a) % g == 0 and \
                (unit or plan.sizes_of(plan.row) * g <= MAX_FOLDED_ROWS):
            return a, g
    # no group shares the keys (every head has its own): one row per program, the last batch
    # axis the keys read only as itself folded with groups of one, so the tile's rows past the
    # first are masked
    bare = [a for a in plan.batch
            if set().union(*(group_of(e, a, plan.sizes) for e in col_side)) == {0}]
    return (bare[-1], 1) if unit and bare else None


def grouped(e: Expr, fold) -> Expr:
    """Column-side operand with ``h // G`` (``h`` itself for groups of one) replaced by the group
    index (a program constant)."""
    axis, g = fold
    group = Symbol(f"__group_{axis.name}", "i32")
    return substitute(e, lambda n: group if g > 1 and isinstance(n, Binary) and
                      n.op == "floordiv" and isinstance(n.a, Axis) and n.a.uid == axis.uid or
                      g == 1 and isinstance(n, Axis) and n.uid == axis.uid else None)
