"""A group's query heads as the rows of one attention tile: the program rewritten so that every
query head that shares a kv-head is a row of that kv-head's tile (``../shared/DESIGN.md`` §4d:
operands not indexed by a row axis are shared, so the rows that share them go in one tile).

Attention over ``q[b, h, i, d]`` with keys ``k[b, h // G, j, d]`` is, as data, attention of the
``HKV`` kv-heads over ``R = G·M`` rows each — row ``r = (h mod G)·M + i`` — with ``q`` viewed as
``[B, HKV, R, D]`` (the same memory where a head's rows lie one after another: the library's
``[B, H, M, D]``, or any layout at one query token). A decode, whose ``M`` is 1, then becomes a
GEMM-shaped sweep of each cache by all the heads that read it, as FlashInfer and FlashMLA
arrange it; several query tokens over one cache (speculative decoding) pack the same way.

:func:`pack_group_rows` makes that program (the score, mask and chain as written; k and v read
by the kv-head directly; a read of the query head apart from ``q·k`` — a temperature or ALiBi
slope per head — a read at each packed row's own head ``hk·G + r // M``) or refuses with the
reason: the score or mask reads the query index apart from ``q·k`` (a causal mask among the
query rows), which the packed row would have to unpick. :class:`PackedRowsKernel` calls a
kernel of the packed program with views of the caller's tensors: nothing is copied.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra.exprs import nodes, rewrite_computes, rewritten_program, substitute
from ..dsl.expr import Axis, Const, DimSize, Load, binary
from ..dsl.program import Compute, Program, TensorParam
from ..errors import ScheduleError
from .attention_chain import AttentionChain, recognise_attention
from .packed_lift import lift_to_four_axes

WHO = "packed group rows"
ROWS = "R"   # the packed program's size of a tile's rows (G·M)


@dataclass(frozen=True)
class PackedRows:
    """The packed program and how the caller's tensors map onto it: ``chain`` is the original
    program's attention chain (its sizes by role), ``program`` the packed one (q and the output
    ``[B, HKV, R, ·]``, k and v as given)."""

    program: Program
    chain: AttentionChain
    # packed for one query token (its index 0, its count 1): calls with several are refused
    one_query: bool = False
    # (tensor or output name, where a unit axis was added): a decode written with three axes
    # (:mod:`.packed_lift`), whose tensors are viewed with them
    lifted: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        b, h, hkv, m, n, d = self.chain.dims
        return (f"{self.chain.q}[{b}, {h}, {m}, {d}] packed as [{b}, {hkv}, {ROWS} = "
                f"{h} / {hkv} · {m}, {d}]: each kv-head's query heads are the rows of its tile")


def _refuse(message: str, loc=None) -> ScheduleError:
    return ScheduleError(f"{WHO}: {message}", loc)


def pack_group_rows(program: Program, names: tuple[str, ...], axis: str,
                    one_query: bool = False) -> PackedRows:
    """The program with each kv-head's query heads as rows (module docstring). ``one_query``:
    for calls with one query token (decode), whose query index is 0 and query count 1 — a mask
    from the bottom right (``j <= N - M + i``) then reads the keys alone and packs too."""
    lifted = ()
    try:
        chain = recognise_attention(program, names, axis, WHO, dtypes=("bf16", "f16"),
                                    logsumexp=True, value_dims=True)
    except ScheduleError:
        found = lift_to_four_axes(program, names, axis)
        if found is None:
            raise
        program, inserts = found   # one query token, written without its axis
        lifted, one_query = tuple(inserts.items()), True
        chain = recognise_attention(program, names, axis, WHO, dtypes=("bf16", "f16"),
                                    logsumexp=True, value_dims=True)
    if one_query:
        program = _at_one_query(program, chain)
        chain = recognise_attention(program, names, axis, WHO, dtypes=("bf16", "f16"),
                                    logsumexp=True, value_dims=True)
    b, h, i, j = chain.axes
    if chain.layouts[0] not in ("bhid", "bihd"):
        raise _refuse(f"q's axes by role are {chain.layouts[0]}: packing views its heads and "
                      "query rows as one axis, [b, h, i, d] or (one query token) [b, i, h, d]")
    roles = chain.layouts[0]
    for c in program.computes:
        for body in c.bodies:
            for n in nodes(body):
                if isinstance(n, Load) and n.param.name == chain.q and not all(
                        isinstance(n.indices[roles.index(r)], Axis)
                        and n.indices[roles.index(r)].uid == a.uid
                        for r, a in (("b", b), ("h", h), ("i", i))):
                    raise _refuse(f"{c.name} reads {chain.q} at other indices than its batch, "
                                  "head and query axes", c.loc)
    for c in program.computes:
        if i.uid in _read_apart(c, chain):
            raise _refuse(f"{c.name} reads the query index {i.name} apart from q·k (a mask "
                          "among the query rows): a packed row would have to unpick it", c.loc)
    packed = _packed_program(program, chain, one_query)
    bound = {d for p in packed.tensor_params for d in p.dims if isinstance(d, str)}
    for c in packed.computes:
        for body in c.bodies:
            unbound = sorted({n.name for n in nodes(body) if isinstance(n, DimSize)} - bound)
            if unbound:
                raise _refuse(f"{c.name} reads the size {unbound[0]}, which no tensor of the "
                              "packed program has (its rows are the query heads and rows "
                              f"together: {ROWS} = {chain.dims[1]} / {chain.dims[2]} · "
                              f"{chain.dims[3]})", c.loc)
    return PackedRows(packed, chain, one_query, lifted)


def reads_query_head(program: Program, chain: AttentionChain) -> bool:
    """Whether ``program`` reads the query head apart from q·k (a temperature or slope per
    head): packed, such a term is read per score element (its row's head), not once a tile."""
    return any(chain.axes[1].uid in _read_apart(c, chain) for c in program.computes)


def _read_apart(c: Compute, chain: AttentionChain) -> set:
    """The axes (their uids) ``c`` reads apart from the reads packing rewrites (q's loads, k's
    and v's kv-head index)."""
    kv, kv_head = {chain.k, chain.v}, chain.kv_head.key()
    return {n.uid for body in c.bodies
            for n in nodes(substitute(body, lambda x: _placeholder(x, chain, kv, kv_head)))
            if isinstance(n, Axis)}


def _at_one_query(program: Program, chain: AttentionChain) -> Program:
    """``program`` with its query index 0 and its query count 1 wherever they are read apart
    from the loads of q and the output's axes (the program of a decode call)."""
    i, count = chain.axes[2], chain.dims[3]

    def fix(node):
        if isinstance(node, Load) and node.param.name == chain.q:
            return node   # indexed by the query axis: kept, packing views it
        if isinstance(node, Axis) and node.uid == i.uid:
            return Const(0, node.dtype)
        if isinstance(node, DimSize) and node.name == count:
            return Const(1, node.dtype)
        return None

    made = rewrite_computes(program, fix)
    return Program(program.name, program.params, list(made.values()),
                   [made[c.name] for c in program.outputs], program.axes,
                   program.size_constraints, program.loc)


def _placeholder(node, chain: AttentionChain, kv: set, kv_head: tuple):
    """``node`` with the reads packing rewrites taken out (what is left must not read the query
    head or index): q's loads, and k's and v's kv-head index."""
    if isinstance(node, Load) and node.param.name == chain.q:
        return _opaque(node)
    if isinstance(node, Load) and node.param.name in kv:
        return Load(node.param, [_opaque(x) if x.key() == kv_head else x for x in node.indices],
                    node.loc)
    return None


def _opaque(node):
    """A node reading no axis, standing for one packing rewrites (only looked at, never run)."""
    return Const(0, node.dtype)


def _packed_program(program: Program, chain: AttentionChain, one_query: bool) -> Program:
    """The rewrite itself: new axes for the kv-head and the packed rows, q and the output (and
    the log-sum-exp) over them, k and v read by the kv-head."""
    b, h, i, j = chain.axes
    dims = {p.name: p for p in program.tensor_params}
    hkv_size = chain.dims[2]
    kv_axis, row_axis = Axis("hk", hkv_size), Axis("r", ROWS)
    q_param = dims[chain.q]
    d_size = q_param.dims[chain.layouts[0].index("d")]
    packed_q = TensorParam(q_param.name, (chain.dims[0], hkv_size, ROWS, d_size), q_param.dtype,
                           q_param.loc)
    axes_map = {h.uid: kv_axis, i.uid: row_axis}
    kv_head = chain.kv_head.key()

    # a read of the query head apart from q (a temperature or ALiBi slope per head): the head of
    # packed row r of kv-head hk is hk·G + r // M (G heads a kv-head, M query rows a head) —
    # in sizes the packed program binds: R = G·M from q, G = H // HKV where M is not 1 (H from
    # the tensor the head reads)
    rows = DimSize(ROWS)
    if one_query:
        head = kv_axis * rows + row_axis
    else:
        group = binary("floordiv", DimSize(chain.dims[1]), DimSize(hkv_size))
        head = kv_axis * group + binary("floordiv", row_axis, binary("floordiv", rows, group))

    def rewrite(node):
        if isinstance(node, Axis) and node.uid == h.uid:
            return head
        if one_query and isinstance(node, DimSize) and node.name == chain.dims[1] and \
                chain.dims[1] != hkv_size:   # the head count, R heads a kv-head
            return rows * DimSize(hkv_size)
        if isinstance(node, Load) and node.param.name == chain.q:
            d = node.indices[chain.layouts[0].index("d")]
            return Load(packed_q, [b, kv_axis, row_axis, d], node.loc)
        if isinstance(node, Load) and node.param.name in (chain.k, chain.v):
            return Load(node.param, [kv_axis if x.key() == kv_head else x for x in node.indices],
                        node.loc)
        return None

    def packed_axes(c: Compute) -> tuple:
        """The output and the log-sum-exp in the library's order of their roles ([b, hk, r, ·])."""
        axes = tuple(axes_map.get(a.uid, a) for a in c.axes)
        if not c.is_output:
            return axes
        return (b, kv_axis, row_axis,
                *(a for a in axes if a.uid not in (b.uid, kv_axis.uid, row_axis.uid)))

    made = rewrite_computes(program, rewrite, axes=packed_axes)
    params = [packed_q if p is q_param else p for p in program.params]
    return rewritten_program(program, params, made, f"{program.name}_packed_rows")
