"""What a row tile's states and outputs ask of its kernel (:mod:`.rowtile`): which states a swept
row keeps per lane, whether the outputs read the row again instead of keeping it, which of their
operands are loaded before the reductions, which members' references others read."""
from __future__ import annotations

import numpy as np

from ...algebra.exprs import nodes
from ...algebra.schemes import EXACT, EXACT_READERS, EXTRAPOLATION, REFERENCE
from ...dsl import dtypes as dt
from ...dsl.evaluate import evaluate_plain
from ...dsl.expr import Binary, Load, Ref, Symbol, walk
from .expr import TileContext, literal
from .reductions import reducible


def depended_on(plan) -> set[str]:
    """The members whose references other members' corrections read (a resetting or held state
    reads its dependencies' values instead: :func:`exactly_read`)."""
    return {d for scheme in plan.chain.schemes.values() if scheme.kind not in EXACT_READERS
            for d in scheme.deps}


def state_type(sp) -> str:
    """The Triton type a state is kept in: f32, or i32 for an integer one (an argmax's index,
    exact past 2**24 and its identity 2**31 - 1 kept as itself)."""
    return "tl.int32" if dt.is_int(sp.dtype) else "tl.float32"


def state_identity(sp) -> str:
    """The literal a state starts from: its monoid's identity (its component's, for a monoid of
    several)."""
    component = sp.k if sp.monoid.arity > 1 else 0
    return literal(sp.monoid.identity_value(component, sp.dtype), sp.dtype)


def stored_state(sp, value: str) -> str:
    """``value`` of state ``sp`` as the f32 scratch buffer of the split update holds it (an
    integer state's bits), and :func:`loaded_state` back."""
    return f"({value}).to(tl.float32, bitcast=True)" if dt.is_int(sp.dtype) else value


def loaded_state(sp, value: str) -> str:
    return f"({value}).to(tl.int32, bitcast=True)" if dt.is_int(sp.dtype) else value


def exactly_read(plan) -> set[str]:
    """The members whose running values themselves (not their references) a resetting state
    compares with, block by block, or a held state reads (``schemes.dependency_symbols``)."""
    return {d for scheme in plan.chain.schemes.values() if scheme.kind in EXACT_READERS
            for d in scheme.deps}


def exact_symbols(scheme, old: str, new: str) -> dict:
    """The symbols of a resetting (or held) ``scheme``'s dependencies: each one's value before
    this block (``old`` formatted with its name) and after it, which its state body reads too
    (``new``)."""
    if scheme.kind not in EXACT_READERS:
        return {}
    return {k: v for d in scheme.deps for k, v in ((f"{d}.old", old.format(d)),
                                                   (f"{d}.new", new.format(d)),
                                                   (f"{d}.{EXACT}", new.format(d)))}


def lanewise_states(plan) -> frozenset:
    """(member, k) of the states a looped row sweep may keep per lane — ``[BLOCK_M, BLOCK_N]``,
    each lane combining its own column of every block, reduced across the row once after the
    loop (as Inductor's looped reductions do) — instead of reducing every block across the
    warps: a sum, max or min of a member whose states need no correction (no dependencies)
    and whose reference no other member reads per block. One cross-warp reduction per row
    instead of one per block, and a long sum added in N / BLOCK_N terms per lane, then as a
    tree (issue 23: the accuracy of long reductions).
    A state that resets where such an extremum moves (an argmax's index) is kept per lane
    beside it, each lane's index relative to its lane's maximum, and folded after the loop with
    its correction from the lane's maximum to the row's (:meth:`.row_merge.SplitMerge.
    fold_lanes`): an argmax over 512 rows of 128256 went from 71 µs, both reduced across the
    warps every block, to 66 (``benchmarks.monoid_kernels``, the H200)."""
    read = depended_on(plan)
    schemes = plan.chain.schemes

    def along(sp) -> bool:   # a monoid of several components: all lanewise or none
        return sp.contraction is None and reducible(sp.monoid) and any(
            plan.col.uid in {a.uid for a in other.body.axes} for other in plan.states
            if other.member is sp.member and (sp.member.arity > 1 or other is sp))

    # a held member reads its dependencies' row values, never a lane's: neither kept per lane
    held = set(plan.chain.held) | {d for n in plan.chain.held for d in schemes[n].deps}
    alone = {(sp.member.name, sp.k) for sp in plan.states if along(sp) and
             not schemes[sp.member.name].deps and sp.member.name not in read | held}
    return frozenset(alone | {(sp.member.name, sp.k) for sp in plan.states
                              if along(sp) and schemes[sp.member.name].kind == "reset" and
                              all((d, 0) in alone for d in schemes[sp.member.name].deps)})


