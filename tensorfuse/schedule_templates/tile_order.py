"""Which persistent schedule balances a kernel's tiles best, from what each tile costs.

Persistent CTAs take tiles either *dynamically* (each claims the next unclaimed tile when it is
done: greedy list scheduling in tile order) or in a fixed *snake* (rounds of one tile per CTA,
forwards in even rounds and backwards in odd ones). Which finishes first depends on the costs:
for attention whose tiles get cheaper within each head (causal, sliding window, prefix-LM at
moderate lengths) the snake pairs each round's longest tiles with the next round's shortest and
finishes earlier; for long rows, or irregular costs, greedy claiming wins. Both are simulated
here on the tiles' costs (key blocks, plus a fixed cost per tile) and the earlier one is chosen.

On the H100 (``benchmarks.hopper_attention``, S = 4096 and 16384, eight masks) the simulation
picked the faster
schedule in every case, predicting about twice the measured gap.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

TILE_COST = 0.5       # a tile's own cost (queries, output), in key blocks
SIMULATED = 1 << 17   # more tiles than this: not simulated (greedy claiming, the robust choice)
MARGIN = 1.01         # the snake only where it is predicted clearly faster


def greedy_makespan(costs: Sequence[float], ctas: int) -> float:
    """When the last of ``ctas`` CTAs finishes, each claiming the next tile when free.

    Simulated exactly, a round of tiles at a time (the first call at a new prompt length
    simulates this: a heap step per tile took 0.45 ms at 1552 tiles): with the CTAs sorted by
    when they are free, the next ``b`` tiles go to the ``b`` earliest CTAs in order as long as
    none of those tiles ends before the last of those CTAs is free — the heap would pick the same
    CTAs, since it always takes the earliest and a CTA it gave a tile to is not earlier than any
    it takes after."""
    costs = np.asarray(costs, dtype=np.float64)
    free = np.zeros(max(1, ctas))
    at = 0
    while at < len(costs):
        free.sort()
        count = min(len(free), len(costs) - at)
        ends = free[:count] + costs[at:at + count]
        # the round may take tile t + 1 where its CTA is free by the time tiles 0..t all end
        keeps = free[1:count] <= np.minimum.accumulate(ends)[:count - 1]
        taken = count if keeps.all() else int(keeps.argmin()) + 1
        free[:taken] = ends[:taken]
        at += taken
    return float(free.max())


def greedy_bounds(costs: np.ndarray, ctas: int) -> tuple[float, float]:
    """Bounds on :func:`greedy_makespan` without simulating: at least the work shared evenly
    and the longest tile; at most, over every tile, all the work before it shared evenly plus
    its own cost (a tile starts no later than when the CTAs have done the earlier tiles'
    work, all of them busy until then)."""
    before = np.cumsum(costs) - costs
    return (max(float(costs.sum()) / ctas, float(costs.max())),
            float((before / ctas + costs).max()))


def snake_makespan(costs: Sequence[float], ctas: int) -> float:
    """When the last CTA finishes with tiles dealt in alternating rounds: CTA ``c`` takes tiles
    ``c, 2·ctas − 1 − c, 2·ctas + c, …``."""
    turn, slot = np.divmod(np.arange(len(costs)), ctas)
    cta = np.where(turn % 2 == 0, slot, ctas - 1 - slot)
    # each CTA's tiles summed in tile order (a first call at a new size simulates this per call)
    return float(np.bincount(cta, weights=np.asarray(costs, dtype=np.float64), minlength=ctas).max())


def pick_persistent(blocks: Sequence[int], ctas: int) -> str:
    """``"snake"`` or ``"dynamic"`` for tiles of ``blocks`` key blocks each (in tile order)."""
    if len(blocks) > SIMULATED or ctas < 2:
        return "dynamic"
    return _simulated_pick(np.asarray(blocks, dtype=np.int32).tobytes(), ctas)


@functools.lru_cache(maxsize=64)   # keys of 4 bytes a tile: at most 32 MB at SIMULATED tiles
def _simulated_pick(blocks: bytes, ctas: int) -> str:
    """:func:`pick_persistent` by simulation, kept per tiles: prompt lengths with as many key
    blocks (a causal mask's 128 lengths a block of keys) have the same tiles. The greedy
    claiming is simulated only where its bounds leave the choice open."""
    costs = np.frombuffer(blocks, dtype=np.int32) + TILE_COST
    snake = MARGIN * snake_makespan(costs, ctas)
    least, most = greedy_bounds(costs, ctas)
    if least > snake:
        return "snake"
    if most <= snake:
        return "dynamic"
    return "snake" if greedy_makespan(costs, ctas) > snake else "dynamic"
