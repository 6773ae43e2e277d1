"""The Triton emitter of the attention backward template: FlashAttention-2's backward for a plan
of :mod:`tensorfuse.schedule_templates.attention_backward` (the score, its derivative and the
mask come from the DSL program, as expressions).

Three kernels, launched in turn:

- ``_tf_bwd_stats`` (query blocks, the dQ kernel's blocks): each row's log-sum-exp of the scores
  in base 2 (an online max and sum over the key blocks: the forward's statistics, recomputed;
  ``P = 2^(S·log2e − LSE₂)`` is one multiply-add and ``ex2`` per element) and
  ``Δ = rowsum(dO ∘ O)`` — or, where the forward saved its log-sum-exp (natural log, one float
  per row: :func:`tensorfuse.schedule_templates.attention_chain.with_logsumexp`),
  ``_tf_bwd_delta``: that log-sum-exp in base 2 and Δ, no product recomputed;
- ``_tf_bwd_dkdv`` (key blocks, per key/value head): over every query head of the group and every
  query block, in the transposed orientation (keys along the tile's rows, so that no register
  tile is transposed for the products), ``Pᵀ = exp(Sᵀ − LSE)``, ``dV += Pᵀ·dO``,
  ``dSᵀ = Pᵀ ∘ (V·dOᵀ − Δ)``, the score's derivative applied, ``dK += dSrawᵀ·Q`` — written once,
  no atomics;
- ``_tf_bwd_dq`` (query blocks): the same ``dS`` over the key blocks, ``dQ += dSraw·K``.

With ``knobs.merged`` the last two are one launch (``_tf_bwd_dkdv_dq``, as FlexAttention's): its
first programs take the key blocks of every head, the rest the query blocks, so that the query
blocks (shorter, all alike) fill the SMs while the last key blocks finish.

With a mask the blocks come from block lists (:mod:`.schedule_templates.block_schedule`, made by
the caller): the kernels visit only the blocks the mask keeps, evaluating it on the partial ones
only; the dK/dV kernel's lists are the transposed ones (per key block, its query blocks). Rows
with no kept key get zero gradients (their ``P`` is 0).
"""
from __future__ import annotations

import math

from ...dsl.expr import Load
from ...dsl.program import TensorParam
from .expr import (HELPERS, LOG2E, TL_DTYPES, TileContext, dot_precision, offset, to_triton,
                   with_called_helpers)
from .launch import TL_SIGNATURE, compile_for, interpreting, load_kernel
from .launcher import JitOnce

ENTRIES = ("_tf_bwd_stats", "_tf_bwd_delta", "_tf_bwd_dkdv", "_tf_bwd_dq", "_tf_bwd_dkdv_dq")
NEG_INF = "float('-inf')"
LISTS = ("PN", "PI", "FN", "FI", "TPN", "TPI", "TFN", "TFI")   # dQ's lists, dK/dV's (transposed)
# the constexpr RANGES: which lists hold consecutive blocks for every program (visited as ranges)
RANGE_BITS = {"PN": 1, "FN": 2, "TPN": 4, "TFN": 8}
# after q, k, v: the output, its gradient, the forward's log-sum-exp (natural log; not read where
# the statistics kernel recomputes it), the base-2 log-sum-exp and Δ, the gradients
BUFFERS = ("OUT", "DO", "FWD_LSE", "LSE", "DELTA", "DQ", "DK", "DV")
FLOAT_BUFFERS = ("FWD_LSE", "LSE", "DELTA")
_AT = {name: 3 + k for k, name in enumerate(BUFFERS)}   # a buffer's place among the arguments


def _indent(text: str, depth: int) -> str:
    return "\n".join("    " * depth + line if line else line for line in text.split("\n"))


def dq_buffer(plan) -> Load:
    """dQ's buffer as the kernels index it: laid out as q, in q's dtype; where q is shared by
    batch axes it does not read (``plan.q_unread``), those axes first and float32 — each
    program writes its own term, summed over them after the kernels (:func:`dq_shape`)."""
    q = plan.q
    if not plan.q_unread:
        return Load(TensorParam("DQ", q.param.dims, q.param.dtype), list(q.indices))
    dims = tuple(a.extent for a in plan.q_unread) + tuple(q.param.dims)
    return Load(TensorParam("DQ", dims, "f32"), [*plan.q_unread, *q.indices])


