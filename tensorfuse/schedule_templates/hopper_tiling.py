"""Token tiling for the Hopper attention template: queries in patches of a 2-D/3-D map, keys in
windows of it (:mod:`.token_tiling`), on the warp-specialised kernel.

The Triton template gathers a patch's tokens with per-row addresses; the Hopper kernel copies a
patch as one TMA box of the map (``targets.cuda.map_tiles``), so the same visiting order costs it
nothing per row. Its partial blocks do not evaluate the mask either: a neighbourhood's mask on a
patch is a dozen integer operations per score — more than the block's exponentials and products
cost the SM —, so the mask of each (row block, partial window) pair is computed once per call
shape on the host side, packed as one bit per score in the consumers' accumulator order
(``targets.cuda.wgmma.fragment_elements``), and copied into shared memory with the block's keys.
The bits hold only for masks of indices, sizes and scalars (the same for every batch and head),
which is what the tiling requires anyway.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra.exprs import nodes
from ..dsl.expr import Axis
from ..errors import ScheduleError
from ..targets.cuda.map_tiles import why_not_viewed
from ..targets.cuda.wgmma import fragment_bit_words, fragment_elements
from .block_schedule import _tokens, window_lists
from .mask_values import MaskEvaluator
from .token_tiling import (KeyWindows, TilingChoice, TokenTiling, choose_tiling,
                           mask_reads_tensors)

PAIRS_AT_ONCE = 256   # (row block, window) pairs whose mask is evaluated in one go


@dataclass(frozen=True)
class HopperTiling:
    """The chosen visiting order: query patches (``rows``), key windows (``cols``) of the same
    map and dilation."""

    choice: TilingChoice

    @property
    def rows(self) -> TokenTiling:
        return self.choice.rows

    @property
    def cols(self) -> KeyWindows:
        return self.choice.cols

    def describe(self) -> str:
        return self.choice.describe() + " (TMA boxes of the map; partial blocks' mask as bits)"


def choose_hopper_tiling(plan, block_m: int, block_n: int, sizes: dict, scalars: dict | None,
                         request: "dict | bool" = True) -> tuple[HopperTiling | None, str]:
    """The tiling the Hopper kernel runs ``plan`` in at these sizes and scalars, or ``None`` and
    why it keeps the flat order. ``request``: ``True`` to choose, ``False`` for the flat order, a
    dict (``Schedule.tile_as``) to fix the patches — refused with the reason where the kernel
    cannot take them."""
    asked = isinstance(request, dict)
    if request is False:
        return None, "the flat order was asked for"
    if not plan.reads_map:
        return None, "the mask does not read the sequence as a map"
    b, h, i, j = plan.chain.axes
    why = _why_flat(plan, block_m, block_n, sizes, scalars or {})
    choice = None
    if why is None:
        choice = choose_tiling(plan.mask, [b, h], i, j, sizes, dict(scalars),
                               block_m, block_n, request if asked else None)
        if choice.rows is None or choice.cols is None:
            why = ("the cheapest order found is " + choice.describe() + "; the Hopper kernel "
                   "tiles both the queries and the keys or neither")
        elif choice.rows.dims != choice.cols.dims or \
                choice.rows.dilation != choice.cols.dilation:
            why = "the queries and keys are read as different maps"
        else:
            why = why_not_viewed(choice.cols.dims, choice.cols.dilation,
                                 sizes[plan.chain.dims[4]])
    if why is not None:
        if asked:
            raise ScheduleError(f"tile_as on the hopper_attention template: {why}")
        return None, why
    return HopperTiling(choice), choice.describe()


def _why_flat(plan, block_m: int, block_n: int, sizes: dict, scalars: dict) -> str | None:
    b, h, i, j = plan.chain.axes
    M, N = (sizes[d] for d in plan.chain.dims[3:5])
    if plan.strided:
        return ("the tensors' axes are in another order than [batch, head, tokens, head dim] (a "
                "map's boxes are views of that layout)")
    if mask_reads_tensors(plan.mask):
        return "the mask reads tensors (its bits would differ per call)"
    if any(isinstance(n, Axis) and n.uid in (b.uid, h.uid) for n in nodes(plan.mask)):
        return "the mask reads the batch or head (its bits would differ per head)"
    if any(isinstance(n, Axis) and n.uid in (i.uid, j.uid) for n in nodes(plan.score)):
        return "the score reads the query or key index, which a tiled kernel renumbers"
    missing = [n for n in plan.map_scalars if n not in scalars]
    if missing:
        return f"the values of {', '.join(missing)} are needed to choose"
    if M != N:
        return f"queries ({M}) and keys ({N}) are not the same map"
    if block_n & (block_n - 1) or block_m & (block_m - 1):
        return f"blocks of {block_m}×{block_n}: patches are powers of two"
    return None


def partial_bits(plan, tiling: HopperTiling, lists, sizes: dict, scalars: dict, block_m: int,
                 block_n: int, device):
    """``(bits, offsets)``: the mask of every partial (row block, window) pair of head 0's lists
    ``lists`` (``window_lists``' ``pn``, ``pi``) as int32 words ``[pairs, block_m / 64, words,
    128]`` in the consumers' accumulator order, and per row block the index of its first pair.
    A bit is set where the key is a token of the map and visible from the row."""
    import torch

    b, h, i, j = plan.chain.axes
    rows = tiling.rows.padded // block_m
    bound = tiling.cols.bound
    pn, pi = (t.to(device) for t in lists[:2])
    counts = pn[:rows].long()
    offsets = torch.zeros(rows, dtype=torch.int64, device=device)
    offsets[1:] = torch.cumsum(counts, 0)[:-1]
    pairs = int(counts.sum())
    entries = pi.reshape(-1)[:rows * bound].view(rows, bound).long()
    taken = torch.arange(bound, device=device).view(1, -1) < counts.view(-1, 1)
    pair_rb = torch.arange(rows, device=device).view(-1, 1).expand(rows, bound)[taken]
    pair_origin = entries[taken]
    fr, fc = (torch.as_tensor(a, device=device).long() for a in fragment_elements(block_m,
                                                                                  block_n))
    inside = fr >= 0
    fr, fc = fr.clamp(min=0), fc.clamp(min=0)
    M, N = (sizes[plan.chain.dims[k]] for k in (3, 4))
    words = fragment_bit_words(block_n)
    out = torch.zeros((pairs, block_m // 64, words, 128), dtype=torch.int32, device=device)
    shifts = torch.arange(32, device=device, dtype=torch.int64)
    for start in range(0, pairs, PAIRS_AT_ONCE):
        rb, origin = pair_rb[start:start + PAIRS_AT_ONCE], pair_origin[start:start + PAIRS_AT_ONCE]
        row_token, _ = _tokens((rb.view(-1, 1) * block_m +
                                torch.arange(block_m, device=device)).view(-1), M, tiling.rows)
        key_token, key_ok = tiling.cols.position(origin.view(-1, 1),
                                                 torch.arange(block_n, device=device).view(1, -1))
        key_ok = torch.ones_like(key_token, dtype=torch.bool) if key_ok is None else key_ok
        grids = {b.uid: 0, h.uid: 0, i.uid: row_token.view(-1, block_m, 1),
                 j.uid: key_token.clamp(max=N - 1).view(-1, 1, block_n)}
        value = torch.as_tensor(MaskEvaluator(grids, {}, scalars, sizes)(plan.mask), device=device)
        value = torch.broadcast_to(value, (rb.numel(), block_m, block_n)) & key_ok.view(-1, 1,
                                                                                         block_n)
        picked = value[:, fr, fc] & inside          # [pairs, consumers, words, 128, 32]
        packed = (picked.to(torch.int64) << shifts).sum(dim=-1)
        out[start:start + rb.numel()] = torch.where(packed >= 2 ** 31, packed - 2 ** 32,
                                                    packed).to(torch.int32)
    return out.contiguous(), offsets.to(torch.int32).contiguous()


def tiled_lists(plan, tiling: HopperTiling, sizes: dict, scalars: dict, block_m: int,
                block_n: int, device):
    """``(pn, pi, fn, fi, bits, offsets)`` of a tiled call: the window lists of every
    (batch·head, row block) and the partial pairs' mask bits (:func:`partial_bits`)."""
    b, h, i, j = plan.chain.axes
    lists = window_lists(plan.mask, [b, h], i, j, sizes, scalars, block_m, device, tiling.rows,
                         tiling.cols)
    bits, offsets = partial_bits(plan, tiling, lists, sizes, scalars, block_m, block_n, device)
    if bits.numel() == 0:   # no partial block anywhere: one word so the pointer is valid
        bits = bits.new_zeros(1)
    return (*lists, bits, offsets)


