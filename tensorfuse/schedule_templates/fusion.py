"""Lower a program with fused chains of reductions: the IR behind rolling and split updates.

For a chain planned by :func:`tensorfuse.algebra.plan_chain`, the fused axis ``j`` is cut into
``splits`` independent parts, each swept in chunks of ``chunk`` elements. Per chunk, in dependency
order, every member gets

    {m}_chunk    the chunk's partial state:  ⊕_t body(x[c·T + t])   (dependencies at their new values)
    {m}_update   the running state:          correct(run; d.old → d.new) ⊕ chunk
    {m}_new      its new value, when later members depend on it
    {m}_commit   the value the next chunk starts from (d.old)

after ``{m}_init`` set everything to the monoid identities. With several splits, ``{m}_merge``
folds the splits' states, each corrected from its own dependency values to the final ones. The
final ``{m}`` block writes the member's usual buffer, so the rest of the program is unchanged.
Reductions over ``j`` that the members read are recomputed per chunk (``{x}_local``). Running
states and corrections are ordinary buffers and blocks: TVM's schedule primitives and MetaSchedule
apply afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx
from tvm.sym import Analyzer

from ..algebra import Chain, inline_elementwise, plan_chain
from ..algebra.schemes import EXTRAPOLATION, dependency_symbols, inexact_reset
from ..algebra.exprs import substitute
from ..dsl.expr import Axis, Expr, Symbol
from ..dsl.program import Compute, Program
from ..errors import RollingUpdateError
from ..lower_to_tir import FunctionBuilder, LoopAxis, Scope, emit_compute, lower_expr
from ..dsl import dtypes as dtt
from ..lower_to_tir.builder import olds_bound, results_bound
from ..lower_to_tir.expr_to_tir import cast_to, constant
from .fusion_cpu import LANES, CpuChunkLayout
from .fusion_order import ChainInputs, emission_order
from tvm.tirx.script.builder import ir as T


@dataclass(frozen=True)
class Fusion:
    """Compute the reductions ``names`` in one pass over ``axis``, in chunks of ``chunk`` elements,
    as ``splits`` independent parts merged at the end (``splits=1``: a rolling update). ``rows``:
    on the CPU, how many consecutive rows (of the chain's last common axis: attention's queries)
    one core sweeps together, chunk by chunk, so that each chunk of keys is read from memory once
    for all of them (:mod:`.fusion_cpu`); GPU templates tile rows their own way."""

    names: tuple[str, ...]
    axis: str
    chunk: int = 16
    splits: int = 1
    rows: int = 1
    held: bool = False   # members no correction carries held to one block (plan_chain, rows)

    def __post_init__(self):
        for name in ("chunk", "splits", "rows"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RollingUpdateError(f"{name} must be a positive integer, got {value!r}")

    def describe(self) -> str:
        names = ", ".join(self.names)
        if self.splits == 1:
            rows = f", rows={self.rows}" if self.rows != 1 else ""
            rows += ", held to one block" if self.held else ""
            return f"rolling_update({names}, axis={self.axis}, chunk={self.chunk}{rows})"
        return f"split_update({names}, axis={self.axis}, splits={self.splits}, chunk={self.chunk})"


def lower_with_fusions(program: Program, fusions, dims=None, index_dtype="int32",
                       parallel: str | None = None, accumulate: str | None = None,
                       vector_math: bool = False) -> tvm.IRModule:
    """TensorIR of ``program`` with ``fusions`` applied; ``parallel`` lays out the data-parallel
    loops, ``accumulate`` widens float sums, running states included (see
    :class:`~tensorfuse.lower_to_tir.FunctionBuilder`)."""
    chains = [plan_chain(program, f.names, f.axis) for f in fusions]   # never held: chunks
    if parallel == "gpu" and any(f.rows != 1 for f in fusions):
        raise RollingUpdateError("a block of rows (rows=…) is how the CPU sweeps a fused chain; "
                                 "GPU templates tile rows with their own knobs")
    owner: dict[str, int] = {}
    for k, ch in enumerate(chains):
        for m in ch.members:
            if m.name in owner:
                raise RollingUpdateError(f"{m.name} is fused twice")
            if why := inexact_reset(ch.schemes, m.name):   # a reset compares with values
                raise RollingUpdateError(why, m.loc)
            owner[m.name] = k
    analyses = [ChainInputs(ch) for ch in chains]
    order = emission_order(program, chains, analyses, owner)
    fb = FunctionBuilder(program, dims, index_dtype, parallel=parallel, accumulate=accumulate,
                         vector_math=vector_math)
    with fb:
        emitters = [_ChainEmitter(fb, ch, f, a) for ch, f, a in zip(chains, fusions, analyses)]
        for node in order:
            if isinstance(node, Compute) and not node.is_output:
                fb.alloc_compute(node)
        for em in emitters:
            for m in em.chain.members:
                if not m.is_output:
                    fb.alloc_compute(m)
            em.allocate()
        for node in order:
            if isinstance(node, Compute):
                emit_compute(fb, node)
            else:
                emitters[node].emit()
    mod = fb.finish()
    gv, func = next(iter(mod.functions.items()))
    func = func.with_attr(FUSED_ATTR, True)
    if parallel == "gpu":
        func = func.with_attr("tirx.is_scheduled", True)
    return tvm.IRModule({gv: func})


FUSED_ATTR = "tensorfuse.fused"  # marks functions whose loop nests hold fused chains


def dt_tvm(dtype: str) -> str:
    return dtt.to_tvm(dtype)


class _ChainEmitter(CpuChunkLayout):
    def __init__(self, fb: FunctionBuilder, chain: Chain, fusion: Fusion, inputs: ChainInputs):
        self.fb, self.chain, self.fusion = fb, chain, fusion
        self.local = inputs.local
        self.n = fb.extent(chain.axis)
        idx = fb.index_dtype
        self.tc = tirx.IntImm(idx, fusion.chunk)
        chunks = tirx.floordiv(self.n + self.tc - 1, self.tc)
        self.splits = fusion.splits
        self.cps = Analyzer().simplify(
            tirx.floordiv(chunks + self.splits - 1, self.splits))
        j = chain.axis.name  # helper loops are named after the fused axis: j_split, j_chunk, j_t
        self.split_axis = Axis(f"{j}_split", fusion.splits)
        self.chunk_axis = Axis(f"{j}_chunk", 1)
        self.t_axis = Axis(f"{j}_t", fusion.chunk)
        self.lane_axis = Axis(f"{j}_lane", LANES)            # CPU: a chunk's sums in lanes
        self.t_outer_axis = Axis(f"{j}_t_outer", max(fusion.chunk // LANES, 1))
        self.names = {"split": f"{j}_split", "chunk": f"{j}_chunk", "t": f"{j}_t"}
        self.common = list(chain.common_axes)
        self.needed_deps = [m.name for m in chain.members
                            if any(m.name in s.deps for s in chain.schemes.values())]

    # -- buffers -------------------------------------------------------------------------------
    def dtype_of(self, st) -> str:
        """The dtype a running state is kept in: its own, or the wider one float sums
        accumulate in on this target (``TargetSpec.accumulate``)."""
        return self.fb.accumulator(st.monoid, st.dtype)

    def _wide(self, name: str, e: Expr) -> Expr:
        """A scheme's expression with its states read in the dtype they are kept in (so that
        corrections of a widened sum are computed in the wider dtype, not rounded first)."""
        states = self.chain.schemes[name].states
        wide = {f"{name}#{k}": self.dtype_of(st) for k, st in enumerate(states)
                if self.dtype_of(st) != st.dtype}
        if not wide:
            return e
        return substitute(e, lambda n: Symbol(n.name, wide[n.name])
                          if isinstance(n, Symbol) and n.name in wide else None)

    def state_axes(self, c: Compute) -> list[Axis]:
        return self.common + [a for a in c.axes if all(a.uid != b.uid for b in self.common)]

    def _split_dims(self):
        return [self.split_axis] if self.splits > 1 else []

    def _shape(self, axes) -> list:
        return [self._extent(a) for a in axes]

    def _extent(self, a: Axis):
        if a is self.split_axis:
            return tirx.IntImm(self.fb.index_dtype, self.splits)
        if a is self.t_axis:
            return self.tc
        return self.fb.extent(a)

    def local_axes(self, x: Compute) -> list[Axis]:
        j = self.chain.axis
        rest = [a for a in x.axes if a.uid != j.uid and all(a.uid != b.uid for b in self.common)]
        return self.common + rest + [self.t_axis]

    def allocate(self) -> None:
        fb, split = self.fb, self._split_dims()
        self.run, self.part, self.prev, self.new, self.merged = {}, {}, {}, {}, {}
        for m in self.chain.members:
            scheme = self.chain.schemes[m.name]
            axes = self.state_axes(m) + split
            self.run[m.name] = [fb.alloc(f"{m.name}{st.suffix}_run", self._shape(axes),
                                         self.dtype_of(st)) for st in scheme.states]
            # a chunk's partial sums stay in the state's own dtype (a few dozen terms); the
            # running states, which add up every chunk, in the wider one where there is one
            self.part[m.name] = [fb.alloc(f"{m.name}{st.suffix}_chunk", self._shape(axes),
                                          st.dtype) for st in scheme.states]
            if m.name in self.needed_deps:
                trivial = not scheme.deps and isinstance(scheme.value[0], Symbol) and \
                    scheme.value[0].name == f"{m.name}#0"
                # a member whose value is its state commits the state itself, in its dtype
                prev_dtype = self.dtype_of(scheme.states[0]) if trivial else m.dtypes[0]
                self.prev[m.name] = fb.alloc(f"{m.name}_prev", self._shape(axes), prev_dtype)
                self.new[m.name] = self.run[m.name][0] if trivial else fb.alloc(
                    f"{m.name}_new", self._shape(axes), m.dtypes[0])
            if self.splits > 1:
                self.merged[m.name] = [fb.alloc(f"{m.name}{st.suffix}_merged",
                                                self._shape(self.state_axes(m)), self.dtype_of(st))
                                       for st in scheme.states]
        self.local_bufs = {}
        for x in self.local:
            shape = self._shape(self.local_axes(x) + split)
            self.local_bufs[x.name] = [fb.alloc(f"{n}_local", shape, d)
                                       for n, d in zip(x.buffer_names(), x.dtypes)]

    # -- indexing ------------------------------------------------------------------------------
    def _index(self, axes, scope: Scope, with_split: bool = True) -> list:
        out = [scope.axes[a.uid] for a in axes]
        if with_split and self.splits > 1:
            out.append(scope.axes[self.split_axis.uid])
        return out

    def _scope(self, base: Scope) -> Scope:
        """A scope where chunk-local reductions read their per-chunk buffers."""
        computes, index = {}, {}
        for x in self.local:
            computes[x.name] = self.local_bufs[x.name]
            index[x.name] = (lambda axes: lambda s: self._index(axes, s))(self.local_axes(x))
        return base.child(computes=computes, compute_index=index)

    # -- loops ---------------------------------------------------------------------------------
    def _loops(self, axes, kind="S") -> list[LoopAxis]:
        return [LoopAxis(a, self._extent(a), a.name, kind) for a in axes]

    def _j_of(self, v) -> dict:
        """The fused axis' value from the split, chunk and position block variables."""
        n = self.names
        split = v[n["split"]] if self.splits > 1 else 0
        return {self.chain.axis.uid: (split * self.cps + v[n["chunk"]]) * self.tc + v[n["t"]]}

    def _in_range(self, v):
        return self._j_of(v)[self.chain.axis.uid] < self.n

    # -- emission ------------------------------------------------------------------------------
    def emit(self) -> None:
        outer = self._loops(self.common + self._split_dims())
        with self._row_loops(outer):
            self._emit_init()
            with self._chunk_range() as cv:
                self.chunk_var = cv
                self.hoisted, self.row_refs, self.row_values = {}, {}, {}
                for x in self.local:
                    self._emit_local(x)
                for m in self.chain.members:
                    self._emit_chunk(m)
                    self._emit_update(m)
                    if m.name in self.needed_deps and self.new[m.name] is not self.run[m.name][0]:
                        self._emit_new(m)
                for name in self.needed_deps:
                    self._emit_commit(name)
            if self.splits == 1:
                for m in self.chain.members:
                    # the running states are relative to the last committed references
                    self._emit_final(m, self.run[m.name], with_split=False,
                                     references=self._part_reference)
        if self.splits > 1:
            for m in self.chain.members:
                self._emit_merge(m)
                self._emit_final(m, self.merged[m.name], with_split=False,
                                 references=self._final_reference, own_loops=True)

    def _block(self, name, extra_loops, extra_vars, more_iters=(), derive=None, predicate=None,
               scope=None):
        iters = list(self.outer) + list(zip(extra_loops, extra_vars)) + list(more_iters)
        guard = self.outer_pred
        if guard is not None and predicate is not None:
            combined = lambda bound: tirx.And(guard, predicate(bound))  # noqa: E731
        elif guard is not None:
            combined = lambda bound: guard  # noqa: E731
        else:
            combined = predicate
        return self.fb.block(name, iters, scope or self.fb.scope, derive, combined)

    def _extra_axes(self, c: Compute) -> list[Axis]:
        return [a for a in c.axes if all(a.uid != b.uid for b in self.common)]

    def _emit_init(self) -> None:
        for m in self.chain.members:
            scheme = self.chain.schemes[m.name]
            loops = self._loops(self._extra_axes(m))
            with self._stage_loops(loops) as lv:
                with self._block(f"{m.name}_init", loops, lv) as sc:
                    idx = self._index(self.state_axes(m), sc)
                    identities = {}
                    for k, (buf, st) in enumerate(zip(self.run[m.name], scheme.states)):
                        dtype = self.dtype_of(st)
                        value = constant(st.monoid.identity_value(0 if m.arity == 1 else k, dtype),
                                         dtype)
                        self.fb.store(buf, value, idx)
                        identities[f"{m.name}#{k}"] = value
                    if m.name in self.prev:
                        if self._trivial(m.name):
                            init = identities[f"{m.name}#0"]
                        else:
                            seen = self._seen(sc, 0)
                            deps = {f"{d}.new": self._stored_reference(
                                d, self._load(self.prev[d], d, sc), seen, sc)
                                for d in scheme.deps}
                            init = self._reference(m.name, identities, deps, seen, sc)
                        self.fb.store(self.prev[m.name], init, idx)

    def _load(self, buf, member_name: str, scope: Scope, with_split: bool = True):
        """``buf`` (indexed like ``member_name``'s states) at the current iteration."""
        member = self.chain.members[[m.name for m in self.chain.members].index(member_name)]
        return tirx.BufferLoad(buf, self._index(self.state_axes(member), scope, with_split))

    def _chunk_iter(self, kind: str = "O"):
        """The chunk index as a block variable (opaque: the chunks are swept in order)."""
        return LoopAxis(self.chunk_axis, self.cps, self.names["chunk"], kind), self.chunk_var

    def _seen(self, sc: Scope, chunks_done) -> tirx.PrimExpr:
        """How many positions of the fused axis this part has covered after ``chunks_done``
        chunks (an expression of the chunk block variable, or ``None``: the whole part)."""
        split = sc.axes[self.split_axis.uid] if self.splits > 1 else 0
        start = split * self.cps * self.tc
        done = self.cps if chunks_done is None else chunks_done
        return tirx.max(tirx.min((split * self.cps + done) * self.tc, self.n) - start, 0)

    def _emit_local(self, x: Compute) -> None:
        rest = [a for a in self.local_axes(x)[len(self.common):-1]]
        spatial = self._loops(rest) + [LoopAxis(self.t_axis, self.tc, self.names["t"])]
        self._emit_identities(f"{x.name}_local_init", spatial, self.local_bufs[x.name], x.monoid,
                              x.dtypes, self.local_axes(x))
        over = self._loops(list(x.over), "R")
        # on the CPU the chunk's positions innermost, for LLVM to vectorise (the operand read
        # along the reduction gets a transposed copy: cpu.rolled_schedule)
        loops = spatial[:-1] + over + spatial[-1:] if self._cpu else spatial + over
        with self._stage_loops(loops) as lv:
            with self._block(f"{x.name}_local", loops, lv, [self._chunk_iter()],
                             derive=self._j_of, predicate=self._in_range,
                             scope=self._scope(self.fb.scope)) as sc:
                bodies = [inline_elementwise(b) for b in x.bodies]
                idx = self._index(self.local_axes(x), sc)
                self.fb.emit_update(x.monoid, self.local_bufs[x.name], idx, bodies, sc, False,
                                    x.dtypes)

    def _emit_identities(self, name, loops, bufs, monoid, dtypes, axes) -> None:
        """Set ``bufs`` to the monoid's identity for this chunk. A separate block, not ``T.init``:
        the reduction after it is guarded by the range predicate, which would also skip an init
        of a chunk past the end (possible with splits)."""
        with self._stage_loops(loops) as lv:
            with self._block(name, loops, lv, [self._chunk_iter()]) as sc:
                idx = self._index(axes, sc)
                for k, (buf, d) in enumerate(zip(bufs, dtypes)):
                    self.fb.store(buf, constant(monoid.identity_value(k, d), d), idx)

    def _emit_chunk(self, m: Compute) -> None:
        scheme = self.chain.schemes[m.name]
        extra = self._loops(self._extra_axes(m))
        t_loop = LoopAxis(self.t_axis, self.tc, self.names["t"], "R")
        scope = self._scope(self.fb.scope)
        groups = [list(range(len(scheme.states)))] if scheme.kind == "independent" and m.arity > 1 \
            else [[k] for k in range(len(scheme.states))]
        for group in groups:
            st = scheme.states[group[0]]
            name = f"{m.name}{st.suffix if len(group) == 1 else ''}_chunk"
            monoid = m.monoid if len(group) > 1 else st.monoid
            bufs = [self.part[m.name][k] for k in group]
            dtypes = [scheme.states[k].dtype for k in group]
            self._emit_identities(f"{name}_init", extra, bufs, monoid, dtypes, self.state_axes(m))
            bodies = [dependency_symbols(scheme.states[k].body,
                                         {c.name for c in self.chain.members}, scheme)
                      for k in group]
            if self._cpu:
                bodies = [self._hoist(b, m) for b in bodies]
            if self._cpu and not extra and len(group) == 1 and self._fits_lanes(monoid):
                self._emit_in_lanes(name, m, monoid, bufs, dtypes[0], bodies[0], scope)
                continue
            loops = self._chunk_loops(extra, t_loop)
            self._emit_row_references(scheme.deps)
            with self._stage_loops(loops) as lv:
                with self._block(name, loops, lv, [self._chunk_iter()],
                                 derive=self._j_of, predicate=self._in_range, scope=scope) as sc:
                    idx = self._index(self.state_axes(m), sc)
                    refs = self._position_symbols(sc, scheme.deps)
                    self.fb.emit_update(monoid, bufs, idx, bodies, sc.child(symbols=refs), False,
                                        dtypes)

    def _symbols(self, m: Compute, sc: Scope, states, with_split: bool, old, new) -> dict:
        """Symbols of a scheme's expressions: its states (``m#k``) read from ``states``, and each
        dependency's old and new value read by ``old(d, scope)`` / ``new(d, scope)``."""
        scheme = self.chain.schemes[m.name]
        idx = self._index(self.state_axes(m), sc, with_split)
        symbols = {f"{m.name}#{k}": tirx.BufferLoad(b, idx) for k, b in enumerate(states)}
        for d in scheme.deps:
            symbols[f"{d}.old"] = old(d, sc)
            symbols[f"{d}.new"] = new(d, sc)
        return symbols

    def _running(self, bufs: dict, done: int):
        """Loader of a dependency's reference value from ``bufs``, valid after the current chunk
        (``done=1``) or the previous one (``done=0``)."""
        def load(d, sc):
            return self._stored_reference(d, self._load(bufs[d], d, sc),
                                          self._seen(sc, sc.axes[self.chunk_axis.uid] + done), sc)

        return load

    def _part_reference(self, d: str, sc: Scope):
        """A split's final reference value of ``d`` (from its committed value)."""
        return self._stored_reference(d, self._load(self.prev[d], d, sc), self._seen(sc, None),
                                      sc)

    def _final(self, d: str, sc: Scope):
        """Loader of a dependency's final value (its ordinary buffer)."""
        member = self._member(d)
        return tirx.BufferLoad(self.fb.scope.computes[d][0], [sc.axes[a.uid] for a in member.axes])

    def _final_reference(self, d: str, sc: Scope):
        """A dependency's final value as a reference (0 where it is no usable one)."""
        member = self._member(d)
        final = Symbol("__final", member.dtypes[0])
        return lower_expr(self.chain.schemes[d].usable(final),
                          sc.child(symbols={"__final": self._final(d, sc)}), member.dtypes[0])

    def _member(self, name: str) -> Compute:
        return next(m for m in self.chain.members if m.name == name)

    def _trivial(self, d: str) -> bool:
        """Whether ``d``'s value is its single running state (no buffer of its own)."""
        return self.new[d] is self.run[d][0]

    def _stored_reference(self, d: str, value, seen, scope: Scope):
        """The reference of ``d`` from what its ``_new``/``_prev`` buffers hold: the reference
        itself, or for a member whose value is its running state, that state turned into one."""
        if not self._trivial(d):
            return value
        return self._reference(d, {f"{d}#0": value}, {}, seen, scope)

    def _reference(self, d: str, states: dict, deps: dict, seen, scope: Scope):
        """The value states are kept relative to (:meth:`~tensorfuse.algebra.Scheme.reference`):
        the value formula with running sums extrapolated to the whole axis (× N / seen) and the
        dependencies at their references, so a mean is estimated as the running mean (Welford's
        centring) whether it is written ``Σ y / N`` or ``Σ y / Σ 1``; 0 where that is no usable
        reference (a maximum that has seen nothing real, an overflow).
        ``states``/``deps``: the symbols ``d#k`` and ``e.new``."""
        dtype = self._member(d).dtypes[0]
        scale = tirx.Cast(dt_tvm(dtype), self.n) / tirx.Cast(dt_tvm(dtype), tirx.max(seen, 1))
        symbols = {**states, **deps, EXTRAPOLATION.name: scale}
        return lower_expr(self._wide(d, self.chain.schemes[d].reference()),
                          scope.child(symbols=symbols), dtype)

    def _exact(self, bufs: dict):
        """Loader of a reset's dependency's running value from ``bufs`` (``_prev``: before this
        chunk, or a part's; ``_new``: after it): its state (``inexact_reset``)."""
        return lambda d, sc: self._load(bufs[d], d, sc)

    def _emit_update(self, m: Compute) -> None:
        scheme = self.chain.schemes[m.name]
        extra = self._loops(self._extra_axes(m))
        corrections = [self._wide(m.name, c) for c in scheme.correct]
        if self._cpu and extra:
            corrections = [self._hoist_row(c, m) for c in corrections]
        with self._stage_loops(extra) as lv:
            with self._block(f"{m.name}_update", extra, lv, [self._chunk_iter("R")]) as sc:
                idx = self._index(self.state_axes(m), sc)
                old, new = (self._exact(self.prev), self._exact(self.new)) \
                    if scheme.kind == "reset" else \
                    (self._running(self.prev, 0), self._running(self.new, 1))
                symbols = self._symbols(m, sc, self.run[m.name], True, old, new)
                names = [f"{m.name}#{k}" for k in range(len(self.run[m.name]))]
                loads, bound = olds_bound([symbols[n] for n in names],
                                          [self.dtype_of(st) for st in scheme.states])
                symbols.update(zip(names, loads))   # every state updated from the old values
                inner = sc.child(symbols={**symbols, **self._row_symbols(sc)})
                results = []
                if scheme.kind == "independent" and m.arity > 1:
                    olds = [Symbol(f"{m.name}#{k}", d) for k, d in enumerate(m.dtypes)]
                    news = [Symbol(f"__chunk{k}", d) for k, d in enumerate(m.dtypes)]
                    combined = m.monoid.combine_exprs(olds, news)
                    chunk_syms = {f"__chunk{k}": tirx.BufferLoad(b, idx)
                                  for k, b in enumerate(self.part[m.name])}
                    scope2 = inner.child(symbols=chunk_syms)
                    results = [lower_expr(c, scope2, d) for c, d in zip(combined, m.dtypes)]
                else:
                    for k, st in enumerate(scheme.states):
                        corrected = Symbol("__corrected", self.dtype_of(st))
                        chunk = Symbol("__chunk", self.dtype_of(st))
                        combined = st.monoid.combine_exprs([corrected], [chunk])[0]
                        scope2 = inner.child(symbols={
                            "__corrected": lower_expr(corrections[k], inner,
                                                      self.dtype_of(st)),
                            "__chunk": cast_to(tirx.BufferLoad(self.part[m.name][k], idx),
                                               self.dtype_of(st))})
                        results.append(lower_expr(combined, scope2, self.dtype_of(st)))
                for buf, r in zip(self.run[m.name], results_bound(results, bound)):
                    self.fb.store(buf, r, idx)

    def _emit_new(self, m: Compute) -> None:
        scheme = self.chain.schemes[m.name]
        extra = self._loops(self._extra_axes(m))
        with self._stage_loops(extra) as lv:
            with self._block(f"{m.name}_new", extra, lv, [self._chunk_iter()]) as sc:
                # the states are kept relative to the dependencies' references: the reference of
                # this member is the value formula at those references, extrapolated
                idx = self._index(self.state_axes(m), sc)
                states = {f"{m.name}#{k}": tirx.BufferLoad(b, idx)
                          for k, b in enumerate(self.run[m.name])}
                deps = {f"{d}.new": self._running(self.new, 1)(d, sc) for d in scheme.deps}
                seen = self._seen(sc, sc.axes[self.chunk_axis.uid] + 1)
                self.fb.store(self.new[m.name], self._reference(m.name, states, deps, seen, sc),
                              idx)

    def _emit_commit(self, name: str) -> None:
        m = self.chain.members[[x.name for x in self.chain.members].index(name)]
        extra = self._loops(self._extra_axes(m))
        with self._stage_loops(extra) as lv:
            with self._block(f"{name}_commit", extra, lv, [self._chunk_iter()]) as sc:
                self.fb.store(self.prev[name], self._load(self.new[name], name, sc),
                              self._index(self.state_axes(m), sc))

    def _emit_final(self, m: Compute, states, with_split: bool, references,
                    own_loops: bool = False) -> None:
        """The member's output from ``states``, corrected from the references they are kept
        relative to (``references``: the last committed ones after a rolling sweep, the final
        values' own after the split merge, which corrects to those) to the dependencies' true
        values. The two
        differ when a dependency's true value is an identity its reference replaced (a row whose
        masked max saw nothing): a dependent sum's true value is then computed from −FLT_MAX,
        its reference from 0."""
        scheme = self.chain.schemes[m.name]
        if own_loops:
            with self.fb.spatial_loops(self._loops(self.state_axes(m))) as (outer, pred):
                saved = self.outer, self.outer_pred
                self.outer, self.outer_pred = outer, pred
                self._emit_final(m, states, with_split, references)
                self.outer, self.outer_pred = saved
            return
        loops = self._loops(self._extra_axes(m))
        out = self.fb.scope.computes[m.name]
        # a reset state was corrected with the exact values chunk by chunk (and merged at the
        # final ones): it is the value
        values = [self._wide(m.name, scheme.value[k] if scheme.kind == "reset" else
                             scheme.true_value(k, settled=True)) for k in range(len(out))]
        self.row_values = {}
        if self._cpu and loops and self.splits == 1:   # per-row factors once per row
            values = [self._hoist_row(v, m, references, self._final, final=True) for v in values]
        with self._stage_loops(loops) as lv:
            with self._block(m.name, loops, lv) as sc:
                symbols = self._symbols(m, sc, states, with_split, references, self._final)
                inner = sc.child(symbols={**symbols, **self._row_symbols(sc)})
                idx = [sc.axes[a.uid] for a in m.axes]
                for buf, d, value in zip(out, m.dtypes, values):
                    self.fb.store(buf, lower_expr(value, inner, d), idx)

    def _emit_merge(self, m: Compute) -> None:
        scheme = self.chain.schemes[m.name]
        split = [LoopAxis(self.split_axis, self._extent(self.split_axis), self.names["split"], "R")]
        with self.fb.spatial_loops(self._loops(self.state_axes(m))) as (outer, pred):
            saved = self.outer, self.outer_pred
            self.outer, self.outer_pred = outer, pred
            self._emit_merge_block(m, scheme, split)
            self.outer, self.outer_pred = saved

    def _emit_merge_block(self, m: Compute, scheme, split) -> None:
        with self.fb.loops(split) as lv:
            with self._block(f"{m.name}_merge", split, lv) as sc:
                idx = self._index(self.state_axes(m), sc, with_split=False)
                old, new = (self._exact(self.prev), self._final) if scheme.kind == "reset" \
                    else (self._part_reference, self._final_reference)
                symbols = self._symbols(m, sc, self.run[m.name], True, old, new)
                inner = sc.child(symbols=symbols)
                if scheme.kind == "independent":
                    bodies = [Symbol(f"{m.name}#{k}", self.dtype_of(st))
                              for k, st in enumerate(scheme.states)]
                    monoid = m.monoid
                    self.fb.emit_update(monoid, self.merged[m.name], idx, bodies, inner, True,
                                        [self.dtype_of(st) for st in scheme.states])
                else:
                    with T.init():
                        for k, (buf, st) in enumerate(zip(self.merged[m.name], scheme.states)):
                            dtype = self.dtype_of(st)
                            self.fb.store(buf, constant(st.monoid.identity_value(0, dtype), dtype),
                                          idx)
                    results = []
                    # every state merged from the old values, bound before the stores
                    accs, bound = olds_bound([tirx.BufferLoad(b, idx)
                                              for b in self.merged[m.name]],
                                             [self.dtype_of(st) for st in scheme.states])
                    for k, st in enumerate(scheme.states):
                        acc = Symbol("__acc", self.dtype_of(st))
                        item = Symbol("__item", self.dtype_of(st))
                        combined = st.monoid.combine_exprs([acc], [item])[0]
                        scope2 = inner.child(symbols={
                            "__acc": accs[k],
                            "__item": lower_expr(self._wide(m.name,
                                                            scheme.corrections(settled=True)[k]),
                                                 inner,
                                                 self.dtype_of(st))})
                        results.append(lower_expr(combined, scope2, self.dtype_of(st)))
                    for buf, r in zip(self.merged[m.name], results_bound(results, bound)):
                        self.fb.store(buf, r, idx)
