"""Plan the fusion of a chain of reductions over one axis: who depends on whom, and each one's scheme.

``plan_chain(program, ["m", "l", "o"], "j")`` inlines the elementwise values the reductions read,
finds which fused reductions each depends on, derives and numerically verifies a scheme for every
dependent one, and refuses — naming the expression and the user's line — when a correction does not
exist. Pure Python: no TVM here.
"""
from __future__ import annotations

import warnings
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from ..dsl.expr import Axis, Expr, Ref, order_axes
from ..dsl.printer import to_text
from ..dsl.program import Compute, Program
from ..errors import RollingUpdateError, RollingUpdateWarning
from .exprs import nodes, refs_to, substitute
from .conditioning import Conditioning, check_conditioning, measure
from .exponent_bounds import check_exponent_bounds
from .schemes import (Scheme, derive_scheme, held_scheme, identity_keepable,
                      independent_scheme, inexact_reset)
from .transfer import USER_RULES, Context, NoCorrection, is_nonnegative, is_positive
from .verify import verify_scheme


@dataclass
class Chain:
    """A planned fusion: members in dependency order, their inlined bodies and schemes."""

    axis: Axis
    members: list[Compute]
    bodies: dict[str, tuple[Expr, ...]]
    schemes: dict[str, Scheme]
    common_axes: tuple[Axis, ...]
    local_reductions: list[Compute] = field(default_factory=list)
    conditioning: list[Conditioning] | None = None   # float32 errors on offset data (measure)
    # members no correction carries, held to a sweep of one block (schemes.held_scheme), each
    # with why it cannot be corrected: a template that sweeps a row in blocks or parts refuses
    held: dict[str, str] = field(default_factory=dict)
    # facts derived from the chain once and asked often (masking.identity_mask), never copied
    # into a chain made from this one
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def member_names(self) -> list[str]:
        return [m.name for m in self.members]

    def dependents_of(self, name: str) -> list[str]:
        return [n for n, s in self.schemes.items() if name in s.deps]

    def describe(self) -> str:
        return "\n".join(self.schemes[m.name].describe() for m in self.members)


def inline_elementwise(e: Expr) -> Expr:
    """Replace references to elementwise computes by their expressions (recursively)."""
    def replace(n: Expr):
        if isinstance(n, Ref) and not n.compute.is_reduction:
            return inline_elementwise(n.compute.bodies[0])
        return None

    return substitute(e, replace)


def _find_axis(program: Program, members: Sequence[Compute], axis: "str | Axis") -> Axis:
    if isinstance(axis, Axis):
        return axis
    for m in members:
        for a in m.over:
            if a.name == axis:
                return a
    names = sorted({a.name for m in members for a in m.over})
    raise RollingUpdateError(f"none of {', '.join(m.name for m in members)} reduces over an axis "
                             f"named {axis!r} (they reduce over {', '.join(names) or 'nothing'})")


_PLANS: "weakref.WeakKeyDictionary[Program, dict]" = weakref.WeakKeyDictionary()


def chain_candidates(program: Program) -> list[tuple[list[Compute], Axis]]:
    """The reductions of ``program`` over a single axis grouped by that axis, the axis most of
    them share first: the chains a template fuses, or whose mask an analysis reads."""
    over_one = [c for c in program.computes if c.is_reduction and len(c.over) == 1]
    counts = Counter(c.over[0].uid for c in over_one)
    groups = [[c for c in over_one if c.over[0].uid == uid] for uid, _ in counts.most_common()]
    return [(members, members[0].over[0]) for members in groups]


# the members a correction-can-grow warning was given for, by the kernel's first parameter (the
# same object in the programs rewritten from it: its monoids' states written out, a template's
# own grouping, which plan the member again) — kept so that its id is not reused
_WARNED: dict = {}


