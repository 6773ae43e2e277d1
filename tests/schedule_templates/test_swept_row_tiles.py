"""Programs that take several row tiles in turn where each row is swept in blocks
(``Knobs.row_tiles``): the nested sweeps they make, their numbers through Triton's interpreter,
and what is still refused with the reason."""
from __future__ import annotations

import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.errors import TargetError
from tests.helpers import check_interpreted
from tests.schedule_templates.swept_row_tiles_check import CASES, template

pytest.importorskip("triton", reason="the row template generates Triton kernels")


def test_each_row_tile_is_swept_in_blocks_in_turn():
    source = template(K.softmax, 128, 4).source(M=7, N=512)
    lines = [line.strip() for line in source.splitlines() if line.strip().startswith("for ")]
    assert lines[0] == "for row_tile in range(0, 4, 1):", lines
    assert lines[1].startswith("for start_n in range(0, 512, BLOCK_N)"), lines
    assert "offs_m = (pid_m * 4 + row_tile) * BLOCK_M + tl.arange(0, BLOCK_M)" in source


@pytest.mark.parametrize("kernel, knobs, sizes", [
    (K.softmax, dict(block=128, rows=1, row_tiles=4), dict(M=6, N=512)),
    # sums down the rows, each row one block: 16 tiles of 2 rows over programs of 3
    (tf.grad(K.rmsnorm), dict(rows=2, row_tiles=3), dict(M=32, N=256))])
def test_tiles_a_program_takes_past_the_rows_are_masked(kernel, knobs, sizes):
    """Every tile is whole, but the last program's last tiles lie past the rows: its loads and
    stores are masked by the rows (they read and wrote past the tensors)."""
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.row_reduction import row_reduction
    from tensorfuse.targets import get_target

    spec = get_target("cuda:sm_90a")
    _, fusion = choose(kernel.program, spec)
    source = row_reduction(kernel, fusion, spec, **knobs).source(**sizes)
    assert f"(offs_m[:, None] < {sizes['M']})" in source


def test_a_split_sweep_is_not_taken_a_tile_after_another():
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.row_reduction import row_reduction
    from tensorfuse.targets import get_target

    spec = get_target("cuda:sm_90a")
    _, fusion = choose(K.softmax.program, spec)
    made = row_reduction(K.softmax, fusion, spec, block=128, rows=1, splits=2, row_tiles=2)
    with pytest.raises(TargetError, match="several row tiles of a split sweep only where a "
                                          "whole row is one block"):
        made.source(M=7, N=512)


def test_swept_row_tiles_interpreted():
    check_interpreted("tests.schedule_templates.swept_row_tiles_check", CASES)
