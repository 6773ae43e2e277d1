"""How a rolling update's chunk is laid out on the CPU (``parallel="cpu"``): a mixin of the fused
lowering's chain emitter (:mod:`.fusion`).

On a GPU each chunk is a tile the templates schedule; on the CPU the lowered loops are what runs,
so they are written for LLVM's vectoriser and for little repeated work:

- the chunk loop sweeps only the chunks a row's mask can keep (:meth:`_chunk_range`);
- costly per-position values (``exp(s - m)``, a mask that divides indices) are computed once per
  position in a loop over the chunk (:meth:`_hoist`), instead of once per output feature and per
  state; costly per-row correction factors once per row (:meth:`_hoist_row`);
- a member with feature axes loops over positions outside and features inside
  (:meth:`_chunk_loops`), a chunk's sum or maximum of one value per position runs in
  :data:`LANES` partial results (:meth:`_emit_in_lanes`);
- with ``Fusion.rows`` > 1, a core sweeps a block of consecutive rows together, every block of
  the sweep looping over them (:meth:`_stage_loops`): the contractions ``q·k`` and ``p·v`` load
  each key's and value's vector once for all rows of the block (one row at a time, they were
  bound by the loads feeding their multiply-adds, not by the multiply-adds).

Measured on 2 cores: ``benchmarks.cpu``.
"""
from __future__ import annotations

import contextlib
import functools

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.sym import Analyzer
from tvm.tirx.script.builder import ir as T

from ..algebra.exprs import nodes, substitute, symbols_in
from ..algebra.schemes import EXACT, REFERENCE
from ..dsl import dtypes as dtt
from ..dsl.expr import Binary, Expr, Load, Ref, Symbol, Unary, Where
from ..dsl.program import Compute
from ..lower_to_tir import LoopAxis, Scope, lower_expr
from ..lower_to_tir.expr_to_tir import constant
from .mask_bounds import chain_key_range

LANES = 16   # partial results of a chunk's sums: an AVX-512 register of f32
ACCUMULATOR_LANES = 16 * LANES   # a block of rows' partial results held in registers
COSTLY = ("exp", "exp2", "log", "log2", "tanh", "sigmoid", "erf", "sqrt", "rsqrt", "sin", "cos")