def referenced_lanes(plan) -> frozenset:
    """(member, k) of the states a looped row sweep may keep per lane once the references they
    are kept relative to stop moving: members over dependencies that are sums alone (a
    variance's ``Σ (x − mean)²`` over the mean's ``Σ x``), each dependency's reference fixed
    after the sweep's first block (every lane of a row relative to the same value: folded by a
    plain sum after the loop, no correction per lane or per block) and the dependency's sum kept
    per lane too (``Knobs.lanes``); without them a variance reduces three sums across the warps
    every block. Any reference gives exact results (the finals correct
    from it); the first block's mean is as near the data as the running one where the rows do
    not drift along the sweep. Empty where a member's corrections do not leave empty states
    empty (the lanes' first block starts from the identity relative to the initial
    reference), where another member reads a lane member's reference, a dependency is read
    exactly (a reset's), or a body divides by a reference (a masked mean's ``Σ x·m / Σ m``: a
    first block masked whole would fix it at 0/1, far from the data)."""
    if plan.mask is not None or plan.locals or any(sp.contraction for sp in plan.states):
        return frozenset()
    schemes, read = plan.chain.schemes, depended_on(plan)
    members = {m.name: m for m in plan.chain.members}
    swept = lambda sp: plan.col.uid in {a.uid for a in sp.body.axes}  # noqa: E731
    states = {name: [sp for sp in plan.states if sp.member.name == name] for name in members}

    def plain_sum(name: str) -> bool:   # a sum of elements along the row, depending on nothing
        return not schemes[name].deps and members[name].arity == 1 and all(
            sp.monoid.name == "sum" and swept(sp) for sp in states[name])

    readers = [n for n, s in schemes.items() if s.deps]
    if not readers or exactly_read(plan) or any(_divides_by_a_reference(sp.body)
                                                for sp in plan.states):
        return frozenset()
    for name in readers:
        scheme = schemes[name]
        if scheme.kind == "reset" or members[name].arity != 1 or name in read or \
                not all(plain_sum(d) for d in scheme.deps) or \
                not all(sp.monoid.name == "sum" and reducible(sp.monoid)
                        for sp in states[name]) or not _keeps_empty_states(plan, scheme):
            return frozenset()
    if any(n not in readers for d in read for n, s in schemes.items() if d in s.deps):
        return frozenset()
    return frozenset({(sp.member.name, sp.k) for name in readers for sp in states[name]
                      if swept(sp)} |
                     {(sp.member.name, sp.k) for d in read for sp in states[d]})


def _divides_by_a_reference(body) -> bool:
    """Whether ``body`` divides by an expression that reads another member's reference."""
    found = []

    def visit(node):
        if isinstance(node, Binary) and node.op == "div" and any(
                isinstance(n, Symbol) and n.name.endswith(f".{REFERENCE}")
                for n in nodes(node.b)):
            found.append(node)

    walk(body, visit)
    return bool(found)


def _keeps_empty_states(plan, scheme) -> bool:
    """Whether ``scheme``'s corrections take states at their identities to their identities
    whatever the references move by (a sum's corrections are linear in its states)."""
    env = {f"{scheme.name}#{k}": np.asarray(st.monoid.identity_value(0, st.dtype), np.float64)
           for k, st in enumerate(scheme.states)}
    env.update({n: np.asarray(float(getattr(v, "value", v))) for n, v in plan.sizes.items()})
    env.update({p.name: np.asarray(0.5) for p in plan.program.scalar_params})
    rng = np.random.default_rng(0)
    for d in scheme.deps:
        env[f"{d}.old"], env[f"{d}.new"] = (np.asarray(v) for v in rng.normal(0, 10, 2))
    with np.errstate(all="ignore"):
        try:
            return all(float(evaluate_plain(c, env)) == float(env[f"{scheme.name}#{k}"])
                       for k, c in enumerate(scheme.correct))
        except (KeyError, TypeError, ValueError):   # reads something else: not taken
            return False


