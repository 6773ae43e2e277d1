"""The row-reduction template: softmax, norms, cross-entropy and any rolled chain along rows, as
one Triton kernel that holds a whole row in registers when it fits (one read, one write: the
memory-bound ideal) and otherwise sweeps it in blocks with the rolling update."""
from __future__ import annotations

import math
from dataclasses import replace

from ..algebra import plan_chain
from ..algebra.exprs import nodes
from ..dsl.expr import Axis, Load
from ..targets import TargetSpec
from ..targets.triton.kernel import TritonKernel, Tuned
from ..targets.triton.row_states import (lanewise_states, referenced_lanes, reloadable,
                                          uncorrected_states)
from ..targets.triton.row_grid import grid
from ..targets.triton.row_realign import realignment
from ..targets.triton.tile_text import needs_wide_offsets
from ..targets.triton.rowtile import SWEPT_IN_L2
from .attention import SMS
from .fusion import Fusion
from .tile_plan import Knobs, RowTilePlan, TilePlanner

MAX_ROW_BLOCK = 16384  # elements of a row held at once (fp32 registers across the CTA)
SWEPT_BLOCK = 4096     # the blocks a row of uncorrected states up to SWEPT_IN_L2 is swept in


def _whole_row_block(cols: int) -> int:
    """The block that holds a whole row (a power of two), up to :data:`MAX_ROW_BLOCK`."""
    return min(1 << max(4, (cols - 1).bit_length()), MAX_ROW_BLOCK)


def _swept_loads(plan: RowTilePlan, outputs: bool = False):
    """The loads of the chain's members (and, with ``outputs``, of its outputs) that the sweep
    reads: indexed by the swept axis."""
    bodies = [b for m in plan.chain.members for b in plan.chain.bodies[m.name]]
    for body in bodies + ([expr for _, expr, _ in plan.outputs] if outputs else []):
        for n in nodes(body):
            if isinstance(n, Load) and any(a.uid == plan.col.uid for a in n.axes):
                yield n


def rows_contiguous(plan: RowTilePlan) -> bool:
    """Whether the chain reduces across a strided axis: a tensor it sweeps is laid out with the
    row axis innermost (log-softmax over the channels of ``[B, C, P]``), so a tile's
    neighbouring rows, not its columns, are neighbours in memory."""
    return any(n.indices and isinstance(n.indices[-1], Axis) and
               n.indices[-1].uid == plan.row.uid for n in _swept_loads(plan))


def writes_down_rows(plan: RowTilePlan) -> bool:
    """Whether an output along the sweep is laid out with the row axis innermost: a layer norm
    over the channels of ``[B, D, S]`` run on a channels-last input in its memory order
    (:mod:`tensorfuse.memory_order`) reads rows of D and writes ``out[b, d, s]``, so a tile's
    stores run down its rows (:data:`TRANSPOSED_ROWS`)."""
    return any(kind == "col" and c.axes and c.axes[-1].uid == plan.row.uid
               for c, _, kind in plan.outputs)


def weighs_the_sweep(plan: RowTilePlan) -> bool:
    """Whether the chain reads a tensor along the swept axis alone (a weight per swept element:
    the vector of a matrix-vector product over a strided axis, ``a[k, i] · x[k]``)."""
    return any({a.uid for a in n.axes} == {plan.col.uid} for n in _swept_loads(plan))


def row_operands(plan: RowTilePlan) -> int:
    """How many tensors the chain and its outputs read along the row (indexed by both the row
    and the swept axis): a backward's input and incoming gradient are two."""
    return len({n.param.name for n in _swept_loads(plan, outputs=True)
                if any(a.uid == plan.row.uid for a in n.axes)})


