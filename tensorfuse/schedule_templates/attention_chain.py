"""Recognising softmax-weighted attention in a rolled chain, for the CUDA C++ templates.

The Triton attention template takes any chain the rolling update accepts; the hand-scheduled CUDA
kernels (cluster decode, the Hopper attention template) hard-code the softmax chain's states and
its correction ``exp(m_old - m_new)``, so they first check that the chain is exactly

    m = max(s), l = sum(exp(s - m)), o = sum(exp(s - m) * v), output o / l

with ``s`` any elementwise expression of one dot product ``q·k`` (the score modification and the
mask), ``q[b, h, i, d]``, ``k[b, hk, j, d]``, ``v[b, hk, j, e]`` and the output ``[b, h, i, e]`` —
the axes found by their roles, in any order in each tensor (``[B, S, H, D]`` as well:
``AttentionChain.layouts``) — and read its pieces. Anything else is refused with the reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..algebra import inline_elementwise, plan_chain
from ..algebra.exprs import factors, nodes, substitute
from ..dsl.evaluate import evaluate_plain
from ..dsl.expr import (Axis, Binary, Cast, Compare, Const, DimSize, Expr, Load, Ref, Symbol, Unary,
                        Where, binary, unary)
from ..dsl.program import Compute, Program
from ..errors import ScheduleError


# q, k, v, the output and the log-sum-exp as the library lays them out (axes by role)
LIBRARY_LAYOUTS = ("bhid", "bhjd", "bhjd", "bhid", "bhi")


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
    dtype: str = "bf16"                         # of q, k, v (and the output: out_dtype)
    axes: tuple = ()                            # the Axis objects b, h, i (queries), j (keys)
    lse: str = ""                               # the log-sum-exp output's name (with_logsumexp)
    # each tensor's axes by role, outermost first: q, k, v, the output (and the log-sum-exp) —
    # b (batch), h (the head; the kv-head in k and v), i (queries), j (keys), d (the head dim,
    # the output's e); the library's layout is LIBRARY_LAYOUTS
    layouts: tuple[str, ...] = LIBRARY_LAYOUTS[:4]
    # the size name of v's and the output's head dim where p·v runs over another one than q·k
    # (DeepSeek's 192 and 128); "" where both are dims[5]
    value_dim: str = ""
    # attention sinks, ``o / (l + exp(sink - m))`` (gpt-oss): (the tensor, its dtype, its axes
    # by role — "h" or "bh"), where the caller takes them (``sinks=True``)
    sink: tuple[str, str, str] | None = None
    # the output is ``where(l > 0, o / l, 0)``: a row whose scores are all -inf gives 0 (as
    # SDPA's kernels), where the caller takes it (``empty_rows=True``)
    empty_rows: bool = False
    # the output's dtype where it is not q's, k's and v's (float32: ``float32_output``)
    out_dtype: str = ""

    @property
    def dv(self) -> str:
        """The size name of the head dim of v and the output (``dims[5]`` unless it differs)."""
        return self.value_dim or self.dims[5]

    @property
    def permuted(self) -> bool:
        """Whether a tensor's axes are in another order than the library's ``[b, h, tokens, d]``
        (``[B, S, H, D]``, ``[S, B, H, D]``, …): kernels then address it by its own strides."""
        return self.layouts != LIBRARY_LAYOUTS[:len(self.layouts)]

    def strides(self, tensor: int, sizes: dict) -> dict[str, int]:
        """Element strides by role of tensor ``tensor`` (0 q, 1 k, 2 v, 3 the output, 4 the
        log-sum-exp), contiguous in its declared order at ``sizes``."""
        B, H, HKV, M, N, D = (sizes[d] for d in self.dims)
        extent = {"b": B, "h": HKV if tensor in (1, 2) else H, "i": M, "j": N,
                  "d": sizes[self.dv] if tensor in (2, 3) else D}
        out, stride = {}, 1
        for role in reversed(self.layouts[tensor]):
            out[role] = stride
            stride *= extent[role]
        return out


def _same(a, b) -> bool:
    return a.key() == b.key()


def _rounded(f, p) -> bool:
    """Whether ``f`` is the weights ``p`` rounded to a float dtype (``T.cast(p, "bf16")``, as
    torch's ``softmax(s).to(v.dtype)``): the kernel rounds them to the values' dtype for ``p·v``
    itself, so weights rounded to it, or to float32, are the ones it multiplies."""
    return isinstance(f, Cast) and f.dtype in ("bf16", "f16", "f32") and _same(f.a, p)


def _is_axis(e, axis) -> bool:
    return isinstance(e, Axis) and e.uid == axis.uid


def recognise_attention(program: Program, names: tuple[str, ...], axis: str, who: str,
                        dtypes: tuple[str, ...] = ("bf16",),
                        logsumexp: bool = False, value_dims: bool = False,
                        sinks: bool = False, empty_rows: bool = False,
                        float32_output: bool = False) -> AttentionChain:
    """The pieces of the rolled chain ``names`` over ``axis`` when it is softmax-weighted
    attention (module docstring) with q, k, v and the output in one of ``dtypes`` (and, where the
    kernel writes it, ``logsumexp``, the second output :func:`with_logsumexp` adds; with
    ``value_dims``, v's head dim may differ from q's and k's; with ``sinks``, the output may be
    ``o / (l + exp(sink[h] - m))``; with ``empty_rows``, ``where(l > 0, …, 0)`` around it: rows
    with no key give 0; with ``float32_output``, the output may also be float32 — as a float32
    term of the score, a temperature or a bias table, makes it); otherwise a
    :class:`ScheduleError` starting with ``who`` that says what differs."""
    def refuse(message: str, loc=None) -> ScheduleError:
        return ScheduleError(f"{who}: {message}", loc)

    plan_chain(program, names, axis)  # refuses chains that have no correction at all
    try:
        m, plain, weighted, scores, p = softmax_states(program, names)
    except ScheduleError as exc:
        raise refuse(exc.message, exc.location) from None
    members = [m, plain, weighted]
    terms = factors(inline_elementwise(weighted.bodies[0]))
    v_load = [f for f in terms if not (_same(f, p) or _rounded(f, p))]
    if len(v_load) != 1 or not isinstance(v_load[0], Load) or any(
            _rounded(f, p) and f.dtype not in (v_load[0].param.dtype, "f32") for f in terms):
        raise refuse(f"{weighted.name} must be sum(p * v[...]) with the same weights p as "
                     f"{plain.name}", weighted.loc)
    v_load = v_load[0]
    outputs = [c for c in program.computes if c.is_output]
    out = outputs[0]
    body = out.bodies[0]
    # the float32 ratio cast, as stored (to float32 too, where that output is taken)
    if isinstance(body, Cast) and (body.dtype in dtypes or float32_output and body.dtype == "f32"):
        body = body.a
    body = _quotient(body)
    guarded = _guarded_ratio(body, plain)
    if guarded is not None and empty_rows:
        body = guarded
    ratio = isinstance(body, Binary) and body.op == "div" and isinstance(body.a, Ref) and \
        body.a.compute is weighted and isinstance(body.b, Ref) and body.b.compute is plain
    sink = None if ratio else _sink_of(body, weighted, plain, m)
    lse = outputs[1] if len(outputs) == 2 and _logsumexp_shaped(
        outputs[1], m, plain, None if sink is None else body) else None
    if lse is not None and lse.dtypes != ("f32",):
        raise refuse(f"the log-sum-exp output {lse.name} is {lse.dtypes[0]}; the attention "
                     "templates write it in float32: cast it (T.cast(m + T.log(l), 'f32'))",
                     lse.loc)
    if lse is not None and not logsumexp:
        raise refuse(f"this kernel does not write the log-sum-exp output {lse.name} (the Hopper "
                     "and Triton attention templates do)", lse.loc)
    shaped = len(outputs) == 1 + (lse is not None) and (ratio or sink is not None)
    if shaped and sink is not None and not sinks:
        raise refuse("attention sinks (o / (l + exp(sink - m))) are not taken here (the "
                     "attention template takes them)", out.loc)
    wide_out = float32_output and out.dtypes[0] == "f32"
    # a float32 score term makes a float32 output
    if shaped and out.dtypes[0] not in dtypes and not wide_out:
        raise refuse(f"the output {out.name} is {out.dtypes[0]}; this template writes "
                     f"{' or '.join(dtypes)}: cast it (T.cast(..., {dtypes[0]!r}))", out.loc)
    if not shaped:
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
    d_axis, j_axis = dot.over[0], m.over[0]
    roles = _axis_roles(q_load, k_load, v_load, out, d_axis, j_axis)
    if isinstance(roles, str):
        raise refuse(roles, dot.loc)
    (b_axis, h_axis, i_axis, e_axis), kv_head, layouts = roles
    params = {x.name: x for x in program.tensor_params}
    qp, kp = params[q_load.param.name], params[k_load.param.name]
    vp = params[v_load.param.name]
    q_dim, v_dim = qp.dims[layouts[0].index("d")], vp.dims[layouts[2].index("d")]
    if q_dim != v_dim and not value_dims:
        raise refuse(f"q·k runs over {q_dim} and p·v over {v_dim}: this kernel keeps one head dim "
                     "for both (the attention template takes different ones)", dot.loc)
    kinds = {qp.dtype, kp.dtype, vp.dtype} | (set() if wide_out else {out.dtypes[0]})
    if len(kinds) != 1:
        also = "" if wide_out else " and the output"
        raise refuse(f"q, k, v{also} must share one dtype, got {sorted(kinds)}", dot.loc)
    if wide_out and qp.dtype not in dtypes:
        raise refuse(f"q, k and v are {qp.dtype}; this template reads {' or '.join(dtypes)}",
                     dot.loc)
    axes = {b_axis.name: "b", h_axis.name: "h", i_axis.name: "0", j_axis.name: "j"}
    if lse is not None:
        lse_roles = {b_axis.uid: "b", h_axis.uid: "h", i_axis.uid: "i"}
        layouts = (*layouts, "".join(lse_roles[a.uid] for a in lse.axes))
    sink_roles = None
    if sink is not None:
        roles_of = {b_axis.uid: "b", h_axis.uid: "h"}
        sink_roles = "".join(roles_of.get(getattr(x, "uid", None), "?") for x in sink.indices)
        if sink_roles not in ("h", "bh") or not all(isinstance(x, Axis) for x in sink.indices):
            raise refuse(f"a sink must be read per head, {sink.param.name}[h] or [b, h]; got "
                         f"{sink}", out.loc)
    q_at, k_at = layouts[0].index, layouts[1].index
    return AttentionChain(qp.name, kp.name, vp.name, scores, out.name,
                          tuple((x.name, x.dtype) for x in program.scalar_params),
                          (str(qp.dims[q_at("b")]), str(qp.dims[q_at("h")]),
                           str(kp.dims[k_at("h")]), str(qp.dims[q_at("i")]),
                           str(kp.dims[k_at("j")]), str(qp.dims[q_at("d")])), kv_head,
                          h_axis.name, dot.name, tuple(axes.items()), qp.dtype,
                          (b_axis, h_axis, i_axis, j_axis), lse.name if lse is not None else "",
                          layouts, str(v_dim) if v_dim != q_dim else "",
                          None if sink is None else (sink.param.name, sink.param.dtype,
                                                     sink_roles), guarded is not None,
                          out.dtypes[0] if out.dtypes[0] != qp.dtype else "")


def _quotient(e: Expr) -> Expr:
    """``x * (1 / y)`` (in either order) as ``x / y``: the output's ratio written through a
    reciprocal; anything else as it is."""
    if isinstance(e, Binary) and e.op == "mul":
        for a, b in ((e.a, e.b), (e.b, e.a)):
            if isinstance(b, Binary) and b.op == "div" and isinstance(b.a, Const) and \
                    b.a.value == 1:
                return binary("div", a, b.b, e.loc)
    return e


def _guarded_ratio(body: Expr, plain: Compute) -> Expr | None:
    """``r`` where the output is ``where(l > 0, r, 0)`` (or ``l != 0``, or ``where(l == 0, 0, r)``)
    with ``l`` the plain sum of weights — a row whose scores are all -inf gives 0, not 0/0 —
    else None."""
    if not isinstance(body, Where) or not isinstance(body.cond, Compare):
        return None
    cond = body.cond

    def is_zero(e) -> bool:
        return isinstance(e, Const) and e.value == 0

    if not (isinstance(cond.a, Ref) and cond.a.compute is plain and is_zero(cond.b)):
        return None
    if cond.op in ("gt", "ne") and is_zero(body.b):
        return body.a
    if cond.op in ("eq", "le") and is_zero(body.a):
        return body.b
    return None


def _sink_of(body: Expr, weighted: Compute, plain: Compute, m: Compute) -> Load | None:
    """The load ``g`` where the output is ``o / (l + exp(g - m))`` (attention sinks: a score
    outside the keys that takes a share of the softmax and attends to nothing; the elementwise
    computes between inlined), else None."""
    e = inline_elementwise(body)
    if not (isinstance(e, Binary) and e.op == "div" and isinstance(e.a, Ref) and
            e.a.compute is weighted):
        return None
    return sink_term(e.b, plain.name, m.name)


def sink_term(denominator: Expr, l_: str, m: str) -> Load | None:
    """The load ``g`` where ``denominator`` is ``l + exp(g - m)`` (either order; ``l_`` and
    ``m``: the computes' names), else None."""
    def ref(e, name) -> bool:
        return isinstance(e, Ref) and e.compute.name == name

    if not (isinstance(denominator, Binary) and denominator.op == "add"):
        return None
    for total, extra in ((denominator.a, denominator.b), (denominator.b, denominator.a)):
        if ref(total, l_) and isinstance(extra, Unary) and extra.op == "exp" and \
                isinstance(extra.a, Binary) and extra.a.op == "sub" and \
                isinstance(extra.a.a, Load) and ref(extra.a.b, m):
            return extra.a.a
    return None


def _axis_roles(q_load: Load, k_load: Load, v_load: Load, out: Compute, d_axis: Axis,
                j_axis: Axis):
    """``((b, h, i, e), kv-head expression, layouts)`` of ``q·k`` and ``p·v`` by the roles of
    their axes, in whatever order the tensors hold them: ``i`` is q's axis that k does not read,
    ``h`` the one k reads through the kv-head expression (a plain axis too without grouping:
    then ``b`` is the one q holds first), ``e`` the output's axis q does not have; or a string
    saying what does not fit."""
    q_ix, k_ix = q_load.indices, k_load.indices
    if len(q_ix) != 4 or not all(isinstance(x, Axis) for x in q_ix) or \
            len({x.uid for x in q_ix}) != 4 or not any(_is_axis(x, d_axis) for x in q_ix):
        return "q must be indexed by four distinct plain axes: batch, head, query and the head dim"
    reads = lambda e: {a.uid for a in e.axes}   # noqa: E731
    rest = [x for x in k_ix if not (_is_axis(x, j_axis) or _is_axis(x, d_axis))]
    free = [x for x in q_ix if not _is_axis(x, d_axis) and
            not any(x.uid in reads(r) for r in rest)]
    if len(k_ix) != 4 or len(rest) != 2 or len(free) != 1:
        return ("k must be indexed by the batch, the kv-head (the head or an expression of it), "
                "the keys and the head dim, and q by the same batch and head and its query axis")
    i_axis = free[0]
    b_h = [x for x in q_ix if not (_is_axis(x, d_axis) or _is_axis(x, i_axis))]
    plain = [r for r in rest if isinstance(r, Axis)]
    if len(plain) == 2:      # no grouping: b is the one q holds first
        b_axis, h_axis = b_h
        kv_head = next(r for r in rest if _is_axis(r, h_axis))
    elif len(plain) == 1 and any(_is_axis(plain[0], x) for x in b_h):
        b_axis = plain[0]
        h_axis = next(x for x in b_h if not _is_axis(x, b_axis))
        kv_head = next(r for r in rest if r is not plain[0])
        if reads(kv_head) != {h_axis.uid}:
            return f"k's kv-head index must read only the query head {h_axis.name}"
    else:
        return "k must be indexed by the batch axis of q as a plain axis"
    e_axes = [a for a in out.axes if not any(_is_axis(a, x) for x in (b_axis, h_axis, i_axis))]
    if len(out.axes) != 4 or len(e_axes) != 1:
        return f"the output must be indexed by {b_axis.name}, {h_axis.name}, {i_axis.name} and " \
               "the value's head dim"
    e_axis = e_axes[0]
    v_ix = v_load.indices
    if len(v_ix) != 4 or sum(_same(x, kv_head) for x in v_ix) != 1 or not all(
            sum(_is_axis(x, a) for x in v_ix) == 1 for a in (b_axis, j_axis, e_axis)):
        return "v must be indexed by the batch, the kv-head expression of k, the keys and the " \
               "output's head dim"

    def layout(indices, kv=None):
        role = {b_axis.uid: "b", h_axis.uid: "h", i_axis.uid: "i", j_axis.uid: "j",
                d_axis.uid: "d", e_axis.uid: "d"}
        return "".join("h" if kv is not None and _same(x, kv) else role[x.uid] for x in indices)

    return ((b_axis, h_axis, i_axis, e_axis), kv_head,
            (layout(q_ix), layout(k_ix, kv_head), layout(v_ix, kv_head), layout(out.axes)))


LSE_FORM = ("a second output m + log(l), float32 [b, h, i]: the log-sum-exp (with sinks, "
            "where(l > 0, m + log(l + exp(sink - m)), sink))")


def softmax_states(program: Program, names: tuple[str, ...]):
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
            and _same(p.a.a, scores) and _the_maximum(p.a.b, m)):
        raise ScheduleError(f"the weights of {plain[0].name} must be exp(s - {m.name}) with s the "
                            f"scores {m.name} maximises; the kernel corrects by exactly that",
                            plain[0].loc)
    return m, plain[0], weighted[0], scores, p


def _the_maximum(e: Expr, m: Compute) -> bool:
    """Whether ``e`` reads the maximum ``m`` as the weights subtract it: as it is, or guarded
    for a row without keys (:func:`guarded_maximum`)."""
    def is_m(x) -> bool:
        return isinstance(x, Ref) and x.compute is m
    return is_m(e) or guarded_maximum(e, is_m)


def guarded_maximum(e: Expr, is_max) -> bool:
    """Whether ``e`` is a maximum (``is_max(x)``: whether ``x`` is it) guarded for a row
    without keys, ``where(m finite, m, c)`` with ``c`` a finite constant — as a logsumexp
    written for the templates takes it (``where(|m| < ∞, m, 0)``:
    :func:`~tensorfuse.algebra.exprs.finite_shift`) or as users write it (``where(m > -inf, m,
    0.0)``, ``where(m == -inf, 0.0, m)``): the same value wherever a row has a finite maximum;
    a row without one has no weight either way (its ``o / l`` NaN, or the fill its output
    chooses where ``l`` is 0)."""
    if not (isinstance(e, Where) and isinstance(e.cond, Compare)):
        return False

    def is_abs_m(x) -> bool:
        return isinstance(x, Unary) and x.op == "abs" and is_max(x.a)

    def infinite(x, sign: int) -> bool:
        return isinstance(x, Const) and x.value == sign * math.inf

    def finite(x) -> bool:
        return isinstance(x, Const) and isinstance(x.value, (int, float)) and \
            not isinstance(x.value, bool) and math.isfinite(x.value)
    a, b, op = e.cond.a, e.cond.b, e.cond.op
    if is_max(b) or is_abs_m(b):   # the maximum on the left
        a, b, op = b, a, {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}.get(op, op)
    finite_if_true = (is_max(a) and op in ("gt", "ne") and infinite(b, -1)) or \
        (is_abs_m(a) and op in ("lt", "ne") and infinite(b, 1))
    infinite_if_true = (is_max(a) and op in ("eq", "le") and infinite(b, -1)) or \
        (is_abs_m(a) and op in ("eq", "ge") and infinite(b, 1))
    if finite_if_true:
        return is_max(e.a) and finite(e.b)
    return infinite_if_true and is_max(e.b) and finite(e.a)


def attention_loads(program: Program, names: tuple[str, ...], axis: str):
    """``(q, k, v, d)`` — the loads of softmax attention's scores ``Σ_d q·k`` (``k`` the one
    over the swept ``axis``), of the values it weighs, and the head dim — where the chain
    ``names`` is softmax attention with its scores one product of two loads; else None. What the
    rewrites that reshape a user's attention before planning it read (:mod:`.packed_lift`,
    :mod:`.merged_heads`)."""
    try:
        m, plain, weighted, _, _ = softmax_states(program, names)
    except ScheduleError:   # not a softmax chain
        return None
    dots = [c for c in program.computes if c.is_reduction and c not in (m, plain, weighted)]
    if len(dots) != 1 or len(dots[0].over) != 1:
        return None
    loads = factors(dots[0].bodies[0])
    on_keys = [ld for ld in loads if isinstance(ld, Load) and any(a.name == axis for a in ld.axes)]
    if len(loads) != 2 or len(on_keys) != 1 or not all(isinstance(ld, Load) for ld in loads):
        return None
    v_load = next((f for f in factors(inline_elementwise(weighted.bodies[0]))
                   if isinstance(f, Load)), None)
    if v_load is None:
        return None
    k_load = on_keys[0]
    return next(ld for ld in loads if ld is not k_load), k_load, v_load, dots[0].over[0]


def _logsumexp_body(m: Compute, l_: Compute, sink_ratio: Expr | None = None) -> Expr:
    """``m + log(l)``; where the output is ``o / (l + exp(g - m))`` (``sink_ratio``, attention
    sinks), the log-sum-exp of the softmax's whole denominator, the sink's term in it:
    ``where(l > 0, m + log(l + exp(g - m)), g)`` — a row with no kept key has only the sink's
    term (m is -inf there: the first branch would be -inf + inf)."""
    if sink_ratio is None:
        return binary("add", m.ref(), unary("log", l_.ref()))
    denominator = inline_elementwise(sink_ratio).b
    g = sink_term(denominator, l_.name, m.name)
    return Where(Compare("gt", l_.ref(), Const(0.0, "f32")),
                 binary("add", m.ref(), unary("log", denominator)), Cast(g, "f32"), "f32")


def _logsumexp_shaped(c: Compute, m: Compute, l_: Compute,
                      sink_ratio: Expr | None = None) -> bool:
    """Whether ``c`` is the chain's log-sum-exp, in any dtype: written out or through named
    values (``lse = m + T.log(l)``, then ``T.cast(lse, "f32")``)."""
    body = inline_elementwise(c.bodies[0])
    if isinstance(body, Cast) and body.a.dtype == "f32":
        body = body.a
    return body.key() == inline_elementwise(_logsumexp_body(m, l_, sink_ratio)).key() and \
        [a.uid for a in c.axes] == [a.uid for a in m.axes]


def _is_logsumexp(c: Compute, m: Compute, l_: Compute, sink_ratio: Expr | None = None) -> bool:
    """Whether ``c`` is the chain's log-sum-exp in float32 (what the templates write)."""
    return c.dtypes == ("f32",) and _logsumexp_shaped(c, m, l_, sink_ratio)


def sink_ratio(program: Program, names: tuple[str, ...]) -> Expr | None:
    """The output's ``o / (l + exp(g - m))`` where the chain ``names`` is attention with sinks
    (the output's cast to its dtype and a ``where(l > 0, …, 0)`` around it looked through),
    else None."""
    m, l_, o, _, _ = softmax_states(program, names)
    body = program.outputs[0].bodies[0]
    body = body.a if isinstance(body, Cast) else body
    guarded = _guarded_ratio(body, l_)
    body = body if guarded is None else guarded
    return body if _sink_of(body, o, l_, m) is not None else None


def with_logsumexp(program: Program, names: tuple[str, ...]) -> Program:
    """``program`` (softmax attention fused over ``names``) with a second output: each row's
    log-sum-exp of the scores, ``m + log(l)`` in float32 over the maximum's axes (−inf for a row
    the mask empties; with attention sinks, of the scores and the sink: the sink's value for a
    row the mask empties) — what the backward pass reads instead of recomputing q·kᵀ. Its
    templates write it in their epilogues (one float per row)."""
    m, l_, _, _, _ = softmax_states(program, names)
    ratio = sink_ratio(program, names)
    if any(_is_logsumexp(c, m, l_, ratio) for c in program.outputs):
        raise ScheduleError(f"{program.name} already writes the log-sum-exp")
    taken = {c.name for c in program.computes} | {p.name for p in program.params}
    name = next(n for n in ("lse", *(f"lse_{k}" for k in range(1, 100))) if n not in taken)
    lse = Compute(name, m.axes, (_logsumexp_body(m, l_, ratio),), ("f32",), loc=program.loc,
                  is_output=True)
    return replace(program, name=f"{program.name}_with_lse", computes=[*program.computes, lse],
                   outputs=[*program.outputs, lse])


def check_head_map(chain: AttentionChain, sizes: dict, H: int, G: int, who: str) -> None:
    """The kernels give query heads ``hk·G … hk·G + G - 1`` to kv-head ``hk``; the program's
    kv-head expression must say the same for every query head (answered once per expression,
    head counts and the sizes it reads: a first call at a new prompt length asks again)."""
    reads = tuple(sorted({n.name for n in nodes(chain.kv_head) if isinstance(n, DimSize)}))
    key = (chain.kv_head.key(), chain.head_axis, H, G, tuple(sizes.get(n) for n in reads))
    if key in _HEAD_MAPS_CHECKED:
        return
    _check_head_map(chain, sizes, H, G, who)
    if len(_HEAD_MAPS_CHECKED) > 4096:
        _HEAD_MAPS_CHECKED.clear()
    _HEAD_MAPS_CHECKED.add(key)


_HEAD_MAPS_CHECKED: set = set()   # keys of check_head_map's questions answered yes


def _check_head_map(chain: AttentionChain, sizes: dict, H: int, G: int, who: str) -> None:
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
