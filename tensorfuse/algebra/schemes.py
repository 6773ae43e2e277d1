"""Running states for one reduction of a fused chain, and how to correct and combine them.

A :class:`Scheme` says, for a reduction ``R = ⊕_j f(x_j, d)`` whose dependencies ``d`` change while
``j`` is swept:

- ``states``: what is accumulated (one running value per basis of ``f``'s transfer, with the monoid
  that folds it and the per-element value folded);
- ``correct``: each state's new value after the dependencies move from ``d.old`` to ``d.new``, as an
  expression over the symbols ``R#k`` (the states) and ``d.old`` / ``d.new``; it maps empty states
  (the identity) to empty states;
- ``value``: ``R`` itself from its states and the dependencies' current values (``d.new``);
- ``settle``: ``correct`` as applied once per row at the end (merging splits, and from the last
  references to the true values), where an overflowing coefficient must not be hidden (below).

Chunks fold with ``state_k ⊕ chunk_k`` after correcting; splits merge with ``⊕_s correct(state_s)``
(corrected from each split's dependency values to the final ones). Which monoid admits which
correction is the algebra's central check:

| monoid | correction allowed | why it distributes |
| --- | --- | --- |
| sum (``linear``) | any linear map of the basis sums | Σ c·b = c·Σ b |
| max, min (``positive_scale``, ``shift``) | ``κ·S + δ`` with κ > 0 | monotone maps commute with max |
| logsumexp (``shift``) | ``S + δ`` | lse(b + δ) = lse(b) + δ |
| prod (``power``) | ``S · κ^n`` (n: elements seen) | Π κ·b = κⁿ Π b |
| max, min, prod (``reset``) | back to a data-independent value when a maximum moves | see ``transfer.Reset`` |

A reduction whose dependence admits no correction (``Σ |x − mean|``: the mean's final value
decides each term) can still share the pass where one block holds the whole swept axis: its
dependencies are then final before it is summed (:func:`held_scheme`, kind ``held``).
"""
from __future__ import annotations

import math
from typing import Sequence
from dataclasses import dataclass, field

from ..dsl import dtypes as dt
from ..dsl.expr import (Binary, Cast, Const, Expr, Ref, Symbol, Unary, binary, compare,
                        unary, where)
from ..dsl.monoid import SUM, Monoid
from ..dsl.printer import to_text
from .exprs import (ONE_KEY, add, const, is_const, mul, refs_to, simplify, substitute,
                    symbols_in)
from .transfer import (Context, NoCorrection, Reset, Terms, is_positive, linear, new_symbol,
                       old_symbol, old_to_new, rebased, transfer)


EXTRAPOLATION = Symbol("__extrapolation", "f32")  # N / seen, in Scheme.reference
# how a state body reads a member it depends on (``d.ref`` / ``d.exact``): dependency_symbols
REFERENCE, EXACT = "ref", "exact"
# the kinds whose states read their dependencies' running values (``d.exact``) rather than
# references: a reset compares with them; a held member (:func:`held_scheme`) their final ones
EXACT_READERS = ("reset", "held")


@dataclass
class State:
    """One running value: ``⊕_j body`` with ``monoid``."""

    suffix: str           # "" for a single state, else a readable tag
    body: Expr            # the per-element value (dependencies read as their current values)
    monoid: Monoid
    dtype: str


