"""The scan template's one-pass kernel for rows cut into parts (``schedule_templates.scan``):
each program takes one part of a row, sweeps it combining its terms, publishes them, reads back
what the parts before it published (the nearest first) until one that holds everything before
its end, publishes that prefix, and sweeps its part again scanning from it — decoupled
look-back, as CUB's single-pass scan does. The second sweep reads what the first just left in
L2, so the row comes from memory once; the two-kernel form (the parts' totals, then the scan)
reads it twice.

Programs take their part by a ticket (an atomic counter), not their grid index, so a program
waits only on parts whose programs already run: the scan progresses whatever order the GPU
starts programs in. A published value and its state share one 64-bit word (state in the upper
half: 0 not yet, 1 the part's own terms, 2 everything up to the part's end), so one exchange
publishes both and a reader never sees a value without its state. Only monoids of one 32-bit
component reduced natively (a sum, max or min of f32 or i32) along rows take it
(:func:`looks_back`); a program holds one row, so the look-back's loop reduces nothing across
threads — with rows side by side (64 rows a program, the rows innermost), its cross-warp
reductions inside the loop gave some rows wrong carries on the H100 with 4 warps (right with 1
or 2), and such plans keep the two kernels."""
from __future__ import annotations

from .reductions import BUILTIN
from .scan import (L, accumulators, block, component_names, identities, prologue,
                   scanned_block, stages, terms, _assign, _combined, _fold, _head)
from .tile_text import needs_wide_offsets

# a word's states (its upper 32 bits)
AGGREGATE, INCLUSIVE = 1, 2
LOW = "0xFFFFFFFF"


# the look-back's tile: blocks of 2048 positions, parts of 16 blocks, 8 warps — of the tiles
# tried on the H100 (blocks of 1024 or 2048, parts of 1, 4 or 16 blocks, 4 or 8 warps), the
# fastest on a bf16 cumulative sum of 256 rows of 32768 (23.1 µs; the two kernels' best 28.2)
# and within 1 % of the fastest on one row of 2**26 (297.5 µs; two kernels 351.6, torch.cumsum
# 262.9) (``benchmarks.scan_kernels``)
BLOCK_N = 2048
PART_BLOCKS = 16
NUM_WARPS = 8


def looks_back(plan) -> bool:
    """Whether the plan's carry fits a published word — one component, 32 bits, a monoid
    Triton reduces natively — and its rows lie along the scan (a program then takes one row:
    the look-back's loop reduces nothing across threads)."""
    return (plan.monoid.name in BUILTIN and len(plan.dtypes) == 1 and plan.along_rows
            and accumulators(plan)[0] in ("tl.float32", "tl.int32"))


def _packed(value: str, state: "str | int", acc: str) -> str:
    """A word holding ``value``'s 32 bits and ``state`` (a variable, or an int) above them."""
    bits = f"({value}).to(tl.int32, bitcast=True)" if acc == "tl.float32" else value
    upper = str(state << 32) if isinstance(state, int) else f"({state}.to(tl.int64) << 32)"
    return f"(({bits}).to(tl.int64) & {LOW}) | {upper}"


def _unpacked(word: str, acc: str) -> str:
    bits = f"({word} & {LOW}).to(tl.int32)"
    return f"{bits}.to(tl.float32, bitcast=True)" if acc == "tl.float32" else bits


