"""Which maxima of a program only stabilise it: its outputs do not change when they move.

Softmax subtracts its row maximum ``m`` before ``exp`` only to keep the exponentials in range:
``exp(x - m) / sum(exp(x - m))`` is the same function for any ``m``. So are log-softmax
(``x - m - log(l)``), cross-entropy (``m + log(l) - x[t]``) and attention's ``o / l``. The
derivative of such outputs with respect to ``m`` is exactly zero, and reverse-mode
differentiation (:mod:`.gradients`) need not send an adjoint through the maximum — a pass over
the row counting the elements tied with it and a term that is zero but for rounding, which also
keep the backward chain from fusing into one sweep (a tie count cannot be corrected when the
maximum moves).

Whether that holds is derived, not assumed from the kernel's name: every value of the program
is classified by how it changes when ``m`` moves by ``c`` (any amount per element of ``m``'s
axes) —

- shifted by ``k·c`` (``m`` itself: ``k = 1``; ``x - m``: ``k = -1``; ``log`` of a scaled value),
- scaled by ``exp(k·c)`` (``exp`` of a shifted value; sums, products and quotients of scaled
  values; a maximum of them),
- unchanged (``k = 0`` either way), or unknown (anything else: a comparison with ``m``,
  ``tanh(x - m)``, a sum over ``m``'s own axes of a value that moves).

The maximum stabilises the program when every floating-point output is unchanged. Constants
fit either class where they are fixed points: ``0`` is any multiple of itself, ``±inf`` any shift
of itself (a mask's ``where(ok, s - m, -inf)`` stays shifted).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import dtypes as dt
from .expr import (Axis, Binary, Cast, Compare, Const, DimSize, Expr, Load, Ref, Scalar, Unary,
                   Where)
from .program import Compute, Program

ANY = "any"   # a constant that is a fixed point of every shift (±inf) or every scaling (0)


class Coefficient:
    """A coefficient ``k`` of the moves: a sum of numbers times products of powers of the
    program's scalars and sizes (``(s - m) * scale`` moves by ``-scale·c``), so that terms
    cancel exactly whatever the scalars' values."""

    __slots__ = ("terms",)

    def __init__(self, terms: dict):
        self.terms = {m: v for m, v in terms.items() if v != 0}

    @staticmethod
    def number(value: float) -> "Coefficient":
        return Coefficient({(): float(value)})

    def plus(self, other: "Coefficient", sign: int = 1) -> "Coefficient":
        terms = dict(self.terms)
        for m, v in other.terms.items():
            terms[m] = terms.get(m, 0.0) + sign * v
        return Coefficient(terms)

    def times(self, other: "Coefficient", power: int = 1) -> "Coefficient":
        """This times ``other`` (``power`` 1), or divided by it (-1: ``other`` one term)."""
        terms: dict = {}
        for m1, v1 in self.terms.items():
            for m2, v2 in other.terms.items():
                powers = dict(m1)
                for name, p in m2:
                    powers[name] = powers.get(name, 0) + power * p
                key = tuple(sorted((n, p) for n, p in powers.items() if p))
                terms[key] = terms.get(key, 0.0) + v1 * (v2 if power > 0 else 1 / v2)
        return Coefficient(terms)

    def __eq__(self, other) -> bool:
        return isinstance(other, Coefficient) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.terms.items())))

    def __repr__(self) -> str:
        return " + ".join(f"{v:g}" + "".join(f"·{n}^{p}" for n, p in m)
                          for m, v in self.terms.items()) or "0"


ZERO = Coefficient({})


@dataclass(frozen=True)
class Moves:
    """How a value changes when the maximum moves by ``c``: ``v + shift·c`` and ``v·exp(scale·c)``
    (each a :class:`Coefficient`, None where that form does not hold, :data:`ANY` where any
    coefficient does)."""

    shift: object = None
    scale: object = None

    @property
    def fixed(self) -> bool:
        return self.shift == ZERO or self.scale == ZERO


FIXED = Moves(ZERO, ZERO)
UNKNOWN = Moves()


def stabilising_maxima(program: Program) -> set[str]:
    """The names of the program's maxima and minima (one-component reductions, not outputs
    themselves) that its floating-point outputs do not depend on."""
    found = set()
    for c in program.computes:
        if c.is_reduction and c.monoid.name in ("max", "min") and c.arity == 1 and \
                not c.is_output and _outputs_fixed(program, c):
            found.add(c.name)
    return found


def _outputs_fixed(program: Program, moved: Compute) -> bool:
    moves: dict[str, Moves] = {moved.name: Moves(Coefficient.number(1), None)}
    for c in program.computes:
        if c.name != moved.name:
            moves[c.name] = _compute_moves(c, moved, moves)
    return all(moves[c.name].fixed for c in program.outputs if dt.is_float(c.dtypes[0]))


def _compute_moves(c: Compute, moved: Compute, moves: dict) -> Moves:
    memo: dict = {}
    kinds = [_moves(b, moves, memo) for b in c.bodies]
    if all(k.fixed for k in kinds):
        return FIXED
    if not c.is_reduction:
        return kinds[0]
    # a reduction across the maximum's own axes mixes values moved by different amounts
    if c.arity > 1 or {a.uid for a in c.over} & {a.uid for a in moved.axes}:
        return UNKNOWN
    body = kinds[0]
    name = c.monoid.name
    if name == "sum":   # Σ v·e^{kc} = e^{kc} Σ v
        return Moves(None, body.scale)
    if name in ("max", "min"):   # the order is kept by a shift and by a positive factor
        return body
    if name == "logsumexp":
        return Moves(body.shift, None)
    return UNKNOWN


