"""How a reduced value changes when the earlier reductions it depends on change.

For a value ``e`` inside a reduction over axis ``j`` that depends on earlier reductions ``d`` (their
*current* values appear in ``e`` as references), :func:`transfer` finds coefficients and bases with

    e(x, d_new) = Σ_k  coef_k(d_old, d_new) · basis_k(x, d_old)

where each coefficient does not depend on ``j`` (so it can be applied to a running sum of the basis)
and each basis is an expression over the data evaluated at the old values. The rules are a table keyed
by operation (``RULES``) that users can extend with :func:`register_rule`. Examples:

    exp(s − m):        {exp(s − m): exp(m_old − m_new)}                (online softmax)
    p · v / l:         {p·v: exp(m_old − m_new) / l_new}
    (x − μ)²:          {(x − μ)²: 1, (x − μ): 2δ, 1: δ²} with δ = μ_old − μ_new   (centred, stable)

When the dependence cannot be written this way, :class:`NoCorrection` names the sub-expression.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..dsl import dtypes as dt
from ..dsl.expr import (Axis, Binary, Cast, Compare, Const, Expr, Load, Ref, Symbol, Unary, Where,
                        binary, unary, where)
from ..dsl.printer import to_text
from .exprs import (ONE_KEY, add, const, div, has_axis, is_const, mul, neg, nodes, product_basis,
                    refs_to, sub, substitute)


class NoCorrection(Exception):
    """The dependence of ``expr`` on an earlier reduction cannot be corrected incrementally."""

    def __init__(self, expr: Expr, reason: str):
        self.expr = expr
        self.reason = reason
        super().__init__(f"{to_text(expr)}: {reason}")


def old_symbol(dep) -> Symbol:
    return Symbol(f"{dep.name}.old", dep.dtypes[0], dep.axes)


def new_symbol(dep) -> Symbol:
    return Symbol(f"{dep.name}.new", dep.dtypes[0], dep.axes)


@dataclass
class Terms:
    """``Σ coef · basis``, keyed by the basis' structure (``ONE_KEY`` for the constant basis 1)."""

    items: dict = field(default_factory=dict)  # key -> (basis, coef)

    @staticmethod
    def single(basis: Expr, coef: Expr) -> "Terms":
        key = ONE_KEY if is_const(basis, 1) else basis.key()
        return Terms({key: (basis, coef)})

    def bases(self) -> list[Expr]:
        return [b for b, _ in self.items.values()]

    def coef(self, key) -> Expr:
        return self.items[key][1] if key in self.items else const(0.0)

    def plus(self, other: "Terms") -> "Terms":
        out = dict(self.items)
        for key, (b, c) in other.items.items():
            out[key] = (b, add(out[key][1], c)) if key in out else (b, c)
        return Terms(out)

    def scaled(self, factor: Expr) -> "Terms":
        return Terms({k: (b, mul(c, factor)) for k, (b, c) in self.items.items()})

    def times(self, other: "Terms") -> "Terms":
        out = Terms()
        for b1, c1 in self.items.values():
            for b2, c2 in other.items.values():
                out = out.plus(Terms.single(product_basis(b1, b2), mul(c1, c2)))
        return out

    def only(self) -> tuple[Expr, Expr] | None:
        """(basis, coef) when there is exactly one term."""
        return next(iter(self.items.values())) if len(self.items) == 1 else None

    def map_bases(self, fn: Callable[[Expr], Expr]) -> "Terms":
        out = Terms()
        for b, c in self.items.values():
            out = out.plus(Terms.single(fn(b), c))
        return out


@dataclass
class Reset:
    """``e(x, d_new) = e(x, d_old)`` while the dependencies keep their values, and ``fallback``
    (independent of the data) for every element seen so far once one of them changes: the pattern
    of ``where(x == max_j x, ...)`` (argmax written as a dependent reduction)."""

    expr: Expr
    fallback: Expr
    deps: tuple[str, ...]


