"""The states a row keeps of the contraction template's reductions over the columns of its sums
(:func:`.contraction._row_block_lines`), as Triton text: each monoid's identity, combine and
fold; an arg reduction's (value, column) pair; and a softmax's normaliser ``l = Σ_j exp(u − M)``
beside ``M = max_j u`` (``T.logsumexp`` of a GEMM's values — InfoNCE's, CLIP's loss, a language
model head's — as written for the templates), kept per lane of a block of columns relative to
the lane's own maximum, so that nothing of the ``[rows, columns]`` values is stored. One
exponential an element: with ``d = u − m`` (the lane's maximum before ``u``), ``e = exp(−|d|)``
is ``exp(u − m)`` where ``u`` does not raise it and ``exp(m − u)`` where it does, so ``l``
becomes ``l + e`` or ``l·e + 1``. Lanes are folded once after the sweep (``Σ l·exp(m − M)``),
parts of split columns combined in order the same way. Infinite values follow ``T.logsumexp``'s
rewrite (:mod:`tensorfuse.schedule_templates.monoid_rewrites`): a row of −∞ sums to 0 (its
log-sum-exp −∞), a +∞ makes the sum +∞; NaN propagates."""
from __future__ import annotations

def column_states(plan) -> int:
    """The states a row keeps of the reductions over the columns (an arg reduction two: the
    extremum and its index)."""
    return sum(r.states for r in plan.over_columns)


def slots(plan) -> dict:
    """Each reduction's first partial slot (by name): the states in order, an arg reduction's
    two side by side."""
    found, slot = {}, 0
    for r in plan.over_columns:
        found[r.name], slot = slot, slot + r.states
    return found


def normalisers_of(plan, top) -> list[int]:
    """The positions among the reductions over the columns of the normalisers of ``top``."""
    return [n for n, r in enumerate(plan.over_columns) if r.of == top.name]


def states(k: int, r) -> list[str]:
    """The names of reduction ``k``'s folded states (an arg reduction's extremum, then index)."""
    return [f"row_{k}", f"at_{k}"] if r.states == 2 else [f"row_{k}"]


def column_refs(plan) -> dict:
    """What the outputs read of each reduction over the columns: its folded state, or an arg
    reduction's two components (``name#0``, ``name#1``)."""
    refs = {}
    for k, r in enumerate(plan.over_columns):
        if r.states == 2:
            refs.update({f"{r.name}#0": f"row_{k}", f"{r.name}#1": f"at_{k}"})
        else:
            refs[r.name] = f"row_{k}"
    return refs


NO_INDEX = 2**31 - 1   # an arg reduction's index before any column (the DSL monoid's identity)
EXTREMUM = {"argmax": "max", "argmin": "min"}
BETTER = {"argmax": "{} > {}", "argmin": "{} < {}"}   # NaN never better: it is never taken
# an arg reduction's value before any column: the DSL monoid's (the f32 extremes, so that a
# column of ±inf is never taken — as the monoid never takes one)
IDENTITY = {"sum": "0.0", "normaliser": "0.0", "max": "float('-inf')", "min": "float('inf')",
            "argmax": "-3.4028234663852886e+38", "argmin": "3.4028234663852886e+38"}
COMBINE = {"sum": "{} + {}", "max": "tl.maximum({}, {})", "min": "tl.minimum({}, {})"}
FOLD = {"sum": "tl.sum({}, 1)", "max": "tl.max({}, 1)", "min": "tl.min({}, 1)"}


NEG_INF, POS_INF = "float('-inf')", "float('inf')"
# the GEMM tiles' own variables are named from here (``_g_top``): never a tensor's name
L = "_g_"


def lane_update(l_: str, m: str, value: str, ok: str | None) -> list[str]:
    """Lines adding the block's ``value`` tile (``[BLOCK_M, BLOCK_N]``; columns where ``ok`` is
    false left out) into the lanes' sums ``l_`` relative to their maxima ``m`` — before ``m``
    takes the block's values."""
    u, gap, e = f"{L}u", f"{L}gap", f"{L}e"
    kept = f"tl.where({ok}, {u}, {NEG_INF})" if ok else u
    return [f"{u} = tl.broadcast_to({value}, (BLOCK_M, BLOCK_N))",
            f"{u} = {kept}",
            f"{gap} = tl.where({u} == {m}, 0.0, {u} - {m})",   # equal infinities: e = 1
            f"{e} = tl.exp(-tl.abs({gap}))",
            f"{l_} = tl.where({u} == {NEG_INF}, {l_}, tl.where({gap} > 0, {l_} * {e} + 1.0, "
            f"{l_} + {e}))"]


def lanes_folded(l_: str, m: str) -> list[str]:
    """Lines folding the lanes' sums ``l_`` (relative to the lanes' maxima ``m``, not yet
    folded) into each row's sum relative to the row's maximum."""
    top, scale = f"{L}top", f"{L}scale"
    return [f"{top} = tl.max({m}, 1)",
            f"{scale} = tl.where({m} == {NEG_INF}, 0.0, tl.exp({m} - {top}[:, None]))",
            f"{l_} = tl.where({top} == {POS_INF}, {POS_INF}, tl.sum({l_} * {scale}, 1))"]


def part_combined(l_: str, top: str, m_part: str, l_part: str) -> list[str]:
    """Lines combining a part's row maximum ``m_part`` and sum ``l_part`` (relative to it) into
    the running ``top`` and ``l_`` (relative to ``top``), in the columns' order."""
    new = f"{L}new"
    return [f"{new} = tl.maximum({top}, {m_part})",
            f"{l_} = tl.where({new} == {POS_INF}, {POS_INF}, "
            f"tl.where({top} == {NEG_INF}, 0.0, {l_} * tl.exp({top} - {new})) + "
            f"tl.where({m_part} == {NEG_INF}, 0.0, {l_part} * tl.exp({m_part} - {new})))",
            f"{top} = {new}"]
