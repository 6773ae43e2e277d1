"""Several reduced axes swept as one: a chain that reduces over ``(p, t)`` together — the page and
the slot of a paged KV cache, the two pixel axes of a pooling — is the same chain over one axis
``j`` of ``P·T`` elements with ``p = j // T`` and ``t = j % T``.

The templates sweep one axis in blocks, so :func:`flatten_sweeps` rewrites such a program at a
call's sizes (the new axis's extent is their product, a constant of that call's kernel) into one
whose chain runs over ``j``; every read keeps its own indices, now arithmetic on ``j`` (a page
table read as ``table[b, j // T]``, a slot as ``j % T``). The rewrite is exact, not an
approximation: the sum, max or rolled state over the product of the axes visits the same
elements, in the order of ``j`` (row-major: the last axis fastest).

An output over the axes holds them next to each other, in the order reduced (a group norm's
``out[b, g, c, p]``): the flat program writes it over the one axis, a view of the same
memory, and :class:`tensorfuse.flat_kernel.FlatSweepKernel` gives it its own shape back. It
refuses (returns ``None``) where the axes are not always reduced together: a compute over one of
them without the others, an output holding them apart or in another order, or two different
groups of several axes.
"""
from __future__ import annotations

import math

from ..algebra.exprs import nodes, rewrite_computes
from ..dsl.expr import Axis, Const, Expr, Load, binary
from ..dsl.program import Program


# reductions whose result is the same in any order of visiting the elements (as floats are
# summed in any template's order): their axes may be swept in the tensors' memory order
ORDERLESS = ("sum", "max", "min")


def swept_together(program: Program) -> tuple[Axis, ...] | None:
    """The axes that reductions of ``program`` reduce over together (two or more), where exactly
    one such group exists and no reduction uses them apart: in the order the tensors read by
    them lie in memory (the contiguous axis fastest: a group norm over ``(c, p)`` of
    ``x[b, p, g, c]`` sweeps ``c`` fastest, 32-byte runs rather than a 2-byte read every
    ``G·C`` elements) where every such reduction is a sum, a maximum or a minimum — none where
    an output holds them in another order —, else in the order written."""
    groups = {tuple(a.uid for a in c.over): c.over for c in program.computes
              if c.is_reduction and len(c.over) > 1}
    if len(groups) != 1:
        return None
    (group,) = groups.values()
    ids = {a.uid for a in group}
    reductions = [c for c in program.computes if c.is_reduction and {a.uid for a in c.over} & ids]
    stored = _memory_order(program, group)
    if stored is not None and [a.uid for a in stored] != [a.uid for a in group] and \
            all(c.monoid.name in ORDERLESS for c in reductions):
        # else the order written would read the tensors a strided element at a time: where an
        # output holds the axes in that order, the floor's stages sweep the reductions alone
        # (in memory order) and write the output apart
        return stored if _sweepable(program, stored, reordered=True) else None
    return group if _sweepable(program, group) else None


def _sweepable(program: Program, group: tuple[Axis, ...], reordered: bool = False) -> bool:
    """Whether ``group``, in its order, can be swept as one axis: every compute holds all of it
    or none, each output holding it holds it next to each other in that order, and each
    reduction over it reduces over all of it (in that order, unless ``reordered``)."""
    ids = {a.uid for a in group}
    order = [a.uid for a in group]
    for c in program.computes:
        held = {a.uid for a in c.axes + c.over} & ids
        if held and held != ids:
            return False
        if c.is_output and {a.uid for a in c.axes} & ids and not _adjacent(c.axes, order):
            return False   # its flat result would not be a view of the output it writes
        if c.is_reduction and {a.uid for a in c.over} & ids and not reordered and \
                [a.uid for a in c.over if a.uid in ids] != order:
            return False
    return True


def _memory_order(program: Program, group: tuple[Axis, ...]) -> tuple[Axis, ...] | None:
    """``group`` in the order the tensors indexed by all of its axes lie in memory (their
    dimensions' order, the last contiguous), where they agree; else ``None``."""
    ids = {a.uid: a for a in group}
    found = set()
    for c in program.computes:
        for body in c.bodies:
            for n in nodes(body):
                if isinstance(n, Load):
                    at = [x.uid for x in n.indices if isinstance(x, Axis) and x.uid in ids]
                    if len(at) == len(ids) and len(set(at)) == len(at):
                        found.add(tuple(at))
    return tuple(ids[u] for u in found.pop()) if len(found) == 1 else None


def _adjacent(axes: tuple[Axis, ...], order: list[int]) -> bool:
    """Whether ``axes`` hold the axes ``order`` names next to each other, in that order."""
    uids = [a.uid for a in axes]
    at = uids.index(order[0]) if order[0] in uids else -1
    return at >= 0 and uids[at:at + len(order)] == order


def flatten_sweeps(program: Program, sizes: dict) -> Program | None:
    """``program`` with its one group of axes reduced together (:func:`swept_together`) replaced
    by a single axis of their product's extent at ``sizes``; ``None`` where it has no such group
    or the sizes of its axes are not all given."""
    group = swept_together(program)
    if group is None:
        return None
    extents = [a.extent if isinstance(a.extent, int) else sizes.get(a.extent) for a in group]
    if any(not isinstance(e, int) for e in extents):
        return None
    taken = {a.name for a in program.axes} | {p.name for p in program.params}
    name = "".join(a.name for a in group)
    while name in taken:
        name += "_"
    flat = Axis(name, math.prod(extents), group[0].loc)
    index: dict[int, Expr] = {}
    inner = 1
    for axis, extent in reversed(list(zip(group, extents))):
        at = flat if inner == 1 else binary("floordiv", flat, Const(inner, "i32"))
        index[axis.uid] = at if axis is group[0] else binary("mod", at, Const(extent, "i32"))
        inner *= extent
    ids = set(index)

    def merged(axes: tuple[Axis, ...]) -> tuple[Axis, ...]:
        out = []
        for a in axes:
            if a.uid == group[0].uid:
                out.append(flat)
            elif a.uid not in ids:
                out.append(a)
        return tuple(out)

    copies = rewrite_computes(
        program, lambda node: index.get(node.uid) if isinstance(node, Axis) else None,
        axes=lambda c: merged(c.axes), over=lambda c: merged(c.over))
    axes = [a for a in program.axes if a.uid not in ids] + [flat]
    return Program(program.name, list(program.params), list(copies.values()),
                   [copies[o.name] for o in program.outputs], axes,
                   list(program.size_constraints), program.loc)
