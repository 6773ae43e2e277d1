"""The Hopper attention backward's plan and launch: which plans of the attention backward
template (:mod:`.attention_backward`) the sm_90a kernel
(:mod:`tensorfuse.targets.cuda.hopper_attention_backward`) takes, what it needs to know of them,
and the reason where it does not take one (the Triton kernels of the template run then);
:class:`HopperAttentionBackward` runs it on PyTorch tensors.

The kernel computes ``dK, dV`` per key block and adds ``dQ`` into a float32 accumulator, one CTA
per (key block, key/value head), its two consumer warpgroups 64 keys each, the query blocks of
every head of the group (64 or 128 queries each: :func:`block_queries`) streamed through a
ring by a producer warpgroup (TMA). It
takes a plan whose

- score, on the blocks the mask keeps, is the product times a factor of scalars and sizes
  (``q·kᵀ · scale``, ``q·kᵀ / √d``), plus or minus a bias of the axes, scalars and sizes (ALiBi's
  slope times the distance): then ``dS_raw = factor · dS``, the bias evaluated where ``P`` is;
  or any other expression of the product, the axes, scalars and sizes (a soft-cap): ``S`` and
  ``∂S/∂(q·k)`` evaluated per element, ``P · ∂S/∂(q·k)`` kept where ``P`` was;
- mask, if any, is evaluated on the partial blocks of the transposed block lists (causal,
  windows, prefixes, documents: anything the lists describe);
- q, k, v and the output have their axes in any order, the head dim innermost (k and v
  indexing the head as ``head // group``, the head the last batch axis): ``[batch…, tokens,
  D]`` read through 3-D maps, others (``[B, S, H, D]``) through 4-D maps of the tensors' own
  strides, no copy (:func:`map_shapes`); bf16 or fp16, head dim 64 or 128 (256 needs
  more registers than a consumer has: the Triton kernels take it) — or a multiple of 8 from 32
  to 128 held in tiles of the next (96 as 128: TMA fills the columns past a row with zeros, dQ's
  are not added and dK's and dV's not stored).
"""
from __future__ import annotations

import math

from dataclasses import dataclass

from ..algebra.exprs import nodes, substitute
from ..dsl.expr import Axis, Binary, Const, Expr, Load, Ref, Symbol, unary
from ..errors import TargetError, TensorfuseError
from .attention import SMS
from .hopper_attention_plan import tile_head_dim

HEAD_DIMS = (64, 128)
BLOCK_KEYS = 128   # a CTA's keys (two warpgroups of 64)
MAX_GRID_Y = 65535                     # CUDA's bound on a grid's y
L2_BYTES = 50 * 2**20                  # the H100's and H200's L2
UNEVEN_TAIL = 0.15                     # the longest CTA's share of a masked grid it may have


@dataclass(frozen=True)
class HopperBackwardPlan:
    """What the sm_90a backward kernel reads of an attention backward plan (``base``): the
    operands' dtype, the score's ``factor`` on ``q·kᵀ`` (an expression of scalars and sizes),
    the bias added to it (an expression of the axes, scalars and sizes; None: none), and the
    tensors the mask reads (by parameter name)."""

    base: object
    dtype: str
    factor: Expr | None     # None: the score is q·kᵀ itself
    mask_tensors: tuple[str, ...]
    # the grid's order (:func:`keys_fastest`): a head's key blocks side by side, or the heads
    keys_fastest: bool = False
    bias: Expr | None = None   # the score is q·kᵀ · factor + bias
    # any other score of q·kᵀ and the axes (a soft-cap): S and ∂S/∂(q·k), evaluated per element
    score: Expr | None = None
    derivative: Expr | None = None
    block_queries: int = 64   # the queries of a visit (:func:`block_queries`)
    # q's, k's, v's and the output's dimensions by role (:func:`_role_orders`)
    orders: tuple = ()

    @property
    def strided(self) -> bool:
        """Whether a tensor's axes are not in the roles' order (``[B, S, H, D]`` tensors): the
        kernel reads q, k, v and dO through 4-D maps of their own strides (batch, head, tokens,
        head dim), else through 3-D maps of ``[batch·heads, tokens, D]``."""
        return any(o != tuple(range(len(o))) for o in self.orders)

    @property
    def head_dim(self) -> int:
        """The tensors' head dim."""
        return self.base.head_dim

    @property
    def tile_dim(self) -> int:
        """The kernel's tiles' head dim (:func:`.hopper_attention_plan.tile_head_dim`)."""
        return tile_head_dim(self.base.head_dim)

    @property
    def masked(self) -> bool:
        return self.base.mask is not None


