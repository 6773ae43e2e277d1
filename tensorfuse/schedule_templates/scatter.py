"""Sums whose every term lands on one output element chosen by an index: the scatter-add that
the gradient of a gathered read is (an embedding's ``emb[tokens[i], d]``, a segment's
``x[starts[g] + r, d]``).

``tf.grad`` writes such a gradient as a sum over the gather's axes of a one-hot condition on
the output's axis, ``d_x[x, d] = Σ_{g, r} where(starts[g] + r == x, v[g, r, d], 0)``: as a dense
reduction, every output element visits every term (a segment mean's backward over 134k rows and
2048 segments of up to 128: 10¹⁶ terms). Read the other way round it is one pass over the terms,
each added into the element its index names. :func:`plan_scatter` recognises that form: one sum
whose body is ``where(index == a, value, 0)`` (under any further conditions) for an axis ``a``
of the sum's result that neither the index nor the value reads; the program's other computes
are elementwise, before the sum (inlined into its value) or after it (the outputs' epilogue).
The emitter (:mod:`tensorfuse.targets.triton.scatter`) adds each term with an atomic add into
an f32 accumulator: indices that repeat (an embedding's tokens) sum in no fixed order, so their
last bits can differ between runs. An integer sum (a histogram's counts) accumulates in its own
integer type: exact, in any order.

Where the index takes far fewer positions than the output's axis has elements (an embedding's
8192 tokens over a vocabulary of 128256), an accumulator the output's size is mostly zeros
written, read and converted. The plan then **compacts** (:meth:`ScatterPlan.compacts`): every
output element the index names claims one slot (the lowest position that names it, by an atomic
minimum), the terms are added into an accumulator of slots, and the outputs read their slot or
zero. The accumulator shrinks from the output's size to the positions' (the embedding's: 2.1 GB
of f32 to 134 MB).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..algebra import inline_elementwise
from ..algebra.exprs import conjuncts, nodes
from ..dsl import dtypes as dt
from ..dsl.expr import Axis, Compare, Const, Expr, Ref, Where
from ..dsl.printer import to_text
from ..dsl.program import Compute, Program
from ..errors import TargetError


@dataclass(frozen=True)
class ScatterPlan:
    """``total[..., a, ...] += value`` at ``a = index``, for every term of ``total``'s reduced
    axes and its other axes where ``conditions`` hold; then ``outputs`` (compute, expression over
    ``total``'s axes reading it as a :class:`Ref`)."""

    program: Program
    total: Compute
    axis: Axis
    index: Expr
    value: Expr
    conditions: tuple
    outputs: tuple

    @property
    def terms(self) -> tuple[Axis, ...]:
        """The axes a term runs over: the sum's reduced axes, then its other result axes (the
        innermost last: a row of the value read along it)."""
        return tuple(self.total.over) + tuple(a for a in self.total.axes
                                              if a.uid != self.axis.uid)

    @property
    def positions(self) -> tuple[Axis, ...] | None:
        """The axes the index reads, where they are all summed over (each position of them then
        names one output element for every value of the kept axes); ``None`` where the index reads
        a kept axis too."""
        over = {a.uid for a in self.total.over}
        reads = {a.uid for a in self.index.axes}
        if not reads <= over:
            return None
        return tuple(a for a in self.total.over if a.uid in reads)

    def compacts(self, extent) -> bool:
        """Whether the sums go through slots (the module's docstring): the index takes at most
        half as many positions as the output's axis has elements. ``extent(axis)`` is an axis's
        size: an int, or a size as a kernel argument (the comparison then guards the build)."""
        if self.positions is None:
            return False
        positions = math.prod(extent(a) for a in self.positions)
        return bool(2 * positions <= extent(self.axis)) and bool(positions < 2**31)

    @property
    def accumulator(self) -> str:
        """The accumulator's element type: the sum's own where it is ``i32``, ``i64`` or
        ``f64`` (exact counts in any order; as precise as asked), ``i32`` for a sum of narrower
        integers, else ``f32``."""
        total = dt.resolve(self.total.dtypes[0])
        return total if total in ("i32", "i64", "f64") else "i32" if dt.is_int(total) else "f32"

    def describe(self) -> str:
        where = "".join(f" where {to_text(c)}" for c in self.conditions)
        return (f"scatter-add plan of {self.program.name}: {self.total.name}[{self.axis.name} = "
                f"{to_text(self.index)}] += {to_text(self.value)}{where}, over "
                f"{', '.join(a.name for a in self.terms)} (atomic adds into {self.accumulator}"
                + (f"; slots where {', '.join(a.name for a in self.positions)} take at most "
                   f"half of {self.axis.name}" if self.positions is not None else "")
                + "); outputs: "
                + ", ".join(c.name for c, _ in self.outputs))


def plan_scatter(program: Program) -> ScatterPlan:
    """The scatter-add plan of ``program``, or a :class:`TargetError` that says why it has none."""
    sums = [c for c in program.computes if c.is_reduction]
    if len(sums) != 1:
        raise TargetError(f"{len(sums)} reductions; a scatter-add program has one")
    total = sums[0]
    if total.monoid.name != "sum" or total.arity != 1:
        raise TargetError(f"{total.name} is a {total.monoid.name}, not a sum")
    body = inline_elementwise(total.bodies[0])
    conditions = []
    while isinstance(body, Where) and isinstance(body.b, Const) and body.b.value == 0:
        conditions += conjuncts(body.cond)   # (x[j] == k) & valid[j]: the index's and another
        body = body.a
    kept = {a.uid for a in total.axes}
    found = None
    for k, cond in enumerate(conditions):
        if isinstance(cond, Compare) and cond.op == "eq":
            for axis, index in ((cond.b, cond.a), (cond.a, cond.b)):
                if isinstance(axis, Axis) and axis.uid in kept and \
                        axis.uid not in {a.uid for a in index.axes}:
                    found = (k, axis, index)
                    break
        if found:
            break
    if found is None:
        raise TargetError(f"{total.name} has no condition 'index == axis' on an axis of its "
                          "result")
    k, axis, index = found
    rest = tuple(c for j, c in enumerate(conditions) if j != k)
    if any(axis.uid in {a.uid for a in e.axes} for e in (body,) + rest):
        raise TargetError(f"the value added into {total.name} reads {axis.name} itself")
    reduced = {a.uid for a in total.over}
    for c in rest:   # (j <= i) & (e[j] == k): a running count per k, every (i, j) a term
        read = {a.uid for a in c.axes}
        if read & reduced and read & (kept - {axis.uid}):
            raise TargetError(f"{to_text(c)} relates a summed axis to one of {total.name}'s "
                              "result: a range (a scan), not a scatter")
    return ScatterPlan(program, total, axis, index, body, rest, outputs_over(program, total))


def outputs_over(program: Program, total: Compute) -> tuple:
    """``(compute, expression)`` of each of ``program``'s outputs, where every one is
    elementwise over ``total``'s result (``total`` itself, or an expression of it as a
    :class:`Ref` and of reads at its axes: a cast, a scale); else :class:`TargetError`."""
    kept = {a.uid for a in total.axes}
    outputs = []
    for c in program.outputs:
        expr = Ref(c, 0, c.loc) if c is total else \
            inline_elementwise(c.bodies[0]) if not c.is_reduction else None
        reads = {n.compute.name for n in nodes(expr) if isinstance(n, Ref)}
        if reads != {total.name} or {a.uid for a in c.axes} != kept:
            raise TargetError(f"output {c.name} is not elementwise over {total.name}'s result")
        outputs.append((c, expr))
    return tuple(outputs)
