"""The Triton emitter of the scan plan (``schedule_templates.scan``): a scan kernel that sweeps a
part of each row's positions block by block — the terms of a block scanned with
``tl.associative_scan`` (reversed for a suffix), combined with the carry of everything before
it, the outputs written at the block's positions — and, where rows are cut into parts, a first
kernel that reduces each part's terms, whose totals start the later parts' carries.

A program takes ``BLOCK_M`` rows (the result's other axes, flattened) × ``BLOCK_N`` positions;
the terms of a block are the value at ``j = i + shift`` (an exclusive scan reads one position
back, or on; such reads are not 16-byte aligned and go element by element), the identity where
``j`` leaves the row or a condition fails — so both kernels reduce the same terms and the
parts' totals compose."""
from __future__ import annotations

import math

from ...dsl import dtypes as dt
from .expr import TL_DTYPES, TileContext, literal, to_triton
from .reductions import BUILTIN, combine_function, reduced, reduced_together
from .tile_text import needs_wide_offsets, store_offsets

NUM_WARPS = 4
# blocks a sweep's loads run ahead along a row (Triton's software pipeliner; 1: synchronous
# loads): 3 against 1 took a bf16 cumulative sum of 256 rows of 32768 from 43.7 to 27.1 µs and
# one row of 2**26 from 491 to 351 µs on the H100; but a running maximum down the middle axis
# of [16, 4096, 1024] from 0.32 to 0.81 ms, and a log-sum-exp scan (a scan to fold each block)
# of 64 rows of 16384 from 0.041 to 0.051 ms, so those load synchronously
# (``benchmarks.scan_kernels``)
STAGES = 3
MAX_BLOCK_N = 1024     # positions a tile, at most
TILE_ELEMENTS = 2048   # rows × positions a tile, at most
ROWS_INNERMOST_TILE = (32, 128)   # rows × positions where the rows are the innermost axis
# the most values of a row axis the outputs sum over within a tile (its rows, a power of two)
MAX_SUMMED = 128
OUT = "out_"   # the stem of a tile's output rows' variables where it sums over a row axis
# the prefix of the kernels' own variables: a program's parameters are named as the user named
# them (``r`` for rewards, ``lo``, ``hi``), and a variable of the same name would shadow one
L = "_s_"


def extent(axis, sizes: dict):
    return axis.extent if isinstance(axis.extent, int) else sizes[axis.extent]


def costly(plan) -> bool:
    """Whether the plan's combine is costly: a log-sum-exp's exp and log, a user's monoid —
    not a native sum, max or min, an arg reduction's compare and select, nor a discounted
    sum's multiply-add."""
    return plan.monoid.name not in BUILTIN and not plan.is_arg and plan.decay is None


