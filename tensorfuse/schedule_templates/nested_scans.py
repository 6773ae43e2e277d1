"""Reductions over several axes whose conditions compare each reduced axis, on its own, with an
axis of the result — a summed-area table (an integral image) ``Σ_{j ≤ i, l ≤ k} x[b, j, l]``, a
running maximum over a grid's rows and columns, a 3-D prefix sum, a box or maximum filter
(``|j − i| <= 2`` and ``|l − k| <= 2``: a band an axis) — written as nested
reductions of one axis each: the innermost over the axis whose result axis lies innermost in
the result (a scan along the rows), each next one over the results of the one inside it (a scan
down them; the floor's stages, each taken by the scan or band template). Reduced axes compared
with nothing are reduced whole first, together (a cumulative sum of row sums: the rows' sums,
then their scan). An H × W image costs a few operations a pixel, not the H·W terms of every
pixel that the reduction as written asks of a template taking it whole.

Reducing over a product of ranges axis by axis is the same reduction for a monoid of one
commutative value (a sum, product, maximum or minimum). Conditions that read no reduced axis
wrap the outermost stage; a condition reading two reduced axes (``j <= l``), conditions on a
reduced axis none of which compares it with a result axis, no such comparison at all, or terms
that read a compared result axis (a distance weight) leave the program as it is."""
from __future__ import annotations

import operator
from functools import reduce

from ..algebra import inline_elementwise
from ..algebra.exprs import nodes, rewrite_computes, rewritten_program
from ..dsl import dtypes as dt
from ..dsl.expr import Const, Ref, where
from ..dsl.program import Compute, Program, fresh_name
from .scan import _reads, peeled, relations

# monoids of one commutative value: reduced axis by axis, the same reduction
NESTABLE = ("sum", "prod", "max", "min")


def nested_scans(program: Program) -> tuple[Program, str] | None:
    """``program`` with each reduction of the form above written as nested reductions (the
    stages it adds named after the original), and a note naming them; ``None`` where it has
    none."""
    taken = {c.name for c in program.computes} | {p.name for p in program.params}
    nested: list[str] = []

    def expand(c: Compute) -> "list[Compute] | None":
        stages = _stages(c, taken)
        if stages:
            nested.append(f"{c.name} over {', '.join(a.name for a in c.over)}")
        return stages

    made = rewrite_computes(program, lambda n: None, expand=expand)
    if not nested:
        return None
    note = (f"{'; '.join(nested)} written as one reduction an axis, the innermost first "
            "(each a scan or a band: a few operations an element, not every element of the "
            "ranges)")
    return rewritten_program(program, list(program.params), made), note


nested_scans.staged_by_design = True   # its stages are the plan: tf.compile warns of no floor


def _stages(c: Compute, taken: set) -> "list[Compute] | None":
    """The nested reductions of ``c``, innermost first (the last is ``c`` itself); ``None``
    where ``c`` is not of the form the module describes."""
    if not c.is_reduction or len(c.over) < 2 or c.arity != 1 or c.monoid.name not in NESTABLE:
        return None
    if any(isinstance(n, Ref) for b in c.bodies for n in nodes(inline_elementwise(b))):
        return None   # (terms reading another reduction's results: a chain, kept whole)
    value, conditions = peeled(inline_elementwise(c.bodies[0]), c)
    reduced = {a.uid for a in c.over}
    own: dict = {a.uid: [] for a in c.over}
    free = []
    for cond in conditions:
        read = {a.uid for a in cond.axes} & reduced
        if len(read) > 1:
            return None
        (own[read.pop()] if read else free).append(cond)
    paired, plain = {}, []
    for r in c.over:
        found = relations(own[r.uid], r, c)
        if found:
            paired[r.uid] = found[0][1]
        elif own[r.uid]:
            return None   # (conditions on it, none a range up to or from a result axis)
        else:
            plain.append(r)
    if not paired or len({a.uid for a in paired.values()}) < len(paired) or \
            any(_reads(value, a) for a in paired.values()):
        return None
    position = {a.uid: n for n, a in enumerate(c.axes)}
    scanned = sorted((r for r in c.over if r.uid in paired),
                     key=lambda r: position[paired[r.uid].uid], reverse=True)
    # the axes reduced whole first, together: the scans then sweep their sums
    order = ([tuple(plain)] if plain else []) + [(r,) for r in scanned]
    float_acc = "f64" if "f64" in (dt.resolve(value.dtype), c.dtypes[0]) else "f32"
    acc = float_acc if dt.is_float(dt.resolve(c.dtypes[0])) else c.dtypes[0]
    identity = Const(c.monoid.identity_value(0, acc), acc)
    stages: list[Compute] = []
    inner = value
    for n, over in enumerate(order):
        # result axes still reduced over by the stages outside this one: their reduced axes
        outer = {paired[o.uid].uid: o for (o,) in order[n + 1:]}
        axes = tuple(outer.get(a.uid, a) for a in c.axes)
        last = n == len(order) - 1
        kept = [cond for r in over for cond in own[r.uid]] + (free if last else [])
        body = where(reduce(operator.and_, kept), inner, identity) if kept else inner
        name = c.name if last else fresh_name(f"{c.name}_over_{'_'.join(r.name for r in over)}",
                                               taken)
        stage = Compute(name, axes, (body,), c.dtypes if last else (acc,), c.monoid, over,
                        c.loc, c.is_output and last)
        taken.add(stage.name)
        stages.append(stage)
        inner = Ref(stage, 0, c.loc)
    return stages