# What a (row block, head) tile of each shape — (query rows, keys a block, CTAs per SM) — costs the
# H100: (fixed µs, µs per key block), both per 132 tiles. Fitted (least squares, with 8 µs per
# call that does not enter the choice) to the probes of the 14 neighbourhood cases
# (``benchmarks.neighborhood``): the earlier defaults (64 or 128 rows, 128-key windows, one CTA an
# SM) and
# 64 rows with 64-key windows at two CTAs an SM; within 4 % of every measured time, and the
# measured faster of the two in all 14. Few key blocks per tile: the fixed part (the
# query copy, the pipeline's fill, the output) dominates — half the rows halve it, and a second
# CTA on the SM runs its blocks meanwhile; many blocks a tile (31×31 kernels): 128-key blocks and
# two consumers take turns on the tensor cores, and cost less.
TILE_SHAPES = {(128, 128, 1): (3.08, 1.98), (64, 128, 1): (1.60, 1.23), (64, 64, 2): (1.43, 0.62)}
# What switching the intra-warpgroup overlap off changes in a shape's (fixed, per block) cost:
# fitted to ``benchmarks.neighborhood`` (each case with and without it, same run). Without it
# a tile's first and last blocks need no pipeline's fill and drain but its blocks' softmax no
# longer hides under the products: 1.7 % faster on tiles of ~4 key blocks, even at ~7, 2.6 %
# slower at ~14. Shapes not listed were not measured without it (taken as equal where the
# overlap is given off).
WITHOUT_OVERLAP = {(64, 64, 2): (-0.19, 0.028)}


