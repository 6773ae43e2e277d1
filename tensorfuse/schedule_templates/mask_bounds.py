"""Skip what a mask removes on the CPU: each row's key loops cut at the mask's edges.

A chain masked by one condition under which a masked element contributes nothing to any state
(:func:`tensorfuse.algebra.masking.identity_mask`: causal, sliding-window, prefix-LM attention)
wastes the work on masked elements when its loops run over every key: half of it for a causal
mask. Here, on a scheduled CPU module, every loop over the keys inside a row is cut to the keys
where the mask can hold for that row — a causal row stops at its diagonal, a window's row starts
at the window's edge:

- the bounds come from the condition's compares that are linear in the key axis with coefficient
  ±1 (``tvm.sym.detect_linear_equation``), written over the row's indices as the block computes
  them; the rest of the condition (``or``, document ids, ``%``) is left to the block's own mask,
  which makes the range wider, never narrower;
- every loop is cut at the same granule of keys (:data:`GRANULE`, or the lcm with the chunk
  sizes): elements of a chunk the mask cuts through are computed and masked as before;
- either every block touching a keyed intermediate (scores, probabilities) is bounded or none is,
  so an element one block skips is never read by another; a loop is cut only when every block
  under it is such a block, and a reduction whose initialisation sits under the loop is not cut
  (the row schedule decomposes them first).

The transformation is not a schedule primitive (TVM has no loop whose extent depends on an outer
loop), so it runs on the finished module, before compilation (:func:`bound_masked_loops`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import tvm
from tvm import s_tir, tirx
from tvm.sym import Analyzer, detect_linear_equation

from ..algebra import Chain, chain_candidates, plan_chain
from ..algebra.exprs import substitute, symbols_in
from ..algebra.masking import identity_mask
from ..algebra.schemes import EXTRAPOLATION
from ..dsl.expr import Axis, Compare, Expr, Unary, binary, compare, unary
from ..dsl.program import Program, TensorParam
from ..errors import RollingUpdateError
from ..lower_to_tir import Scope, lower_expr

GRANULE = 16        # keys: an f32 vector of AVX-512, the row schedule's default width
MAX_GRANULE = 512


@dataclass(frozen=True)
class KeyMask:
    """A program's chain over ``key`` masked by ``cond`` (masked elements are identities);
    ``axes_of``: the axes of each intermediate buffer's dimensions (accumulators included),
    ``keyed``: those of them indexed by the key."""

    program: Program
    key: Axis
    cond: Expr
    axes_of: dict
    keyed: frozenset


def key_mask(program: Program) -> KeyMask | None:
    """The masked chain of ``program`` whose key loops may be cut, or None: its reductions over
    one axis fuse into a chain (:func:`~tensorfuse.algebra.plan_chain`) with an identity mask,
    no output is indexed by that axis, and nothing else reduces over it."""
    for members, key in chain_candidates(program):
        if any(key.uid in {a.uid for a in c.axes} for c in program.outputs) or any(
                c.is_reduction and key.uid in {a.uid for a in c.over} and c not in members
                for c in program.computes):
            continue
        try:
            chain = plan_chain(program, [m.name for m in members], key, checked=False)
        except RollingUpdateError:
            continue
        cond = identity_mask(chain)
        if cond is None:
            continue
        axes_of = {}
        for c in program.computes:
            for name in list(c.buffer_names()) + [f"{c.name}_acc"]:
                axes_of[name] = tuple(c.axes)
        keyed = frozenset(n for n, axes in axes_of.items() if key.uid in {a.uid for a in axes})
        return KeyMask(program, key, cond, axes_of, keyed)
    return None


def bound_masked_loops(mod: tvm.IRModule, program: Program) -> tvm.IRModule:
    """``mod`` (a scheduled CPU module of ``program``) with its key loops cut at the mask's
    edges, or ``mod`` itself where the program has no such mask or the schedule does not allow
    every keyed block to be bounded (module docstring)."""
    mask = key_mask(program)
    if mask is None:
        return mod
    (gvar, func), = mod.functions.items()
    try:
        blocks = _blocks(func.body)
        cuts = _cuts(blocks, mask, func)
    except _Unsupported:
        return mod
    if not cuts:
        return mod
    return tvm.IRModule({gvar: func.with_body(_rebuild(func.body, cuts))})


class _Unsupported(Exception):
    """The module holds something the pass does not reason about: leave it as it is."""


@dataclass
class _Block:
    realize: s_tir.SBlockRealize
    loops: list          # the enclosing For nodes, outermost first


@dataclass
class _Cut:
    chunk: int           # keys per iteration of the loop
    lo: tirx.PrimExpr | None    # the first key the mask may keep (None: no bound)
    hi: tirx.PrimExpr | None    # the last one
    extent: tirx.PrimExpr


def _blocks(stmt, loops=()) -> list[_Block]:
    """Every block below ``stmt`` (the root excluded) with its loops."""
    if isinstance(stmt, tirx.For):
        return _blocks(stmt.body, (*loops, stmt))
    if isinstance(stmt, tirx.SeqStmt):
        return [b for s in stmt.seq for b in _blocks(s, loops)]
    if isinstance(stmt, s_tir.SBlockRealize):
        inner = _blocks(stmt.block.body, loops)
        return inner if stmt.block.name_hint == "root" else [_Block(stmt, list(loops))] + inner
    if isinstance(stmt, tirx.IfThenElse):
        return _blocks(stmt.then_case, loops) + (
            _blocks(stmt.else_case, loops) if stmt.else_case is not None else [])
    if isinstance(stmt, (tirx.BufferStore, tirx.Evaluate)):
        return []
    raise _Unsupported(type(stmt).__name__)


def _cuts(blocks: list[_Block], mask: KeyMask, func) -> dict:
    """The new range of every key loop (by loop variable), or {} unless every keyed block is
    bounded consistently."""
    found: dict = {}
    granule = GRANULE
    for b in blocks:
        block = b.realize.block
        bind = list(zip((iv.var for iv in block.iter_vars), b.realize.iter_values))
        values, keys = {}, []
        for region in list(block.reads) + list(block.writes):
            axes = mask.axes_of.get(region.source.name)
            if axes is None or len(axes) != len(region.region):
                continue
            for axis, rng in zip(axes, region.region):
                if not _is_one(rng.extent):
                    raise _Unsupported(f"{block.name_hint} reads a region")
                index = _substituted(rng.min, bind)
                if axis.uid == mask.key.uid:
                    keys.append(index)
                else:
                    values.setdefault(axis.uid, index)
        if not keys:
            continue
        if any(not Analyzer().can_prove_equal(keys[0], k) for k in keys[1:]):
            return {}
        loop, chunk = _chunk_loop(keys[0], b.loops)
        if loop is None:
            return {}
        inner = {lp.loop_var.id_ for lp in b.loops[b.loops.index(loop):]}
        if block.init is not None and any(_uses(v, inner) for v in b.realize.iter_values):
            return {}   # its initialisation runs at the loop's first iteration
        lo, hi = _key_range(mask, values, func, "int64" if str(keys[0].ty) == "int64"
                            else "int32")
        if any(e is not None and _uses(e, inner) for e in (lo, hi)):
            return {}
        if lo is None and hi is None:
            return {}
        cut = _Cut(chunk, lo, hi, loop.extent)
        var = loop.loop_var
        if var in found:
            old = found[var]
            if old.chunk != chunk or not all(_same(x, y) for x, y in ((old.lo, lo), (old.hi, hi))):
                return {}
        found[var] = cut
        granule = granule * chunk // math.gcd(granule, chunk)
    if granule > MAX_GRANULE or not found:
        return {}
    for b in blocks:   # every block under a cut loop must be one of the bounded ones
        under = [lp.loop_var for lp in b.loops if lp.loop_var in found]
        if under and not _keyed(b, mask):
            return {}
    for lp in (lp for b in blocks for lp in b.loops if lp.loop_var in found):
        if not (_is_zero(lp.min) and lp.kind == tirx.ForKind.SERIAL):
            return {}
    return {var: _new_range(cut, granule) for var, cut in found.items()}


def _keyed(b: _Block, mask: KeyMask) -> bool:
    block = b.realize.block
    return any(r.source.name in mask.keyed for r in list(block.reads) + list(block.writes))


def _chunk_loop(key: tirx.PrimExpr, loops: list):
    """The outermost loop the key index runs with, and how many keys one of its iterations
    covers: ``key = chunk·loop + rest`` with ``rest`` in ``[0, chunk)`` over the inner loops."""
    used = [lp for lp in loops if _uses(key, {lp.loop_var.id_})]
    if not used:
        return None, 0
    outer = used[0]
    coeffs = detect_linear_equation(key, [lp.loop_var for lp in used])
    if len(coeffs) != len(used) + 1 or not all(isinstance(c, tirx.IntImm) for c in coeffs[:-1]):
        return None, 0
    chunk = int(coeffs[0])
    if chunk <= 0:
        return None, 0
    analyzer = Analyzer()
    for lp in loops[loops.index(outer) + 1:]:
        analyzer.bind(lp.loop_var, tvm.ir.Range.from_min_extent(lp.min, lp.extent))
    rest = analyzer.simplify(key - outer.loop_var * chunk)
    bound = analyzer.const_int_bound(rest)
    if bound.min_value < 0 or bound.max_value >= chunk:
        return None, 0
    return outer, chunk


def _key_range(mask: KeyMask, values: dict, func, index_dtype: str):
    """``(lo, hi)``: the keys the mask can keep for the row whose axes have ``values`` (each
    None where the condition gives no bound)."""
    scope = Scope(axes=dict(values), index_dtype=index_dtype)
    for p, arg in zip(mask.program.params, func.params):
        if isinstance(p, TensorParam):
            scope.params[p.name] = arg
            for d, name in enumerate(p.dims):
                if isinstance(name, str):
                    scope.dims.setdefault(name, arg.shape[d])
        else:
            scope.scalars[p.name] = arg
    return _range_in(mask.cond, mask.key, scope)


def chain_key_range(chain: Chain, scope: Scope) -> tuple:
    """``(lo, hi)`` of the keys a fused chain's mask can keep for the row whose axes ``scope``
    gives (the rolling update's chunk loop on the CPU), each None where unbounded; both None
    when the chain has no identity mask, or when the reference of a member others depend on
    extrapolates over the positions seen (a skipped chunk would still move it, and with it the
    corrections)."""
    cond = identity_mask(chain)
    deps = {d for scheme in chain.schemes.values() for d in scheme.deps}
    if cond is None or any(EXTRAPOLATION.name in symbols_in(chain.schemes[d].reference())
                           for d in deps):
        return None, None
    return _range_in(cond, chain.axis, scope)


def _range_in(cond: Expr, key_axis: Axis, scope: Scope) -> tuple:
    key = tirx.Var("key", "int64" if scope.index_dtype == "int64" else "int32")
    try:
        lowered = lower_expr(_without_abs(cond), scope.child(axes={key_axis.uid: key}), "bool")
    except KeyError:   # an axis the row does not know (it reads no buffer of that axis)
        return None, None
    simplify = Analyzer().simplify
    return tuple(simplify(x) if x is not None else None for x in _range(lowered, key))


def _range(cond, key) -> tuple:
    """``(lo, hi)`` of ``key`` where ``cond`` holds, either None where unbounded: compares
    linear in the key bound it, ``and`` intersects, ``or`` takes the hull, the rest (document
    ids, ``%``) bounds nothing."""
    if isinstance(cond, (tirx.And, tirx.Or)):
        (lo_a, hi_a), (lo_b, hi_b) = _range(cond.a, key), _range(cond.b, key)
        if isinstance(cond, tirx.And):
            pick = lambda x, y, f: x if y is None else y if x is None else f(x, y)  # noqa: E731
            return pick(lo_a, lo_b, tirx.max), pick(hi_a, hi_b, tirx.min)
        hull = lambda x, y, f: None if x is None or y is None else f(x, y)  # noqa: E731
        return hull(lo_a, lo_b, tirx.min), hull(hi_a, hi_b, tirx.max)
    bounds = _linear_bounds(cond, key)
    return bounds if bounds is not None else (None, None)


def _without_abs(cond: Expr) -> Expr:
    """``abs(x) <= r`` (``<``) written as ``x <= r and -x <= r``, which are linear in ``x``."""
    def split(n):
        if isinstance(n, Compare) and n.op in ("le", "lt") and isinstance(n.a, Unary) and \
                n.a.op == "abs":
            x = n.a.a
            return binary("and", compare(n.op, x, n.b, n.loc),
                          compare(n.op, unary("neg", x, n.loc), n.b, n.loc), n.loc)
        return None
    return substitute(cond, split)


_BOUNDS: dict[type, Callable] = {   # (coefficient, base) of ``a - b`` -> (lo, hi) of the key
    tirx.LT: lambda c, base: (None, -base - 1) if c == 1 else (base + 1, None),
    tirx.LE: lambda c, base: (None, -base) if c == 1 else (base, None),
    tirx.GT: lambda c, base: (-base + 1, None) if c == 1 else (None, base - 1),
    tirx.GE: lambda c, base: (-base, None) if c == 1 else (None, base),
    tirx.EQ: lambda c, base: (-base, -base) if c == 1 else (base, base),
}


def _linear_bounds(part, key):
    """The bounds one compare puts on ``key`` when it is ``±key + base  op  0``, else None."""
    rule = _BOUNDS.get(type(part))
    if rule is None or not all(str(x.ty) in ("int32", "int64") for x in (part.a, part.b)):
        return None
    coeffs = detect_linear_equation(part.a - part.b, [key])
    if len(coeffs) != 2 or not isinstance(coeffs[0], tirx.IntImm) or \
            int(coeffs[0]) not in (1, -1) or _uses(coeffs[1], {key.id_}):
        return None
    return rule(int(coeffs[0]), coeffs[1])


def _new_range(cut: _Cut, granule: int):
    """``(min, extent)`` of the loop: the granules holding ``[lo, hi]``, within its extent."""
    per = granule // cut.chunk
    first = tirx.IntImm(str(cut.extent.ty), 0)
    end = cut.extent
    if cut.lo is not None:
        first = tirx.max(first, tirx.floordiv(cut.lo, granule) * per)
    if cut.hi is not None:
        end = tirx.min(end, (tirx.floordiv(cut.hi, granule) + 1) * per)
    simplify = Analyzer().simplify
    first = simplify(tirx.min(first, cut.extent))
    return first, simplify(tirx.max(end - first, 0))


def _rebuild(stmt, cuts: dict):
    if isinstance(stmt, tirx.For):
        body = _rebuild(stmt.body, cuts)
        if stmt.loop_var not in cuts:
            if body.same_as(stmt.body):
                return stmt
            start, extent = stmt.min, stmt.extent
        else:
            start, extent = cuts[stmt.loop_var]
        return tirx.For(stmt.loop_var, start, extent, stmt.kind, body, stmt.thread_binding,
                        stmt.annotations, stmt.step)
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_rebuild(s, cuts) for s in stmt.seq])
    if isinstance(stmt, s_tir.SBlockRealize):
        b = stmt.block
        block = s_tir.SBlock(b.iter_vars, b.reads, b.writes, b.name_hint,
                             _rebuild(b.body, cuts), b.init, b.alloc_buffers, b.match_buffers,
                             b.annotations)
        return s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, block)
    if isinstance(stmt, tirx.IfThenElse):
        return tirx.IfThenElse(stmt.condition, _rebuild(stmt.then_case, cuts),
                               _rebuild(stmt.else_case, cuts)
                               if stmt.else_case is not None else None)
    return stmt


def _substituted(expr, bind) -> tirx.PrimExpr:
    """``expr`` with each block variable replaced by its binding (simplified)."""
    analyzer = Analyzer()
    for var, value in bind:
        analyzer.bind(var, value)
    return analyzer.simplify(expr)


def _uses(expr, ids: set) -> bool:
    return any(v.id_ in ids for v in tirx.analysis.undefined_vars(expr, []))


def _is_one(e) -> bool:
    return isinstance(e, tirx.IntImm) and e.value == 1


def _is_zero(e) -> bool:
    return isinstance(e, tirx.IntImm) and e.value == 0


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None
                                         and Analyzer().can_prove_equal(a, b))
