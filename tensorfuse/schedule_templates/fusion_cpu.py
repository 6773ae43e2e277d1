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
  :data:`LANES` partial results (:meth:`_emit_in_lanes`).

Measured on 2 cores: benchmarks/RESULTS.md, session 19.
"""
from __future__ import annotations

import contextlib

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.sym import Analyzer
from tvm.tirx.script.builder import ir as T

from ..algebra.exprs import nodes, substitute, symbols_in
from ..dsl import dtypes as dtt
from ..dsl.expr import Binary, Expr, Load, Ref, Symbol, Unary, Where
from ..dsl.program import Compute
from ..lower_to_tir import LoopAxis, Scope, lower_expr
from ..lower_to_tir.expr_to_tir import constant
from .mask_bounds import chain_key_range

LANES = 16   # partial results of a chunk's sums: an AVX-512 register of f32
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

        with self.fb.loops([lane_loop]) as lv:
            with self._block(f"{name}_lanes_init", [lane_loop], lv, [self._chunk_iter()]) as sc:
                self.fb.store(lanes, constant(monoid.identity_value(0, dtype), dtype),
                              lane_index(sc))
        self._emit_row_references(scheme.deps)
        with self.fb.loops([outer, lane_loop]) as lv:
            with self._block(name, [outer, lane_loop], lv, [self._chunk_iter()],
                             derive=lambda v: {**self._j_of({**v, n["t"]: position(v)}),
                                               self.t_axis.uid: position(v)},
                             predicate=lambda b: self._in_range({**b, n["t"]: position(b)}),
                             scope=scope) as sc:
                self.fb.emit_update(monoid, [lanes], lane_index(sc), [body],
                                    sc.child(symbols=self._position_symbols(sc, scheme.deps)),
                                    False, [dtype])
        fold = LoopAxis(self.lane_axis, lane_loop.extent, self.lane_axis.name, "R")
        with self.fb.loops([fold]) as lv:
            with self._block(f"{name}_lanes_fold", [fold], lv, [self._chunk_iter()]) as sc:
                lane = {"__lane": tirx.BufferLoad(lanes, lane_index(sc))}
                self.fb.emit_update(monoid, bufs, self._index(self.state_axes(m), sc),
                                    [Symbol("__lane", dtype)], sc.child(symbols=lane), False,
                                    [dtype])

    @property
    def _cpu(self) -> bool:
        return self.fb.parallel == "cpu"

    @contextlib.contextmanager
    def _chunk_range(self):
        """The loop over a part's chunks; yields its variable. On the CPU, a chain whose mask
        gives each row a range of keys (:func:`.mask_bounds.chain_key_range`) sweeps only the
        chunks that range touches: a chunk the mask removes whole adds the identity to every
        state and leaves the dependencies — hence every correction — unchanged."""
        start, stop = tirx.IntImm(self.fb.index_dtype, 0), self.cps
        if self._cpu and self.splits == 1:
            axes = {lp.axis.uid: value for lp, value in self.outer if lp.axis is not None}
            lo, hi = chain_key_range(self.chain, self.fb.scope.child(axes=axes))
            if lo is not None:
                start = tirx.max(start, tirx.floordiv(lo, self.tc))
            if hi is not None:
                stop = tirx.min(stop, tirx.floordiv(hi, self.tc) + 1)
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
        deps = {n.name[:-len(".ref")] for n in nodes(e) if isinstance(n, Symbol)
                and n.name.endswith(".ref")}
        self._emit_row_references(deps)
        with self.fb.loops([t_loop]) as lv:
            with self._block(f"{self.chain.axis.name}_value{k}", [t_loop], lv,
                             [self._chunk_iter()], derive=self._j_of, predicate=self._in_range,
                             scope=self._scope(self.fb.scope)) as sc:
                inner = sc.child(symbols=self._position_symbols(sc, deps))
                self.fb.store(buf, lower_expr(e, inner, dtt.resolve(e.dtype)),
                              self._position_index(sc))
        return Symbol(f"__value{k}", e.dtype), buf

    def _hoist_row(self, correction: Expr, m: Compute) -> Expr:
        """``correction`` (of a state with feature axes) with its costly parts that do not read
        the state (attention's ``exp(m.old − m.new)``, with the references' guards) computed
        once per row and chunk into a buffer before the update, not once per feature: LLVM
        hoisted the one-compare guard itself, not the three-compare one of an overflowed maximum
        (a sliding window's fused kernel went from 32 to 45 ms without this)."""
        own = {f"{m.name}#{k}" for k in range(len(self.chain.schemes[m.name].states))}

        def replace(n: Expr):
            if not (isinstance(n, Unary) and n.op in COSTLY) or symbols_in(n) & own:
                return None
            if n.key() not in self.row_values:
                k = len(self.row_values)
                buf = self.fb.alloc(f"{m.name}_factor{k}",
                                    self._shape(self.common + self._split_dims()),
                                    dtt.resolve(n.dtype))
                with self._block(f"{m.name}_factor{k}", [], [], [self._chunk_iter()]) as sc:
                    deps = {}
                    for d in self.chain.schemes[m.name].deps:
                        deps[f"{d}.old"] = self._running(self.prev, 0)(d, sc)
                        deps[f"{d}.new"] = self._running(self.new, 1)(d, sc)
                    self.fb.store(buf, lower_expr(n, sc.child(symbols=deps),
                                                  dtt.resolve(n.dtype)),
                                  self._index(self.common, sc))
                self.row_values[n.key()] = Symbol(f"__row{k}", n.dtype), buf
            return self.row_values[n.key()][0]

        return substitute(correction, replace)

    def _row_symbols(self, sc: Scope) -> dict:
        """The per-row values of :meth:`_hoist_row`, by name."""
        return {h.name: tirx.BufferLoad(buf, self._index(self.common, sc))
                for h, buf in self.row_values.values()}

    def _position_index(self, sc: Scope) -> list:
        return self._index(self.common, sc) + [sc.axes[self.t_axis.uid]]

    def _position_symbols(self, sc: Scope, deps) -> dict:
        """What a block over a chunk's positions reads by name: the dependencies ``deps`` at
        their references after this chunk (``d.ref``; on the CPU from the row's buffer of
        :meth:`_emit_row_references`), and the per-position values hoisted so far."""
        symbols = {f"{d}.ref": tirx.BufferLoad(self.row_refs[d], self._index(self.common, sc))
                   if d in self.row_refs else self._running(self.new, 1)(d, sc) for d in deps}
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
            buf = self.fb.alloc(f"{d}_ref_row", self._shape(self.common + self._split_dims()),
                                member.dtypes[0])
            with self._block(f"{d}_ref_row", [], [], [self._chunk_iter()]) as sc:
                self.fb.store(buf, self._running(self.new, 1)(d, sc), self._index(self.common, sc))
            self.row_refs[d] = buf

    def _chunk_loops(self, extra: list, t_loop: LoopAxis) -> list:
        """A chunk's loops for a member with ``extra`` axes (attention's output features): on
        the CPU the positions outside and the features inside, the loop LLVM vectorises (a
        position's hoisted value read once for all features); elsewhere the positions inside
        (a reduction per feature)."""
        return [t_loop] + extra if self._cpu else extra + [t_loop]
