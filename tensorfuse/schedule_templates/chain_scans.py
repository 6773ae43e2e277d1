"""Chains of dependent reductions over the positions up to each output's own, scanned together:
a running log-normaliser written out, ``m_i = max_{j ≤ i} x_j`` and ``s_i = Σ_{j ≤ i} exp(x_j −
m_i)`` (a causal softmax's denominators), or any chain whose later members read the earlier
ones at the output's position.

Each member reads the others at the output's own position ``i``, so as a dense reduction every
output visits every term up to it: ``N²/2`` terms a row on the row template. But the rolling
update's algebra (:mod:`tensorfuse.algebra`) already says how a member's running state is
corrected when the values it depends on move (``s ← s · exp(m_old − m_new)``), and correcting
two parts' states to their combined dependencies and combining them is associative — the split
update's merge. So the chain's states together are one monoid of several components
(:func:`chain_monoid`), and the scan template scans it: ``N`` terms a row, each a tuple of
states, the combine correcting both sides' states to the combined dependencies (a correction
whose dependencies did not move is skipped: ``−∞ − −∞`` is no number).

Taken where every member is a sum, maximum or minimum over one axis under the same conditions
(the same range of positions), each member's value is one of its running states, the terms read
the output's position only through the members, and the outputs are elementwise over them. The
rows are the widest member's other axes: a softmax-weighted average of values so far (``Σ p ·
v[b, j, e] / Σ p``) scans its weights' maximum and normaliser again along each feature ``e``,
in the same tile — ``N`` terms a feature where the attention template took ``N²/2``. A
chain the algebra refuses, or a single reduction (the scan's own plan), is left to the other
templates."""
from __future__ import annotations

from functools import reduce

from ..algebra import inline_elementwise, plan_chain
from ..algebra.exprs import nodes, simplify, substitute
from ..dsl.expr import Const, Expr, Ref, Symbol, binary, compare, where
from ..dsl.monoid import Monoid
from ..dsl.program import Program
from ..errors import RollingUpdateError, TargetError
from .scan import ChainStates, ScanPlan, _reads, peeled, relations, terms_of

SCANNABLE = ("sum", "max", "min")
KINDS = ("independent", "linear", "affine")


def plan_chain_scan(program: Program) -> ScanPlan:
    """The scan plan of ``program``'s chain (module docstring), or a :class:`TargetError`
    saying why it has none."""
    members = [c for c in program.computes if c.is_reduction]
    if len(members) < 2:
        raise TargetError(f"{len(members)} reductions; a chain scan scans several")
    first = members[0]
    for c in members:
        if c.arity != 1 or c.monoid.name not in SCANNABLE or len(c.over) != 1 or \
                c.over[0].uid != first.over[0].uid:
            raise TargetError(f"{c.name} is not a sum, maximum or minimum over "
                              f"{first.over[0].name} alone")
    j = first.over[0]
    terms = {c.name: terms_of(c, "chain scan") for c in members}   # (j, values, conditions)
    conditions = {name: found[2] for name, found in terms.items()}
    found = relations(conditions[first.name], j, first)
    if not found:
        raise TargetError(f"{first.name} has no condition comparing {j.name} with an axis of "
                          "its result of the same extent")
    at, i, (direction, shift) = found[0]
    keys = sorted(e.key() for e in conditions[first.name])
    if any(sorted(e.key() for e in conditions[c.name]) != keys for c in members):
        raise TargetError("the chain's members reduce under different conditions: one range of "
                          "positions a scan")
    rest = tuple(e for n, e in enumerate(conditions[first.name]) if n != at)
    names = {c.name for c in members}
    # checked before the chain is planned (its algebra warns of what it fuses)
    own = [substitute(terms[c.name][1][0], lambda n: Const(0.0, n.dtype)
                      if isinstance(n, Ref) and n.compute.name in names else None)
           for c in members]
    if any(_reads(v, i) for v in own) or any(_reads(e, i) for e in rest):
        raise TargetError(f"the terms read {i.name} beside comparing it")
    try:
        chain = plan_chain(program, [c.name for c in members], j)
    except RollingUpdateError as exc:
        raise TargetError(f"the chain does not fuse: {exc}") from exc
    schemes = [chain.schemes[c.name] for c in members]
    for s in schemes:
        if s.kind not in KINDS or len(s.value) != 1 or not isinstance(s.value[0], Symbol):
            raise TargetError(f"{s.name}'s running states are not its value ({s.kind})")
    values = _terms(schemes, names)
    # the rows: the widest member's other axes (a weighted sum's feature beside its weights'
    # maximum and normaliser: those are scanned again along each feature, in the same tile)
    widest = max(members, key=lambda c: len(c.axes))
    kept = {a.uid for a in widest.axes}
    if any(not {a.uid for a in c.axes} <= kept for c in members):
        raise TargetError("the chain's members are indexed by axes no one of them holds all of")
    outputs = []
    for c in program.outputs:
        expr = Ref(c, 0, c.loc) if c.name in names else inline_elementwise(c.bodies[0])
        reads = {n.compute.name for n in nodes(expr) if isinstance(n, Ref)}
        if not reads or not reads <= names or {a.uid for a in c.axes} != kept:
            raise TargetError(f"output {c.name} is not elementwise over the chain's results")
        outputs.append((c, expr))
    monoid, dtypes = chain_monoid(schemes)
    components = _components(schemes)
    read = tuple((s.name, components[s.name][_state_index(s)]) for s in schemes)
    return ScanPlan(program, widest, j, i, direction, shift, tuple(values), rest,
                    tuple(outputs), chain=ChainStates(monoid, dtypes, read))


