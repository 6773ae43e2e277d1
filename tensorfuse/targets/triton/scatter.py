"""The Triton emitter of the scatter-add plan (``schedule_templates.scatter``): one kernel adds
every term into its element of an accumulator with atomic adds (f32; an integer sum's own
integer type, so counts stay exact past 2²⁴ — a histogram's bin of 2²⁵ hits — and do not
depend on the order of the adds), a second writes the outputs from it (their epilogue: a cast,
a scale). Where the plan compacts, a first kernel claims the slots and the accumulator holds
slots, not the output's elements; where it counts into few bins, each program counts its
block into bins of its own first (:func:`bins`).

Both walk a flat index over their axes, the innermost axis of the accumulator innermost, so a
row of values is read and added along contiguous memory (an embedding gradient's rows, a
segment's features)."""
from __future__ import annotations

import math

from ...dsl import dtypes as dt
from ...dsl.expr import Const
from .expr import TL_DTYPES, TileContext, to_triton
from .tile_text import assemble_source, store_offsets

# the kernels' own variables are named from here (``_a_ok``): never a tensor's name
L = "_a_"
BLOCK = 1024   # elements a program takes (not measured: a memory-bound elementwise pass)
# Counts into few bins (a histogram: a constant added at each term's bin, the bins one fixed
# axis): each program counts a block of terms into bins of its own (``tl.histogram``) and adds
# each bin with one atomic add. Every term's own atomic add serialised on the 256 addresses of
# a byte histogram of 2²⁶ values: 21.9 ms on the H100 against torch.bincount's 2.46; bins a
# program, blocks of 16384: 0.35 ms (4096: 0.42, 1024: 1.5; ``benchmarks.unlisted_kernels
# --only byte_histogram`` and the kernel written by hand). Up to 1024 bins (256 measured).
BINNED_BLOCK, MAX_BINS = 16384, 1024


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
    w(f"{L}lin = tl.program_id(0)" + (".to(tl.int64)" if wide else "") +
      " * BLOCK_M + tl.arange(0, BLOCK_M)")
    w(f"{L}ok = {L}lin < {count}")
    w(f"{L}rest = {L}lin")
    names = {}
    for a in reversed(axes):
        names[a.uid] = f"ax_{a.name}"
        w(f"ax_{a.name} = {L}rest % {extent(a, sizes)}")
        w(f"{L}rest = {L}rest // {extent(a, sizes)}")
    return TileContext(axes=names, valid={a.uid: f"{L}ok" for a in axes}, sizes=sizes)


def bins(plan, sizes: dict) -> int | None:
    """The bins (the scattered axis' extent, rounded up to a power of two) a program counts its
    terms into where the plan is a count into few bins (above): a constant value, an
    accumulator of the scattered axis alone, of a fixed extent up to :data:`MAX_BINS`; else
    None."""
    extent_ = plan.axis.extent
    if not isinstance(plan.value, Const) or kept_axes(plan) or compacts(plan, sizes) or \
            not isinstance(extent_, int) or extent_ > MAX_BINS:
        return None
    return 1 << max(0, extent_ - 1).bit_length()


def block(plan, sizes: dict) -> int:
    """Terms a program takes: :data:`BINNED_BLOCK` where it counts into :func:`bins`, else
    :data:`BLOCK`."""
    return BINNED_BLOCK if bins(plan, sizes) else BLOCK


def kept_axes(plan) -> tuple:
    """The accumulator's axes beside the scattered one, in its order."""
    return tuple(a for a in accumulator_axes(plan) if a.uid != plan.axis.uid)


def compacts(plan, sizes: dict) -> bool:
    """Whether the plan goes through slots at ``sizes`` (``ScatterPlan.compacts``)."""
    return plan.compacts(lambda a: extent(a, sizes))


def slots(plan, sizes: dict) -> int:
    """The slots' count where the plan compacts: the positions the index takes."""
    return math.prod(extent(a, sizes) for a in plan.positions)


def scratch_shapes(plan, sizes: dict) -> dict:
    """The call's buffers beside its arguments: the accumulator (zeroed: the output's
    shape, or a slot's row for every position), and where it compacts the slot each element
    of the scattered axis claimed (filled with the slots' count: none)."""
    if not compacts(plan, sizes):
        return {"acc": [extent(a, sizes) for a in accumulator_axes(plan)]}
    return {"acc": [slots(plan, sizes)] + [extent(a, sizes) for a in kept_axes(plan)],
            "owner": [extent(plan.axis, sizes)]}


def _index(w, plan, tile, sizes: dict, wide: bool) -> None:
    """Lines computing ``idx``, the term's element of the scattered axis, and ``keep``, whether
    it names one (out-of-range indices add nothing)."""
    w(f"{L}idx = ({to_triton(plan.index, tile)})" + (".to(tl.int64)" if wide else ""))
    w(f"{L}keep = {L}ok & ({L}idx >= 0) & ({L}idx < {extent(plan.axis, sizes)})")


