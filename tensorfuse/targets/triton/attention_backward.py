"""The Triton emitter of the attention backward template: FlashAttention-2's backward for a plan
of :mod:`tensorfuse.schedule_templates.attention_backward` (the score, its derivative and the
mask come from the DSL program, as expressions).

Three kernels, launched in turn:

- ``_tf_bwd_stats`` (query blocks): each row's log-sum-exp of the scores (an online max and sum
  over the key blocks: the forward's statistics, recomputed) and ``Δ = rowsum(dO ∘ O)``;
- ``_tf_bwd_dkdv`` (key blocks, per key/value head): over every query head of the group and every
  query block, ``P = exp(S − LSE)``, ``dV += Pᵀ·dO``, ``dS = P ∘ (dO·Vᵀ − Δ)``, the score's
  derivative applied, ``dK += dSrawᵀ·Q`` — written once, no atomics;
- ``_tf_bwd_dq`` (query blocks): the same ``dS`` over the key blocks, ``dQ += dSraw·K``.

A tile the mask removes whole is skipped (its keep-count tested before any load). Rows with no
kept key get zero gradients (their ``P`` is 0).
"""
from __future__ import annotations

from ...dsl.expr import Load
from ...dsl.program import TensorParam
from .expr import HELPERS, TL_DTYPES, TileContext, strides, to_triton
from .launch import TL_SIGNATURE, compile_for, interpreting, load_kernel

ENTRIES = ("_tf_bwd_stats", "_tf_bwd_dkdv", "_tf_bwd_dq")


def _offset(load: Load, ctx: TileContext) -> str:
    """Element offset of ``load`` in its tensor (row-major strides at the plan's sizes)."""
    terms = []
    for index, stride in zip(load.indices, strides(load.param, ctx.sizes)):
        idx = to_triton(index, ctx.child(keep_dtype=False))
        terms.append(idx if stride == 1 else f"({idx}) * {stride}")
    return " + ".join(terms) or "0"


