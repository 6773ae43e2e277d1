"""The Triton emitter of the scatter-add plan (``schedule_templates.scatter``): one kernel adds
every term into its element of an f32 accumulator with atomic adds, a second writes the outputs
from it (their epilogue: a cast, a scale).

Both walk a flat index over their axes, the innermost axis of the accumulator innermost, so a
row of values is read and added along contiguous memory (an embedding gradient's rows, a
segment's features)."""
from __future__ import annotations

import math

from .expr import TL_DTYPES, TileContext, to_triton
from .rowtile import assemble_source, store_offsets

BLOCK = 1024   # elements a program takes (not measured: a memory-bound elementwise pass)


def extent(axis, sizes: dict) -> int:
    return axis.extent if isinstance(axis.extent, int) else sizes[axis.extent]


def accumulator_axes(plan) -> tuple:
    """The accumulator's axes: the first output's order (its epilogue then reads and writes
    along the same memory)."""
    return tuple(plan.outputs[0][0].axes)


def term_axes(plan) -> tuple:
    """The axes a term runs over, the accumulator's innermost last."""
    kept = [a for a in accumulator_axes(plan) if a.uid != plan.axis.uid]
    return tuple(plan.total.over) + tuple(kept)


def counts(plan, sizes: dict) -> tuple[int, int]:
    """(terms, accumulator elements) at ``sizes``."""
    return (math.prod(extent(a, sizes) for a in term_axes(plan)),
            math.prod(extent(a, sizes) for a in accumulator_axes(plan)))


def _flat(w, axes, sizes: dict, count: int, total: int) -> TileContext:
    """Lines splitting this program's flat indices over ``axes`` (row-major); the tile context
    whose axes are those indices, every one valid where the flat index is below ``count``
    (64-bit where ``total``, the largest offset they reach, is 2³¹ or more)."""
    wide = total >= 2**31
    w("lin = tl.program_id(0)" + (".to(tl.int64)" if wide else "") +
      " * BLOCK_M + tl.arange(0, BLOCK_M)")
    w(f"ok = lin < {count}")
    w("rest = lin")
    names = {}
    for a in reversed(axes):
        names[a.uid] = f"ax_{a.name}"
        w(f"ax_{a.name} = rest % {extent(a, sizes)}")
        w(f"rest = rest // {extent(a, sizes)}")
    return TileContext(axes=names, valid={a.uid: "ok" for a in axes}, sizes=sizes)


def scatter_source(plan, name: str, sizes: dict, args: list[str]) -> str:
    """The Python source of the two kernels, ``{name}_terms`` and ``{name}_outputs``, both
    taking ``args``."""
    from .source_writer import SourceWriter

    terms, elements = counts(plan, sizes)
    acc_axes = accumulator_axes(plan)
    w = SourceWriter(False)
    tile = _flat(w, term_axes(plan), sizes, terms, max(terms, elements))
    # 64-bit where the accumulator's offsets reach 2³¹ (an index loaded as i32, times a row)
    wide = ".to(tl.int64)" if elements >= 2**31 else ""
    w(f"idx = ({to_triton(plan.index, tile)}){wide}")
    keep = ["ok", f"(idx >= 0) & (idx < {extent(plan.axis, sizes)})"]
    keep += [f"({to_triton(c, tile)})" for c in plan.conditions]
    w(f"keep = {' & '.join(keep)}")
    w(f"value = {to_triton(plan.value, tile)}")
    at = tile.child(axes={plan.axis.uid: "idx"})
    # relaxed: the adds need no order among themselves, and the kernel's end orders them before
    # the outputs' kernel reads the sums
    w(f"tl.atomic_add(acc + ({store_offsets(acc_axes, at, sizes)}), value, mask=keep, "
      "sem='relaxed')")
    first = w.lines
    w = SourceWriter(False)
    tile = _flat(w, acc_axes, sizes, elements, elements)
    w("total = tl.load(acc + lin, mask=ok, other=0.0)")
    tile = tile.child(refs={plan.total.name: "total"})
    for c, expr in plan.outputs:
        w(f"tl.store(out_{c.name} + ({store_offsets(c.axes, tile, sizes)}), "
          f"({to_triton(expr, tile)}).to({TL_DTYPES[c.dtypes[0]]}), mask=ok)")
    return assemble_source([(f"{name}_terms", args, first), (f"{name}_outputs", args, w.lines)])


def grids(plan, sizes: dict) -> tuple[tuple[int], tuple[int]]:
    """The two kernels' grids."""
    terms, elements = counts(plan, sizes)
    return (max(1, math.ceil(terms / BLOCK)),), (max(1, math.ceil(elements / BLOCK)),)