def _overlap_costs(shape: tuple, fixed: float, per_block: float, overlap: "bool | None"):
    """``(overlap, fixed, per block)`` of ``shape`` with the overlap given, or both ways where
    :data:`WITHOUT_OVERLAP` knows what switching it off costs."""
    if overlap is not False:
        yield True, fixed, per_block
    if overlap is False or (overlap is None and shape in WITHOUT_OVERLAP):
        d_fixed, d_block = WITHOUT_OVERLAP.get(shape, (0.0, 0.0))
        yield False, fixed + d_fixed, per_block + d_block


def tile_shape_for_map(plan, sizes: dict, scalars: dict, allowed=lambda shape: True,
                       overlap: "bool | None" = None) -> "tuple[tuple, HopperTiling] | None":
    """``((query rows, block_n, ctas_per_sm, overlap), tiling)``: the tile shape among
    :data:`TILE_SHAPES` (and with or without the intra-warpgroup overlap: :data:`WITHOUT_OVERLAP`;
    ``overlap`` fixes it) that ``allowed`` accepts (``(rows, block_n, ctas_per_sm)``: the knobs
    given, shared memory) whose tiles cost least on the schedules each visiting order gives, and
    that order; None where none tiles."""
    B, H = (sizes[d] for d in plan.chain.dims[:2])
    N = sizes[plan.chain.dims[4]]
    best = None
    for shape, (fixed, per_block) in TILE_SHAPES.items():
        rows, block_n, _ = shape
        if not allowed(shape):
            continue
        tiling, _ = choose_hopper_tiling(plan, rows, block_n, sizes, scalars)
        if tiling is None:
            continue
        blocks = tiling.choice.density * -(-N // block_n)   # key blocks a row block visits
        tiles = tiling.rows.padded // rows * B * H
        for on, fixed_cost, block_cost in _overlap_costs(shape, fixed, per_block, overlap):
            cost = tiles * (fixed_cost + block_cost * blocks)
            if best is None or cost < best[0]:
                best = (cost, (*shape, on), tiling)
    return None if best is None else best[1:]