class _Writer:
    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, text: str, depth: int) -> None:
        self.lines.extend("    " * depth + line for line in text.strip("\n").split("\n"))

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def backward_source(plan, knobs) -> str:
    """Triton source of the three kernels for ``plan`` and ``knobs``."""
    interp = interpreting()
    sizes = plan.sizes
    extents = {a.uid: plan.extent(a) for a in plan.batch}
    M, N, D = plan.extent(plan.row), plan.extent(plan.col), plan.head_dim
    storage = plan.q.param.dtype
    dot_type = TL_DTYPES[storage]
    precision = ", input_precision='ieee'" if storage in ("f32", "f64") else ""
    others = [p for p in plan.program.tensor_params
              if p.name not in (plan.q.param.name, plan.k.param.name, plan.v.param.name)]
    scalars = [p.name for p in plan.program.scalar_params]
    args = ", ".join([plan.q.param.name, plan.k.param.name, plan.v.param.name, "OUT", "DO",
                      "LSE", "DELTA", "DQ", "DK", "DV"] + [p.name for p in others] + scalars)
    out_axes = plan.program.outputs[0].axes
    feature_q, feature_v = plan.q.indices[-1], plan.v.indices[-1]
    OUT = Load(TensorParam("OUT", tuple(a.extent for a in out_axes), storage), list(out_axes))
    DO = Load(TensorParam("DO", OUT.param.dims, storage), list(out_axes))
    DQ = Load(TensorParam("DQ", plan.q.param.dims, storage), list(plan.q.indices))
    DK = Load(TensorParam("DK", plan.k.param.dims, storage), list(plan.k.indices))
    DV = Load(TensorParam("DV", plan.v.param.dims, storage), list(plan.v.indices))
    head = plan.head
    batch_vars = {a.uid: f"ax_{a.name}" for a in plan.batch}

    def ctx(rows: str, cols: str | None, query_side: bool) -> TileContext:
        """Tiles: queries along ``rows`` (a [BM, 1] index) and keys along ``cols`` ([1, BN]),
        or keys along rows (``query_side`` False: a K or V tile)."""
        axes = dict(batch_vars)
        valid = {}
        if query_side:
            axes[plan.row.uid] = f"{rows}[:, None]"
            valid[plan.row.uid] = "row_ok[:, None]"
            if cols is not None:
                axes[plan.col.uid] = f"{cols}[None, :]"
                valid[plan.col.uid] = "col_ok[None, :]"
        else:
            axes[plan.col.uid] = f"{rows}[:, None]"
            valid[plan.col.uid] = "col_ok[:, None]"
        for f in (feature_q, feature_v):
            axes[f.uid] = "offs_d[None, :]"
        return TileContext(axes, valid, {plan.qk: "_qk"}, {"__ds": "_ds"}, sizes,
                           interpreter=interp)

    def load(e: Load, c: TileContext, keep: bool = True) -> str:
        return to_triton(e, c.child(keep_dtype=keep))

    def store(e: Load, value: str, c: TileContext, ok: str) -> str:
        return (f"tl.store({e.param.name} + ({_offset(e, c)}), ({value}).to("
                f"{TL_DTYPES[e.param.dtype]}), mask={ok}[:, None])")

    def decompose(depth: int, grouped: bool) -> str:
        """The batch axes' values from program id 1 (the head axis by key/value head)."""
        lines = ["rest = tl.program_id(1)"]
        for a in reversed(plan.batch):
            n = extents[a.uid]
            name = batch_vars[a.uid]
            if grouped and head is not None and a.uid == head.uid:
                n //= plan.group
                name = "ax_hkv"
            lines += [f"{name} = rest % {n}", f"rest = rest // {n}"]
        return "\n".join("    " * depth + x for x in lines)

    flat_q = " + ".join(f"{batch_vars[a.uid]} * {_prod(extents[b.uid] for b in plan.batch[k + 1:])}"
                        for k, a in enumerate(plan.batch)) or "0"
    rows_kv = lambda r, c: ctx(r, c, True)  # noqa: E731

    def score_lines(c: TileContext, depth: int) -> str:
        """``_s`` (f32 scores, −inf outside the kept and valid elements) from ``_qk``."""
        score = to_triton(plan.score, c)
        return "\n".join("    " * depth + x for x in (
            f"_s = ({score}).to(tl.float32)",
            "_s = tl.where(row_ok[:, None] & col_ok[None, :], _s, float('-inf'))"))

    def gradient_lines(c: TileContext, depth: int) -> str:
        d = to_triton(plan.d_score, c)
        return "\n".join("    " * depth + x for x in (
            "_p = tl.exp(_s - _lse[:, None])",
            f"_dp = tl.dot(_do, tl.trans(_v){precision})",
            "_ds = tl.where(_p == 0.0, 0.0, _p * (_dp - _delta[:, None]))",
            f"_dsr = tl.where(row_ok[:, None] & col_ok[None, :], ({d}).to(tl.float32), 0.0)"))

    def skip_test(c: TileContext, depth: int) -> str:
        if plan.mask is None:
            return "    " * depth + "if True:"
        keep = to_triton(plan.mask, c)
        return "    " * depth + (f"if tl.sum(({keep} & row_ok[:, None] & col_ok[None, :])"
                                 ".to(tl.int32)) > 0:")

    w = _Writer()
    w("import triton\nimport triton.language as tl\nfrom triton.language.extra import "
      "libdevice\n" + HELPERS, 0)
    q_ctx = ctx("offs_m", "offs_n", True)
    k_ctx = ctx("offs_n", None, False)
    lse_ptr = f"({flat_q}) * {M} + offs_m"
    # -- statistics and Δ -------------------------------------------------------------------
    w(f"""
@triton.jit
def _tf_bwd_stats({args}, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
{decompose(1, False)}
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, {D})
    row_ok = offs_m < {M}
    _q = {load(plan.q, q_ctx)}
    _m_i = tl.full([BM], float('-inf'), tl.float32)
    _l_i = tl.zeros([BM], tl.float32)
    for start_n in range(0, {N}, BN):
        offs_n = start_n + tl.arange(0, BN)
        col_ok = offs_n < {N}
        _k = {load(plan.k, ctx("offs_n", None, False))}
        _qk = tl.dot(_q, tl.trans(_k){precision})
{score_lines(q_ctx, 2)}
        _m_new = tl.maximum(_m_i, tl.max(_s, 1))
        _m_use = tl.where(_m_new == float('-inf'), 0.0, _m_new)
        _l_i = _l_i * tl.exp(_m_i - _m_use) + tl.sum(tl.exp(_s - _m_use[:, None]), 1)
        _m_i = _m_new
    _lse = tl.where(_l_i > 0.0, _m_i + tl.log(_l_i), float('inf'))
    tl.store(LSE + {lse_ptr}, _lse, mask=row_ok)
    _o = {load(OUT, q_ctx, keep=False)}
    _do = {load(DO, q_ctx, keep=False)}
    _delta = tl.sum(tl.where(row_ok[:, None], _o * _do, 0.0), 1)
    tl.store(DELTA + {lse_ptr}, _delta, mask=row_ok)
""", 0)
    # -- dK, dV ----------------------------------------------------------------------------------
    group_loop = (f"for g in range({plan.group}):\n        {batch_vars[head.uid]} = "
                  f"ax_hkv * {plan.group} + g" if head is not None else "for g in range(1):")
    head_first = (f"    {batch_vars[head.uid]} = ax_hkv * {plan.group}" if head is not None
                  else "")
    w(f"""
@triton.jit
def _tf_bwd_dkdv({args}, BM: tl.constexpr, BN: tl.constexpr):
    pid_n = tl.program_id(0)
{decompose(1, True)}
{head_first}
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, {D})
    col_ok = offs_n < {N}
    _k = {load(plan.k, k_ctx)}
    _v = {load(plan.v, k_ctx)}
    _dk = tl.zeros([BN, {D}], tl.float32)
    _dv = tl.zeros([BN, {D}], tl.float32)
    {group_loop}
        for start_m in range(0, {M}, BM):
            offs_m = start_m + tl.arange(0, BM)
            row_ok = offs_m < {M}
{skip_test(rows_kv("offs_m", "offs_n"), 3)}
                _q = {load(plan.q, q_ctx)}
                _do = {load(DO, q_ctx)}
                _lse = tl.load(LSE + {lse_ptr}, mask=row_ok, other=float('inf'))
                _delta = tl.load(DELTA + {lse_ptr}, mask=row_ok, other=0.0)
                _qk = tl.dot(_q, tl.trans(_k){precision})
{score_lines(q_ctx, 4)}
{gradient_lines(q_ctx, 4)}
                _dv += tl.dot(tl.trans(_p.to({dot_type})), _do{precision})
                _dk += tl.dot(tl.trans(_dsr.to({dot_type})), _q{precision})
    {store(DK, "_dk", k_ctx, "col_ok")}
    {store(DV, "_dv", k_ctx, "col_ok")}
""", 0)
    # -- dQ --------------------------------------------------------------------------------------
    w(f"""
@triton.jit
def _tf_bwd_dq({args}, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
{decompose(1, False)}
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, {D})
    row_ok = offs_m < {M}
    _q = {load(plan.q, q_ctx)}
    _do = {load(DO, q_ctx)}
    _lse = tl.load(LSE + {lse_ptr}, mask=row_ok, other=float('inf'))
    _delta = tl.load(DELTA + {lse_ptr}, mask=row_ok, other=0.0)
    _dq = tl.zeros([BM, {D}], tl.float32)
    for start_n in range(0, {N}, BN):
        offs_n = start_n + tl.arange(0, BN)
        col_ok = offs_n < {N}
{skip_test(q_ctx, 2)}
            _k = {load(plan.k, ctx("offs_n", None, False))}
            _v = {load(plan.v, ctx("offs_n", None, False))}
            _qk = tl.dot(_q, tl.trans(_k){precision})
{score_lines(q_ctx, 3)}
{gradient_lines(q_ctx, 3)}
            _dq += tl.dot(_dsr.to({dot_type}), _k{precision})
    {store(DQ, "_dq", q_ctx, "row_ok")}
""", 0)
    return w.text()


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