# Reducing across a strided axis: tiles of 64 contiguous rows × the whole row where the tile
# holds up to 32k elements (a warp per 4096 elements of the tile, at least 4: 64 × 512 with 4
# spilled 820-1074 bytes, ptxas sm_90a), the row kept in registers (not read again); rows of up
# to 1024 in 32-row tiles, a few a program (TILED_CONTIGUOUS, below); wider rows are swept in
# 32 × 512 blocks by 4 warps, each block's loads issued while the one before is reduced (2
# stages). On the H200 (``benchmarks.strided_rows_knobs``, GPU time, bf16): log-softmax
# over C=150 of [8, 150, 65536] 0.082 ms in one 64 × 256 tile with 4 warps (8 warps: 0.115; read
# again: 0.086; torch.compile 0.156); layer norm over D=1024 of [8, 1024, 4096] 0.051 ms swept in
# 32 × 512 blocks, 2 stages (64 × 256: 0.057, unpipelined 0.062; the whole row, 32 × 1024 with 8
# warps: 0.062; torch.compile 0.063); the max over S=512 of [64, 512, 4096] 0.063-0.064 in one
# block of 512 (torch.compile 0.063). The row-major default (8 rows × 256) ran the log-softmax at
# 988 GB/s (``benchmarks.user_kernels``).
CONTIGUOUS_ROWS, CONTIGUOUS_TILE = 64, 32768
# ... on 4 warps whatever the tile where the outputs are per row (the tile is not stored again):
# a log-sum-exp over S=512 of [64, 512, 4096] 0.130 -> 0.085 ms (64 × 512; 32 × 512 0.081,
# torch.compile 0.126; 36 bytes spilled, ptxas), the max over S 0.064 -> 0.063
# (``benchmarks.strided_rows_knobs --only logsumexp_pool,max_pool``, H200)
PER_ROW_TILE_WARPS = 4
SWEPT_CONTIGUOUS = (32, 512, 4, 2)   # rows, block, warps and stages of a wider strided row
# Rows of 4096 columns held whole that read two tensors along the row (a norm's or a softmax's
# backward: x and the incoming gradient) run on 4 warps, not 8: on the H200 RMSNorm's backward
# row kernel at [8192, 4096] 0.054 ms against 0.059, layer norm's 0.062 against 0.067
# (``benchmarks.rows_backward --sweep``); rows reading one such tensor keep 8
TWO_OPERAND_ROW, TWO_OPERAND_WARPS = 4096, 4
# Rows read along the sweep whose outputs along it have the row axis innermost
# (:func:`writes_down_rows`): tiles of 16 rows (a store of 32 bytes, a sector, in bf16), held
# whole, by one warp where the row is at most 256 wide, else 8. On the H100 from a CUDA graph
# (``probe`` sweep of the knobs on ``benchmarks.layout_kernels``' kernels): the log-softmax over
# C=150 of a channels-last [8, 65536, 150] seen as [B, C, P] 145 µs (16 rows on 2 warps 166,
# 32 on 4 276, 64 on 4 345, 8 on 1 372; torch.compile 249); layer norm over D=1024 of a
# channels-last [8, 4096, 1024] 51.6 µs (16 rows on 16 warps 52.5, 32 rows the strided sweep's
# 32 × 1024 on 8 warps, 4 stages 61.5, 8 rows 145, the row-major default's 2 rows 300;
# torch.compile 47.1)
TRANSPOSED_ROWS, TRANSPOSED_NARROW, TRANSPOSED_WARPS = 16, 256, 8
# A long strided sweep over few row tiles — a weight gradient's sum down the rows of [M, N]:
# tiles of 64 contiguous rows (128-byte pieces) × blocks of 64, the sweep split into parts for
# about four programs an SM. RMSNorm's d_weight over the 8192 rows of [8192, 4096]: 0.039 ms
# (r64 b64 w4, 8 parts) against 0.069 in the 32 × 512 tiles above, 0.051 in 4 parts;
# torch.compile 0.036 (``benchmarks.strided_rows_knobs --only weight_gradient``)
FEW_TILES_SWEPT = (64, 64, 4, 2)
# ... blocks of 128 where one tensor is read along the sweep (the same bytes a block in flight as
# the two of a weight gradient): a mean down the 65536 rows of [65536, 1024], 16 tiles in 33
# parts, 0.058 ms in blocks of 64 → 0.038 in 128 (torch.compile 0.035), where the weight
# gradient's two tensors took 0.039 in 64 and 0.086 in 128 (``benchmarks.strided_rows_knobs
# --family parts``)
FEW_TILES_ONE_OPERAND_BLOCK = 128
# ... and where that one tensor is weighed by a vector along the sweep (``a[k, i] · x[k]`` over
# k: a matrix-vector product with the matrix's rows contiguous), tiles of 128 rows (256-byte
# pieces) × blocks of 64: on the H200 from a CUDA graph, [8192, 8192] 58.9 → 35.5 µs in 8 parts,
# the best of 72 tilings and part counts (``benchmarks.strided_rows_knobs --only
# strided_matvec``; torch.compile 44.7, cuBLAS's gemv 33.4); [16384, 4096] 59.4 → 36.0 in 16
# parts and [4096, 16384] 35.3 → 36.1 in 4 by the same sweep at those shapes
WEIGHED_FEW_TILES = (128, 64, 4, 2)
PROGRAMS_PER_SM = 4
# ... where the parts (at most MAX_PARTS) give about two programs an SM or more: batch-norm
# statistics over the 100352 rows of [100352, 256] are 4 tiles of 64 channels, 256 programs in
# 64 parts: 0.071 ms, against 0.034 in 8 tiles of 32 × 512 split in 33 parts
# (:func:`_split_few_tiles`; ``benchmarks.user_kernels``, channel_stats); more parts (66-264)
# and tiles of 64-256 channels were all slower there (``benchmarks.strided_rows_knobs --only
# channel_stats``)
MAX_PARTS = 64
# A strided row of 513-1024 elements: tiles of 32 contiguous rows × the whole row on 8 warps, the
# row held in registers, each program sweeping two tiles with the loads of the next three issued
# while one is reduced (4 stages), where that leaves at least two programs an SM. Layer norm over
# D=1024 of [8, 1024, 4096] on the H200: 0.045 ms against 0.051 swept in 32 × 512 blocks (3
# stages: 0.046; four tiles a program: 0.048-0.051; 16-row tiles: 0.054; torch.compile 0.063;
# ``benchmarks.strided_rows_knobs --tiles``); the log-softmax over C=150 and the max over S=512,
# held whole in 64-row tiles, gained nothing from several tiles a program
TILED_CONTIGUOUS = (32, 8, 4, 2)   # rows, warps, stages, row tiles a program
# A strided sweep of 4096 elements or more (16+ blocks) whose outputs run along it (so it is not
# split into parts): blocks of 256 with the loads of three ahead. The columns of [8192, 4096]
# L2-normalised (the sweep down 8192 rows, then the outputs along it): 0.056 ms against 0.069 in
# 32 × 512 blocks, 2 stages; 8 warps or 512-wide blocks with 4 stages 0.056-0.058;
# torch.compile 0.054 (``benchmarks.strided_rows_knobs --only column_norm``)
LONG_SWEEP, LONG_SWEPT_CONTIGUOUS = 4096, (32, 256, 4, 4)
# A strided sweep too long to hold whose outputs are one value a row (a masked mean over 2048
# tokens of [32, 2048, 1024], rows (b, d)): blocks of 128 by 8 warps, unpipelined — 0.041 ms
# against 0.069 in the 32 × 512 blocks of 2 stages above, 0.044 with 3-4 stages, 64-row tiles
# 0.044-0.047; torch.compile 0.056 (``benchmarks.strided_rows_knobs --only masked_mean``). Rows
# whose outputs run along them lost with it (layer norm over D=1024: 0.104 against 0.051).
# Tiles of twice the rows where 32-row tiles would give more than PER_ROW_PROGRAMS_PER_SM
# programs an SM: tokens summed with weights over [64, 4096, 1024] (2048 tiles of 32 rows) took
# 0.151 ms in 32-row tiles, 0.126 in 64 (torch.compile 0.120), the masked mean (1024 tiles)
# 0.041 in 32 and 0.049 in 64 (``benchmarks.strided_rows_knobs --only masked_mean,weighted_pool
# --family strided``)
SWEPT_PER_ROW = (32, 128, 8, 1)
PER_ROW_PROGRAMS_PER_SM = 8
# Rows laid out along the row (softmax, norms, a group norm's flat row) are swept without the
# pipeline: on the H200 (``benchmarks.rows_sweep --stages``) it took softmax over 2048 × 65536
# from 82 to 62 % of copy, cross-entropy 73 -> 67 %, layernorm 56 -> 60 %, and the [16384, 8192]
# rows in blocks of 4096 10-25 % lower; a group norm's 65536-element rows 0.054 -> 0.062 ms
# (``benchmarks.strided_rows_knobs``)
ROW_MAJOR_STAGES = 1
# A sweep bounded per program (ragged segments, :mod:`.sweep_bounds`) across contiguous rows:
# tiles of the rows whole (up to 1024) by blocks of 16, the loads three blocks ahead. The means
# of 2048 segments of 1-128 rows of 1024 on the H200: 0.0815 ms against 0.112 in 64 × 128 blocks
# (the whole sweep one block, 16 programs a segment), 0.096 unpipelined, 0.101 in 512 × 32;
# torch.compile 0.238 (``benchmarks.strided_rows_knobs --only segment_mean --family ragged
# --cold``). Where whole rows leave few programs, narrower tiles by longer blocks: the means of
# 32 sequences' first 512-2048 tokens of 1024 took 0.0369 ms in 64 × 128 blocks, 0.0394 in
# 64 × 256, 0.0426 in 32 × 128 (torch.compile 0.0646; ``--only lengths_mean``)
BOUNDED_ROWS, BOUNDED_BLOCK, BOUNDED_WARPS, BOUNDED_STAGES = 1024, 16, 4, 3
BOUNDED_TILE, BOUNDED_PROGRAMS, BOUNDED_NARROWEST = 8192, 4, 64