@dataclass
class Context:
    """What a transfer is relative to: the reduced axis and the reductions that are changing."""

    axis: Axis
    deps: dict                       # name -> Compute of each changing earlier reduction
    positive: set = field(default_factory=set)   # deps whose values are provably positive
    independent: set = field(default_factory=set)  # deps that depend on no other member
    # the deps' own schemes (name -> Scheme): what their values may do when theirs move
    schemes: dict = field(default_factory=dict)
    # deps whose running values may pass through many orders of magnitude on the way to their
    # final ones (products, and values computed from them): terms are not centred on them
    # (:func:`rebased`)
    wandering: set = field(default_factory=set)
    rules: dict = field(default_factory=dict)     # user rules: op -> [fn]
    memo: dict = field(default_factory=dict)

    def to_new(self, e: Expr) -> Expr:
        """``e`` with every dependency reference read as its new value."""
        return substitute(e, lambda n: new_symbol(self.deps[n.compute.name])
                          if isinstance(n, Ref) and n.compute.name in self.deps else None)

    def depends(self, e: Expr) -> bool:
        return bool(refs_to(e, self.deps))


def new_to_old(e: Expr) -> Expr:
    return substitute(e, lambda n: Symbol(n.name[:-4] + ".old", n.dtype, n.axes)
                      if isinstance(n, Symbol) and n.name.endswith(".new") else None)


def old_to_new(e: Expr) -> Expr:
    return substitute(e, lambda n: Symbol(n.name[:-4] + ".new", n.dtype, n.axes)
                      if isinstance(n, Symbol) and n.name.endswith(".old") else None)


def mentions_new(e: Expr) -> bool:
    return any(isinstance(n, Symbol) and n.name.endswith(".new") for n in nodes(e))


def shift_delta(terms: Terms) -> Expr | None:
    """δ with ``e(new) = e(old) + δ`` when the data-dependent part of ``e`` does not change."""
    for key, (_, c) in terms.items.items():
        if key != ONE_KEY and mentions_new(c):
            return None
    c1 = terms.coef(ONE_KEY)
    return sub(c1, new_to_old(c1))


def mentions_old(e: Expr) -> bool:
    return any(isinstance(n, Symbol) and n.name.endswith(".old") for n in nodes(e))


def rebased(e: Expr, terms: Terms, ctx: "Context | None" = None) -> Terms:
    """Write a shifted value as ``e_old + Σ Δ_k·b_k`` (centred at the old values: the stable
    form). Applies when the terms whose coefficient changes are shifts — coefficients of the new
    values alone, like ``−v.new`` in ``x − v`` or ``where(m, x − v, 0)`` — while the others keep
    theirs: then ``e(new) = e(old) + Σ (c_k(new) − c_k(old))·b_k``, and a running sum of ``e_old``
    stays as small as the data's spread about the reference, where ``Σ x − v·Σ 1`` cancels.
    Rescaled terms (``exp(m.old − m.new)·b``) are left as they are: written as shifts they would
    need ``κ − 1``, which cancels instead. Nor is a value centred on a dependency of
    ``ctx.wandering``: a running product's reference can sit orders of magnitude from its final
    value (factors of 3 before the maximum they are divided by has been seen: 3^20), and a sum
    kept relative to it holds terms that large, which the final correction cancels to the
    data's size (the generated chains of ``tests/algebra/test_generated_chains.py`` found one
    wrong in the first digit); uncentred, ``Σ x − c·Σ 1`` reads only the final value."""
    changing = [(b, c) for b, c in terms.items.values() if mentions_new(c)]
    if ctx is not None and ctx.wandering and any(
            n.name[:-4] in ctx.wandering for _, c in changing for n in nodes(c)
            if isinstance(n, Symbol) and n.name.endswith(".new")):
        return terms
    if not changing or len(changing) == len(terms.items) or any(mentions_old(c)
                                                                  for _, c in changing):
        return terms
    out = Terms.single(e, const(1.0))
    for b, c in changing:
        delta = sub(c, new_to_old(c))
        if not is_const(delta, 0):
            out = out.plus(Terms.single(b, delta))
    return out


# -- positivity ----------------------------------------------------------------------------------