@dataclass
class Scheme:
    compute: object                       # the reduction's Compute
    kind: str                             # independent | linear | affine | power | reset
    deps: tuple[str, ...]
    states: list[State]
    correct: list[Expr] = field(default_factory=list)
    value: list[Expr] = field(default_factory=list)   # one per component of the reduction
    settle: list[Expr] = field(default_factory=list)  # empty: the same as ``correct``
    # a max or min whose identity (±FLT_MAX) is kept as a reference: every member relative to it
    # reads it only through exp(±(its own elements − it)) (:func:`identity_keepable`)
    keeps_identity: bool = False

    def state_symbol(self, k: int) -> Symbol:
        return Symbol(f"{self.compute.name}#{k}", self.states[k].dtype)

    def corrections(self, settled: bool = False) -> list[Expr]:
        """``correct``, or with ``settled`` the once-per-row form (``settle``, where a scheme
        has one)."""
        return (self.settle or self.correct) if settled else self.correct

    @property
    def name(self) -> str:
        return self.compute.name

    def true_value(self, k: int = 0, settled: bool = False) -> Expr:
        """Component ``k`` of the value when the states are kept relative to references of the
        dependencies (``d.old``) that differ from their true values (``d.new``): the states are
        corrected from the references to the true values, then combined by the value formula.
        ``settled``: the final value (corrections as in ``settle``)."""
        if not self.deps:
            return self.value[k]
        corrected = {f"{self.name}#{i}": c for i, c in enumerate(self.corrections(settled))}
        return substitute(self.value[k], lambda n: corrected.get(n.name)
                          if isinstance(n, Symbol) else None)

    def reference(self) -> Expr:
        """The value later members are kept relative to while the axis is being swept: the value
        formula with every running sum extrapolated to the whole axis (multiplied by the symbol
        ``EXTRAPOLATION``, which a lowering binds to ``N / seen``; a running logsumexp gets
        ``+ log(N / seen)``) and the dependencies at their
        own references (``d.new``). Any reference gives an exact result (the final value corrects
        from it); one close to the final value keeps the corrections from cancelling. A mean
        written ``Σ y / N`` comes out as the running mean, and one written ``Σ y / l`` with
        ``l = Σ 1`` (or an integer count) as the running mean too (the extrapolations cancel),
        where extrapolating the value itself would put it ``N / seen`` times too far from the
        data.
        A sum seen as 0 so far (a count of a masked prefix, float or integer) is referenced as 1
        while part of the axis is still unseen: members may divide by it (a masked variance's
        ``x − Σ x·m / Σ m`` was 0/0 after a first block masked whole, and its states NaN for
        good), and any finite reference is exact. Once the whole axis is seen (extrapolated by
        1: one block the whole row) the reference is the value itself, which a kernel of one
        block uses as the true value."""
        scaled = {}
        for k, st in enumerate(self.states):
            if st.monoid.name == "sum" and dt.is_float(st.dtype):
                scaled[f"{self.name}#{k}"] = mul(self.state_symbol(k), EXTRAPOLATION)
            elif st.monoid.name == "sum" and dt.is_int(st.dtype):   # a count: extrapolated as
                # the float sums beside it are (a mean over it is the running mean), kept whole
                scaled[f"{self.name}#{k}"] = Cast(mul(Cast(self.state_symbol(k), "f32"),
                                                      EXTRAPOLATION), st.dtype)
            elif st.monoid.name == "logsumexp":  # log Σ exp, its sum extrapolated
                scaled[f"{self.name}#{k}"] = add(self.state_symbol(k), unary("log", EXTRAPOLATION))
        found = self.usable(simplify(substitute(self.value[0], lambda n: scaled.get(n.name)
                                                if isinstance(n, Symbol) else None)))
        dtype = self.compute.dtypes[0]
        if self.compute.monoid.name == "sum" and (dt.is_float(dtype) or dt.is_int(dtype)):
            unseen = compare("gt", EXTRAPOLATION, const(1.0))
            zero, one = (Const(v if dt.is_float(dtype) else int(v), dtype) for v in (0.0, 1.0))
            return where(compare("eq", found, zero), where(unseen, one, found), found)
        return found

    def usable(self, e: Expr) -> Expr:
        """``e`` as a reference: 0 where it is no usable one — not finite (an overflow, or a
        logsumexp of nothing), or the identity of a maximum or minimum that has seen nothing
        real yet (a masked prefix, a split part of masked elements; −FLT_MAX); a maximum or
        minimum that overflowed to ±inf gets ±FLT_MAX instead. Members kept
        relative to such a value would be infinite, or huge; any finite reference keeps the
        result exact, and the final values use the true ones, as the unfused program does.
        One comparison per row and block: it sits in attention's inner loop."""
        dtype = self.compute.dtypes[0]
        if not dt.is_float(dtype):
            return e
        bound = math.inf   # one comparison: |e| below the identity's magnitude (FLT_MAX for a
        monoid = self.compute.monoid   # max or min; inf otherwise) is finite and not it
        if not (monoid.identity_is_sentinel(dtype)
                and math.isfinite(monoid.identity_value(0, dtype))):
            return where(compare("lt", unary("abs", e), Const(bound, dtype)), e, const(0.0))
        bound = abs(float(monoid.identity_value(0, dtype)))
        # kept: a row whose real values all sit at the identity (a float32 mask's finfo.min)
        # weighs them equally, as unfused; against 0 their exp(x − v) underflowed to 0/0
        below = "le" if self.keeps_identity else "lt"
        # a maximum or minimum that overflowed to ±inf is replaced by ±FLT_MAX, not by 0: members
        # such as exp(τ(x − v)) are 0 against it, as against the true +inf (against 0 they
        # overflowed, and a minimum of them could not tell inf from "nothing seen")
        overflow = where(compare("eq", unary("abs", e), Const(math.inf, dtype)),
                         where(compare("gt", e, const(0.0)), Const(bound, dtype),
                               Const(-bound, dtype)), const(0.0))
        return where(compare(below, unary("abs", e), Const(bound, dtype)), e, overflow)

    def describe(self) -> str:
        """The corrections in readable form (for show() and tutorials)."""
        lines = [f"{self.name}: {self.kind} over {', '.join(self.deps) or 'no dependencies'}"]
        for k, st in enumerate(self.states):
            lines.append(f"  state {self.name}#{k} = {st.monoid.name}_j {to_text(st.body)}")
            if self.deps:
                lines.append(f"    when {', '.join(self.deps)} move: {self.name}#{k} <- "
                             f"{to_text(self.correct[k])}")
        lines.append(f"  value: {self.name} = " + ", ".join(to_text(v) for v in self.value))
        return "\n".join(lines)


