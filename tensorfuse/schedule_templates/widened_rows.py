"""Chains whose wider members carry their extra axes only from the tensors they read — a masked
mean over tokens, ``Σ_s x[b, s, d]·mask[b, s] / Σ_s mask[b, s]`` — planned as rows.

Such a chain looks like attention to the planner (a member has an axis, ``d``, the others lack),
but no member reads another's value: ``d`` is no feature a tile must carry through a rolling
update, it is rows of their own. The attention template would hold ``d`` whole in a tile (at
most 256 elements; wider ran on TVM's untiled default schedule) over rows of the batch alone (B
programs). :func:`widened` recomputes the narrower members along those axes (the count
``Σ_s mask[b, s]`` once per ``(b, d)``: its operands are read again from cache), so that every
member has the same rows and the row-reduction template sweeps ``s`` for rows ``(b, d)`` —
strided rows, as a max over tokens is.
"""
from __future__ import annotations

from ..algebra.chain import chain_candidates, plan_chain
from ..algebra.exprs import nodes, rewrite_computes
from ..dsl.expr import Load
from ..dsl.program import Compute, Program
from ..errors import RollingUpdateError


def widened(program: Program) -> tuple[Program, str] | None:
    """``program`` with its first chain's narrower members recomputed along the axes of its
    widest, and a note saying so, where that chain contracts through tensors alone (no member
    reads another, nothing reduced inside a member), the widest member's axes hold every other
    member's, no narrower member is an output, and every value reading one runs over those axes;
    else ``None``."""
    candidates = chain_candidates(program)
    if not candidates:
        return None
    members, axis = candidates[0]
    try:
        chain = plan_chain(program, [m.name for m in members], axis, checked=False)
    except RollingUpdateError:
        return None
    if chain.local_reductions or any(chain.schemes[m.name].deps for m in chain.members):
        return None
    widest = max(chain.members, key=lambda m: len(m.axes))
    wide = {a.uid for a in widest.axes}
    narrower = {m.name for m in chain.members if {a.uid for a in m.axes} != wide}
    if not narrower or any(not {a.uid for a in m.axes} <= wide for m in chain.members) or \
            any(m.is_output for m in chain.members if m.name in narrower):
        return None
    extra = wide - _axes_of(chain, {m.name for m in chain.members})
    if _outer_product(widest, extra):
        return None
    for c in program.computes:
        if {d.name for d in c.inputs()} & narrower and not wide <= {a.uid for a in c.axes}:
            return None
    rebuilt = rewrite_computes(program, lambda n: None,
                               axes=lambda c: widest.axes if c.name in narrower else c.axes)
    note = (f"{', '.join(sorted(narrower))} recomputed along "
            f"{', '.join(a.name for a in widest.axes if a.uid not in _axes_of(chain, narrower))}"
            " (the chain reads tensors alone: rows, not a feature carried in a tile)")
    return Program(program.name, list(program.params), list(rebuilt.values()),
                   [rebuilt[c.name] for c in program.outputs], list(program.axes),
                   list(program.size_constraints), program.loc), note


def _outer_product(member: Compute, extra: set[int]) -> bool:
    """Whether ``member`` multiplies tensors that each carry extra axes the other lacks
    (``x[i, d]·y[j, d]``: a GEMM, which the contraction template takes — not rows to sweep),
    rather than weighting one tensor's extra axes by values without them (a GEMV: ``Σ_s
    x[b, s, d]·mask[b, s]``)."""
    carried = {frozenset(a.uid for a in n.axes) & extra for body in member.bodies
               for n in nodes(body) if isinstance(n, Load)} - {frozenset()}
    return len(carried) > 1


def _axes_of(chain, names: set[str]) -> set[int]:
    """The axes every member of ``names`` already runs over."""
    sets = [{a.uid for a in m.axes} for m in chain.members if m.name in names]
    return set.intersection(*sets) if sets else set()
