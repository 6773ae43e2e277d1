"""The interval of keys a mask keeps for one query row, for kernels that sweep only that interval.

A score written ``where(cond, s, -inf)`` whose condition is a conjunction (``&``) of bounds on the
key index ``j`` keeps one interval of keys per row:

- ``j < length[b]`` (a static cache filled to a length kept in device memory, per batch row);
- ``j <= N - M + i`` (causal, aligned to the bottom right);
- ``N - M + i - j < window`` (a sliding window's far edge);
- ``|N - M + i - j| <= radius`` (a neighbourhood along the keys).

Where a bound reads nothing that varies inside one row of the kernel's work — only the row's own
indices (the batch; the query, 0 in decode), sizes, scalars and elements of integer tensors at
those indices — the kernel evaluates it once and sweeps ``[max(lower), min(upper))`` clamped into
the keys it was given: a length that lives in device memory then needs no host work and no new
launch as it grows (one captured CUDA graph replays a whole decode loop), and a sliding window
reads its window instead of the whole cache. The terms found are taken out of the score (the
sweep keeps them exactly); the rest of the condition stays elementwise.

Keys outside the interval are never read, which is exact for the softmax chain: a masked key adds
the identity to every state (``algebra.masking``). A row whose interval is empty gives what the
math gives for a row with every key masked (0/0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..algebra.exprs import linear_in, nodes
from ..dsl import dtypes as dt
from ..dsl.expr import (Axis, Binary, Compare, Const, Expr, Load, Unary, Where, binary, unary,
                        where)

# a bound's relation, turned around when j moves to the other side: a < b ⟺ b > a
_FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq"}


@dataclass(frozen=True)
class KeyRange:
    """The keys ``lower ≤ j < upper`` (every bound of each tuple holds: the largest lower, the
    smallest upper) and the score without the terms they came from. Empty tuples: no bound on
    that side (the kernel's own 0 and key count)."""

    lower: tuple[Expr, ...]
    upper: tuple[Expr, ...]
    score: Expr


def key_range(score: Expr, key: Axis, row_axes: tuple[Axis, ...]) -> KeyRange:
    """The bounds on ``key`` in the conjunction of ``score``'s outer ``where(cond, s, -inf)``
    that read, of the axes, only ``row_axes``; the other terms stay in the returned score."""
    if not _masks_to_minus_infinity(score):
        return KeyRange((), (), score)
    allowed = {a.uid for a in row_axes}
    lower, upper, rest = [], [], []
    for term in _conjunction(score.cond):
        found = _bounds(term, key, allowed)
        if found is None:
            rest.append(term)
            continue
        lower += found[0]
        upper += found[1]
    if not lower and not upper:
        return KeyRange((), (), score)
    inner = score.a
    if rest:
        cond = rest[0]
        for term in rest[1:]:
            cond = binary("and", cond, term, term.loc)
        inner = where(cond, inner, score.b, score.loc)
    return KeyRange(tuple(lower), tuple(upper), inner)


def reads_tensors(e: Expr) -> tuple[tuple[str, str], ...]:
    """``(name, dtype)`` of the tensors ``e`` reads, in order of first appearance."""
    found: dict[str, str] = {}
    for n in nodes(e):
        if isinstance(n, Load):
            found.setdefault(n.param.name, n.param.dtype)
    return tuple(found.items())


def _masks_to_minus_infinity(e: Expr) -> bool:
    if not isinstance(e, Where):
        return False
    b = e.b
    if isinstance(b, Unary) and b.op == "neg" and isinstance(b.a, Const):
        return float(b.a.value) == math.inf
    return isinstance(b, Const) and float(b.value) == -math.inf


def _conjunction(cond: Expr) -> list[Expr]:
    if isinstance(cond, Binary) and cond.op == "and":
        return _conjunction(cond.a) + _conjunction(cond.b)
    return [cond]


def _bounds(term: Expr, key: Axis, allowed: set) -> tuple[list, list] | None:
    """``(lowers, uppers)`` of ``key`` that ``term`` states exactly, or None where it is not
    such a bound (or reads what a row does not fix)."""
    if not isinstance(term, Compare):
        return None
    for side, other, op in ((term.a, term.b, term.op), (term.b, term.a, _FLIPPED.get(term.op))):
        if isinstance(side, Unary) and side.op == "abs" and op in ("lt", "le"):
            return _absolute_bounds(side.a, other, op, key, allowed)
    if term.op not in _FLIPPED:
        return None
    a, b = linear_in(term.a, key), linear_in(term.b, key)
    if a is None or b is None or not (_is_number(a[0]) and _is_number(b[0])):
        return None
    coefficient = a[0].value - b[0].value
    if coefficient == 1:      # j + ra op rb  ⟺  j op rb - ra
        op, bound = term.op, _minus(b[1], a[1])
    elif coefficient == -1:   # -j + ra op rb  ⟺  j flip(op) ra - rb
        op, bound = _FLIPPED[term.op], _minus(a[1], b[1])
    else:
        return None
    if not _fixed_per_row(bound, allowed):
        return None
    one_past = binary("add", bound, 1, term.loc)
    return {"lt": ([], [bound]), "le": ([], [one_past]), "gt": ([one_past], []),
            "ge": ([bound], []), "eq": ([bound], [one_past])}[op]


def _absolute_bounds(inside: Expr, limit: Expr, op: str, key: Axis, allowed: set):
    """``|c·j + r| < limit`` (or ``<=``) with ``c = ±1``: ``j`` within ``limit`` of ``∓r``."""
    split = linear_in(inside, key)
    if split is None or not _is_number(split[0]) or abs(split[0].value) != 1 or \
            not _fixed_per_row(limit, allowed):
        return None
    centre = split[1] if split[0].value == -1 else unary("neg", split[1], inside.loc)
    if not _fixed_per_row(centre, allowed):
        return None
    reach = limit if op == "le" else binary("sub", limit, 1, inside.loc)
    return ([binary("sub", centre, reach, inside.loc)],
            [binary("add", binary("add", centre, reach, inside.loc), 1, inside.loc)])


def _is_number(e: Expr) -> bool:
    return isinstance(e, Const) and not isinstance(e.value, bool)


def _minus(a: Expr, b: Expr) -> Expr:
    if _is_number(b) and b.value == 0:
        return a
    return binary("sub", a, b, a.loc)


def _fixed_per_row(e: Expr, allowed: set) -> bool:
    """Whether ``e`` is an integer the kernel can evaluate once per row: of the axes only
    ``allowed``, every leaf an integer (an integral constant, a size, an integer scalar or an
    element of an integer tensor)."""
    if any(a.uid not in allowed for a in e.axes):
        return False
    for n in nodes(e):
        if isinstance(n, Const) and not (float(n.value).is_integer()):
            return False
        if not isinstance(n, Const) and not n.children() and dt.is_float(dt.resolve(n.dtype)):
            return False
        if isinstance(n, Load) and dt.is_float(n.param.dtype):
            return False
        if isinstance(n, (Binary, Unary)) and n.op not in ("add", "sub", "mul", "neg", "min",
                                                           "max", "floordiv", "mod"):
            return False
    return True
