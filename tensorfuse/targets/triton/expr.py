"""DSL expressions as Triton source over a tile.

A :class:`TileContext` says what each DSL axis is inside the current tile: a scalar (program-id
axes), a ``[BLOCK, 1]`` or ``[1, BLOCK]`` index tensor, or an expression; and what references to
computes and symbols read (tile variables of the kernel being written). Loads become masked
``tl.load`` of pointer arithmetic on the tensor's strides.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

from ...algebra.exprs import nodes
from ...dsl import dtypes as dt
from ...dsl.expr import (Axis, Binary, Cast, Compare, Const, DimSize, Expr, Load, Ref, Scalar,
                         Symbol, Unary, Where, reads_data)
from ...errors import TargetError
from ..address_terms import address_terms
from .view_strides import view_strides

TL_DTYPES = {"f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32", "f64": "tl.float64",
             "i8": "tl.int8", "u8": "tl.uint8", "i32": "tl.int32", "i64": "tl.int64",
             "bool": "tl.int1"}


def dot_precision(dot_dtype: str, split_tf32: bool = False) -> str:
    """``tl.dot``'s argument that keeps a float32 contraction's products at float32's accuracy
    (Triton's default for f32 operands is TF32, 10-bit mantissas: a tiny Llama's f32 attention
    gradients on the H200, its forward's products in TF32, were 3e-3 from SDPA's where f32 asks
    1e-5): IEEE products on the FMA units, or with ``split_tf32`` (NVIDIA's tensor cores: Triton
    compiles it for no AMD GPU) three TF32 products of each operand's high and low halves
    (``tf32x3``: the dropped low × low term is 2⁻²² of a product, float32's own rounding) —
    causal attention with float32 rotary tables 16.8 → 3.2 ms on the H200
    (``benchmarks.serving_kernels``); float64 operands keep IEEE products; nothing for 16-bit
    operands."""
    if dot_dtype == "f32" and split_tf32:
        return ", input_precision='tf32x3'"
    return ", input_precision='ieee'" if dot_dtype in ("f32", "f64") else ""


_UNARY = {"exp": "tl.exp({})", "exp2": "tl.exp2({})", "log": "tl.log({})", "log2": "tl.log2({})",
          "sqrt": "tl.sqrt({})", "rsqrt": "tl.rsqrt({})", "abs": "tl.abs({})",
          "sigmoid": "tl.sigmoid({})", "erf": "tl.erf({})", "floor": "tl.floor({})",
          "ceil": "tl.ceil({})", "round": "_rint({})", "sin": "tl.sin({})",
          "cos": "tl.cos({})",
          "tanh": "libdevice.tanh({})", "neg": "(-{})", "not": "(~{})"}
_BINARY = {"add": "({} + {})", "sub": "({} - {})", "mul": "({} * {})", "div": "({} / {})",
           "max": "tl.maximum({}, {})", "min": "tl.minimum({}, {})", "pow": "libdevice.pow({}, {})",
           "and": "({} & {})", "or": "({} | {})", "floordiv": "_floordiv({}, {})",
           "mod": "_floormod({}, {})"}
LOG2E = "1.4426950408889634"
# integer operations of two literals, folded as Python does (floor division and modulo)
_INT_FOLDS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
              "floordiv": operator.floordiv, "mod": operator.mod}
_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}

# Helpers every generated file defines: floor division and modulo (Triton's // and % truncate).
HELPERS = '''
@triton.jit
def _floordiv(a, b):
    q = a // b
    return q - ((a % b != 0) & ((a < 0) != (b < 0))).to(q.dtype)


@triton.jit
def _floormod(a, b):
    r = a % b
    return r + ((r != 0) & ((r < 0) != (b < 0))).to(r.dtype) * b
'''

# ``T.round`` (to the nearest, halves to even, as torch.round) from floor and compares, written
# into a source that calls it (:func:`with_called_helpers`): Triton's interpreter gave None for
# libdevice's rint, nearbyint, round and trunc alike, and in a memory-bound kernel the few
# extra instructions cost nothing measurable
ROUND_HELPER = '''
@triton.jit
def _rint(x):
    f = tl.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
'''

# ``a ** b`` under Triton's interpreter, which gives None for libdevice's pow (as for rint):
# |a|^b by exp2 and log2, its sign for a negative base by the exponent's parity (NaN for a
# fractional one), 1 for a zero exponent — libdevice's pow's values
POW_HELPER = '''
@triton.jit
def _pow(a, b):
    a, b = a + 0.0 * b, b + 0.0 * a   # an integer exponent (a distance i - j) in a's float type
    m = tl.exp2(b * tl.log2(tl.abs(a)))
    odd = (b - 2.0 * tl.floor(b * 0.5)) == 1.0
    signed = tl.where(tl.floor(b) == b, tl.where(odd, -m, m), float("nan"))
    return tl.where(b == 0, 1.0, tl.where(a < 0, signed, m))
'''
# the helpers a source may call, by the name it calls them with
_CALLED_HELPERS = {"_rint": ROUND_HELPER, "_pow": POW_HELPER}


def with_called_helpers(source: str) -> str:
    """``source`` (a whole generated module) with the helpers written only where they are
    called (:data:`ROUND_HELPER`, :data:`POW_HELPER`) put after its imports."""
    helpers = "".join(text for name, text in _CALLED_HELPERS.items()
                      if f"{name}(" in source and f"def {name}(" not in source)
    if not helpers:
        return source
    head, sep, rest = source.partition("\n\n")
    return head + "\n" + helpers + sep + rest


def literal(value, dtype: str) -> str:
    d = dt.resolve(dtype)
    if d == "bool":
        return "True" if value else "False"
    if dt.is_int(d):
        return str(int(value))
    if isinstance(value, float) and math.isinf(value):
        return "float('inf')" if value > 0 else "float('-inf')"
    if isinstance(value, float) and math.isnan(value):
        return "float('nan')"
    return repr(float(value))


@dataclass
class TileContext:
    """What names mean in one tile: ``axes`` (uid → Triton expression of the index), ``valid``
    (uid → mask expression for axes whose tile may overhang), ``refs`` (compute name → tile
    variable), ``symbols`` (name → variable), ``sizes`` (dimension name → int), ``scalars``."""

    axes: dict
    valid: dict = field(default_factory=dict)
    refs: dict = field(default_factory=dict)
    symbols: dict = field(default_factory=dict)
    sizes: dict = field(default_factory=dict)
    keep_dtype: bool = False   # loads keep their storage type (operands of tl.dot)
    emit: object = None        # when set: emit(line) binds repeated tile values to variables
    memo: dict = field(default_factory=dict)
    interpreter: bool = False  # Triton's CPU interpreter: no libdevice
    # (row axes, column axis, hint) of a row kernel that streams its rows: loads along a row get
    # the hint (evict_first where this is the row's last read, evict_last where a second pass
    # reads it again), loads along the columns alone are reused by every row (a norm's weight:
    # evict_last); empty: no hints
    streaming: tuple = ()
    # tensors a row kernel reads through 16-byte aligned windows (:mod:`.row_realign`): name →
    # (the column axis' uid, the window's offset text, the mask of its loads or None); a read of
    # one with the columns innermost takes them in place of its offset and its columns' mask
    realigned: dict = field(default_factory=dict)
    # conditions of the ``T.where`` branches being written: ((mask text, its axes' uids), ...);
    # loads in a branch read only where it is taken (:func:`load`)
    guard: tuple = ()

    def child(self, **changes) -> "TileContext":
        new = TileContext(dict(self.axes), dict(self.valid), dict(self.refs), dict(self.symbols),
                          self.sizes, self.keep_dtype, self.emit, self.memo, self.interpreter,
                          self.streaming, self.realigned, self.guard)
        for key, value in changes.items():
            if isinstance(value, dict) and key != "memo":
                getattr(new, key).update(value)
            else:
                setattr(new, key, value)
        return new


def dim_sizes(param, sizes: dict) -> list[int]:
    """A tensor parameter's dimensions at the given sizes."""
    return [d if isinstance(d, int) else sizes[d] for d in param.dims]


def strides(param, sizes: dict) -> list[int]:
    """The strides a kernel reads a tensor parameter at: a view's own where the kernel is
    written for a call passing one (:mod:`.view_strides`), else row-major at the given sizes."""
    view = view_strides(param.name)
    if view is not None:
        return list(view)
    dims = dim_sizes(param, sizes)
    out, acc = [], 1
    for n in reversed(dims):
        out.append(acc)
        acc *= n
    return list(reversed(out))


def fresh_memo(memo: dict, keep: frozenset = frozenset()) -> dict:
    """A memo holding only ``memo``'s values of the expressions ``keep`` (by key), whose new
    temporaries are numbered after ``memo``'s: the other values are computed again from here on
    (a row read a second time), under names that stay unique in the kernel (:func:`to_triton`
    numbers them by the memo's length)."""
    return {key if key[0] in keep else ("spent", key): name for key, name in memo.items()}


def nonnegative(e: Expr) -> bool:
    """Whether an integer expression is at least 0 at every call, whatever the sizes
    (:func:`index_range`'s lowest value)."""
    lowest = index_range(e, {})[0]
    return lowest is not None and lowest >= 0


def to_triton(e: Expr, ctx: TileContext) -> str:
    """Triton source computing ``e`` in ``ctx`` (floating values in f32 unless ``keep_dtype``).
    With ``ctx.emit``, each tile-valued load or operation is bound to a variable once and reused
    (common subexpressions are shared between the chain's members)."""
    if ctx.emit is None or not isinstance(e, (Load, Unary, Binary, Compare, Where, Cast)) or \
            not any(a.uid in ctx.axes for a in e.axes):
        return _to_triton(e, ctx)
    taken = _guards_taken(e, ctx) if ctx.guard else ()
    key = (e.key(), ctx.keep_dtype) + ((taken,) if taken else ())
    if key not in ctx.memo:
        text = _to_triton(e, ctx)
        name = f"_t{len(ctx.memo)}"
        ctx.emit(f"{name} = {text}")
        ctx.memo[key] = name
    return ctx.memo[key]


def _to_triton(e: Expr, ctx: TileContext) -> str:
    if isinstance(e, Const):
        return literal(e.value, dt.resolve(e.dtype))
    if isinstance(e, Axis):
        if e.uid not in ctx.axes:
            raise TargetError(f"axis {e.name} is not part of this tile")
        return ctx.axes[e.uid]
    if isinstance(e, Scalar):
        return e.name
    if isinstance(e, DimSize):
        return str(ctx.sizes[e.name])
    if isinstance(e, Symbol):
        return ctx.symbols[e.name]
    if isinstance(e, Ref):
        key = e.compute.name if e.compute.arity == 1 else f"{e.compute.name}#{e.component}"
        if key not in ctx.refs:
            raise TargetError(f"{e.compute.name} is not available in this tile")
        return ctx.refs[key]
    if isinstance(e, Load):
        return load(e, ctx)
    if isinstance(e, Unary):
        if e.op == "exp" and isinstance(e.a, Binary) and e.a.op == "sub":
            # exp(a − b) = 2^((a − b)·log2e): the difference first, so that a and b near the
            # largest floats (a mask's lowest value, −3.39e38) give exp(0) = 1 as the math does;
            # a·log2e − b·log2e overflowed to −∞ − −∞ there (NaN). tl.exp would compute the same
            # but with ex2's denormal-preserving form (ex2.approx.f32, not .ftz; sm_90a PTX):
            # this is the form the softmax and attention rows were timed with.
            a, b = to_triton(e.a.a, ctx), to_triton(e.a.b, ctx)
            return f"tl.exp2(({a} - {b}) * {LOG2E})"
        if e.op == "tanh" and ctx.interpreter:
            return "(2.0 * tl.sigmoid(2.0 * {}) - 1.0)".format(to_triton(e.a, ctx))
        return _UNARY[e.op].format(to_triton(e.a, ctx))
    if isinstance(e, Binary):
        a, b = to_triton(e.a, ctx), to_triton(e.b, ctx)
        if e.op == "pow" and ctx.interpreter:
            return f"_pow({a}, {b})"
        if e.op in _INT_FOLDS and _is_int_literal(a) and _is_int_literal(b) and \
                not dt.is_float(dt.resolve(e.dtype)):
            # sizes compiled in (a count of elements): one literal, a Python int the kernel
            # may cast (an int expression has no .to)
            return str(_INT_FOLDS[e.op](int(a), int(b)))
        if e.op in ("floordiv", "mod") and nonnegative(e.a) and nonnegative(e.b):
            # Triton's truncating // and % are the floor's here, and keep the contiguity its
            # vectoriser reads (rotary's x[…, (d + D/2) % D]: vector loads, not one a lane)
            return f"({a} {'//' if e.op == 'floordiv' else '%'} {b})"
        if e.op == "div" and dt.is_float(dt.resolve(e.dtype)) and \
                {x.uid for x in e.b.axes} < {x.uid for x in e.a.axes}:
            # a divisor broadcast over some of the dividend's axes (x[i, j] / t[i], o / l):
            # one reciprocal per divisor element and a multiply per element, not a division
            # per element (an IEEE division is a dozen instructions; a per-row temperature
            # made a softmax compute-bound)
            return f"({a} * (1.0 / {b}))"
        return _BINARY[e.op].format(a, b)
    if isinstance(e, Compare):
        return f"({to_triton(e.a, ctx)} {_COMPARE[e.op]} {to_triton(e.b, ctx)})"
    if isinstance(e, Where):
        cond = to_triton(e.cond, ctx)
        taken, other = (_guarded(branch, ctx, cond, e.cond, flip)
                        for branch, flip in ((e.a, False), (e.b, True)))
        return f"tl.where({cond}, {to_triton(e.a, taken)}, {to_triton(e.b, other)})"
    if isinstance(e, Cast):
        inner, dtype = to_triton(e.a, ctx), dt.resolve(e.dtype)
        if _is_int_literal(inner):   # a Python int: a scalar of the type, not int.to
            return f"tl.full((), {inner}, {TL_DTYPES[dtype]})"
        return f"({inner}).to({TL_DTYPES[dtype]})"
    raise TargetError(f"{type(e).__name__} has no Triton translation")


def _guarded(branch: Expr, ctx: TileContext, cond: str, cond_expr: Expr, flip: bool):
    """The context of a ``T.where`` branch: its loads masked by the condition that takes it
    (a segment's rows past its length, a sequence's padding are then never fetched: unmasked,
    the segment mean of ``benchmarks.user_kernels`` read about twice its bytes); ``ctx``
    itself where the branch reads no tensor."""
    if cond_expr.dtype != "bool" or not any(isinstance(n, Load) for n in nodes(branch)):
        return ctx
    text = f"(~{cond})" if flip else cond
    return ctx.child(guard=ctx.guard + ((text, frozenset(axes_in(cond_expr))),))


def _guards_of(e: Load, guard: tuple) -> list[str]:
    """The branch conditions (``guard``) that mask the load ``e``: those whose axes its tile
    holds (a load over fewer is not masked by a tile it does not span) and that are constant
    along its tensor's innermost index (one varying along it, a causal ``j <= i``, would cut
    the vector loads to one element a lane)."""
    innermost = axes_in(e.indices[-1]) if e.indices else set()
    return [text for text, uids in guard if uids <= axes_in(e) and not uids & innermost]


def _guards_taken(e: Expr, ctx: TileContext) -> tuple:
    """The masks the loads in ``e`` take in ``ctx``: part of its memo key, so that a value
    computed from masked loads is never reused where the branch is not taken, and one whose
    loads no branch masks is shared (rotary's x read once for both branches of its where)."""
    return tuple(sorted({text for n in nodes(e) if isinstance(n, Load)
                         for text in _guards_of(n, ctx.guard)}))


def _is_int_literal(text: str) -> bool:
    return text.lstrip("-").isdigit()


def axes_in(e: Expr) -> set[int]:
    return {a.uid for a in e.axes}


def _eviction(e: Load, streaming: tuple) -> str:
    """The L2 eviction hint of a load in a streaming row kernel (``, eviction_policy=...``), or
    nothing."""
    if not streaming:
        return ""
    rows, col, policy = streaming
    used = {a.uid for a in e.axes}
    if col in used and (used & rows or not rows):   # no rows: one row in all
        return f", eviction_policy='{policy}'"
    if col in used:
        return ", eviction_policy='evict_last'"
    return ""


def offset(e: Load, ctx: TileContext) -> str:
    """The element offset ``e`` reads in its tensor (:func:`strides` at ``ctx.sizes``): what
    a load or a store of the same element adds to the tensor's pointer."""
    terms = []
    size_of = {id(i): n for i, n in zip(e.indices, dim_sizes(e.param, ctx.sizes))}
    for index, stride in address_terms(e.indices, strides(e.param, ctx.sizes)):
        idx = to_triton(index, ctx.child(keep_dtype=False))
        if reads_data(index):   # data: clamped into its dimension (see index_checks)
            size = size_of[id(index)]   # a gather is never merged: its own dimension
            idx = f"tl.minimum(tl.maximum({idx}, 0), {size - 1})"
            if stride * size >= 2**31:   # an i32 page number times its stride would wrap
                idx = f"{idx}.to(tl.int64)"
        terms.append(idx if stride == 1 else f"{idx} * {stride}")
    return " + ".join(terms) or "0"


def index_range(e: Expr, sizes: dict) -> tuple:
    """``(lowest, highest)`` an integer index expression takes over its axes (each bound ``None``
    where it is not known at ``sizes``; a size not in ``sizes`` is at least 0): axes, literals,
    sizes and their sums, differences, products and quotients, remainders, minima and maxima."""
    if isinstance(e, (Axis, DimSize)):
        name = e.extent if isinstance(e, Axis) else e.name
        size = name if isinstance(name, int) else sizes.get(name)
        if not isinstance(size, int):
            return 0, None
        return (0, size - 1) if isinstance(e, Axis) else (size, size)
    if isinstance(e, Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value, e.value
    if isinstance(e, Cast) and dt.is_int(dt.resolve(e.dtype)):
        return index_range(e.a, sizes)
    if not isinstance(e, Binary):
        return None, None
    (alo, ahi), (blo, bhi) = index_range(e.a, sizes), index_range(e.b, sizes)

    def both(f, x, y):
        return f(x, y) if x is not None and y is not None else None

    if e.op == "add":
        return both(operator.add, alo, blo), both(operator.add, ahi, bhi)
    if e.op == "sub":
        return both(operator.sub, alo, bhi), both(operator.sub, ahi, blo)
    if e.op in ("min", "max"):
        pick = min if e.op == "min" else max
        return both(pick, alo, blo), both(pick, ahi, bhi)
    if alo is None or blo is None or alo < 0 or blo < 0:   # below: of non-negative operands
        return None, None
    if e.op == "mul":
        return alo * blo, both(operator.mul, ahi, bhi)
    if e.op == "floordiv":
        return (alo // bhi if bhi else 0), (ahi // blo if ahi is not None and blo else ahi)
    if e.op == "mod":
        return 0, (bhi - 1 if bhi else ahi)
    return None, None


def _bounds(e: Load, ctx: TileContext) -> list[str]:
    """Masks keeping a load inside its tensor where an index of axes and literals can leave its
    dimension (``x[b, c, t - k]`` at t < k, under a ``T.where`` that discards those lanes: the
    read itself would be outside the tensor). Gathered indices are clamped instead
    (:func:`offset`)."""
    masks = []
    for index, size in zip(e.indices, dim_sizes(e.param, ctx.sizes)):
        if isinstance(index, Axis) or reads_data(index):
            continue
        lo, hi = index_range(index, ctx.sizes)
        below = lo is not None and lo < 0
        above = hi is not None and isinstance(size, int) and hi >= size
        if below or above:
            text = to_triton(index, ctx.child(keep_dtype=False))
            masks += [f"({text} >= 0)"] * below + [f"({text} < {size})"] * above
    return masks


def load(e: Load, ctx: TileContext) -> str:
    window = ctx.realigned.get(e.param.name)
    if window is not None and isinstance(e.indices[-1], Axis) and \
            e.indices[-1].uid == window[0]:   # whole aligned vectors, its row's columns or not
        offset_ = window[1]
        masks = sorted({ctx.valid[a] for a in axes_in(e) if a in ctx.valid and a != window[0]}
                       | ({window[2]} if window[2] else set()))
    else:
        offset_ = offset(e, ctx)
        masks = sorted({ctx.valid[a] for a in axes_in(e) if a in ctx.valid}) + _bounds(e, ctx)
    masks += [text for text in _guards_of(e, ctx.guard) if text not in masks]
    ptr = f"{e.param.name} + ({offset_})"
    hint = _eviction(e, ctx.streaming)
    text = f"tl.load({ptr}, mask={' & '.join(masks)}, other=0{hint})" if masks else \
        f"tl.load({ptr}{', ' + hint[2:] if hint else ''})"
    return text if ctx.keep_dtype else computed(text, e.param.dtype)


def computed(loaded: str, dtype: str) -> str:
    """A tile ``loaded`` from a tensor of ``dtype`` in the type the template computes in (the
    DSL's :func:`~tensorfuse.dsl.dtypes.compute_dtype`): 16-bit floats widened to f32, 8-bit
    integers to i32 (in their own type a product of two wrapped, and an i32 running state's
    identity, −2³¹, was no int8 scalar), other types as they are."""
    wide = dt.compute_dtype(dtype)
    return loaded if wide == dtype else f"{loaded}.to({TL_DTYPES[wide]})"