def _warn_again(program: Program, caught: list, checked: bool) -> None:
    """Give the warnings a plan raised again (the user's filters apply as they are given): a
    correction that can grow once per member of the user's kernel, and only where the plan is
    ``checked``."""
    first = program.params[0] if program.params else program
    for w in caught:
        member = getattr(w.message, "member", None)
        if member is not None:
            if not checked or (id(first), member) in _WARNED:
                continue
            _WARNED[(id(first), member)] = first
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def plan_chain(program: Program, names: Sequence[str], axis: "str | Axis",
               strict: bool = False, checked: bool = True, held: bool = False) -> Chain:
    """The plan of fusing the reductions ``names`` of ``program`` into one pass over ``axis``.

    Planned once per program, names and axis (every build and call of a fused kernel asks again),
    so its warnings — a correction that can exceed 1, a member that loses precision on data far
    from zero (:mod:`.conditioning`) — are given once. ``strict`` refuses the second kind instead
    of warning. Raises :class:`~tensorfuse.errors.RollingUpdateError` when the fusion does not
    hold, naming the expression and the user's line. ``checked=False``: the plan without the
    precision checks and their warnings, for code that reads the chain's algebra without fusing
    it (the CPU's mask bounds). ``held``: a member whose dependence admits no correction is
    held to a sweep of one block (``Chain.held``) instead of refused — for a template that holds
    the whole swept axis in one block and checks it does."""
    key = (tuple(names), _axis_key(program, names, axis), len(USER_RULES),
           sum(len(v) for v in USER_RULES.values()), checked, held)
    plans = _PLANS.setdefault(program, {})
    if key not in plans:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RollingUpdateWarning)
            chain = _plan(program, names, axis, held)
        _warn_again(program, caught, checked)
        if checked:
            chain.conditioning = measure(chain)
            check_conditioning(chain)
            check_exponent_bounds(chain)
        plans[key] = chain
    chain = plans[key]
    if strict:
        check_conditioning(chain, strict=True)
        check_exponent_bounds(chain, strict=True)
    return chain


def _axis_key(program: Program, names: Sequence[str], axis: "str | Axis"):
    """The fused axis as the plans are kept by: its uid, whether it is given as an axis or by
    name (a template names it, the chain candidates give the axis: one plan, its warnings once)."""
    try:
        return _find_axis(program, [c for c in program.computes if c.name in names], axis).uid
    except RollingUpdateError:   # named nowhere: planning says so
        return axis


def _plan(program: Program, names: Sequence[str], axis: "str | Axis",
          held: bool = False) -> Chain:
    if not names:
        raise RollingUpdateError("name the reductions to fuse, e.g. rolling_update('m', 'l', 'o', "
                                 "axis='j')")
    members = []
    for n in names:
        try:
            c = program.compute(n)
        except KeyError:
            known = [c.name for c in program.computes if c.is_reduction]
            raise RollingUpdateError(f"{program.name} has no value named {n!r}; its reductions "
                                     f"are {', '.join(known)}") from None
        if not c.is_reduction:
            raise RollingUpdateError(f"{n} is not a reduction (it is elementwise); fuse the "
                                     "reductions it is computed from", c.loc)
        members.append(c)
    if len({m.name for m in members}) != len(members):
        raise RollingUpdateError(f"a reduction is named twice in {list(names)}")
    ax = _find_axis(program, members, axis)
    for m in members:
        if [a.uid for a in m.over] != [ax.uid]:
            raise RollingUpdateError(f"{m.name} reduces over ({', '.join(a.name for a in m.over)}),"
                                     f" not over {ax.name} alone; only reductions over the one "
                                     "fused axis can share its pass", m.loc)
    order = {c.name: k for k, c in enumerate(program.computes)}
    members.sort(key=lambda c: order[c.name])
    member_names = {m.name for m in members}
    bodies = {m.name: tuple(inline_elementwise(b) for b in m.bodies) for m in members}
    local = _check_outside_reductions(program, members, bodies, member_names)

    schemes: dict[str, Scheme] = {}
    held_members: dict[str, str] = {}
    positive: set[str] = set()
    for k, m in enumerate(members):
        earlier = {p.name: p for p in members[:k]}
        body = bodies[m.name][0]
        ctx = Context(ax, earlier, positive=set(positive), rules={},
                      independent={n for n, sc in schemes.items() if not sc.deps},
                      schemes=dict(schemes), wandering=_wandering(members[:k], schemes))
        if not refs_to(body, earlier) or m.arity > 1:
            if m.arity > 1 and refs_to(body, earlier):
                raise RollingUpdateError(f"{m.name} reduces several values at once and depends "
                                         f"on {', '.join(sorted(refs_to(body, earlier)))}; only "
                                         "single-value reductions can be corrected", m.loc)
            schemes[m.name] = independent_scheme(m, bodies[m.name])
        else:
            try:
                scheme = derive_scheme(m, body, ctx)
                verify_scheme(scheme, body, ctx)
            except NoCorrection as exc:
                why = f"in `{to_text(exc.expr)}`, {exc.reason}"
                scheme = held_scheme(m, body, tuple(sorted(refs_to(body, earlier)))) \
                    if held else None
                if scheme is None or inexact_reset({**schemes, m.name: scheme}, m.name):
                    raise RollingUpdateError(f"cannot fuse {m.name} into one pass over "
                                             f"{ax.name}: {why}", exc.expr.loc or m.loc) from None
                held_members[m.name] = why
            schemes[m.name] = scheme
        if _value_positive(m, body, ctx):
            positive.add(m.name)
    _keep_identities(members, bodies, schemes)
    common = order_axes([a for a in members[0].axes
                         if all(any(a.uid == b.uid for b in m.axes) for m in members)])
    return Chain(ax, members, bodies, schemes, common, local, held=held_members)