def is_positive(e: Expr, ctx: Context) -> bool:
    """A conservative proof that ``e > 0`` (or ``e ≥ 0`` for values that scale empty states)."""
    if isinstance(e, Const):
        return e.value > 0
    if isinstance(e, Symbol):
        return e.name.rsplit(".", 1)[0] in ctx.positive
    if isinstance(e, Ref):
        return e.compute.name in ctx.positive
    if isinstance(e, Unary):
        if e.op in ("exp", "exp2", "sigmoid"):
            return True
        if e.op in ("sqrt", "rsqrt", "abs"):
            return is_positive(e.a, ctx) or e.op == "abs"
        return False
    if isinstance(e, Binary):
        if e.op in ("mul", "div", "add", "min"):
            return is_positive(e.a, ctx) and is_positive(e.b, ctx)
        if e.op == "max":
            return is_positive(e.a, ctx) or is_positive(e.b, ctx)
        if e.op == "pow":
            return is_positive(e.a, ctx)
        return False
    if isinstance(e, Where):
        return is_positive(e.a, ctx) and is_positive(e.b, ctx)
    if isinstance(e, Cast):
        return is_positive(e.a, ctx)
    return False


def is_nonnegative(e: Expr, ctx: Context) -> bool:
    if isinstance(e, Const):
        return e.value >= 0
    if isinstance(e, Unary) and e.op in ("abs", "sqrt", "exp", "exp2", "sigmoid"):
        return True
    if isinstance(e, Binary) and e.op in ("mul", "div", "add"):
        return is_nonnegative(e.a, ctx) and is_nonnegative(e.b, ctx)
    if isinstance(e, Where):
        return is_nonnegative(e.a, ctx) and is_nonnegative(e.b, ctx)
    return is_positive(e, ctx)


# -- the rules -----------------------------------------------------------------------------------

Rule = Callable[[Expr, Context], "Terms | Reset | None"]
RULES: dict[str, Rule] = {}


def register_rule(op: str, rule: Rule | None = None):
    """Add a rule for operation ``op`` (``"exp"``, ``"tanh"``, ``"mul"``, ``"where"``, ...), tried
    before the built-in one: ``rule(expr, ctx)`` returns :class:`Terms`, or ``None`` when it does
    not apply. Usable as a decorator. Every correction a rule yields is still checked numerically."""
    def add_rule(fn: Rule) -> Rule:
        USER_RULES.setdefault(op, []).append(fn)
        return fn

    return add_rule if rule is None else add_rule(rule)


USER_RULES: dict[str, list[Rule]] = {}


def _builtin(op: str):
    def deco(fn: Rule) -> Rule:
        RULES[op] = fn
        return fn

    return deco


def op_name(e: Expr) -> str:
    if isinstance(e, (Unary, Binary)):
        return e.op
    return type(e).__name__.lower()


def transfer(e: Expr, ctx: Context) -> Terms | Reset:
    """The transfer of ``e``; raises :class:`NoCorrection` when there is none."""
    if e.uid not in ctx.memo:
        ctx.memo[e.uid] = _transfer(e, ctx)
    return ctx.memo[e.uid]


def linear(e: Expr, ctx: Context) -> Terms:
    t = transfer(e, ctx)
    if isinstance(t, Reset):
        raise NoCorrection(e, "an equality test against a running maximum can only be the whole "
                              "value being reduced, not part of a larger expression")
    return t


def _transfer(e: Expr, ctx: Context) -> Terms | Reset:
    if not ctx.depends(e):
        if has_axis(e, ctx.axis):
            return Terms.single(e, const(1.0))
        return Terms.single(const(1.0), e)
    if isinstance(e, Ref) and e.compute.name in ctx.deps:
        return Terms.single(const(1.0), new_symbol(ctx.deps[e.compute.name]))
    if not has_axis(e, ctx.axis):
        return Terms.single(const(1.0), ctx.to_new(e))
    op = op_name(e)
    for rule in ctx.rules.get(op, []) + USER_RULES.get(op, []):
        found = rule(e, ctx)
        if found is not None:
            return found
    if op in RULES:
        return RULES[op](e, ctx)
    raise NoCorrection(e, f"no rule says how `{op}` changes when {_deps_text(e, ctx)} changes")


