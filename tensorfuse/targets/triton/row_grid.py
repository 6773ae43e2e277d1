"""Where a row-tile kernel's programs sit: the launch grid (row blocks by batch entries, in the
order CUDA's limits allow), the block lists' length per row block, and the feature block."""
from __future__ import annotations

import math

from ...errors import TargetError


# the arguments of the block lists a masked sweep walks (made per call; not where the mask only
# bounds the sweep: :mod:`.row_bounds`)
MASK_ARGS = ("bm_partial_num", "bm_partial_idx", "bm_full_num", "bm_full_idx")


def list_length(plan, knobs) -> int:
    """Entries per row block of the block lists."""
    if plan.key_windows is not None:
        return plan.key_windows.bound
    return math.ceil(plan.cols / knobs.block_n)


def grid(plan, knobs) -> tuple[int, int]:
    """``(row blocks, batch entries)``: the programs a launch runs (:func:`launch_grid` orders
    them on the grid)."""
    batch = plan.grid_batch_size
    rows = plan.row_tiling.padded if plan.row_tiling is not None else plan.rows
    # a program may sweep several row tiles (Knobs.row_tiles: whole rows, the next tile's
    # loads issued while one is reduced; a plan with sums down the rows)
    return (math.ceil(math.ceil(rows / knobs.block_m) / knobs.row_tiles), batch)


MAX_GRID_YZ = 65535   # CUDA's limit on a grid's second and third dimensions (the first: 2³¹ − 1)


def batch_first(plan, knobs) -> bool:
    """Whether the batch entries go on the grid's first dimension instead of its second: more of
    them than the second holds (a paged cache's scores, [B, H, pages] of them)."""
    return grid(plan, knobs)[1] > MAX_GRID_YZ


def launch_grid(plan, knobs, *more: int) -> tuple[int, ...]:
    """The launch grid: row blocks and batch entries (the batch first where
    :func:`batch_first`), then ``more``; a clear error where neither order fits CUDA's limits."""
    rows, batch = grid(plan, knobs)
    if any(n > MAX_GRID_YZ for n in more):
        raise TargetError(f"{max(more)} parts of the sweep: CUDA grids hold at most "
                          f"{MAX_GRID_YZ} blocks on their third dimension")
    if min(rows, batch) > MAX_GRID_YZ:
        raise TargetError(f"{rows} row blocks and {batch} batch entries: CUDA grids hold at most "
                          f"{MAX_GRID_YZ} blocks on all but one dimension (larger row blocks, or "
                          "fewer batch entries, would fit)")
    return ((batch, rows) if batch_first(plan, knobs) else (rows, batch)) + more


def block_k(plan) -> int:
    return plan.feature_block


def merged_apart(plan, knobs) -> bool:
    """Whether the split update's parts are merged by a kernel of their own, a program per row
    tile and chunk of the weighted sums' features, rather than by each tile's last part: where
    those sums are taken in chunks, the last part alone read every part's whole accumulator
    (DeepSeek's latent decode, 8 parts of 64 heads × 512 features: 1 MiB a tile, its loads
    spilled) — on the H100 97 µs, 82.5 with the merge kernel (``benchmarks.unlisted_kernels
    --only latent_attention_decode``, its row "tensorfuse one kernel")."""
    return knobs.splits > 1 and plan.feature_chunk is not None and \
        any(sp.contraction is not None for sp in plan.states)


def merge_chunks(plan) -> int:
    """The programs a row tile's merge kernel runs (:func:`merged_apart`): its weighted sums'
    most feature chunks."""
    return max(plan.feature_chunks(plan.state_feature(sp)) for sp in plan.states
               if sp.contraction is not None)
