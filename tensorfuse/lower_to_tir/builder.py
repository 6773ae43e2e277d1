"""Build a TensorIR ``PrimFunc`` for a program with TVM's IR builder: the function signature, buffers,
and the loop nests and ``sblock``s that compute values.

Blocks are written in schedulable (s_tir) form: iteration variables declared spatial or reduce,
``T.init`` for reductions, read/write regions completed by TVM. Every lowering in tensorfuse (the
naive one and the rolled and split ones) is made of the pieces here.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Sequence

import tvm
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script.builder import ir as T

from ..dsl import dtypes as dt
from ..dsl.expr import Axis, Expr, Symbol
from ..dsl.program import Compute, Program, TensorParam
from .expr_to_tir import Scope, cast_to, constant, lower

# sums of up to this many terms (known when the IR is made) keep their dtype on the CPU too
SHORT_SUM = 256


@dataclass
class LoopAxis:
    """One loop of a nest: which DSL axis it runs (``None`` for helper loops such as chunk
    indices), its extent, its name and the kind of block variable it drives."""

    axis: Axis | None
    extent: tirx.PrimExpr
    name: str
    kind: str = "S"  # block iteration variable: "S" spatial, "R" reduce, "O" opaque


def lower_size(expr: Expr, scope: Scope) -> tirx.PrimExpr:
    """A derived size (``Program.derived_sizes``) as an expression of the sizes it reads, in the
    index type: a buffer shaped by it matches the arrays the call passes."""
    return cast_to(lower(expr, scope), "i64" if scope.index_dtype == "int64" else "i32")


class FunctionBuilder:
    """Open a PrimFunc for ``program``; emit its body with the methods below, then :meth:`finish`."""

    def __init__(self, program: Program, dims: dict[str, int] | None = None,
                 index_dtype: str = "int32", name: str | None = None, parallel: str | None = None,
                 threads: int = 128, accumulate: str | None = None, vector_math: bool = False):
        """``parallel``: how loops over data-parallel axes are laid out (:meth:`spatial_loops`):
        ``None`` serial (to be scheduled later), ``"cpu"`` the outermost one parallel, ``"gpu"``
        all of them fused and bound to ``blockIdx.x`` × ``threadIdx.x`` (``threads`` a block).
        ``accumulate``: the dtype narrower float sums accumulate in (``TargetSpec.accumulate``;
        None: their own). ``vector_math``: elementary functions in forms the CPU's vector units
        run (``TargetSpec.vector_math``; :mod:`tensorfuse.lower_to_tir.vector_math`)."""
        self.program = program
        self.parallel = parallel
        self.accumulate = accumulate
        self.threads = threads
        self.dim_values = dict(dims or {})
        self.index_dtype = index_dtype
        self.name = name or program.name
        self._stack = contextlib.ExitStack()
        self._ib = IRBuilder()
        self.scope = Scope(index_dtype=index_dtype, vector_math=vector_math)
        self.output_buffers: dict[str, tirx.Buffer] = {}

    # -- signature -------------------------------------------------------------------------------
    def __enter__(self) -> "FunctionBuilder":
        self._stack.enter_context(self._ib)
        self._stack.enter_context(T.prim_func(s_tir=True))
        T.func_name(self.name)
        T.func_attr({"tirx.noalias": True})
        derived = self.program.derived_sizes()
        for d in self.program.dim_names():
            value = self.dim_values.get(d)
            if value is None and d in derived:   # after its inputs (dim_names' order)
                self.scope.dims[d] = lower_size(derived[d], self.scope)
                continue
            self.scope.dims[d] = (tirx.Var(d, self.index_dtype) if value is None
                                  else tirx.IntImm(self.index_dtype, int(value)))
        for p in self.program.params:
            if isinstance(p, TensorParam):
                handle = T.arg(p.name, T.handle())
                shape = [self.dim(d) for d in p.dims]
                buf = T.match_buffer(handle, shape, dt.to_tvm(p.dtype), layout=None)
                self.scope.params[p.name] = IRBuilder.name(p.name, buf)
            else:
                self.scope.scalars[p.name] = T.arg(p.name, tirx.Var(p.name, dt.to_tvm(p.dtype)))
        for c in self.program.outputs:
            handle = T.arg(c.name, T.handle())
            buf = T.match_buffer(handle, self.shape(c.axes), dt.to_tvm(c.dtypes[0]), layout=None)
            self.output_buffers[c.name] = IRBuilder.name(c.name, buf)
            self.scope.computes[c.name] = [self.output_buffers[c.name]]
        return self

    def __exit__(self, *exc) -> None:
        self._stack.__exit__(*exc)

    def finish(self) -> tvm.IRModule:
        self._stack.close()
        func = self._ib.get()
        return tvm.IRModule({self.name: func})

    # -- sizes and buffers ---------------------------------------------------------------------
    def dim(self, d) -> tirx.PrimExpr:
        return tirx.IntImm(self.index_dtype, d) if isinstance(d, int) else self.scope.dims[d]

    def extent(self, axis: Axis) -> tirx.PrimExpr:
        return self.dim(axis.extent)

    def shape(self, axes: Sequence[Axis]) -> list[tirx.PrimExpr]:
        return [self.extent(a) for a in axes]

    def accumulator(self, monoid, dtype: str, terms: int | None = None) -> str:
        """The dtype a reduction of ``monoid`` producing ``dtype`` accumulates in. A sum of at
        most :data:`SHORT_SUM` terms known here (``terms``: a dot product over a head
        dimension) keeps its own dtype: f32 loses nothing measurable there, and the CPU runs it
        at twice the rate of f64."""
        if self.accumulate and monoid.name == "sum" and dt.is_float(dtype) and \
                dt.wider(self.accumulate, dtype) and (terms is None or terms > SHORT_SUM):
            return self.accumulate
        return dtype

    def static_terms(self, axes: Sequence[Axis]) -> int | None:
        """How many terms a reduction over ``axes`` has, where every size is known here."""
        sizes = [self.extent(a) for a in axes]
        if not all(isinstance(n, tirx.IntImm) for n in sizes):
            return None
        return math.prod(n.value for n in sizes)

    def alloc(self, name: str, shape, dtype: str, scope: str = "global") -> tirx.Buffer:
        buf = T.sblock_alloc_buffer(list(shape), dt.to_tvm(dtype), scope=scope, layout=None)
        return IRBuilder.name(name, buf)

    def alloc_compute(self, compute: Compute, axes: Sequence[Axis] | None = None,
                      prefix: str = "", scope: str = "global") -> list[tirx.Buffer]:
        """Buffers for an intermediate compute (one per component), registered in the scope."""
        axes = compute.axes if axes is None else axes
        bufs = [self.alloc(prefix + n, self.shape(axes), d, scope)
                for n, d in zip(compute.buffer_names(), compute.dtypes)]
        self.scope.computes[compute.name] = bufs
        return bufs

    # -- loop nests and blocks ----------------------------------------------------------------
    @contextlib.contextmanager
    def loops(self, loops: Sequence[LoopAxis]):
        """Open a serial loop per entry; yields the loop variables."""
        if not loops:
            yield []
            return
        with T.grid(*[lp.extent for lp in loops]) as loop_vars:
            loop_vars = list(loop_vars) if len(loops) > 1 else [loop_vars]
            for lp, v in zip(loops, loop_vars):
                IRBuilder.name(lp.name, v)
            yield list(loop_vars)

    @contextlib.contextmanager
    def spatial_loops(self, loops: Sequence[LoopAxis]):
        """Loops over data-parallel axes laid out for the builder's ``parallel`` mode. Yields
        ``(iters, predicate)``: ``(loop axis, value)`` pairs for :meth:`block`, and a predicate
        every block inside must carry (``None`` when all iterations are real)."""
        if self.parallel is None or (self.parallel == "cpu" and not loops):
            with self.loops(loops) as lv:
                yield list(zip(loops, lv)), None
        elif self.parallel == "cpu":   # every data-parallel loop: rows of all batches and heads
            total = loops[0].extent
            for lp in loops[1:]:
                total = total * lp.extent
            with T.parallel(0, total) as fused:
                IRBuilder.name("_".join(lp.name for lp in loops), fused)
                yield list(zip(loops, self._unfused(fused, loops))), None
        else:
            total = tirx.IntImm(self.index_dtype, 1)
            for lp in loops:
                total = total * lp.extent
            threads = tirx.IntImm(self.index_dtype, self.threads)
            with T.thread_binding(0, tirx.floordiv(total + threads - 1, threads),
                                  thread="blockIdx.x") as bx:
                IRBuilder.name("bx", bx)
                with T.thread_binding(0, threads, thread="threadIdx.x") as tx:
                    IRBuilder.name("tx", tx)
                    fused = bx * threads + tx
                    yield list(zip(loops, self._unfused(fused, loops))), fused < total

    def _unfused(self, fused, loops: Sequence[LoopAxis]) -> list:
        """Each loop's value from the index ``fused`` of their fused loop (the last fastest)."""
        if len(loops) == 1:
            return [fused]
        values, stride = [], tirx.IntImm(self.index_dtype, 1)
        for lp in reversed(loops):
            values.append(tirx.floormod(tirx.floordiv(fused, stride), lp.extent))
            stride = stride * lp.extent
        return list(reversed(values))

    @contextlib.contextmanager
    def block(self, name: str, iters: Sequence[tuple[LoopAxis, tirx.PrimExpr]], scope: Scope,
              derive=None, predicate=None):
        """Open an ``sblock`` with one iteration variable per ``(loop axis, bound value)``; yields a
        scope in which the DSL axes mean the block variables. ``derive(vars)`` may map further DSL
        axes to expressions of the block variables (by loop name); ``predicate(values)`` guards
        the block (``T.where``), written over the bound values (the loop variables)."""
        kinds = {"S": T.axis.spatial, "R": T.axis.reduce, "O": T.axis.opaque}
        with T.sblock(name):
            mapping, by_name, bound = {}, {}, {}
            for lp, value in iters:
                bv = kinds[lp.kind](lp.extent, value)
                IRBuilder.name("v_" + lp.name, bv)
                by_name[lp.name], bound[lp.name] = bv, value
                if lp.axis is not None:
                    mapping[lp.axis.uid] = bv
            if derive is not None:
                mapping.update(derive(by_name))
            if predicate is not None:
                T.where(predicate(bound))
            yield scope.child(axes=mapping)

    def store(self, buf: tirx.Buffer, value: tirx.PrimExpr, indices) -> None:
        T.buffer_store(buf, value, list(indices))

    def emit_update(self, monoid, bufs: Sequence[tirx.Buffer], indices, bodies: Sequence[Expr],
                    scope: Scope, with_init: bool, dtypes: Sequence[str]) -> None:
        """``bufs[indices] = bufs[indices] ⊕ bodies`` (with ``T.init`` to the identity if asked)."""
        if with_init:
            with T.init():
                for k, (buf, d) in enumerate(zip(bufs, dtypes)):
                    self.store(buf, constant(monoid.identity_value(k, d), d), indices)
        new_values = [lower(b, scope, d) for b, d in zip(bodies, dtypes)]
        self.emit_combine(monoid, bufs, indices, new_values, scope, dtypes)

    def emit_combine(self, monoid, bufs, indices, new_values, scope: Scope, dtypes) -> None:
        """Store ``bufs[indices] ⊕ new_values`` into ``bufs[indices]``."""
        olds = [Symbol(f"__old{k}", d) for k, d in enumerate(dtypes)]
        news = [Symbol(f"__new{k}", d) for k, d in enumerate(dtypes)]
        combined = monoid.combine_exprs(olds, news)
        loads, bound = olds_bound([tirx.BufferLoad(b, list(indices)) for b in bufs], dtypes)
        symbols = {s.name: v for s, v in zip(olds, loads)}
        symbols.update({s.name: v for s, v in zip(news, new_values)})
        inner = scope.child(symbols=symbols)
        results = results_bound([lower(c, inner, d) for c, d in zip(combined, dtypes)], bound)
        for buf, r in zip(bufs, results):
            self.store(buf, r, indices)