class AttentionBackwardKernels:
    """The three kernels of a plan, launched on PyTorch tensors."""

    def __init__(self, plan, knobs):
        self.plan, self.knobs = plan, knobs
        self.source = backward_source(plan, knobs)

    def __call__(self, tensors: dict, scalars: dict, out, d_out):
        """``(dq, dk, dv)`` for the forward's ``tensors`` (by parameter name) and ``scalars``,
        its output ``out`` and the incoming gradient ``d_out``."""
        import torch
        import triton

        plan, knobs = self.plan, self.knobs
        q, k, v = (tensors[x.param.name].contiguous() for x in (plan.q, plan.k, plan.v))
        batch = _prod(plan.extent(a) for a in plan.batch)
        M, N = plan.extent(plan.row), plan.extent(plan.col)
        lse = torch.empty(batch, M, device=q.device, dtype=torch.float32)
        delta = torch.empty_like(lse)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        others = [tensors[p.name].contiguous() for p in plan.program.tensor_params
                  if p.name not in (plan.q.param.name, plan.k.param.name, plan.v.param.name)]
        values = [scalars[p.name] for p in plan.program.scalar_params]
        args = [q, k, v, out.contiguous(), d_out.contiguous(), lse, delta, dq, dk, dv,
                *others, *values]
        options = {"num_warps": knobs.num_warps, "num_stages": knobs.num_stages}
        if interpreting():
            options = {}
        stats, dkdv, dq_kernel = (load_kernel(self.source, name) for name in ENTRIES)
        bm2, bn2, bm1, bn1 = knobs.block_m2, knobs.block_n2, knobs.block_m1, knobs.block_n1
        stats[(triton.cdiv(M, bm2), batch)](*args, BM=bm2, BN=64, **options)
        dkdv[(triton.cdiv(N, bn1), batch // plan.group)](*args, BM=bm1, BN=bn1, **options)
        dq_kernel[(triton.cdiv(M, bm2), batch)](*args, BM=bm2, BN=bn2, **options)
        return dq, dk, dv

    def compiled(self, target) -> list:
        """The three kernels compiled for ``target`` without launching them (no GPU needed):
        Triton's compiled objects (``.asm["ptx"]``, ``.metadata.shared``)."""
        plan = self.plan
        storage = "*" + TL_SIGNATURE[plan.q.param.dtype]
        names = [plan.q.param.name, plan.k.param.name, plan.v.param.name, "OUT", "DO", "LSE",
                 "DELTA", "DQ", "DK", "DV"]
        sig = {n: ("*fp32" if n in ("LSE", "DELTA") else storage) for n in names}
        for p in plan.program.tensor_params:
            sig.setdefault(p.name, "*" + TL_SIGNATURE[p.dtype])
        for p in plan.program.scalar_params:
            sig[p.name] = TL_SIGNATURE[p.dtype]
        k = self.knobs
        blocks = {"_tf_bwd_stats": (k.block_m2, 64), "_tf_bwd_dkdv": (k.block_m1, k.block_n1),
                  "_tf_bwd_dq": (k.block_m2, k.block_n2)}
        return [compile_for(load_kernel(self.source, name), sig, {"BM": bm, "BN": bn}, target,
                            k.num_warps, k.num_stages) for name, (bm, bn) in blocks.items()]