def uncorrected_states(plan) -> bool:
    """Whether every state of ``plan``'s row reduction is kept per lane when the row is swept in
    blocks (:func:`lanewise_states`) and needs no correction: a chain of independent sums,
    maxima or minima (RMSNorm's Σx²), with no block mask and nothing on the tensor cores."""
    return bool(plan.states) and plan.mask is None and not plan.locals and \
        len(lanewise_states(plan)) == len(plan.states) and \
        not any(scheme.deps for scheme in plan.chain.schemes.values())


def reloadable(plan) -> bool:
    """Whether the outputs of ``plan`` can read the row again instead of keeping it: a row
    reduction (no contraction on the tensor cores, no block mask) whose outputs run along the
    row (a norm, a softmax)."""
    return plan.mask is None and not plan.locals and \
        not any(sp.contraction for sp in plan.states) and \
        any(kind == "col" for _, _, kind in plan.outputs)


def column_operands(plan) -> bool:
    """Whether an output reads a tensor along the columns alone (a norm's weight or bias)."""
    found = []

    def visit(node):
        if isinstance(node, Load) and {a.uid for a in node.axes} == {plan.col.uid}:
            found.append(node)

    for _, expr, _ in plan.outputs:
        walk(expr, visit)
    return bool(found)


def output_operands(plan, tile: TileContext) -> tuple:
    """The loads in the outputs' expressions that do not depend on the chain's results and are
    indexed by the row alone (a per-row scale, cross-entropy's gathered target logit): issued
    before the reductions, their latency overlaps the row's. Loads along the columns (a norm's
    weight) stay where they are used: held across the reductions they cost registers, and a
    layernorm lost 9 % of its bandwidth that way (H100, benchmarks/rows_sweep.py)."""
    found: dict = {}
    for _, expr, kind in plan.outputs:
        if kind not in ("row", "col"):
            continue
        after_chain: set = set()

        def visit(node):
            if isinstance(node, Ref) or any(c.uid in after_chain for c in node.children()):
                after_chain.add(node.uid)
            elif isinstance(node, Load) and all(a.uid in tile.axes and a.uid != plan.col.uid
                                                for a in node.axes):
                found.setdefault(node.key(), node)

        walk(expr, visit)
    return tuple(found.values())


def initial_reference(plan, d: str, initial: dict, cols) -> float:
    """The reference of ``d`` before anything is seen (as in the TensorIR lowering: the reference
    formula on empty states, the dependencies at their initial references, extrapolated by the
    width ``cols``). A symbolic width (:mod:`~tensorfuse.dsl.symbolic_sizes`) is read at this
    build's value and not fixed: any reference gives an exact result (the final values correct
    from it), this one is only where the sweep starts — and from empty sums it is the same at
    any width."""
    scheme = plan.chain.schemes[d]
    env = {f"{d}#{k}": np.asarray(st.monoid.identity_value(0, st.dtype), np.float64)
           for k, st in enumerate(scheme.states)}
    env.update({f"{e}.new": np.asarray(initial[e], np.float64) for e in scheme.deps})
    env[EXTRAPOLATION.name] = np.asarray(float(getattr(cols, "value", cols)))
    # sizes at this build's values (symbolic ones read, not fixed, as the width); the call's
    # scalars (an eps, unknown when the kernel is written) at 0: on empty states a reference
    # does not depend on them (a backward's ``where(d#0 · n == 0, 0, … rsqrt(var / N + eps)
    # …)`` is 0), and where one did, any value is still a valid starting reference
    env.update({n: np.asarray(float(getattr(v, "value", v))) for n, v in plan.sizes.items()})
    env.update({p.name: np.asarray(0.0) for p in plan.program.scalar_params})
    with np.errstate(all="ignore"):
        value = float(evaluate_plain(scheme.reference(), env))
    return 0.0 if np.isnan(value) else value
