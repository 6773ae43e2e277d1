"""The contraction template's tiles over rows grouped by a gathered index
(:class:`~tensorfuse.schedule_templates.contraction_plan.Group`: a mixture of experts' weights
read by each token's expert): the loop over the values of the index a tile's rows hold, around
the sweep of the contracted axis, each value's sums kept for the rows holding it."""
from __future__ import annotations

from .expr import TileContext, to_triton

# the loop's variables, named apart from a program's tensors (named as the user named them: a
# tensor ``groups`` or ``group``, a group norm's, would be shadowed)
GROUPS, GROUP, IN_GROUP, PART = "_groups", "_group", "_rows_in_group", "_part"


def group_count(plan, sizes: dict):
    """The number of values the plan's group index takes: the size of the dimension it
    indexes."""
    return plan.extent(plan.group.axis, sizes)


def open_group_loop(plan, w, sizes: dict, interpreter: bool, batch: dict, bounds: dict) -> dict:
    """Lines computing each of the tile's rows' group (:data:`GROUPS`: the gathered index
    clamped into its dimension, as every gather is — ``tensorfuse.index_checks``; rows past the
    last, outside ``bounds``, get the count, which no group has), opening the loop over the
    distinct ones, smallest first (:data:`GROUP`; :data:`IN_GROUP`: the rows holding it), and
    starting each product's sums of the group (:data:`PART`, numbered): a tile of rows sorted by
    their group takes one or two turns, one of unsorted rows a turn per value present. The lines
    after are inside the loop until :func:`close_group_loop`. Returns the memo of the
    temporaries written (a loop's variables keep their shapes: the loop's are numbered after
    them)."""
    count = group_count(plan, sizes)
    memo: dict = {}
    ctx = TileContext({**batch, plan.rows.uid: "offs_m[:, None]"}, bounds, sizes=sizes,
                      emit=w, memo=memo, interpreter=interpreter)
    index = to_triton(plan.group.index, ctx)
    w(f"{GROUPS} = tl.minimum(tl.maximum(({index}).to(tl.int32), 0), {count} - 1)")
    if plan.rows.uid in bounds:
        w(f"{GROUPS} = tl.where({bounds[plan.rows.uid]}, {GROUPS}, {count})")
    w(f"{GROUP} = tl.min({GROUPS})")
    w(f"while {GROUP} < {count}:")
    w.indent += 1
    w(f"{IN_GROUP} = {GROUPS} == {GROUP}")
    for k, _ in enumerate(plan.products):
        w(f"{PART}_{k} = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
    return memo


def close_group_loop(plan, w, sizes: dict) -> None:
    """Lines keeping the group's sums (:data:`PART`, numbered) for its rows in the accumulators
    (``acc_k``) and moving to the next value the rows hold, closing the loop."""
    for k, _ in enumerate(plan.products):
        w(f"acc_{k} = tl.where({IN_GROUP}, {PART}_{k}, acc_{k})")
    w(f"{GROUP} = tl.min(tl.where({GROUPS} > {GROUP}, {GROUPS}, {group_count(plan, sizes)}))")
    w.indent -= 1
