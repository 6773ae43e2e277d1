"""The contraction template's Triton source: GEMM tiles on the tensor cores (``tl.dot``) for a
:class:`~tensorfuse.schedule_templates.contraction_plan.ContractionPlan`.

One program computes a ``BLOCK_M × BLOCK_N`` tile of the output (rows × columns) at one batch
index: for each block of ``BLOCK_K`` contracted indices it loads (or computes, from loads) the
rows side ``[BLOCK_M, BLOCK_K]`` and the columns side ``[BLOCK_K, BLOCK_N]`` of every sum — each
tensor addressed through its own strides, so a transposed operand is read as it lies — and adds
their product to the sum's f32 accumulator; the outputs are then computed on the accumulators
(with any loads at the output's indices) and stored. Tiles are visited in groups of ``group_m``
row blocks (the columns' blocks then stay in L2 across a group). Triton's software pipeliner
runs the loads ``num_stages`` blocks ahead (asynchronous copies into shared memory; on sm_90
``tl.dot`` becomes ``wgmma``, on sm_80 ``mma.sync``, on CDNA ``v_mfma``).

A pairwise reduction's block is computed on the CUDA cores instead, index by index over the
pairs (:func:`_pairs`). Where reductions over the columns follow, a program takes a block of rows
and sweeps the columns itself, each block's tile folded into per-row states
(:func:`_row_block_lines`).
"""
from __future__ import annotations

from ...algebra import inline_elementwise
from ...algebra.exprs import has_axis, nodes
from ...dsl.expr import Load
from ...dsl.program import Program
from ...dsl.symbolic_sizes import size_arguments
from .expr import TL_DTYPES, TileContext, fresh_memo, dot_precision, to_triton
from .elementwise import split_interleaved
from .gemm_groups import GROUP, PART, close_group_loop, open_group_loop
from .tile_text import assemble_source, dot_operand, needs_wide_offsets, store_offsets
from .column_states import (BETTER, COMBINE, EXTREMUM, FOLD, IDENTITY, L, NO_INDEX,
                            column_refs, column_states, lane_update, lanes_folded,
                            normalisers_of, part_combined, slots, states)
from .source_writer import SourceWriter
from .combine_slices import combine_slices


def _digits(plan, axes: tuple, sizes: dict, flat: str) -> dict:
    """Each of ``axes`` (outermost first; uid → Triton index) as a digit of the one index
    ``flat`` that sweeps them all: the innermost ``flat % E``, the next ``(flat // E) % E'``,
    the outermost without a modulo (the contracted axes, and the batch axes of the grid)."""
    out, inner = {}, 1
    for k, axis in enumerate(reversed(axes)):
        extent = plan.extent(axis, sizes)
        digit = flat if inner == 1 else f"({flat} // {inner})"
        out[axis.uid] = digit if k == len(axes) - 1 else f"({digit} % {extent})"
        inner = extent if inner == 1 else inner * extent
    return out


def _bounds(candidates: dict) -> dict:
    """The load bounds (axis uid → condition) of the axes whose size is ragged."""
    return {uid: ok for uid, (ragged, ok) in candidates.items() if ragged}


def _extent_of(plan, axes, sizes: dict):
    """The number of indices ``axes`` sweep together at ``sizes``."""
    total = 1
    for axis in axes:
        total = total * plan.extent(axis, sizes)
    return total


def _stage_extents(plan, staged, sizes: dict) -> tuple:
    """``(free axis, its extent, contracted axes, their extent, batch axes)`` of a staged side,
    as far as it reads them (a free axis it does not read counts 1)."""
    free = plan.rows if staged.side == "rows" else plan.cols
    read = {a.uid for a in staged.axes}
    ks = tuple(a for a in plan.ks if a.uid in read)
    F = plan.extent(free, sizes) if free.uid in read else 1
    return free, F, ks, _extent_of(plan, ks, sizes), tuple(a for a in plan.batch
                                                           if a.uid in read)


