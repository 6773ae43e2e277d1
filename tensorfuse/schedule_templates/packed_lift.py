"""A decode written without a query axis (``q[b, h, d]``, as users write one token) — and, with
every head on one cache, without a kv-head axis (``k[b, j, d]``) — as the same program with unit
axes added: the four-axis attention :mod:`.packed_rows` packs. The caller's tensors are then
viewed with those axes (``unsqueeze``: nothing copied)."""
from __future__ import annotations

from ..algebra.exprs import nodes, rewrite_computes, rewritten_program
from ..dsl.expr import Axis, Compare, Const, DimSize, Load, binary
from ..dsl.program import Compute, Program, TensorParam
from .attention_chain import attention_loads

UNIT_Q, UNIT_KV = "ONE_Q", "ONE_KV"   # sizes of the axes a lift adds: 1 at every call
UNIT_H = "ONE_H"   # a head axis added to every tensor (:mod:`.shared_queries`): 1 too


def lift_to_four_axes(program: Program, names: tuple[str, ...], axis: str):
    """``(program with a unit query axis — and kv-head axis — added, {tensor or output name:
    where its unit axis goes})`` for a decode whose q has three axes, or None where q is not
    read with three plain axes (the four-axis recogniser then says what differs)."""
    found = _q_axes(program, names, axis, 3)
    if found is None:
        return None
    (q_load, k_load, v_load), heads, batch = found
    if len(heads) != 1:
        return None
    h, b = heads[0], batch[0]
    one_cache = len(k_load.indices) == 3   # every head on one cache: a unit kv-head axis too
    if one_cache and not all(b.uid in {x.uid for x in load.indices if isinstance(x, Axis)}
                             for load in (k_load, v_load)):
        return None   # a cache read through a gather (a page table): no batch axis to lift by
    return _lifted(program, q_load.param, h, b, one_cache, {k_load.param.name,
                                                           v_load.param.name})


def lift_one_cache(program: Program, names: tuple[str, ...], axis: str):
    """``(program with a unit kv-head axis added to k and v, {tensor name: where it goes})`` for
    attention with a query axis whose keys and values have no head axis (multi-query attention
    written ``q[b, h, i, d]`` over ``k[b, j, d]``): every head on the one cache, read at
    ``h // H``. The head is the axis of q besides the batch that the mask does not compare with
    the keys — with no such comparison, the outer of the two (the query axis is innermost but
    for the head dim, as in ``[b, h, i, d]``). None for any other attention."""
    found = _q_axes(program, names, axis, 4)
    if found is None:
        return None
    (q_load, k_load, v_load), rows, batch = found
    if len(rows) != 2 or len(k_load.indices) != 3 or len(v_load.indices) != 3:
        return None
    compared = _compared_with(program, names, axis)
    queries = [x for x in rows if x.uid in compared]
    h = next(x for x in rows if x is not queries[0]) if len(queries) == 1 else rows[0]
    return _lifted(program, q_load.param, h, batch[0], True,
                   {k_load.param.name, v_load.param.name}, lift_q=False)


def _q_axes(program: Program, names: tuple[str, ...], axis: str, rank: int):
    """``((q, k, v loads), q's axes k does not read, q's one batch axis k reads)`` of softmax
    attention whose q has ``rank`` plain axes and one batch axis k reads, and is not read as the
    keys or values too (Reformer's shared q·k: one tensor cannot take a unit axis where it is q
    and none where it is k); else None."""
    found = attention_loads(program, names, axis)
    if found is None:
        return None
    q_load, k_load, v_load, d = found
    if len(q_load.indices) != rank or not all(isinstance(x, Axis) for x in q_load.indices) or \
            q_load.param.name in (k_load.param.name, v_load.param.name):
        return None
    k_plain = {x.uid for x in k_load.indices if isinstance(x, Axis)}
    rows = [x for x in q_load.indices if x.uid != d.uid and x.uid not in k_plain]
    batch = [x for x in q_load.indices if x.uid != d.uid and x.uid in k_plain]
    return ((q_load, k_load, v_load), rows, batch) if len(batch) == 1 else None


def _compared_with(program: Program, names: tuple[str, ...], axis: str) -> set:
    """The axes the chain's computes compare with the swept ``axis`` (a causal mask's query)."""
    found = set()
    for c in program.computes:
        for body in c.bodies:
            for n in nodes(body):
                if isinstance(n, Compare):
                    uids = {a.uid for a in nodes(n) if isinstance(a, Axis)}
                    if any(a.name == axis for a in nodes(n) if isinstance(a, Axis)):
                        found |= uids
    return found


def _lifted(program: Program, q: TensorParam, h: Axis, b: Axis, one_cache: bool, kv: set,
            lift_q: bool = True):
    i1 = Axis("i1", UNIT_Q)
    head_at = [x.uid for x in _indices_of(program, q.name)].index(h.uid)
    q_at = head_at + 1   # the query axis right inside the heads: [b, h, i, d]
    params, inserts = [], {q.name: q_at} if lift_q else {}
    lifted_q = TensorParam(q.name, _with(q.dims, q_at, UNIT_Q), q.dtype, q.loc) if lift_q \
        else q
    heads = q.dims[head_at]
    head_count = DimSize(heads) if isinstance(heads, str) else Const(heads, "i32")
    lifted_kv = {}
    for param in program.params:
        if param is q:
            params.append(lifted_q)
        elif one_cache and param.name in kv:
            at = [x.uid for x in _indices_of(program, param.name)].index(b.uid) + 1
            lifted_kv[param.name] = (TensorParam(param.name, _with(param.dims, at, UNIT_KV),
                                                 param.dtype, param.loc), at)
            inserts[param.name] = at
            params.append(lifted_kv[param.name][0])
        else:
            params.append(param)
    def rewrite(node):
        if isinstance(node, Load) and node.param.name == q.name and lift_q:
            return Load(lifted_q, _with(node.indices, q_at, i1), node.loc)
        if isinstance(node, Load) and node.param.name in lifted_kv:
            param, at = lifted_kv[node.param.name]
            kv_head = binary("floordiv", h, head_count)   # 0: the one cache
            return Load(param, _with(node.indices, at, kv_head), node.loc)
        return None

    def after_head(c: Compute) -> int | None:
        """Where ``c``'s unit query axis goes: right inside its head axis (None: it has none,
        or the query axis is not lifted)."""
        uids = [a.uid for a in c.axes]
        return uids.index(h.uid) + 1 if h.uid in uids and lift_q else None

    inserts.update({c.name: after_head(c) for c in program.outputs
                    if after_head(c) is not None})
    made = rewrite_computes(program, rewrite, axes=lambda c: c.axes if after_head(c) is None
                            else _with(c.axes, after_head(c), i1))
    return rewritten_program(program, params, made), inserts


def added_units(lifted: Program) -> tuple[str, ...]:
    """The sizes a lift added to ``lifted`` (the query axis's, the kv-head axis's or a head
    axis's where it added one): 1 at every call."""
    return tuple(n for n in (UNIT_Q, UNIT_KV, UNIT_H) if n in lifted.dim_names())


def _indices_of(program: Program, name: str) -> tuple:
    """The indices of the first load of tensor ``name``."""
    for c in program.computes:
        for body in c.bodies:
            for node in nodes(body):
                if isinstance(node, Load) and node.param.name == name:
                    return node.indices
    raise KeyError(name)


def _with(items, at: int, item) -> tuple:
    items = tuple(items)
    return items[:at] + (item,) + items[at:]