def identity_keepable(dependency: str, monoid: str, own: Expr, bodies: list[Expr],
                      references: Sequence[Expr] = ()) -> bool:
    """Whether a running max (``monoid`` ``"max"``; ``"min"`` mirrored) of the elements ``own`` can
    stay the reference of the member ``bodies`` while it is still its identity (−FLT_MAX): true
    when each body reads it only as ``exp(own − dependency)`` (``exp2`` too). Such a term is at
    most 1 for every element the maximum has seen, whatever its value, and its correction is a
    scale by ``exp(old − new)`` ≤ 1: a row whose real values are all −FLT_MAX gets them weighed as
    unfused. Anything else (``(y − v)²``, ``exp(y − v)`` of another ``y``) could overflow against
    −FLT_MAX, so those members keep 0 as their reference. ``references``: the value formulas of
    dependents that later members are kept relative to; one that reads the maximum itself
    (``max(y) − v/2`` as the reference of a ``Σ (y − w)``) would put that reference near
    ±FLT_MAX/2 in a split part that saw none of the maximum's elements, and the later member's
    terms would cancel against it: not keepable either."""
    reads = {f"{dependency}.new", f"{dependency}.old"}
    if any(reads & symbols_in(v) for v in references):
        return False
    sign = 1 if monoid == "max" else -1

    def gap(e: Expr) -> bool:   # own − dependency (max) or dependency − own (min)
        if not (isinstance(e, Binary) and e.op == "sub"):
            return False
        high, low = (e.a, e.b) if sign > 0 else (e.b, e.a)
        return isinstance(low, Ref) and low.compute.name == dependency and \
            high.key() == own.key()

    def reads_only_gaps(e: Expr) -> bool:
        if isinstance(e, Unary) and e.op in ("exp", "exp2") and gap(e.a):
            return True
        if isinstance(e, Ref) and e.compute.name == dependency:
            return False
        return all(reads_only_gaps(c) for c in e.children())

    return all(reads_only_gaps(b) for b in bodies)


