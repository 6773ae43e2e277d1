"""Feature axes wider than a row tile holds in one block, taken in chunks.

A row tile holds its feature axes (head dims) in one power-of-two block up to
:data:`~tensorfuse.targets.triton.rowtile.MAX_FEATURE`. DeepSeek's absorbed latent attention
runs q·k over 576 features and p·v over 512: one block would be 1024 wide (q·k padded by 78 %)
and the tile's products would not fit. Past that width every feature axis is cut into chunks of
one power-of-two width (the widest of 128, 64, 32 that pads the axes least: 576 and 512 →
64): q·kᵀ is summed chunk after chunk into the one score tile, and each chunk of a weighted sum
(p·v) is a state of its own, corrected like the whole one (the rolling update's corrections are
per row). The chunks are the emitter's; the plan says how wide they are.

Up to :data:`MAX_CHUNKED_FEATURE`: the value accumulator of a 64-row tile of 512 features is 128
f32 registers a thread with 8 warps, half of what a thread has; twice that spills.
"""
from __future__ import annotations

import math

from ..errors import TargetError
from ..targets.triton.rowtile import MAX_FEATURE

MAX_CHUNKED_FEATURE = 640
CHUNK_WIDTHS = (128, 64, 32)   # narrower: more products than their tiles pay for


def feature_chunk(extents: dict) -> int | None:
    """The chunk width for feature axes of these sizes (axis uid → size), or None where the
    widest fits one block; :class:`TargetError` past :data:`MAX_CHUNKED_FEATURE`."""
    widest = max(extents.values(), default=1)
    if widest <= MAX_FEATURE:
        return None
    if widest > MAX_CHUNKED_FEATURE:
        raise TargetError(f"the feature axis has {widest} elements; the row-tile template holds "
                          f"up to {MAX_FEATURE} in one block and up to {MAX_CHUNKED_FEATURE} in "
                          "chunks (its weighted sums' accumulators in registers: wider needs a "
                          "cluster of CTAs)")
    return min(CHUNK_WIDTHS, key=lambda c: (padded(extents.values(), c), -c))


def padded(sizes, chunk: int) -> int:
    """Elements the chunks of axes of these ``sizes`` hold together."""
    return sum(math.ceil(s / chunk) * chunk for s in sizes)

