"""Recognising softmax-weighted attention in a rolled chain, for the CUDA C++ templates.

The Triton attention template takes any chain the rolling update accepts; the hand-scheduled CUDA
kernels (cluster decode, the Hopper attention template) hard-code the softmax chain's states and
its correction ``exp(m_old - m_new)``, so they first check that the chain is exactly

    m = max(s), l = sum(exp(s - m)), o = sum(exp(s - m) * v), output o / l

with ``s`` any elementwise expression of one dot product ``q·k`` (the score modification and the
mask), ``q[b, h, i, d]``, ``k[b, hk, j, d]``, ``v[b, hk, j, e]`` and the output ``[b, h, i, e]``,
and read its pieces. Anything else is refused with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..algebra import inline_elementwise, plan_chain
from ..algebra.exprs import factors, substitute
from ..dsl.evaluate import evaluate_plain
from ..dsl.expr import Axis, Binary, Const, DimSize, Expr, Load, Ref, Symbol, Unary, binary, unary
from ..dsl.program import Compute, Program
from ..errors import ScheduleError


@dataclass(frozen=True)
class AttentionChain:
    """The chain's tensors and the score expression (of the dot product ``dot`` and the batch,
    head, query and key axes named in ``score_axes``)."""

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
    dtype: str = "bf16"                         # of q, k, v and the output
    axes: tuple = ()                            # the Axis objects b, h, i (queries), j (keys)
    lse: str = ""                               # the log-sum-exp output's name (with_logsumexp)


def _same(a, b) -> bool:
    return a.key() == b.key()


def _is_axis(e, axis) -> bool:
    return isinstance(e, Axis) and e.uid == axis.uid


def recognise_attention(program: Program, names: tuple[str, ...], axis: str, who: str,
                        dtypes: tuple[str, ...] = ("bf16",),
                        logsumexp: bool = False) -> AttentionChain:
    """The pieces of the rolled chain ``names`` over ``axis`` when it is softmax-weighted
    attention (module docstring) with q, k, v and the output in one of ``dtypes`` (and, where the
    kernel writes it, ``logsumexp``, the second output :func:`with_logsumexp` adds); otherwise a
    :class:`ScheduleError` starting with ``who`` that says what differs."""
    def refuse(message: str, loc=None) -> ScheduleError:
        return ScheduleError(f"{who}: {message}", loc)

    plan_chain(program, names, axis)  # refuses chains that have no correction at all
    try:
        m, plain, weighted, scores, p = _softmax_states(program, names)
    except ScheduleError as exc:
        raise refuse(exc.message, exc.location) from None
    members = [m, plain, weighted]
    v_load = [f for f in factors(inline_elementwise(weighted.bodies[0])) if not _same(f, p)]
    if len(v_load) != 1 or not isinstance(v_load[0], Load):
        raise refuse(f"{weighted.name} must be sum(p * v[...]) with the same weights p as "
                     f"{plain.name}", weighted.loc)
    v_load = v_load[0]
    outputs = [c for c in program.computes if c.is_output]
    out = outputs[0]
    body = out.bodies[0]
    lse = outputs[1] if len(outputs) == 2 and _is_logsumexp(outputs[1], m, plain) else None
    if lse is not None and not logsumexp:
        raise refuse(f"this kernel does not write the log-sum-exp output {lse.name} (the Hopper "
                     "and Triton attention templates do)", lse.loc)
    if len(outputs) != 1 + (lse is not None) or not (
            isinstance(body, Binary) and body.op == "div" and isinstance(body.a, Ref)
            and body.a.compute is weighted and isinstance(body.b, Ref)
            and body.b.compute is plain) or out.dtypes[0] not in dtypes:
        also = f" (and optionally {LSE_FORM})" if logsumexp else ""
        raise refuse(f"the output must be the weighted sum divided by the sum of weights, in "
                     f"{' or '.join(dtypes)}{also}", out.loc)
    dots = [c for c in program.computes if c.is_reduction and all(c is not x for x in members)]
    if len(dots) != 1 or len(dots[0].over) != 1:
        raise refuse("the scores must be one dot product q·k with elementwise terms", m.loc)
    dot = dots[0]
    loads = factors(dot.bodies[0])
    on_keys = [ld for ld in loads if isinstance(ld, Load) and any(a.name == axis for a in ld.axes)]
    if len(loads) != 2 or not all(isinstance(ld, Load) for ld in loads) or len(on_keys) != 1:
        raise refuse(f"the scores must be sum(q[...] * k[...], over=d) with k running over "
                     f"{axis!r}", dot.loc)
    k_load = on_keys[0]
    q_load = next(ld for ld in loads if ld is not k_load)
    # layouts: q[b, h, i, d], k[b, hk, j, d], v[b, hk, j, e], out[b, h, i, e]
    d_axis, j_axis = dot.over[0], m.over[0]
    if len(q_load.indices) != 4 or not all(isinstance(x, Axis) for x in q_load.indices) or \
            not _is_axis(q_load.indices[3], d_axis):
        raise refuse("q must be indexed [b, h, i, d] by plain axes", dot.loc)
    b_axis, h_axis, i_axis = q_load.indices[:3]
    kv_head = k_load.indices[1] if len(k_load.indices) == 4 else None
    e_axis = out.axes[-1] if len(out.axes) == 4 else None
    if kv_head is None or not (
            _is_axis(k_load.indices[0], b_axis) and _is_axis(k_load.indices[2], j_axis)
            and _is_axis(k_load.indices[3], d_axis) and len(v_load.indices) == 4
            and _is_axis(v_load.indices[0], b_axis) and _same(v_load.indices[1], kv_head)
            and _is_axis(v_load.indices[2], j_axis) and _is_axis(v_load.indices[3], e_axis)
            and all(_is_axis(a, x) for a, x in zip(out.axes, (b_axis, h_axis, i_axis, e_axis)))):
        raise refuse("k and v must be indexed [b, kv-head, j, d] and [b, kv-head, j, e] with one "
                     "kv-head expression, and the output [b, h, i, e]", dot.loc)
    params = {x.name: x for x in program.tensor_params}
    qp, kp = params[q_load.param.name], params[k_load.param.name]
    vp = params[v_load.param.name]
    kinds = {qp.dtype, kp.dtype, vp.dtype, out.dtypes[0]}
    if len(kinds) != 1:
        raise refuse(f"q, k, v and the output must share one dtype, got {sorted(kinds)}", dot.loc)
    axes = {b_axis.name: "b", h_axis.name: "h", i_axis.name: "0", j_axis.name: "j"}
    return AttentionChain(qp.name, kp.name, vp.name, scores, out.name,
                          tuple((x.name, x.dtype) for x in program.scalar_params),
                          (str(qp.dims[0]), str(qp.dims[1]), str(kp.dims[1]), str(qp.dims[2]),
                           str(kp.dims[2]), str(qp.dims[3])), kv_head, h_axis.name, dot.name,
                          tuple(axes.items()), out.dtypes[0],
                          (b_axis, h_axis, i_axis, j_axis), lse.name if lse is not None else "")


LSE_FORM = "a second output m + log(l), float32 [b, h, i]: the log-sum-exp"


def _softmax_states(program: Program, names: tuple[str, ...]):
    """``(m, l, o, scores, p)``: the chain's maximum, plain sum of weights, weighted sum, the
    scores and the weights ``p = exp(scores − m)``; a :class:`ScheduleError` where the chain is
    not max → sum(exp) → weighted sum."""
    by_name = {c.name: c for c in program.computes}
    members = [by_name[n] for n in names]
    maxes = [c for c in members if c.monoid.name == "max"]
    sums = [c for c in members if c.monoid.name == "sum"]
    if len(maxes) != 1 or len(sums) != 2:
        raise ScheduleError(f"the chain {', '.join(names)} is not max → sum(exp) → weighted sum; "
                            "this kernel keeps softmax states only (the rolling update's Triton "
                            "template takes other chains)")
    m = maxes[0]
    scores = inline_elementwise(m.bodies[0])
    bodies = {c.name: factors(inline_elementwise(c.bodies[0])) for c in sums}
    plain = [c for c in sums if len(bodies[c.name]) == 1]
    weighted = [c for c in sums if len(bodies[c.name]) == 2]
    if len(plain) != 1 or len(weighted) != 1:
        raise ScheduleError("the chain's sums must be sum(p) and sum(p * v)", m.loc)
    p = bodies[plain[0].name][0]
    if not (isinstance(p, Unary) and p.op == "exp" and isinstance(p.a, Binary) and p.a.op == "sub"
            and _same(p.a.a, scores) and isinstance(p.a.b, Ref) and p.a.b.compute is m):
        raise ScheduleError(f"the weights of {plain[0].name} must be exp(s - {m.name}) with s the "
                            f"scores {m.name} maximises; the kernel corrects by exactly that",
                            plain[0].loc)
    return m, plain[0], weighted[0], scores, p


def _logsumexp_body(m: Compute, l_: Compute) -> Expr:
    return binary("add", m.ref(), unary("log", l_.ref()))


def _is_logsumexp(c: Compute, m: Compute, l_: Compute) -> bool:
    return c.dtypes == ("f32",) and c.bodies[0].key() == _logsumexp_body(m, l_).key() and \
        [a.uid for a in c.axes] == [a.uid for a in m.axes]


def with_logsumexp(program: Program, names: tuple[str, ...]) -> Program:
    """``program`` (softmax attention fused over ``names``) with a second output: each row's
    log-sum-exp of the scores, ``m + log(l)`` in float32 over the maximum's axes (−inf for a row
    the mask empties) — what the backward pass reads instead of recomputing q·kᵀ. Its templates
    write it in their epilogues (one float per row)."""
    m, l_, _, _, _ = _softmax_states(program, names)
    if any(_is_logsumexp(c, m, l_) for c in program.outputs):
        raise ScheduleError(f"{program.name} already writes the log-sum-exp")
    taken = {c.name for c in program.computes} | {p.name for p in program.params}
    name = next(n for n in ("lse", *(f"lse_{k}" for k in range(1, 100))) if n not in taken)
    lse = Compute(name, m.axes, (_logsumexp_body(m, l_),), ("f32",), loc=program.loc,
                  is_output=True)
    return replace(program, name=f"{program.name}_with_lse", computes=[*program.computes, lse],
                   outputs=[*program.outputs, lse])


def check_head_map(chain: AttentionChain, sizes: dict, H: int, G: int, who: str) -> None:
    """The kernels give query heads ``hk·G … hk·G + G - 1`` to kv-head ``hk``; the program's
    kv-head expression must say the same for every query head."""
    def replace(n):
        if isinstance(n, Axis) and n.name == chain.head_axis:
            return Symbol(n.name, "i64")
        if isinstance(n, DimSize):
            return Const(sizes[n.name], "i64")
        return None

    heads = np.arange(H, dtype=np.int64)
    try:
        got = np.broadcast_to(evaluate_plain(substitute(chain.kv_head, replace),
                                             {chain.head_axis: heads}), heads.shape)
    except Exception:  # noqa: BLE001 - anything the evaluator cannot do is not a head map
        got = None
    if got is None or not np.array_equal(got, heads // G):
        raise ScheduleError(f"{who}: the kv-head index {chain.kv_head} does not give query heads "
                            f"hk·{G}…hk·{G}+{G - 1} to kv-head hk (the grouping the kernel uses)")