def _wandering(earlier, schemes: dict) -> set[str]:
    """The earlier members whose running values may pass through many orders of magnitude: the
    products (a running product of n factors moves like cⁿ whatever its final value), and the
    members whose references read one."""
    out: set[str] = set()
    for m in earlier:
        sc = schemes[m.name]
        if m.monoid.name == "prod" or sc.kind == "power" or out & set(sc.deps):
            out.add(m.name)
    return out


def _keep_identities(members, bodies, schemes) -> None:
    """Marks the maxima and minima whose identity can stay their members' reference
    (:func:`~.schemes.identity_keepable`)."""
    for m in members:
        if m.monoid.name not in ("max", "min") or m.arity > 1 or \
                not m.monoid.identity_is_sentinel(m.dtypes[0]):
            continue
        dependents = [d for d in members if m.name in schemes[d.name].deps]
        # a dependent's value formula is its own reference for the members after it
        referenced = [schemes[d.name] for d in dependents
                      if any(d.name in schemes[e.name].deps for e in members)]
        schemes[m.name].keeps_identity = bool(dependents) and identity_keepable(
            m.name, m.monoid.name, bodies[m.name][0],
            [st.body for d in dependents for st in schemes[d.name].states],
            [v for sc in referenced for v in sc.value])


def _value_positive(m: Compute, body: Expr, ctx: Context) -> bool:
    """Whether the reduction's value is provably positive (or ≥ 0 for sums of non-negative
    terms, enough for rescalings: empty states are guarded separately)."""
    if m.monoid.name == "sum":
        return is_nonnegative(body, ctx)
    if m.monoid.name in ("max", "min", "logsumexp"):
        return is_positive(body, ctx)
    return False


def _check_outside_reductions(program, members, bodies, member_names) -> list[Compute]:
    """Reductions outside the chain that members read: fine when they do not depend on a member
    (they are computed for each chunk, or before the pass); an error otherwise."""
    local: dict[str, Compute] = {}
    for m in members:
        for b in bodies[m.name]:
            for n in nodes(b):
                if isinstance(n, Ref) and n.compute.is_reduction and n.compute.name not in member_names:
                    blockers = _member_dependencies(n.compute, member_names, set())
                    if blockers:
                        raise RollingUpdateError(
                            f"{m.name} reads {n.compute.name}, which itself depends on "
                            f"{', '.join(sorted(blockers))}: it would need their final values in "
                            f"the middle of the pass; add {n.compute.name} to the fused "
                            "reductions", m.loc)
                    local[n.compute.name] = n.compute
    return list(local.values())


def _member_dependencies(c: Compute, member_names: set, seen: set) -> set:
    found = set()
    for b in c.bodies:
        for n in nodes(inline_elementwise(b)):
            if isinstance(n, Ref) and n.compute.name not in seen:
                if n.compute.name in member_names:
                    found.add(n.compute.name)
                elif n.compute.is_reduction:
                    seen.add(n.compute.name)
                    found |= _member_dependencies(n.compute, member_names, seen)
    return found