def plan_hopper_backward(base, arch: str) -> HopperBackwardPlan:
    """The Hopper backward's plan of ``base`` (an ``AttentionBackwardPlan``) on ``arch``;
    :class:`TargetError` saying why the kernel does not take it."""
    if arch != "sm_90a":
        raise TargetError(f"the Hopper attention backward runs on sm_90a, not {arch or 'a CPU'}")
    dtypes = {x.param.dtype for x in (base.q, base.k, base.v)}
    if len(dtypes) != 1 or not dtypes <= {"bf16", "f16"}:
        raise TargetError(f"the Hopper attention backward takes bf16 or fp16 q, k and v, not "
                          f"{sorted(dtypes)}")
    if base.value_dim != base.head_dim:
        raise TargetError(f"the Hopper attention backward takes one head dim for q·k and p·v, "
                          f"not {base.head_dim} and {base.value_dim}")
    if base.head_dim % 8 or tile_head_dim(base.head_dim) not in HEAD_DIMS:
        raise TargetError(f"the Hopper attention backward takes head dims {HEAD_DIMS} and the "
                          f"multiples of 8 below them (held in their tiles), not "
                          f"{base.head_dim}")
    orders = _role_orders(base)
    score = derivative = None
    try:
        factor, bias = _score_parts(base.kept(base.score), base.qk)
    except TargetError:
        factor = bias = None
        score, derivative = _pointwise_score(base)
    tensors = ()
    if base.mask is not None:
        tensors = tuple(dict.fromkeys(n.param.name for n in nodes(base.mask)
                                      if isinstance(n, Load)))
    return HopperBackwardPlan(base, dtypes.pop(), factor, tensors, keys_fastest(base), bias,
                              score, derivative,
                              block_queries(tile_head_dim(base.head_dim), score is not None),
                              orders)


def block_queries(tile_dim: int, pointwise: bool) -> int:
    """The queries a consumer visit takes at the tiles' head dim: 128 where a consumer's
    registers hold ``Sᵀ`` and ``dPᵀ`` of 64 keys × 128 queries beside dK and dV (head dims up
    to 64: twice the work per visit for the same barriers, waits and statistics, and ``Sᵀ``,
    ``dPᵀ`` as ``m64n128`` products), else 64 — and 64 for a ``pointwise`` score, whose packed
    P lives beside ``P · ∂S/∂(q·k)`` (at 128 ptxas serialises the wgmmas for want of
    registers). At head dim 64 128 queries took 0.83–0.88× the time of 64 (full, causal and
    grouped causal, S=4096 and 16384; H200, the two timed in one process as
    ``benchmarks.attention_backward --kernels`` times the kernel)."""
    return 128 if tile_dim <= 64 and not pointwise else 64


def _pointwise_score(base) -> tuple[Expr, Expr]:
    """``(S, ∂S/∂(q·k))`` on the blocks the mask keeps, for a score of ``q·kᵀ``, the axes,
    scalars and sizes that is not ``q·kᵀ · c + β`` (a soft-cap's ``cap · tanh(q·kᵀ · scale /
    cap)``): the kernel evaluates both per element; else :class:`TargetError`."""
    score = base.kept(base.score)
    one = Const(1.0, "f32")
    derivative = substitute(base.kept(base.d_score), lambda n: one if isinstance(n, Symbol)
                            and n.name == base.ds_symbol else None)
    for e in (score, derivative):
        if any(isinstance(n, Load) or isinstance(n, Ref) and n.compute.name != base.qk
               for n in nodes(e)):
            raise TargetError("the Hopper attention backward takes scores of q·kᵀ, the axes, "
                              f"scalars and sizes; not {score}")
    return score, derivative


