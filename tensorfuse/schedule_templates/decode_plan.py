"""The cluster-decode template plan: one query token's rolled attention chain with its keys split
over a thread-block cluster per (batch, kv-head), as data (the CUDA C++:
:mod:`tensorfuse.targets.cuda.cluster_decode`).

:func:`plan_decode` checks that the rolled chain is exactly softmax-weighted attention with the
layouts the kernel indexes and reads its pieces; :func:`check_decode` refuses sizes and knobs the
kernel cannot run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..algebra import inline_elementwise, plan_chain
from ..algebra.exprs import factors, substitute
from ..dsl.evaluate import evaluate_plain
from ..dsl.expr import Axis, Binary, Const, DimSize, Expr, Load, Ref, Symbol, Unary
from ..dsl.printer import to_text
from ..dsl.program import Program
from ..errors import ScheduleError
from ..targets.cuda.expr import to_cuda


@dataclass(frozen=True)
class DecodePlan:
    """The chain's tensors and the score expression (of the scaled-or-not dot product, with the
    batch, head, query and key axes)."""

    q: str
    k: str
    v: str
    score: Expr        # of the dot product ``dot`` and the axes named in ``score_axes``
    out: str
    scalars: tuple[tuple[str, str], ...]
    dims: tuple[str, str, str, str, str, str]   # B, H, HKV, M, N, D size names
    kv_head: Expr      # the kv-head index of k and v, in the query head axis
    head_axis: str     # that axis's name
    dot: str = ""                               # the q·k reduction the score reads
    score_axes: tuple[tuple[str, str], ...] = ()  # axis name -> the kernel's index (b, h, 0, j)

    def describe(self) -> str:
        b, h, hkv, m, n, d = self.dims
        return "\n".join([
            f"cluster-decode plan: {self.out}[{b}, {h}, {m}, {d}] from {self.q}, {self.k}, "
            f"{self.v} ({hkv} kv-heads)",
            f"  score: {to_text(self.score)} ({self.dot}: q·k on tensor cores or CUDA cores)",
            f"  keys {n} split over a cluster per (batch, kv-head); softmax states merged in "
            "distributed shared memory with exp(m_part - m)"])


@dataclass(frozen=True)
class DecodeKnobs:
    """``cluster`` CTAs per (batch, kv-head); ``warps`` per CTA, each sweeping blocks of 32 keys
    with ``stages`` blocks in its shared memory; ``mma``: the group's q·k and p·v on tensor cores
    (``"mma_sync"``, up to 16 heads per group) or CUDA cores (``"fma"``)."""

    cluster: int = 8
    warps: int = 2
    stages: int = 2
    mma: str = "mma_sync"

    def __str__(self) -> str:
        return f"cluster={self.cluster}, warps={self.warps}, stages={self.stages}, mma={self.mma}"


def _refuse(message: str, loc=None) -> ScheduleError:
    return ScheduleError(f"cluster_distribute (attention): {message}", loc)


def _same(a, b) -> bool:
    return a.key() == b.key()


def _is_axis(e, axis) -> bool:
    return isinstance(e, Axis) and e.uid == axis.uid


def plan_decode(program: Program, names: tuple[str, ...], axis: str) -> DecodePlan:
    """Check that the rolled chain is exactly softmax-weighted attention — ``m = max(s)``,
    ``l = sum(exp(s - m))``, ``o = sum(exp(s - m) * v)``, output ``o / l`` — with the layouts the
    kernel indexes, and read its pieces. Anything else is refused: the kernel's merge hard-codes
    this chain's correction ``exp(m_part - m)``."""
    plan_chain(program, names, axis)  # refuses chains that have no correction at all
    by_name = {c.name: c for c in program.computes}
    members = [by_name[n] for n in names]
    maxes = [c for c in members if c.monoid.name == "max"]
    sums = [c for c in members if c.monoid.name == "sum"]
    if len(maxes) != 1 or len(sums) != 2:
        raise _refuse(f"the chain {', '.join(names)} is not max → sum(exp) → weighted sum; cluster "
                      "decode merges softmax states only (use split_update for other chains)")
    m = maxes[0]
    scores = inline_elementwise(m.bodies[0])
    bodies = {c.name: factors(inline_elementwise(c.bodies[0])) for c in sums}
    plain = [c for c in sums if len(bodies[c.name]) == 1]
    weighted = [c for c in sums if len(bodies[c.name]) == 2]
    if len(plain) != 1 or len(weighted) != 1:
        raise _refuse("the chain's sums must be sum(p) and sum(p * v)", m.loc)
    p = bodies[plain[0].name][0]
    if not (isinstance(p, Unary) and p.op == "exp" and isinstance(p.a, Binary) and p.a.op == "sub"
            and _same(p.a.a, scores) and isinstance(p.a.b, Ref) and p.a.b.compute is m):
        raise _refuse(f"the weights of {plain[0].name} must be exp(s - {m.name}) with s the "
                      f"scores {m.name} maximises; the cluster merge corrects by exactly that",
                      plain[0].loc)
    v_load = [f for f in bodies[weighted[0].name] if not _same(f, p)]
    if len(v_load) != 1 or not isinstance(v_load[0], Load):
        raise _refuse(f"{weighted[0].name} must be sum(p * v[...]) with the same weights p as "
                      f"{plain[0].name}", weighted[0].loc)
    v_load = v_load[0]
    outputs = [c for c in program.computes if c.is_output]
    out = outputs[0]
    body = out.bodies[0]
    if len(outputs) != 1 or not (
            isinstance(body, Binary) and body.op == "div" and isinstance(body.a, Ref)
            and body.a.compute is weighted[0] and isinstance(body.b, Ref)
            and body.b.compute is plain[0]) or out.dtypes[0] != "bf16":
        raise _refuse("the output must be the weighted sum divided by the sum of weights, in "
                      "bf16", out.loc)
    dots = [c for c in program.computes if c.is_reduction and all(c is not x for x in members)]
    if len(dots) != 1 or len(dots[0].over) != 1:
        raise _refuse("the scores must be one dot product q·k with elementwise terms", m.loc)
    dot = dots[0]
    loads = factors(dot.bodies[0])
    on_keys = [ld for ld in loads if isinstance(ld, Load) and any(a.name == axis for a in ld.axes)]
    if len(loads) != 2 or not all(isinstance(ld, Load) for ld in loads) or len(on_keys) != 1:
        raise _refuse(f"the scores must be sum(q[...] * k[...], over=d) with k running over "
                      f"{axis!r}", dot.loc)
    k_load = on_keys[0]
    q_load = next(ld for ld in loads if ld is not k_load)
    # layouts: q[b, h, i, d], k[b, hk, j, d], v[b, hk, j, e], out[b, h, i, e]
    d_axis, j_axis = dot.over[0], m.over[0]
    if len(q_load.indices) != 4 or not all(isinstance(x, Axis) for x in q_load.indices) or \
            not _is_axis(q_load.indices[3], d_axis):
        raise _refuse("q must be indexed [b, h, i, d] by plain axes", dot.loc)
    b_axis, h_axis, i_axis = q_load.indices[:3]
    kv_head = k_load.indices[1] if len(k_load.indices) == 4 else None
    e_axis = out.axes[-1] if len(out.axes) == 4 else None
    if kv_head is None or not (
            _is_axis(k_load.indices[0], b_axis) and _is_axis(k_load.indices[2], j_axis)
            and _is_axis(k_load.indices[3], d_axis) and len(v_load.indices) == 4
            and _is_axis(v_load.indices[0], b_axis) and _same(v_load.indices[1], kv_head)
            and _is_axis(v_load.indices[2], j_axis) and _is_axis(v_load.indices[3], e_axis)
            and all(_is_axis(a, x) for a, x in zip(out.axes, (b_axis, h_axis, i_axis, e_axis)))):
        raise _refuse("k and v must be indexed [b, kv-head, j, d] and [b, kv-head, j, e] with one "
                      "kv-head expression, and the output [b, h, i, e]", dot.loc)
    axes = {b_axis.name: "b", h_axis.name: "h", i_axis.name: "0", j_axis.name: "j"}
    to_cuda(scores, {dot.name: "qk"}, "the score", axes=axes)  # refused now if not writable
    qp = next(x for x in program.tensor_params if x.name == q_load.param.name)
    kp = next(x for x in program.tensor_params if x.name == k_load.param.name)
    return DecodePlan(qp.name, kp.name, v_load.param.name, scores, out.name,
                      tuple((x.name, x.dtype) for x in program.scalar_params),
                      (str(qp.dims[0]), str(qp.dims[1]), str(kp.dims[1]), str(qp.dims[2]),
                       str(kp.dims[2]), str(qp.dims[3])), kv_head, h_axis.name, dot.name,
                      tuple(axes.items()))


