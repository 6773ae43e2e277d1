"""Rows that start off 16-byte boundaries, read and written in 16-byte vectors anyway.

A row kernel over ``[M, W]`` bf16 with ``W`` not a multiple of 8 starts each row at another
offset modulo 16 bytes, and Triton, which vectorises an access only where it can prove the
address aligned and its mask the same across the vector, reads and writes such rows element by
element, with a test per element: on the H200 a softmax over 8192 rows of GPT-2's 50257 words
took 1.27 ms (31 % of the copy bandwidth; torch.compile 1.09), 2.4 times as long as over 50264.

Here a row is swept in *windows* that start on the 16-byte boundary at or before the row's
start: position ``n`` of a window is the row's column ``n - shift`` (``shift``: the row's start
modulo 16 bytes, per row), positions outside ``[0, W)`` hold a neighbouring row's elements and
are left out of everything the kernel computes (the column mask), and every load of the row's
tensors reads whole aligned 16-byte vectors. The tensor's last elements past its last whole
vector (fewer than one vector, all in the last row) are read by one more block, element by
element, in the program that holds that row: no load reads outside the tensor. An output of the
rows' shape is written at the same aligned positions. The sweep runs in three parts: its first
block and the blocks from the last that lies inside every row on hold the rows' ends and test
each element; the blocks between lie inside every row of the program and test nothing, so their
loads and stores are whole vectors with no per-element work. In blocks of 4096 (the default
here: ``schedule_templates.row_reduction.REALIGNED_BLOCK``) that softmax takes 0.80 ms, the
cross-entropy over the same logits 0.36 (0.70 element by element; ``benchmarks.rows_vocab``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...dsl import dtypes as dt
from ...dsl.expr import Axis, Load, walk

VECTOR_BYTES = 16


@dataclass(frozen=True)
class Realignment:
    """How a kernel reads its rows through windows: ``vector`` elements of the narrowest realigned
    type in 16 bytes, the tensors read that way (``params``; each read with the columns as its
    innermost index, all of one shape), their element count (``count``) and the elements in whole
    vectors from their start (``whole``; ints, or size arguments' names in text)."""

    vector: int
    params: frozenset
    count: object
    whole: object
    sample: Load = field(compare=False)   # one of the reads: its offset at column 0 starts a row
    # rows of an odd width start at every element: stores at the rows' ends go element by element
    # (rows of an even width: two elements or more a store)
    odd: bool = False

    def window_columns(self, N) -> str:
        """The positions a window sweeps to cover any row's shift and its ``N`` columns."""
        return f"{N} + {self.vector - 1}"

    def prologue(self, row_offset: str, N) -> list[str]:
        """Each row's start (``row_offset``: its first element's offset in the tensors), the
        16-byte boundary at or before it, the shift between them, and the window position past
        the row's last vector."""
        v = self.vector
        return [f"row_at = {row_offset}", f"al_m = row_at // {v} * {v}", "sh_m = row_at - al_m",
                f"end_m = (sh_m + {N} + {v - 1}) // {v} * {v}",
                f"mid_n = tl.maximum(({N} - {v}) // BLOCK_N * BLOCK_N, BLOCK_N)"]

    def block(self, N, tail: bool, interior: bool = False) -> list[str]:
        """A block's lines after ``offs_n``: its positions in the tensors, the loads' mask
        (``in_n``: the row's whole vectors — a block past the row's end reads nothing of the
        next rows' —, or in the tail block the elements past the tensor's last whole vector) and
        the columns of the row it holds (``col_ok``); a block inside every row needs neither."""
        if interior:
            return ["flat_n = al_m + offs_n[None, :]"]
        inside = f"(flat_n >= {self.whole}) & (flat_n < {self.count})" if tail else \
            f"(flat_n < {self.whole}) & (offs_n[None, :] < end_m)"
        return ["flat_n = al_m + offs_n[None, :]", f"in_n = {inside}",
                f"col_ok = (offs_n[None, :] >= sh_m) & (offs_n[None, :] - sh_m < {N}) & in_n"]

    def inner_stores(self) -> str | None:
        """The mask of an edge block's store where the row's first and last vectors are stored
        apart (:meth:`edge_vectors`): its whole vectors between them. Rows of an odd width only:
        ``col_ok`` tests each element against the row's shifted ends, and Triton writes a block
        stored under it element by element (32 two-byte stores a thread in blocks of 4096 where 2
        would do: a softmax over 4096 × 6623 bf16 0.122 → 0.062 ms, odd widths from 5000 to
        32000 20-35 % faster); rows of an even width are stored two elements or more at a time,
        and the vectors apart, a load and a store more a row, cost them 5-12 %
        (``benchmarks.dynamic --only row_widths``). None: ``col_ok`` stays."""
        if not self.odd:
            return None
        v = self.vector
        return f"in_n & (offs_n[None, :] >= {v}) & (offs_n[None, :] < end_m - {v})"

    def edge_vectors(self, N) -> list[tuple[str, str]]:
        """``(window positions, which of them)`` of the row's first vector and of its last: the
        last vector ends at ``end_m``, between the ``roundup(N)`` of a row that starts on a
        boundary and a vector past it, so two vectors from ``roundup(N) - v`` hold it for every
        shift. Stored element by element under ``col_ok`` and this test."""
        v = self.vector
        return [(f"tl.arange(0, {v})", f"offs_n[None, :] < {v}"),
                (f"({N} - 1) // {v} * {v} + tl.arange(0, {2 * v})",
                 f"offs_n[None, :] >= end_m - {v}")]

    def tail_start(self, N) -> str | None:
        """Where the tail block starts in the last row's window, or None where the tensor ends on
        a whole vector. The last row starts at ``count - N``."""
        if not self.count % self.vector:   # on a size argument: a guard of the build
            return None
        v = self.vector
        return f"{self.whole} - ({self.count} - {N}) // {v} * {v}"

    def holds_tail(self, N) -> str:
        """Whether this program holds the tensor's last row (only it runs the tail block)."""
        return f"tl.max((row_at == {self.count} - {N}).to(tl.int32)) > 0"

    @staticmethod
    def column() -> str:
        """A window position's column in its row."""
        return "(offs_n[None, :] - sh_m)"

    def seen_next(self, N, tail: bool) -> str:
        """Each row's columns covered after this block (rows differ by their shifts; the blocks
        before the tail stop at the last whole vector), by arithmetic on the row's window: a sum
        of the column mask per block made Triton write each element's test on its own (780 KB
        of PTX for a layer norm in blocks of 1024)."""
        if tail:
            return f"tl.full([BLOCK_M, 1], {N}, tl.int32)"
        return (f"tl.minimum(tl.maximum(tl.minimum(start_n + BLOCK_N, {self.whole} - al_m) - sh_m, "
                f"0), {N})")


def realignment(plan, knobs, single: bool, wide: bool) -> Realignment | None:
    """The windows for ``plan``'s rows where they pay and the kernel can take them, else None:
    rows swept in blocks (not one block, not split, no mask, tiling, fold, tensor-core products
    or sums down the rows, offsets within 32 bits, a vector or more of each block a thread),
    every read along the columns a plain ``[..., row, col]`` read of tensors of one shape (none
    along the columns alone: a norm's weight), and rows that do not all start on 16-byte
    boundaries."""
    if single or wide or knobs.splits != 1 or knobs.row_tiles > 1 or plan.mask is not None or \
            plan.key_windows is not None or plan.row_tiling is not None or \
            plan.fold is not None or plan.locals or plan.column_sums or \
            any(sp.contraction is not None for sp in plan.states):
        return None
    along, alone = [], []

    def visit(node):
        if isinstance(node, Load) and plan.col.uid in {a.uid for a in node.axes}:
            (along if len(node.axes) > 1 else alone).append(node)

    for sp in plan.states:
        walk(sp.body, visit)
    for _, expr, _ in plan.outputs:
        walk(expr, visit)
    if not along or alone:
        # a read along the columns alone (a norm's weight) would be gathered at each row's
        # shifted columns, element by element, for the row's 16-byte reads it buys
        return None
    shapes = set()
    for load in along:
        indices = load.indices
        if not all(isinstance(i, Axis) for i in indices) or indices[-1].uid != plan.col.uid or \
                sum(i.uid == plan.col.uid for i in indices) != 1:
            return None
        shapes.add((tuple(i.uid for i in indices), tuple(load.param.dims)))
    if len(shapes) != 1:
        return None
    first = along[0].param
    vector = VECTOR_BYTES // min(dt.to_numpy(load.param.dtype).itemsize for load in along)
    if knobs.block_m * knobs.block_n < vector * 32 * knobs.num_warps:
        return None   # a thread holds less than a vector of a block: nothing to read whole
    dims = [d if isinstance(d, int) else plan.sizes[d] for d in first.dims]
    if not dims[-1] % vector:   # every row starts on a boundary already
        return None
    count = math.prod(dims)
    return Realignment(vector, frozenset(load.param.name for load in along), count,
                       count // vector * vector, along[0], bool(dims[-1] % 2))


def sweep_parts(real: Realignment, N) -> list[tuple[str, str, bool]]:
    """``(start, stop, inside every row)`` of the sweep's parts, in window positions: the first
    block (the rows' starts), the blocks that end at least a vector before any row's end
    (``mid_n``), the rest to the windows' end."""
    return [("0", "BLOCK_N", False), ("BLOCK_N", "mid_n", True),
            ("mid_n", real.window_columns(N), False)]


def emit_sweep(w, real: Realignment, N, stages: int, body, backwards: bool = False) -> None:
    """The sweep of realigned rows: ``body(tail, inside)`` per block of each part, then the
    tensor's tail block in the program that holds its last row; ``backwards``: everything in
    the reverse order (an output pass: the blocks read last come back from L2 first)."""
    tail = real.tail_start(N)

    def tail_block():
        if tail is not None:
            w(f"if {real.holds_tail(N)}:")
            with w.block():
                w(f"start_n = {tail}")
                body(True, False)

    parts = sweep_parts(real, N)
    if backwards:
        tail_block()
    for start, stop, inside in (reversed(parts) if backwards else parts):
        if backwards:
            w.sweep("back_n", "0", f"({stop}) - ({start})", "BLOCK_N", stages)
            with w.block():
                w(f"start_n = {start} + (({stop}) - ({start}) + BLOCK_N - 1) // BLOCK_N * "
                  "BLOCK_N - BLOCK_N - back_n")
                body(False, inside)
        else:
            w.sweep("start_n", start, stop, "BLOCK_N", stages)
            with w.block():
                body(False, inside)
    if not backwards:
        tail_block()


def emit_stores(w, real: Realignment, N, stages: int, store) -> None:
    """A realigned row's output, backwards (:func:`emit_sweep`): ``store(positions, tail, inside,
    mask)`` writes the lines of one store at those window positions (``mask``: the test that
    replaces ``col_ok``, or None). Where the rows' ends are stored apart
    (:meth:`Realignment.inner_stores`), the edge blocks store their whole vectors between the
    row's first and last, then those two element by element."""
    inner = real.inner_stores()
    emit_sweep(w, real, N, stages, lambda tail, inside: store(
        "start_n + tl.arange(0, BLOCK_N)", tail, inside, None if tail or inside else inner),
        backwards=True)
    if inner is not None:
        for positions, which in real.edge_vectors(N):
            store(positions, False, False, f"col_ok & ({which})")