def blocks(plan, sizes: dict) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_N)``: along a row held in memory along the scan, up to 1024 positions
    (a row's next power of two where its length is known) and rows up to 2048 elements a tile;
    where the rows are the innermost axis, 32 rows × 128 positions, each position's rows read
    side by side (on the H200, a running maximum down the middle axis of [16, 4096, 1024] f32
    0.272 → 0.157 ms against 64 × 32 in two parts, an integral image's scan down the rows of
    [16, 1024, 1024] 118 → 84 µs for both stages; 8-64 rows × 32-256 positions swept by hand
    over ``benchmarks.scan_kernels``' running_max and integral_image); one row where there are
    no others."""
    if not plan.along_rows:
        block_m, block_n = ROWS_INNERMOST_TILE
        return (max(block_m, summed_rows(plan, sizes)) if plan.summed else block_m), block_n
    n = extent(plan.axis, sizes)
    block_n = MAX_BLOCK_N if not isinstance(n, int) else \
        max(16, min(MAX_BLOCK_N, 1 << (n - 1).bit_length()))
    return (max(1, min(16, TILE_ELEMENTS // block_n)) if plan.rows else 1), block_n


def warps(plan) -> int:
    """A tile's warps: :data:`NUM_WARPS`; 8 for a :func:`costly` combine, whose scan computes
    more than it moves. A log-cumulative-sum-exp on the H100, 4 / 8 / 16 warps: 64 rows of
    16384 0.051 / 0.036 / 0.047 ms (torch.compile 0.037), 4 rows of 262144 0.042 / 0.034 /
    0.030 (0.063); blocks of 4096 or 16384 positions were slower on the long rows (the tiles
    varied by hand; ``benchmarks.scan_kernels``' own row: 0.045 ms at 4 warps, 0.035 at 8)."""
    return 8 if costly(plan) else NUM_WARPS


def stages(plan) -> int:
    """The sweep's :data:`STAGES` where the plan reads along rows and its monoid reduces
    natively, else 1 (synchronous loads)."""
    return STAGES if plan.along_rows and plan.monoid.name in BUILTIN else 1


def row_count(plan, sizes: dict, axes=None):
    """The rows' count: of the plan's row axes, or of ``axes`` (a row axis the outputs sum over
    padded to a power of two: :func:`row_extent`)."""
    return math.prod(row_extent(plan, a, sizes) for a in (plan.rows if axes is None else axes))


def row_extent(plan, axis, sizes: dict):
    """The rows a row axis spans: its extent, or for the axis the outputs sum over its next
    power of two — a tile's rows then hold whole groups of it, the padding masked."""
    n = extent(axis, sizes)
    if plan.summed and axis.uid == plan.summed.axis.uid:
        return 1 << (n - 1).bit_length()
    return n


def summed_rows(plan, sizes: dict) -> int:
    """The rows a tile adds up for each output row: the summed axis's :func:`row_extent` (at
    most ``MAX_SUMMED``; a size given at the call is checked here, when its kernel is built)."""
    from ...errors import TargetError

    n, name = plan.summed.axis, plan.summed.name
    rows = row_extent(plan, n, sizes)
    if rows > MAX_SUMMED:
        raise TargetError(f"{name} sums over {extent(n, sizes)} values of {n.name}; the scan "
                          f"template adds up to {MAX_SUMMED} within a tile")
    return rows


def layout(plan, dims: dict) -> tuple[int, int, int]:
    """``(parts, blocks a part, programs along the rows)`` of a call at ``dims`` (ints)."""
    block_m, block_n = blocks(plan, dims)
    rows, n = row_count(plan, dims), extent(plan.axis, dims)
    cut = plan.parts(rows, n, block_m, block_n)
    count = math.ceil(n / block_n)
    each = math.ceil(count / cut)
    return math.ceil(count / each), each, math.ceil(rows / block_m)


def accumulators(plan) -> list[str]:
    """Each component's carry and terms' Triton type: f32 for floats (f64 for an f64 result: as
    precise as asked), the result's own for integers (an arg reduction's index)."""
    made = []
    for dtype in plan.dtypes:
        dtype = dt.resolve(dtype)
        made.append("tl.float32" if dt.is_float(dtype) and dtype != "f64" else TL_DTYPES[dtype])
    return made


def totals_names(plan) -> list[str]:
    """The scratch arguments holding each component's part totals."""
    return ["totals"] + [f"totals_{k}" for k in range(1, len(plan.dtypes))]


def identities(plan) -> list[str]:
    made = []
    for k, dtype in enumerate(plan.dtypes):
        value = plan.monoid.identity_value(k, dtype)
        made.append(literal(value, "f32" if dt.is_float(dt.resolve(dtype)) else dtype))
    return made


def component_names(stem: str, plan) -> list[str]:
    """A value's variables, one a component: ``stem`` alone for one (named apart from the
    program's parameters: :data:`L`)."""
    k = len(plan.dtypes)
    return [L + stem] if k == 1 else [f"{L}{stem}{c}" for c in range(k)]


def _combined(plan, a: list[str], b: list[str]) -> str:
    return f"{combine_function(plan.monoid)}({', '.join(a + b)})"


def _fold(w, plan, names: list[str], tiles: list[str], width: str) -> None:
    """Lines folding the tiles (one a component, ``width`` along their axis 1) in the scan's
    direction into ``names``, dimensions kept: a sum, max or min reduced natively; any other
    monoid scanned and the last lane in the direction picked (:func:`edge`) — in order, as a
    monoid that is not commutative (a discounted sum) needs, where a reduction may pair the
    lanes in any order."""
    if plan.monoid.name in BUILTIN:
        _assign(w, names, reduced(plan.monoid, tiles[0], 1, keep_dims=True) if len(tiles) == 1
                else reduced_together(plan.monoid, tiles, 1))
        return
    scanned = [f"{n}_scan" for n in names]
    reverse = ", reverse=True" if plan.direction == "suffix" else ""
    packed = tiles[0] if len(tiles) == 1 else f"({', '.join(tiles)})"
    _assign(w, scanned, f"tl.associative_scan({packed}, 1, {combine_function(plan.monoid)}"
                        f"{reverse})")
    edge(w, plan, names, scanned, width)


def edge(w, plan, names: list[str], tiles: list[str], width: str) -> None:
    """Lines setting ``names`` to the tiles' values (one a component, ``width`` along axis 1)
    at the last lane in the scan's direction — picked by a masked sum, dimensions kept."""
    lane = f"{width} - 1" if plan.direction == "prefix" else "0"
    mask = f"{L}edge_{width}"   # one a width: a loop's variables keep their shapes
    w(f"{mask} = tl.arange(0, {width})[None, :] == {lane}")
    for n, t, acc in zip(names, tiles, accumulators(plan)):
        w(f"{n} = tl.sum(tl.where({mask}, {t}, 0), axis=1, keep_dims=True).to({acc})")


def row_axes(w, plan, sizes: dict, wide: bool, rows: str, axes=None,
             tile: str = "tl.program_id(0)", stem: str = "") -> dict:
    """Lines computing the program's rows (``row``: ``tile``, by default the first grid axis,
    then ``rows``; ``row_ok``) and the index of each row axis (``axes``: by default all) from
    them; the row axes' names by uid. ``stem`` names them apart (a tile's output rows beside
    its scanned ones). The padding of a summed axis (:func:`row_extent`) is no row."""
    axes = plan.rows if axes is None else axes
    row, ok, rest = f"{L}{stem}row", f"{L}{stem}row_ok", f"{L}{stem}rest"
    w(f"{row} = {tile}" + (".to(tl.int64)" if wide else "") + rows)
    w(f"{ok} = {row} < {row_count(plan, sizes, axes)}")
    w(f"{rest} = {row}")
    names = {}
    for a in reversed(axes):
        names[a.uid] = row_axis_name(a, stem)
        w(f"{names[a.uid]} = {rest} % {row_extent(plan, a, sizes)}")
        w(f"{rest} = {rest} // {row_extent(plan, a, sizes)}")
        if row_extent(plan, a, sizes) != extent(a, sizes):
            w(f"{ok} = {ok} & ({names[a.uid]} < {extent(a, sizes)})")
    return names


def row_axis_name(axis, stem: str = "") -> str:
    """The variable holding a row axis' index (:func:`row_axes`)."""
    return f"{L}{stem}ax_{axis.name}"


def prologue(w, plan, sizes: dict, wide: bool, tile: str = "tl.program_id(0)",
             part: str = "tl.program_id(1)") -> dict:
    """The program's rows (``row``, ``row_ok`` and each row axis' index: the rows of tile
    ``tile``) and its part's positions (part ``part``: ``lo`` to ``hi``, ``nb`` blocks); the
    row axes' names by uid."""
    names = row_axes(w, plan, sizes, wide, " * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]",
                     tile=tile)
    w(f"{L}part = {part}")
    # in whole blocks: Triton then knows a block's start is a multiple of BLOCK_N, and reads and
    # writes a row's elements in 16-byte vectors (a length as an argument left them one by one)
    w(f"{L}lo = {L}part * scan_part_blocks * BLOCK_N")
    w(f"{L}hi = tl.minimum({L}lo + scan_part_blocks * BLOCK_N, {extent(plan.axis, sizes)})")
    w(f"{L}nb = tl.cdiv({L}hi - {L}lo, BLOCK_N)")
    return names


def terms(w, plan, sizes: dict, rows: dict, block: str) -> TileContext:
    """Lines computing ``v`` (``v0``, ``v1``: one a component), the terms of block ``block`` of
    the part (its positions ``col``, ``col_ok``); the tile of the outputs at those positions."""
    n = extent(plan.axis, sizes)
    w(f"{L}col = {L}lo + ({block}) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
    w(f"{L}col_ok = {L}col < {L}hi")
    w(f"{L}jj = {L}col + {plan.shift}" if plan.shift else f"{L}jj = {L}col")
    w(f"{L}j_ok = ({L}jj >= 0) & ({L}jj < {n})" if plan.shift else f"{L}j_ok = {L}jj < {n}")
    values(w, plan, sizes, rows, f"{L}col_ok", "v")
    valid = dict.fromkeys(rows, f"{L}row_ok")
    return TileContext(axes={**rows, plan.out_axis.uid: f"{L}col"},
                       valid={**valid, plan.out_axis.uid: f"{L}col_ok"}, sizes=sizes)


def values(w, plan, sizes: dict, rows: dict, taken: str, stem: str, valid=None,
           rows_ok: str = f"{L}row_ok", at: str = "j") -> None:
    """Lines computing ``stem`` (one variable a component): the terms at positions ``{at}j``
    (``{at}_ok`` where they are in the row), the identity where ``taken``, the rows' mask
    ``rows_ok`` or a condition fails; ``valid``: each row axis' mask for the reads (by default
    ``row_ok``). Its variables are named by ``stem``: a loop's variables keep their shapes, so
    terms of another shape before a loop (:func:`_head`) must not reuse the loop's names."""
    valid = dict.fromkeys(rows, f"{L}row_ok") if valid is None else valid
    position, inside_row = f"{L}{at}j", f"{L}{at}_ok"
    tile = TileContext(axes={**rows, plan.axis.uid: position},
                       valid={**valid, plan.axis.uid: inside_row}, sizes=sizes)
    keep = [rows_ok, taken, inside_row] + [f"({to_triton(c, tile)})" for c in plan.conditions]
    w(f"{L}keep_{stem} = {' & '.join(keep)}")
    terms = [(value, f"{L}keep_{stem}") for value in plan.values]
    if plan.decay is not None:
        # a discounted sum decays at every position of the row, whatever its conditions
        # (Σ_{j ≤ i, j < len} c^(i−j)·x[j] past len still decays): only past the row's or the
        # part's end is its term the identity
        w(f"{L}inside_{stem} = {rows_ok} & {taken} & {inside_row}")
        terms = [(plan.decay, f"{L}inside_{stem}")] + terms
    for v, (value, mask), ident, acc in zip(component_names(stem, plan), terms,
                                            identities(plan), accumulators(plan)):
        w(f"{v} = tl.where({mask}, {to_triton(value, tile)}, {ident}).to({acc})")


def _head(w, plan, sizes: dict, rows: dict, carry: list[str]) -> None:
    """Lines folding into the first part's carry (in the scan's direction) the terms no
    output's sweep reads: a prefix reaching ``k`` positions past each output (``j <= i + k``)
    sweeps the terms from ``k`` on, so the row's first ``k`` come before them; a suffix from
    ``k`` before (``j >= i − k``), its last ``k``. Nothing where the scan stops short of or at
    the position."""
    ahead = plan.shift if plan.direction == "prefix" else -plan.shift
    if ahead <= 0:
        return
    n = extent(plan.axis, sizes)
    width = 1 << (ahead - 1).bit_length()
    lanes = f"tl.arange(0, {width})[None, :]"
    first = f"{L}part == 0" if plan.direction == "prefix" else f"{L}part == scan_parts - 1"
    w(f"{L}hj = {lanes}" if plan.direction == "prefix" else f"{L}hj = {n} - {ahead} + {lanes}")
    w(f"{L}h_ok = ({L}hj >= 0) & ({L}hj < {n})")
    w(f"{L}in_head = ({lanes} < {ahead}) & ({first})")
    values(w, plan, sizes, rows, f"{L}in_head", "h", at="h")
    head = component_names("head", plan)
    _fold(w, plan, head, component_names("h", plan), str(width))
    _assign(w, carry, _combined(plan, carry, head))


def _assign(w, names: list[str], value: str) -> None:
    w(f"{', '.join(names)} = {value}")


def _carry_on(w, plan, carry: list[str], total: list[str], v: list[str]) -> None:
    """The carry past a block: the carry combined with the block's terms reduced (a sum, max or
    min reduces natively), or, for any other monoid (a logsumexp: an exp and a log a combine;
    a user's; a discounted sum, whose order matters), the scanned totals' value at the block's
    last position in the scan's direction, where a reduction would combine every term once
    more. Positions past the row's end hold the identity, so the last lane is the whole
    block's."""
    if plan.monoid.name in BUILTIN:
        _fold(w, plan, component_names("r", plan), v, "BLOCK_N")
        _assign(w, carry, _combined(plan, carry, component_names("r", plan)))
        return
    edge(w, plan, carry, total, "BLOCK_N")


def block(plan) -> str:
    """The part's block the sweep's ``k``-th step takes: from the end for a suffix."""
    return f"{L}k" if plan.direction == "prefix" else f"{L}nb - 1 - {L}k"


def result_refs(plan, total: list[str]) -> dict:
    """How the outputs' expressions read the result: the component that is it, or each
    (``name#k``) where it has several."""
    if plan.members:   # a chain's: each member's component
        return {name: total[k] for name, k in plan.members}
    if plan.result_component is not None:
        return {plan.total.name: total[plan.result_component]}
    return {f"{plan.total.name}#{k}": t for k, t in enumerate(total)}


def scanned_block(w, plan, sizes: dict, out_tile: TileContext, carry: list[str]) -> None:
    """Lines scanning a block's terms (``v``: :func:`terms`) in the scan's direction, combined
    with ``carry`` (the carry then moved past the block), the outputs stored at the block's
    positions (``out_tile``)."""
    v = component_names("v", plan)
    reverse = ", reverse=True" if plan.direction == "suffix" else ""
    tiles = v[0] if len(v) == 1 else f"({', '.join(v)})"
    _assign(w, component_names("s", plan),
            f"tl.associative_scan({tiles}, 1, {combine_function(plan.monoid)}{reverse})")
    total = component_names("total", plan)
    _assign(w, total, _combined(plan, carry, component_names("s", plan)))
    _carry_on(w, plan, carry, total, v)
    out_tile = out_tile.child(refs=result_refs(plan, total))
    if plan.summed:
        _summed_stores(w, plan, sizes, out_tile)
        return
    for c, expr in plan.outputs:
        w(f"tl.store(out_{c.name} + ({store_offsets(c.axes, out_tile, sizes)}), "
          f"({to_triton(expr, out_tile)}).to({TL_DTYPES[c.dtypes[0]]}), "
          f"mask={L}row_ok & {L}col_ok)")


def _summed_stores(w, plan, sizes: dict, tile: TileContext) -> None:
    """Lines adding the summand up over each group of the tile's rows that share the output's
    row (the summed axis innermost among them: groups of :func:`summed_rows` rows, the padding
    masked) and storing the outputs at the tile's output rows (:func:`output_rows`)."""
    n, summand, name = plan.summed
    group = summed_rows(plan, sizes)
    value = f"tl.where({L}row_ok & {L}col_ok, {to_triton(summand, tile)}, 0.0)"
    w(f"{L}summed = tl.sum(tl.reshape(tl.broadcast_to({value}, (BLOCK_M, BLOCK_N)), "
      f"(BLOCK_M // {group}, {group}, BLOCK_N)), axis=1)")
    axes = {a.uid: row_axis_name(a, OUT) for a in plan.rows if a.uid != n.uid}
    out = TileContext(axes={**axes, plan.out_axis.uid: f"{L}col"}, sizes=sizes,
                      refs={name: f"{L}summed"})
    for c, expr in plan.outputs:
        w(f"tl.store(out_{c.name} + ({store_offsets(c.axes, out, sizes)}), "
          f"({to_triton(expr, out)}).to({TL_DTYPES[c.dtypes[0]]}), "
          f"mask={L}{OUT}row_ok & {L}col_ok)")


def output_rows(w, plan, sizes: dict, wide: bool) -> None:
    """Lines computing the output rows of the tile's groups (``out_row``, ``out_row_ok``,
    ``out_ax_*``): a tile of ``BLOCK_M`` scanned rows holds ``BLOCK_M // group`` of them."""
    group = summed_rows(plan, sizes)
    axes = tuple(a for a in plan.rows if a.uid != plan.summed.axis.uid)
    row_axes(w, plan, sizes, wide, f" * (BLOCK_M // {group}) + "
             f"tl.arange(0, BLOCK_M // {group})[:, None]", axes, stem=OUT)


def scan_kernels(plan, name: str, sizes: dict, args: list[str], interpreter: bool) -> list:
    """``{name}_totals`` (each part's combined terms into ``totals``, one buffer a component)
    and ``{name}_scan``, both taking ``args``, as (name, args, lines) for
    :func:`.tile_text.assemble_source`; ``interpreter``: for Triton's CPU interpreter (loop
    bounds read from tensors)."""
    from .source_writer import SourceWriter

    wide = needs_wide_offsets(plan.program, sizes)
    idents, accs = identities(plan), accumulators(plan)
    carry, v = component_names("carry", plan), component_names("v", plan)
    totals = totals_names(plan)
    w = SourceWriter(interpreter)
    rows = prologue(w, plan, sizes, wide)
    for c, ident, acc in zip(carry, idents, accs):
        w(f"{c} = tl.full([BLOCK_M, 1], {ident}, {acc})")
    _head(w, plan, sizes, rows, carry)
    w.sweep(f"{L}k", "0", f"{L}nb", "1", stages(plan))
    with w.block():   # in the scan's direction: a discounted sum's order matters
        terms(w, plan, sizes, rows, block(plan))
        _fold(w, plan, component_names("r", plan), v, "BLOCK_N")
        _assign(w, carry, _combined(plan, carry, component_names("r", plan)))
    for t, c in zip(totals, carry):
        w(f"tl.store({t} + {L}row * {plan.max_parts} + {L}part, {c}, mask={L}row_ok)")
    kernels = [(f"{name}_totals", args, w.lines)]

    w = SourceWriter(interpreter)
    rows = prologue(w, plan, sizes, wide)
    # the parts before this one in the scan's direction: their totals, combined
    w(f"{L}offs_k = tl.arange(0, {plan.max_parts})[None, :]")
    before = f"{L}offs_k < {L}part" if plan.direction == "prefix" else \
        f"({L}offs_k > {L}part) & ({L}offs_k < scan_parts)"
    prev = component_names("prev", plan)
    for p, t, ident, acc in zip(prev, totals, idents, accs):
        w(f"{p} = tl.load({t} + {L}row * {plan.max_parts} + {L}offs_k, "
          f"mask={L}row_ok & ({before}), other={ident}).to({acc})")
    _fold(w, plan, carry, prev, str(plan.max_parts))
    _head(w, plan, sizes, rows, carry)
    if plan.summed:
        output_rows(w, plan, sizes, wide)
    w.sweep(f"{L}k", "0", f"{L}nb", "1", stages(plan))
    with w.block():
        scanned_block(w, plan, sizes, terms(w, plan, sizes, rows, block(plan)), carry)
    kernels.append((f"{name}_scan", args, w.lines))
    return kernels
