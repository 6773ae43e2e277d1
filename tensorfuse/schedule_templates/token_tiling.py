"""Token tiling: a flat sequence axis that a mask reads as a 2-D or 3-D map, visited in patches.

A 2-D neighbourhood attention over an image of width ``W`` is written on flat token indices
(``dy = i // W - j // W``, ``dx = i % W - j % W``). Tiled along the flat order, a block of 128
queries is a strip of the image whose neighbourhoods touch many mostly-empty key blocks. Visiting
the tokens in *patches* (8×16 queries, 8×16 keys) instead makes each block a compact square of
the image, so far fewer key blocks are touched and more of them are wholly inside the mask
(NATTEN's multi-dimensional tiling, arXiv 2504.16922). A dilated map (``dy % dil == 0``) splits
into ``dil²`` interleaved sub-maps, each dense; the tiling visits them one after another.

A tiling only renumbers positions: block ``p`` of the tiled order holds the tokens
:meth:`TokenTiling.position` names, loads and stores read and write those tokens, and the mask is
evaluated on them — so any tiling is exact, and choosing one is a matter of speed. Positions past
the map's edge (a side that is not a multiple of the patch) are padding: never loaded, stored, or
counted. This module is data and arithmetic on duck-typed integers (torch tensors for the block
schedule, source text for the emitters); :func:`choose_tiling` picks the cheapest by counting
blocks on a sample of the schedule.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

from ..algebra.exprs import nodes
from ..dsl.expr import Axis, Binary, Const, DimSize, Expr, Load, Scalar
from ..errors import ScheduleError
from .block_schedule import PARTIAL_COST, block_lists, window_lists
from .mask_values import MaskEvaluator

# row blocks of the tiled order whose schedule is counted to compare tilings
SAMPLED_BLOCKS = 8
LARGEST_DILATION = 16


@dataclass(frozen=True)
class _MapLayout:
    """``extent`` tokens laid out as a row-major map of ``dims`` (outermost first; token
    ``Σ c_k · stride_k``), visited ``patch`` tokens a block, in steps of ``dilation``: what the
    query patches and the key windows share."""

    extent: int
    dims: tuple[int, ...]
    dilation: tuple[int, ...]
    patch: tuple[int, ...]

    def __post_init__(self):
        if not (len(self.dims) == len(self.dilation) == len(self.patch)):
            raise ScheduleError(f"a tiling of a {len(self.dims)}-D map needs a dilation and a "
                                f"patch of {len(self.dims)} numbers each; got dilation "
                                f"{self.dilation}, patch {self.patch}")
        if any(d < 1 for d in self.dilation) or any(p < 1 for p in self.patch):
            raise ScheduleError(f"dilation {self.dilation} and patch {self.patch} must be "
                                "positive")

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(math.prod(self.dims[k + 1:]) for k in range(len(self.dims)))

    @property
    def block(self) -> int:
        """Tokens per block (one patch)."""
        return math.prod(self.patch)

    def token(self, coords: list):
        """``Σ c_k · stride_k`` of coordinates (tensors, ints or source text)."""
        out = None
        for c, stride in zip(coords, self.strides):
            term = c * stride if stride != 1 else c
            out = term if out is None else out + term
        return out

    def coordinates(self, token) -> list:
        """The coordinates of ``token`` (the inverse of :meth:`token` on the map)."""
        out = []
        for k, (n, stride) in enumerate(zip(self.dims, self.strides)):
            at = token // stride if stride != 1 else token
            out.append(at % n if k > 0 else at)
        return out

    def _shape_text(self, before: str, after: str = "") -> str:
        text = before + "×".join(map(str, self.patch)) + after
        if any(d > 1 for d in self.dilation):
            text += ", dilation " + "×".join(map(str, self.dilation))
        return text


@dataclass(frozen=True)
class TokenTiling(_MapLayout):
    """The rows' visiting order: the map split into ``prod(dilation)`` interleaved sub-maps
    (coordinates congruent modulo ``dilation``), each visited in patches of ``patch`` (a block of
    ``prod(patch)`` consecutive positions of the tiled order)."""

    def __post_init__(self):
        super().__post_init__()
        if math.prod(self.dims) < self.extent:
            raise ScheduleError(f"a map of {self.dims} holds {math.prod(self.dims)} tokens, "
                                f"fewer than the axis's {self.extent}")

    @property
    def grid(self) -> tuple[int, ...]:
        """Patches along each dimension of a sub-map."""
        return tuple(math.ceil(math.ceil(n / d) / p)
                     for n, d, p in zip(self.dims, self.dilation, self.patch))

    @property
    def padded(self) -> int:
        """Positions of the tiled order, padding included."""
        return math.prod(self.dilation) * math.prod(self.grid) * self.block

    @property
    def exact(self) -> bool:
        """Whether every position of the tiled order is a token (no padding to skip)."""
        return self.padded == self.extent and math.prod(self.dims) == self.extent

    def position(self, p):
        """``(token, valid)`` of position ``p`` of the tiled order: ``p`` may be a torch tensor,
        a NumPy array, an int or anything with ``//``, ``%``, ``*``, ``+``, ``<`` and ``&``
        (source text, for the emitters); ``valid`` is ``None`` where every position is a
        token."""
        within, rest = p % self.block, p // self.block
        tiles = math.prod(self.grid)
        offs = _digits(within, self.patch)
        tile_at = _digits(rest % tiles, self.grid)
        sub_at = _digits(rest // tiles, self.dilation)
        coords = []
        for k in range(len(self.dims)):
            c = tile_at[k] * self.patch[k] + offs[k] if self.grid[k] > 1 else offs[k]
            coords.append(c * self.dilation[k] + sub_at[k] if self.dilation[k] > 1 else c)
        token = self.token(coords)
        checks = [c < n for c, n, d, g, q in zip(coords, self.dims, self.dilation, self.grid,
                                                  self.patch) if g * q * d > n]
        if math.prod(self.dims) > self.extent:
            checks.append(token < self.extent)
        return token, _all(checks)

    def describe(self) -> str:
        return self._shape_text("×".join(map(str, self.dims)) + " map in patches of ")


@dataclass(frozen=True)
class KeyWindows(_MapLayout):
    """Key blocks placed where they are needed: a block is a ``patch`` of keys of the map (steps
    of ``dilation``) starting at any token, its *origin*. Each row block's schedule lists origins
    that cover the box of its visible keys (per sub-map), so a query patch's neighbourhood costs
    the blocks its box needs — not the blocks of a fixed grid it straddles (NATTEN's sliding key
    window, from the mask rather than a formula)."""

    @property
    def bound(self) -> int:
        """At most this many blocks cover one row block's keys (a row of the block lists)."""
        return math.prod(self.dilation) * math.prod(
            math.ceil(math.ceil(n / d) / p) + 1 for n, d, p in zip(self.dims, self.dilation,
                                                                  self.patch))

    def offsets(self, r) -> tuple:
        """``(token offset, coordinate offsets)`` of key ``r`` of a block from its origin."""
        steps = [digit * d if d > 1 else digit
                 for digit, d in zip(_digits(r, self.patch), self.dilation)]
        return self.token(steps), steps

    def position(self, origin, r):
        """``(token, valid)`` of key ``r`` of the block at ``origin``; ``origin`` and ``r`` may
        be tensors (broadcast together) or source text."""
        return self.at(origin, *self.offsets(r))

    def at(self, origin, offset, steps: list):
        """``(token, valid)`` of the key ``offset`` (coordinate ``steps``, from :meth:`offsets`,
        computed once by an emitter) past ``origin``."""
        token = origin + offset
        checks = [at + step < n for at, step, n in zip(self.coordinates(origin), steps,
                                                       self.dims)]
        if math.prod(self.dims) > self.extent:
            checks.append(token < self.extent)
        return token, _all(checks)

    def describe(self) -> str:
        return self._shape_text("windows of ", f" keys on the {'×'.join(map(str, self.dims))} map")


