"""Masks that bound the swept axis: ``lo <= j < hi`` with bounds each program reads.

A ragged sweep — a segment's rows ``r < lengths[g]``, a sequence's keys ``j < kv_len[b]``, a
window starting at ``starts[b]`` — is a mask whose every term compares the swept axis with an
integer read through the grid's batch axes and the rows (a tile of rows sweeps from its lowest
lower bound to its highest upper one). Such a mask needs no per-call block lists
(:mod:`.block_schedule`): each program reads its bounds and sweeps only the blocks between them,
so nothing is evaluated on the host or by extra kernels per call, a CUDA graph replays correctly
whatever the lengths hold by then, and the call takes the launcher's fast path. Masks of any
other form keep the lists.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra.exprs import conjuncts
from ..dsl import dtypes as dt
from ..dsl.expr import Axis, Binary, Compare, Const, Expr


@dataclass(frozen=True)
class SweepBounds:
    """The swept positions a program visits: ``lo <= j < hi``, each side a tuple of bounds whose
    maximum (minimum) holds (empty: from 0, or to the axis' end)."""

    lo: tuple[Expr, ...]
    hi: tuple[Expr, ...]

    def describe(self, text, axis: str) -> str:
        """``max(a, b) <= j < c`` in the DSL's words (``text``: an expression's text)."""
        def side(bounds, pick):
            parts = [text(b) for b in bounds]
            return parts[0] if len(parts) == 1 else f"{pick}({', '.join(parts)})"
        lo = f"{side(self.lo, 'max')} <= " if self.lo else ""
        hi = f" < {side(self.hi, 'min')}" if self.hi else ""
        return f"{lo}{axis}{hi}"


_FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def sweep_bounds(mask: Expr | None, swept: Axis, others: list[Axis]) -> SweepBounds | None:
    """The bounds ``mask`` puts on ``swept`` where it is a conjunction (``&``) of comparisons of
    the axis itself with integers over ``others`` (the batch axes and the rows: sizes,
    literals, scalars, reads of tensors indexed by them); ``None`` for any other mask (or
    none)."""
    if mask is None:
        return None
    allowed = {a.uid for a in others}
    lo: list[Expr] = []
    hi: list[Expr] = []
    for term in conjuncts(mask):
        if not isinstance(term, Compare) or term.op not in _FLIPPED:
            return None
        op, axis, bound = term.op, term.a, term.b
        if not _is_axis(axis, swept):
            op, axis, bound = _FLIPPED[op], term.b, term.a
        if not _is_axis(axis, swept) or not dt.is_int(dt.resolve(bound.dtype)) or \
                not {a.uid for a in bound.axes} <= allowed:
            return None
        if op in ("lt", "le"):
            hi.append(bound if op == "lt" else _plus_one(bound))
        else:
            lo.append(bound if op == "ge" else _plus_one(bound))
    return SweepBounds(tuple(lo), tuple(hi)) if lo or hi else None


def _is_axis(e: Expr, swept: Axis) -> bool:
    return isinstance(e, Axis) and e.uid == swept.uid


def _plus_one(e: Expr) -> Expr:
    if isinstance(e, Binary) and e.op == "sub" and isinstance(e.b, Const) and e.b.value == 1:
        return e.a   # j <= n - 1: j < n
    return Binary("add", e, Const(1, e.dtype), e.dtype)
