"""The Triton emitter of the scan plan (``schedule_templates.scan``): a scan kernel that sweeps a
part of each row's positions block by block — the terms of a block scanned with
``tl.associative_scan`` (reversed for a suffix), combined with the carry of everything before
it, the outputs written at the block's positions — and, where rows are cut into parts, a first
kernel that reduces each part's terms, whose totals start the later parts' carries.

A program takes ``BLOCK_M`` rows (the result's other axes, flattened) × ``BLOCK_N`` positions;
the terms of a block are the value at ``j = i + shift`` (an exclusive scan reads one position
back, or on; such reads are not 16-byte aligned and go element by element), the identity where
``j`` leaves the row or a condition fails — so both kernels reduce the same terms and the
parts' totals compose."""
from __future__ import annotations

import math

from ...dsl import dtypes as dt
from .expr import TL_DTYPES, TileContext, literal, to_triton
from .reductions import combine_function, reduced
from .tile_text import assemble_source, needs_wide_offsets, store_offsets

NUM_WARPS = 4


def extent(axis, sizes: dict):
    return axis.extent if isinstance(axis.extent, int) else sizes[axis.extent]


def blocks(plan, sizes: dict) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_N)``: along a row held in memory along the scan, up to 1024 positions
    (a row's next power of two where its length is known) and rows up to 2048 elements a tile;
    where the rows are the innermost axis, 64 rows × 32 positions, each position's rows read
    side by side; one row where there are no others. Not measured yet: a memory-bound sweep
    (``benchmarks.scan_kernels`` times it)."""
    if not plan.along_rows:
        return 64, 32
    n = extent(plan.axis, sizes)
    block_n = 1024 if not isinstance(n, int) else max(16, min(1024, 1 << (n - 1).bit_length()))
    return (max(1, min(16, 2048 // block_n)) if plan.rows else 1), block_n


def row_count(plan, sizes: dict):
    return math.prod(extent(a, sizes) for a in plan.rows)


def layout(plan, dims: dict) -> tuple[int, int, int]:
    """``(parts, blocks a part, programs along the rows)`` of a call at ``dims`` (ints)."""
    block_m, block_n = blocks(plan, dims)
    rows, n = row_count(plan, dims), extent(plan.axis, dims)
    cut = plan.parts(rows, n, block_m, block_n)
    count = math.ceil(n / block_n)
    each = math.ceil(count / cut)
    return math.ceil(count / each), each, math.ceil(rows / block_m)


def accumulator(plan) -> str:
    """The carry's and terms' Triton type: f32 for floats, the result's own for integers."""
    dtype = dt.resolve(plan.total.dtypes[0])
    return "tl.float32" if dt.is_float(dtype) else TL_DTYPES[dtype]


def _identity(plan) -> str:
    dtype = plan.total.dtypes[0]
    value = plan.monoid.identity_value(0, dtype)
    return literal(value, "f32" if dt.is_float(dt.resolve(dtype)) else dtype)


def _prologue(w, plan, sizes: dict, wide: bool) -> dict:
    """The program's rows (``row``, ``row_ok`` and each row axis' index) and its part's
    positions (``lo`` to ``hi``, ``nb`` blocks); the row axes' names by uid."""
    w("row = tl.program_id(0)" + (".to(tl.int64)" if wide else "") +
      " * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]")
    w(f"row_ok = row < {row_count(plan, sizes)}")
    w("rest = row")
    names = {}
    for a in reversed(plan.rows):
        names[a.uid] = f"ax_{a.name}"
        w(f"ax_{a.name} = rest % {extent(a, sizes)}")
        w(f"rest = rest // {extent(a, sizes)}")
    w("part = tl.program_id(1)")
    # in whole blocks: Triton then knows a block's start is a multiple of BLOCK_N, and reads and
    # writes a row's elements in 16-byte vectors (a length as an argument left them one by one)
    w("lo = part * scan_part_blocks * BLOCK_N")
    w(f"hi = tl.minimum(lo + scan_part_blocks * BLOCK_N, {extent(plan.axis, sizes)})")
    w("nb = tl.cdiv(hi - lo, BLOCK_N)")
    return names


def _terms(w, plan, sizes: dict, rows: dict, block: str) -> TileContext:
    """Lines computing ``v``, the terms of block ``block`` of the part (its positions ``col``,
    ``col_ok``); the tile of the outputs at those positions."""
    n = extent(plan.axis, sizes)
    w(f"col = lo + ({block}) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
    w("col_ok = col < hi")
    w(f"jj = col + {plan.shift}" if plan.shift else "jj = col")
    w(f"j_ok = (jj >= 0) & (jj < {n})" if plan.shift else f"j_ok = jj < {n}")
    valid = dict.fromkeys(rows, "row_ok")
    tile = TileContext(axes={**rows, plan.axis.uid: "jj"},
                       valid={**valid, plan.axis.uid: "j_ok"}, sizes=sizes)
    keep = ["row_ok", "col_ok", "j_ok"] + [f"({to_triton(c, tile)})" for c in plan.conditions]
    w(f"v = tl.where({' & '.join(keep)}, {to_triton(plan.value, tile)}, {_identity(plan)})"
      f".to({accumulator(plan)})")
    return TileContext(axes={**rows, plan.out_axis.uid: "col"},
                       valid={**valid, plan.out_axis.uid: "col_ok"}, sizes=sizes)


def _combined(plan, a: str, b: str) -> str:
    return f"{combine_function(plan.monoid)}({a}, {b})"


def scan_source(plan, name: str, sizes: dict, args: list[str], interpreter: bool) -> str:
    """The Python source of ``{name}_totals`` (each part's combined terms into ``totals``) and
    ``{name}_scan``, both taking ``args``; ``interpreter``: for Triton's CPU interpreter (loop
    bounds read from tensors)."""
    from .source_writer import SourceWriter

    wide = needs_wide_offsets(plan.program, sizes)
    ident, acc = _identity(plan), accumulator(plan)
    w = SourceWriter(interpreter)
    rows = _prologue(w, plan, sizes, wide)
    w(f"carry = tl.full([BLOCK_M, 1], {ident}, {acc})")
    w.sweep("k", "0", "nb", "1")
    with w.block():
        _terms(w, plan, sizes, rows, "k")
        w("carry = " + _combined(plan, "carry", reduced(plan.monoid, "v", 1, keep_dims=True)))
    w(f"tl.store(totals + row * {plan.max_parts} + part, carry, mask=row_ok)")
    kernels = [(f"{name}_totals", args, w.lines)]

    w = SourceWriter(interpreter)
    rows = _prologue(w, plan, sizes, wide)
    # the parts before this one in the scan's direction: their totals, combined
    w(f"offs_k = tl.arange(0, {plan.max_parts})[None, :]")
    before = "offs_k < part" if plan.direction == "prefix" else \
        "(offs_k > part) & (offs_k < scan_parts)"
    w(f"prev = tl.load(totals + row * {plan.max_parts} + offs_k, mask=row_ok & ({before}), "
      f"other={ident}).to({acc})")
    w(f"carry = {reduced(plan.monoid, 'prev', 1, keep_dims=True)}")
    w.sweep("k", "0", "nb", "1")
    with w.block():
        block = "k" if plan.direction == "prefix" else "nb - 1 - k"
        out_tile = _terms(w, plan, sizes, rows, block)
        reverse = ", reverse=True" if plan.direction == "suffix" else ""
        w(f"s = tl.associative_scan(v, 1, {combine_function(plan.monoid)}{reverse})")
        w("total = " + _combined(plan, "carry", "s"))
        w("carry = " + _combined(plan, "carry", reduced(plan.monoid, "v", 1, keep_dims=True)))
        out_tile = out_tile.child(refs={plan.total.name: "total"})
        for c, expr in plan.outputs:
            w(f"tl.store(out_{c.name} + ({store_offsets(c.axes, out_tile, sizes)}), "
              f"({to_triton(expr, out_tile)}).to({TL_DTYPES[c.dtypes[0]]}), "
              f"mask=row_ok & col_ok)")
    kernels.append((f"{name}_scan", args, w.lines))
    return assemble_source(kernels)
