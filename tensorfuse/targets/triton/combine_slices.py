"""How many programs add a split contraction's parts: each output tile in slices of its rows.

A contraction split along its contracted axis (``ContractionKnobs.splits``) leaves every part's
f32 tile in a scratch buffer, and a second kernel adds them up (:mod:`.contraction`). Its
programs are as few as the output's tiles where a program takes a whole tile — and a split is
chosen exactly where the tiles are few.
"""
from __future__ import annotations

# A split's combine kernel takes each output tile in row slices, a program each, until there are
# about this many programs (an H100's or H200's 132 SMs) or a slice is 16 rows: a decode's p·v
# over a paged latent cache (8 sequences, 128 heads × 512 features, 8 parts) combined its 16
# tiles of 128 × 256 in 24.9 µs with a program a tile, each reading 1 MiB of parts (the H100;
# ``benchmarks.unlisted_kernels --only paged_latent_decode``)
COMBINE_PROGRAMS = 128
MIN_SLICE_ROWS = 16


def combine_slices(knobs, tiles, batch) -> int:
    """Row slices a tile of a split contraction is combined in (a program each): a power of two,
    doubled while the programs stay within :data:`COMBINE_PROGRAMS` and a slice holds
    :data:`MIN_SLICE_ROWS` rows or more."""
    slices = 1
    while 2 * slices * tiles * batch <= COMBINE_PROGRAMS and \
            knobs.block_m // (2 * slices) >= MIN_SLICE_ROWS:
        slices *= 2
    return slices