def dq_shape(plan, q_shape: tuple) -> tuple:
    """The shape of dQ's buffer (:func:`dq_buffer`) for q of ``q_shape``."""
    return tuple(plan.extent(a) for a in plan.q_unread) + tuple(q_shape)


def backward_source(plan, knobs) -> str:
    """Triton source of the three kernels for ``plan`` and ``knobs``."""
    return _BackwardSource(plan, knobs).source()


class _BackwardSource:
    """The three kernels' text for one plan and its knobs (:func:`backward_source`): the tiles'
    contexts, the loops over blocks (every block, or the block lists' partial and full ones), a
    block's gradient, and the kernels themselves."""

    def __init__(self, plan, knobs):
        self.plan, self.knobs = plan, knobs
        self.interp = interpreting()
        self.sizes = plan.sizes
        self.extents = extents = {a.uid: plan.extent(a) for a in plan.batch}
        self.M, self.N = M, N = plan.extent(plan.row), plan.extent(plan.col)
        # q·k's and p·v's head dims and their tiles' widths (columns past a dim are masked)
        self.dim_qk, self.dim_v = plan.head_dim, plan.value_dim
        self.tile_qk, self.tile_v = plan.head_tile, plan.value_tile
        self.storage = storage = plan.q.param.dtype
        self.dot_type = TL_DTYPES[storage]
        self.prec = dot_precision(storage)
        self.qkv = (plan.q.param.name, plan.k.param.name, plan.v.param.name)
        self.others = [p.name for p in plan.program.tensor_params if p.name not in self.qkv]
        self.scalars = [p.name for p in plan.program.scalar_params]
        self.args = ", ".join(list(self.qkv) + list(BUFFERS) + list(LISTS) + self.others +
                              self.scalars)
        self.out_axes = out_axes = plan.program.outputs[0].axes
        self.feature_q, self.feature_v = plan.q.indices[-1], plan.v.indices[-1]

        def buffer(name: str, of: Load) -> Load:   # a gradient laid out as the tensor `of`
            return Load(TensorParam(name, of.param.dims, storage), list(of.indices))

        self.OUT = Load(TensorParam("OUT", tuple(a.extent for a in out_axes), storage),
                        list(out_axes))
        self.DO = buffer("DO", self.OUT)
        self.DQ, self.DK, self.DV = dq_buffer(plan), buffer("DK", plan.k), buffer("DV", plan.v)
        self.head = head = plan.head
        self.batch_vars = batch_vars = {a.uid: f"ax_{a.name}" for a in plan.batch}
        self.masked = plan.mask is not None
        self.score_free, self.d_score_free = plan.kept(plan.score), plan.kept(plan.d_score)
        self.i, self.j = plan.row, plan.col
        self.bm1, self.bn1, self.bm2, self.bn2 = bm1, bn1, bm2, bn2 = \
            knobs.block_m1, knobs.block_n1, knobs.block_m2, knobs.block_n2
        # dK/dV's tiles; the statistics' and dQ's
        self.t1, self.t2 = self.tiles(bm1, bn1), self.tiles(bm2, bn2)
        # a row the mask empties has P = 0 but Δ = NaN (its output is 0/0): keep dS at 0 there —
        # on partial blocks only, since such a row has no block the mask keeps whole
        self.guard = self.masked and plan.empty is None
        self.strides_q = [math.prod(extents[b.uid] for b in plan.batch[k + 1:])
                          for k in range(len(plan.batch))]
        self.flat_q = " + ".join(f"{batch_vars[a.uid]} * {stride}"
                                 for a, stride in zip(plan.batch, self.strides_q)) or "0"
        self.rows_ptr = rows_ptr = f"({self.flat_q}) * {M} + offs_m"
        self.fwd_lse_ptr = self.saved_rows(plan, batch_vars, M)
        self.nq2, self.nk2 = math.ceil(M / bm2), math.ceil(N / bn2)
        self.nk1, self.nq1 = math.ceil(N / bn1), math.ceil(M / bm1)
        # (batch, key/value head) pairs, each summing dK/dV over its members (:meth:`member`)
        self.heads = math.prod(extents.values()) // plan.members
        self.key_programs, self.per_head = self.nk1 * self.heads, plan.members * self.nq2
        self.row_stats = (f"_lse = tl.load(LSE + {rows_ptr}, mask=row_ok, other=float('inf'))\n"
                          f"_delta = tl.load(DELTA + {rows_ptr}, mask=row_ok, other=0.0)\n")
        self.rows_start = ("\noffs_m = pid * BM + tl.arange(0, BM)\n" + self.features
                           + f"row_ok = offs_m < {M}\n")
        # a query block
        self.row_block = "bh = tl.program_id(1)\n" + self.decompose(False) + self.rows_start
        self.query_block = self.row_block + f"_q = {self.load(plan.q, self.t2['q'])}"
        t2q = self.t2["q"]
        self.delta = (f"_o = {self.load(self.OUT, t2q, keep=False)}\n"
                      f"_do = {self.load(self.DO, t2q, keep=False)}\n"
                      f"tl.store(DELTA + {rows_ptr}, tl.sum(tl.where(row_ok[:, None], _o * _do, "
                      "0.0), 1), mask=row_ok)")
        self.stats_loop = self.blocks(self.stats_body, "PN,PI,FN,FI", str(self.nq2), self.nk2,
                                      "BN", "offs_n", "col_ok", N)
        self.dq_loop = self.blocks(self.dq_body, "PN,PI,FN,FI", str(self.nq2), self.nk2, "BN",
                                   "offs_n", "col_ok", N)
        self.dkdv_loop = self.blocks(self.dkdv_body, "TPN,TPI,TFN,TFI", str(self.nk1), self.nq1,
                                     "BM", "offs_m", "row_ok", M)
        self.group = f"for _g in range({plan.members}):\n" + _indent(self.member("_g"), 1) + \
            "\n" if plan.members > 1 or head is not None else "for _g in range(1):\n"
        self.head_first = f"{batch_vars[head.uid]} = ax_hkv * {plan.group}" \
            if head is not None else ""

    def ctx(self, axes_of: dict, valid: dict) -> TileContext:
        axes = dict(self.batch_vars)
        axes.update({a.uid: text for a, text in axes_of.items()})
        return TileContext(axes, {a.uid: text for a, text in valid.items()}, {self.plan.qk: "_qk"},
                           {self.plan.ds_symbol: "_ds"}, self.sizes, interpreter=self.interp)

    def tiles(self, bm: int, bn: int) -> dict:
        """The contexts of a kernel with ``bm`` × ``bn`` tiles: queries along the rows and keys
        along the columns (``q``), keys along the rows (``k``: dK/dV), a query tile transposed
        (``qt``); and the validity of their elements (``ok_q``, ``ok_k``: None where the tiles
        divide the axes — the sizes are known here — so no element is masked)."""
        rows, cols = self.M % bm != 0, self.N % bn != 0
        i, j, fq, fv = self.i, self.j, self.feature_q, self.feature_v
        pick = lambda *pairs: {a: t for a, t, on in pairs if on}  # noqa: E731
        both = lambda a, b: " & ".join(x for x in (a, b) if x) or None  # noqa: E731
        # the head dims' columns past the dim (a dim that is not a power of two from 16)
        wide = pick((fq, "dq_ok[None, :]", self.tile_qk != self.dim_qk),
                    (fv, "dv_ok[None, :]", self.tile_v != self.dim_v))
        return {
            "q": self.ctx({i: "offs_m[:, None]", j: "offs_n[None, :]", fq: "offs_dq[None, :]",
                           fv: "offs_dv[None, :]"},
                          {**pick((i, "row_ok[:, None]", rows), (j, "col_ok[None, :]", cols)),
                           **wide}),
            "k": self.ctx({j: "offs_n[:, None]", i: "offs_m[None, :]", fq: "offs_dq[None, :]",
                           fv: "offs_dv[None, :]"},
                          {**pick((j, "col_ok[:, None]", cols), (i, "row_ok[None, :]", rows)),
                           **wide}),
            "qt": self.ctx({i: "offs_m[None, :]", fq: "offs_dq[:, None]"},
                           {**pick((i, "row_ok[None, :]", rows),
                                   (fq, "dq_ok[:, None]", self.tile_qk != self.dim_qk))}),
            "ok_q": both("row_ok[:, None]" if rows else "", "col_ok[None, :]" if cols else ""),
            "ok_k": both("col_ok[:, None]" if cols else "", "row_ok[None, :]" if rows else ""),
            "rows": rows, "cols": cols}

    def load(self, e: Load, c: TileContext, keep: bool = True) -> str:
        return to_triton(e, c.child(keep_dtype=keep))

    @property
    def features(self) -> str:
        """The head dims' column offsets (and, where a tile is wider than its dim, their
        validity)."""
        text = f"offs_dq = tl.arange(0, {self.tile_qk})\noffs_dv = tl.arange(0, {self.tile_v})\n"
        if self.tile_qk != self.dim_qk:
            text += f"dq_ok = offs_dq < {self.dim_qk}\n"
        if self.tile_v != self.dim_v:
            text += f"dv_ok = offs_dv < {self.dim_v}\n"
        return text

    def store(self, e: Load, value: str, c: TileContext, ok: str, ragged: bool) -> str:
        """A gradient's tile stored where its rows (``ok``, if ``ragged``) and its head dim's
        columns are."""
        columns = {self.feature_q.uid: ("dq_ok", self.tile_qk != self.dim_qk),
                   self.feature_v.uid: ("dv_ok", self.tile_v != self.dim_v)}
        column, wide = columns.get(e.indices[-1].uid, ("", False))
        masks = ([f"{ok}[:, None]"] if ragged else []) + ([f"{column}[None, :]"] if wide else [])
        mask = f", mask={' & '.join(masks)}" if masks else ""
        return (f"tl.store({e.param.name} + ({offset(e, c)}), ({value}).to("
                f"{TL_DTYPES[e.param.dtype]}){mask})")

    def valid(self, ok: str | None, value: str, other: str) -> str:
        return value if ok is None else f"tl.where({ok}, {value}, {other})"

    def decompose(self, grouped: bool, member: str | None = None) -> str:
        """The batch axes' values from ``bh`` (the head axis by key/value head; with ``member``
        the query head is that head of the key/value head's group)."""
        lines = ["rest = bh"]
        shared = {a.uid for a in self.plan.shared}
        for a in reversed(self.plan.batch):
            n, name = self.extents[a.uid], self.batch_vars[a.uid]
            if grouped and a.uid in shared:
                continue
            if grouped and self.head is not None and a.uid == self.head.uid:
                n, name = n // self.plan.group, "ax_hkv"
            lines += [f"{name} = rest % {n}", f"rest = rest // {n}"]
        if member is not None:
            lines.append(self.member(member))
        return "\n".join(x for x in lines if x)

    def member(self, var: str) -> str:
        """The batch axes of member ``var`` (``0 … plan.members − 1``) of a key/value head: the
        group's head ``ax_hkv · G + var % G``, then the shared axes from ``var // G``."""
        plan, lines = self.plan, []
        rest = var
        if self.head is not None:
            inner = f"{var} % {plan.group}" if plan.shared else var
            lines.append(f"{self.batch_vars[self.head.uid]} = ax_hkv * {plan.group} + {inner}")
            rest = f"({var} // {plan.group})"
        for a in reversed(plan.shared):
            n = self.extents[a.uid]
            lines.append(f"{self.batch_vars[a.uid]} = {rest} % {n}")
            rest = f"({rest} // {n})"
        return "\n".join(lines)

    def blocks(self, body, lists: str, own: str, count: int, block: str, offs: str, ok: str,
               extent: int) -> str:
        """A loop over the blocks of the other axis: from the block lists where there is a mask
        (partial blocks with it, full ones without), else over every block. ``body(masked)``:
        the loop body's text."""
        head_lines = (f"{offs} = blk * {block} + tl.arange(0, {block})\n"
                      f"{ok} = {offs} < {extent}\n")
        if not self.masked:
            return f"for blk in range(0, {count}):\n" + _indent(head_lines + body(False), 1)
        pn, pi, fn, fi = lists.split(",")
        text = f"base = ({self.flat_q}) * {own} + pid\n"
        for num, idx, with_mask in ((pn, pi, True), (fn, fi, False)):
            # where every program's blocks of this kind are consecutive (RANGES has the list's
            # bit), the loop runs over them as a range from the first: its tiles' addresses
            # follow from the loop counter, and the loads are pipelined ahead as without a mask
            listed = f"blk = tl.load({idx} + base * {count} + _t)\n" + head_lines + body(with_mask)
            ranged = head_lines + body(with_mask)
            first = f"first = tl.load({idx} + base * {count})\n"
            if self.interp:   # the interpreter takes no loop bound loaded from memory
                loop = lambda inner: (f"for _t in range(0, {count}):\n"  # noqa: E731
                                      + _indent(f"if _t < n_{num}:\n" + _indent(inner, 1), 1))
                text += (f"n_{num} = tl.load({num} + base)\nif RANGES & {RANGE_BITS[num]}:\n"
                         + _indent(first + loop("blk = first + _t\n" + ranged), 1)
                         + "\nelse:\n" + _indent(loop(listed), 1) + "\n")
            else:
                text += (f"if RANGES & {RANGE_BITS[num]}:\n"
                         + _indent(first + f"for blk in range(first, first + tl.load({num} + "
                                   f"base)):\n" + _indent(ranged, 1), 1)
                         + "\nelse:\n" + _indent(f"for _t in range(0, tl.load({num} + base)):\n"
                                                    + _indent(listed, 1), 1) + "\n")
        return text

    def gradient(self, t: dict, with_mask: bool, transposed: bool) -> str:
        c = t["k"] if transposed else t["q"]
        ok = t["ok_k"] if transposed else t["ok_q"]
        s = to_triton(self.plan.score if with_mask else self.score_free, c)
        d = to_triton(self.plan.d_score if with_mask else self.d_score_free, c)
        stat = "[None, :]" if transposed else "[:, None]"
        dp = "tl.dot(_v, tl.trans(_do)" if transposed else "tl.dot(_do, tl.trans(_v)"
        ds = f"_p * (_dp - _delta{stat})"
        return "\n".join((
            f"_s = {self.valid(ok, f'({s}).to(tl.float32)', NEG_INF)}",
            f"_p = tl.exp2(_s * {LOG2E} - _lse{stat})",
            f"_dp = {dp}{self.prec})",
            f"_ds = {f'tl.where(_p == 0.0, 0.0, {ds})' if self.guard and with_mask else ds}",
            f"_dsr = {self.valid(ok, f'({d}).to(tl.float32)', '0.0')}")) + "\n"

    def stats_body(self, with_mask: bool) -> str:
        s = to_triton(self.plan.score if with_mask else self.score_free, self.t2["q"])
        return (f"_k = {self.load(self.plan.k, self.t2['k'])}\n"
                f"_qk = tl.dot(_q, tl.trans(_k){self.prec})\n"
                f"_s = {self.valid(self.t2['ok_q'], f'({s}).to(tl.float32)', NEG_INF)}\n"
                "_m_new = tl.maximum(_m_i, tl.max(_s, 1))\n"
                "_m_use = tl.where(_m_new == float('-inf'), 0.0, _m_new)\n"
                "_l_i = _l_i * tl.exp(_m_i - _m_use) + tl.sum(tl.exp(_s - _m_use[:, None]), 1)\n"
                "_m_i = _m_new\n")

    def dq_body(self, with_mask: bool) -> str:
        k, v = self.load(self.plan.k, self.t2["k"]), self.load(self.plan.v, self.t2["k"])
        return (f"_k = {k}\n_v = {v}\n_qk = tl.dot(_q, tl.trans(_k){self.prec})\n"
                + self.gradient(self.t2, with_mask, False)
                + f"_dq += tl.dot(_dsr.to({self.dot_type}), _k{self.prec})\n")

    def dkdv_body(self, with_mask: bool) -> str:
        qt, do = self.load(self.plan.q, self.t1["qt"]), self.load(self.DO, self.t1["q"])
        return (f"_qt = {qt}\n_do = {do}\n" + self.row_stats +
                f"_qk = tl.dot(_k, _qt{self.prec})\n" + self.gradient(self.t1, with_mask, True)
                + f"_dv += tl.dot(_p.to({self.dot_type}), _do{self.prec})\n"
                f"_dk += tl.dot(_dsr.to({self.dot_type}), tl.trans(_qt){self.prec})\n")


    def statistics_kernels(self) -> str:
        """The imports, the helpers and the statistics kernels (recomputed, or from the saved
        log-sum-exp)."""
        return f"""import triton
import triton.language as tl
from triton.language.extra import libdevice
{HELPERS}

@triton.jit
def _tf_bwd_stats({self.args}, BM: tl.constexpr, BN: tl.constexpr, RANGES: tl.constexpr):
    pid = tl.program_id(0)
{_indent(self.query_block, 1)}
    _m_i = tl.full([BM], float('-inf'), tl.float32)
    _l_i = tl.zeros([BM], tl.float32)
{_indent(self.stats_loop, 1)}
    _lse = tl.where(_l_i > 0.0, (_m_i + tl.log(_l_i)) * {LOG2E}, float('inf'))
    tl.store(LSE + {self.rows_ptr}, _lse, mask=row_ok)
{_indent(self.delta, 1)}


@triton.jit
def _tf_bwd_delta({self.args}, BM: tl.constexpr, BN: tl.constexpr, RANGES: tl.constexpr):
    pid = tl.program_id(0)
{_indent(self.row_block, 1)}
    _lse = tl.load(FWD_LSE + {self.fwd_lse_ptr}, mask=row_ok, other=float('-inf'))
    # a row with no kept key: log-sum-exp −inf (or NaN) forward, +inf here (its P is 0)
    tl.store(LSE + {self.rows_ptr}, tl.where(_lse > float('-inf'), _lse * {LOG2E}, float('inf')),
             mask=row_ok)
{_indent(self.delta, 1)}


"""

    def saved_rows(self, plan, batch_vars: dict, M: int) -> str:
        """Offsets of the query block's rows in the forward's log-sum-exp, which is laid out in
        the order the program declares its axes (``[B, S, H]`` for ``[B, S, H, D]`` tensors);
        the statistics' own buffers keep the batch axes first, then the rows."""
        axes = sorted([*plan.batch, plan.row], key=lambda a: a.uid)
        if axes[-1].uid == plan.row.uid:
            return self.rows_ptr
        terms = []
        for k, a in enumerate(axes):
            stride = math.prod(M if b.uid == plan.row.uid else self.extents[b.uid]
                               for b in axes[k + 1:])
            index = "offs_m" if a.uid == plan.row.uid else batch_vars[a.uid]
            terms.append(f"{index} * {stride}" if stride != 1 else index)
        return " + ".join(terms)

    def gradient_blocks(self) -> str:
        """A key block's dK/dV and a query block's dQ (device functions of the entries)."""
        return f"""@triton.jit
def _dkdv_block(pid, bh, {self.args}, BM: tl.constexpr, BN: tl.constexpr, RANGES: tl.constexpr):
{_indent(self.decompose(True), 1)}
    {self.head_first}
    offs_n = pid * BN + tl.arange(0, BN)
{_indent(self.features, 1)}
    col_ok = offs_n < {self.N}
    _k = {self.load(self.plan.k, self.t1["k"])}
    _v = {self.load(self.plan.v, self.t1["k"])}
    _dk = tl.zeros([BN, {self.tile_qk}], tl.float32)
    _dv = tl.zeros([BN, {self.tile_v}], tl.float32)
{_indent(self.group + _indent(self.dkdv_loop, 1), 1)}
    {self.store(self.DK, "_dk", self.t1["k"], "col_ok", self.t1["cols"])}
    {self.store(self.DV, "_dv", self.t1["k"], "col_ok", self.t1["cols"])}


@triton.jit
def _dq_block(pid, member, bh, {self.args}, BM: tl.constexpr, BN: tl.constexpr,
              GROUPED: tl.constexpr, RANGES: tl.constexpr):
    if GROUPED:   # ``bh`` counts key/value heads; ``member``: the head of the group
{_indent(self.decompose(True, "member"), 2)}
    else:
{_indent(self.decompose(False), 2)}
{_indent(self.rows_start, 1)}
    _q = {self.load(self.plan.q, self.t2['q'])}
    _do = {self.load(self.DO, self.t2["q"])}
{_indent(self.row_stats, 1)}
    _dq = tl.zeros([BM, {self.tile_qk}], tl.float32)
{_indent(self.dq_loop, 1)}
    {self.store(self.DQ, "_dq", self.t2["q"], "row_ok", self.t2["rows"])}


"""

    def entries(self) -> str:
        """The dK/dV and dQ launches, apart or merged."""
        args, nq2, nk1 = self.args, self.nq2, self.nk1
        key_programs, per_head = self.key_programs, self.per_head
        return f"""@triton.jit
def _tf_bwd_dkdv({args}, BM: tl.constexpr, BN: tl.constexpr, RANGES: tl.constexpr):
    _dkdv_block(tl.program_id(0), tl.program_id(1), {args}, BM, BN, RANGES)


@triton.jit
def _tf_bwd_dq({args}, BM: tl.constexpr, BN: tl.constexpr, RANGES: tl.constexpr):
    _dq_block(tl.program_id(0), 0, tl.program_id(1), {args}, BM, BN, False, RANGES)


@triton.jit
def _tf_bwd_dkdv_dq({args}, BM: tl.constexpr, BN: tl.constexpr, BM2: tl.constexpr,
                    BN2: tl.constexpr, RANGES: tl.constexpr):
    # every key block first (the longer programs: a group's heads each), then the query blocks,
    # which fill the SMs while the last key blocks finish; head by head (its queries and output
    # gradients shared in L2), the first key blocks and the last query blocks (a causal mask's
    # longest) first
    _t = tl.program_id(0)
    if _t < {key_programs}:
        _dkdv_block(_t % {nk1}, _t // {nk1}, {args}, BM, BN, RANGES)
    else:
        _t = _t - {key_programs}
        _dq_block({nq2 - 1} - _t % {nq2}, (_t % {per_head}) // {nq2}, _t // {per_head}, {args},
                  BM2, BN2, True, RANGES)
"""

    def source(self) -> str:
        return with_called_helpers(self.statistics_kernels() + self.gradient_blocks() +
                                   self.entries())