# Rows off 16-byte boundaries swept through aligned windows (:mod:`..targets.triton.row_realign`):
# blocks of 4096, so that all but a row's first and last blocks lie inside every row and test
# nothing. On the H200, 8192 rows of 50257: softmax 1.16 ms in blocks of 16384, 0.81 in 4096
# (1.27 before the windows; torch.compile 1.09), cross-entropy 0.57 / 0.36 (0.70; 0.63);
# 4096 rows of 151937 cross-entropy 0.65 / 0.50 (``benchmarks.rows_vocab``)
REALIGNED_BLOCK = 4096
NARROW_ROW, NARROW_ROWS = 8, 128   # a row this narrow: its block, and the rows a program (below)


def default_knobs(plan: RowTilePlan, target: TargetSpec) -> Knobs:
    """The knobs by the row's layout and width (:func:`_tile_knobs`), its sweep split into parts
    where too few row tiles would leave most of a GPU idle (:func:`_split_few_tiles`); a plan
    with sums down the rows holds whole rows and sweeps several tiles a program
    (:func:`_summing`); rows off 16-byte boundaries that the kernel reads through aligned
    windows take blocks of :data:`REALIGNED_BLOCK`. A chain with members held to one block
    (``Chain.held``) holds each row whole, unsplit."""
    knobs = _tile_knobs(plan, target)
    if plan.chain.held:
        return _held_whole(plan, knobs)
    if plan.column_sums:
        return _summing(plan, knobs)
    if knobs.block_n > REALIGNED_BLOCK and plan.cols > REALIGNED_BLOCK:
        narrow = _split_few_tiles(plan, replace(knobs, block_n=REALIGNED_BLOCK), target)
        wide = needs_wide_offsets(plan.program, plan.sizes)   # as the emitter asks it
        if narrow.splits == 1 and realignment(plan, narrow, False, wide) is not None:
            return narrow
    split = _split_few_tiles(plan, knobs, target)
    if target.kind == "cuda" and split.splits > 1 and rows_contiguous(plan) and \
            referenced_lanes(plan):
        rows, block, warps, stages = LANES_SWEPT
        return _split_few_tiles(plan, Knobs(block_m=rows, block_n=block, num_warps=warps,
                                            num_stages=stages, reload=0, lanes=1), target)
    return split