def keys_fastest(base) -> bool:
    """Whether the grid walks a head's key blocks side by side rather than the heads: where the
    float32 dQ that the heads running at once add into (one query head's per key/value head)
    would not stay in L2 — each of a head's key blocks adds into all of its dQ, so side by side
    they add into one head's dQ at a time — and, under a mask, the CTAs' uneven lengths leave a
    short last wave (with the heads side by side every head's longest CTAs start first; a head's
    longest is about ``2 · SMS / CTAs`` of the whole under a causal mask). On the H200
    (``benchmarks.attention_backward --kernels``): S=16384, D=128 0.90× the time (full) and
    0.95× (causal), 0.97× (grouped causal); S=4096 0.95× full, but 1.09× causal
    and, with 16 key/value heads' dQ in L2, 1.18× grouped causal and 1.07–1.13× at D=64."""
    heads = math.prod(base.extent(a) for a in base.batch) // base.group
    rows, keys = base.extent(base.row), base.extent(base.col)
    active = min(heads, SMS) * rows * base.head_dim * 4
    if heads > MAX_GRID_Y or active <= L2_BYTES:
        return False
    ctas = heads * math.ceil(keys / BLOCK_KEYS)
    return base.mask is None or 2 * SMS / ctas < UNEVEN_TAIL


def _score_parts(score: Expr, qk: str) -> tuple[Expr | None, Expr | None]:
    """``(c, β)`` of a score ``q·kᵀ · c + β`` (``c · q·kᵀ``, ``q·kᵀ / c``: then ``1 / c``;
    ``β + …``, ``… − β``: then ``−β``), ``c`` free of axes and tensors (None: 1), ``β`` of the
    axes, scalars and sizes (None: no bias) — where ``dS_raw`` is ``c · dS`` and the bias is
    evaluated with ``P``, as the kernel does; else :class:`TargetError`."""
    def is_qk(e):
        return isinstance(e, Ref) and e.compute.name == qk

    def constant(e):
        return all(not isinstance(n, (Axis, Load, Ref)) for n in nodes(e))

    def factor(e):
        if is_qk(e):
            return True, None
        if isinstance(e, Binary) and e.op == "mul":
            for a, b in ((e.a, e.b), (e.b, e.a)):
                if is_qk(a) and constant(b):
                    return True, b
        if isinstance(e, Binary) and e.op == "div" and is_qk(e.a) and constant(e.b):
            return True, Binary("div", Const(1.0, "f32"), e.b, "f32")
        return False, None

    def bias(e):
        return all(not isinstance(n, (Load, Ref)) for n in nodes(e))

    found, c = factor(score)
    if found:
        return c, None
    if isinstance(score, Binary) and score.op in ("add", "sub"):
        sides = [(score.a, score.b)] + ([(score.b, score.a)] if score.op == "add" else [])
        for a, b in sides:
            found, c = factor(a)
            if found and bias(b):
                return c, b if score.op == "add" else unary("neg", b)
    raise TargetError("the Hopper attention backward takes scores q·kᵀ times a factor of scalars "
                      f"and sizes, plus a bias of the axes, scalars and sizes; not {score}")