class CpuChunkLayout:
    """The CPU's layout of a chunk; mixed into the chain emitter, whose state it reads (``fb``,
    ``chain``, ``fusion``, the chunk's axes and buffers)."""

    def _fits_lanes(self, monoid) -> bool:
        """Whether a chunk's reduction of one value per position runs in lanes: a sum, maximum
        or minimum (their lanes fold in any order; an argmax's ties would not) over chunks of
        whole lane groups."""
        return monoid.name in ("sum", "max", "min") and self.fusion.chunk % LANES == 0

    def _emit_in_lanes(self, name: str, m: Compute, monoid, bufs, dtype: str, body: Expr,
                       scope: Scope) -> None:
        """A chunk's sum (max, min) of one value per position, on the CPU: ``LANES`` partial
        results, position ``t`` into lane ``t % LANES`` (a loop over the lanes LLVM vectorises,
        where one running scalar would chain every position's add), then the lanes folded into
        the chunk's state."""
        scheme, n = self.chain.schemes[m.name], self.names
        lanes = self.fb.alloc(f"{name}_lanes", self._shape(self.state_axes(m)
                                                          + self._split_dims())
                              + [tirx.IntImm(self.fb.index_dtype, LANES)], dtype)
        lane_loop = LoopAxis(self.lane_axis, tirx.IntImm(self.fb.index_dtype, LANES),
                             self.lane_axis.name, "S")
        outer = LoopAxis(self.t_outer_axis, tirx.IntImm(self.fb.index_dtype,
                                                        self.fusion.chunk // LANES),
                         self.t_outer_axis.name, "R")
        position = lambda v: v[outer.name] * LANES + v[lane_loop.name]  # noqa: E731

        def lane_index(sc):
            return self._index(self.state_axes(m), sc) + [sc.axes[self.lane_axis.uid]]

        with self._stage_loops([lane_loop]) as lv:
            with self._block(f"{name}_lanes_init", [lane_loop], lv, [self._chunk_iter()]) as sc:
                self.fb.store(lanes, constant(monoid.identity_value(0, dtype), dtype),
                              lane_index(sc))
        self._emit_row_references(scheme.deps)
        with self._stage_loops([outer, lane_loop]) as lv:
            with self._block(name, [outer, lane_loop], lv, [self._chunk_iter()],
                             derive=lambda v: {**self._j_of({**v, n["t"]: position(v)}),
                                               self.t_axis.uid: position(v)},
                             predicate=lambda b: self._in_range({**b, n["t"]: position(b)}),
                             scope=scope) as sc:
                self.fb.emit_update(monoid, [lanes], lane_index(sc), [body],
                                    sc.child(symbols=self._position_symbols(sc, scheme.deps)),
                                    False, [dtype])
        fold = LoopAxis(self.lane_axis, lane_loop.extent, self.lane_axis.name, "R")
        with self._stage_loops([fold]) as lv:
            with self._block(f"{name}_lanes_fold", [fold], lv, [self._chunk_iter()]) as sc:
                lane = {"__lane": tirx.BufferLoad(lanes, lane_index(sc))}
                self.fb.emit_update(monoid, bufs, self._index(self.state_axes(m), sc),
                                    [Symbol("__lane", dtype)], sc.child(symbols=lane), False,
                                    [dtype])

    @property
    def _cpu(self) -> bool:
        return self.fb.parallel == "cpu"

    @property
    def _rows_per_block(self) -> int:
        """Rows of the last common axis swept together (``Fusion.rows``): on the CPU, and for a
        rolling update (one part) with rows to block; else 1."""
        rows = self.fusion.rows
        if not (self._cpu and self.splits == 1 and self.common) or rows == 1:
            return 1
        extent = self.fb.extent(self.common[-1])
        if isinstance(extent, tirx.IntImm) and extent.value < 2:
            return 1
        return rows

    @contextlib.contextmanager
    def _row_loops(self, outer: list):
        """The loops over the rows around the whole sweep: one parallel loop over every row, or,
        with a block of rows (:attr:`_rows_per_block`), over blocks of that many consecutive rows
        of the last common axis (attention's queries), each block's rows visited inside every
        stage (:meth:`_stage_loops`)."""
        rows = self._rows_per_block
        self._block_of = None
        if rows == 1:
            with self.fb.spatial_loops(outer) as (self.outer, self.outer_pred):
                yield
            return
        last, per = outer[-1], tirx.IntImm(self.fb.index_dtype, rows)
        blocks = LoopAxis(None, Analyzer().simplify(tirx.floordiv(last.extent + per - 1, per)),
                          f"{last.name}_block")
        with self.fb.spatial_loops(outer[:-1] + [blocks]) as (iters, pred):
            self._block_of = iters[:-1], last, iters[-1][1] * per, pred
            self.outer, self.outer_pred = None, None   # set per row by _stage_loops
            yield

    def _block_rows(self) -> list:
        """The rows of the current block (clamped into the axis: the last block may be short)."""
        _, last, first, _ = self._block_of
        end = last.extent - 1
        return [tirx.min(first + r, end) for r in range(self._rows_per_block)]

    @contextlib.contextmanager
    def _stage_loops(self, loops: list):
        """Open the loops of one block of the sweep (``loops``) and yield their values. In a
        block of rows (:meth:`_row_loops`) a loop over its rows joins them: in a contraction
        (reductions, then a spatial loop innermost: ``q·k`` over ``d``, ``p·v`` over the keys)
        just above that innermost loop, so that each operand vector it loads (a key's or a
        value's) serves every row of the block from a register
        (:meth:`_contraction_loops`); elsewhere outermost. Rows past the axis' end are
        guarded."""
        if self._block_of is None:
            with self.fb.loops(loops) as lv:
                yield lv
            return
        iters, last, first, pred = self._block_of
        rows = LoopAxis(None, tirx.IntImm(self.fb.index_dtype, self._rows_per_block),
                        f"{last.name}_row")
        contraction = bool(loops) and loops[-1].kind == "S" and \
            any(lp.kind == "R" for lp in loops[:-1])
        at = len(loops) - 1 if contraction else 0
        with self._contraction_loops(loops[:at] + [rows] + loops[at:]) as lv:
            row = first + lv[at]
            guard = None if _divides(self._rows_per_block, last.extent) else row < last.extent
            if pred is not None:
                guard = pred if guard is None else tirx.And(pred, guard)
            self.outer, self.outer_pred = iters + [(last, row)], guard
            try:
                yield lv[:at] + lv[at + 1:]
            finally:
                self.outer, self.outer_pred = None, None

    def _chunk_bounds(self, row: dict) -> tuple:
        """``(first chunk, chunk past the last)`` that the mask lets the row (the axes of the
        current loops, ``row`` overriding) reach, either None where unbounded
        (:func:`.mask_bounds.chain_key_range`)."""
        iters = self.outer if self._block_of is None else self._block_of[0]
        axes = {lp.axis.uid: value for lp, value in iters if lp.axis is not None}
        lo, hi = chain_key_range(self.chain, self.fb.scope.child(axes={**axes, **row}))
        return (None if lo is None else tirx.floordiv(lo, self.tc),
                None if hi is None else tirx.floordiv(hi, self.tc) + 1)

    @contextlib.contextmanager
    def _chunk_range(self):
        """The loop over a part's chunks; yields its variable. On the CPU, a chain whose mask
        gives each row a range of keys (:func:`.mask_bounds.chain_key_range`) sweeps only the
        chunks that range touches (a block of rows: the hull of its rows' ranges): a chunk the
        mask removes whole adds the identity to every state and leaves the dependencies —
        hence every correction — unchanged."""
        start, stop = tirx.IntImm(self.fb.index_dtype, 0), self.cps
        if self._cpu and self.splits == 1:
            if self._block_of is None:
                bounds = [self._chunk_bounds({})]
            else:
                uid = self._block_of[1].axis.uid
                bounds = [self._chunk_bounds({uid: row}) for row in self._block_rows()]
            starts, stops = [b[0] for b in bounds], [b[1] for b in bounds]
            if all(s is not None for s in starts):
                start = tirx.max(start, functools.reduce(tirx.min, starts))
            if all(s is not None for s in stops):
                stop = tirx.min(stop, functools.reduce(tirx.max, stops))
            simplify = Analyzer().simplify
            start, stop = simplify(tirx.min(start, self.cps)), simplify(tirx.max(stop, start))
        with T.serial(start, stop) as cv:
            IRBuilder.name(self.names["chunk"], cv)
            yield cv

    def _hoist(self, body: Expr, m: Compute) -> Expr:
        """``body`` with its costly per-position parts read from chunk buffers, each computed
        once per position before the first state that needs it — not once per feature, nor once
        per state, and in a loop over the positions LLVM vectorises. Costly: a function such as
        ``exp`` (attention's ``exp(s - m)``), or a masked value whose mask does integer division
        or reads data (a 2-D neighbourhood's ``i // w``, document ids), of values along the
        fused axis and not along ``m``'s own feature axes."""
        features = {a.uid for a in self._extra_axes(m)}
        local = {x.name for x in self.local}

        def per_position(n: Expr) -> bool:
            axes = {a.uid for a in n.axes} | {a.uid for r in nodes(n) if isinstance(r, Ref)
                                              and r.compute.name in local
                                              for a in r.compute.axes}
            return self.chain.axis.uid in axes and not axes & features

        def costly(n: Expr) -> bool:
            if isinstance(n, Unary):
                return n.op in COSTLY
            return isinstance(n, Where) and any(
                isinstance(x, Load) or (isinstance(x, Binary) and x.op in ("floordiv", "mod"))
                for x in nodes(n.cond))

        def replace(n: Expr):
            if not (costly(n) and per_position(n)):
                return None
            if n.key() not in self.hoisted:   # its own costly parts first, then itself
                inner = n.rebuild([substitute(c, replace) for c in n.children()])
                self.hoisted[n.key()] = self._emit_position_values(inner)
            return self.hoisted[n.key()][0]

        return substitute(body, replace)

    def _emit_position_values(self, e: Expr):
        """A chunk buffer holding ``e`` at each position of the chunk; returns its symbol and
        buffer."""
        k = len(self.hoisted)
        axes = self.common + self._split_dims() + [self.t_axis]
        buf = self.fb.alloc(f"{self.chain.axis.name}_value{k}_local", self._shape(axes),
                            dtt.resolve(e.dtype))
        t_loop = LoopAxis(self.t_axis, self.tc, self.names["t"])
        deps = {n.name.rsplit(".", 1)[0] for n in nodes(e) if isinstance(n, Symbol)
                and n.name.endswith((f".{REFERENCE}", f".{EXACT}"))}
        self._emit_row_references(deps)
        with self._stage_loops([t_loop]) as lv:
            with self._block(f"{self.chain.axis.name}_value{k}", [t_loop], lv,
                             [self._chunk_iter()], derive=self._j_of, predicate=self._in_range,
                             scope=self._scope(self.fb.scope)) as sc:
                inner = sc.child(symbols=self._position_symbols(sc, deps))
                self.fb.store(buf, lower_expr(e, inner, dtt.resolve(e.dtype)),
                              self._position_index(sc))
        return Symbol(f"__value{k}", e.dtype), buf

    def _hoist_row(self, e: Expr, m: Compute, old=None, new=None, final: bool = False) -> Expr:
        """``e`` (a correction of a state with feature axes; with ``final``, the member's output)
        with its costly parts that do not read the state (attention's ``exp(m.old − m.new)``,
        with the references' guards) computed once per row — and chunk, in the sweep — into a
        buffer before the block that reads them, not once per feature. ``old(d, scope)`` /
        ``new(d, scope)``: the dependencies' values those parts read (default: the chunk update's).
        LLVM hoisted the one-compare guard itself, not the three-compare one of an overflowed
        maximum (a sliding window's fused kernel went from 32 to 45 ms without this); and it
        hoisted nothing out of the output's loop over features in a block of rows, where that
        loop then ran scalar, an ``exp`` per feature: a third of the kernel at 1024 keys."""
        own = {f"{m.name}#{k}" for k in range(len(self.chain.schemes[m.name].states))}
        old = old or self._running(self.prev, 0)
        new = new or self._running(self.new, 1)
        tag = "final_factor" if final else "factor"

        def replace(n: Expr):
            if not (isinstance(n, Unary) and n.op in COSTLY) or symbols_in(n) & own:
                return None
            if n.key() not in self.row_values:
                k = len(self.row_values)
                buf = self.fb.alloc(f"{m.name}_{tag}{k}",
                                    self._shape(self.common + self._split_dims()),
                                    dtt.resolve(n.dtype))
                chunk = [] if final else [self._chunk_iter()]
                with self._stage_loops([]), self._block(f"{m.name}_{tag}{k}", [], [], chunk) as sc:
                    deps = {}
                    for d in self.chain.schemes[m.name].deps:
                        deps[f"{d}.old"], deps[f"{d}.new"] = old(d, sc), new(d, sc)
                    self.fb.store(buf, lower_expr(n, sc.child(symbols=deps),
                                                  dtt.resolve(n.dtype)),
                                  self._index(self.common, sc))
                self.row_values[n.key()] = Symbol(f"__row{k}", n.dtype), buf
            return self.row_values[n.key()][0]

        return substitute(e, replace)

    def _row_symbols(self, sc: Scope) -> dict:
        """The per-row values of :meth:`_hoist_row`, by name."""
        return {h.name: tirx.BufferLoad(buf, self._index(self.common, sc))
                for h, buf in self.row_values.values()}

    def _position_index(self, sc: Scope) -> list:
        return self._index(self.common, sc) + [sc.axes[self.t_axis.uid]]

    def _position_symbols(self, sc: Scope, deps) -> dict:
        """What a block over a chunk's positions reads by name: the dependencies ``deps`` at
        their references after this chunk (``d.ref``; on the CPU from the row's buffer of
        :meth:`_emit_row_references`) and at their values (``d.exact``, which a resetting
        state compares with), and the per-position values hoisted so far."""
        symbols = {f"{d}.{REFERENCE}": tirx.BufferLoad(self.row_refs[d][0],
                                                      self._index(self.row_refs[d][1], sc))
                   if d in self.row_refs else self._running(self.new, 1)(d, sc) for d in deps}
        symbols.update({f"{d}.{EXACT}": self._exact(self.new)(d, sc) for d in deps})
        symbols.update({h.name: tirx.BufferLoad(buf, self._position_index(sc))
                        for h, buf in self.hoisted.values()})
        return symbols

    def _emit_row_references(self, deps) -> None:
        """On the CPU, each dependency's reference after this chunk computed once per row and
        chunk into a buffer, before the blocks over the chunk's positions that read it. A
        member whose value is its state has no buffer of its own and its reference (the state
        made usable: finite, not a sentinel) was recomputed at every position: 45 ms instead of
        32 for a sliding window once that guard grew to three compares."""
        if not self._cpu:
            return
        for d in deps:
            if d in self.row_refs:
                continue
            member = self._member(d)
            # over the dependency's own axes: a mean per (b, d) that a count per b divides
            extra = self._loops(self._extra_axes(member))
            buf = self.fb.alloc(f"{d}_ref_row", self._shape(self.state_axes(member)
                                                            + self._split_dims()),
                                member.dtypes[0])
            with self._stage_loops(extra) as lv, \
                    self._block(f"{d}_ref_row", extra, lv, [self._chunk_iter()]) as sc:
                self.fb.store(buf, self._running(self.new, 1)(d, sc),
                              self._index(self.state_axes(member), sc))
            self.row_refs[d] = (buf, self.state_axes(member))

    @contextlib.contextmanager
    def _contraction_loops(self, loops: list):
        """Open ``loops`` and yield their values. In a contraction over a block of rows
        (spatial loops, the reductions, the rows, a spatial loop innermost) each step of the
        reductions updates rows × innermost partial results, which LLVM keeps in vector
        registers across the reductions — while they fit: where they would take more than
        :data:`ACCUMULATOR_LANES` lanes (16 AVX-512 registers), the innermost loop is cut into
        parts that do, whose outer part runs outside the reductions (4 rows of 128 keys' scores:
        two parts of 64; without the cut 32 registers of partial results spilled)."""
        first = next((k for k, lp in enumerate(loops) if lp.kind == "R"), None)
        inner = loops[-1] if loops else None
        width = ACCUMULATOR_LANES // self._rows_per_block
        if not (first is not None and first < len(loops) - 1
                and inner.kind == "S" and isinstance(inner.extent, tirx.IntImm)
                and inner.extent.value % width == 0 and inner.extent.value > width):
            with self.fb.loops(loops) as lv:
                yield lv
            return
        idx = self.fb.index_dtype
        outer = LoopAxis(None, tirx.IntImm(idx, inner.extent.value // width), f"{inner.name}_o")
        part = LoopAxis(None, tirx.IntImm(idx, width), f"{inner.name}_i")
        with self.fb.loops(loops[:first] + [outer] + loops[first:-1] + [part]) as lv:
            values = lv[:first] + lv[first + 1:-1]
            yield values + [lv[first] * width + lv[-1]]

    def _chunk_loops(self, extra: list, t_loop: LoopAxis) -> list:
        """A chunk's loops for a member with ``extra`` axes (attention's output features): on
        the CPU the positions outside and the features inside, the loop LLVM vectorises (a
        position's hoisted value read once for all features); elsewhere the positions inside
        (a reduction per feature)."""
        return [t_loop] + extra if self._cpu else extra + [t_loop]


def _divides(rows: int, extent) -> bool:
    return isinstance(extent, tirx.IntImm) and extent.value % rows == 0
