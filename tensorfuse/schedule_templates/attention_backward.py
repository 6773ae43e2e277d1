"""The attention backward template's plan: what the FlashAttention-2 backward of an attention-like
program needs, read off the forward's row-tile plan (:mod:`.tile_plan`).

A forward whose chain is softmax attention — ``m = max_j S``, ``l = Σ_j exp(S − m)``,
``o = Σ_j exp(S − m) · v[…, j, e]``, output ``o / l`` (or ``where(l > 0, o / l, c)``), with the
score ``S`` any expression of one tensor-core product ``q·kᵀ`` (scale, bias, soft-cap, masks) —
has the backward

    P = exp(S − LSE)        dV = Pᵀ·dO        dP = dO·Vᵀ        Δ = rowsum(dO ∘ O)
    dS = P ∘ (dP − Δ)       dSraw = dS · ∂S/∂(q·k)       dQ = dSraw·K       dK = dSrawᵀ·Q

where ``∂S/∂(q·k)`` is the score's derivative, taken by :mod:`tensorfuse.dsl.gradients` (the
mask's ``where`` keeps it to the kept elements). With attention sinks, output
``o / (l + exp(g − m))`` (a score ``g`` per batch position outside the keys that attends to
nothing), the same with the sink's term in LSE, and ``dg = −Σ e^(g − LSE) · Δ`` over the rows
(and the batch axes ``g`` is not read by). The plan holds the expressions; the Triton emitter
(:mod:`tensorfuse.targets.triton.attention_backward`) writes the three kernels (statistics and
Δ per query block, dK/dV per key block over every query head of its group, dQ per query block).
An operand broadcast over a batch axis it does not read has the sum over that axis as its
gradient: k and v without one of q's axes (MQA written with ``k[b, j, d]``, a group's query
heads as an axis of their own) take every index of it as a member of their group; q without
one of k's (latent queries shared by the batch) gets a dQ term per index, summed.

Refused with the reason (the generic backward program then runs): scores that read another
differentiable tensor (a learned bias table: its gradient needs a scatter), a value that is not a
plain load of ``v``, outputs other than the attention's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from ..algebra import plan_chain
from ..algebra.exprs import nodes, substitute
from ..dsl import dtypes as dt
from ..dsl.expr import (Axis, Binary, Cast, Compare, Const, Expr, Load, Ref, Symbol, Where,
                        Unary, binary)
from ..dsl.gradients import backprop
from ..dsl.program import Program
from ..errors import TargetError
from .attention_chain import guarded_maximum, sink_term
from .row_fold import group_of
from .tile_plan import plan_rowtile

DS = "__ds"   # the symbol the score's derivative is written in (dS, per element)
MAX_HEAD_DIM = 256   # D = 256 on the smaller tiles of ``BackwardKnobs.for_head_dim``


def tile_dim(d: int) -> int:
    """The width a head dim of ``d`` is computed at: the power of two from 16 (``tl.dot``'s
    smallest K) that holds it; the columns past ``d`` are loaded as zeros and never stored."""
    return max(16, 1 << (d - 1).bit_length())


@dataclass
class BackwardKnobs:
    """Tile sizes of the dK/dV kernel (``m1`` queries × ``n1`` keys) and the dQ kernel (``m2`` ×
    ``n2``; the statistics kernel uses its tiles too), warps and pipeline stages. The defaults
    were the fastest of five settings on the H100 for full and causal attention at S=4096, D=128
    (2.33 / 1.63 ms; the Triton tutorial's 32/128/128/32 with 4 warps took 4.9 / 3.4 ms:
    ``benchmarks.attention_backward``). ``merged``: dK/dV and dQ in one launch (key blocks
    first, then query blocks) rather than two, as FlexAttention's backward — by default where
    the heads are not grouped (H100, S=4096/16384: causal 1.063 against 1.144 ms apart, sliding
    window 0.575 / 0.605; grouped 32/8 heads 2.264 / 2.239 and 32.6 / 28.6 ms: apart wins
    there). Its programs go head by head: ordered block by block across the heads instead
    (a causal mask's longest blocks of every head first) they took 3–9 % longer
    (``benchmarks.attention_backward``)."""

    block_m1: int = 64
    block_n1: int = 128
    block_m2: int = 128
    block_n2: int = 64
    num_warps: int = 8
    num_stages: int = 3
    merged: bool | None = None   # None: merged unless the heads are grouped

    @classmethod
    def for_head_dim(cls, d: int) -> "BackwardKnobs":
        """The defaults at head dim ``d``: above 128, tiles of 32 queries × 64 keys (dK/dV) and
        64 × 32 (dQ) in two stages — at D=256 the dK/dV accumulators alone take 128 registers a
        thread, and these fit (ptxas for sm_90a: 131 KB of shared memory, 32 bytes spilled; 64 ×
        64 tiles spill 380 bytes, one stage 2.3 KB)."""
        return cls(32, 64, 64, 32, 8, 2) if d > 128 else cls()


@dataclass
class AttentionBackwardPlan:
    program: Program
    sizes: dict
    batch: list            # the batch axes of q and the output, in order
    head: Axis | None      # the batch axis k and v read as ``head // group`` (grouped heads)
    group: int
    row: Axis
    col: Axis
    q: Load                # q[…, i, d]: the product's row operand as the program reads it
    k: Load                # k[…, j, d]
    v: Load                # v[…, j, e]
    head_dim: int          # q·k's head dim (q, k, dQ, dK)
    qk: str                # the name of the q·kᵀ product the score reads
    score: Expr            # S, with the mask's −inf, of ``qk`` (a Ref) and the axes
    d_score: Expr          # ∂S/∂(q·k) · dS, of ``qk``, the axes and the symbol DS
    mask: Expr | None
    empty: float | None    # what the output of a row with no kept key is (None: 0/0)
    ds_symbol: str = DS    # the name ``d_score`` reads dS by
    value_dim: int = 0     # p·v's head dim (v, the output, dV); 0: the same as ``head_dim``
    sink: Load | None = None   # g where the output is o / (l + exp(g − m)) (attention sinks)
    # batch axes k and v do not read (q broadcast against them: MQA written with k[b, j, d], a
    # group's query heads as an axis of their own): dK/dV sum over them as over a group's heads
    shared: tuple = ()
    # batch axes q does not read (latent queries shared by the batch): dQ summed over them
    q_unread: tuple = ()
    # tensors the score reads besides q·kᵀ (a bias table, a temperature per sequence): their
    # gradients would be scatters of dS, which the template does not compute — a gradient
    # asked of them takes the gradient program instead (:func:`frozen_refusal`)
    frozen: tuple[str, ...] = ()
    _lists: dict = field(default_factory=dict, repr=False)   # block lists by sizes/scalars

    def __post_init__(self):
        self.value_dim = self.value_dim or self.head_dim

    @property
    def members(self) -> int:
        """Query heads whose gradients flow into each key/value head's dK and dV: the group's
        heads times every combination of the shared axes."""
        return self.group * math.prod(self.extent(a) for a in self.shared)

    @property
    def differentiated(self) -> list[Load]:
        """The loads whose gradients the template gives, in its order: q, k, v, and the sink."""
        return [self.q, self.k, self.v] + ([self.sink] if self.sink is not None else [])

    @property
    def head_tile(self) -> int:
        """q·k's head dim as the kernels compute it (:func:`tile_dim`)."""
        return tile_dim(self.head_dim)

    @property
    def value_tile(self) -> int:
        """p·v's head dim as the kernels compute it."""
        return tile_dim(self.value_dim)

    @property
    def widest_tile_dim(self) -> int:
        """The wider of the two: what the knobs' defaults are chosen for."""
        return max(self.head_tile, self.value_tile)

    def extent(self, axis: Axis) -> int:
        return axis.extent if isinstance(axis.extent, int) else self.sizes[axis.extent]

    def kept(self, e: Expr) -> Expr:
        """``e`` on a block the mask keeps whole: its ``where(mask, a, b)`` read as ``a``."""
        if self.mask is None:
            return e
        key = self.mask.key()
        return substitute(e, lambda n: n.a if isinstance(n, Where) and n.cond.key() == key
                          else None)

    def sink_into_logsumexp(self, lse2, tensors: dict) -> None:
        """Each row's base-2 log-sum-exp of the scores alone (``[batch, M]``, what the statistics
        kernel recomputes) made in place that of the scores and the sink, ``log2(2^lse₂ +
        2^(g·log₂e))``: the denominator the forward divided by (a row with no kept key: the
        sink's alone). A log-sum-exp the forward saved has the sink's term already."""
        import torch

        shaped = lse2.view(*self._batch_extents, -1)
        torch.logaddexp2(shaped, self._sink_by_batch(tensors) * math.log2(math.e), out=shaped)

    def sink_gradient(self, tensors: dict, lse2, delta):
        """``d g = −Σ e^(g − lse) · Δ`` over the rows and the batch axes ``g`` is not read by, in
        the sink tensor's shape and dtype: the sink takes the share ``e^(g − lse)`` of every row's
        softmax and gives the output nothing, so it moves the output by ``−share · O`` (``lse``:
        with the sink's term; ``Δ = rowsum(dO ∘ O)``, as the statistics kernel writes it)."""
        import torch

        extents = self._batch_extents
        g = self._sink_by_batch(tensors)
        share = torch.exp2(g * math.log2(math.e) - lse2.view(*extents, -1))
        summed = -(share * delta.view(*extents, -1)).sum(-1)
        read = [k for k, a in enumerate(self.batch) if a.uid in self._sink_axes]
        unread = [k for k in range(len(extents)) if k not in read]
        summed = summed.sum(unread) if unread else summed   # sum([]) would sum every axis
        order = [sorted(self._sink_axes, key=self._batch_position).index(u)
                 for u in self._sink_axes]
        sink = tensors[self.sink.param.name]
        return summed.permute(order).to(sink.dtype).reshape(sink.shape)

    @property
    def _batch_extents(self) -> list[int]:
        return [self.extent(a) for a in self.batch]

    @property
    def _sink_axes(self) -> list[int]:
        return [x.uid for x in self.sink.indices]

    def _batch_position(self, uid: int) -> int:
        return next(k for k, a in enumerate(self.batch) if a.uid == uid)

    def _sink_by_batch(self, tensors: dict):
        """The sink tensor as float32 ``[*batch extents, 1]``: its axes in the batch axes' order,
        1 along those it is not read by, and along the rows."""
        g = tensors[self.sink.param.name].float()
        order = sorted(range(len(self._sink_axes)),
                       key=lambda k: self._batch_position(self._sink_axes[k]))
        shape = [self.extent(a) if a.uid in self._sink_axes else 1 for a in self.batch]
        return g.permute(order).reshape(*shape, 1)

    @cached_property
    def mask_reads_data(self) -> bool:
        """Whether the mask reads tensors (its block lists then change with their data)."""
        return bool(self._mask_reads)

    @cached_property
    def _mask_reads(self) -> list[str]:
        return sorted({n.param.name for n in nodes(self.mask) if isinstance(n, Load)})

    def block_lists(self, knobs: BackwardKnobs, tensors: dict, scalars: dict,
                    transposed: bool):
        """The mask's block lists (:func:`.block_schedule.block_lists`): per query block its key
        blocks (the dQ kernel's tiles), or ``transposed`` per key block its query blocks (the
        dK/dV kernel's); and whether every program's partial and full blocks are consecutive
        (a causal mask's, a window's whole blocks: the kernels then loop over a range). That is
        read once for lists made once (masks of sizes and scalars); lists of masks that read
        tensors (a boolean mask, document ids) are taken as lists, kept with those tensors while
        they are the same memory, not written since (:func:`tensorfuse.interop.data_key`: a
        training step's backward after another with the same mask finds them)."""
        from ..interop import data_key
        from .block_schedule import block_lists

        device = next(iter(tensors.values())).device
        reads_data = self.mask_reads_data
        key = (transposed, knobs.block_m1, knobs.block_n1, knobs.block_m2, knobs.block_n2,
               str(device), tuple(sorted(scalars.items())))
        if not reads_data and key in self._lists:
            return self._lists[key]
        if reads_data:
            read = [tensors[n] for n in self._mask_reads]
            identity = data_key(read)
            found = self._lists.get(key)
            if found is not None and found[0] == identity:
                return found[1]
        if transposed:
            made = block_lists(self.mask, self.batch, self.col, self.row, self.sizes, tensors,
                               scalars, knobs.block_n1, knobs.block_m1, device)
        else:
            made = block_lists(self.mask, self.batch, self.row, self.col, self.sizes, tensors,
                               scalars, knobs.block_m2, knobs.block_n2, device)
        made = (made, (False, False)) if reads_data else \
            (made, (_consecutive(*made[:2]), _consecutive(*made[2:])))
        # sizes and scalars decide them: made once; else the last, with the tensors they read
        self._lists[key] = (identity, made, read) if reads_data else made
        return made


def _consecutive(counts, index) -> bool:
    """Whether each program's listed blocks (``counts[p]`` of row ``index[p]``) follow each
    other (one synchronisation: the caller keeps the answer with the lists)."""
    import torch

    if index.shape[1] < 2:
        return True
    used = torch.arange(index.shape[1] - 1, device=index.device)[None, :] < counts[:, None] - 1
    return bool(((index[:, 1:] - index[:, :-1] == 1) | ~used).all())


def plan_attention_backward(program: Program, fusion, sizes: dict) -> AttentionBackwardPlan:
    """The backward plan of ``program`` fused by ``fusion`` (the forward template's choice), at
    ``sizes``; :class:`TargetError` saying why where it is not softmax attention."""
    chain = plan_chain(program, fusion.names, fusion.axis)
    plan = plan_rowtile(program, chain, sizes)
    if len(plan.locals) != 1:
        raise TargetError("the attention backward needs one q·kᵀ product in the score")
    (qk, product), = plan.locals.items()
    by_monoid = {}
    for sp in plan.states:
        key = (sp.monoid.name, sp.contraction is not None)
        if key in by_monoid:
            raise TargetError("the attention backward needs one max, one sum and one weighted sum")
        by_monoid[key] = sp
    try:
        m, l_, o = by_monoid[("max", False)], by_monoid[("sum", False)], by_monoid[("sum", True)]
    except KeyError:
        raise TargetError("the chain is not softmax attention (max, sum, weighted sum)") from None
    score = m.body
    if not (_softmax_weight(l_.body, score, m.member.name) and
            o.contraction.left.key() == l_.body.key()):
        raise TargetError("the sums are not exp(score − max) (softmax attention)")
    value = o.contraction.right
    empty, sink = _output_form(plan.outputs, o.member.name, l_.member.name, m.member.name)
    if sink is not None and not _reads_batch_axes(sink, plan.batch):
        raise TargetError(f"the attention backward reads a sink by batch axes of q, each once; "
                          f"got {sink}")
    q, k = _plain_load(product.left, "q"), _plain_load(product.right, "k")
    v = _plain_load(value, "v")
    if plan.fold is not None:   # decode shapes fold grouped heads into rows: read them back
        axis, g = plan.fold
        unfold = lambda e: substitute(e, lambda n: binary("floordiv", axis, Const(g, "i32"))  # noqa
                                      if isinstance(n, Symbol) and n.name == f"__group_{axis.name}"
                                      else None)
        k, v = _plain_load(unfold(product.right), "k"), _plain_load(unfold(value), "v")
    d, dv = plan.feature_size(q.indices[-1]), plan.feature_size(v.indices[-1])
    if not (d <= MAX_HEAD_DIM and dv <= MAX_HEAD_DIM):
        raise TargetError(f"the attention backward holds head dims up to {MAX_HEAD_DIM}, not "
                          f"{sorted({d, dv})}")
    head, group = _grouping(plan, k, v, sizes)
    shared, q_unread = _broadcast_axes(plan.batch, q, k, v)
    contributions = backprop(score, Symbol(DS, "f32"))
    d_score, frozen = None, []
    for leaf, c in contributions:
        if isinstance(leaf, Ref) and leaf.compute.name == qk:
            d_score = c if d_score is None else binary("add", d_score, c)
        elif isinstance(leaf, Load):
            frozen.append(leaf.param.name)
        else:
            raise TargetError(f"the score reads {leaf.compute.name}, whose gradient the "
                              "attention backward does not compute")
    if d_score is None:
        raise TargetError("the score does not depend on q·kᵀ")
    return AttentionBackwardPlan(program, dict(sizes), list(plan.batch), head, group, plan.row,
                                 plan.col, q, k, v, d, qk, score, d_score, plan.mask, empty,
                                 value_dim=dv, sink=sink, shared=shared, q_unread=q_unread,
                                 frozen=tuple(dict.fromkeys(frozen)))


def frozen_refusal(plan: AttentionBackwardPlan, asked) -> str | None:
    """Why the template cannot give the gradients of the parameters named in ``asked`` (a
    tensor the score reads besides q·kᵀ: its gradient is a scatter of dS, e.g. a relative-
    position bias table's), or None where it gives them all."""
    given = {x.param.name for x in plan.differentiated}
    missing = [n for n in asked if n not in given]
    if not missing:
        return None
    frozen = [n for n in missing if n in plan.frozen]
    if frozen:
        return (f"the score reads {', '.join(frozen)}, whose gradient the attention backward "
                "does not compute (a scatter of dS); ask tf.grad(kernel, wrt=[...]) without it, "
                "or leave it without requires_grad, for the template")
    return "a gradient the backward template does not compute is asked for"


def _softmax_weight(e: Expr, score: Expr, m: str) -> bool:
    """Whether ``e`` is ``exp(score − m)``, the maximum as it is or guarded for a row without
    keys (:func:`.attention_chain.guarded_maximum`): the weights the backward recomputes from
    the saved log-sum-exp on every row with a key."""
    ref = Symbol(f"{m}.ref", score.dtype).key()

    def is_max(x) -> bool:
        return x.key() == ref
    return isinstance(e, Unary) and e.op == "exp" and isinstance(e.a, Binary) and \
        e.a.op == "sub" and e.a.a.key() == score.key() and \
        (is_max(e.a.b) or guarded_maximum(e.a.b, is_max))


def _output_form(outputs, o: str, l_: str, m: str) -> tuple[float | None, Load | None]:
    """What a row with no kept key gives (None: 0/0) and the sink's load (None: no sink) of an
    output ``o / l``, ``o / (l + exp(g − m))``, either in ``where(l > 0, …, c)``, cast or not."""
    if len(outputs) != 1:
        raise TargetError("the attention backward handles one output")
    _, e, _ = outputs[0]
    e = e.a if isinstance(e, Cast) and dt.is_float(e.dtype) else e
    empty = None
    if isinstance(e, Where) and isinstance(e.cond, Compare) and e.cond.op == "gt" and \
            _is_ref(e.cond.a, l_) and isinstance(e.cond.b, Const) and e.cond.b.value == 0 and \
            isinstance(e.b, Const):
        e, empty = e.a, float(e.b.value)
    if isinstance(e, Binary) and e.op == "div" and _is_ref(e.a, o):
        if _is_ref(e.b, l_):
            return empty, None
        sink = sink_term(e.b, l_, m)
        if sink is not None:
            return empty, sink
    raise TargetError("the output is not o / l (softmax attention) or o / (l + exp(g − m)) "
                      "(with sinks)")


def _is_ref(e: Expr, name: str) -> bool:
    return isinstance(e, Ref) and e.compute.name == name


def _reads_batch_axes(load: Load, batch: list) -> bool:
    uids = [getattr(x, "uid", None) for x in load.indices]
    return all(isinstance(x, Axis) for x in load.indices) and len(set(uids)) == len(uids) and \
        set(uids) <= {a.uid for a in batch}


def _plain_load(e: Expr, role: str) -> Load:
    if not isinstance(e, Load) or not dt.is_float(e.param.dtype):
        raise TargetError(f"the attention backward needs {role} as a plain tensor read")
    return e


def _broadcast_axes(batch: list, q: Load, k: Load, v: Load) -> tuple[tuple, tuple]:
    """The batch axes neither k nor v reads, and those q does not read: the operands broadcast
    over them, so their gradients are sums over them. k and v must read the same ones (a key
    without its value's axis has no kernel here)."""
    def read(load: Load) -> set:
        return {n.uid for index in load.indices for n in nodes(index) if isinstance(n, Axis)}

    by_k, by_v, by_q = read(k), read(v), read(q)
    batch_uids = {a.uid for a in batch}
    if by_k & batch_uids != by_v & batch_uids:
        raise TargetError("the attention backward needs k and v to read the same batch axes")
    return (tuple(a for a in batch if a.uid not in by_k),
            tuple(a for a in batch if a.uid not in by_q))


def _grouping(plan, k: Load, v: Load, sizes: dict) -> tuple[Axis | None, int]:
    """The head axis k and v read as ``h // G``, and G (1: none)."""
    for a in plan.batch:
        groups = group_of(k, a, sizes) | group_of(v, a, sizes)
        groups.discard(0)
        if groups:
            if len(groups) != 1:
                raise TargetError("k and v group the heads differently")
            return a, groups.pop()
    return None, 1
