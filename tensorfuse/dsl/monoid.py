"""Monoids: the (combine, identity) pairs reductions fold with.

Built in: ``sum``, ``prod``, ``max``, ``min``, ``logsumexp`` and the two-component ``argmax`` / ``argmin``
(value, index). Users define their own with :class:`Monoid`; its combine function is written with the
same DSL operations as a kernel and is checked for an identity and associativity on random numbers
when the monoid is made, so a wrong definition fails early instead of producing a wrong kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from . import dtypes as dt
from .expr import Expr, Symbol, as_expr, binary, compare, unary, user_location, where
from ..errors import DSLError

IdentityFn = Callable[[str], float]


@dataclass(eq=False)
class Monoid:
    """An associative, commutative combine with an identity element, over ``arity`` components.

    ``combine(a, b)`` takes and returns tuples of ``arity`` expressions (or single expressions when
    ``arity`` is 1); ``identity`` is a value, or a function of the dtype giving one, per component.
    ``idempotent`` (``x ⊕ x = x``, as for max and min) lets the rolling update use more corrections.
    ``homomorphisms`` names the correction maps known to distribute over this monoid (see
    ``tensorfuse.algebra``): ``"linear"`` (any linear map, for sums), ``"positive_scale"``, ``"shift"``,
    ``"power"`` (scaling whose effect is a power of the count, for products) and ``"reset"``.
    """

    name: str
    combine: Callable
    identity: Sequence
    arity: int = 1
    idempotent: bool = False
    homomorphisms: tuple[str, ...] = ()
    check: bool = True
    result_dtypes: Callable[[Sequence[str]], Sequence[str]] | None = None

    def __post_init__(self):
        if not isinstance(self.identity, (list, tuple)):
            self.identity = (self.identity,)
        if len(self.identity) != self.arity:
            raise DSLError(f"monoid {self.name!r}: {self.arity} components but "
                           f"{len(self.identity)} identity values")
        if self.check:
            _check_monoid_laws(self)

    def identity_value(self, component: int, dtype: str):
        ident = self.identity[component]
        return ident(dt.resolve(dtype)) if callable(ident) else ident

    def identity_is_sentinel(self, dtype: str, component: int = 0) -> bool:
        """Whether the identity is an extreme value (±inf, or the dtype's largest magnitude, as
        for max, min and logsumexp): a running value still equal to it has seen nothing real, so
        rolling updates must not use it as the reference that later states are kept relative to
        — (x − v)² or exp(x − v) at v = −inf are inf, and inf − inf corrections give NaN."""
        ident = self.identity_value(component, dtype)
        if not dt.is_float(dt.resolve(dtype)) or not isinstance(ident, (int, float, np.number)):
            return False
        import ml_dtypes  # finfo for bf16 as well as NumPy's own types

        ident = float(ident)
        largest = float(ml_dtypes.finfo(dt.to_numpy(dt.resolve(dtype))).max)
        return math.isinf(ident) or abs(ident) >= largest

    def combine_exprs(self, a: Sequence[Expr], b: Sequence[Expr]) -> tuple[Expr, ...]:
        """Apply the combine function to expressions, always returning a tuple."""
        out = self.combine(*a, *b) if self.arity > 1 else self.combine(a[0], b[0])
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(out) != self.arity:
            raise DSLError(f"monoid {self.name!r}: combine returned {len(out)} values, expected "
                           f"{self.arity}")
        return tuple(as_expr(o) for o in out)

    def dtypes_for(self, body_dtypes: Sequence[str]) -> tuple[str, ...]:
        if self.result_dtypes is not None:
            return tuple(self.result_dtypes(body_dtypes))
        return tuple(dt.resolve(d) for d in body_dtypes)


def _check_monoid_laws(m: Monoid, trials: int = 64) -> None:
    """Identity and associativity, checked on random values in float64."""
    from .evaluate import evaluate_scalar

    rng = np.random.default_rng(0)
    syms = [[Symbol(f"{p}{c}", "f64") for c in range(m.arity)] for p in "abc"]
    ab = m.combine_exprs(syms[0], syms[1])
    ab_c = m.combine_exprs(ab, syms[2])
    bc = m.combine_exprs(syms[1], syms[2])
    a_bc = m.combine_exprs(syms[0], bc)
    ident = [Symbol(f"e{c}", "f64") for c in range(m.arity)]
    a_e = m.combine_exprs(syms[0], ident)
    for _ in range(trials):
        env = {s.name: float(rng.integers(-8, 9) if rng.random() < 0.3 else rng.normal() * 3)
               for group in syms for s in group}
        env.update({f"e{c}": float(m.identity_value(c, "f64")) for c in range(m.arity)})
        for lhs, rhs, law in ((ab_c, a_bc, "associative"), (a_e, syms[0], "identity")):
            for x, y in zip(lhs, rhs):
                u, v = evaluate_scalar(x, env), evaluate_scalar(y, env)
                if not (np.isclose(u, v, rtol=1e-9, atol=1e-12) or (np.isnan(u) and np.isnan(v))):
                    raise DSLError(f"monoid {m.name!r} is not a monoid: the {law} law fails at "
                                   f"{env} ({u} != {v})", user_location())


def _lowest(dtype: str):
    """Identity of max: the lowest finite value (TVM recognises max reductions by it)."""
    if dt.is_float(dtype):
        return np.finfo(dt.to_numpy(dtype)).min.item()
    return int(np.iinfo(dt.to_numpy(dtype)).min)


def _highest(dtype: str):
    if dt.is_float(dtype):
        return np.finfo(dt.to_numpy(dtype)).max.item()
    return int(np.iinfo(dt.to_numpy(dtype)).max)


def _max(a, b):
    return binary("max", a, b)


def _min(a, b):
    return binary("min", a, b)


def _logaddexp(a, b):
    hi = binary("max", a, b)
    lo = binary("min", a, b)
    return where(compare("eq", hi, -math.inf), hi, hi + unary("log", 1.0 + unary("exp", lo - hi)))


def _arg_combine(better: str):
    def combine(va, ia, vb, ib):
        take_b = compare(better, vb, va) | ((vb == va) & (ib < ia))
        return where(take_b, vb, va), where(take_b, ib, ia)

    return combine


SUM = Monoid("sum", lambda a, b: a + b, (0,), homomorphisms=("linear",), check=False)
PROD = Monoid("prod", lambda a, b: a * b, (1,), homomorphisms=("power", "reset"), check=False)
MAX = Monoid("max", _max, (_lowest,), idempotent=True,
             homomorphisms=("positive_scale", "shift", "reset"), check=False)
MIN = Monoid("min", _min, (_highest,), idempotent=True,
             homomorphisms=("positive_scale", "shift", "reset"), check=False)
LOGSUMEXP = Monoid("logsumexp", _logaddexp, (-math.inf,), homomorphisms=("shift",), check=False)
ARGMAX = Monoid("argmax", _arg_combine("gt"), (_lowest, lambda d: np.iinfo(np.int32).max), arity=2,
                idempotent=True, check=False, result_dtypes=lambda ds: (dt.resolve(ds[0]), "i32"))
ARGMIN = Monoid("argmin", _arg_combine("lt"), (_highest, lambda d: np.iinfo(np.int32).max), arity=2,
                idempotent=True, check=False, result_dtypes=lambda ds: (dt.resolve(ds[0]), "i32"))