def _deps_text(e: Expr, ctx: Context) -> str:
    return " and ".join(sorted(refs_to(e, ctx.deps))) or "a dependency"


@_builtin("add")
def _add(e, ctx):
    return linear(e.a, ctx).plus(linear(e.b, ctx))


@_builtin("sub")
def _sub(e, ctx):
    return linear(e.a, ctx).plus(linear(e.b, ctx).scaled(const(-1.0)))


@_builtin("neg")
def _neg(e, ctx):
    return linear(e.a, ctx).scaled(const(-1.0))


@_builtin("mul")
def _mul(e, ctx):
    return rebased(e.a, linear(e.a, ctx), ctx).times(rebased(e.b, linear(e.b, ctx), ctx))


@_builtin("div")
def _div(e, ctx):
    den = linear(e.b, ctx).only()
    if den is None:
        raise NoCorrection(e, f"dividing by {to_text(e.b)}, which shifts when "
                              f"{_deps_text(e.b, ctx)} changes; only division by a value that is "
                              "rescaled can be corrected")
    basis, coef = den
    num = rebased(e.a, linear(e.a, ctx), ctx)
    return num.map_bases(lambda b: b if is_const(basis, 1) else binary("div", b, basis)) \
        .scaled(div(const(1.0), coef))


@_builtin("pow")
def _pow(e, ctx):
    if ctx.depends(e.b) or has_axis(e.b, ctx.axis) or not isinstance(e.b, Const):
        raise NoCorrection(e, "a power correction needs a constant exponent")
    n = e.b.value
    base = rebased(e.a, linear(e.a, ctx), ctx)
    if float(n).is_integer() and 0 <= n <= 8:
        out = Terms.single(const(1.0), const(1.0))
        for _ in range(int(n)):
            out = out.times(base)
        return out
    single = base.only()
    if single is None or not is_positive(single[1], ctx):
        raise NoCorrection(e, "a fractional power of a value that is not a positive rescaling")
    b, c = single
    return Terms.single(binary("pow", b, e.b), binary("pow", c, e.b))


def _exponential(name: str):
    def rule(e, ctx):
        delta = shift_delta(linear(e.a, ctx))
        if delta is None:
            raise NoCorrection(e, f"{name} of {to_text(e.a)}, whose change when "
                                  f"{_deps_text(e.a, ctx)} changes is not a plain shift")
        return Terms.single(e, unary(name, delta))

    return rule


RULES["exp"] = _exponential("exp")
RULES["exp2"] = _exponential("exp2")


def _logarithm(name: str):
    def rule(e, ctx):
        single = rebased(e.a, linear(e.a, ctx), ctx).only()
        if single is None or not is_positive(single[1], ctx):
            raise NoCorrection(e, f"{name} of {to_text(e.a)}: only a positive rescaling of the "
                                  "argument can be corrected")
        b, c = single
        return Terms.single(unary(name, b), const(1.0)).plus(
            Terms.single(const(1.0), unary(name, c)))

    return rule


RULES["log"] = _logarithm("log")
RULES["log2"] = _logarithm("log2")


def _homogeneous(name: str, needs_positive: bool):
    def rule(e, ctx):
        single = rebased(e.a, linear(e.a, ctx), ctx).only()
        if single is None or (needs_positive and not is_nonnegative(single[1], ctx)):
            raise NoCorrection(e, f"{name} of {to_text(e.a)}: only a "
                                  f"{'non-negative ' if needs_positive else ''}rescaling of the "
                                  "argument can be corrected")
        b, c = single
        return Terms.single(unary(name, b), unary(name, c))

    return rule


RULES["sqrt"] = _homogeneous("sqrt", True)
RULES["rsqrt"] = _homogeneous("rsqrt", True)
RULES["abs"] = _homogeneous("abs", False)


