"""Attention whose queries are shared by the batch — learned latent queries ``q[l, d]`` (or
``q[h, l, d]``) over each sequence's keys ``k[b, j, d]`` (Perceiver's cross-attention, the
Set Transformer's pooling, a Q-Former's queries) — as the attention the Hopper template plans by
the roles of its axes: q read by the batch axis too (the caller's q copied once per sequence:
``B × L × D`` elements, a small fraction of the keys and values an attention over more keys than
queries reads) and, where no tensor has a head axis, a unit head axis on every tensor (a view).
The Triton template, which takes the program as written, runs it otherwise: at L=256 latent
queries over B=32 sequences of 4096 keys it reached 228 TFLOP/s against SDPA's 305 on the
latents broadcast (``benchmarks.pipeline_kernels --only latent_cross_attention``, H200)."""
from __future__ import annotations

from dataclasses import dataclass

from ..dsl.expr import Axis, Load
from ..dsl.program import Program, TensorParam
from ..algebra.exprs import rewrite_computes, rewritten_program
from .attention_chain import attention_loads
from .lifted_kernel import LiftedKernel
from .packed_lift import UNIT_H, _indices_of, _with

# the Hopper template's tensors are [batch, head, rows, head dim] in some order: q with its
# batch (and a head) added has four axes, the keys and values with a head three or four
HOPPER_RANK = 4


@dataclass(frozen=True)
class SharedQueries:
    """The rewrite of attention with batch-shared queries: ``program`` reads ``q`` (a parameter
    name) by the batch axis too, at ``batch`` (the batch's size: a dimension name or a number);
    ``unit_head``: a unit head axis was added to every tensor, right inside its batch axis
    (``inserts``: where, by tensor or output name; the queries' goes right inside the batch
    axis added first)."""

    program: Program
    q: str
    batch: str | int
    unit_head: bool
    inserts: dict

    def describe(self) -> str:
        head = "; a unit head axis on every tensor" if self.unit_head else ""
        return (f"queries shared by the batch: {self.q} copied once per sequence "
                f"({self.batch} × its elements){head}")


def lift_shared_queries(program: Program, names: tuple[str, ...], axis: str
                        ) -> SharedQueries | None:
    """The rewrite (:class:`SharedQueries`) of softmax attention over ``axis`` whose q lacks one
    axis — the batch — that the keys, the values and every output read as a plain axis; None
    for any other program (q indexed by anything but distinct plain axes, or read as the keys
    or values too)."""
    found = attention_loads(program, names, axis)
    if found is None:
        return None
    q_load, k_load, v_load, d = found
    q_ix = q_load.indices
    if not all(isinstance(x, Axis) for x in q_ix) or len({x.uid for x in q_ix}) != len(q_ix) or \
            q_load.param.name in (k_load.param.name, v_load.param.name):
        return None
    held = {x.uid for x in q_ix}
    plain_in = lambda load: {x.uid for x in load.indices if isinstance(x, Axis)}  # noqa: E731
    outputs = [{a.uid for a in c.axes} for c in program.outputs]
    batch = [x for x in k_load.indices if isinstance(x, Axis) and x.uid not in held and
             x.name != axis and x.uid != d.uid and x.uid in plain_in(v_load) and
             all(x.uid in out for out in outputs)]
    if len(batch) != 1:
        return None
    b = batch[0]
    rest = [x for x in k_load.indices if x is not b and not (isinstance(x, Axis) and
                                                          (x.name == axis or x.uid == d.uid))]
    unit_head = not rest   # no head axis on the keys: one head
    if len(q_ix) + 1 + unit_head != HOPPER_RANK:
        return None
    size = k_load.param.dims[next(k for k, x in enumerate(k_load.indices) if x is b)]
    return _lifted(program, q_load.param, b, size, unit_head,
                   {k_load.param.name, v_load.param.name})


def _lifted(program: Program, q: TensorParam, b: Axis, size, unit_head: bool,
            kv: set) -> SharedQueries:
    h1 = Axis("h1", UNIT_H)
    head = (UNIT_H,) if unit_head else ()
    lifted_q = TensorParam(q.name, (size, *head, *q.dims), q.dtype, q.loc)
    inserts: dict = {}
    params = []
    for param in program.params:
        if param is q:
            params.append(lifted_q)
        elif unit_head and param.name in kv:
            at = _after_batch(program, param.name, b)
            inserts[param.name] = at
            params.append(TensorParam(param.name, _with(param.dims, at, UNIT_H), param.dtype,
                                      param.loc))
        else:
            params.append(param)
    by_name = {p.name: p for p in params}

    def rewrite(node):
        if isinstance(node, Load) and node.param.name == q.name:
            return Load(lifted_q, (b, *((h1,) if unit_head else ()), *node.indices), node.loc)
        if isinstance(node, Load) and node.param.name in inserts:
            return Load(by_name[node.param.name],
                        _with(node.indices, inserts[node.param.name], h1), node.loc)
        return None

    def axes(c):
        uids = [a.uid for a in c.axes]
        if not unit_head or b.uid not in uids:
            return c.axes
        return _with(c.axes, uids.index(b.uid) + 1, h1)

    if unit_head:
        inserts.update({c.name: [a.uid for a in c.axes].index(b.uid) + 1
                        for c in program.outputs})
    made = rewrite_computes(program, rewrite, axes=axes)
    return SharedQueries(rewritten_program(program, params, made), q.name, size, unit_head,
                         inserts)


def _after_batch(program: Program, name: str, b: Axis) -> int:
    """Where a unit head axis goes among the indices of tensor ``name``: right inside ``b``."""
    return [x.uid if isinstance(x, Axis) else None
            for x in _indices_of(program, name)].index(b.uid) + 1


class SharedQueriesKernel(LiftedKernel):
    """``inner``, a kernel of ``shared.program`` (:class:`SharedQueries`), as a kernel of the
    program as written: a call's q copied once per sequence (``expand`` to the batch, then
    contiguous: the Hopper template reads tensors through maps of strides that step forward),
    the keys, values and outputs viewed with the unit head axis where one was added."""

    who = "queries shared by the batch"

    def __init__(self, program, shared: SharedQueries, inner, target):
        super().__init__(program, shared.inserts, inner, target,
                         (UNIT_H,) if shared.unit_head else ())
        self.shared = shared
        self.lift = shared.describe()
        self.description = f"{self.lift}; {inner.description}"

    def _views(self, values: dict, outs: list, dims: dict) -> list:
        name = self.shared.q
        batch = self.shared.batch
        count = dims[batch] if isinstance(batch, str) else batch
        values[name] = per_sequence(values[name], count, self.shared.unit_head)
        return outs

    def _copied(self, inner_kwargs: dict) -> dict:
        count, unit_head = int(inner_kwargs[self.shared.q].shape[0]), self.shared.unit_head
        return {self.shared.q: lambda q: per_sequence(q, count, unit_head)}


def per_sequence(q, count: int, unit_head: bool):
    """``q`` (the queries as the caller holds them) once per sequence: ``[count, (1,) *q's
    axes]``, contiguous."""
    shaped = q.unsqueeze(0).unsqueeze(1) if unit_head else q.unsqueeze(0)
    return shaped.expand(count, *shaped.shape[1:]).contiguous()