def _guarded_scale(coef: Expr, state: Symbol) -> Expr:
    """``coef · state`` per chunk, with a coefficient that is not finite replaced by 0: an empty
    (zero) state stays empty even when the correction overflows (e.g. exp(old − new) after a
    reference moved off a masked-only prefix). The guard is on the coefficient, computed once per
    row, not on every state element of every chunk."""
    if is_const(coef, 1):
        return state
    finite = compare("lt", unary("abs", coef), math.inf)
    return mul(where(finite, coef, const(0.0)), state)


def _settled_scale(coef: Expr, state: Symbol) -> Expr:
    """``coef · state`` guarded on the state instead: an empty state stays empty, but a state that
    holds something keeps an overflowing coefficient. For the once-per-row corrections (where
    the true value of a dependency can still be its identity — a row whose masked max saw
    nothing: −FLT_MAX — and Σ (x − v)² must come out infinite, as unfused, not as the Σ x² that
    zeroing the coefficient (v − 0)² would leave) and for the value formula's coefficients that
    are not constants (Σ where(m, x − 2v, 0) = S_x − 2v·S_1 must stay 0 when all is masked)."""
    if is_const(coef, 1) or is_const(coef, 0):
        return mul(coef, state)
    return where(compare("eq", state, const(0.0)), const(0.0), mul(coef, state))


def _state_dtype(compute) -> str:
    d = compute.dtypes[0]
    return d if dt.is_float(d) else "f32"


def independent_scheme(compute, bodies) -> Scheme:
    """A reduction that depends on no other member: its running state is the reduction itself."""
    states = [State("" if compute.arity == 1 else f"_{k}", b, compute.monoid, compute.dtypes[k])
              for k, b in enumerate(bodies)]
    scheme = Scheme(compute, "independent", (), states)
    scheme.correct = [scheme.state_symbol(k) for k in range(len(states))]
    scheme.value = [scheme.state_symbol(k) for k in range(len(states))]
    return scheme


def derive_scheme(compute, body: Expr, ctx: Context) -> Scheme:
    """The scheme for reduction ``compute`` whose (inlined) body is ``body``; raises
    :class:`NoCorrection` when its monoid does not admit the corrections its dependence needs."""
    monoid = compute.monoid
    homs = set(monoid.homomorphisms)
    deps = tuple(sorted(n for n in ctx.deps if n in _dep_names(body, ctx)))
    top = transfer(body, ctx)
    if isinstance(top, Reset):
        # back to the identity any monoid allows (a count of the elements equal to the maximum:
        # 0 when it moves); to another value, only those that declare it
        if "reset" not in homs and not _resets_to_identity(top, monoid, compute.dtypes[0]):
            raise NoCorrection(body, f"{monoid.name} does not allow resetting when a maximum "
                                     f"moves to {to_text(top.fallback)}, which is not its "
                                     "identity")
        scheme = _reset_scheme(compute, body, top, monoid, ctx)
    elif "linear" in homs:
        scheme = _linear_scheme(compute, body, top, ctx, deps)
    elif homs & {"positive_scale", "shift"}:
        scheme = _affine_scheme(compute, body, top, ctx, deps, homs)
    elif "power" in homs:
        scheme = _power_scheme(compute, body, top, ctx, deps)
    else:
        raise NoCorrection(body, f"no correction distributes over the monoid {monoid.name!r}; "
                                 "declare its homomorphisms (Monoid(..., homomorphisms=...)) if "
                                 "some do")
    scheme.correct = [simplify(c) for c in scheme.correct]
    scheme.settle = [simplify(c) for c in scheme.settle]
    scheme.value = [simplify(v) for v in scheme.value]
    return scheme


def _dep_names(body: Expr, ctx: Context) -> set[str]:
    return refs_to(body, ctx.deps)