# A variance down a strided axis of few tiles, split in parts (a batch norm's statistics): its
# sums kept per lane (Knobs.lanes) in tiles of 64 rows × blocks of 64, loads two blocks ahead.
# On the H100, [100352, 256] bf16 from cold L2: 36.6 µs against 39.5 in the 32 × 512 blocks
# reduced across the warps every block (33 parts; torch.compile 41.4); the same 64 × 64 tiles
# without lanes 66.2, 32 × 64 77.1 against 39.3 with (``benchmarks.strided_rows_knobs --only
# channel_stats --family lanes --cold``). Flat rows gained nothing (a group norm's); ROCm not
# measured (its tiles kept)
LANES_SWEPT = (64, 64, 4, 3)


# A plan with sums down the rows (a norm's backward with its weight gradient): about two
# programs an SM, each sweeping its share of the row tiles with the loads of the next two issued
# while one is reduced (3 stages), the row held in registers for the outputs (not read again),
# and storing one partial row of each sum. On the H200 at [8192, 4096] bf16 (32 rows a program,
# 4 warps; ``benchmarks.rows_backward --sweep``, from a CUDA graph): RMSNorm's backward 0.058 ms
# (2 stages, the row read again: 0.075; 16 rows a program: 0.064; 64: 0.064), layer norm's
# 0.075 (0.095); the staged floor had taken 0.103 and 0.132, torch.compile 0.088 and 0.113
SUMMING_PROGRAMS, SUMMING_STAGES = 2 * SMS, 3
# ... its tile's rows halved until the tensors read along the row fit 32k elements together, and
# a row that fills those alone read again for the outputs rather than held: a layer norm's
# backward over D=1024 of [8, 1024, 4096] (x and the incoming gradient) in 32-row tiles on 8
# warps spilled 1696 bytes, in 16-row tiles 36; over a row of 16384 held it spilled 1464, read
# again 20 (ptxas sm_90a; not timed)
SUMMING_TILE = 32768


def _held_whole(plan: RowTilePlan, knobs: Knobs) -> Knobs:
    """``knobs`` with each row one block (up to :data:`MAX_ROW_BLOCK`: wider rows are refused,
    and run as the floor's stages), one part, sums reduced across the row (members held to
    one block read their dependencies' row values)."""
    block_n = max(knobs.block_n, _whole_row_block(plan.cols))
    block_m = knobs.block_m
    while block_m > 1 and block_m * block_n > MAX_ROW_BLOCK:
        block_m //= 2
    return replace(knobs, block_m=block_m, block_n=block_n, splits=1, lanes=0, reload=0)


def _summing(plan: RowTilePlan, knobs: Knobs) -> Knobs:
    block_n, block_m = max(knobs.block_n, _whole_row_block(plan.cols)), knobs.block_m
    held = lambda rows: rows * block_n * max(1, row_operands(plan))  # noqa: E731
    while block_m > 1 and held(block_m) > SUMMING_TILE:
        block_m //= 2
    reload = int(held(1) >= SUMMING_TILE and reloadable(plan))
    tiles = math.prod(grid(plan, Knobs(block_m=block_m, block_n=block_n)))
    return replace(knobs, block_m=block_m, block_n=block_n, splits=1, reload=reload,
                   num_stages=SUMMING_STAGES, row_tiles=max(1, math.ceil(tiles / SUMMING_PROGRAMS)))