def emit_compute(fb: FunctionBuilder, compute: Compute, scope: Scope | None = None,
                 name: str | None = None) -> None:
    """One loop nest and one block computing ``compute`` in full (a sum that accumulates in a
    wider dtype: a block reducing into an accumulator, then ``{name}_store`` rounding it)."""
    scope = scope or fb.scope
    bufs = scope.computes[compute.name]
    accumulator = fb.accumulator(compute.monoid, compute.dtypes[0],
                                 fb.static_terms(compute.over)) if compute.is_reduction else None
    if compute.is_reduction and compute.arity == 1 and accumulator != compute.dtypes[0]:
        acc = fb.alloc(f"{compute.name}_acc", fb.shape(compute.axes), accumulator)
        _emit_reduction(fb, compute, scope, name, [acc], [accumulator])
        spatial = [LoopAxis(a, fb.extent(a), a.name, "S") for a in compute.axes]
        with fb.spatial_loops(spatial) as (outer, predicate):
            with fb.block(f"{name or compute.name}_store", outer, scope,
                          predicate=(lambda _: predicate) if predicate is not None else None) \
                    as inner:
                indices = [inner.axes[a.uid] for a in compute.axes]
                fb.store(bufs[0], cast_to(tirx.BufferLoad(acc, indices), compute.dtypes[0]),
                         indices)
        return
    _emit_reduction(fb, compute, scope, name, bufs, compute.dtypes)


