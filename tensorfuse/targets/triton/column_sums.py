"""Emission of a row kernel's sums down the rows (``schedule_templates.column_sums``): the
row tiles a program sweeps, its per-column partials, and the second kernel of the source that
adds the partials up and writes the outputs that read them.

The partial rows live in the call's f32 scratch (``colpart_<sum>``: one row of the swept axis per
program, programs ordered batch entry-major), so the sums are the same on every run: no atomics.
"""
from __future__ import annotations

import math

from ...dsl.expr import Symbol
from .expr import TL_DTYPES, TileContext, literal, to_triton
from .row_grid import grid
from .reductions import reduced

# parts (rows of partials) the finishing kernel adds per step, the most columns a program of it
# takes, and the programs it aims at (about one an SM): not measured apart, a few microseconds
# beside the row kernel (``benchmarks.rows_backward``)
FINISH_PARTS, FINISH_MAX_COLUMNS, FINISH_PROGRAMS = 32, 128, 128


def partial_names(plan) -> list[str]:
    """The scratch arguments holding each sum's partial rows."""
    return [f"colpart_{cs.name}" for cs in plan.column_sums]


def parts(plan, knobs) -> int:
    """Partial rows per sum: the row kernel's programs."""
    return math.prod(grid(plan, knobs))


def scratch_shapes(plan, knobs) -> list[tuple[str, tuple]]:
    """(argument name, shape) of each sum's partial rows, f32."""
    return [(name, (parts(plan, knobs), plan.cols)) for name in partial_names(plan)]


def _identity(cs) -> str:
    return literal(cs.monoid.identity_value(0, "f32"), "f32")


def _combined(cs, a: str, b: str, sizes: dict) -> str:
    combined = cs.monoid.combine_exprs([Symbol("__a", "f32")], [Symbol("__b", "f32")])[0]
    return to_triton(combined, TileContext(axes={}, symbols={"__a": a, "__b": b}, sizes=sizes))


def open_partials(w, plan) -> None:
    """Each sum's running partial over the program's row tiles, one value per column."""
    for cs in plan.column_sums:
        w(f"cs_{cs.name} = tl.full([BLOCK_N], {_identity(cs)}, tl.float32)")


def add_tile(w, plan, tile: TileContext, valid: str) -> None:
    """Add this row tile's contributions (rows and columns that exist: ``valid``) to the
    partials; ``tile`` holds the chain's finals and the outputs' loads."""
    for cs in plan.column_sums:
        body = f"tl.where({valid}, {to_triton(cs.body, tile)}, {_identity(cs)})"
        w(f"cs_{cs.name} = " + _combined(cs, f"cs_{cs.name}",
                                         reduced(cs.monoid, body, 0), plan.sizes))


def store_partials(w, plan, knobs) -> None:
    """Store the program's partial rows (after its last tile)."""
    rows = grid(plan, knobs)[0]
    w("offs_n = tl.arange(0, BLOCK_N)")
    program = f"(pid_b * {rows} + pid_m)"
    for cs in plan.column_sums:
        w(f"tl.store(colpart_{cs.name} + {program} * {plan.cols} + offs_n, cs_{cs.name}, "
          f"mask=offs_n < {plan.cols})")


def finish_body(plan, knobs, outs: dict, interpreter: bool) -> list[str]:
    """The lines of the kernel that adds the partial rows up and writes the outputs reading the
    sums (``outs``: output compute name -> its argument). One program per block of columns.
    ``interpreter``: for Triton's CPU interpreter (a loop bound read from an argument)."""
    from .source_writer import SourceWriter

    w = SourceWriter(interpreter)
    cols, total = plan.cols, parts(plan, knobs)
    block = finish_columns(plan)
    w(f"offs_c = tl.program_id(0) * {block} + tl.arange(0, {block})")
    w(f"ok_c = offs_c < {cols}")
    w(f"offs_p = tl.arange(0, {FINISH_PARTS})")
    refs = {}
    for cs in plan.column_sums:
        ident = _identity(cs)
        w(f"sum_{cs.name} = tl.full([{block}], {ident}, tl.float32)")
        w.sweep("p0", "0", str(total), str(FINISH_PARTS))
        with w.block():
            w(f"ok_p = (p0 + offs_p[:, None]) < {total}")
            w(f"_cs_v = tl.load(colpart_{cs.name} + (p0 + offs_p[:, None]) * {cols} + "
              f"offs_c[None, :], mask=ok_p & ok_c[None, :], other={ident})")
            w(f"sum_{cs.name} = " + _combined(cs, f"sum_{cs.name}",
                                              reduced(cs.monoid, "_cs_v", 0), plan.sizes))
        refs[cs.name] = f"sum_{cs.name}"
    tile = TileContext(axes={plan.col.uid: "offs_c"}, valid={plan.col.uid: "ok_c"}, refs=refs,
                       sizes=plan.sizes)
    for c, expr, kind in plan.outputs:
        if kind == "colsum":
            w(f"tl.store({outs[c.name]} + offs_c, ({to_triton(expr, tile)})"
              f".to({TL_DTYPES[c.dtypes[0]]}), mask=ok_c)")
    return w.lines


def finish_columns(plan) -> int:
    """Columns a program of the finishing kernel adds up (a power of two, 16 to
    :data:`FINISH_MAX_COLUMNS`)."""
    each = max(1, plan.cols // FINISH_PROGRAMS)
    return max(16, min(FINISH_MAX_COLUMNS, 1 << (each.bit_length() - 1)))


def finish_grid(plan) -> tuple[int]:
    return (math.ceil(plan.cols / finish_columns(plan)),)