def stage_grid(plan, staged, knobs, sizes: dict) -> tuple[int, int]:
    """(tiles, batch indices) of the kernel that stores ``staged`` (a
    :class:`~tensorfuse.schedule_templates.contraction_plan.StagedSide` of ``plan``): the
    GEMM's tiles of that side, once each."""
    _, F, _, K, batch = _stage_extents(plan, staged, sizes)
    block = knobs.block_m if staged.side == "rows" else knobs.block_n
    return -(-F // block) * -(-K // knobs.block_k), _extent_of(plan, batch, sizes)


def grid_of(plan, knobs, sizes: dict) -> tuple[int, int]:
    """(output tiles, batch indices): the launch grid at ``sizes`` (row blocks, where each
    program sweeps the columns: reductions over them)."""
    rows, cols = (plan.extent(a, sizes) for a in (plan.rows, plan.cols))
    tiles = 1 if plan.over_columns else -(-cols // knobs.block_n)
    return -(-rows // knobs.block_m) * tiles, _extent_of(plan, plan.batch, sizes)


def kernel_arguments(program: Program, sizes: dict, extra: tuple = ()) -> list[str]:
    """The kernel's arguments in order: the program's parameters, one pointer per output
    (``out_<name>``), ``extra`` pointers (:data:`PARTIALS`), and the sizes written as
    arguments."""
    return [p.name for p in program.params] + [f"out_{c.name}" for c in program.outputs] + \
        list(extra) + size_arguments(sizes)


# The f32 partial tiles of a contraction split along its contracted axis (``knobs.splits`` > 1):
# every part's tile of every sum, in the order the combine kernel adds them
PARTIALS = "partials"


def split_arguments(knobs) -> tuple[str, ...]:
    """The pointers a launch with ``knobs`` takes besides the program's: the partial tiles
    where the contracted axis is split."""
    return (PARTIALS,) if knobs.splits > 1 else ()


def partial_floats(plan, knobs, sizes: dict) -> int:
    """The f32 values of the partial tiles at ``sizes``: a padded tile per sum, part, output tile
    and batch index — or, where the columns are split, a padded row block's states per
    reduction over them, part, row block and batch index."""
    tiles, batch = grid_of(plan, knobs, sizes)
    if plan.over_columns:
        return column_states(plan) * knobs.splits * tiles * batch * knobs.block_m
    return len(plan.products) * knobs.splits * tiles * batch * knobs.block_m * knobs.block_n


def _slot(count: int, k: int, knobs, part: str, blocks: str) -> str:
    """The index (64-bit) of the ``k``-th of ``count`` partial tiles or row states of part
    ``part`` of block ``pid`` among ``blocks`` at batch index ``pid_b``: where a part stores it
    and the combine kernel reads it."""
    return f"(((pid_b * {count} + {k}) * {knobs.splits} + {part}) * {blocks} + pid).to(tl.int64)"


def combine_name(name: str) -> str:
    """The name of the kernel that combines the parts of a launch ``name`` split into parts (of
    the contracted axis, or of the columns) and computes the outputs."""
    return f"{name}_combine"


def stage_name(name: str, k: int) -> str:
    """The name of the kernel that stores ``plan.staged[k]`` before the tiles ``name``."""
    return f"{name}_stage_{k}"


def contraction_source(plan, knobs, name: str, sizes: dict,
                       interpreter: bool = False) -> tuple[str, list[str]]:
    """``(source, argument names)`` of ``plan`` at ``sizes`` (ints, or :mod:`symbolic
    <tensorfuse.dsl.symbolic_sizes>` sizes read from arguments) with ``knobs``
    (:class:`~tensorfuse.schedule_templates.contraction.ContractionKnobs`): the tiles' kernel
    ``name``, after a kernel per side the plan stages (:func:`stage_name`), all taking the
    same arguments."""
    args = kernel_arguments(plan.program, sizes, split_arguments(knobs))
    functions = [(stage_name(name, k), args, _stage_lines(plan, staged, knobs, sizes,
                                                          interpreter))
                 for k, staged in enumerate(plan.staged)]
    if knobs.splits > 1 and plan.over_columns:   # the columns split: the rows' partial states
        functions += [(name, args, _row_block_lines(plan, knobs, sizes, interpreter)),
                      (combine_name(name), args, _row_combine_lines(plan, knobs, sizes,
                                                                    interpreter))]
    elif knobs.splits > 1:
        functions += [(name, args, _part_lines(plan, knobs, sizes, interpreter)),
                      (combine_name(name), args, _combine_lines(plan, knobs, sizes, interpreter))]
    else:
        functions.append((name, args, _tile_lines(plan, knobs, sizes, interpreter)))
    return assemble_source(functions), args


def _stage_lines(plan, staged, knobs, sizes: dict, interpreter: bool) -> list[str]:
    """A kernel storing ``staged``'s value in the tiles the GEMM reads it in (module
    docstring), rounded to its type as the GEMM's tile would round it."""
    w = SourceWriter(interpreter)
    wide = needs_wide_offsets(plan.program, sizes)
    as_index = ".to(tl.int64)" if wide else ""
    rows = staged.side == "rows"
    block = "BLOCK_M" if rows else "BLOCK_N"
    free, F, ks, K, batch_axes = _stage_extents(plan, staged, sizes)
    w("pid = tl.program_id(0)")
    w(f"pid_b = tl.program_id(1){as_index}")
    w(f"blocks_f = tl.cdiv({F}, {block})")
    w(f"offs_f = (pid % blocks_f){as_index} * {block} + tl.arange(0, {block})")
    w(f"offs_k = (pid // blocks_f){as_index} * BLOCK_K + tl.arange(0, BLOCK_K)")
    at = {}
    for axis in batch_axes:
        w(f"ax_{axis.name} = {_digits(plan, batch_axes, sizes, 'pid_b')[axis.uid]}")
        at[axis.uid] = f"ax_{axis.name}"
    f_at, k_at = ("offs_f[:, None]", "offs_k[None, :]") if rows else \
        ("offs_f[None, :]", "offs_k[:, None]")
    f_ok, k_ok = f"({f_at} < {F})", f"({k_at} < {K})"
    ragged_f = F % (knobs.block_m if rows else knobs.block_n) != 0
    ragged_k = K % knobs.block_k != 0
    at.update({free.uid: f_at, **_digits(plan, ks, sizes, k_at)})
    ctx = TileContext(at, _bounds({free.uid: (ragged_f, f_ok),
                                   **{a.uid: (ragged_k, k_ok) for a in ks}}),
                      sizes=sizes, emit=w, memo={}, interpreter=interpreter)
    value = to_triton(staged.value, ctx)
    shape = f"{block}, BLOCK_K" if rows else f"BLOCK_K, {block}"
    bounds = " & ".join(ok for ragged, ok in ((ragged_f, f_ok), (ragged_k, k_ok)) if ragged)
    w(f"tl.store({staged.param.name} + ({store_offsets(staged.axes, ctx, sizes)}), "
      f"tl.broadcast_to({value}, ({shape})).to({TL_DTYPES[staged.param.dtype]})"
      f"{', mask=' + bounds if bounds else ''})")
    return w.lines


def _tile_lines(plan, knobs, sizes: dict, interpreter: bool) -> list[str]:
    """The GEMM tiles' kernel body (module docstring); with reductions over the columns, the
    row blocks' (:func:`_row_block_lines`)."""
    if plan.over_columns:
        return _row_block_lines(plan, knobs, sizes, interpreter)
    w, M, N, as_index = _kernel_start(plan, sizes, interpreter)
    _tile_position(knobs, w, M, N, as_index)
    batch = _batch_digits(plan, w, sizes)
    refs, out_ctx, bounds = _contracted(plan, knobs, w, sizes, interpreter, batch)
    _store_outputs(plan, w, refs, out_ctx, bounds, sizes)
    return w.lines


def _tile_position(knobs, w, M, N, as_index: str, slice_rows: int = 0) -> None:
    """``offs_m``, ``offs_n`` of the tile ``pid``: tiles in groups of ``group_m`` row blocks
    (with ``slice_rows``: the rows of slice ``pid_s`` of the tile, :func:`combine_slices`)."""
    w(f"blocks_m = tl.cdiv({M}, BLOCK_M)")
    w(f"blocks_n = tl.cdiv({N}, BLOCK_N)")
    w(f"in_group = {knobs.group_m} * blocks_n   # tiles of a group of {knobs.group_m} row blocks")
    w(f"first_m = (pid // in_group) * {knobs.group_m}")
    w(f"group_rows = tl.minimum(blocks_m - first_m, {knobs.group_m})")
    w("pid_m = first_m + (pid % in_group) % group_rows")
    w("pid_n = (pid % in_group) // group_rows")
    if slice_rows:
        w(f"offs_m = pid_m{as_index} * BLOCK_M + pid_s * {slice_rows} + "
          f"tl.arange(0, {slice_rows})")
    else:
        w(f"offs_m = pid_m{as_index} * BLOCK_M + tl.arange(0, BLOCK_M)")
    w(f"offs_n = pid_n{as_index} * BLOCK_N + tl.arange(0, BLOCK_N)")


def _store_outputs(plan, w, refs: dict, out_ctx, bounds: dict, sizes: dict,
                   rows: str = "BLOCK_M") -> None:
    """Every output of the tile (of ``rows`` rows), computed on the sums (``refs``) and
    stored."""
    for c in plan.outputs:
        value = refs[c.name] if c.name in refs else to_triton(inline_elementwise(c.bodies[0]),
                                                              out_ctx)
        offsets = store_offsets(c.axes, out_ctx, sizes)
        masks = " & ".join(ok for ragged, ok in (bounds[plan.rows.uid], bounds[plan.cols.uid])
                           if ragged)
        w(f"tl.store(out_{c.name} + ({offsets}), tl.broadcast_to({value}, ({rows}, BLOCK_N))"
          f".to({TL_DTYPES[c.dtypes[0]]}){', mask=' + masks if masks else ''})")


def _part_lines(plan, knobs, sizes: dict, interpreter: bool) -> list[str]:
    """A contraction split along its contracted axis: program ``part · tiles + tile`` sums the
    tile's ``part``-th range of the contracted indices (whole blocks of them) and stores its
    accumulators, padded tiles, into :data:`PARTIALS`; :func:`_combine_lines` finishes."""
    w, M, N, as_index = _kernel_start(plan, sizes, interpreter)
    K = _extent_of(plan, plan.ks, sizes)
    w(f"tiles = tl.cdiv({M}, BLOCK_M) * tl.cdiv({N}, BLOCK_N)")
    w("part = pid // tiles")
    w("pid = pid % tiles")
    _tile_position(knobs, w, M, N, as_index)
    batch = _batch_digits(plan, w, sizes)
    w(f"k_part = tl.cdiv(tl.cdiv({K}, {knobs.splits}), BLOCK_K) * BLOCK_K")
    w("k_begin = part * k_part")
    w(f"k_end = tl.minimum(k_begin + k_part, {K})")
    _contracted(plan, knobs, w, sizes, interpreter, batch, ("k_begin", "k_end"))
    w("tile_at = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
    for k, _ in enumerate(plan.products):
        w(f"tl.store({PARTIALS} + {_slot(len(plan.products), k, knobs, 'part', 'tiles')} * "
          f"(BLOCK_M * BLOCK_N) + tile_at, acc_{k})")
    return w.lines


def _combine_lines(plan, knobs, sizes: dict, interpreter: bool) -> list[str]:
    """The tile ``pid`` of a split contraction (or a slice of its rows: :func:`combine_slices`):
    its parts' accumulators added in the parts' order (the same sums on every run, unlike
    atomics), then the outputs as one program's tile (:func:`_tile_lines`)."""
    w, M, N, as_index = _kernel_start(plan, sizes, interpreter)
    slices = combine_slices(knobs, *grid_of(plan, knobs, sizes))
    slice_rows = knobs.block_m // slices if slices > 1 else 0
    rows = str(slice_rows) if slice_rows else "BLOCK_M"
    if slice_rows:   # program pid·slices + s: slice s of tile pid
        w(f"pid_s = pid % {slices}")
        w(f"pid = pid // {slices}")
    w(f"tiles = tl.cdiv({M}, BLOCK_M) * tl.cdiv({N}, BLOCK_N)")
    _tile_position(knobs, w, M, N, as_index, slice_rows)
    batch = _batch_digits(plan, w, sizes)
    first = f"(pid_s * {rows} + tl.arange(0, {rows}))" if slice_rows else "tl.arange(0, BLOCK_M)"
    w(f"tile_at = {first}[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
    for k, _ in enumerate(plan.products):
        w(f"acc_{k} = tl.zeros([{rows}, BLOCK_N], dtype=tl.float32)")
        w.sweep("part", "0", str(knobs.splits), "1")
        with w.block():
            w(f"acc_{k} += tl.load({PARTIALS} + "
              f"{_slot(len(plan.products), k, knobs, 'part', 'tiles')} * (BLOCK_M * BLOCK_N) + "
              "tile_at)")
    bounds = _tile_bounds(plan, knobs, sizes)[0]
    refs, out_ctx = _finished(plan, w, sizes, interpreter, batch, bounds, {})
    _store_outputs(plan, w, refs, out_ctx, bounds, sizes, rows)
    return w.lines


def _kernel_start(plan, sizes: dict, interpreter: bool) -> tuple:
    """``(writer, rows, columns, the index cast)`` of a kernel whose first lines, written, name
    its program ids (``pid``; ``pid_b``: the batch index)."""
    w = SourceWriter(interpreter)
    M, N = (plan.extent(a, sizes) for a in (plan.rows, plan.cols))
    as_index = ".to(tl.int64)" if needs_wide_offsets(plan.program, sizes) else ""
    w("pid = tl.program_id(0)")
    w(f"pid_b = tl.program_id(1){as_index}")
    return w, M, N, as_index


def _batch_digits(plan, w, sizes: dict) -> dict:
    """Each batch axis (uid → its variable) as a digit of the grid's second index."""
    batch = {}
    for axis in plan.batch:
        w(f"ax_{axis.name} = {_digits(plan, plan.batch, sizes, 'pid_b')[axis.uid]}")
        batch[axis.uid] = f"ax_{axis.name}"
    return batch


def _tile_bounds(plan, knobs, sizes: dict) -> tuple[dict, bool]:
    """``({rows and columns uid: (ragged, their bound)}, whether the contracted axis is ragged)``:
    bounds only where a size is not a multiple of its block (Triton's loads are then
    unpredicated and vectorised; with a size as an argument, which it is is a guard)."""
    M, N = (plan.extent(a, sizes) for a in (plan.rows, plan.cols))
    K = _extent_of(plan, plan.ks, sizes)
    ragged_m, ragged_n, ragged_k = (size % block != 0 for size, block in (
        (M, knobs.block_m), (N, knobs.block_n), (K, knobs.block_k)))
    return {plan.rows.uid: (ragged_m, f"(offs_m[:, None] < {M})"),
            plan.cols.uid: (ragged_n, f"(offs_n[None, :] < {N})")}, ragged_k


def _finished(plan, w, sizes: dict, interpreter: bool, batch: dict, bounds: dict,
              memo: dict) -> tuple:
    """``(compute name → its accumulator, the context of the tile's outputs)`` once the sums
    are whole, their factors of no contracted axis applied."""
    refs = {p.name: f"acc_{k}" for k, p in enumerate(plan.products)}
    refs.update({p.name: f"pair_{k}" for k, p in enumerate(plan.pairwise)})
    out_ctx = TileContext({**batch, plan.rows.uid: "offs_m[:, None]",
                           plan.cols.uid: "offs_n[None, :]"}, _bounds(bounds), refs=refs,
                          sizes=sizes, emit=w, memo=memo, interpreter=interpreter)
    for k, product in enumerate(plan.products):   # factors of no contracted axis, applied once
        if product.outer is not None:
            w(f"acc_{k} = acc_{k} * {to_triton(product.outer, out_ctx)}")
    return refs, out_ctx


def _contracted(plan, knobs, w, sizes: dict, interpreter: bool, batch: dict,
                k_range: tuple | None = None) -> tuple:
    """The ``[BLOCK_M, BLOCK_N]`` tile of every sum at ``offs_m`` × ``offs_n``, over the whole
    contracted axis: ``(compute name → its accumulator, the context of the tile's outputs, axis
    uid → (ragged, bound) of the rows and the columns)``. ``k_range``: (first, end) of the
    contracted indices instead (a part of a split contraction: its sums are not finished)."""
    K = _extent_of(plan, plan.ks, sizes)
    as_index = ".to(tl.int64)" if needs_wide_offsets(plan.program, sizes) else ""
    for k, _ in enumerate(plan.products):
        w(f"acc_{k} = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
    for k, pair in enumerate(plan.pairwise):
        w(f"pair_{k} = tl.full([BLOCK_M, BLOCK_N], {IDENTITY[pair.monoid]}, tl.float32)")
    tile_bounds, ragged_k = _tile_bounds(plan, knobs, sizes)
    (ragged_m, rows_ok), (ragged_n, cols_ok) = (tile_bounds[a.uid] for a in (plan.rows,
                                                                            plan.cols))
    rows_at, cols_at = "offs_m[:, None]", "offs_n[None, :]"
    into = "acc"   # the accumulators the products add to
    loop_memo: dict = {}
    if plan.group is not None:
        into = PART
        # the loop's temporaries numbered after the groups' (a loop's variables keep a shape)
        loop_memo = fresh_memo(open_group_loop(plan, w, sizes, interpreter, batch,
                                               _bounds({plan.rows.uid: (ragged_m, rows_ok)})))
    w.sweep("k0", *(k_range or ("0", str(K))), "BLOCK_K")
    with w.block():
        w(f"offs_k = (k0 + tl.arange(0, BLOCK_K)){as_index}")
        base = dict(sizes=sizes, emit=w, memo=loop_memo, interpreter=interpreter)
        sides = []   # (context, the contracted index's bound, the tile's shape) of each side
        group = {plan.group.axis.uid: GROUP} if plan.group is not None else {}
        for axis, at, bound, k_at, shape in (
                (plan.rows, rows_at, (ragged_m, rows_ok), "offs_k[None, :]", "BLOCK_M, BLOCK_K"),
                (plan.cols, cols_at, (ragged_n, cols_ok), "offs_k[:, None]", "BLOCK_K, BLOCK_N")):
            k_ok = f"({k_at} < {K})"
            ctx = TileContext({**batch, **group, axis.uid: at,
                               **_digits(plan, plan.ks, sizes, k_at)},
                              _bounds({axis.uid: bound,
                                       **{a.uid: (ragged_k, k_ok) for a in plan.ks}}), **base)
            sides.append((ctx, k_ok, shape))
        # Triton's interpreter multiplies 16-bit operands wrongly: it gets them in f32
        for k, product in enumerate(plan.products):
            dtype = "f32" if interpreter else product.dtype
            operands = []
            for side, (ctx, k_ok, shape) in zip((product.rows_side, product.cols_side), sides):
                if isinstance(side, Load):   # masked: zeros past the last contracted index
                    value = dot_operand(side, ctx, dtype)
                else:   # computed (from zeros past the last index, which need not give zero)
                    value = f"tl.where({k_ok}, {to_triton(side, ctx)}, 0.0)" if ragged_k else \
                        to_triton(side, ctx)
                    value = f"({value}).to({TL_DTYPES[dtype]})"
                operands.append(f"tl.broadcast_to({value}, ({shape}))")
            w(f"{into}_{k} = tl.dot({operands[0]}, {operands[1]}, {into}_{k}"
              f"{dot_precision(dtype)})")
        bounds = {plan.rows.uid: (ragged_m, rows_ok), plan.cols.uid: (ragged_n, cols_ok),
                  **{a.uid: (ragged_k, f"(offs_k[None, :] < {K})") for a in plan.ks}}
        _pairs(plan, knobs, w, batch, bounds, base, K)
    if plan.group is not None:
        close_group_loop(plan, w, sizes)
    if k_range is not None:
        return None
    refs, out_ctx = _finished(plan, w, sizes, interpreter, batch, tile_bounds,
                              fresh_memo(loop_memo))
    return refs, out_ctx, tile_bounds


def _row_block_lines(plan, knobs, sizes: dict, interpreter: bool) -> list[str]:
    """A program per block of ``BLOCK_M`` rows (and batch index) that sweeps the columns in
    blocks of ``BLOCK_N``: each block's tile of the sums (:func:`_contracted`), then every
    reduction over the columns combined elementwise into its ``[BLOCK_M, BLOCK_N]`` state
    (columns past the last combine the identity), folded across the columns once after the
    sweep (a fold every block had cost 82 warp shuffles a block of 16 × 256 pairs, 2.5 a pair
    on each thread, on sm_90a); the outputs from the folded states. Nothing of the
    ``[rows, columns]`` sums is stored (a Gaussian kernel's sum over 16384² pairs had stored
    1 GiB between two kernels). With ``knobs.splits`` > 1, program ``part · row blocks + row
    block`` sweeps the ``part``-th range of the columns (whole blocks) and stores its folded
    states into :data:`PARTIALS`; :func:`_row_combine_lines` finishes."""
    w, M, N, as_index = _kernel_start(plan, sizes, interpreter)
    columns = ("0", str(N))
    if knobs.splits > 1:
        w(f"row_blocks = tl.cdiv({M}, BLOCK_M)")
        w("part = pid // row_blocks")
        w("pid = pid % row_blocks")
        w(f"n_part = tl.cdiv(tl.cdiv({N}, {knobs.splits}), BLOCK_N) * BLOCK_N")
        w("n_begin = part * n_part")
        w(f"n_end = tl.minimum(n_begin + n_part, {N})")
        columns = ("n_begin", "n_end")
    w(f"offs_m = pid{as_index} * BLOCK_M + tl.arange(0, BLOCK_M)")
    batch = _batch_digits(plan, w, sizes)
    for k, r in enumerate(plan.over_columns):   # folded across the columns once, at the end
        w(f"row_{k} = tl.full([BLOCK_M, BLOCK_N], {IDENTITY[r.monoid]}, tl.float32)")
        if r.states == 2:
            w(f"at_{k} = tl.full([BLOCK_M, BLOCK_N], {NO_INDEX}, tl.int32)")
    w.sweep("n0", *columns, "BLOCK_N")
    with w.block():
        w(f"offs_n = (n0 + tl.arange(0, BLOCK_N)){as_index}")
        refs, ctx, bounds = _contracted(plan, knobs, w, sizes, interpreter, batch)
        ragged_n, cols_ok = bounds[plan.cols.uid]
        for k, r in enumerate(plan.over_columns):
            if r.of:   # a normaliser: taken with its maximum, before the maximum moves
                continue
            value = to_triton(r.body, ctx)
            for n in normalisers_of(plan, r):
                for line in lane_update(f"row_{n}", f"row_{k}", value,
                                        cols_ok if ragged_n else None):
                    w(line)
            if r.states == 2:   # the pair's combine: better, or as good at an earlier column
                w(f"{L}value = tl.broadcast_to({value}, (BLOCK_M, BLOCK_N))")
                w(f"{L}column = tl.broadcast_to((n0 + tl.arange(0, BLOCK_N))[None, :], "
                  "(BLOCK_M, BLOCK_N))")
                take = (f"({BETTER[r.monoid].format(L + 'value', f'row_{k}')}) | "
                        f"(({L}value == row_{k}) & ({L}column < at_{k}))")
                w(f"{L}take = {f'{cols_ok} & ({take})' if ragged_n else take}")
                w(f"row_{k} = tl.where({L}take, {L}value, row_{k})")
                w(f"at_{k} = tl.where({L}take, {L}column, at_{k})")
                continue
            if ragged_n:
                value = f"tl.where({cols_ok}, {value}, {IDENTITY[r.monoid]})"
            w(f"row_{k} = {COMBINE[r.monoid].format(f'row_{k}', value)}")
    at = {r.name: k for k, r in enumerate(plan.over_columns)}
    for k, r in enumerate(plan.over_columns):   # normalisers first: their maxima still by lane
        if r.of:
            for line in lanes_folded(f"row_{k}", f"row_{at[r.of]}"):
                w(line)
    slot = slots(plan)
    for k, r in enumerate(plan.over_columns):
        if r.states == 2:   # the extremum, then the first column holding it
            w(f"{L}best = {FOLD[EXTREMUM[r.monoid]].format(f'row_{k}')}")
            w(f"at_{k} = tl.min(tl.where(row_{k} == {L}best[:, None], at_{k}, {NO_INDEX}), 1)")
            w(f"row_{k} = {L}best")
        elif not r.of:   # (a normaliser is folded above)
            w(f"row_{k} = {FOLD[r.monoid].format(f'row_{k}')}")
        if knobs.splits > 1:
            for c, state in enumerate(states(k, r)):
                stored = state if c == 0 else \
                    f"{state}.to(tl.float32, bitcast=True)"   # an index's bits, kept exactly
                at_slot = _slot(column_states(plan), slot[r.name] + c, knobs, "part",
                                "row_blocks")
                w(f"tl.store({PARTIALS} + {at_slot} * BLOCK_M + tl.arange(0, BLOCK_M), {stored})")
    if knobs.splits == 1:
        _store_row_outputs(plan, knobs, w, batch, sizes, interpreter)
    return w.lines


def _row_combine_lines(plan, knobs, sizes: dict, interpreter: bool) -> list[str]:
    """The row block ``pid`` of a contraction whose columns are split: each reduction's states
    of the parts combined in the parts' order, then the outputs (:func:`_row_block_lines`)."""
    w, M, _, as_index = _kernel_start(plan, sizes, interpreter)
    w(f"row_blocks = tl.cdiv({M}, BLOCK_M)")
    w(f"offs_m = pid{as_index} * BLOCK_M + tl.arange(0, BLOCK_M)")
    batch = _batch_digits(plan, w, sizes)
    slot = slots(plan)
    for k, r in enumerate(plan.over_columns):
        w(f"row_{k} = tl.full([BLOCK_M], {IDENTITY[r.monoid]}, tl.float32)")
        if r.states == 2:
            w(f"at_{k} = tl.full([BLOCK_M], {NO_INDEX}, tl.int32)")
        if r.of:
            w(f"{L}top = tl.full([BLOCK_M], float('-inf'), tl.float32)")
        w.sweep("part", "0", str(knobs.splits), "1")
        with w.block():
            loads = [f"tl.load({PARTIALS} + "
                     f"{_slot(column_states(plan), slot[r.name] + c, knobs, 'part', 'row_blocks')}"
                     " * BLOCK_M + tl.arange(0, BLOCK_M))" for c in range(r.states)]
            w(f"{L}state = {loads[0]}")
            if r.of:   # its maximum's part, which this part's sum is relative to
                w(f"{L}m_part = tl.load({PARTIALS} + "
                  f"{_slot(column_states(plan), slot[r.of], knobs, 'part', 'row_blocks')} * "
                  "BLOCK_M + tl.arange(0, BLOCK_M))")
                for line in part_combined(f"row_{k}", f"{L}top", f"{L}m_part", f"{L}state"):
                    w(line)
            elif r.states == 2:   # parts in the columns' order: a later one wins only if better
                w(f"{L}column = {loads[1]}.to(tl.int32, bitcast=True)")
                w(f"{L}take = ({BETTER[r.monoid].format(L + 'state', f'row_{k}')}) | "
                  f"(({L}state == row_{k}) & ({L}column < at_{k}))")
                w(f"row_{k} = tl.where({L}take, {L}state, row_{k})")
                w(f"at_{k} = tl.where({L}take, {L}column, at_{k})")
            else:
                w(f"row_{k} = {COMBINE[r.monoid].format(f'row_{k}', L + 'state')}")
    _store_row_outputs(plan, knobs, w, batch, sizes, interpreter)
    return w.lines


def _store_row_outputs(plan, knobs, w, batch: dict, sizes: dict, interpreter: bool) -> None:
    """The outputs of the row block ``offs_m`` from its folded states ``row_<k>``, stored."""
    at = {r.name: k for k, r in enumerate(plan.over_columns)}
    for k, r in enumerate(plan.over_columns):   # exp(u − m) as written: NaN where m is infinite
        if r.of and not r.guarded:
            w(f"row_{k} = tl.where(tl.abs(row_{at[r.of]}) == float('inf'), float('nan'), "
              f"row_{k})")
    M = plan.extent(plan.rows, sizes)
    ragged_m, _ = _tile_bounds(plan, knobs, sizes)[0][plan.rows.uid]
    rows_ok = f"(offs_m < {M})"
    out_ctx = TileContext({**batch, plan.rows.uid: "offs_m"},
                          _bounds({plan.rows.uid: (ragged_m, rows_ok)}),
                          refs=column_refs(plan),
                          sizes=sizes, emit=w, interpreter=interpreter)
    for c in plan.outputs:
        value = out_ctx.refs.get(c.name) or to_triton(inline_elementwise(c.bodies[0]), out_ctx)
        w(f"tl.store(out_{c.name} + ({store_offsets(c.axes, out_ctx, sizes)}), "
          f"tl.broadcast_to({value}, (BLOCK_M,)).to({TL_DTYPES[c.dtypes[0]]})"
          f"{', mask=' + rows_ok if ragged_m else ''})")




def _pairs(plan, knobs, w, batch: dict, bounds: dict, base: dict, K) -> None:
    """One block of the contracted axis for the plan's pairwise reductions: each load of their
    bodies that reads the contracted axis is one ``[BLOCK_M | BLOCK_N | 1, BLOCK_K]`` tile (the
    contracted index innermost, as most tensors lie), split in registers into its ``BLOCK_K``
    columns (``tl.split``: the index stays inside each thread, where a ``[BLOCK_M, BLOCK_K,
    BLOCK_N]`` broadcast reduced along its middle axis had Triton spread it over two lanes and
    shuffle every pair — 64 ``SHFL`` a block against none, ptxas for sm_90a); then, for each
    index of the block, every body on the ``[BLOCK_M, BLOCK_N]`` pairs, folded into its
    accumulator (indices past the last one fold in the identity; where the whole axis is one
    block, they are not computed)."""
    if not plan.pairwise:
        return
    k_tile = _digits(plan, plan.ks, base["sizes"], "offs_k[None, :]")
    loads = {n.key(): n for p in plan.pairwise for n in nodes(p.body) if isinstance(n, Load)}
    per_index: dict = {}   # a tiled load's key → its column at each index of the block
    fixed = TileContext({**batch, plan.rows.uid: "offs_m[:, None]",
                         plan.cols.uid: "offs_n[None, :]"},
                        _bounds({plan.rows.uid: bounds[plan.rows.uid],
                                 plan.cols.uid: bounds[plan.cols.uid]}), **base)
    for t, (key, n) in enumerate(loads.items()):
        if not any(has_axis(n, a) for a in plan.ks):   # a row's or a column's factor: once
            per_index[key] = [to_triton(n, fixed)] * knobs.block_k
            continue
        free = next((a for a in (plan.rows, plan.cols) if has_axis(n, a)), None)
        axes, valid = {**batch, **k_tile}, {a.uid: bounds[a.uid] for a in plan.ks}
        if free is not None:   # its index down the tile's first axis, whichever side it is
            at = f"offs_{'m' if free is plan.rows else 'n'}[:, None]"
            axes[free.uid] = at
            valid[free.uid] = (bounds[free.uid][0], f"({at} < {plan.extent(free, base['sizes'])})")
        tile = TileContext(axes, _bounds(valid), sizes=base["sizes"],
                           interpreter=base["interpreter"])
        width = knobs.block_m if free is plan.rows else knobs.block_n if free is not None else 1
        w(f"_pw{t} = {to_triton(n, tile)}")
        columns = split_interleaved(w, f"_pw{t}", width, 1, knobs.block_k)
        if free is plan.cols:   # [BLOCK_N, 1] → [1, BLOCK_N]
            columns = [f"tl.reshape({c}, [1, {width}])" for c in columns]
        per_index[key] = columns
    ragged_k = bounds[plan.ks[0].uid][0]
    indices = knobs.block_k
    if isinstance(K, int) and K <= knobs.block_k:   # one block: the indices past K are dropped
        indices, ragged_k = K, False
    memo = base["memo"]
    for kk in range(indices):
        memo = fresh_memo(memo)
        memo.update({(key, False): columns[kk] for key, columns in per_index.items()})
        ctx = fixed.child(axes=_digits(plan, plan.ks, base["sizes"], f"(k0 + {kk})"), memo=memo)
        for k, pair in enumerate(plan.pairwise):
            value = to_triton(pair.body, ctx)
            if ragged_k:
                value = f"tl.where(k0 + {kk} < {K}, {value}, {IDENTITY[pair.monoid]})"
            w(f"pair_{k} = {COMBINE[pair.monoid].format(f'pair_{k}', value)}")
    # the names taken here, kept under keys no expression has: later temporaries (the tile's
    # outputs) are numbered after them
    base["memo"].update({("pairwise", key): name for key, name in memo.items()})
