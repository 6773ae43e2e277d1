"""The Triton emitter of the row-tile template: a plan (``schedule_templates.tile_plan``) and its
knobs become one Triton kernel — a tile of rows swept over the fused axis in blocks.

This is the GPU code generation behind the attention and row-reduction templates (DESIGN §4b: a
tile-level lowering to Triton, whose compiler does the tensor-core and memory-pipeline work — wgmma
and TMA on Hopper, MFMA on AMD). It only writes code: which axis is the row, which products go to
the tensor cores, which condition masks the blocks — all of that comes with the plan. Running
states live in registers; the corrections, values and references are the schemes' expressions.
Blocks are walked from the per-call block lists of a masked plan (partial ones evaluate the mask,
full ones skip it).
"""
from __future__ import annotations

import math

import numpy as np

from ...algebra.exprs import substitute
from ...algebra.schemes import EXTRAPOLATION
from ...dsl.evaluate import evaluate_plain
from ...dsl.expr import Axis, Expr, Load, Ref, Symbol, Where, walk
from ...dsl.program import Compute
from ..index_text import IndexText as _Index
from .expr import HELPERS, TL_DTYPES, TileContext, fresh_memo, literal, to_triton

REDUCE = {"sum": "tl.sum", "max": "tl.max", "min": "tl.min"}
MAX_FEATURE = 256  # head dims up to 256 fit a tile in registers
# issue the outputs' per-row operand loads before a whole-row block's reductions (chunk_body)
PREFETCH = True
# L2 eviction hints on a row reduction's loads (rows evict first — or last, on the first of two
# passes over them —, column operands evict last). None: where the kernel only reads its rows
# (its outputs are per row: cross-entropy, 91 -> 95 % of copy on the H100) or reads them twice
# and has no column operands (rows wider than a block: softmax over 65536 columns 68 -> 92 %).
# Measured worse, so left without: kernels that read each row once and write it (~1 %), a
# layernorm over 65536 columns (its weight and bias beside the rows: 74 -> 67 %)
# (benchmarks/rows_sweep.py, RESULTS.md session 15). True / False: always / never (measuring)
EVICTION = None
# keep a swept row's uncorrected states per lane (:func:`lanewise_states`); False: reduce every
# block across the warps, as before session 32 (measuring)
LANEWISE = True
# columns up to which a row of sums is swept twice, in blocks of 4096 with L2 hints (a row of
# 8192: 0.997-1.0004x torch.compile against 0.996-0.998x in one block; of 16384: 96 % of copy
# against 98.7 % in one block read again — RESULTS.md session 32)
SWEPT_IN_L2 = 8192


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