# A sweep whose outputs are per row is split where the row tiles are fewer than half the SMs: a
# batch norm's statistics over the 100352 rows of [100352, 256] are 8 tiles of 32 channels, each
# sweeping every row alone otherwise. About two parts per SM, each of at least two blocks, at
# most 64 (the attention template's decode takes the same count; the parts merge in the same
# launch). Outputs along the row (a softmax's) are written by the merging program alone, so
# only their statistics would run in parallel: not split (not measured).
SPLIT_BELOW_TILES = SMS // 2
# ... and a sweep that is one tile alone (a value over every axis: :mod:`.unit_rows`) in two parts
# an SM: on the H200 the largest magnitude of 8192 × 8192 bf16 (an fp8 scale) took 78 µs in 64
# parts of 16 warps, 51 in 264, 55-58 in 528; its merge reads a value a part. The default 0.050
# ms against torch.compile's 0.052 (``benchmarks.full_reductions``)
ONE_TILE_PARTS = 2 * SMS


# ... but a sweep whose outputs run along it (a softmax's) is not split: only the program that
# merges the parts would hold the statistics to write them. Where its row tiles are as few and
# its sweep at least this many blocks long, one kernel leaves most of the GPU idle, so
# tf.compile runs the statistics as a stage of their own (outputs per row: split over the GPU)
# and the outputs as another (its floor, :func:`.auto.templated_stages`). A log-softmax down the
# first axis of [V, B] f32 on the H200, one kernel → two stages (torch.compile): [32000, 64]
# 215 → 32 µs (37), [128256, 16] 803 → 22 (28), [32000, 8] 195 → 15 (34), [4096, 64] 31 → 13
# (35), [32000, 1024] 214 → 109 (145) (``benchmarks.unlisted_kernels --only
# log_softmax_vocab_major``; the others a probe's). Knobs given or tuned, and the template
# applied by hand, keep the one kernel.
OUTPUTS_ALONG_FEW_TILES_BLOCKS = 16


def few_tiles_for_outputs(plan: RowTilePlan, knobs: Knobs, target: TargetSpec) -> str | None:
    """Why ``plan`` at ``knobs`` should not run as one kernel (:data:`OUTPUTS_ALONG_FEW_TILES_
    BLOCKS`), or None."""
    if not target.is_gpu or plan.outputs_per_row or plan.mask is not None or plan.column_sums:
        return None
    tiles, blocks = _tiles_and_blocks(plan, knobs)
    if tiles >= SPLIT_BELOW_TILES or blocks < OUTPUTS_ALONG_FEW_TILES_BLOCKS:
        return None
    return (f"{tiles} row tile(s) of {plan.program.name} would each sweep {plan.cols} elements "
            f"({blocks} blocks) with outputs along the sweep, which one kernel cannot split "
            "over the GPU: the statistics and the outputs run as stages of their own")


def _tiles_and_blocks(plan: RowTilePlan, knobs: Knobs) -> tuple[int, int]:
    """The row tiles of the launch's grid at ``knobs``, and the blocks each sweeps."""
    return math.prod(grid(plan, knobs)), math.ceil(plan.cols / knobs.block_n)


def _splittable(plan: RowTilePlan, target: TargetSpec) -> bool:
    return target.is_gpu and plan.mask is None and plan.outputs_per_row