@_builtin("cast")
def _cast(e, ctx):
    if not dt.is_float(e.dtype):
        raise NoCorrection(e, "converting a corrected value to an integer or boolean")
    return transfer(e.a, ctx)


@_builtin("where")
def _where(e, ctx):
    if ctx.depends(e.cond):
        reset = _reset(e, ctx)
        if reset is not None:
            return reset
        raise NoCorrection(e, f"the condition {to_text(e.cond)} depends on "
                              f"{_deps_text(e.cond, ctx)}: elements already reduced would switch "
                              "branches")
    zero = const(0.0)
    absorbing = _where_with_constant(e, ctx)
    if absorbing is not None:
        return absorbing

    def masked(terms: Terms, take_true: bool) -> Terms:
        return terms.map_bases(lambda b: where(e.cond, b, zero) if take_true
                               else where(e.cond, zero, b))

    return masked(linear(e.a, ctx), True).plus(masked(linear(e.b, ctx), False))


def _where_with_constant(e: Where, ctx: Context) -> Terms | None:
    """``where(c, a, K)`` with ``K`` infinite (a masked score) or zero, and ``a`` shifted or
    positively rescaled: the whole select shifts or rescales pointwise, since κ·∞ + δ = ∞ for
    κ > 0 (and κ·0 = 0). Keeps masked maxima correctable by one shift."""
    import math

    for value, other, flip in ((e.a, e.b, False), (e.b, e.a, True)):
        if not isinstance(other, Const):
            continue
        c = other.value
        infinite = isinstance(c, float) and math.isinf(c)
        if not (c == 0 or infinite):
            continue
        terms = linear(value, ctx)

        def masked(b: Expr) -> Expr:
            return where(e.cond, other, b) if flip else where(e.cond, b, other)

        delta = shift_delta(terms)
        if infinite and delta is not None:
            return Terms.single(e, const(1.0)).plus(Terms.single(const(1.0), delta))
        rest = [(b, k) for key, (b, k) in terms.items.items() if key != ONE_KEY]
        if len(rest) == 1 and is_positive(rest[0][1], ctx) and (infinite or len(terms.items) == 1):
            out = Terms.single(masked(rest[0][0]), rest[0][1])
            if infinite and ONE_KEY in terms.items:
                out = out.plus(Terms.single(const(1.0), terms.coef(ONE_KEY)))
            return out
    return None


def _reset(e: Where, ctx: Context) -> Reset | None:
    cond, keep, other = e.cond, e.a, e.b
    if not isinstance(cond, Compare) or cond.op not in ("eq", "ne"):
        return None
    if cond.op == "ne":
        keep, other = other, keep
    sides = [(cond.a, cond.b), (cond.b, cond.a)]
    for value, ref in sides:
        if isinstance(ref, Ref) and ref.compute.name in ctx.deps and not ctx.depends(value):
            dep = ctx.deps[ref.compute.name]
            if dep.monoid is None or dep.monoid.name not in ("max", "min"):
                return None
            if dep.bodies[0].key() != value.key():
                return None
            if ctx.depends(keep) or ctx.depends(other) or has_axis(other, ctx.axis):
                return None
            return Reset(e, other, (dep.name,))
    return None


def _extremum(op: str):
    def rule(e, ctx):
        ta, tb = linear(e.a, ctx), linear(e.b, ctx)
        da, db = shift_delta(ta), shift_delta(tb)
        if da is not None and db is not None and da.key() == db.key():
            return Terms.single(e, const(1.0)).plus(Terms.single(const(1.0), da))
        sa, sb = ta.only(), tb.only()
        if sa and sb and sa[1].key() == sb[1].key() and is_positive(sa[1], ctx):
            return Terms.single(binary(op, sa[0], sb[0]), sa[1])
        raise NoCorrection(e, f"elementwise {op} of values that change differently when "
                              f"{_deps_text(e, ctx)} changes")

    return rule


RULES["max"] = _extremum("max")
RULES["min"] = _extremum("min")


@_builtin("load")
def _load(e, ctx):
    raise NoCorrection(e, f"an index of {e.param.name} depends on {_deps_text(e, ctx)}")