def _all(checks: list):
    """The conjunction of ``checks`` (``None`` for none)."""
    out = None
    for check in checks:
        out = check if out is None else out & check
    return out


def _digits(value, radices: tuple[int, ...]) -> list:
    """Row-major digits of ``value`` in mixed radices (the first digit unbounded)."""
    out = []
    for k in range(len(radices)):
        inner = math.prod(radices[k + 1:])
        if k > 0 and radices[k] == 1:
            out.append(0)
            continue
        digit = value // inner if inner > 1 else value
        out.append(digit % radices[k] if k > 0 else digit)
    return out


def map_dims(exprs: list[Expr], axis: Axis, extent: int, sizes: dict,
             scalars: dict | None = None) -> tuple[int, ...] | None:
    """The map the expressions read ``axis`` as: the divisors and moduli of its uses as
    ``axis // a``, ``axis % b`` and ``(axis // a) % b`` are the map's strides (each dividing the
    next: ``W`` and ``H·W`` give ``(extent / (H·W), H, W)``). ``None`` where the axis is not read
    that way, or the strides are not constants (sizes and given scalars count as constants)."""
    strides: set[int] = set()
    bad = []

    def value(e: Expr) -> int | None:
        if isinstance(e, Const):
            return int(e.value)
        if isinstance(e, DimSize) and e.name in sizes:
            return int(sizes[e.name])
        if isinstance(e, Scalar) and scalars and e.name in scalars:
            return int(scalars[e.name])
        if isinstance(e, Binary) and e.op in ("mul", "floordiv", "add", "sub"):
            a, b = value(e.a), value(e.b)
            if a is None or b is None:
                return None
            return {"mul": a * b, "floordiv": a // max(b, 1), "add": a + b, "sub": a - b}[e.op]
        return None

    def is_axis(e: Expr) -> bool:
        return isinstance(e, Axis) and e.uid == axis.uid

    def visit(e: Expr) -> None:
        if isinstance(e, Binary) and e.op == "mod" and isinstance(e.a, Binary) and \
                e.a.op == "floordiv" and is_axis(e.a.a):
            a, b = value(e.a.b), value(e.b)
            if a is None or b is None or a < 1 or b < 1:
                bad.append(e)
            else:
                strides.update({a, a * b})
            return
        if isinstance(e, Binary) and e.op in ("floordiv", "mod") and is_axis(e.a):
            a = value(e.b)
            if a is None or a < 1:
                bad.append(e)
            else:
                strides.add(a)
            return
        for c in e.children():
            visit(c)

    for e in exprs:
        visit(e)
    strides.discard(1)
    strides = {s for s in strides if s < extent}
    if bad or not strides:
        return None
    ordered = sorted(strides)
    if any(b % a for a, b in zip(ordered, ordered[1:])):
        return None
    inner = [hi // lo for lo, hi in zip(ordered, ordered[1:])][::-1]
    return (math.ceil(extent / ordered[-1]), *inner, ordered[0])


def patches(dims: tuple[int, ...], dilation: tuple[int, ...], block: int,
            aspect: int = 4) -> list[tuple[int, ...]]:
    """Power-of-two patches of ``block`` positions that fit the sub-maps (a side no longer than
    the sub-map's, rounded up to a power of two), sides within a factor ``aspect`` of each other
    where the map allows it."""
    limits = [1 << max(0, math.ceil(n / d) - 1).bit_length() for n, d in zip(dims, dilation)]
    powers = [[1 << e for e in range(block.bit_length()) if (1 << e) <= lim] for lim in limits]
    found = [p for p in itertools.product(*powers) if math.prod(p) == block]
    balanced = [p for p in found if max(x for x, lim in zip(p, limits) if lim > 1 or x > 1) <=
                aspect * min(x for x, lim in zip(p, limits) if lim >= aspect or x > 1)]
    return balanced or found


def dilation_of(evaluate: Callable, dims: tuple[int, ...], extent: int) -> tuple:
    """The dilation of a mask over a map: per dimension, the largest step that every visible
    key's coordinate differs from the query's by, found on sample queries (the map's centre and
    the middles of its quarters). ``evaluate(rows, cols)`` gives the mask (booleans, rows × cols)
    at flat token indices."""
    import torch

    layout = _MapLayout(extent, dims, tuple(1 for _ in dims), tuple(1 for _ in dims))
    samples = [[n // 2 for n in dims]] + [[(n * f) // 4 for n in dims] for f in (1, 3)]
    tokens = sorted({t for t in map(layout.token, samples) if t < extent})
    cols = torch.arange(extent)
    visible = evaluate(torch.tensor(tokens), cols)
    steps = [0] * len(dims)
    for r, q in enumerate(tokens):
        keys = cols[visible[r]]
        if keys.numel() < 2:
            continue
        for k, (key_at, at) in enumerate(zip(layout.coordinates(keys), layout.coordinates(q))):
            steps[k] = math.gcd(steps[k], _gcd_all((key_at - at).abs()))
    return tuple(s if 1 < s <= LARGEST_DILATION else 1 for s in steps)


def _gcd_all(values) -> int:
    out = 0
    for v in values.unique().tolist():
        out = math.gcd(out, int(v))
    return out


@dataclass(frozen=True)
class TilingChoice:
    """The tilings of the rows and the keys (``None``: the flat order) and how they compare:
    ``cost`` and ``flat_cost`` in fully visible blocks per row block (a partial one counts
    ``block_schedule.PARTIAL_COST``), ``density`` the visited share of all blocks and ``full``
    the share of the visited ones that skip the mask, both on the sampled row blocks."""

    rows: TokenTiling | None
    cols: KeyWindows | None
    cost: float
    flat_cost: float
    density: float
    full: float

    def describe(self) -> str:
        if self.rows is None and self.cols is None:
            return (f"flat order ({self.density:.1%} of the blocks visited, {self.full:.0%} of "
                    "them without the mask)")
        sides = [f"queries: {self.rows.describe()}" if self.rows else "queries: flat order",
                 f"keys: {self.cols.describe()}" if self.cols else "keys: flat order"]
        return (f"{'; '.join(sides)} — {self.density:.1%} of the blocks visited, "
                f"{self.full:.0%} of them without the mask; block cost "
                f"{self.cost / self.flat_cost:.2f}× the flat order's")


def mask_reads_map(mask: Expr | None, axes: tuple[Axis, ...]) -> bool:
    """Whether ``mask`` reads one of ``axes`` through ``//`` or ``%`` (a candidate for tiling)."""
    uids = {a.uid for a in axes}
    return mask is not None and any(
        isinstance(e, Binary) and e.op in ("floordiv", "mod") and isinstance(e.a, Axis)
        and e.a.uid in uids for e in nodes(mask))


def mask_reads_tensors(mask: Expr | None) -> bool:
    """Whether ``mask`` reads a tensor (a document id, a block-sparse layout): its blocks come
    with each call's values, so no visiting order can be chosen for it ahead (the flat order)."""
    return mask is not None and any(isinstance(n, Load) for n in nodes(mask))


def map_scalars(mask: Expr | None, axes: tuple[Axis, ...]) -> tuple[str, ...]:
    """The scalars of a mask that reads one of ``axes`` as a map (its width, radius, dilation: a
    visiting order in patches depends on their values, so kernels are made per value), in the
    order the mask reads them; ``()`` for any other mask."""
    if not mask_reads_map(mask, axes):
        return ()
    return tuple(dict.fromkeys(n.name for n in nodes(mask) if isinstance(n, Scalar)))


def choose_tiling(mask: Expr, batch: list, row: Axis, col: Axis, sizes: dict, scalars: dict,
                  block_m: int, block_n: int, request: "dict | None" = None) -> TilingChoice:
    """The cheapest visiting order for ``mask``: the flat order, or query patches of the map the
    mask reads the rows as (:func:`map_dims`) with key windows on the keys' map, dilated where
    the visible keys of sample queries are (:func:`dilation_of`). Each candidate's block schedule
    is counted on :data:`SAMPLED_BLOCKS` row blocks. ``request`` (``Schedule.tile_as``):
    ``patch``, ``key_patch``, ``dilation`` fixed by the user instead of chosen. The mask may read
    sizes and scalars, not the batch axes or tensors (those keep the flat order). Chosen once per
    mask, sizes, scalars and block shape (the sampled schedules take seconds at a 64² map, and
    the Hopper template's tile shapes and each set of knobs given ask again)."""
    if request:
        return _chosen_tiling(mask, batch, row, col, sizes, scalars, block_m, block_n, request)
    key = (mask.key(), tuple(a.uid for a in batch), row.uid, col.uid,
           tuple(sorted(sizes.items())), tuple(sorted(scalars.items())), block_m, block_n)
    if key not in _CHOSEN:
        if len(_CHOSEN) > 1024:
            _CHOSEN.clear()
        _CHOSEN[key] = _chosen_tiling(mask, batch, row, col, sizes, scalars, block_m, block_n, {})
    return _CHOSEN[key]


_CHOSEN: dict = {}   # choose_tiling's choices (frozen: callers share them)


def _chosen_tiling(mask: Expr, batch: list, row: Axis, col: Axis, sizes: dict, scalars: dict,
                   block_m: int, block_n: int, request: dict) -> TilingChoice:
    import torch

    extent = lambda a: a.extent if isinstance(a.extent, int) else sizes[a.extent]  # noqa: E731
    rows, cols = extent(row), extent(col)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def cost_of(rt, windows) -> tuple[float, float, float]:
        n_rb = (rt.padded if rt else math.ceil(rows / block_m) * block_m) // block_m
        picked = sorted({round(x * (n_rb - 1) / max(1, SAMPLED_BLOCKS - 1))
                         for x in range(min(SAMPLED_BLOCKS, n_rb))})
        if windows is None:
            partial, full = block_lists(mask, batch, row, col, sizes, {}, scalars, block_m,
                                        block_n, device, rt, row_blocks=picked)
        else:
            partial, full = window_lists(mask, batch, row, col, sizes, scalars, block_m, device,
                                         rt, windows, row_blocks=picked)
        p, f = int(partial.sum()), int(full.sum())
        per_block = (p * PARTIAL_COST + f) / len(picked)
        visited = (p + f) / (len(picked) * math.ceil(cols / block_n))
        return per_block * n_rb, visited, f / max(1, p + f)

    flat = cost_of(None, None)
    flat_choice = TilingChoice(None, None, cost=flat[0], flat_cost=flat[0], density=flat[1],
                               full=flat[2])
    reads = {a.uid for a in mask.axes}
    row_dims = map_dims([mask], row, rows, sizes, scalars)
    col_dims = map_dims([mask], col, cols, sizes, scalars)
    why = None
    if row_dims is None and col_dims is None:
        why = "the mask does not read the query or key axis as a map (no `i // W`, `i % W`)"
    elif any(a.uid in reads for a in batch) or any(isinstance(n, Load) for n in nodes(mask)):
        why = "the mask reads tensors or the batch axes, which tilings do not follow"
    if why is not None:
        if request:
            raise ScheduleError(f"tile_as: {why}")
        return flat_choice

    def evaluate(r, c):
        import torch

        grids = {a.uid: 0 for a in batch}
        grids[row.uid], grids[col.uid] = r.view(-1, 1), c.view(1, -1)
        value = MaskEvaluator(grids, {}, scalars, sizes)(mask)
        return torch.broadcast_to(torch.as_tensor(value), (r.numel(), c.numel()))

    if "dilation" in request:
        dil = tuple(request["dilation"])
    else:
        dil = dilation_of(evaluate, col_dims or row_dims, cols if col_dims else rows)
    same = row_dims == col_dims and rows == cols
    row_options, col_options = [None], [None]
    if row_dims is not None:
        d = dil if same or col_dims is None else tuple(1 for _ in row_dims)
        shapes = [tuple(request["patch"])] if request.get("patch") else \
            patches(row_dims, d, block_m)
        row_options = [TokenTiling(rows, row_dims, d, p) for p in shapes]
    if col_dims is not None:
        shapes = [tuple(request["key_patch"])] if request.get("key_patch") else \
            patches(col_dims, dil, block_n)
        col_options = [KeyWindows(cols, col_dims, dil, p) for p in shapes]
    if not request:
        row_options.append(None)
        col_options.append(None)
    best = None
    for rt, ct in itertools.product(row_options, col_options):
        if rt is None and ct is None:
            continue
        for t, block in ((rt, block_m), (ct, block_n)):
            if t is not None and t.block != block:
                raise ScheduleError(f"tile_as: a patch of {t.block} tokens for blocks of "
                                    f"{block}; the patch's sides multiply to the block size")
        cost, visited, full = cost_of(rt, ct)
        if best is None or cost < best.cost:
            best = TilingChoice(rt, ct, cost, flat[0], visited, full)
    if best is None and request:
        raise ScheduleError(f"tile_as: no patch of {block_m} queries / {block_n} keys fits this "
                            "map (a smaller tile_m / tile_n would)")
    if best is None or not request and best.cost >= flat[0]:
        return flat_choice
    return best