def _split_few_tiles(plan: RowTilePlan, knobs: Knobs, target: TargetSpec) -> Knobs:
    if knobs.splits > 1 or not _splittable(plan, target):
        return knobs
    tiles, blocks = _tiles_and_blocks(plan, knobs)
    if tiles >= SPLIT_BELOW_TILES or blocks < 4:
        return knobs
    most = ONE_TILE_PARTS if tiles == 1 else MAX_PARTS
    return replace(knobs, splits=max(2, min(round(2 * SMS / tiles), blocks // 2, most)))


def _bounded_knobs(plan: RowTilePlan, whole: int) -> Knobs:
    """A sweep bounded per program across contiguous rows: the rows whole (up to
    :data:`BOUNDED_ROWS`), narrower where that leaves fewer than :data:`BOUNDED_PROGRAMS` an SM
    (a mean over each of 32 sequences' tokens: 32 tiles of 1024), the block then as long as
    keeps the tile's elements (:data:`BOUNDED_TILE`)."""
    rows = min(BOUNDED_ROWS, _whole_row_block(plan.rows))
    while rows > BOUNDED_NARROWEST and \
            _tiles_and_blocks(plan, Knobs(block_m=rows))[0] < BOUNDED_PROGRAMS * SMS:
        rows //= 2
    block = min(max(BOUNDED_BLOCK, BOUNDED_TILE // rows), whole)
    return Knobs(block_m=rows, block_n=block, num_warps=BOUNDED_WARPS,
                 num_stages=BOUNDED_STAGES, reload=0)


def _tile_knobs(plan: RowTilePlan, target: TargetSpec) -> Knobs:
    cols = plan.cols
    block_n = _whole_row_block(cols)
    across_rows = rows_contiguous(plan)   # asked once: it walks the plan's loads
    if target.kind == "cuda" and (across_rows or writes_down_rows(plan)):
        if not across_rows and TRANSPOSED_ROWS * block_n <= CONTIGUOUS_TILE:
            return Knobs(block_m=TRANSPOSED_ROWS, block_n=block_n,
                         num_warps=1 if block_n <= TRANSPOSED_NARROW else TRANSPOSED_WARPS,
                         num_stages=1, reload=0)
        if plan.bounds is not None and plan.outputs_per_row:
            return _bounded_knobs(plan, block_n)
        if CONTIGUOUS_ROWS * block_n > CONTIGUOUS_TILE:
            rows, block, warps, stages = FEW_TILES_SWEPT
            if row_operands(plan) == 1:
                block = FEW_TILES_ONE_OPERAND_BLOCK
                if weighs_the_sweep(plan):
                    rows, block, warps, stages = WEIGHED_FEW_TILES
            tiles = math.prod(grid(plan, Knobs(block_m=rows, block_n=block)))
            parts = min(MAX_PARTS, math.ceil(plan.cols / block) // 2,
                        max(2, round(PROGRAMS_PER_SM * SMS / tiles)))
            if tiles < SMS and _splittable(plan, target) and \
                    tiles * parts >= PROGRAMS_PER_SM * SMS // 2:
                return Knobs(block_m=rows, block_n=block, num_warps=warps, num_stages=stages,
                             reload=0, splits=parts)
            rows, warps, stages, row_tiles = TILED_CONTIGUOUS
            if rows * block_n <= CONTIGUOUS_TILE and \
                    math.prod(grid(plan, Knobs(block_m=rows, block_n=block_n))) >= \
                    2 * row_tiles * SMS:
                return Knobs(block_m=rows, block_n=block_n, num_warps=warps, num_stages=stages,
                             reload=0, row_tiles=row_tiles)
            long = cols >= LONG_SWEEP and not _splittable(plan, target)
            # (not a sweep of so few tiles that it is split into parts: batch-norm statistics'
            # 32 × 512 blocks in 33 parts were measured, below)
            per_row = plan.outputs_per_row and math.prod(grid(
                plan, Knobs(block_m=SWEPT_PER_ROW[0], block_n=SWEPT_PER_ROW[1]))) >= SMS
            rows, block, warps, stages = LONG_SWEPT_CONTIGUOUS if long else \
                SWEPT_PER_ROW if per_row else SWEPT_CONTIGUOUS
            if per_row and not long and math.prod(grid(plan, Knobs(block_m=rows, block_n=block))) \
                    > PER_ROW_PROGRAMS_PER_SM * SMS:
                rows *= 2
            return Knobs(block_m=rows, block_n=block, num_warps=warps, num_stages=stages,
                         reload=0)
        return Knobs(block_m=CONTIGUOUS_ROWS, block_n=block_n,
                     num_warps=PER_ROW_TILE_WARPS if plan.outputs_per_row else
                     max(4, CONTIGUOUS_ROWS * block_n // 4096), num_stages=1, reload=0)
    # a row of 4097-8192 columns whose states are sums kept per lane (RMSNorm's Σx²): swept in
    # two blocks of 4096 by 16 warps, read twice (held in L2 between the passes) — Inductor's
    # shape; RMSNorm over 8192 at 1.0004x torch.compile against 0.997x in one block, the scaled
    # one 0.997-1.0004x against 0.996-0.998x (``benchmarks.rows_sweep --swept``; over 16384
    # columns four blocks lost to one: 96 against 98.7 % of copy; ROCm
    # and rows whose outputs are per row — read once either way —: not measured, kept)
    if target.kind == "cuda" and SWEPT_BLOCK < cols <= SWEPT_IN_L2 and \
            uncorrected_states(plan) and reloadable(plan):
        return Knobs(block_m=1, block_n=SWEPT_BLOCK, num_warps=16, num_stages=1, reload=0)
    # rows of at most 8 columns and no tensor-core products (a router's softmax over 8 experts):
    # blocks of the row's 8 (not 16, half of them masked), 128 rows on 4 warps a program, the
    # row held in registers rather than read again — 524288 × 8 f32 softmax 13.8 -> 11.2 µs on
    # the H200 (torch.compile 12.8; 64 rows on one warp 11.3, 256 rows 12.0-12.5; read again
    # 12.1-12.8). Measured with ``benchmarks.rows_sweep.made`` and ``benchmarks.unlisted_kernels``
    contracts = bool(plan.locals) or any(sp.contraction for sp in plan.states)
    if target.kind == "cuda" and cols <= NARROW_ROW and not contracts:
        rows = min(NARROW_ROWS, 1 << max(0, (plan.rows - 1).bit_length()))
        return Knobs(block_m=rows, block_n=NARROW_ROW, num_warps=4, num_stages=ROW_MAJOR_STAGES,
                     reload=0)
    # about 2048 elements a program (the measured wide rows' tile: 16 × 128 … 2 × 1024); rows
    # narrower than 128 take more rows, up to the rows there are, not 16 (a router's softmax over
    # 8 experts of 524288 rows had 32768 programs of 16 rows × 16 columns)
    rows_per_program = max(1, min(2048 // block_n, 1 << max(0, (plan.rows - 1).bit_length())))
    # 8 warps for a row of 4097-8192 columns in one block: on the H200 (4.25 TB/s) 16 warps held
    # the rows with extra operands to 79-87 % of a copy of their bytes against 91-96 % with 8
    # (the library softmax: 97 % either way); on the H100 16 had measured 0.2-0.8 % ahead
    # (``benchmarks.rows_sweep``). 16 warps from 16384 columns on
    # (CUDA; measured on the H100 only; ROCm: 8)
    widest = 16 if target.kind == "cuda" else 8
    warps = widest if block_n >= 16384 else 8 if block_n >= 4096 else 4 if block_n >= 1024 else 2
    if target.kind == "cuda" and block_n == TWO_OPERAND_ROW and row_operands(plan) >= 2:
        warps = TWO_OPERAND_WARPS
    if target.kind == "cuda" and cols > block_n and not contracts:
        block_n, warps = _swept_block(plan, block_n, warps)
    # a row in one block read again for the outputs: +0.3-1.4 % on the H100 for softmax, norms
    # and rows with extra operands, layernorm over 16384 columns 74 -> 98 % of copy (the row no
    # longer held in registers across the reductions; benchmarks/rows_sweep.py --reload,
    # ``benchmarks.rows_sweep``; ROCm: not measured, kept off)
    reload = int(target.kind == "cuda" and cols <= block_n and reloadable(plan))
    if target.kind == "cuda" and block_n == MASKED_NARROW[0] and 4 * cols <= 3 * block_n and \
            cols > block_n // 2 and not contracts:
        rows_per_program, warps, reload = MASKED_NARROW[1], MASKED_NARROW[2], 0
    return Knobs(block_m=rows_per_program, block_n=block_n, num_warps=warps,
                 num_stages=ROW_MAJOR_STAGES, reload=reload)


# Rows of 129-192 columns (blocks of 256, a quarter or more of them masked) without products: 4
# rows a program on one warp, the row held. The log-softmax over the 150 channels of a channels-last
# [8, 65536, 150] bf16 read in memory order, on the H100 from a CUDA graph: 110.7 µs against
# 182 in the 8 × 256 tiles on 2 warps read again (8 rows on 1 warp 119.7, 2 rows 160, 4 rows on
# 2 warps 151.7; torch.compile 249; a ``probe`` knob sweep on ``benchmarks.layout_kernels``)
MASKED_NARROW = (256, 4, 1)   # the block, rows a program, warps


# A row swept in blocks whose states are reduced across the warps every block (each a barrier
# and a round through shared memory), more than 3 of them: 4 warps on blocks of 8192 — a KL
# divergence written with two logsumexps (6 states) over 4096 × 32000 bf16 took 347 µs on 16
# warps, 210 on 4 (4096-column blocks 227; 8 warps 284). Where states are kept per lane, more
# than one of them (an argmax's value and index): blocks of 8192 on 16 warps, 64 registers a
# thread against 126 for 16384 — 512 × 128256 65 -> 56 µs. The H200, knob grids through
# ``row_reduction`` on ``benchmarks.monoid_kernels``' kernels; a log-sum-exp's 2 states per
# block stay on 16 warps (93 % of copy). The library's layer norm over 2048 × 65536 (its 4
# states) moves too: 233 -> 217 µs (torch.compile 240; blocks of 4096 on 8 warps 210).
BLOCK_REDUCED_STATES, SWEPT_FEW_WARPS = 3, (8192, 4)
LANE_STATES_BLOCK = 8192
# States kept per lane beside states reduced across the warps every block (a mean's sum beside a
# maximum and the sum it corrects: a cross-entropy with label smoothing): blocks of 4096 on 8
# warps — on the H200 over 8192 × 32768 bf16 0.305 → 0.177 ms (8192 on 16 warps 0.231, on 8
# 0.219; its 16384-blocks took 102 registers a thread, one CTA an SM); the same row without the
# mean took 0.172 in 16384-blocks. Rows of lane states alone keep their blocks (a row sum over
# 32768 the same in every block; an RMS scale over 65536 0.087 ms, 0.100 in 4096-blocks)
# (``benchmarks.variant_kernels``' kernels through ``row_reduction``'s knobs; the defaults are
# the suite's rows)
MIXED_STATES_SWEEP = (4096, 8)


def _swept_block(plan: RowTilePlan, block_n: int, warps: int) -> tuple[int, int]:
    lanes = lanewise_states(plan)
    if len(plan.states) - len(lanes) > BLOCK_REDUCED_STATES:
        block, few = SWEPT_FEW_WARPS
        return min(block_n, block), few
    if lanes and len(plan.states) > len(lanes):
        block, fewer = MIXED_STATES_SWEEP
        return min(block_n, block), min(warps, fewer)
    if len(lanes) > 1:
        return min(block_n, LANE_STATES_BLOCK), warps
    return block_n, warps


def knob_choices(plan: RowTilePlan, target: TargetSpec) -> dict[str, tuple[int, ...]]:
    """The values tuning tries for each knob (the defaults among them)."""
    default, whole = default_knobs(plan, target), _whole_row_block(plan.cols)
    blocks = sorted({default.block_n, whole} | {b for b in (1024, 2048, 4096, 8192) if b < whole})
    rows = sorted({default.block_m} | {r for r in (1, 2, 4, 8) if r * default.block_n <= 16384}
                  | ({16, 32, 128} if rows_contiguous(plan) or writes_down_rows(plan)
                     else set()))
    if plan.bounds is not None:   # a ragged sweep: blocks near its short rows' length
        blocks = sorted(set(blocks) | {b for b in (16, 32, 64) if b < whole})
        rows = sorted(set(rows) | {r for r in (256, 512) if r < default.block_m})
    splits = {1, default.splits} | ({default.splits // 2, min(64, default.splits * 2)}
                                     if default.splits > 1 else set())
    choices = {"block_m": tuple(rows), "block_n": tuple(blocks), "num_warps": (2, 4, 8, 16),
               "num_stages": (1, 2, 3), "splits": tuple(sorted(splits)),
               "reload": (0, 1) if reloadable(plan) else (0,),
               "lanes": (0, 1) if referenced_lanes(plan) else (0,)}
    if plan.chain.held:   # whole rows, never split (rowtile.held_refusal)
        choices.update(block_n=(default.block_n,), splits=(1,), lanes=(0,),
                       block_m=tuple(r for r in rows if r * default.block_n <= MAX_ROW_BLOCK))
    elif plan.column_sums:   # whole rows, never split; the row tiles a program sweeps
        tiles = default.row_tiles
        choices.update(block_n=(default.block_n,), splits=(1,), row_tiles=tuple(sorted(
            {tiles, max(1, tiles // 4), max(1, tiles // 2), tiles * 2})))
    elif default.row_tiles > 1:   # a strided row held whole: its tiles, one or a few a program
        choices.update(block_n=(default.block_n,), splits=(1,), row_tiles=(1, 2, 4))
    return choices


def row_reduction(kernel, fusion: Fusion, target: TargetSpec, rows: int | None = None,
                  block: int | None = None, num_warps: int | None = None,
                  num_stages: int | None = None, reload: bool | None = None,
                  splits: int | None = None, row_tiles: int | None = None,
                  lanes: bool | None = None, tuned: Tuned | None = None,
                  dynamic: "bool | None" = False, staged_few_tiles: bool = False) -> TritonKernel:
    """A callable Triton kernel for ``kernel`` with ``fusion`` applied along its rows.
    ``reload``: a row held in one block is read again (from L2) for the outputs instead of kept
    in registers (``Knobs.reload``; ignored where the outputs do not run along the row).
    ``splits``: parts of the sweep run in parallel, the last of a row tile's merging (default:
    split where the row tiles are few, :func:`default_knobs`; 1: never).
    ``row_tiles``: row tiles a program sweeps, where the kernel adds sums down the rows up in
    its pass (a norm's weight gradient; default: about two programs an SM), or, given, one
    after the other where each row is swept in blocks (a group norm's 65536-element rows: no
    faster than one a program on the H200, ``strided_rows_knobs --family swept_tiles``).
    ``lanes``: a variance's sums (states kept relative to moving sums) kept per lane, the sums'
    references fixed after the first block (``Knobs.lanes``; ignored where the chain has none).
    ``tuned``: the compile entry point's lookup of tuning records (used unless knobs are given).
    ``dynamic``: which sizes the kernel reads as arguments (:mod:`~tensorfuse.targets.triton.
    size_builds`: ``True`` all, ``False`` none, ``None`` those seen at a second value).
    ``staged_few_tiles`` (``tf.compile``'s own choice): at its defaults the kernel refuses sizes
    it would run on a few programs (:func:`few_tiles_for_outputs`), which tf.compile's floor then
    runs as stages; a template applied by hand runs them."""
    program = kernel.program if hasattr(kernel, "program") else kernel
    chain = plan_chain(program, fusion.names, fusion.axis, held=fusion.held)

    def knobs(plan: RowTilePlan) -> Knobs:
        k = default_knobs(plan, target)
        return Knobs(rows or k.block_m, block or k.block_n, num_warps or k.num_warps,
                     num_stages or k.num_stages, splits=k.splits if splits is None else splits,
                     reload=k.reload if reload is None else int(reload),
                     row_tiles=row_tiles or k.row_tiles,
                     lanes=k.lanes if lanes is None else int(lanes))

    explicit = any(v is not None for v in (rows, block, num_warps, num_stages, reload, splits,
                                            row_tiles, lanes))
    return TritonKernel(TilePlanner(program, chain), target, knobs,
                        f"row-reduction template ({fusion.describe()})", fusion,
                        tuned=None if explicit else tuned, dynamic=dynamic,
                        refuse=None if explicit or not staged_few_tiles else
                        (lambda plan, k: few_tiles_for_outputs(plan, k, target)),
                        given=dict(rows=rows, block=block, num_warps=num_warps,
                                   num_stages=num_stages, reload=reload, splits=splits,
                                   row_tiles=row_tiles, lanes=lanes))
