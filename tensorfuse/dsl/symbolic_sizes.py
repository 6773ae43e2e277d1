"""Sizes known by value and by name: one generated kernel for many sizes.

A template plans and writes its kernel from the sizes of a call. Given :class:`SymInt` sizes
instead of ints, the same code writes a kernel that reads those sizes from arguments (a SymInt
prints as the argument's name), while every decision the code takes on a size — a comparison,
a truth test, a conversion to ``int`` — is taken on the call's value and recorded as a
:class:`Guard`. The kernel then serves every other size for which all of its guards give the
same answers (PyTorch's dynamic shapes work the same way): a width compared with a block's
becomes a bucket, a width made an ``int`` (for a ``range``, say) is specialised, exactly.

Nothing is silently generalised: an operation :class:`SymInt` does not define raises
``TypeError`` (the caller builds for the exact sizes instead), and every way out of the
symbolic world (``int()``, ``%d`` formatting, ``float()``) records an equality guard.
"""
from __future__ import annotations

import operator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
            "==": operator.eq, "!=": operator.ne}
_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


@dataclass(frozen=True)
class Guard:
    """``left op right`` evaluated to ``holds`` when the kernel was written."""

    text: str
    left: Callable[[dict], int]
    op: str
    right: Callable[[dict], int]
    holds: bool

    def check(self, sizes: dict) -> bool:
        return _COMPARE[self.op](self.left(sizes), self.right(sizes)) == self.holds

    def describe(self) -> str:
        """The guard as the condition that holds (``a > b`` that failed reads ``a <= b``)."""
        if self.holds:
            return self.text
        left, right = self.text.split(f" {self.op} ", 1)
        return f"{left} {_NEGATED[self.op]} {right}"


class Guards:
    """The decisions taken on symbolic sizes while one kernel was planned and written."""

    def __init__(self):
        self.items: list[Guard] = []
        self._seen: set = set()
        self.sealed = False   # the kernel is written: a later decision is a bug, said loudly

    def add(self, guard: Guard) -> None:
        if self.sealed:
            raise TypeError(f"a decision on a symbolic size after its kernel was written "
                            f"({guard.text}): a symbolic value outlived its build")
        said = guard.describe()
        if said not in self._seen:
            self._seen.add(said)
            self.items.append(guard)

    def check(self, sizes: dict) -> bool:
        """Whether a kernel written under these guards is the one for ``sizes``."""
        try:
            return all(g.check(sizes) for g in self.items)
        except (KeyError, ZeroDivisionError):   # a size it depends on not given, or 0
            return False

    def describe(self) -> list[str]:
        return [g.describe() for g in self.items]

    def specialised(self) -> list[str]:
        """The sizes fixed to one value (an equality that holds on a bare name)."""
        return sorted(g.text for g in self.items
                      if g.holds and g.op == "==" and g.text.split(" == ")[0].isidentifier()
                      and g.text.split(" == ")[1].isdigit())


def _value(x) -> Callable[[dict], int]:
    return x.at if isinstance(x, SymInt) else (lambda sizes, v=x: v)


def _text(x) -> str:
    return x.text if isinstance(x, SymInt) else repr(x)


def _int_like(x) -> bool:
    return isinstance(x, SymInt) or isinstance(x, int) and not isinstance(x, bool)