def _claims(plan, sizes: dict) -> list[str]:
    """The first kernel of a compacted plan: every position claims its element's slot, the
    lowest position naming an element winning (any agreed choice would do: the terms read the
    winner, not their own position)."""
    from .source_writer import SourceWriter

    w = SourceWriter(False)
    count = slots(plan, sizes)
    tile = _flat(w, plan.positions, sizes, count, count)
    _index(w, plan, tile, sizes, False)
    w(f"tl.atomic_min(owner + {L}idx, {L}lin.to(tl.int32), mask={L}keep, sem='relaxed')")
    return w.lines


def _slot_offsets(plan, tile, sizes: dict, slot: str) -> str:
    """The offset of a slot's element in the compacted accumulator."""
    row = math.prod(extent(a, sizes) for a in kept_axes(plan))
    wide = ".to(tl.int64)" if slots(plan, sizes) * row >= 2**31 else ""
    kept = store_offsets(kept_axes(plan), tile, sizes) if kept_axes(plan) else "0"
    return f"{slot}{wide} * {row} + {kept}"


def _terms(w, plan, tile, sizes: dict, compact: bool, name: str, args: list[str]) -> list:
    """The kernels adding every term into its element with an atomic add of its own (after a
    kernel claiming the slots where the plan compacts), ``w`` holding the terms' indices."""
    w(f"{L}value = {to_triton(plan.value, tile)}")   # atomic_add casts it to the accumulator's
    if compact:
        w(f"{L}slot = tl.load(owner + {L}idx, mask={L}keep, other=0)")
        where = _slot_offsets(plan, tile, sizes, f"{L}slot")
    else:
        where = store_offsets(accumulator_axes(plan),
                              tile.child(axes={plan.axis.uid: f"{L}idx"}), sizes)
    # relaxed: the adds need no order among themselves, and the kernel's end orders them before
    # the outputs' kernel reads the sums
    w(f"tl.atomic_add(acc + ({where}), {L}value, mask={L}keep, sem='relaxed')")
    kernels = [(f"{name}_claims", args, _claims(plan, sizes))] if compact else []
    return kernels + [(f"{name}_terms", args, w.lines)]


def scatter_source(plan, name: str, sizes: dict, args: list[str]) -> str:
    """The Python source of the kernels (``{name}_claims`` where the plan compacts, then
    ``{name}_terms`` and ``{name}_outputs``), all taking ``args``."""
    from .source_writer import SourceWriter

    compact = compacts(plan, sizes)
    terms, elements = counts(plan, sizes)
    acc_axes = accumulator_axes(plan)
    w = SourceWriter(False)
    # 64-bit where the accumulator's offsets reach 2³¹ (an index loaded as i32, times a row);
    # a slot's offsets widen on their own (_slot_offsets)
    tile = _flat(w, term_axes(plan), sizes, terms, terms if compact else max(terms, elements))
    _index(w, plan, tile, sizes, not compact and elements >= 2**31)
    if plan.conditions:
        w(f"{L}keep = {L}keep & {' & '.join(f'({to_triton(c, tile)})' for c in plan.conditions)}")
    binned = bins(plan, sizes)
    if binned:   # the block's counts, scaled by the constant, one atomic add a bin
        bin_ids = f"tl.arange(0, {binned})"
        w(f"{L}binned = tl.histogram(tl.where({L}keep, {L}idx, 0).to(tl.int32), {binned}, "
          f"mask={L}keep)")
        w(f"{L}value = ({L}binned * {to_triton(plan.value, tile)})"
          f".to({TL_DTYPES[plan.accumulator]})")
        w(f"tl.atomic_add(acc + {bin_ids}, {L}value, mask={bin_ids} < {extent(plan.axis, sizes)}, "
          "sem='relaxed')")
        kernels = [(f"{name}_terms", args, w.lines)]
    else:
        kernels = _terms(w, plan, tile, sizes, compact, name, args)
    w = SourceWriter(False)
    tile = _flat(w, acc_axes, sizes, elements, elements)
    zero = "0" if dt.is_int(plan.accumulator) else "0.0"
    if compact:
        # an element no position named has no slot: its sum is zero
        w(f"{L}slot = tl.load(owner + {tile.axes[plan.axis.uid]}, mask={L}ok, other=0)")
        w(f"{L}total = tl.load(acc + ({_slot_offsets(plan, tile, sizes, L + 'slot')}), "
          f"mask={L}ok & ({L}slot < {slots(plan, sizes)}), other={zero})")
    else:
        w(f"{L}total = tl.load(acc + {L}lin, mask={L}ok, other={zero})")
    tile = tile.child(refs={plan.total.name: f"{L}total"})
    for c, expr in plan.outputs:
        w(f"tl.store(out_{c.name} + ({store_offsets(c.axes, tile, sizes)}), "
          f"({to_triton(expr, tile)}).to({TL_DTYPES[c.dtypes[0]]}), mask={L}ok)")
    kernels.append((f"{name}_outputs", args, w.lines))
    return assemble_source(kernels)


def grids(plan, sizes: dict) -> list[tuple[int]]:
    """The kernels' grids, in the source's order."""
    terms, elements = counts(plan, sizes)
    made = [(max(1, math.ceil(n / block(plan, sizes))),) for n in (terms, elements)]
    return [(max(1, math.ceil(slots(plan, sizes) / BLOCK)),)] + made \
        if compacts(plan, sizes) else made