def kernel_source(plan, knobs, name: str,
                  interpreter: bool = False) -> tuple[str, list[str]] | tuple[str, list, list]:
    """Python source of a Triton kernel for ``plan`` (a ``tile_plan.RowTilePlan``) with ``knobs``
    (its ``Knobs``) and the names of its arguments, in order.
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
    windows = plan.key_windows
    members = plan.chain.members
    depended_on = _depended_on(plan)
    needed = [m.name for m in members if m.name in depended_on]
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
    reads_only = all(kind == "row" for _, _, kind in plan.outputs)
    # rows wider than a block: swept once for the reductions, again for the outputs
    reads_twice = not reads_only and plan.mask is None and splits == 1 and N > knobs.block_n
    # rows read twice beside column operands get no hints (a layernorm over 65536 columns lost
    # by them) but where the states are sums kept per lane and the row is short enough to stay
    # in L2 between its passes (the scaled RMSNorm over 8192: 0.9956 -> 0.9995x torch.compile)
    hinted = reads_only or reads_twice and (not _column_operands(plan) or
                                            N <= SWEPT_IN_L2 and uncorrected_states(plan))
    single = plan.mask is None and N <= knobs.block_n and splits == 1
    reload = single and knobs.reload and reloadable(plan)
    if reload or ((hinted if EVICTION is None else EVICTION) and not plan.locals and
                  not any(sp.contraction for sp in plan.states)):
        # a row reduction (no contraction): its rows stream through L2, kept there for a second
        # pass (switched to evict_first for that pass below)
        ctx_base.streaming = (frozenset({plan.row.uid} | {a.uid for a in plan.batch}),
                              plan.col.uid, "evict_last" if reads_twice or reload else
                              "evict_first")

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
        if plan.row_tiling is not None:   # the rows of this block: a patch of the map
            token, ok = plan.row_tiling.position(_Index("offs_m"))
            w(f"tok_m = {token.text}")
            row_index = "tok_m[:, None]"
            if ok is not None:
                w(f"ok_m = {ok.text}")
        if windows is not None:   # a key block's tokens from its origin
            offset, steps = windows.offsets(_Index("tl.arange(0, BLOCK_N)"))
            w(f"koff_n = {_Index.of(offset)}")
            for k, step in enumerate(steps):
                w(f"kstep_{k} = {_Index.of(step)}")
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
    col_index, col_index_t = "offs_n[None, :]", "offs_n[:, None]"
    if plan.row_tiling is not None:
        ragged_rows = not plan.row_tiling.exact
        row_ok = "ok_m[:, None]"
    if windows is not None:   # keys past the map's edge (set per block in chunk_body)
        col_ok, col_ok_t = "ok_n[None, :]", "ok_n[:, None]"
        col_index, col_index_t = "tok_n[None, :]", "tok_n[:, None]"
    ragged_feature = plan.feature_extent != bk

    def valid(pairs):
        return {uid: text for uid, text, ragged in pairs if ragged}

    def ctx_rc():
        """Row × column tile (the feature axis reduced away)."""
        return ctx_base.child(axes={plan.row.uid: row_index, plan.col.uid: col_index},
                              valid=valid([(plan.row.uid, row_ok, ragged_rows),
                                           (plan.col.uid, col_ok, ragged_cols)]))

    def ctx_rf(feature: Axis):
        return ctx_base.child(axes={plan.row.uid: row_index, feature.uid: "offs_k[None, :]"},
                              valid=valid([(plan.row.uid, row_ok, ragged_rows),
                                           (feature.uid, feat_ok, ragged_feature)]))

    def ctx_cf(feature: Axis):
        return ctx_base.child(axes={plan.col.uid: col_index_t, feature.uid: "offs_k[None, :]"},
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
    lanes = lanewise_states(plan) if LANEWISE and not single and plan.mask is None and \
        splits == 1 else frozenset()
    for sp in plan.states:
        shape = "[BLOCK_M, BLOCK_K]" if sp.contraction is not None else \
            "[BLOCK_M, BLOCK_N]" if (sp.member.name, sp.k) in lanes else "[BLOCK_M, 1]"
        ident = literal(sp.monoid.identity_value(0, sp.dtype), sp.dtype)
        w(f"st_{sp.member.name}_{sp.k} = tl.full({shape}, {ident}, tl.float32)")
    w("seen = tl.full([], 0, tl.int32)")
    initial: dict = {}
    for d in needed:
        initial[d] = _initial_reference(plan, d, initial, N)
        w(f"ref_{d} = tl.full([BLOCK_M, 1], {literal(initial[d], 'f32')}, tl.float32)")

    def chunk_body(with_mask: bool, prefetch: tuple = ()):
        """One block of the axis: its loads, the chain's partial reductions and the rolling
        update of the states. ``prefetch``: loads of the outputs to issue first (their latency
        then overlaps the row's load and reductions instead of following them)."""
        nonlocal ragged_cols
        w("offs_n = start_n + tl.arange(0, BLOCK_N)")
        if windows is None:
            w(f"col_ok = {col_ok}")
        if windows is not None:   # only a partial window may hold keys past the map's edge
            ragged_cols = with_mask
            token, ok = windows.at(_Index("start_n"), _Index("koff_n"),
                                   [_Index(f"kstep_{k}") for k in range(len(windows.dims))])
            w(f"tok_n = {token.text}")
            if with_mask:
                w(f"ok_n = {ok.text}")
                w(f"col_ok = {col_ok}")
        memo: dict = {}
        early = ctx_rc().child(emit=w, memo=memo)
        for operand in prefetch:
            to_triton(operand, early)
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
                    if (m.name, sp.k) in lanes:   # combined per lane, reduced after the loop
                        w(f"c_{m.name}_{sp.k} = {body}")
                    else:
                        w(f"c_{m.name}_{sp.k} = {REDUCE[sp.monoid.name]}({body}, axis=1, "
                          "keep_dims=True)")
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
                w(f"newref_{m.name} = "
                  f"{to_triton(scheme.reference(), ctx_r().child(symbols=at_refs))}")
                symbols[f"{m.name}.ref"] = f"newref_{m.name}"
        for d in needed:
            w(f"ref_{d} = newref_{d}")
        w("seen = seen_next")
        return memo

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
                ctx = ctx_r().child(refs=finals, emit=w if single else None, memo=chunk_memo)
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
                usable = scheme.usable(Symbol("__fin", m.dtypes[0]))
                w(f"finref_{m.name} = "
                  f"{to_triton(usable, ctx_r().child(symbols={'__fin': f'fin_{m.name}'}))}")
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
        early = _output_operands(plan, ctx_rc()) if PREFETCH else ()
        chunk_memo = chunk_body(True, early)
        if reload:   # ... or read the row again, from L2, as they store it (but the early loads)
            chunk_memo = fresh_memo(chunk_memo, frozenset(e.key() for e in early))
            ctx_base.streaming = ctx_base.streaming[:2] + ("evict_first",)
    elif plan.mask is None:
        w(f"for start_n in range(0, {N}, BLOCK_N):")
        with w.block():
            chunk_body(True)
        for sp in plan.states:
            if (sp.member.name, sp.k) in lanes:
                state = f"st_{sp.member.name}_{sp.k}"
                w(f"{state} = {REDUCE[sp.monoid.name]}({state}, axis=1, keep_dims=True)")
        if ctx_base.streaming:   # the output pass reads each row a last time
            ctx_base.streaming = ctx_base.streaming[:2] + ("evict_first",)
    else:
        for kind, flag in (("partial", True), ("full", False)):
            w(f"base_{kind} = pid_b * {grid(plan, knobs)[0]} + pid_m")
            w(f"count_{kind} = tl.load(bm_{kind}_num + base_{kind})")
            if interpreter:
                w(f"for blk in range(0, {_blocks(plan, knobs)}):")
                w.indent += 1
                w(f"if blk < count_{kind}:")
            else:
                w(f"for blk in range(0, count_{kind}):")
            with w.block():
                start = f"tl.load(bm_{kind}_idx + base_{kind} * {_blocks(plan, knobs)} + blk)"
                w(f"start_n = {start}" if windows is not None else f"start_n = {start} * BLOCK_N")
                chunk_body(flag)
            if interpreter:
                w.indent -= 1
    # one block saw the whole axis: its references are the true values (sums extrapolated by
    # N / N, maxima not the identity); states kept only for corrections become dead code
    finals = emit_finals(states, {d: f"ref_{d}" for d in needed}, {}, correct=not single)
    emit_outputs(finals)
    return _assemble([(name, args, w.lines)]), args


def _depended_on(plan) -> set[str]:
    """The members whose references other members' corrections read."""
    return {d for scheme in plan.chain.schemes.values() for d in scheme.deps}


def lanewise_states(plan) -> frozenset:
    """(member, k) of the states a looped row sweep may keep per lane — ``[BLOCK_M, BLOCK_N]``,
    each lane combining its own column of every block, reduced across the row once after the
    loop (as Inductor's looped reductions do) — instead of reducing every block across the
    warps: a sum, max or min of a member whose states need no correction (no dependencies)
    and whose reference no other member reads per block. One cross-warp reduction per row
    instead of one per block, and a long sum added in N / BLOCK_N terms per lane, then as a
    tree (issue 23: the accuracy of long reductions)."""
    depended_on = _depended_on(plan)
    return frozenset((sp.member.name, sp.k) for sp in plan.states
                     if sp.contraction is None and not plan.chain.schemes[sp.member.name].deps
                     and sp.member.name not in depended_on and sp.monoid.name in REDUCE
                     and plan.col.uid in {a.uid for a in sp.body.axes})


def uncorrected_states(plan) -> bool:
    """Whether every state of ``plan``'s row reduction is kept per lane when the row is swept in
    blocks (:func:`lanewise_states`): a chain of independent sums, maxima or minima (RMSNorm's
    Σx²), with no block mask and nothing on the tensor cores."""
    return bool(plan.states) and plan.mask is None and not plan.locals and \
        len(lanewise_states(plan)) == len(plan.states)


def reloadable(plan) -> bool:
    """Whether the outputs of ``plan`` can read the row again instead of keeping it: a row
    reduction (no contraction on the tensor cores, no block mask) whose outputs run along the
    row (a norm, a softmax)."""
    return plan.mask is None and not plan.locals and \
        not any(sp.contraction for sp in plan.states) and \
        any(kind == "col" for _, _, kind in plan.outputs)


def _column_operands(plan) -> bool:
    """Whether an output reads a tensor along the columns alone (a norm's weight or bias)."""
    found = []

    def visit(node):
        if isinstance(node, Load) and {a.uid for a in node.axes} == {plan.col.uid}:
            found.append(node)

    for _, expr, _ in plan.outputs:
        walk(expr, visit)
    return bool(found)


def _output_operands(plan, tile: TileContext) -> tuple:
    """The loads in the outputs' expressions that do not depend on the chain's results and are
    indexed by the row alone (a per-row scale, cross-entropy's gathered target logit): issued
    before the reductions, their latency overlaps the row's. Loads along the columns (a norm's
    weight) stay where they are used: held across the reductions they cost registers, and a
    layernorm lost 9 % of its bandwidth that way (H100, benchmarks/rows_sweep.py)."""
    found: dict = {}
    for _, expr, kind in plan.outputs:
        if kind not in ("row", "col"):
            continue
        after_chain: set = set()

        def visit(node):
            if isinstance(node, Ref) or any(c.uid in after_chain for c in node.children()):
                after_chain.add(node.uid)
            elif isinstance(node, Load) and all(a.uid in tile.axes and a.uid != plan.col.uid
                                                for a in node.axes):
                found.setdefault(node.key(), node)

        walk(expr, visit)
    return tuple(found.values())


def _assemble(functions) -> str:
    parts = ["import triton", "import triton.language as tl",
             "from triton.language.extra import libdevice", HELPERS]
    for fname, fargs, body in functions:
        parts += ["", "@triton.jit",
                  f"def {fname}(" + ", ".join(fargs) + ", BLOCK_M: tl.constexpr, "
                  "BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):"] + body
    return "\n".join(parts) + "\n"


def _operand(e: Expr, ctx: TileContext, dot_dtype: str) -> str:
    """A tl.dot operand: a single load keeps its storage type; anything else is computed in f32
    and converted."""
    if isinstance(e, Load) and e.param.dtype == dot_dtype:
        return to_triton(e, ctx.child(keep_dtype=True))
    return f"({to_triton(e, ctx)}).to({TL_DTYPES[dot_dtype]})"


def _initial_reference(plan, d: str, initial: dict, cols: int) -> float:
    """The reference of ``d`` before anything is seen (as in the TensorIR lowering: the reference
    formula on empty states, the dependencies at their initial references)."""
    scheme = plan.chain.schemes[d]
    env = {f"{d}#{k}": np.asarray(st.monoid.identity_value(0, st.dtype), np.float64)
           for k, st in enumerate(scheme.states)}
    env.update({f"{e}.new": np.asarray(initial[e], np.float64) for e in scheme.deps})
    env[EXTRAPOLATION.name] = np.asarray(float(cols))
    with np.errstate(all="ignore"):
        return float(evaluate_plain(scheme.reference(), env))


def _store_offsets(c: Compute, ctx: TileContext, sizes: dict) -> str:
    dims = [a.extent if isinstance(a.extent, int) else sizes[a.extent] for a in c.axes]
    strides, acc = [], 1
    for n in reversed(dims):
        strides.append(acc)
        acc *= n
    strides.reverse()
    return " + ".join(f"{ctx.axes[a.uid]} * {s}" if s != 1 else ctx.axes[a.uid]
                      for a, s in zip(c.axes, strides))


def _largest(prog, sizes: dict) -> int:
    best = 0
    for p in prog.tensor_params:
        best = max(best, int(np.prod([d if isinstance(d, int) else sizes[d] for d in p.dims])))
    for c in prog.outputs:
        best = max(best, int(np.prod([a.extent if isinstance(a.extent, int) else sizes[a.extent]
                                      for a in c.axes])))
    return best


def _blocks(plan, knobs) -> int:
    """Entries per row block of the block lists."""
    if plan.key_windows is not None:
        return plan.key_windows.bound
    return math.ceil(plan.cols / knobs.block_n)


def grid(plan, knobs) -> tuple[int, int]:
    batch = int(np.prod([extent for _, extent in plan.grid_batch])) if plan.batch else 1
    rows = plan.row_tiling.padded if plan.row_tiling is not None else plan.rows
    return (math.ceil(rows / knobs.block_m), batch)


def block_k(plan) -> int:
    return max(16, 1 << max(0, (plan.feature_extent - 1).bit_length()))