class SymInt:
    """An integer size: ``value`` at the call being planned, ``text`` the expression of kernel
    arguments it is in the generated source, ``at(sizes)`` its value at other sizes; every
    decision on it is recorded in ``guards``."""

    __slots__ = ("text", "value", "at", "guards", "nonneg")

    def __init__(self, text: str, value: int, at: Callable[[dict], int], guards: Guards,
                 nonneg: bool = True):
        self.text, self.value, self.at, self.guards = text, value, at, guards
        self.nonneg = nonneg   # never negative at any sizes (sizes, their sums and products)

    # -- arithmetic: exact on integers, a new expression ------------------------------------
    def _make(self, other, op: str, fn, swap: bool = False):
        if not _int_like(other):
            return NotImplemented
        a, b = (other, self) if swap else (self, other)
        same = _identity(a, b, op)
        if same is not None:
            return same
        fa, fb = _value(a), _value(b)
        value = fn(a.value if isinstance(a, SymInt) else a,
                   b.value if isinstance(b, SymInt) else b)
        nonneg = op != "-" and all(x.nonneg if isinstance(x, SymInt) else x >= 0 for x in (a, b))
        return SymInt(f"({_text(a)} {op} {_text(b)})", value,
                      lambda sizes: fn(fa(sizes), fb(sizes)), self.guards, nonneg)

    def __add__(self, o): return self._make(o, "+", operator.add)          # noqa: E704
    def __radd__(self, o): return self._make(o, "+", operator.add, True)   # noqa: E704
    def __sub__(self, o): return self._make(o, "-", operator.sub)          # noqa: E704
    def __rsub__(self, o): return self._make(o, "-", operator.sub, True)   # noqa: E704
    def __mul__(self, o): return self._make(o, "*", operator.mul)          # noqa: E704
    def __rmul__(self, o): return self._make(o, "*", operator.mul, True)   # noqa: E704

    # floor division and modulo: Triton's // and % truncate, Python's floor; they agree where
    # the dividend is not negative and the divisor positive. A dividend that may be negative
    # (a difference of sizes) is guarded to be non-negative, and refused where it is not
    def _divide(self, other, op: str, fn, swap: bool = False):
        dividend, divisor = (other, self) if swap else (self, other)
        if not _int_like(other):
            return NotImplemented
        if isinstance(divisor, int) and divisor <= 0 or \
                isinstance(divisor, SymInt) and divisor.value <= 0:
            raise TypeError("a symbolic size divided by a value that is not positive")
        if isinstance(dividend, SymInt) and not dividend.nonneg and \
                not dividend._decide(0, ">="):
            raise TypeError("a negative symbolic size divided (Triton's // truncates)")
        if isinstance(dividend, int) and dividend < 0:
            raise TypeError("a negative number divided by a symbolic size")
        return self._make(other, op, fn, swap)

    def __floordiv__(self, o): return self._divide(o, "//", operator.floordiv)         # noqa
    def __rfloordiv__(self, o): return self._divide(o, "//", operator.floordiv, True)  # noqa
    def __mod__(self, o): return self._divide(o, "%", operator.mod)                   # noqa
    def __rmod__(self, o): return self._divide(o, "%", operator.mod, True)            # noqa

    def __truediv__(self, other):
        if not isinstance(other, int) or isinstance(other, bool) or other <= 0:
            raise TypeError("a symbolic size divided by something other than a positive int")
        return _Quotient(self, other)

    def __neg__(self):
        return SymInt(f"(-{self.text})", -self.value, lambda s, f=self.at: -f(s), self.guards,
                      False)

    def __pos__(self):
        return self

    def __ceil__(self):
        return self

    def __floor__(self):
        return self

    # -- decisions: taken on the value, recorded -------------------------------------------
    def _decide(self, other, op: str, swap: bool = False):
        if not _int_like(other):
            return NotImplemented
        a, b = (other, self) if swap else (self, other)
        holds = _COMPARE[op](a.value if isinstance(a, SymInt) else a,
                             b.value if isinstance(b, SymInt) else b)
        if _text(a) == _text(b):   # the same expression on both sides: true at any size
            return holds
        self.guards.add(Guard(f"{_plain(a)} {op} {_plain(b)}", _value(a), op, _value(b), holds))
        return holds

    def __lt__(self, o): return self._decide(o, "<")    # noqa: E704
    def __le__(self, o): return self._decide(o, "<=")   # noqa: E704
    def __gt__(self, o): return self._decide(o, ">")    # noqa: E704
    def __ge__(self, o): return self._decide(o, ">=")   # noqa: E704
    def __eq__(self, o): return self._decide(o, "==")   # noqa: E704
    def __ne__(self, o): return self._decide(o, "!=")   # noqa: E704

    def __hash__(self):
        return hash(self.value)   # a dict lookup then compares: an equality guard

    def __bool__(self):
        return self._decide(0, "!=")

    def bit_length(self) -> int:
        """``int.bit_length`` of the value: its power-of-two bucket (two guards), as a next
        power of two asks."""
        bits = self.value.bit_length()
        if bits:
            self._decide(1 << (bits - 1), ">=")
        self._decide(1 << bits, "<")
        return bits

    def _fixed(self) -> int:
        """The value, the size fixed to it from here on (an equality guard)."""
        self._decide(self.value, "==")
        return self.value

    def __int__(self): return self._fixed()     # noqa: E704
    def __index__(self): return self._fixed()   # noqa: E704
    def __float__(self): return float(self._fixed())   # noqa: E704

    def __format__(self, spec: str) -> str:
        return self.text if not spec else format(self._fixed(), spec)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"SymInt({self.text}={self.value})"


class _Quotient:
    """``size / d`` for a positive int ``d``: only ever rounded (``math.ceil``/``math.floor``)."""

    def __init__(self, size: SymInt, divisor: int):
        self.size, self.divisor = size, divisor

    def __ceil__(self) -> SymInt:
        return (self.size + (self.divisor - 1)) // self.divisor

    def __floor__(self) -> SymInt:
        return self.size // self.divisor


def _identity(a, b, op: str):
    """``a op b`` where it is one of its operands or zero (x·1, x+0, x//1, x%1), else None
    (decided on the int operands only: nothing is recorded)."""
    a_int, b_int = not isinstance(a, SymInt), not isinstance(b, SymInt)
    if op == "*" and (a_int and a == 0 or b_int and b == 0) or op == "%" and b_int and b == 1:
        return 0
    if a_int and (op == "*" and a == 1 or op == "+" and a == 0):
        return b
    if b_int and (op in ("*", "//") and b == 1 or op in ("+", "-") and b == 0):
        return a
    return None


def _plain(x) -> str:
    """A guard's side without parentheses around the whole of it."""
    text = _text(x)
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for k, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and k < len(text) - 1:   # the first parenthesis closes early
            return text
    return text[1:-1]


PREFIX = "size_"   # a size's argument is named PREFIX + its name


@contextmanager
def symbolic(sizes: dict, names: "set[str] | None" = None, prefix: str = PREFIX):
    """Within: ``sizes`` with those in ``names`` (default all) as :class:`SymInt` printing as
    ``prefix + name``, and the :class:`Guards` they record. Yields ``(symbolic sizes, guards)``."""
    guards = Guards()
    out = {}
    for name, value in sizes.items():
        if names is None or name in names:
            out[name] = SymInt(prefix + name, int(value), lambda s, n=name: s[n], guards)
        else:
            out[name] = value
    try:
        yield out, guards
    finally:
        guards.sealed = True


def size_arguments(sizes: dict, prefix: str = PREFIX) -> list[str]:
    """The kernel arguments of the symbolic ``sizes``, in order."""
    return [prefix + n for n, v in sizes.items() if isinstance(v, SymInt)]