def _linear_scheme(compute, body: Expr, top: Terms, ctx: Context, deps) -> Scheme:
    top = rebased(body, top, ctx)  # a shifted body is summed centred on its references
    order: list = []
    transfers: dict = {}
    pending = list(top.items.items())
    while pending:
        key, (basis, _) = pending.pop(0)
        if key in transfers:
            continue
        if len(transfers) >= 16:
            raise NoCorrection(basis, "the correction needs more than 16 running sums")
        t = rebased(basis, linear(basis, ctx), ctx) if key != ONE_KEY else \
            Terms.single(const(1.0), const(1.0))
        transfers[key] = (basis, t)
        order.append(key)
        pending.extend((k, v) for k, v in t.items.items() if k not in transfers)
    dtype = _state_dtype(compute)
    states = [State(f"_{i}" if len(order) > 1 else "", transfers[k][0], SUM, dtype)
              for i, k in enumerate(order)]
    scheme = Scheme(compute, "linear", deps, states)
    index = {k: i for i, k in enumerate(order)}
    for key in order:
        _, t = transfers[key]
        for scale, into in ((_guarded_scale, scheme.correct), (_settled_scale, scheme.settle)):
            total: Expr = const(0.0)
            for k2, (_, c) in t.items.items():
                total = add(total, scale(c, scheme.state_symbol(index[k2])))
            into.append(total)
    value: Expr = const(0.0)
    for k2, (_, c) in top.items.items():
        value = add(value, _settled_scale(simplify(old_to_new(c)), scheme.state_symbol(index[k2])))
    scheme.value = [value]
    return scheme


def _positive_affine(terms: Terms, ctx: Context, allow_scale: bool, what: Expr):
    """(basis, κ, δ) for ``κ·basis + δ`` with κ > 0, or NoCorrection."""
    delta = terms.coef(ONE_KEY)
    rest = [(k, b, c) for k, (b, c) in terms.items.items() if k != ONE_KEY]
    if len(rest) != 1:
        raise NoCorrection(what, "a max/min-type reduction can only be corrected by a positive "
                                 "rescaling plus a shift of one running value")
    _, basis, kappa = rest[0]
    if not is_const(kappa, 1):
        if not allow_scale:
            raise NoCorrection(what, "this monoid is only corrected by shifts, and the value is "
                                     "rescaled")
        if not is_positive(kappa, ctx):
            raise NoCorrection(what, f"the rescaling {to_text(kappa)} is not provably positive, "
                                     "and a negative one would turn a max into a min")
    return basis, kappa, delta


def _affine_scheme(compute, body, top: Terms, ctx, deps, homs) -> Scheme:
    allow_scale = "positive_scale" in homs
    # a shifted body of a monoid that accumulates (logsumexp) is kept centred on its references:
    # lse(x − v_ref), not lse(x) − v, whose running value would hold the data's offset at
    # float32's resolution there. A max or min only selects: max(x) is exact, and one shift at
    # the end rounds once, where a centred state would carry every reference it moved through.
    centred = not compute.monoid.idempotent
    basis, kappa, delta = _positive_affine(rebased(body, top, ctx) if centred else top, ctx,
                                           allow_scale, body)
    own = rebased(basis, linear(basis, ctx), ctx) if centred else linear(basis, ctx)
    b2, k2, d2 = _positive_affine(own, ctx, allow_scale, basis)
    if b2.key() != basis.key():
        raise NoCorrection(basis, "its running value does not correct into itself")
    monoid = compute.monoid
    scheme = Scheme(compute, "affine", deps, [State("", basis, monoid, _state_dtype(compute))])
    s = scheme.state_symbol(0)
    identity = Const(monoid.identity_value(0, scheme.states[0].dtype), scheme.states[0].dtype)
    corrected = add(mul(k2, s), d2)
    scheme.correct = [where(compare("eq", s, identity), s, corrected)]
    # nothing seen stays the identity (as unfused, and so that later members know it is no
    # reference): κ·(−FLT_MAX) + δ would be a huge number that is neither
    scheme.value = [where(compare("eq", s, identity), identity,
                          add(mul(old_to_new(kappa), s), old_to_new(delta)))]
    return scheme


