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

from ...algebra.exprs import substitute
from ...algebra.schemes import EXACT_READERS
from ...errors import TargetError
from ...dsl import dtypes as dt
from ...dsl.expr import Axis, Where
from ...dsl.symbolic_sizes import size_arguments
from ..index_text import IndexText as _Index
from .expr import TL_DTYPES, TileContext, fresh_memo, dot_precision, literal, to_triton
from .expr import offset as load_offset
from .column_sums import add_tile, finish_body, open_partials, partial_names, store_partials
from .row_bounds import bounded_sweep
from .row_merge import SplitMerge
from .row_outputs import RowOutputs
from .row_realign import Realignment, emit_sweep, realignment
from .row_updates import RowUpdates
from .row_grid import (MASK_ARGS, batch_first, block_k, grid, launch_grid, list_length,
                       merge_chunks, merged_apart)
from .row_states import (column_operands, depended_on, exact_symbols, exactly_read,
                         initial_reference, lanewise_states, output_operands,
                         referenced_lanes, reloadable, state_identity, state_type,
                         stored_state, uncorrected_states)
from .reductions import reduced
from .size_builds import size_alignments
from .tile_text import assemble_source, dot_operand, needs_wide_offsets
from .source_writer import SourceWriter, host_int

MAX_FEATURE = 256  # head dims up to 256 fit a tile in registers (past it: in chunks)
# issue the outputs' per-row operand loads before a whole-row block's reductions (chunk_body)
PREFETCH = True
# L2 eviction hints on a row reduction's loads (rows evict first — or last, on the first of two
# passes over them —, column operands evict last). None: where the kernel only reads its rows
# (its outputs are per row: cross-entropy, 91 -> 95 % of copy on the H100) or reads them twice
# and has no column operands (rows wider than a block: softmax over 65536 columns 68 -> 92 %).
# Measured worse, so left without: kernels that read each row once and write it (~1 %), a
# layernorm over 65536 columns (its weight and bias beside the rows: 74 -> 67 %)
# (``benchmarks.rows_sweep``). True / False: always / never (measuring)
EVICTION = None
# keep a swept row's uncorrected states per lane (:func:`lanewise_states`); False: reduce every
# block across the warps, as the template did before (measuring)
LANEWISE = True
# columns up to which a row of sums is swept twice, in blocks of 4096 with L2 hints (a row of
# 8192: 0.997-1.0004x torch.compile against 0.996-0.998x in one block; of 16384: 96 % of copy
# against 98.7 % in one block read again — ``benchmarks.rows_sweep``)
SWEPT_IN_L2 = 8192


def kernel_source(plan, knobs, name: str, interpreter: bool = False,
                  nvidia: bool = False) -> tuple[str, list[str]]:
    """Python source of a Triton kernel for ``plan`` (a ``tile_plan.RowTilePlan``) with ``knobs``
    (its ``Knobs``) and the names of its arguments, in order. ``interpreter``: source for Triton's
    CPU interpreter, which has no bf16 tensor-core operands (they become f32) and no loop bounds
    loaded from memory (block lists are walked to their static length, skipping past the count).
    ``nvidia``: float32 products on its tensor cores (:func:`.expr.dot_precision`)."""
    launch_grid(plan, knobs)   # a grid CUDA cannot launch is refused here, where a fit is asked
    if why := held_refusal(plan, knobs):
        raise TargetError(why)
    return _RowTileSource(plan, knobs, name, interpreter, nvidia).source()


def held_refusal(plan, knobs) -> str | None:
    """Why a chain with members held to one block (``Chain.held``: no correction carries their
    dependence) cannot run with ``knobs`` at ``plan``'s sizes — its row swept in more than one
    block or part, where those members would read their dependencies' partial values — or
    None."""
    held = plan.chain.held
    if not held:
        return None
    names = ", ".join(held)
    reason = next(iter(held.values()))
    if plan.cols > knobs.block_n or knobs.splits > 1 or plan.feature_chunk is not None:
        return (f"{names} reads its dependencies' final values ({reason}), which needs each row "
                f"of {plan.cols} elements in one block: block_n={knobs.block_n}, "
                f"splits={knobs.splits}" + (", features in chunks"
                                            if plan.feature_chunk is not None else ""))
    return None


