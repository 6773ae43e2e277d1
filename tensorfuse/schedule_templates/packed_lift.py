"""A decode written without a query axis (``q[b, h, d]``, as users write one token) — and, with
every head on one cache, without a kv-head axis (``k[b, j, d]``) — as the same program with unit
axes added: the four-axis attention :mod:`.packed_rows` packs. The caller's tensors are then
viewed with those axes (``unsqueeze``: nothing copied)."""
from __future__ import annotations

from ..algebra.exprs import nodes, rewrite_computes
from ..dsl.expr import Axis, Const, DimSize, Load, binary
from ..dsl.program import Compute, Program, TensorParam
from .attention_chain import attention_loads

UNIT_Q, UNIT_KV = "ONE_Q", "ONE_KV"   # sizes of the axes a lift adds: 1 at every call


def lift_to_four_axes(program: Program, names: tuple[str, ...], axis: str):
    """``(program with a unit query axis — and kv-head axis — added, {tensor or output name:
    where its unit axis goes})`` for a decode whose q has three axes, or None where q is not
    read with three plain axes (the four-axis recogniser then says what differs)."""
    found = attention_loads(program, names, axis)
    if found is None:
        return None
    q_load, k_load, v_load, d = found
    if len(q_load.indices) != 3 or not all(isinstance(x, Axis) for x in q_load.indices):
        return None
    k_plain = {x.uid for x in k_load.indices if isinstance(x, Axis)}
    heads = [x for x in q_load.indices if x.uid != d.uid and x.uid not in k_plain]
    batch = [x for x in q_load.indices if x.uid != d.uid and x.uid in k_plain]
    if len(heads) != 1 or len(batch) != 1:
        return None
    h, b = heads[0], batch[0]
    if q_load.param.name in (k_load.param.name, v_load.param.name):
        return None   # (q read as the keys or values too, Reformer's shared q·k: one tensor
        # cannot take a unit axis where it is q and none where it is k)
    one_cache = len(k_load.indices) == 3   # every head on one cache: a unit kv-head axis too
    return _lifted(program, q_load.param, h, b, one_cache, {k_load.param.name,
                                                           v_load.param.name})


def _lifted(program: Program, q: TensorParam, h: Axis, b: Axis, one_cache: bool, kv: set):
    i1 = Axis("i1", UNIT_Q)
    head_at = [x.uid for x in _indices_of(program, q.name)].index(h.uid)
    q_at = head_at + 1   # the query axis right inside the heads: [b, h, i, d]
    params, inserts = [], {q.name: q_at}
    lifted_q = TensorParam(q.name, _with(q.dims, q_at, UNIT_Q), q.dtype, q.loc)
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
        if isinstance(node, Load) and node.param.name == q.name:
            return Load(lifted_q, _with(node.indices, q_at, i1), node.loc)
        if isinstance(node, Load) and node.param.name in lifted_kv:
            param, at = lifted_kv[node.param.name]
            kv_head = binary("floordiv", h, head_count)   # 0: the one cache
            return Load(param, _with(node.indices, at, kv_head), node.loc)
        return None

    def after_head(c: Compute) -> int | None:
        """Where ``c``'s unit query axis goes: right inside its head axis (None: it has none)."""
        uids = [a.uid for a in c.axes]
        return uids.index(h.uid) + 1 if h.uid in uids else None

    inserts.update({c.name: after_head(c) for c in program.outputs
                    if after_head(c) is not None})
    made = rewrite_computes(program, rewrite, axes=lambda c: c.axes if after_head(c) is None
                            else _with(c.axes, after_head(c), i1))
    computes = list(made.values())
    used = {a.uid: a for c in computes for a in c.axes + c.over}
    lifted = Program(program.name, params, computes, [made[c.name] for c in program.outputs],
                     sorted(used.values(), key=lambda a: a.uid), [], program.loc)
    return lifted, inserts


def added_units(lifted: Program) -> tuple[str, ...]:
    """The sizes a lift added to ``lifted`` (the query axis's, and the kv-head axis's where it
    added one): 1 at every call."""
    return tuple(n for n in (UNIT_Q, UNIT_KV) if n in lifted.dim_names())


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