def _power_scheme(compute, body, top: Terms, ctx, deps) -> Scheme:
    single = top.only()
    if single is None or is_const(single[0], 1):
        raise NoCorrection(body, "a product can only be corrected when every factor is rescaled "
                                 "by the same amount")
    basis, kappa = single
    own = linear(basis, ctx).only()
    if own is None or own[0].key() != basis.key():
        raise NoCorrection(basis, "its running product does not correct into itself")
    dtype = _state_dtype(compute)
    scheme = Scheme(compute, "power", deps, [State("_prod", basis, compute.monoid, dtype),
                                             State("_count", const(1.0), SUM, dtype)])
    p, n = scheme.state_symbol(0), scheme.state_symbol(1)
    scheme.correct = [mul(p, binary("pow", own[1], n)), n]
    scheme.value = [mul(binary("pow", old_to_new(kappa), n), p)]
    return scheme


def dependency_symbols(body: Expr, members, scheme: "Scheme") -> Expr:
    """A state ``body`` of ``scheme`` with its reads of the chain's ``members`` (names) as the
    symbols an emitter binds block by block: ``d.ref``, the reference the states are kept
    relative to; in a reset's state ``d.exact``, the running value itself — a comparison by
    equality would not find a value in a reference that stands for an infinite maximum by the
    largest finite number."""
    kind = EXACT if scheme.kind in EXACT_READERS else REFERENCE
    return substitute(body, lambda n: Symbol(f"{n.compute.name}.{kind}", n.dtype)
                      if isinstance(n, Ref) and n.compute.name in members else None)


def inexact_reset(schemes: dict, name: str) -> str | None:
    """Why member ``name`` (a reset, or a member held to one block) cannot read its
    dependencies' running values themselves (a dependency kept relative to another member, not
    as its value), or None (also where ``name`` reads them by reference).
    ``transfer.Reset`` compares with an extremum whose body reads no changing member, so every
    reset derived today passes; the emitters, which compare with those values, check it."""
    scheme = schemes[name]
    for d in scheme.deps if scheme.kind in EXACT_READERS else ():
        dep = schemes[d]
        if dep.kind != "independent" or len(dep.states) != 1:
            reads = f"resets where {d} moves" if scheme.kind == "reset" else f"reads {d}'s value"
            return (f"{name} {reads}, and {d}'s running state is kept relative to "
                    f"another member ({dep.kind}), not its value: {name} needs the value "
                    "itself")
    return None


def held_scheme(compute, body: Expr, deps: tuple[str, ...]) -> Scheme:
    """A reduction whose dependence on ``deps`` admits no correction, summed where one block
    holds the whole swept axis: the dependencies are final when its only block is folded, and
    its one state reads their values (``d.exact``). Its correction is the identity — right only
    for an empty state, which is all a sweep of one block corrects; the row-tile template
    refuses knobs that sweep a row in more than one block or part."""
    scheme = Scheme(compute, "held", tuple(deps),
                    [State("", body, compute.monoid, compute.dtypes[0])])
    scheme.correct = [scheme.state_symbol(0)]
    scheme.value = [scheme.state_symbol(0)]
    return scheme



def _resets_to_identity(reset: Reset, monoid, dtype: str) -> bool:
    """Whether the elements seen before a maximum moved contribute the monoid's identity."""
    return isinstance(reset.fallback, Const) and \
        reset.fallback.value == monoid.identity_value(0, dtype)


def _reset_scheme(compute, body, reset: Reset, monoid, ctx) -> Scheme:
    dtype = compute.dtypes[0]
    scheme = Scheme(compute, "reset", reset.deps, [State("", body, monoid, dtype)])
    s = scheme.state_symbol(0)
    identity = Const(monoid.identity_value(0, dtype), dtype)
    unchanged = None
    for d in reset.deps:
        dep = ctx.deps[d]
        same = compare("eq", old_symbol(dep), new_symbol(dep))
        unchanged = same if unchanged is None else binary("and", unchanged, same)
    fallback = reset.fallback
    if not (isinstance(fallback, Const) and fallback.value == identity.value):
        if not monoid.idempotent:
            raise NoCorrection(body, f"after a reset every element seen so far contributes "
                                     f"{to_text(fallback)}, which {monoid.name} cannot fold without "
                                     "counting them")
        fallback = where(compare("eq", s, identity), identity, fallback)
    scheme.correct = [where(unchanged, s, fallback)]
    scheme.value = [s]
    return scheme