class _RowTileSource(SplitMerge, RowOutputs, RowUpdates):
    """One row-tile kernel's emission (:func:`kernel_source`): what the plan and knobs decide
    about its rows, columns and states, and the pieces of the kernel (prologue, a block of the
    swept axis, the finals and outputs, the split update's merge), written in order to ``w``."""

    def __init__(self, plan, knobs, name: str, interpreter: bool, nvidia: bool):
        self.plan, self.knobs, self.name, self.interpreter = plan, knobs, name, interpreter
        self.nvidia = nvidia
        self.products = lambda dtype: dot_precision(dtype, nvidia)  # noqa: E731
        self.dot_type = (lambda con: "f32") if interpreter else \
            (lambda con: con.dot_dtype)  # noqa: E731
        self.prog = prog = plan.program
        self.sizes = plan.sizes
        self.w = SourceWriter(interpreter)
        self.tensors = [p.name for p in prog.tensor_params]
        self.scalars = [p.name for p in prog.scalar_params]
        self.outs = [f"out_{c.name}" for c, _, _ in plan.outputs]
        self.splits = splits = knobs.splits
        self.M, self.N = M, N = plan.rows, plan.cols
        self.windows = windows = plan.key_windows
        self.members = plan.chain.members
        self.depended_on = depended_on(plan)
        self.needed = [m.name for m in self.members if m.name in self.depended_on]
        self.parts = [f"part_{sp.member.name}_{sp.k}" for sp in plan.states] + \
            [f"part_ref_{d}" for d in self.needed]
        self.bounds = plan.bounds if splits == 1 else None   # the sweep bounded: no lists
        self.mask_args = list(MASK_ARGS) if plan.block_listed and splits == 1 else []
        # split: the parts' state buffers and arrival counters (the last part of a tile merges,
        # or a kernel of its own: row_grid.merged_apart)
        self.apart = merged_apart(plan, knobs)
        self.only_chunk = None   # the merge kernel's branch: the one feature chunk it merges
        self.args = self.tensors + self.scalars + self.outs + (
            self.parts + ([] if self.apart else ["part_count"]) if splits > 1 else
            self.mask_args) + \
            partial_names(plan) + \
            size_arguments(plan.sizes)   # sizes the kernel reads as arguments (dynamic=)
        self.bk = block_k(plan)
        self.wide = needs_wide_offsets(prog, self.sizes)
        self.tiles_swept = bool(plan.column_sums) or knobs.row_tiles > 1

        self.ctx_base = TileContext(axes={}, sizes=self.sizes, interpreter=interpreter)
        self.reads_only = plan.outputs_per_row
        # rows wider than a block: swept once for the reductions, again for the outputs
        self.reads_twice = not self.reads_only and plan.mask is None and splits == 1 and \
            N > knobs.block_n
        # rows read twice beside column operands get no hints (a layernorm over 65536 columns lost
        # by them) but where the states are sums kept per lane and the row is short enough to stay
        # in L2 between its passes (the scaled RMSNorm over 8192: 0.9956 -> 0.9995x torch.compile)
        self.hinted = self.reads_only or self.reads_twice and (
            not column_operands(plan) or N <= SWEPT_IN_L2 and uncorrected_states(plan))
        self.single = plan.mask is None and N <= knobs.block_n and splits == 1
        contracts = bool(plan.locals) or any(sp.contraction for sp in plan.states)
        # a row reduction's sweeps run their loads num_stages blocks ahead (a chain with
        # tensor-core products is pipelined by the compile option already)
        self.stages = 1 if contracts else knobs.num_stages
        self.reload = self.single and knobs.reload and reloadable(plan)
        if self.reload or ((self.hinted if EVICTION is None else EVICTION) and not contracts):
            # a row reduction (no contraction): its rows stream through L2, kept there for a second
            # pass (switched to evict_first for that pass below)
            # one row in all (a value over every axis): a tensor no row indexes is read once too
            rows = frozenset() if M == 1 and not plan.batch else \
                frozenset({plan.row.uid} | {a.uid for a in plan.batch})
            self.ctx_base.streaming = (rows, plan.col.uid, "evict_last"
                                       if self.reads_twice or self.reload else "evict_first")

        self.row_index = "offs_m[:, None]"
        self.row_ok = f"(offs_m[:, None] < {M})"
        self.col_ok = f"(offs_n[None, :] < {N})"
        self.col_ok_t = f"(offs_n[:, None] < {N})"
        # a program's row tiles may run past the rows (the last program's), not only its tile
        self.ragged_rows = M % (knobs.block_m * (knobs.row_tiles if self.tiles_swept else 1)) != 0
        self.ragged_cols = N % knobs.block_n != 0
        self.col_index, self.col_index_t = "offs_n[None, :]", "offs_n[:, None]"
        if plan.row_tiling is not None:
            self.ragged_rows = not plan.row_tiling.exact
            self.row_ok = "ok_m[:, None]"
        if windows is not None:   # keys past the map's edge (set per block in chunk_body)
            self.col_ok, self.col_ok_t = "ok_n[None, :]", "ok_n[:, None]"
            self.col_index, self.col_index_t = "tok_n[None, :]", "tok_n[:, None]"
        # rows off 16-byte boundaries: swept in aligned windows, columns shifted per row
        self.realign = realignment(plan, knobs, self.single, self.wide)
        if self.realign is not None:
            self.col_ok, self.col_index, self.ragged_cols = "col_ok", Realignment.column(), True
            self.ctx_base.realigned = {name: (plan.col.uid, "flat_n", "in_n")
                                       for name in self.realign.params}
        self.lanes = lanewise_states(plan) if LANEWISE and not self.single and \
            plan.mask is None else frozenset()
        # a variance's sums per lane where the knob asks (their sums' references fixed after the
        # first block: members read uncorrected, the sums' references set once, in that block)
        self.referenced = referenced_lanes(plan) if knobs.lanes and LANEWISE and \
            not self.single and self.realign is None and plan.bounds is None else frozenset()
        self.lanes = self.lanes | self.referenced
        self.fixed = {name for name, _ in self.referenced if plan.chain.schemes[name].deps}
        self.chunk_memo: dict = {}
        self.rows_pad = math.ceil(M / knobs.block_m) * knobs.block_m
        self.per_split = math.ceil(math.ceil(N / knobs.block_n) / splits) * knobs.block_n
        self.states = {(sp.member.name, sp.k): f"st_{sp.member.name}_{sp.k}" for sp in plan.states}
        # members whose variables are a chunk each (features past one block: .feature_chunks)
        self.chunked = {sp.member.name for sp in plan.states if sp.contraction is not None} \
            if plan.feature_chunk is not None else set()

    def prologue(self):
        w, plan = self.w, self.plan
        for size, align in size_alignments(self.prog, plan.sizes):
            w(f"{size} = {size} // {align} * {align}")   # no change: its divisor, said to Triton
        rows_at, batch_at = (1, 0) if batch_first(plan, self.knobs) else (0, 1)
        w(f"pid_m = tl.program_id({rows_at})")
        w(f"pid_b = tl.program_id({batch_at})" + (".to(tl.int64)" if self.wide else ""))
        stride = 1
        for (gname, extent), a in reversed(list(zip(plan.grid_batch, plan.batch))):
            w(f"ax_{gname} = (pid_b // {stride}) % {extent}")
            self.ctx_base.axes[a.uid] = f"ax_{gname}"
            stride *= extent
        if not self.tiles_swept:   # else per row tile of the program (swept_tiles_source)
            w("offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
        if self.realign is not None:
            start = load_offset(self.realign.sample,
                                self._tile([self._row(), (plan.col, "0", None, False)]))
            for line in self.realign.prologue(start, self.N):
                w(line)
        w("offs_k = tl.arange(0, BLOCK_K)")
        if plan.row_tiling is not None:   # the rows of this block: a patch of the map
            token, ok = plan.row_tiling.position(_Index("offs_m"))
            w(f"tok_m = {token.text}")
            self.row_index = "tok_m[:, None]"
            if ok is not None:
                w(f"ok_m = {ok.text}")
        if self.windows is not None:   # a key block's tokens from its origin
            offset, steps = self.windows.offsets(_Index("tl.arange(0, BLOCK_N)"))
            w(f"koff_n = {_Index.of(offset)}")
            for k, step in enumerate(steps):
                w(f"kstep_{k} = {_Index.of(step)}")
        if plan.fold is not None:  # rows are (head in group, query): h = group·G + r // M
            a, g = plan.fold
            per = plan.sizes_of(plan.row)
            self.ctx_base.axes[a.uid] = f"(ax_{a.name}g * {g} + offs_m[:, None] // {per})"
            self.ctx_base.symbols[f"__group_{a.name}"] = f"ax_{a.name}g"
            self.row_index = f"(offs_m[:, None] % {per})"
            if self.ragged_rows:   # the tile's rows past the group's read no head of another
                self.ctx_base.valid[a.uid] = self.row_ok

    def _tile(self, axes: list) -> TileContext:
        """A tile over ``axes`` — ``(axis, index text, validity text, ragged)`` — with the
        validity of its ragged ones."""
        return self.ctx_base.child(axes={a.uid: index for a, index, _, _ in axes},
                                   valid={a.uid: ok for a, _, ok, ragged in axes if ragged})

    def ctx_rc(self):
        """Row × column tile (the feature axis reduced away)."""
        return self._tile([self._row(), (self.plan.col, self.col_index, self.col_ok,
                                         self.ragged_cols)])

    def ctx_rf(self, feature: Axis, chunk: int = 0):
        """Row × feature tile (of the feature's ``chunk``)."""
        return self._tile([self._row(), self._feature(feature, chunk)])

    def ctx_cf(self, feature: Axis, chunk: int = 0):
        """Column × feature tile (the columns down the tile)."""
        return self._tile([(self.plan.col, self.col_index_t, self.col_ok_t, self.ragged_cols),
                           self._feature(feature, chunk)])

    def ctx_r(self):
        """One value per row."""
        return self._tile([self._row()])

    def _row(self) -> tuple:
        return self.plan.row, self.row_index, self.row_ok, self.ragged_rows

    def _feature(self, feature: Axis, chunk: int = 0) -> tuple:
        """The feature axis along the tile's columns (from its ``chunk``'s first element),
        valid up to its own size."""
        size, start = self.plan.feature_size(feature), chunk * self.bk
        index = f"(offs_k[None, :] + {start})" if start else "offs_k[None, :]"
        return feature, index, f"(offs_k[None, :] < {size - start})", size - start < self.bk

    def feature_chunks(self, feature: Axis) -> list[tuple[int, str]]:
        """``(chunk, suffix of its variables' names)`` of each tile of ``feature``: one, named
        as the whole, where the plan holds it in one block (:mod:`.feature_chunks`)."""
        if self.plan.feature_chunk is None:
            return [(0, "")]
        return [(c, f"_c{c}") for c in range(self.plan.feature_chunks(feature))
                if self.only_chunk in (None, c)]

    def state_chunks(self, sp) -> list[tuple[int, str]]:
        """The tiles of a state: a weighted sum's chunks, one for a state per row."""
        return self.feature_chunks(self.plan.state_feature(sp)) if sp.contraction is not None \
            else [(0, "")]

    def chunk_body(self, with_mask: bool, prefetch: tuple = (), tail: bool = False):
        """One block of the axis: its loads, the chain's partial reductions and the rolling
        update of the states. ``prefetch``: loads of the outputs to issue first (their latency
        then overlaps the row's load and reductions instead of following them). ``tail``: the
        realigned rows' block of the tensor's elements past its whole 16-byte vectors."""
        w, plan = self.w, self.plan
        w("offs_n = start_n + tl.arange(0, BLOCK_N)")
        if self.realign is not None:
            for line in self.realign.block(self.N, tail, not self.ragged_cols):
                w(line)
        elif self.windows is None:
            w(f"col_ok = {self.col_ok}")
        if self.windows is not None:   # only a partial window may hold keys past the map's edge
            self.ragged_cols = with_mask
            token, ok = self.windows.at(_Index("start_n"), _Index("koff_n"),
                                   [_Index(f"kstep_{k}") for k in range(len(self.windows.dims))])
            w(f"tok_n = {token.text}")
            if with_mask:
                w(f"ok_n = {ok.text}")
                w(f"col_ok = {self.col_ok}")
        memo: dict = {}
        early = self.ctx_rc().child(emit=w, memo=memo)
        for operand in prefetch:
            to_triton(operand, early)
        rc_refs = {}
        for xname, con in plan.locals.items():
            feat = self.local_axes[xname]
            for c, sfx in self.feature_chunks(feat):   # q·kᵀ summed over the chunks
                rhs = dot_operand(con.right, self.ctx_cf(feat, c), self.dot_type(con))
                w(f"rhs_{xname}{sfx} = {rhs}")
                precision = self.products(self.dot_type(con))
                acc = f", t_{xname}" if c else ""
                w(f"t_{xname} = tl.dot(lhs_{xname}{sfx}, tl.trans(rhs_{xname}{sfx}){acc}"
                  f"{precision})")
            rc_refs[xname] = f"t_{xname}"
        if self.realign is not None:
            w(f"seen_next = {self.realign.seen_next(self.N, tail)}")
        elif self.splits > 1:  # positions of this program's part covered so far (the last is short)
            w(f"seen_next = tl.minimum(seen + BLOCK_N, "
              f"tl.minimum(_lo + {self.per_split}, {self.N}) - _lo)")
        elif self.N % self.knobs.block_n:
            w(f"seen_next = tl.minimum(seen + BLOCK_N, {self.N})")
        else:
            w("seen_next = seen + BLOCK_N")
        symbols: dict = {}
        exact = exactly_read(plan)
        for m in self.members:
            scheme = plan.chain.schemes[m.name]
            # a resetting state: the dependencies' running values before and after this block
            resets = exact_symbols(scheme, "old_{}", "st_{}_0")
            tile = self.ctx_rc().child(refs=rc_refs, symbols={**symbols, **resets}, emit=w,
                                       memo=memo)
            if not with_mask and plan.mask is not None:
                mask_key = plan.mask.key()
                strip = lambda e: substitute(e, lambda n: n.a  # noqa: E731
                                             if isinstance(n, Where) and n.cond.key() == mask_key
                                             else None)
            else:
                strip = lambda e: e  # noqa: E731
            chunk_vars = []
            together = m.arity > 1   # a monoid of several components: reduced as one tuple
            for sp in [s for s in plan.states if s.member is m]:
                ident = state_identity(sp)
                if sp.contraction is None:
                    stripped = strip(sp.body)   # a full block's: the mask's where taken away
                    body = to_triton(stripped, tile)
                    constant_along = plan.col.uid not in {a.uid for a in stripped.axes}
                    if constant_along and sp.monoid.name == "sum":  # e.g. a count: 1.0 × columns
                        w(f"c_{m.name}_{sp.k} = ({body}) * (seen_next - seen).to(tl.float32)")
                        chunk_vars.append(sp)
                        continue
                    if constant_along:
                        body = f"(({body}) + tl.zeros([BLOCK_M, BLOCK_N], tl.float32))"
                    elif together and not self.reads_rows(stripped):
                        # an argmax's index: the same for every row, but reduced in one tuple
                        # with the row's values, which must be of the tile's shape
                        body = f"tl.broadcast_to({body}, [BLOCK_M, BLOCK_N])"
                    if self.ragged_cols:
                        body = f"tl.where(col_ok, {body}, {ident})"
                    if (m.name, sp.k) in self.lanes or together:   # (lanes: reduced after the
                        w(f"c_{m.name}_{sp.k} = {body}")                 # loop; several: below)
                    else:
                        w(f"c_{m.name}_{sp.k} = {reduced(sp.monoid, body, 1, True)}")
                else:
                    con = sp.contraction
                    feat = plan.state_feature(sp)
                    p = to_triton(strip(con.left), tile)
                    if self.ragged_cols:
                        p = f"tl.where(col_ok, {p}, 0.0)"
                    w(f"p_{m.name}_{sp.k} = ({p}).to({TL_DTYPES[self.dot_type(con)]})")
                    for c, sfx in self.feature_chunks(feat):
                        v = dot_operand(con.right, self.ctx_cf(feat, c), self.dot_type(con))
                        w(f"v_{m.name}_{sp.k}{sfx} = {v}")
                chunk_vars.append(sp)
            self.update_states(m, chunk_vars, resets, symbols, exact)
        for d in self.needed:
            w(f"ref_{d} = newref_{d}")
        w("seen = seen_next")
        return memo

    def reads_rows(self, expr) -> bool:
        """Whether ``expr`` varies along the tile's rows (reads the row axis, or the head axis
        folded into them)."""
        rows = {self.plan.row.uid} | ({self.plan.fold[0].uid} if self.plan.fold else set())
        return any(a.uid in rows for a in expr.axes)

    def emit_finals(self, kept: dict, refs: dict, values: dict, correct: bool) -> dict:
        """Each member's final value from ``kept`` states relative to ``refs`` (corrected to the
        true ``values`` of its dependencies first, unless ``correct`` is false)."""
        finals = {}
        for m in self.members:
            scheme = self.plan.chain.schemes[m.name]
            if m.arity > 1:   # independent: each component is its state
                for k in range(m.arity):
                    self.w(f"fin_{m.name}_{k} = {kept[(m.name, k)]}")
                    finals[f"{m.name}#{k}"] = f"fin_{m.name}_{k}"
                continue
            mine = [sp for sp in self.plan.states if sp.member is m]
            for _, sfx in self.state_chunks(mine[0]):   # a weighted sum's chunks: each finished
                sym = {f"{m.name}#{sp.k}": kept[(m.name, sp.k)] + sfx for sp in mine}
                if scheme.kind in EXACT_READERS:   # reset against (or held to) the exact values
                    value = to_triton(scheme.value[0], self.ctx_r().child(symbols=sym))
                elif not correct:  # the references are the true values: no correction needed
                    sym.update({f"{d}.new": refs[d] for d in scheme.deps})
                    value = to_triton(scheme.value[0], self.ctx_r().child(symbols=sym))
                else:
                    sym.update({f"{d}.old": refs[d] for d in scheme.deps})
                    sym.update({f"{d}.new": values.get(d, f"fin_{d}") for d in scheme.deps})
                    value = to_triton(scheme.true_value(0, settled=True),
                                      self.ctx_r().child(symbols=sym))
                self.w(f"fin_{m.name}{sfx} = {value}")
            finals[m.name] = f"fin_{m.name}"
        return finals

    def source(self) -> tuple[str, list[str]]:
        """The kernel's Python source and argument names."""
        self.prologue()
        if self.tiles_swept:
            return self.swept_tiles_source()
        return self.tile_source()

    def swept_tiles_source(self) -> tuple[str, list[str]]:
        """Each program sweeps ``row_tiles`` tiles of whole rows, the next tile's loads issued
        ``num_stages - 1`` tiles ahead while one is reduced — or tiles of rows swept in blocks,
        one after the other. With sums down the rows
        (:mod:`.column_sums`) it adds their contributions up per column and stores them; a
        second kernel adds the programs' partials up and writes the outputs that read the
        sums."""
        w, plan, knobs = self.w, self.plan, self.knobs
        if not self.single and (plan.column_sums or knobs.splits > 1):
            what = "sums down the rows are added up in the row kernel's pass" \
                if plan.column_sums else "a program sweeps several row tiles of a split sweep"
            raise TargetError(f"{what} only where a whole row is one block: {self.N} columns in "
                              f"blocks of {knobs.block_n}"
                              + (f", {knobs.splits} parts" if knobs.splits > 1 else ""))
        open_partials(w, plan)
        # rows swept in blocks: one tile after the other (the sweep inside pipelines its loads),
        # so that the rows a GPU holds between their passes stay few enough for L2
        w.sweep("row_tile", "0", str(knobs.row_tiles), "1", knobs.num_stages if self.single else 1)
        with w.block():
            w(f"offs_m = (pid_m * {knobs.row_tiles} + row_tile) * BLOCK_M + "
              "tl.arange(0, BLOCK_M)")
            finals = self.tile_body()
            add_tile(w, plan, self.ctx_rc().child(refs=finals, emit=w, memo=self.chunk_memo),
                     f"{self.row_ok} & {self.col_ok}")
        if not plan.column_sums:
            return assemble_source([(self.name, self.args, w.lines)]), self.args
        store_partials(w, plan, knobs)
        finish = finish_body(plan, knobs, {c.name: out for (c, _, _), out in
                                           zip(plan.outputs, self.outs)}, self.interpreter)
        return assemble_source([(self.name, self.args, w.lines),
                                (f"{self.name}_sums", self.args, finish)]), self.args

    def tile_source(self) -> tuple[str, list[str]]:
        """The kernel of a plan without sums down the rows: one row tile a program (and the
        kernel that merges its parts, where they are merged apart)."""
        self.tile_body()
        kernels = [(self.name, self.args, self.w.lines)]
        if self.apart:
            kernels.append((f"{self.name}_merge", self.args, self.merge_kernel_lines()))
        return assemble_source(kernels), self.args

    def merge_kernel_lines(self) -> list[str]:
        """The body of the kernel that merges the parts' states where they are merged apart
        (:func:`.row_grid.merged_apart`): a program per row tile and feature chunk (the grid's
        third axis), each folding every part's states of its chunk, and the states per row
        whole, then storing its chunk of the outputs (the first chunk's program the outputs per
        row)."""
        merge = _RowTileSource(self.plan, self.knobs, self.name, self.interpreter, self.nvidia)
        merge.prologue()
        merge.w("pid_c = tl.program_id(2)")
        for c in range(merge_chunks(self.plan)):
            merge.w(f"if pid_c == {c}:")
            with merge.w.block():
                merge.only_chunk = c
                merge.emit_merge()
        return merge.w.lines

    def tile_body(self) -> dict | None:
        """One row tile: its states, its sweep of the axis, its finals and outputs; the finals'
        variables (None where the split update's last part merges and writes the outputs)."""
        w, plan, knobs = self.w, self.plan, self.knobs
        # hoisted row operands of the local contractions (q)
        self.local_axes = {}
        for xname, con in plan.locals.items():
            x = self.prog.compute(xname)
            feat = x.over[0]
            self.local_axes[xname] = feat
            for c, sfx in self.feature_chunks(feat):
                lhs = dot_operand(con.left, self.ctx_rf(feat, c), self.dot_type(con))
                w(f"lhs_{xname}{sfx} = {lhs}")
        # states
        for sp in plan.states:
            shape = "[BLOCK_M, BLOCK_K]" if sp.contraction is not None else \
                "[BLOCK_M, BLOCK_N]" if (sp.member.name, sp.k) in self.lanes else "[BLOCK_M, 1]"
            for _, sfx in self.state_chunks(sp):
                w(f"st_{sp.member.name}_{sp.k}{sfx} = tl.full({shape}, {state_identity(sp)}, "
                  f"{state_type(sp)})")
        w("seen = tl.full([], 0, tl.int32)" if self.realign is None else
          "seen = tl.zeros([BLOCK_M, 1], tl.int32)")
        self.initial: dict = {}
        for d in self.needed:
            self.initial[d] = initial_reference(plan, d, self.initial, self.N)
            # an integer sum's reference is extrapolated as an integer (Scheme.reference): the
            # loop carries it in the sum's own type
            kind = plan.chain.schemes[d].compute.dtypes[0]
            kind = kind if dt.is_int(kind) else "f32"
            w(f"ref_{d} = tl.full([BLOCK_M, 1], {literal(self.initial[d], kind)}, "
              f"{TL_DTYPES[kind]})")
        if self.splits > 1:  # this program's part of the axis; its states go to memory to merge
            w("pid_s = tl.program_id(2)")
            w(f"_lo = pid_s * {self.per_split}")
            if self.interpreter:  # no loop bounds computed from program ids in the interpreter
                w(f"for blk in range(0, {host_int(str(self.per_split // knobs.block_n))}):")
                with w.block():
                    w("start_n = _lo + blk * BLOCK_N")
                    w(f"if start_n < {self.N}:")
                    with w.block():
                        self.chunk_body(True)
            else:
                w.sweep("start_n", "_lo", f"tl.minimum(_lo + {self.per_split}, {self.N})",
                        "BLOCK_N", self.stages)
                with w.block():
                    self.chunk_body(True)
            self.fold_lanes()   # a part's lanes folded before its states are stored
            for sp in plan.states:
                for c, sfx in self.state_chunks(sp):
                    w(f"tl.store({self.part_at(sp, 'pid_s', c)}, "
                      f"{stored_state(sp, self.states[(sp.member.name, sp.k)] + sfx)})")
            for d in self.needed:
                w(f"tl.store({self.part_at(f'part_ref_{d}', 'pid_s')}, ref_{d})")
            if not self.apart:
                self.last_part_merges()
            return None
        if self.single:  # the whole axis in one block: no loop, and outputs reuse the loaded values
            w("start_n = 0")
            early = output_operands(plan, self.ctx_rc()) if PREFETCH else ()
            self.chunk_memo = self.chunk_body(True, early)
            if self.reload:   # ... or read the row again, from L2, as they store it (but the early
                #                 loads)
                self.chunk_memo = fresh_memo(self.chunk_memo, frozenset(e.key() for e in early))
                self.ctx_base.streaming = self.ctx_base.streaming[:2] + ("evict_first",)
        elif plan.mask is None and self.realign is not None:
            def block(tail: bool, inside: bool):
                with self.inside_rows(inside):
                    self.chunk_body(True, tail=tail)
            emit_sweep(w, self.realign, self.N, self.stages, block)
            self.fold_lanes()
        elif plan.mask is None:
            w.sweep("start_n", "0", str(self.N), "BLOCK_N", self.stages)
            with w.block():
                self.chunk_body(True)
            self.fold_lanes()
        elif self.bounds is not None:
            bounded_sweep(self)
        else:
            for kind, flag in (("partial", True), ("full", False)):
                w(f"base_{kind} = pid_b * {grid(plan, knobs)[0]} + pid_m")
                w(f"count_{kind} = tl.load(bm_{kind}_num + base_{kind})")
                if self.interpreter:
                    w(f"for blk in range(0, {host_int(str(list_length(plan, knobs)))}):")
                    w.indent += 1
                    w(f"if blk < count_{kind}:")
                else:
                    w(f"for blk in range(0, count_{kind}):")
                with w.block():
                    start = f"tl.load(bm_{kind}_idx + base_{kind} * {list_length(plan, knobs)} + blk)"
                    w(f"start_n = {start}" if self.windows is not None else
                      f"start_n = {start} * BLOCK_N")
                    self.chunk_body(flag)
                if self.interpreter:
                    w.indent -= 1
        # one block saw the whole axis: its references are the true values (sums extrapolated by
        # N / N, maxima not the identity); states kept only for corrections become dead code
        finals = self.emit_finals(self.states, {d: f"ref_{d}" for d in self.needed}, {},
                                  correct=not self.single)
        self.emit_outputs(finals)
        return finals
