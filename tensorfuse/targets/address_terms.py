"""A read's address as few terms as its indices allow: indices that are mixed-radix digits of one
expression, over dimensions laid out one inside the other, are one index again.

Sweeping several axes as one (``schedule_templates.flat_sweeps``) reads ``x[b, g, c, p]`` as
``x[b, g, j // P, j % P]``. Its address ``(j // P)·P + j % P`` is ``j``, but no compiler below
sees that: Triton's contiguity analysis stops at the floor division, so the loads are neither
vectorised nor copied asynchronously. Merging the digits back gives the address the emitters
write, ``j·1``.

The identity, for positive ``d``, ``m`` and any integer ``X`` (floor division):
``((X // (d·m)) % n)·(s·m) + ((X // d) % m)·s == ((X // d) % (n·m))·s``, and without the outer
``% n`` (the leading digit) the merged term has none either.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..dsl.expr import Binary, Const, Expr, binary, reads_data


@dataclass(frozen=True)
class _Digit:
    """``((base // divisor) % modulus) * stride`` (``modulus`` None: no modulo)."""

    base: Expr
    divisor: int
    modulus: int | None
    stride: int


def _const(e: Expr) -> int | None:
    if isinstance(e, Const) and isinstance(e.value, int) and e.value > 0:
        return e.value
    return None


def _digit(index: Expr, stride: int) -> _Digit | None:
    """``index`` as a digit of an expression, or ``None`` where it reads a tensor (a gather keeps
    its own index: the emitters clamp it into its dimension)."""
    if reads_data(index):
        return None
    modulus = None
    if isinstance(index, Binary) and index.op == "mod" and _const(index.b):
        modulus, index = _const(index.b), index.a
    divisor = 1
    if isinstance(index, Binary) and index.op == "floordiv" and _const(index.b):
        divisor, index = _const(index.b), index.a
    return _Digit(index, divisor, modulus, stride)


def _merged(outer: _Digit, inner: _Digit) -> _Digit | None:
    """The two digits as one, where ``outer`` is the next digit of ``inner``'s expression and its
    dimension holds ``inner``'s whole range."""
    m = inner.modulus
    if m is None or outer.base.key() != inner.base.key() or \
            outer.divisor != inner.divisor * m or outer.stride != inner.stride * m:
        return None
    return _Digit(inner.base, inner.divisor,
                  None if outer.modulus is None else outer.modulus * m, inner.stride)


def _expr(d: _Digit) -> Expr:
    e = d.base   # (its own location: binary() would look one up on the stack)
    if d.divisor != 1:
        e = binary("floordiv", e, Const(d.divisor, e.dtype), e.loc)
    if d.modulus is not None:
        e = binary("mod", e, Const(d.modulus, e.dtype), e.loc)
    return e


def address_terms(indices, strides) -> list[tuple[Expr, int]]:
    """``(index, stride)`` pairs whose products sum to the address of ``indices`` read at
    ``strides``: digits of one expression on nested dimensions merged (indices left as written
    where nothing merges)."""
    out: list[tuple[Expr, int, _Digit | None]] = []
    for index, stride in zip(indices, strides):
        digit = _digit(index, stride)
        if out and digit is not None and out[-1][2] is not None:
            merged = _merged(out[-1][2], digit)
            if merged is not None:
                out[-1] = (_expr(merged), merged.stride, merged)
                continue
        out.append((index, stride, digit))
    return [(index, stride) for index, stride, _ in out]
