"""Grouped-query attention written with its query heads as two axes — a kv-head ``g`` and the
heads ``r`` of its group, ``q[b, g, r, i, d]`` over ``k[b, g, j, d]`` (einops' ``b (g r) s d``,
as code that broadcasts q against k writes it) — as the same program with one head axis
``h = g · R + r`` whose keys and values are read at ``h // R``: the four-axis attention the
Hopper template plans. The caller's q and output are then viewed with ``g`` and ``r`` as one
axis (nothing copied: their strides must merge, as a contiguous tensor's do).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra.exprs import nodes, rewrite_computes, rewritten_program
from ..dsl.expr import Axis, DimSize, Load, binary
from ..dsl.program import Program, TensorParam
from .attention_chain import attention_loads


@dataclass(frozen=True)
class MergedHeads:
    """``program`` with the head axes merged; ``group``, ``heads``: the size names of ``g`` and
    ``r``; ``merged``: the new size's name (``group × heads``); ``at``: for q and each output
    (by name), where ``g`` sits among its axes (``r`` right after it)."""

    program: Program
    group: str
    heads: str
    merged: str
    at: dict

    def describe(self) -> str:
        return (f"query heads merged: {self.group} × {self.heads} as {self.merged}, keys and "
                f"values read at the group")


def merge_head_axes(program: Program, names: tuple[str, ...], axis: str) -> MergedHeads | None:
    """The program with ``q``'s kv-head and group axes merged (module docstring), or None where
    the attention is not written so: ``q`` and the outputs read ``g`` then ``r`` side by side,
    ``k`` and ``v`` read ``g`` and not ``r``, nothing else reads either, and both are sizes of
    their own."""
    found = attention_loads(program, names, axis)
    if found is None or not all(isinstance(a, Axis) for a in found[0].indices + found[1].indices):
        return None
    q_load, k_load, v_load, d = found
    if len({q_load.param.name, k_load.param.name, v_load.param.name}) != 3:
        return None
    q_axes = [a.uid for a in q_load.indices]
    k_axes = {a.uid for a in k_load.indices}
    pair = next(((g, r) for g, r in zip(q_load.indices, q_load.indices[1:])
                 if g.uid in k_axes and r.uid not in k_axes and r.uid != d.uid
                 and isinstance(g.extent, str) and isinstance(r.extent, str)), None)
    if pair is None:
        return None
    g, r = pair
    # two axes of q's own besides the head dim — the group's heads, then the queries — so the
    # query axis is never taken for a head (a four-axis q has one: nothing to merge)
    own = [a for a in q_load.indices if a.uid not in k_axes and a.uid != d.uid]
    if len(own) != 2 or own[0].uid != r.uid:
        return None
    if not _only_where_expected(program, g, r, q_load.param.name,
                                {k_load.param.name, v_load.param.name}):
        return None
    for c in program.computes:   # a value over r holds g right before it, an output both;
        axes = [a.uid for a in c.axes]   # none reduces over either
        paired = g.uid in axes and axes[axes.index(g.uid) + 1:][:1] == [r.uid]
        if {g.uid, r.uid} & {a.uid for a in c.over} or r.uid in axes and not paired or \
                c.is_output and not paired:
            return None
    merged = _fresh_size(program, f"{g.extent}{r.extent}")
    h = Axis(f"{g.name}{r.name}", merged)
    group_of = binary("floordiv", h, binary("floordiv", DimSize(merged), DimSize(g.extent)))
    at = {q_load.param.name: q_axes.index(g.uid),
          **{c.name: [a.uid for a in c.axes].index(g.uid) for c in program.outputs}}
    q = q_load.param
    q_at = at[q.name]
    merged_q = TensorParam(q.name, q.dims[:q_at] + (merged,) + q.dims[q_at + 2:], q.dtype, q.loc)

    def rewrite(node):
        if isinstance(node, Load) and node.param.name == q.name:
            return Load(merged_q, _merged(node.indices, q_at, h), node.loc)
        if isinstance(node, Axis) and node.uid == g.uid:   # k's and v's: the group
            return group_of
        return None

    def axes_of(c):
        uids = [a.uid for a in c.axes]
        return c.axes if g.uid not in uids else _merged(c.axes, uids.index(g.uid), h)

    made = rewrite_computes(program, rewrite, axes=axes_of)
    params = [merged_q if p.name == q.name else p for p in program.params]
    return MergedHeads(rewritten_program(program, params, made), g.extent, r.extent, merged, at)


def _only_where_expected(program: Program, g: Axis, r: Axis, q: str, kv: set) -> bool:
    """Whether ``r`` is read only by ``q`` and ``g`` only by ``q``, ``k`` and ``v`` (as plain
    indices; a mask or a term per head would need the heads apart)."""
    for c in program.computes:
        for body in c.bodies:
            for node in nodes(body):
                if isinstance(node, Load):
                    reads = {a.uid for a in node.indices if isinstance(a, Axis)}
                    if r.uid in reads and node.param.name != q or \
                            g.uid in reads and node.param.name not in kv | {q}:
                        return False
                # any other use (an index expression, a mask, a term): the walk reaches it
                elif any(isinstance(a, Axis) and a.uid in (g.uid, r.uid)
                         for a in node.children()):
                    return False
    return True


def _fresh_size(program: Program, name: str) -> str:
    taken = set(program.dim_names())
    while name in taken:
        name = f"{name}_"
    return name


def _merged(items, at: int, item) -> tuple:
    items = tuple(items)
    return items[:at] + (item,) + items[at + 2:]