def _check_head_map(plan: DecodePlan, sizes: dict, H: int, G: int) -> None:
    """The kernel gives query heads ``hk·G … hk·G + G - 1`` to kv-head ``hk``; the program's
    kv-head expression must say the same for every query head."""
    def replace(n):
        if isinstance(n, Axis) and n.name == plan.head_axis:
            return Symbol(n.name, "i64")
        if isinstance(n, DimSize):
            return Const(sizes[n.name], "i64")
        return None

    heads = np.arange(H, dtype=np.int64)
    try:
        got = np.broadcast_to(evaluate_plain(substitute(plan.kv_head, replace),
                                             {plan.head_axis: heads}), heads.shape)
    except Exception:  # noqa: BLE001 - anything the evaluator cannot do is not a head map
        got = None
    if got is None or not np.array_equal(got, heads // G):
        raise _refuse(f"the kv-head index {plan.kv_head} does not give query heads "
                      f"hk·{G}…hk·{G}+{G - 1} to kv-head hk (the grouping the kernel uses)")


def check_decode(plan: DecodePlan, knobs: DecodeKnobs, sizes: dict) -> None:
    """Refuse sizes and knobs the decode kernel cannot run, saying which."""
    B, H, HKV, M, N, D = (sizes[d] for d in plan.dims)
    if M != 1:
        raise _refuse(f"cluster decode is for one query token (M=1), got M={M}; prefill uses the "
                      "attention template")
    if D not in (64, 128, 256):
        raise _refuse(f"head dim D={D}: cluster decode handles 64, 128 and 256")
    if H % HKV:
        raise _refuse(f"H={H} query heads do not share HKV={HKV} kv-heads evenly")
    G = H // HKV
    _check_head_map(plan, sizes, H, G)
    C, W = knobs.cluster, knobs.warps
    if not 1 <= C <= 16:
        raise _refuse(f"cluster={C}: a cluster has 1 to 16 CTAs (over 8 with the non-portable "
                      "size, which the H100 allows)")
    if W not in (1, 2, 4, 8, 16):
        raise _refuse(f"warps={W} is not 1, 2, 4, 8 or 16")
    if knobs.stages not in (2, 3, 4):
        raise _refuse(f"stages={knobs.stages} is not 2, 3 or 4 (blocks of 32 keys per warp in "
                      "shared memory, stages − 1 of them in flight)")
    if knobs.mma not in ("mma_sync", "fma"):
        raise _refuse(f"mma={knobs.mma!r} is not 'mma_sync' (tensor cores) or 'fma' (CUDA cores)")
    if knobs.mma == "mma_sync" and G > 16:
        raise _refuse(f"mma='mma_sync' takes up to 16 query heads per kv-head (one 16-row MMA "
                      f"tile); this group has {G}: use mma='fma'")
