"""Which key-block width the Hopper attention kernel's mask favours: a model of a block's cost
(its keys' products plus a fixed overhead) summed over the blocks a mask's schedule visits on a
sample of row blocks, per bucket of sequence lengths. The plan
(:func:`.hopper_attention_plan.wide_blocks_pay`) asks it where wider blocks might pay."""
from __future__ import annotations

import math

from ..dsl.expr import Expr
from .attention_chain import AttentionChain

# A key block's cost beyond its keys' products, in keys (the softmax correction, the O rescale,
# the barriers): fitted to the H100's block_n 128 → 176 changes (``benchmarks.hopper_attention``),
# which this model predicts within a point for causal at S = 4096 and 16384 and the sliding
# window.
BLOCK_OVERHEAD_KEYS = 18.6
SAMPLED_ROW_BLOCKS = 8


def length_bucket(chain: AttentionChain, sizes: dict) -> tuple:
    """Self-attention's sizes with its length (queries and keys alike) rounded up to a power of
    two: the block schedule is sampled there, so every length of a bucket gets the same block
    size (as PyTorch's own kernels bucket by powers of two; the lengths measured, 4096 and 16384,
    are their own). Other query and key lengths are their own bucket: a mask may depend on their
    difference (causal from the bottom right), which rounding each would change."""
    rows, cols = chain.dims[3], chain.dims[4]
    if sizes[rows] != sizes[cols]:
        return tuple(sorted(sizes.items()))
    top = 1 << max(0, sizes[rows] - 1).bit_length()
    return tuple(sorted({**sizes, rows: top, cols: top}.items()))


def wide_costs_less(mask: Expr, chain: AttentionChain, sizes: dict, scalars: dict | None,
                    wide: int, block_m: int, narrow: int, head_dim: int) -> bool:
    """Whether ``wide``-key blocks cost less than ``narrow`` ones under ``mask`` at ``sizes``
    (``block_m`` query rows a block, the tiles' ``head_dim``), on a sample of row blocks."""
    from .block_schedule import block_lists

    b, h, i, j = chain.axes
    # a block's fixed costs in keys of its products, which take half as long at head dim 64: the
    # overhead doubles there (causal S4096 at D64 on the H200: 192-key blocks 6 % ahead of 128)
    overhead = BLOCK_OVERHEAD_KEYS * 128 / head_dim
    rows = math.ceil(sizes[chain.dims[3]] / block_m)
    sample = sorted({round(k * (rows - 1) / max(1, SAMPLED_ROW_BLOCKS - 1))
                     for k in range(min(rows, SAMPLED_ROW_BLOCKS))})
    cost = {}
    for block_n in (narrow, wide):
        partial, full = block_lists(mask, [b, h], i, j, sizes, {}, dict(scalars or {}),
                                    block_m, block_n, "cpu", row_blocks=sample)
        cost[block_n] = int((partial | full).sum()) * (block_n + overhead)
    return cost[wide] < cost[narrow]