def _role_orders(base) -> tuple[tuple[int, ...], ...]:
    """For q, k, v and the output, the tensor's dimensions in the order of their axes' roles —
    the batch axes (in ``base.batch``'s order), the tokens, the feature (the head dim) — so that
    ``tensor.permute(order)`` is ``[batch…, tokens, feature]`` whatever order the program
    indexes them in (``[B, S, H, D]`` as well as ``[B, H, S, D]``); k and v may read the head
    as ``head // group``, the head the last batch axis. The feature is innermost in every one
    (TMA reads rows of it); else :class:`TargetError`."""
    batch = [a.uid for a in base.batch]
    if base.shared or base.q_unread:
        raise TargetError("the Hopper attention backward needs q, k and v to read every batch "
                          "axis (an operand broadcast over one sums its gradient: the Triton "
                          "kernels)")
    if base.head is not None and base.batch[-1].uid != base.head.uid:
        raise TargetError("the Hopper attention backward needs the head axis as the last batch "
                          "axis where heads share keys")

    def uid(index):
        if isinstance(index, Axis):
            return index.uid
        if isinstance(index, Binary) and index.op == "floordiv" and base.head is not None and \
                isinstance(index.a, Axis) and index.a.uid == base.head.uid:
            return index.a.uid
        return None

    def order(what: str, uids: list, tokens: Axis) -> tuple[int, ...]:
        features = [u for u in uids if u not in batch and u != tokens.uid]
        roles = batch + [tokens.uid] + features
        if None in uids or len(features) != 1 or sorted(roles) != sorted(uids):
            raise TargetError(f"the Hopper attention backward reads {what} by the batch axes, "
                              f"the tokens and one feature axis, not {what} indexed {uids}")
        if uids[-1] != features[0]:
            raise TargetError(f"the Hopper attention backward reads {what} with its head dim "
                              "innermost (TMA's rows); the Triton kernels take other layouts")
        return tuple(uids.index(u) for u in roles)

    made = [order(load.param.name, [uid(x) for x in load.indices], tokens)
            for load, tokens in ((base.q, base.row), (base.k, base.col), (base.v, base.col))]
    out = base.program.outputs[0]
    return (*made, order("the output's gradient", [a.uid for a in out.axes], base.row))


class HopperAttentionBackward:
    """The sm_90a backward of one plan, launched on PyTorch tensors: the template's Triton
    statistics kernel (``LSE₂`` and ``Δ``), the Hopper kernel, dQ's conversion. ``plan`` is the
    attention backward plan (what ``autograd`` reads), ``hplan`` the Hopper plan."""

    def __init__(self, hplan, target, statistics):
        from ..targets.cuda.hopper_attention_backward import (ENTRY, backward_source,
                                                               kernel_arguments, shared_bytes)
        from ..targets.cuda.module import TENSOR_MAP, DriverLaunch

        self.hplan, self.plan, self.statistics = hplan, hplan.base, statistics
        program = self.plan.program
        self.scalars = [(p.name, p.dtype) for p in program.scalar_params]
        self.source = backward_source(hplan, self.scalars)
        self.arguments = kernel_arguments(hplan, self.scalars)
        types = tuple(TENSOR_MAP if t == "tensormap" else t for _, t, _ in self.arguments)
        self.launch = DriverLaunch(self.source, target, ENTRY, types)
        # once: the ring's fit is not free
        self.shared_bytes = shared_bytes(hplan.tile_dim, hplan.block_queries)

    def __call__(self, tensors: dict, scalars: dict, out, d_out, lse=None):
        """``(dq, dk, dv)`` (and the sink's gradient), as the Triton kernels' ``__call__``. Under
        ``torch.use_deterministic_algorithms(True)`` the Triton kernels run instead: their dQ is
        the same bits on every run, this kernel's is added in whatever order the CTAs finish."""
        import ctypes

        import torch

        if torch.are_deterministic_algorithms_enabled():
            return self.statistics(tensors, scalars, out, d_out, lse)

        from ..targets.cuda.hopper_attention_backward import BN, DQ_ROWS, THREADS
        from ..targets.cuda.tma import tensor_map
        from .attention_backward import BackwardKnobs

        plan, hplan = self.plan, self.hplan
        q, k, v = (tensors[x.param.name] for x in (plan.q, plan.k, plan.v))
        lse2, delta = self.statistics.row_statistics(tensors, scalars, out, d_out, lse)
        # the kernel's dO tiles are of q's dtype: a float32 output's gradient (Δ above read it
        # whole) rounded as the products take it — read as it is, its bytes were other numbers
        d_out = d_out if d_out.dtype == q.dtype else d_out.to(q.dtype)
        M, N, D = plan.extent(plan.row), plan.extent(plan.col), hplan.head_dim
        batch, kv_batch = role_extents(hplan)
        dq_acc = torch.zeros(math.prod(batch) * M * D, device=q.device, dtype=torch.float32)
        # dK and dV [batch…, keys, D] as the kernel writes them, given back in k's and v's order
        dk, dv = (torch.empty(*kv_batch, N, D, device=q.device, dtype=t.dtype) for t in (k, v))
        if hplan.masked:
            knobs = BackwardKnobs(block_m1=hplan.block_queries, block_n1=BLOCK_KEYS)
            lists, _ = plan.block_lists(knobs, tensors, scalars, True)
        else:
            lists = (lse2,) * 4   # not read
        shapes = map_shapes(hplan, (q, k, v, d_out))
        maps = [tensor_map(t.data_ptr(), sizes, box, hplan.dtype, strides)
                for t, sizes, box, strides in shapes]
        maps.append(tensor_map(dq_acc.data_ptr(), (math.prod(batch), M, D), (1, DQ_ROWS, 32),
                               "f32"))
        factor = 1.0 if hplan.factor is None else _value(hplan.factor, scalars, plan.sizes)
        handles = [ctypes.c_void_p(t.data_ptr()) for t in (lse2, delta, dk, dv, *lists)]
        reads = [ctypes.c_void_p(tensors[n].contiguous().data_ptr()) for n in hplan.mask_tensors]
        values = [scalars[n] for n, _ in self.scalars]
        args = maps + handles + [factor * math.log2(math.e), factor] + reads + values
        grid = (math.ceil(N / BN), math.prod(kv_batch))
        self.launch(args, grid if hplan.keys_fastest else grid[::-1], THREADS, 1,
                    self.shared_bytes, q.device)
        del shapes   # (the views the maps read, copies among them, lived until the launch)
        q_order, k_order, v_order, _ = hplan.orders
        grads = (in_order(dq_acc.view(*batch, M, D), q_order).to(q.dtype),
                 in_order(dk, k_order), in_order(dv, v_order))
        return grads if plan.sink is None else \
            (*grads, plan.sink_gradient(tensors, lse2, delta))