def _moves(e: Expr, moves: dict, memo: dict) -> Moves:
    found = memo.get(e.uid)
    if found is None:
        found = memo[e.uid] = _node_moves(e, moves, memo)
    return found


def _node_moves(e: Expr, moves: dict, memo: dict) -> Moves:
    if isinstance(e, Ref):
        return moves.get(e.compute.name, FIXED)
    if isinstance(e, Const):
        if isinstance(e.value, float) and math.isinf(e.value):
            return Moves(ANY, ZERO)
        return Moves(ZERO, ANY) if e.value == 0 else FIXED
    if isinstance(e, (Scalar, DimSize, Axis)):
        return FIXED
    if isinstance(e, Load):
        return FIXED if all(_moves(ix, moves, memo).fixed for ix in e.indices) else UNKNOWN
    kids = [_moves(k, moves, memo) for k in e.children()]
    if all(k == FIXED for k in kids):
        return FIXED
    found = _combined(e, kids)
    if all(k.fixed for k in kids):   # a function of unmoved values is unmoved
        found = Moves(ZERO if found.shift is None else found.shift,
                      ZERO if found.scale is None else found.scale)
    return found


def _combined(e: Expr, kids: list) -> Moves:
    if isinstance(e, Cast):
        return kids[0] if dt.is_float(e.dtype) else UNKNOWN
    if isinstance(e, Compare):   # a + kc ? b + kc is a ? b
        return FIXED if _same(kids[0].shift, kids[1].shift) is not None else UNKNOWN
    if isinstance(e, Where):
        cond, a, b = kids
        if not cond.fixed:
            return UNKNOWN
        return Moves(_same(a.shift, b.shift), _same(a.scale, b.scale))
    if isinstance(e, Unary):
        return _unary(e.op, kids[0])
    if isinstance(e, Binary):
        return _binary(e, *kids)
    return UNKNOWN


def _same(a, b):
    """The coefficient two values share (a fixed point takes the other's), or None."""
    if a is None or b is None:
        return None
    if a == ANY:
        return b
    if b == ANY or a == b:
        return a
    return None


def _plus(a, b, sign: int = 1):
    if a is None or b is None:
        return None
    if a == ANY or b == ANY:
        return ANY
    return a.plus(b, sign)


def _times(a, factor: "Coefficient | None", power: int = 1):
    if a is None or factor is None:
        return None
    return a if a == ANY else a.times(factor, power)


_LOG2 = Coefficient.number(math.log(2.0))


def _unary(op: str, a: Moves) -> Moves:
    if op == "neg":
        return Moves(_times(a.shift, Coefficient.number(-1)), a.scale)
    if op == "exp":   # e^{v + kc} = e^v · e^{kc}
        return Moves(None, a.shift)
    if op == "exp2":
        return Moves(None, _times(a.shift, _LOG2))
    if op == "log":   # log(v · e^{kc}) = log v + kc
        return Moves(a.scale, None)
    if op == "log2":
        return Moves(_times(a.scale, _LOG2, -1), None)
    if op in ("sqrt", "rsqrt"):
        return Moves(None, _times(a.scale, Coefficient.number(0.5 if op == "sqrt" else -0.5)))
    if op == "abs":
        return Moves(None, a.scale)
    return UNKNOWN


def _factor(e: Expr) -> "Coefficient | None":
    """``e`` as a coefficient where it is a product of numbers, scalars and sizes, else None."""
    if isinstance(e, Const) and isinstance(e.value, (int, float)) and math.isfinite(e.value) \
            and not isinstance(e.value, bool):
        return Coefficient.number(e.value)
    if isinstance(e, Scalar):
        return Coefficient({((e.name, 1),): 1.0})
    if isinstance(e, DimSize):
        return Coefficient({((f"size {e.name}", 1),): 1.0})
    if isinstance(e, Cast):
        return _factor(e.a)
    if isinstance(e, Unary) and e.op == "neg":
        inner = _factor(e.a)
        return inner.times(Coefficient.number(-1)) if inner is not None else None
    if isinstance(e, Binary) and e.op in ("mul", "div"):
        a, b = _factor(e.a), _factor(e.b)
        if a is None or b is None or (e.op == "div" and len(b.terms) != 1):
            return None
        return a.times(b, 1 if e.op == "mul" else -1)
    return None


def _binary(e: Binary, a: Moves, b: Moves) -> Moves:
    if e.op in ("add", "sub"):
        return Moves(_plus(a.shift, b.shift, 1 if e.op == "add" else -1),
                     _same(a.scale, b.scale))
    if e.op in ("mul", "div"):
        scale = _plus(a.scale, b.scale, 1 if e.op == "mul" else -1)
        # a shifted value times a constant factor (a scalar, a size, a number) stays shifted
        shift = None
        if b.fixed and a.shift is not None:
            factor = _factor(e.b)
            if factor is not None and (e.op == "mul" or len(factor.terms) == 1):
                shift = _times(a.shift, factor, 1 if e.op == "mul" else -1)
        elif a.fixed and b.shift is not None and e.op == "mul":
            shift = _times(b.shift, _factor(e.a))
        return Moves(shift, scale)
    if e.op in ("max", "min"):
        return Moves(_same(a.shift, b.shift), _same(a.scale, b.scale))
    if e.op == "pow" and b.fixed and isinstance(e.b, Const):
        return Moves(None, _times(a.scale, Coefficient.number(float(e.b.value))))
    return UNKNOWN
