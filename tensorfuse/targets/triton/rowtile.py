"""A fused chain as one Triton kernel: a tile of rows swept over the fused axis in blocks.

This is the GPU code generation behind the attention and row-reduction templates (DESIGN §4b: a
tile-level lowering to Triton, whose compiler does the tensor-core and memory-pipeline work — wgmma
and TMA on Hopper, MFMA on AMD). The roles of the axes come from the planned chain:

- the chain's common axes: all but the last run over the grid's second dimension (``batch``); the
  last is the ``row`` axis, tiled by ``BLOCK_M``;
- the fused axis ``j`` is swept in blocks of ``BLOCK_N`` (the rolling update's chunks);
- one ``feature`` axis (the head dimension) is held whole in ``BLOCK_K``: reductions over it that
  multiply a row tile by a column tile become ``tl.dot`` (q·kᵀ), and members that sum a row×column
  tile times a column×feature tile become ``tl.dot`` too (p·v).

Running states live in registers; the corrections and values are the schemes' expressions. When the
chain's elements are masked by one condition (``where(cond, s, -inf)``), blocks where it is false
everywhere are skipped and blocks where it is true everywhere skip evaluating it, from block lists
computed per call (:mod:`.blockmask`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...algebra import Chain, inline_elementwise
from ...algebra.exprs import factors, nodes, substitute
from ...algebra.schemes import EXTRAPOLATION
from ...dsl import dtypes as dt
from ...dsl.evaluate import evaluate_plain
from ...dsl.expr import Axis, Binary, Cast, Const, Expr, Load, Ref, Symbol, Where
from ...dsl.program import Compute, Program
from ...errors import TargetError
from .expr import HELPERS, TL_DTYPES, TileContext, literal, to_triton

REDUCE = {"sum": "tl.sum", "max": "tl.max", "min": "tl.min"}
MAX_FEATURE = 256  # head dims up to 256 fit a tile in registers


@dataclass
class Contraction:
    """``Σ_k left(row, k) · right(col, k)`` (or with ``col`` the output feature axis)."""

    left: Expr
    right: Expr
    dot_dtype: str


@dataclass
class StatePlan:
    member: Compute
    k: int
    body: Expr                   # per-element value (row×col tile), deps as '{d}.ref' symbols
    monoid: object
    dtype: str
    contraction: Contraction | None = None   # for states over the feature axis


@dataclass
class RowTilePlan:
    program: Program
    chain: Chain
    sizes: dict
    batch: list[Axis]
    row: Axis
    col: Axis
    feature: Axis | None
    feature_extent: int
    locals: dict = field(default_factory=dict)        # compute name -> Contraction
    states: list[StatePlan] = field(default_factory=list)
    mask: Expr | None = None
    outputs: list = field(default_factory=list)       # (compute, expr, kind)
    fold: tuple | None = None   # (batch axis h, group size G): G values of h share a row tile

    @property
    def rows(self) -> int:
        rows = self.sizes_of(self.row)
        return rows * self.fold[1] if self.fold else rows

    @property
    def grid_batch(self) -> list[tuple[str, int]]:
        """(name, extent) of the axes over the grid's second dimension (a folded axis by group)."""
        out = []
        for a in self.batch:
            if self.fold and a.uid == self.fold[0].uid:
                out.append((f"{a.name}g", self.sizes_of(a) // self.fold[1]))
            else:
                out.append((a.name, self.sizes_of(a)))
        return out

    @property
    def cols(self) -> int:
        return self.sizes_of(self.col)

    def sizes_of(self, axis: Axis) -> int:
        return axis.extent if isinstance(axis.extent, int) else self.sizes[axis.extent]


def _product(factors: list[Expr]) -> Expr:
    out = factors[0]
    for f in factors[1:]:
        out = Binary("mul", out, f, dt.promote(out.dtype, f.dtype), out.loc)
    return out


def _split_product(e: Expr, left_axes: set, right_axes: set, shared: set) -> tuple | None:
    """Split a product into a left part (axes ⊆ left_axes) and a right part (⊆ right_axes)."""
    left, right = [], []
    for f in factors(e):
        axes = {a.uid for a in f.axes}
        if axes <= shared:
            left.append(f)
        elif axes <= left_axes:
            left.append(f)
        elif axes <= right_axes:
            right.append(f)
        else:
            return None
    if not left or not right:
        return None
    return _product(left), _product(right)


def _storage_of(e: Expr) -> str:
    loads = [n for n in nodes(e) if isinstance(n, Load) and dt.is_float(n.param.dtype)]
    kinds = {n.param.dtype for n in loads}
    return kinds.pop() if len(kinds) == 1 and kinds <= {"bf16", "f16"} else "bf16"


def plan_rowtile(program: Program, chain: Chain, sizes: dict) -> RowTilePlan:
    """Check that the chain fits the template and assign the axes their roles."""
    if chain.axis is None or len(chain.common_axes) < 1:
        raise TargetError("the row-tile template needs at least one axis shared by the chain")
    *batch, row = chain.common_axes
    col = chain.axis
    common = {a.uid for a in chain.common_axes}
    members = {m.name for m in chain.members}
    features: dict[int, Axis] = {}
    for m in chain.members:
        for a in m.axes:
            if a.uid not in common:
                features[a.uid] = a
    for x in chain.local_reductions:
        for a in x.over:
            features[a.uid] = a
    extents = {(a.extent if isinstance(a.extent, int) else sizes[a.extent]) for a in features.values()}
    if len(extents) > 1:
        raise TargetError(f"the row-tile template holds one feature size, got {sorted(extents)}")
    feature_extent = extents.pop() if extents else 1
    if feature_extent > MAX_FEATURE:
        raise TargetError(f"the feature axis has {feature_extent} elements; the row-tile template "
                          f"holds it whole in registers, up to {MAX_FEATURE} (a GEMM chain this "
                          "wide needs K-blocking or a cluster of CTAs)")
    plan = RowTilePlan(program, chain, sizes, list(batch), row, col, None, feature_extent)
    batch_ids = {a.uid for a in batch}
    for x in chain.local_reductions:
        if x.monoid.name != "sum" or len(x.over) != 1 or any(a.uid not in common | {col.uid}
                                                            for a in x.axes):
            raise TargetError(f"{x.name}: only sums over the feature axis of a row value times a "
                              "column value become tensor-core products")
        k = x.over[0]
        body = inline_elementwise(x.bodies[0])
        parts = _split_product(body, common | {k.uid}, batch_ids | {col.uid, k.uid}, batch_ids)
        if parts is None:
            raise TargetError(f"{x.name} is not a product of a row value and a column value")
        plan.locals[x.name] = Contraction(parts[0], parts[1], _storage_of(body))
    for m in chain.members:
        scheme = chain.schemes[m.name]
        extra = [a for a in m.axes if a.uid not in common]
        if scheme.kind not in ("independent", "linear", "affine") or m.arity != 1:
            raise TargetError(f"{m.name}: {scheme.kind} schemes are not in the row-tile template")
        for k, st in enumerate(scheme.states):
            body = _deps_as_symbols(st.body, members)
            if not extra:
                if st.monoid.name not in REDUCE:
                    raise TargetError(f"{m.name}: {st.monoid.name} is not in the row-tile template")
                plan.states.append(StatePlan(m, k, body, st.monoid, st.dtype))
                continue
            if st.monoid.name != "sum" or len(extra) != 1:
                raise TargetError(f"{m.name}: a state over {extra[0].name} must be a sum")
            e = extra[0]
            parts = _split_product(body, common | {col.uid}, batch_ids | {col.uid, e.uid}, batch_ids)
            if parts is None:
                raise TargetError(f"{m.name}: not a product of a row×{col.name} value and a "
                                  f"{col.name}×{e.name} value")
            plan.states.append(StatePlan(m, k, body, st.monoid, st.dtype,
                                         Contraction(parts[0], parts[1], _storage_of(parts[1]))))
    plan.fold = _row_fold(plan)
    if plan.fold is not None:
        plan.locals = {k: Contraction(c.left, _grouped(c.right, plan.fold), c.dot_dtype)
                       for k, c in plan.locals.items()}
        for sp in plan.states:
            if sp.contraction is not None:
                sp.contraction = Contraction(sp.contraction.left,
                                             _grouped(sp.contraction.right, plan.fold),
                                             sp.contraction.dot_dtype)
    plan.mask = None if plan.fold else _single_mask(chain, members)
    plan.outputs = _outputs(program, chain, common, col)
    return plan


MAX_FOLDED_ROWS = 64


def _group_of(e: Expr, axis: Axis, sizes: dict) -> set:
    """The divisors ``g`` of every use of ``axis`` in ``e`` as ``axis // g`` (0 for a bare use)."""
    found = set()

    def visit(n: Expr):
        if isinstance(n, Binary) and n.op == "floordiv" and isinstance(n.a, Axis) and \
                n.a.uid == axis.uid:
            resolved = substitute(n.b, lambda x: Const(sizes[x.name], "i32")
                                  if x.__class__.__name__ == "DimSize" else None)
            try:
                found.add(int(evaluate_plain(resolved, {})))
            except Exception:  # noqa: BLE001 - not a constant: no fold
                found.add(0)
            return
        if isinstance(n, Axis) and n.uid == axis.uid:
            found.add(0)
            return
        for c in n.children():
            visit(c)

    visit(e)
    return found


def _row_fold(plan: RowTilePlan):
    """Few query rows and a head axis that the column operands (keys, values) read only as
    ``h // G`` (grouped-query attention): put the G heads of a group in one row tile, so each
    program reads its keys and values once for the whole group instead of once per head."""
    if plan.sizes_of(plan.row) * 2 > MAX_FOLDED_ROWS:
        return None
    col_side = [c.right for c in plan.locals.values()] + [sp.contraction.right for sp in plan.states
                                                          if sp.contraction is not None]
    if not col_side:
        return None
    for a in plan.batch:
        groups = set().union(*(_group_of(e, a, plan.sizes) for e in col_side))
        if len(groups) == 1 and (g := groups.pop()) > 1 and plan.sizes_of(a) % g == 0 and \
                plan.sizes_of(plan.row) * g <= MAX_FOLDED_ROWS:
            return a, g
    return None


def _grouped(e: Expr, fold) -> Expr:
    """Column-side operand with ``h // G`` replaced by the group index (a program constant)."""
    axis, _ = fold
    return substitute(e, lambda n: Symbol(f"__group_{axis.name}", "i32")
                      if isinstance(n, Binary) and n.op == "floordiv" and isinstance(n.a, Axis)
                      and n.a.uid == axis.uid else None)


def _deps_as_symbols(e: Expr, members: set) -> Expr:
    return substitute(e, lambda n: Symbol(f"{n.compute.name}.ref", n.dtype)
                      if isinstance(n, Ref) and n.compute.name in members else None)


def _single_mask(chain: Chain, members: set) -> Expr | None:
    """The condition masking the chain's elements, when there is exactly one and masked elements
    contribute nothing to any state (checked numerically on random values)."""
    conds = {}
    for m in chain.members:
        for b in chain.bodies[m.name]:
            for n in nodes(b):
                if isinstance(n, Where) and not any(isinstance(x, Ref) for x in nodes(n.cond)) \
                        and not any(isinstance(x, Load) and dt.is_float(x.param.dtype)
                                    for x in nodes(n.cond)):
                    conds[n.cond.key()] = n.cond
    if len(conds) != 1:
        return None
    cond = next(iter(conds.values()))
    rng = np.random.default_rng(0)
    for m in chain.members:
        scheme = chain.schemes[m.name]
        for st in scheme.states:
            masked = substitute(st.body, lambda n: Const(False, "bool") if n.key() == cond.key()
                                else None)
            identity = st.monoid.identity_value(0, "f64")
            for _ in range(16):
                leaves: dict = {}

                def leaf(n):
                    if isinstance(n, (Load, Ref, Axis, Symbol)) or n.__class__.__name__ in (
                            "Scalar", "DimSize"):
                        name = f"l{len(leaves)}"
                        leaves[name] = rng.normal() * 3 if dt.is_float(n.dtype) else \
                            int(rng.integers(0, 5))
                        return Symbol(name, n.dtype)
                    return None

                value = float(evaluate_plain(substitute(masked, leaf), leaves))
                if not (value == identity or (st.monoid.name == "max" and value <= identity) or
                        (st.monoid.name == "min" and value >= identity)):
                    return None
    return cond


def _outputs(program: Program, chain: Chain, common: set, col: Axis) -> list:
    members = {m.name for m in chain.members}
    out = []
    for c in program.outputs:
        body = c.bodies[0] if not c.is_reduction else None
        if c.name in members:
            expr: Expr = Ref(c, 0, c.loc)
        elif body is not None:
            expr = inline_elementwise(body)
        else:
            raise TargetError(f"output {c.name} is a reduction outside the chain")
        for n in nodes(expr):
            if isinstance(n, Ref) and n.compute.name not in members:
                raise TargetError(f"output {c.name} reads {n.compute.name}, outside the chain")
        axes = {a.uid for a in c.axes}
        kind = "row" if axes <= common else ("col" if axes <= common | {col.uid} else "feature")
        out.append((c, expr, kind))
    return out


# -- source --------------------------------------------------------------------------------------

@dataclass
class Knobs:
    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2
    splits: int = 1  # >1: the split update (parts of the axis in parallel, then a merge kernel)


class _Writer:
    def __init__(self):
        self.lines: list[str] = []
        self.indent = 1

    def __call__(self, text: str = "") -> None:
        self.lines.append("    " * self.indent + text if text else "")

    def block(self):
        writer = self

        class _Indent:
            def __enter__(self):
                writer.indent += 1

            def __exit__(self, *exc):
                writer.indent -= 1

        return _Indent()


def kernel_source(plan: RowTilePlan, knobs: Knobs, name: str,
                  interpreter: bool = False) -> tuple[str, list[str]] | tuple[str, list, list]:
    """Python source of a Triton kernel for ``plan`` and the names of its arguments, in order.
    ``interpreter``: source for Triton's CPU interpreter, which has no bf16 tensor-core operands
    (they become f32) and no loop bounds loaded from memory (block lists are walked to their
    static length, skipping past the count)."""
    dot_type = (lambda con: "f32") if interpreter else (lambda con: con.dot_dtype)  # noqa: E731
    prog = plan.program
    sizes = plan.sizes
    w = _Writer()
    tensors = [p.name for p in prog.tensor_params]
    scalars = [p.name for p in prog.scalar_params]
    outs = [f"out_{c.name}" for c, _, _ in plan.outputs]
    mask_args = ["bm_partial_num", "bm_partial_idx", "bm_full_num", "bm_full_idx"] if plan.mask is \
        not None else []
    splits = knobs.splits
    M, N = plan.rows, plan.cols
    members = plan.chain.members
    needed = [m.name for m in members if any(m.name in s.deps for s in plan.chain.schemes.values())]
    parts = [f"part_{sp.member.name}_{sp.k}" for sp in plan.states] + [f"part_ref_{d}"
                                                                      for d in needed]
    if splits > 1:
        mask_args = []
        args = tensors + scalars + parts
    else:
        args = tensors + scalars + outs + mask_args
    bk = max(16, 1 << max(0, (plan.feature_extent - 1).bit_length()))
    wide = _largest(prog, sizes) >= 2**31

    ctx_base = TileContext(axes={}, sizes=sizes, interpreter=interpreter)

    row_index = "offs_m[:, None]"

    def prologue():
        nonlocal row_index
        w("pid_m = tl.program_id(0)")
        w("pid_b = tl.program_id(1)" + (".to(tl.int64)" if wide else ""))
        stride = 1
        for (gname, extent), a in reversed(list(zip(plan.grid_batch, plan.batch))):
            w(f"ax_{gname} = (pid_b // {stride}) % {extent}")
            ctx_base.axes[a.uid] = f"ax_{gname}"
            stride *= extent
        w("offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
        w("offs_k = tl.arange(0, BLOCK_K)")
        if plan.fold is not None:  # rows are (head in group, query): h = group·G + r // M
            a, g = plan.fold
            per = plan.sizes_of(plan.row)
            ctx_base.axes[a.uid] = f"(ax_{a.name}g * {g} + offs_m[:, None] // {per})"
            ctx_base.symbols[f"__group_{a.name}"] = f"ax_{a.name}g"
            row_index = f"(offs_m[:, None] % {per})"

    prologue()
    row_ok = "(offs_m[:, None] < %d)" % M
    feat_ok = "(offs_k[None, :] < %d)" % plan.feature_extent
    col_ok = "(offs_n[None, :] < %d)" % N
    col_ok_t = "(offs_n[:, None] < %d)" % N
    ragged_rows = M % knobs.block_m != 0
    ragged_cols = N % knobs.block_n != 0
    ragged_feature = plan.feature_extent != bk

    def valid(pairs):
        return {uid: text for uid, text, ragged in pairs if ragged}

    def ctx_rc():
        """Row × column tile (the feature axis reduced away)."""
        return ctx_base.child(axes={plan.row.uid: row_index, plan.col.uid: "offs_n[None, :]"},
                              valid=valid([(plan.row.uid, row_ok, ragged_rows),
                                           (plan.col.uid, col_ok, ragged_cols)]))

    def ctx_rf(feature: Axis):
        return ctx_base.child(axes={plan.row.uid: row_index, feature.uid: "offs_k[None, :]"},
                              valid=valid([(plan.row.uid, row_ok, ragged_rows),
                                           (feature.uid, feat_ok, ragged_feature)]))

    def ctx_cf(feature: Axis):
        return ctx_base.child(axes={plan.col.uid: "offs_n[:, None]", feature.uid: "offs_k[None, :]"},
                              valid=valid([(plan.col.uid, col_ok_t, ragged_cols),
                                           (feature.uid, feat_ok, ragged_feature)]))

    def ctx_r():
        return ctx_base.child(axes={plan.row.uid: row_index},
                              valid=valid([(plan.row.uid, row_ok, ragged_rows)]))

    # hoisted row operands of the local contractions (q)
    local_axes = {}
    for xname, con in plan.locals.items():
        x = prog.compute(xname)
        feat = x.over[0]
        local_axes[xname] = feat
        w(f"lhs_{xname} = {_operand(con.left, ctx_rf(feat), dot_type(con))}")
    # states
    for sp in plan.states:
        shape = "[BLOCK_M, BLOCK_K]" if sp.contraction is not None else "[BLOCK_M, 1]"
        ident = literal(sp.monoid.identity_value(0, sp.dtype), sp.dtype)
        w(f"st_{sp.member.name}_{sp.k} = tl.full({shape}, {ident}, tl.float32)")
    w("seen = tl.full([], 0, tl.int32)")
    initial: dict = {}
    for d in needed:
        initial[d] = _initial_reference(plan, d, initial, N)
        w(f"ref_{d} = tl.full([BLOCK_M, 1], {literal(initial[d], 'f32')}, tl.float32)")

    def chunk_body(with_mask: bool):
        w("offs_n = start_n + tl.arange(0, BLOCK_N)")
        w(f"col_ok = {col_ok}")
        memo: dict = {}
        rc_refs = {}
        for xname, con in plan.locals.items():
            feat = local_axes[xname]
            w(f"rhs_{xname} = {_operand(con.right, ctx_cf(feat), dot_type(con))}")
            w(f"t_{xname} = tl.dot(lhs_{xname}, tl.trans(rhs_{xname}))")
            rc_refs[xname] = f"t_{xname}"
        if splits > 1:  # positions of this program's part covered so far (the last part is short)
            w(f"seen_next = tl.minimum(seen + BLOCK_N, tl.minimum(lo + {per_split}, {N}) - lo)")
        elif N % knobs.block_n:
            w(f"seen_next = tl.minimum(seen + BLOCK_N, {N})")
        else:
            w("seen_next = seen + BLOCK_N")
        symbols: dict = {}
        for m in members:
            scheme = plan.chain.schemes[m.name]
            tile = ctx_rc().child(refs=rc_refs, symbols=symbols, emit=w, memo=memo)
            if not with_mask and plan.mask is not None:
                mask_key = plan.mask.key()
                strip = lambda e: substitute(e, lambda n: n.a  # noqa: E731
                                             if isinstance(n, Where) and n.cond.key() == mask_key
                                             else None)
            else:
                strip = lambda e: e  # noqa: E731
            chunk_vars = []
            for sp in [s for s in plan.states if s.member is m]:
                ident = literal(sp.monoid.identity_value(0, sp.dtype), sp.dtype)
                if sp.contraction is None:
                    body = to_triton(strip(sp.body), tile)
                    constant_along = plan.col.uid not in {a.uid for a in sp.body.axes}
                    if constant_along and sp.monoid.name == "sum":  # e.g. a count: 1.0 × columns
                        w(f"c_{m.name}_{sp.k} = ({body}) * (seen_next - seen).to(tl.float32)")
                        chunk_vars.append(sp)
                        continue
                    if constant_along:
                        body = f"(({body}) + tl.zeros([BLOCK_M, BLOCK_N], tl.float32))"
                    if ragged_cols:
                        body = f"tl.where(col_ok, {body}, {ident})"
                    w(f"c_{m.name}_{sp.k} = {REDUCE[sp.monoid.name]}({body}, axis=1, keep_dims=True)")
                else:
                    con = sp.contraction
                    feat = next(a for a in m.axes if a.uid not in {x.uid for x in
                                                                     plan.chain.common_axes})
                    p = to_triton(strip(con.left), tile)
                    if ragged_cols:
                        p = f"tl.where(col_ok, {p}, 0.0)"
                    w(f"p_{m.name}_{sp.k} = ({p}).to({TL_DTYPES[dot_type(con)]})")
                    w(f"v_{m.name}_{sp.k} = {_operand(con.right, ctx_cf(feat), dot_type(con))}")
                chunk_vars.append(sp)
            # correct and combine
            sym = {f"{m.name}#{sp.k}": f"st_{m.name}_{sp.k}" for sp in chunk_vars}
            for d in scheme.deps:
                sym[f"{d}.old"] = f"ref_{d}"
                sym[f"{d}.new"] = f"newref_{d}"
            corr = ctx_r().child(symbols=sym)
            new_values = []
            for sp in chunk_vars:
                corrected = to_triton(scheme.correct[sp.k], corr)
                if sp.contraction is not None:  # accumulate on the tensor cores: acc = p·v + acc
                    text = f"tl.dot(p_{m.name}_{sp.k}, v_{m.name}_{sp.k}, {corrected})"
                else:
                    combined = sp.monoid.combine_exprs([Symbol("__a", sp.dtype)],
                                                       [Symbol("__b", sp.dtype)])[0]
                    text = to_triton(combined, TileContext(axes={}, symbols={
                        "__a": f"({corrected})", "__b": f"c_{m.name}_{sp.k}"}, sizes=sizes))
                new_values.append((sp, text))
            for sp, text in new_values:
                w(f"nst_{m.name}_{sp.k} = {text}")
            for sp, _ in new_values:
                w(f"st_{m.name}_{sp.k} = nst_{m.name}_{sp.k}")
            if m.name in needed:  # its reference: the value at the references, extrapolated
                at_refs = {**sym, **{f"{d}.new": f"newref_{d}" for d in scheme.deps},
                           EXTRAPOLATION.name: f"({N} / tl.maximum(seen_next, 1))"}
                estimate = to_triton(scheme.reference(), ctx_r().child(symbols=at_refs))
                w(f"est_{m.name} = {estimate}")
                w(f"newref_{m.name} = {_without_sentinel(plan, m.name, f'est_{m.name}')}")
                symbols[f"{m.name}.ref"] = f"newref_{m.name}"
        for d in needed:
            w(f"ref_{d} = newref_{d}")
        w("seen = seen_next")
        return memo

    single = plan.mask is None and N <= knobs.block_n and splits == 1
    chunk_memo: dict = {}
    rows_pad = math.ceil(M / knobs.block_m) * knobs.block_m
    per_split = math.ceil(math.ceil(N / knobs.block_n) / splits) * knobs.block_n

    def part_at(sp_or_ref, split: str) -> str:
        """Address of this program's rows of a split's saved state in its buffer."""
        wide_state = not isinstance(sp_or_ref, str) and sp_or_ref.contraction is not None
        base = f"((pid_b * {splits} + {split}) * {rows_pad} + offs_m[:, None])"
        name_ = sp_or_ref if isinstance(sp_or_ref, str) else \
            f"part_{sp_or_ref.member.name}_{sp_or_ref.k}"
        return f"{name_} + {base} * BLOCK_K + offs_k[None, :]" if wide_state else f"{name_} + {base}"

    def emit_finals(states: dict, refs: dict, values: dict, correct: bool) -> dict:
        """Each member's final value from ``states`` kept relative to ``refs`` (corrected to the
        true ``values`` of its dependencies first, unless ``correct`` is false)."""
        finals = {}
        for m in members:
            scheme = plan.chain.schemes[m.name]
            sym = {f"{m.name}#{sp.k}": states[(m.name, sp.k)] for sp in plan.states if sp.member is m}
            if not correct:  # the references are the true values: no correction is needed
                sym.update({f"{d}.new": refs[d] for d in scheme.deps})
                w(f"fin_{m.name} = {to_triton(scheme.value[0], ctx_r().child(symbols=sym))}")
            else:
                sym.update({f"{d}.old": refs[d] for d in scheme.deps})
                sym.update({f"{d}.new": values.get(d, f"fin_{d}") for d in scheme.deps})
                value = to_triton(scheme.true_value(0, settled=True), ctx_r().child(symbols=sym))
                w(f"fin_{m.name} = {value}")
            finals[m.name] = f"fin_{m.name}"
        return finals

    def emit_outputs(finals: dict) -> None:
        for (c, expr, kind), out in zip(plan.outputs, outs):
            if kind == "row":
                ctx = ctx_r().child(refs=finals)
            elif kind == "feature":
                feat = next(a for a in c.axes if a.uid not in {x.uid for x in plan.chain.common_axes})
                ctx = ctx_rf(feat).child(refs=finals)
            else:
                ctx = ctx_rc().child(refs=finals, emit=w if single else None, memo=chunk_memo)
            offsets = _store_offsets(c, ctx, sizes)
            valid_ = sorted({ctx.valid[a.uid] for a in c.axes if a.uid in ctx.valid})
            store = (f"tl.store({out} + ({offsets}), ({to_triton(expr, ctx)})"
                     f".to({TL_DTYPES[c.dtypes[0]]}), mask={' & '.join(valid_) or 'None'})")
            if kind == "col" and not single:
                w(f"for start_n in range(0, {N}, BLOCK_N):")
                with w.block():
                    w("offs_n = start_n + tl.arange(0, BLOCK_N)")
                    w(store)
            else:
                w(store)

    def emit_merge() -> None:
        """Fold the splits' saved states, each corrected from its split's references to the final
        ones (the split update's merge, in registers), then write the outputs."""
        finals = {}
        for m in members:
            scheme = plan.chain.schemes[m.name]
            mine = [sp for sp in plan.states if sp.member is m]
            for sp in mine:
                shape = "[BLOCK_M, BLOCK_K]" if sp.contraction is not None else "[BLOCK_M, 1]"
                ident = literal(sp.monoid.identity_value(0, sp.dtype), sp.dtype)
                w(f"acc_{m.name}_{sp.k} = tl.full({shape}, {ident}, tl.float32)")
            w(f"for s in tl.static_range({splits}):")
            with w.block():
                sym = {}
                for sp in mine:
                    w(f"sv_{m.name}_{sp.k} = tl.load({part_at(sp, 's')})")
                    sym[f"{m.name}#{sp.k}"] = f"sv_{m.name}_{sp.k}"
                for d in scheme.deps:
                    w(f"sref_{d} = tl.load({part_at(f'part_ref_{d}', 's')})")
                    sym[f"{d}.old"], sym[f"{d}.new"] = f"sref_{d}", f"finref_{d}"
                for sp in mine:
                    corrected = to_triton(scheme.corrections(settled=True)[sp.k],
                                          ctx_r().child(symbols=sym))
                    combined = sp.monoid.combine_exprs([Symbol("__a", sp.dtype)],
                                                       [Symbol("__b", sp.dtype)])[0]
                    w(f"acc_{m.name}_{sp.k} = " + to_triton(combined, TileContext(
                        axes={}, symbols={"__a": f"acc_{m.name}_{sp.k}", "__b": f"({corrected})"},
                        sizes=sizes)))
            acc = {f"{m.name}#{sp.k}": f"acc_{m.name}_{sp.k}" for sp in mine}
            acc.update({f"{d}.old": f"finref_{d}" for d in scheme.deps})
            acc.update({f"{d}.new": f"fin_{d}" for d in scheme.deps})
            value = to_triton(scheme.true_value(0, settled=True), ctx_r().child(symbols=acc))
            w(f"fin_{m.name} = {value}")
            finals[m.name] = f"fin_{m.name}"
            if m.name in needed:
                w(f"finref_{m.name} = {_without_sentinel(plan, m.name, f'fin_{m.name}')}")
        emit_outputs(finals)

    states = {(sp.member.name, sp.k): f"st_{sp.member.name}_{sp.k}" for sp in plan.states}
    if splits > 1:  # this program's part of the axis; its states go to memory for the merge
        w("pid_s = tl.program_id(2)")
        w(f"lo = pid_s * {per_split}")
        if interpreter:  # no loop bounds computed from program ids in the interpreter
            w(f"for blk in range(0, {per_split // knobs.block_n}):")
            with w.block():
                w("start_n = lo + blk * BLOCK_N")
                w(f"if start_n < {N}:")
                with w.block():
                    chunk_body(True)
        else:
            w(f"for start_n in range(lo, tl.minimum(lo + {per_split}, {N}), BLOCK_N):")
            with w.block():
                chunk_body(True)
        for sp in plan.states:
            w(f"tl.store({part_at(sp, 'pid_s')}, {states[(sp.member.name, sp.k)]})")
        for d in needed:
            w(f"tl.store({part_at(f'part_ref_{d}', 'pid_s')}, ref_{d})")
        part_lines, w.lines = w.lines, []
        prologue()
        emit_merge()
        merge_args = tensors + scalars + outs + parts
        return _assemble([(f"{name}_part", args, part_lines),
                          (f"{name}_merge", merge_args, w.lines)]), args, merge_args
    if single:  # the whole axis in one block: no loop, and outputs reuse the loaded values
        w("start_n = 0")
        chunk_memo = chunk_body(True)
    elif plan.mask is None:
        w(f"for start_n in range(0, {N}, BLOCK_N):")
        with w.block():
            chunk_body(True)
    else:
        for kind, flag in (("partial", True), ("full", False)):
            w(f"base_{kind} = pid_b * {math.ceil(M / knobs.block_m)} + pid_m")
            w(f"count_{kind} = tl.load(bm_{kind}_num + base_{kind})")
            if interpreter:
                w(f"for blk in range(0, {_blocks(plan, knobs)}):")
                w.indent += 1
                w(f"if blk < count_{kind}:")
            else:
                w(f"for blk in range(0, count_{kind}):")
            with w.block():
                w(f"start_n = tl.load(bm_{kind}_idx + base_{kind} * {_blocks(plan, knobs)} + blk)"
                  " * BLOCK_N")
                chunk_body(flag)
            if interpreter:
                w.indent -= 1
    # one block saw the whole axis: its references are the true values (sums extrapolated by
    # N / N, maxima not the identity); states kept only for corrections become dead code
    finals = emit_finals(states, {d: f"ref_{d}" for d in needed}, {}, correct=not single)
    emit_outputs(finals)
    return _assemble([(name, args, w.lines)]), args


def _assemble(functions) -> str:
    parts = ["import triton", "import triton.language as tl",
             "from triton.language.extra import libdevice", HELPERS]
    for fname, fargs, body in functions:
        parts += ["", "@triton.jit",
                  f"def {fname}(" + ", ".join(fargs) + ", BLOCK_M: tl.constexpr, "
                  "BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):"] + body
    return "\n".join(parts) + "\n"


def _without_sentinel(plan: RowTilePlan, d: str, value: str) -> str:
    """As in the TensorIR lowering: mid-sweep, a maximum (minimum, logsumexp) that has seen
    nothing real is 0."""
    m = plan.chain.schemes[d].compute
    if not m.monoid.identity_is_sentinel(m.dtypes[0]):
        return value
    return f"tl.where({value} == {literal(m.monoid.identity_value(0, m.dtypes[0]), 'f32')}, 0.0, {value})"


def _operand(e: Expr, ctx: TileContext, dot_dtype: str) -> str:
    """A tl.dot operand: a single load keeps its storage type; anything else is computed in f32
    and converted."""
    if isinstance(e, Load) and e.param.dtype == dot_dtype:
        return to_triton(e, ctx.child(keep_dtype=True))
    return f"({to_triton(e, ctx)}).to({TL_DTYPES[dot_dtype]})"


def _initial_reference(plan: RowTilePlan, d: str, initial: dict, cols: int) -> float:
    """The reference of ``d`` before anything is seen (as in the TensorIR lowering: the reference
    formula on empty states, the dependencies at their initial references; 0 for a maximum)."""
    scheme = plan.chain.schemes[d]
    env = {f"{d}#{k}": np.asarray(st.monoid.identity_value(0, st.dtype), np.float64)
           for k, st in enumerate(scheme.states)}
    env.update({f"{e}.new": np.asarray(initial[e], np.float64) for e in scheme.deps})
    env[EXTRAPOLATION.name] = np.asarray(float(cols))
    with np.errstate(all="ignore"):
        value = float(evaluate_plain(scheme.reference(), env))
    m, dtype = scheme.compute, scheme.states[0].dtype
    if m.monoid.identity_is_sentinel(dtype) and value == m.monoid.identity_value(0, dtype):
        return 0.0
    return value


def _store_offsets(c: Compute, ctx: TileContext, sizes: dict) -> str:
    dims = [a.extent if isinstance(a.extent, int) else sizes[a.extent] for a in c.axes]
    strides, acc = [], 1
    for n in reversed(dims):
        strides.append(acc)
        acc *= n
    strides.reverse()
    return " + ".join(f"{ctx.axes[a.uid]} * {s}" if s != 1 else ctx.axes[a.uid]
                      for a, s in zip(c.axes, strides))


def _largest(prog: Program, sizes: dict) -> int:
    best = 0
    for p in prog.tensor_params:
        best = max(best, int(np.prod([d if isinstance(d, int) else sizes[d] for d in p.dims])))
    for c in prog.outputs:
        best = max(best, int(np.prod([a.extent if isinstance(a.extent, int) else sizes[a.extent]
                                      for a in c.axes])))
    return best


def _blocks(plan: RowTilePlan, knobs: Knobs) -> int:
    return math.ceil(plan.cols / knobs.block_n)


def grid(plan: RowTilePlan, knobs: Knobs) -> tuple[int, int]:
    batch = int(np.prod([extent for _, extent in plan.grid_batch])) if plan.batch else 1
    return (math.ceil(plan.rows / knobs.block_m), batch)


def block_k(plan: RowTilePlan) -> int:
    return max(16, 1 << max(0, (plan.feature_extent - 1).bit_length()))