def lookback_kernel(plan, name: str, sizes: dict, args: list[str], interpreter: bool) -> tuple:
    """``{name}_lookback`` taking ``args``: a 1-D grid of (rows × ``scan_parts``) programs, one
    row a program (``BLOCK_M`` is 1: the look-back's loop then reduces nothing across threads),
    each sweeping its part's ``scan_part_blocks`` blocks twice — their terms combined, then,
    once the look-back has the carry, scanned (the second sweep reads what the first left in
    L2); ``scan_flags`` (int64, zeroed by the call) holds the ticket counter at 0 and each row's
    published words from 1 on."""
    from .source_writer import SourceWriter

    (acc,), (ident,) = accumulators(plan), identities(plan)
    carry, v, own = (component_names(s, plan) for s in ("carry", "v", "own"))
    w = SourceWriter(interpreter)
    w(f"{L}ticket = tl.atomic_add(scan_flags, 1)")
    part = f"{L}ticket % scan_parts"
    if plan.direction == "suffix":   # a suffix's parts from the row's end: its first ones
        part = f"scan_parts - 1 - {part}"
    rows = prologue(w, plan, sizes, needs_wide_offsets(plan.program, sizes),
                    tile=f"{L}ticket // scan_parts", part=part)
    w(f"{carry[0]} = tl.full([BLOCK_M, 1], {ident}, {acc})")
    _head(w, plan, sizes, rows, carry)   # the row's first part only
    w(f"{own[0]} = tl.full([BLOCK_M, 1], {ident}, {acc})")
    w.sweep(f"{L}k", "0", f"{L}nb", "1", stages(plan))
    with w.block():
        terms(w, plan, sizes, rows, block(plan))
        _fold(w, plan, component_names("r", plan), v, "BLOCK_N")
        _assign(w, own, _combined(plan, own, component_names("r", plan)))
    first, step, inside = (f"{L}part == 0", "- 1", f"{L}p >= 0") \
        if plan.direction == "prefix" else \
        (f"{L}part == scan_parts - 1", "+ 1", f"{L}p < scan_parts")
    w(f"{L}first = {first}")
    w(f"{L}word_at = scan_flags + 1 + {L}row * scan_parts")
    # the first part holds everything before its end at once; the others their own terms
    w(f"{L}state = tl.where({L}first, {INCLUSIVE}, {AGGREGATE})")
    # published by an atomic exchange: a plain store may be held back past the look-back's
    # loop, and the parts after this one would wait the longer
    w(f"tl.atomic_xchg({L}word_at + {L}part, "
      f"{_packed(_combined(plan, carry, own), f'{L}state', acc)}, "
      f"mask={L}row_ok, sem=\"release\")")
    # look back: the parts before this one, nearest first, until one holds everything before
    # it; a row done once it has (rows past the end, and the first part, from the start)
    w(f"{L}done = (~{L}row_ok) | {L}first")
    w(f"{L}p = {L}part {step}")
    w(f"while ({inside}) & (tl.min({L}done.to(tl.int32)) == 0):")
    with w.block():
        w(f"{L}word = tl.load({L}word_at + {L}p, mask=~{L}done, other=0, volatile=True)")
        w(f"{L}seen = tl.where({L}done, {INCLUSIVE}, ({L}word >> 32).to(tl.int32))")
        # every row's part published: take them all, or wait (spin) for the latecomers
        w(f"{L}ready = tl.min({L}seen) > 0")
        w(f"{L}take = {L}ready & (~{L}done)")
        w(f"{L}there = {_unpacked(f'{L}word', acc)}")
        # the earlier part's value comes before the carry gathered so far
        _assign(w, [f"{L}later"], _combined(plan, [f"{L}there"], carry))
        w(f"{carry[0]} = tl.where({L}take, {L}later, {carry[0]})")
        w(f"{L}done = {L}done | ({L}take & ({L}seen == {INCLUSIVE}))")
        w(f"{L}p = tl.where({L}ready, {L}p {step}, {L}p)")
    w(f"tl.atomic_xchg({L}word_at + {L}part, "
      f"{_packed(_combined(plan, carry, own), INCLUSIVE, acc)}, "
      f"mask={L}row_ok & (~{L}first), sem=\"release\")")
    w.sweep(f"{L}k", "0", f"{L}nb", "1", stages(plan))
    with w.block():
        scanned_block(w, plan, sizes, terms(w, plan, sizes, rows, block(plan)), carry)
    return f"{name}_lookback", args, w.lines