def _state_index(scheme) -> int:
    """Which of ``scheme``'s states its value is."""
    name = scheme.value[0].name
    return next(k for k in range(len(scheme.states)) if scheme.state_symbol(k).name == name)


def _components(schemes) -> dict:
    """Each member's states' components of the chain's monoid, in the members' order."""
    out, n = {}, 0
    for s in schemes:
        out[s.name] = list(range(n, n + len(s.states)))
        n += len(s.states)
    return out


def _terms(schemes, names: set) -> list[Expr]:
    """Each component's term at one position: the member's state body without its conditions
    (the emitter applies them to every component), its dependencies at their own terms'
    values (a single position's maximum is its term)."""
    term_of: dict = {}   # member → its value over one position
    values = []
    for s in schemes:
        states = []
        for st in s.states:
            body = peeled(inline_elementwise(st.body), s.compute)[0]
            # folded: a term relative to itself is exp(0) = 1, also where it is −∞ (a masked
            # logit), where exp(x − x) would be NaN and poison every later state
            states.append(simplify(substitute(body, lambda n: term_of.get(n.compute.name)
                                              if isinstance(n, Ref) and n.compute.name in names
                                              else None)))
        values += states
        term_of[s.name] = states[_state_index(s)]
    return values


def chain_monoid(schemes) -> tuple[Monoid, tuple]:
    """``(the monoid of the chain's states, each component's dtype)``: combining two parts'
    states member by member in dependency order — an independent member's by its own monoid;
    a dependent one's each corrected from its part's dependencies to the combined ones (left
    as it is where they did not move), then combined."""
    states = [(s, k) for s in schemes for k in range(len(s.states))]
    width = len(states)
    components = _components(schemes)

    def combine(*ab):
        sides = {"a": ab[:width], "b": ab[width:]}
        value = {"a": {}, "b": {}, "ab": {}}
        combined: list = []
        for s in schemes:
            own = components[s.name]
            made = []
            for local, st in enumerate(s.states):
                parts = []
                for side in ("a", "b"):
                    state = sides[side][own[local]]
                    fixed = _corrected(s, local, sides[side], own, value[side], value["ab"])
                    if s.deps:
                        same = reduce(lambda x, y: binary("and", x, y),
                                      [compare("eq", value[side][d], value["ab"][d])
                                       for d in s.deps])
                        fixed = where(same, state, fixed)
                    parts.append(fixed)
                made.append(st.monoid.combine_exprs([parts[0]], [parts[1]])[0])
            combined += made
            at = _state_index(s)   # the member's value is one of its states
            value["a"][s.name], value["b"][s.name] = (sides[x][own[at]] for x in "ab")
            value["ab"][s.name] = made[at]
        return tuple(combined)

    identity = tuple(s.states[k].monoid.identity[0] for s, k in states)
    name = "chain_" + "_".join(s.name for s in schemes)
    monoid = Monoid(name, combine, identity, arity=width, check=False)
    return monoid, tuple(s.states[k].dtype for s, k in states)


def _corrected(scheme, local: int, side: tuple, own: list, old: dict, new: dict) -> Expr:
    """State ``local`` of ``scheme`` (held in ``side`` at its components ``own``) corrected
    from its dependencies' values ``old`` to ``new``."""
    bound = {scheme.state_symbol(k).name: side[own[k]] for k in range(len(own))}
    for d in scheme.deps:
        bound[f"{d}.old"], bound[f"{d}.new"] = old[d], new[d]
    return substitute(scheme.correct[local], lambda n: bound.get(n.name)
                      if isinstance(n, Symbol) else None)
