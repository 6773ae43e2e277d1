"""Sums down the rows that a row kernel adds up in its own pass: a norm's weight and bias
gradients (``d_weight[j] = Σ_i d_out[i, j] · x̂[i, j]``) beside the row reductions of its input
gradient.

Such a sum reduces over every row a launch visits — the plan's row axis and its batch axes —
and keeps the swept axis; its body at ``(i, j)`` needs the chain's final values of row ``i``, so
it is evaluated where the outputs are, after the row's reductions. Each program of the row
kernel sweeps several row tiles (``Knobs.row_tiles``), adds their contributions up per column
in registers and stores one partial row; a second, small kernel in the same source adds the
partials and writes the outputs that read the sums (their epilogue: a cast, a column operand).
Without this the floor ran the sums as a kernel of their own, reading the rows a second time
(``benchmarks.rows_backward``: RMSNorm's and layer norm's backward).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra import inline_elementwise
from ..algebra.exprs import nodes
from ..dsl.expr import Expr, Ref
from ..dsl.program import Compute
from ..errors import TargetError
from ..targets.triton.reductions import reducible


@dataclass(frozen=True)
class ColumnSum:
    """``compute[col] = monoid over (batch, row) of body``: ``body`` per element of the row
    tile, the chain's members read as :class:`Ref` (their final values)."""

    compute: Compute
    body: Expr

    @property
    def name(self) -> str:
        return self.compute.name

    @property
    def monoid(self):
        return self.compute.monoid


def column_sum(x: Compute, plan) -> ColumnSum:
    """``x`` as a sum down the rows of ``plan`` (a :class:`~.tile_plan.RowTilePlan` whose axes
    and mask are set), or a :class:`TargetError` that says why it is not one."""
    why = _why_not(x, plan)
    if why:
        raise TargetError(f"{x.name} is a reduction outside the chain that the row kernel cannot "
                          f"add up in its pass: {why}")
    return ColumnSum(x, inline_elementwise(x.bodies[0]))


def _why_not(x: Compute, plan) -> str | None:
    members = {m.name for m in plan.chain.members}
    rows = {plan.row.uid} | {a.uid for a in plan.batch}
    if x.arity != 1 or not reducible(x.monoid):
        return f"{x.monoid.name} reductions are not added up per column"
    if plan.locals or any(sp.contraction for sp in plan.states) or plan.mask is not None \
            or plan.fold is not None:
        return "the chain has tensor-core products or a mask"
    if [a.uid for a in x.axes] != [plan.col.uid]:
        return f"it is over {', '.join(a.name for a in x.axes) or 'nothing'}, not the swept " \
            f"axis {plan.col.name} alone"
    if {a.uid for a in x.over} != rows:
        return f"it reduces over {', '.join(a.name for a in x.over)}, not over every row the " \
            f"kernel visits ({', '.join(a.name for a in plan.batch + [plan.row])})"
    body = inline_elementwise(x.bodies[0])
    outside = sorted({n.compute.name for n in nodes(body)
                      if isinstance(n, Ref) and n.compute.name not in members})
    if outside:
        return f"it reads {', '.join(outside)}, outside the chain"
    if not {a.uid for a in body.axes} <= rows | {plan.col.uid}:
        return "it reads an axis the row tile does not hold"
    return None


def output_reads(expr: Expr, members: set) -> tuple[set, dict]:
    """(names of the chain members, other reductions by name) that an output's expression
    reads."""
    refs = {n.compute.name: n.compute for n in nodes(expr) if isinstance(n, Ref)}
    return {n for n in refs if n in members}, {n: c for n, c in refs.items() if n not in members}
