"""Patches of a 2-D/3-D token map as TMA boxes: the sm_90a side of a token tiling
(``schedule_templates.token_tiling``), for the Hopper attention kernel.

A ``[batch·heads, tokens, D]`` tensor whose tokens are a row-major map of ``dims`` is, for the
tensor-map unit, a tensor of up to five dimensions: per map dimension ``k`` its coordinate
``c = q·d + s`` split by the dilation ``d`` into ``q`` (sub-map steps) and ``s`` (which sub-map;
left out where ``d`` is 1), the heads merged into the outermost ``q``, the head dim innermost.
A patch of a dilated sub-map (``patch[k]`` steps of ``d`` along each dimension) is then one box
— ``patch[k]`` along each ``q``, 1 along each ``s``, 64 along the head dim — landing in shared
memory in the patch's row-major order with the same 128-byte swizzle as a box of consecutive rows.
A box past the map's edge in an inner dimension reads zeros; past the outermost one it reads the
next head's tokens (the schedule masks them: they are never visible) or zeros after the last head.

What the kernel computes from here is C++ text made by the tiling's own arithmetic on
:class:`~tensorfuse.targets.index_text.CudaIndexText` (the tiling objects are duck-typed:
``dims``, ``dilation``, ``patch``, ``position``, ``coordinates``).
"""
from __future__ import annotations

import math

from ...errors import ScheduleError
from ..index_text import CudaIndexText

MAX_RANK = 5   # cuTensorMapEncodeTiled's limit


def view_rank(dims: tuple[int, ...], dilation: tuple[int, ...]) -> int:
    """Dimensions of the tensor map: the head dim, one per map dimension, one per dilation."""
    return 1 + len(dims) + sum(d > 1 for d in dilation)


def why_not_viewed(dims: tuple[int, ...], dilation: tuple[int, ...], tokens: int) -> str | None:
    """Why a ``tokens``-long axis cannot be copied as boxes of this map (None: it can)."""
    if math.prod(dims) != tokens:
        return f"the {'×'.join(map(str, dims))} map does not hold exactly the {tokens} tokens"
    if any(n % d for n, d in zip(dims, dilation)):
        return (f"the map's sides {dims} are not multiples of the dilation {dilation} (the "
                "sub-maps would differ in size)")
    if view_rank(dims, dilation) > MAX_RANK:
        return (f"a {len(dims)}-D map with dilation {dilation} needs a "
                f"{view_rank(dims, dilation)}-D tensor map; TMA has at most {MAX_RANK}")
    return None


def view_sizes(dims: tuple[int, ...], dilation: tuple[int, ...], heads: int,
               D: int) -> tuple[int, ...]:
    """The tensor map's sizes, outermost first."""
    why = why_not_viewed(dims, dilation, math.prod(dims))
    if why is not None:
        raise ScheduleError(f"token tiling on TMA: {why}")
    out = []
    for k, (n, d) in enumerate(zip(dims, dilation)):
        out.append(n // d * (heads if k == 0 else 1))
        if d > 1:
            out.append(d)
    return tuple(out) + (D,)


def view_box(patch: tuple[int, ...], dilation: tuple[int, ...]) -> tuple[int, ...]:
    """A patch's box, outermost first (64 elements of the head dim: one swizzle row)."""
    out = []
    for p, d in zip(patch, dilation):
        out.append(p)
        if d > 1:
            out.append(1)
    return tuple(out) + (64,)


def corner_function(name: str, layout) -> str:
    """``name(token, head, c)``: ``c`` (``view_rank - 1`` ints) the TMA coordinates, innermost
    first and past the head dim's, of the box whose first token is ``token`` in head ``head``."""
    coords = layout.coordinates(CudaIndexText("token"))
    lines = []
    at = 0
    for k in reversed(range(len(layout.dims))):
        c, d = CudaIndexText.of(coords[k]), layout.dilation[k]
        q = f"({c}) / {d}" if d > 1 else c
        if d > 1:
            lines.append(f"  c[{at}] = ({c}) % {d};")
            at += 1
        if k == 0:
            q = f"{q} + head * {layout.dims[0] // d}"
        lines.append(f"  c[{at}] = {q};")
        at += 1
    body = "\n".join(lines)
    return f"""__host__ __device__ __forceinline__ void {name}(int token, int head, int* c) {{
{body}
}}
"""


def position_function(name: str, tiling) -> str:
    """``name(pos, ok)``: the token at position ``pos`` of the tiled order, ``ok`` whether it is
    one (not padding past the map's edge)."""
    token, ok = tiling.position(CudaIndexText("pos"))
    return f"""__host__ __device__ __forceinline__ int {name}(int pos, bool& ok) {{
  ok = {CudaIndexText.of(ok) if ok is not None else "true"};
  return {CudaIndexText.of(token)};
}}
"""


def _box_coordinates(rank: int, inner: str, corner: str) -> str:
    """A box's coordinates: the head dim's ``inner``, then the corner's."""
    return ", ".join([inner] + [f"{corner}[{k}]" for k in range(rank - 1)])


def tma_load_call(rank: int, dst: str, tensor_map: str, inner: str, corner: str, bar: str) -> str:
    """The copy of one box: the head dim's coordinate ``inner``, then the corner's."""
    coords = _box_coordinates(rank, inner, corner)
    return f"tf_tma_load_{rank}d({dst}, {tensor_map}, {coords}, {bar})"


def tma_prefetch_call(rank: int, tensor_map: str, inner: str, corner: str) -> str:
    """The same box as :func:`tma_load_call`'s, fetched into L2 only."""
    return f"tf_tma_prefetch_{rank}d({tensor_map}, {_box_coordinates(rank, inner, corner)})"