def merged(knobs, plan) -> bool:
    """Whether dK/dV and dQ run as one launch (``knobs.merged``; by default where the heads are
    not grouped)."""
    return plan.members == 1 if knobs.merged is None else bool(knobs.merged)


class AttentionBackwardKernels:
    """The kernels of a plan, launched on PyTorch tensors (a masked plan's block lists from its
    ``block_lists``)."""

    def __init__(self, plan, knobs):
        self.plan, self.knobs = plan, knobs
        self.source = backward_source(plan, knobs)
        self.kernels: dict = {}   # entry -> its JitOnce

    def _launch(self, entry: str, grid: tuple, args: list, constexprs: dict) -> None:
        """One kernel of the backward: through Triton's JIT the first time per specialisation,
        straight to its launcher after (autograd calls the backward with arguments it does not
        bind once per signature, as a forward's fast call does)."""
        launch = self.kernels.get(entry)
        if launch is None:
            launch = self.kernels[entry] = JitOnce(load_kernel(self.source, entry),
                                                   self._options)
        launch(grid, args, constexprs)

    def launches(self, saved_lse: bool) -> list[tuple[str, tuple, dict]]:
        """``(entry, (grid over the blocks, grid over batch × heads), block sizes)`` in launch
        order: the statistics (recomputed, or from the forward's ``saved_lse``), then dK/dV and
        dQ (one launch with ``knobs.merged``)."""
        plan, k = self.plan, self.knobs
        batch = math.prod(plan.extent(a) for a in plan.batch)
        M, N = plan.extent(plan.row), plan.extent(plan.col)
        nq2, nk1 = math.ceil(M / k.block_m2), math.ceil(N / k.block_n1)
        tiles2, tiles1 = {"BM": k.block_m2, "BN": k.block_n2}, {"BM": k.block_m1, "BN": k.block_n1}
        made = [("_tf_bwd_delta" if saved_lse else "_tf_bwd_stats", (nq2, batch), tiles2)]
        if merged(k, plan):
            made.append(("_tf_bwd_dkdv_dq",
                         ((nk1 + plan.members * nq2) * batch // plan.members, 1),
                         {**tiles1, "BM2": k.block_m2, "BN2": k.block_n2}))
        else:
            made += [("_tf_bwd_dkdv", (nk1, batch // plan.members), tiles1),
                     ("_tf_bwd_dq", (nq2, batch), tiles2)]
        return made

    def __call__(self, tensors: dict, scalars: dict, out, d_out, lse=None):
        """``(dq, dk, dv)`` for the forward's ``tensors`` (by parameter name) and ``scalars``,
        its output ``out``, the incoming gradient ``d_out`` and, where the forward saved it, each
        row's log-sum-exp of the scores (natural log, float32, the batch axes flattened × rows;
        −inf for a row with no kept key; with sinks, the sink's term in it); with sinks, the
        sink's gradient after them."""
        args, ranges = self._arguments(tensors, scalars, out, d_out, lse, gradients=True)
        first, *rest = self.launches(lse is not None)
        self._statistics(first, args, ranges, tensors, lse)
        for entry, grid, blocks in rest:
            self._launch(entry, grid, args, {**blocks, "RANGES": ranges})
        grads = tuple(args[_AT[n]] for n in ("DQ", "DK", "DV"))
        if self.plan.q_unread:   # each program's term of dQ: summed over the axes q lacks
            dq = grads[0].sum(tuple(range(len(self.plan.q_unread))))
            grads = (dq.to(args[0].dtype), *grads[1:])
        if self.plan.sink is None:
            return grads
        return (*grads, self.plan.sink_gradient(tensors, args[_AT["LSE"]], args[_AT["DELTA"]]))

    def row_statistics(self, tensors: dict, scalars: dict, out, d_out, lse=None):
        """``(LSE₂, Δ)`` per query row (float32, ``[batch, M]``; with sinks, the sink's term in
        LSE₂): the statistics kernel alone, for a backward whose gradients another kernel
        computes (the Hopper backward; no gradient buffers are made)."""
        args, ranges = self._arguments(tensors, scalars, out, d_out, lse, gradients=False)
        self._statistics(self.launches(lse is not None)[0], args, ranges, tensors, lse)
        return args[_AT["LSE"]], args[_AT["DELTA"]]

    def _statistics(self, launch, args: list, ranges: int, tensors: dict, lse) -> None:
        """The statistics kernel; where it recomputed the log-sum-exps of a program with sinks
        (no saved one), the sink's term added to them."""
        entry, grid, blocks = launch
        self._launch(entry, grid, args, {**blocks, "RANGES": ranges})
        if self.plan.sink is not None and lse is None:
            self.plan.sink_into_logsumexp(args[_AT["LSE"]], tensors)

    @property
    def _options(self) -> dict:
        return {} if interpreting() else {"num_warps": self.knobs.num_warps,
                                          "num_stages": self.knobs.num_stages}

    def _arguments(self, tensors: dict, scalars: dict, out, d_out, lse, gradients: bool):
        """The kernels' arguments and the ``RANGES`` bits; the gradients' buffers made where
        ``gradients`` (else the statistics' stand in: the statistics kernels do not write
        them)."""
        import torch

        plan, knobs = self.plan, self.knobs
        q, k, v = (tensors[x.param.name] for x in (plan.q, plan.k, plan.v))
        if gradients or lse is None:   # (Δ from a saved log-sum-exp reads neither: no copies)
            q, k, v = (t.contiguous() for t in (q, k, v))
        batch = math.prod(plan.extent(a) for a in plan.batch)
        M = plan.extent(plan.row)
        lse2 = torch.empty(batch, M, device=q.device, dtype=torch.float32)
        delta = torch.empty_like(lse2)
        dq = torch.empty(dq_shape(plan, q.shape), device=q.device, dtype=torch.float32) \
            if plan.q_unread else torch.empty_like(q)
        grads = (dq, torch.empty_like(k), torch.empty_like(v)) if gradients else (lse2,) * 3
        ranges = 0
        if plan.mask is not None:
            lists = []
            for transposed, counts in ((False, ("PN", "FN")), (True, ("TPN", "TFN"))):
                made, consecutive = plan.block_lists(knobs, tensors, scalars, transposed)
                lists += made
                ranges |= sum(RANGE_BITS[c] for c, yes in zip(counts, consecutive) if yes)
        else:
            lists = [lse2] * len(LISTS)   # not read
        others = [tensors[p.name].contiguous() for p in plan.program.tensor_params
                  if p.name not in (plan.q.param.name, plan.k.param.name, plan.v.param.name)]
        values = [scalars[p.name] for p in plan.program.scalar_params]
        saved = lse.reshape(batch, M).contiguous() if lse is not None else lse2   # not read
        # O and dO in q's dtype, as the kernels read them (an output of f32, a bias table's
        # scores: its dO went into a bf16 tl.dot with v — refused by Triton)
        args = [q, k, v, out.to(q.dtype).contiguous(), d_out.to(q.dtype).contiguous(), saved,
                lse2, delta, *grads, *lists, *others, *values]
        return args, ranges

    def compiled(self, target, saved_lse: bool = True, ranges: int = 0) -> list:
        """The kernels compiled for ``target`` without launching them (no GPU needed): Triton's
        compiled objects (``.asm["ptx"]``, ``.metadata.shared``), in launch order; ``ranges``:
        which block lists are visited as ranges (``RANGE_BITS``)."""
        plan = self.plan
        storage = "*" + TL_SIGNATURE[plan.q.param.dtype]
        names = [plan.q.param.name, plan.k.param.name, plan.v.param.name, *BUFFERS]
        sig = {n: ("*fp32" if n in FLOAT_BUFFERS or n == "DQ" and plan.q_unread else storage)
               for n in names}
        sig.update({n: "*i32" for n in LISTS})
        for p in plan.program.tensor_params:
            sig.setdefault(p.name, "*" + TL_SIGNATURE[p.dtype])
        for p in plan.program.scalar_params:
            sig[p.name] = TL_SIGNATURE[p.dtype]
        k = self.knobs
        return [compile_for(load_kernel(self.source, entry), sig, {**blocks, "RANGES": ranges},
                            target, k.num_warps, k.num_stages)
                for entry, _, blocks in self.launches(saved_lse)]