def role_extents(hplan) -> tuple[list[int], list[int]]:
    """The extents of the batch axes as q reads them, and as k and v do (the head's divided by
    the group)."""
    plan = hplan.base
    batch = [plan.extent(a) for a in plan.batch]
    kv = batch[:-1] + [batch[-1] // plan.group] if batch else []
    return batch, kv


def map_shapes(hplan, tensors: tuple) -> list[tuple]:
    """``(tensor, sizes, box, strides)`` of the tensor maps of q, k, v and dO (``tensors``, in
    the layouts the program indexes them in): the tensor the map reads (its address), the
    map's sizes and box (outermost first) and element strides (None: row-major).

    In the roles' order (``[batch…, tokens, D]``), 3-D maps of ``[batch·heads, tokens, D]`` of
    the tensors made contiguous; else (:attr:`HopperBackwardPlan.strided`) 4-D maps of
    ``[batch…, head, tokens, D]`` — the batch axes before the last merged into one — by the
    tensors' own strides, where TMA can take them (head dim contiguous, 16-byte strides and
    address), else of a contiguous copy of that view."""
    plan = hplan.base
    M, N, D = plan.extent(plan.row), plan.extent(plan.col), hplan.head_dim
    batch, kv = role_extents(hplan)
    boxes = (hplan.block_queries, BLOCK_KEYS, BLOCK_KEYS, hplan.block_queries)
    extents = ((batch, M), (kv, N), (kv, N), (batch, M))
    if not hplan.strided:
        return [(t.contiguous(), (math.prod(b), rows, D), (1, box, 64), None)
                for t, (b, rows), box in zip(tensors, extents, boxes)]
    made = []
    for t, order, (b, rows), box in zip(tensors, hplan.orders, extents, boxes):
        view = t.permute(order)
        if len(b) < 2:
            view = view.reshape(*([1] * (2 - len(b))), *view.shape)
        else:
            view = view.flatten(0, len(b) - 2)   # a view where the strides allow, else a copy
        if not _tma_readable(view):
            view = view.contiguous()
        sizes = tuple(view.shape)
        # an axis of one element: torch leaves its stride arbitrary; TMA wants 16-byte ones
        strides = tuple(s if n > 1 else math.prod(sizes[k + 1:])
                        for k, (s, n) in enumerate(zip(view.stride()[:3], sizes)))
        made.append((view, sizes, (1, 1, box, 64), strides))
    return made


def _tma_readable(view) -> bool:
    """Whether TMA reads ``view`` by its strides: the innermost contiguous, the others and the
    address multiples of 16 bytes (axes of one element aside)."""
    size = view.element_size()
    return view.stride(-1) == 1 and view.data_ptr() % 16 == 0 and all(
        s * size % 16 == 0 for s, n in zip(view.stride()[:-1], view.shape[:-1]) if n > 1)


def in_order(role_tensor, order: tuple[int, ...]):
    """A tensor ``[batch…, tokens, D]`` (in the roles' order) as the view of it whose
    dimensions are in a tensor's own order, ``order`` being that tensor's dimensions by role
    (``tensor.permute(order)`` is in the roles' order)."""
    back = [0] * len(order)
    for role, dim in enumerate(order):
        back[dim] = role
    return role_tensor.permute(back)


def _value(e, scalars: dict, sizes: dict) -> float:
    """The number an expression of scalars and sizes stands for."""
    from .mask_values import MaskEvaluator

    value = MaskEvaluator({}, {}, scalars, sizes)(e)
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise TargetError(f"the score's factor {e} is not a number here: {value!r}") from exc


BACKWARDS = ("auto", "hopper", "triton")   # TENSORFUSE_ATTENTION_BACKWARD's values


def hopper_backward(plan, target, triton, chosen: bool | None = None):
    """The sm_90a backward kernel of ``plan`` (the Triton kernels' statistics kernel before it)
    where it is chosen and takes the plan; else None (the Triton kernels run). ``chosen``
    True/False decides; None reads ``TENSORFUSE_ATTENTION_BACKWARD``: ``hopper`` or ``auto``
    (the default) wherever it takes the plan, ``triton`` never. ``auto`` is where it measured
    faster or the same within the runs' noise, which is everywhere it was measured: 0.88–0.89×
    the Triton kernels' time without a mask, 0.91–0.94× under causal masks, 0.85–0.91× grouped
    causal (S=4096 and 16384, head dim 128), 0.84× and 0.81× with ALiBi's bias, 0.54× with a
    soft-cap; at head dim 64 0.79–0.83× without a mask, 0.97–1.00× causal, 0.89–1.04× grouped
    causal; under sliding-window, prefix-LM, neighbourhood and document masks 0.90–1.04× (H200,
    ``benchmarks.attention_backward --kernels``)."""
    import os

    if chosen is None:
        choice = os.environ.get("TENSORFUSE_ATTENTION_BACKWARD", "auto")
        if choice not in BACKWARDS:
            raise TensorfuseError(f"TENSORFUSE_ATTENTION_BACKWARD={choice!r}: one of "
                                  f"{', '.join(BACKWARDS)}")
        chosen = choice != "triton"   # (a plan the kernel refuses: None below)
    if not chosen:
        return None
    try:
        return HopperAttentionBackward(plan_hopper_backward(plan, target.arch), target, triton)
    except TensorfuseError:
        return None


def backward_template(program, fusion, dims: dict, target):
    """The attention backward template of ``program`` (softmax attention fused by ``fusion``)
    at ``dims`` on ``target``: the Hopper kernel where :func:`hopper_backward` chooses it, else
    the Triton kernels; or, where the template refuses the program, the reason (a string)."""
    from ..targets.triton.attention_backward import AttentionBackwardKernels
    from .attention_backward import BackwardKnobs, plan_attention_backward

    try:
        plan = plan_attention_backward(program, fusion, dims)
    except TensorfuseError as exc:
        return exc.message
    triton = AttentionBackwardKernels(plan, BackwardKnobs.for_head_dim(plan.widest_tile_dim))
    return hopper_backward(plan, target, triton) or triton
