"""The Triton emitter of the band plan (``schedule_templates.bands.plan_band``): a reduction over
the W positions of a band around each output's own as two scans of segments of W.

A program takes one row (the result's other axes, flattened) and ``BLOCK_M`` segments × W
outputs of it, held as a tile of ``BLOCK_M`` × ``BLOCK_N`` (W's next power of two; the columns
past W are left out); where the positions are not the innermost axis (a band down the sequence
of ``[B, S, C]``), ``BLOCK_K`` rows of the innermost axis side by side as the tile's third,
contiguous dimension (``[B, S, C]``: 32 channels of one sequence). The window of the output in
segment ``s``, column ``c`` starts at ``a = s·W + c + lo``. Its first piece, from ``a`` to its
segment's end, is a suffix scan along the tile's columns of the terms at ``s·W + c + lo``; its
second, from the next segment's start to ``a + W − 1``, a prefix scan of the terms at
``s·W + c + lo + W − 1`` for columns from 1 (an aligned window has none). The pieces are disjoint and in
order: the monoid combines them as it is (``combine(first, second)``), a few operations an
output at any width. Terms outside the row or failing a condition are the identity, as in the
scan template (:mod:`tensorfuse.targets.triton.scan`, whose value and output helpers this
shares)."""
from __future__ import annotations

from .expr import TL_DTYPES, TileContext, to_triton
from .reductions import combine_function
from .scan import L, component_names, extent, result_refs, row_axes, row_count, values
from .tile_text import assemble_source, needs_wide_offsets, store_offsets

NUM_WARPS = 4
TILE_ELEMENTS = 4096   # segments × W's power of two (× rows) a tile, at least one segment
ROWS_SIDE_BY_SIDE = 32  # rows a tile where they are the innermost axis: 128 bytes of f32 each


def blocks(plan) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K)``: segments a tile, the band's width to a power of two,
    and rows side by side (1 where the band runs along the rows' innermost axis)."""
    block_n = 1 << (plan.width - 1).bit_length()
    block_k = 1 if plan.along_rows else ROWS_SIDE_BY_SIDE
    return max(1, TILE_ELEMENTS // (block_n * block_k)), block_n, block_k


def _split_rows(plan) -> tuple:
    """(the row axes a program's first grid index covers, the row axis held side by side in
    the tile or None)."""
    return (plan.rows, None) if plan.along_rows else (plan.rows[:-1], plan.rows[-1])


def programs(plan, dims: dict) -> tuple[int, int, int]:
    """The grid: rows, tiles along a row, and blocks of the rows held side by side."""
    block_m, _, block_k = blocks(plan)
    outer, inner = _split_rows(plan)
    across = 1 if inner is None else -(-extent(inner, dims) // block_k)
    return (row_count(plan, dims, outer),
            -(-extent(plan.axis, dims) // (block_m * plan.width)), across)


def _valid(plan, rows: dict) -> dict:
    """Each row axis' mask: the scalar ``row_ok`` of the program's rows, ``inner_ok`` of the
    rows side by side."""
    inner = _split_rows(plan)[1]
    return {uid: f"{L}inner_ok" if inner is not None and uid == inner.uid else f"{L}row_ok"
            for uid in rows}


def _rows_ok(plan) -> str:
    """The mask of the tile's rows: the program's, and those side by side."""
    return f"{L}row_ok" if _split_rows(plan)[1] is None else f"({L}row_ok & {L}inner_ok)"


def _terms(w, plan, sizes: dict, rows: dict, stem: str, first: str, offset: int) -> None:
    """Lines computing ``{stem}`` (one variable a component), the terms at positions
    ``out + offset`` of the columns from ``first`` up to the band's width."""
    n = extent(plan.axis, sizes)
    w(f"{L}jj = {L}out + {offset}" if offset else f"{L}jj = {L}out")
    # the column bound on the loads, the first column on the terms only: a load mask that
    # changes inside a 16-byte group keeps Triton from vectorising the load
    w(f"{L}j_ok = ({L}col < {plan.width}) & ({L}jj >= 0) & ({L}jj < {n})")
    values(w, plan, sizes, rows, f"({L}col >= {first})", stem, _valid(plan, rows),
           _rows_ok(plan))


def band_source(plan, name: str, sizes: dict, args: list[str]) -> str:
    """The Python source of ``{name}_band``, taking ``args``."""
    from .source_writer import SourceWriter

    wide = needs_wide_offsets(plan.program, sizes)
    w = SourceWriter()
    outer, inner = _split_rows(plan)
    rows = row_axes(w, plan, sizes, wide, "", outer)
    if inner is None:
        w(f"{L}seg = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]")
        w(f"{L}col = tl.arange(0, BLOCK_N)[None, :]")
    else:   # segments × positions × rows, the rows (contiguous) innermost
        rows[inner.uid] = f"{L}ax_{inner.name}"
        w(f"{L}ax_{inner.name} = tl.program_id(2) * BLOCK_K + "
          "tl.arange(0, BLOCK_K)[None, None, :]")
        # the rows' own mask stays a scalar: a read of the outer rows alone (lengths[b]) is a
        # scalar pointer, which a tile of a mask may not guard
        w(f"{L}inner_ok = {L}ax_{inner.name} < {extent(inner, sizes)}")
        w(f"{L}seg = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None, None]")
        w(f"{L}col = tl.arange(0, BLOCK_N)[None, :, None]")
    w(f"{L}out = {L}seg * {plan.width} + {L}col")
    combine = combine_function(plan.monoid)
    _terms(w, plan, sizes, rows, "a", "0", plan.low)
    head = component_names("head", plan)
    a = component_names("a", plan)
    a_tiles = a[0] if len(a) == 1 else f"({', '.join(a)})"
    w(f"{', '.join(head)} = tl.associative_scan({a_tiles}, 1, {combine}, reverse=True)")
    _terms(w, plan, sizes, rows, "b", "1", plan.shift)
    tail = component_names("tail", plan)
    b = component_names("b", plan)
    b_tiles = b[0] if len(b) == 1 else f"({', '.join(b)})"
    w(f"{', '.join(tail)} = tl.associative_scan({b_tiles}, 1, {combine})")
    total = component_names("total", plan)
    w(f"{', '.join(total)} = {combine}({', '.join(head + tail)})")
    out_tile = TileContext(axes={**rows, plan.out_axis.uid: f"{L}out"},
                           valid={**_valid(plan, rows), plan.out_axis.uid: f"{L}out_ok"},
                           sizes=sizes)
    out_tile = out_tile.child(refs=result_refs(plan, total))
    w(f"{L}out_ok = {_rows_ok(plan)} & ({L}col < {plan.width}) & "
      f"({L}out < {extent(plan.axis, sizes)})")
    for c, expr in plan.outputs:
        w(f"tl.store(out_{c.name} + ({store_offsets(c.axes, out_tile, sizes)}), "
          f"({to_triton(expr, out_tile)}).to({TL_DTYPES[c.dtypes[0]]}), mask={L}out_ok)")
    return assemble_source([(f"{name}_band", args, w.lines)])