def _emit_reduction(fb: FunctionBuilder, compute: Compute, scope: Scope, name: str | None, bufs,
                    dtypes) -> None:
    spatial = [LoopAxis(a, fb.extent(a), a.name, "S") for a in compute.axes]
    reduce = [LoopAxis(a, fb.extent(a), a.name, "R") for a in compute.over]
    with fb.spatial_loops(spatial) as (outer, predicate):
        with fb.loops(reduce) as reduce_vars:
            iters = outer + list(zip(reduce, reduce_vars))
            with fb.block(name or compute.name, iters, scope,
                          predicate=(lambda _: predicate) if predicate is not None else None) as inner:
                indices = [inner.axes[a.uid] for a in compute.axes]
                if compute.is_reduction:
                    fb.emit_update(compute.monoid, bufs, indices, compute.bodies, inner, True,
                                   dtypes)
                else:
                    fb.store(bufs[0], lower(compute.bodies[0], inner, compute.dtypes[0]), indices)


def olds_bound(olds: list, dtypes) -> tuple[list, bool]:
    """Loads of several states that are all stored anew (``olds``, the states' ``dtypes``),
    bound before the stores so that every result reads the old values — and whether they were.
    The old values are bound, not the results: TVM's bf16 legalisation leaves a bf16 load inside
    a bound value as its integer bits (an argmax over bf16 rows on the CPU picked by bit
    pattern; a bf16 row factor scaled a rolling update's correction by thousands). States kept
    in a 16-bit float are not bound (:func:`results_bound` binds their results instead)."""
    bound = len(olds) > 1 and not any(dt.is_half(d) for d in dtypes)
    return ([T.Bind(o) for o in olds] if bound else olds), bound


def results_bound(results: list, olds_were_bound: bool) -> list:
    """Several results bound before their stores where the old values they read were not."""
    return [T.Bind(r) for r in results] if len(results) > 1 and not olds_were_bound else results
