"""The persistent schedule chosen from the tiles' costs (schedule_templates.tile_order): the two
makespans simulated exactly, and the choice the H100 measurements (``benchmarks.hopper_attention``)
agree with."""
from __future__ import annotations

import heapq

import numpy as np
import pytest

from tensorfuse.schedule_templates.tile_order import (MARGIN, SIMULATED, TILE_COST,
                                                      greedy_bounds, greedy_makespan,
                                                      pick_persistent, snake_makespan)


def one_tile_at_a_time(costs, ctas: int) -> float:
    """Greedy claiming simulated the plain way: a heap of the CTAs' free times."""
    free = [0.0] * ctas
    for cost in costs:
        heapq.heapreplace(free, free[0] + cost)
    return max(free)


def attention_blocks(row_blocks: int, heads: int, blocks) -> list[int]:
    """Key blocks per tile in the kernel's order: head-major, the last row block first."""
    return [blocks(row_blocks - 1 - t % row_blocks) for t in range(row_blocks * heads)]


def test_makespans_by_hand():
    # two CTAs; greedy: 5 → A, 4 → B, 3 → B (free at 4), 1 → A (free at 5): A 6, B 7
    assert greedy_makespan([5, 4, 3, 1], 2) == 7
    # snake: round 0 A 5, B 4; round 1 backwards: B 3, A 1 → A 6, B 7
    assert snake_makespan([5, 4, 3, 1], 2) == 7
    # the snake wins: round 0 A 1, B 4; round 1 B 1, A 4 → 5; greedy: A 1, B 4, A 2, A 6
    assert snake_makespan([1, 4, 1, 4], 2) == 5
    assert greedy_makespan([1, 4, 1, 4], 2) == 6
    # greedy wins: A 1, B 1, A 2, B 3, A 3; the snake: A 1, B 1, B 2, A 3, A 4
    assert greedy_makespan([1, 1, 1, 2, 1], 2) == 3
    assert snake_makespan([1, 1, 1, 2, 1], 2) == 4
    assert greedy_makespan([1.0] * 10, 3) == snake_makespan([1.0] * 10, 3) == 4


@pytest.mark.parametrize("row_blocks, heads, blocks, expected", [
    (32, 32, lambda rb: rb + 1, "snake"),              # causal, S=4096: 503 vs 479 TFLOP/s
    (32, 32, lambda rb: min(rb + 1, 9), "snake"),      # sliding window 1024: 365 vs 354
    (32, 64, lambda rb: rb + 1, "snake"),              # GQA causal 32 heads: 505 vs 497
    (128, 32, lambda rb: rb + 1, "dynamic"),           # causal, S=16384: 537 vs 566
    (128, 64, lambda rb: rb + 1, "dynamic"),           # GQA causal, S=16384: 560 vs 571
    (32, 32, lambda rb: 32, "dynamic"),                # every tile alike: no gain to take
])
def test_the_choice_agrees_with_the_h100(row_blocks, heads, blocks, expected):
    assert pick_persistent(attention_blocks(row_blocks, heads, blocks), 132) == expected


def test_too_many_tiles_or_one_cta_is_not_simulated():
    assert pick_persistent([1] * (SIMULATED + 1), 132) == "dynamic"
    assert pick_persistent(attention_blocks(32, 32, lambda rb: rb + 1), 1) == "dynamic"


@pytest.mark.parametrize("seed", range(6))
def test_rounds_of_tiles_match_a_tile_at_a_time(seed):
    """The round-at-a-time simulation against the heap, on costs with ties, zeros and long tails;
    the bounds that skip it hold around it, and the choice is the one the heap would make."""
    rng = np.random.default_rng(seed)
    for _ in range(40):
        tiles, ctas = int(rng.integers(1, 3000)), int(rng.integers(2, 200))
        costs = rng.integers(0, int(rng.choice([2, 9, 130])), tiles) + TILE_COST
        if seed % 2:   # attention's shape: costs falling within each head
            costs = np.sort(costs)[::-1]
        exact = one_tile_at_a_time(costs.tolist(), ctas)
        assert greedy_makespan(costs, ctas) == exact
        least, most = greedy_bounds(costs, ctas)
        assert least <= exact <= most
        wanted = "snake" if exact > MARGIN * snake_makespan(costs, ctas) else "dynamic"
        assert pick_persistent((costs - TILE_COST).astype(int).tolist(), ctas) == wanted
