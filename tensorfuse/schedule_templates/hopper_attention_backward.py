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
- q, k, v and the output are laid out ``[batch…, tokens, D]`` (k and v indexing the head as
  ``head // group``, the head the last batch axis), bf16 or fp16, head dim 64 or 128 (256 needs
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
    _check_layout(base)
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
                              block_queries(tile_head_dim(base.head_dim), score is not None))


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


def _check_layout(base) -> None:
    """q, k, v and the output indexed ``[batch…, tokens, feature]``, the head axis (grouped
    heads) the last batch axis; else :class:`TargetError`."""
    batch = [a.uid for a in base.batch]
    if base.shared or base.q_unread:
        raise TargetError("the Hopper attention backward needs q, k and v to read every batch "
                          "axis (an operand broadcast over one sums its gradient: the Triton "
                          "kernels)")
    if base.head is not None and base.batch[-1].uid != base.head.uid:
        raise TargetError("the Hopper attention backward needs the head axis as the last batch "
                          "axis where heads share keys")

    def leading(load: Load) -> list:
        out = []
        for index in load.indices[:-2]:
            if isinstance(index, Axis):
                out.append(index.uid)
            elif isinstance(index, Binary) and index.op == "floordiv" and \
                    isinstance(index.a, Axis):
                out.append(index.a.uid)
            else:
                return []
        return out

    for load, tokens in ((base.q, base.row), (base.k, base.col), (base.v, base.col)):
        last = load.indices[-2:]
        if leading(load) != batch or len(last) != 2 or not isinstance(last[0], Axis) or \
                last[0].uid != tokens.uid or not isinstance(last[1], Axis):
            raise TargetError(f"the Hopper attention backward reads {load.param.name} laid out "
                              f"[batch…, tokens, feature], not {load}")
    out = base.program.outputs[0]
    axes = [a.uid for a in out.axes]
    if axes[:-1] != batch + [base.row.uid]:
        raise TargetError("the Hopper attention backward writes the output's gradient laid out "
                          "[batch…, tokens, feature]")


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
        q, k, v = (tensors[x.param.name].contiguous() for x in (plan.q, plan.k, plan.v))
        d_out = d_out.contiguous()
        lse2, delta = self.statistics.row_statistics(tensors, scalars, out, d_out, lse)
        # the kernel's dO tiles are of q's dtype: a float32 output's gradient (Δ above read it
        # whole) rounded as the products take it — read as it is, its bytes were other numbers
        d_out = d_out if d_out.dtype == q.dtype else d_out.to(q.dtype)
        batch = math.prod(plan.extent(a) for a in plan.batch)
        M, N, D = plan.extent(plan.row), plan.extent(plan.col), hplan.head_dim
        kv_batch = batch // plan.group
        dq_acc = torch.zeros(batch * M * D, device=q.device, dtype=torch.float32)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        bm = hplan.block_queries
        if hplan.masked:
            knobs = BackwardKnobs(block_m1=bm, block_n1=BLOCK_KEYS)
            lists, _ = plan.block_lists(knobs, tensors, scalars, True)
        else:
            lists = (lse2,) * 4   # not read
        maps = [tensor_map(t.data_ptr(), (rows_batch, rows, D), (1, box, 64), hplan.dtype)
                for t, rows_batch, rows, box in ((q, batch, M, bm), (k, kv_batch, N, BN),
                                                 (v, kv_batch, N, BN), (d_out, batch, M, bm))]
        maps.append(tensor_map(dq_acc.data_ptr(), (batch, M, D), (1, DQ_ROWS, 32), "f32"))
        factor = 1.0 if hplan.factor is None else _value(hplan.factor, scalars, plan.sizes)
        handles = [ctypes.c_void_p(t.data_ptr()) for t in (lse2, delta, dk, dv, *lists)]
        reads = [ctypes.c_void_p(tensors[n].contiguous().data_ptr()) for n in hplan.mask_tensors]
        values = [scalars[n] for n, _ in self.scalars]
        args = maps + handles + [factor * math.log2(math.e), factor] + reads + values
        grid = (math.ceil(N / BN), kv_batch)
        self.launch(args, grid if hplan.keys_fastest else grid[::-1], THREADS, 1,
                    self.shared_bytes, q.device)
        grads = (dq_acc.view(q.shape).to(q.dtype), dk, dv)
        return grads if plan.sink is None else \
            (*grads, plan.sink_gradient(tensors, lse2, delta))


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
