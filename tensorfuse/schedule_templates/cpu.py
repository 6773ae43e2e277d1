"""The CPU template: any lowered program (plain or fused) on the ``llvm`` target.

Row programs — every block loops over the same row axes and at most one inner axis (softmax,
norms, cross-entropy, any chain over the last axis) — get the row schedule (:func:`row_schedule`):
one row at a time per core with all of its blocks, the row's intermediates small enough to stay in
the core's cache, every inner loop vectorised (sums and maxima through ``rfactor``: a vector of
partial results, then one across it). A block may also contract within its row (attention's
scores ``q·k`` over ``d`` and ``p·v`` over the keys): its reduction loop goes outside, the other
loop inside for LLVM to vectorise, and an operand read along the reduction as its last axis (the
keys) is copied once per head with the other axis last, so that inner loop reads consecutive
elements (measured: ``benchmarks.cpu``). Other programs run the
outermost loop of each top-level nest on all cores.

Tuning declares its knobs as MetaSchedule decisions, so the search and the XGBoost cost model see
them: for row programs the vector width (``sample_categorical`` over the widths every inner loop
divides into), the rows a core takes at a time and an unroll depth; for the others the vector
width of each block's innermost loop when that loop is data-parallel (``sample_perfect_tile``:
the loop is split and its inner part vectorised) and the unroll depth.
"""
from __future__ import annotations

import tvm

UNROLL_DEPTHS = (0, 16, 64, 512)
MAX_VECTOR = 16  # fp32 lanes of two AVX-512 registers: wider gains nothing on current CPUs
VECTOR = 16      # the row schedule's default width: f32 lanes of one AVX-512 register
ROW_WIDTHS = (4, 8, 16, 32)
ROW_GRAINS = (1, 4, 16, 64)   # rows a core takes at a time (1: the default)
_DATA_PARALLEL = 0  # IterVar.DataPar
_REDUCE = 2         # IterVar.CommReduce (a rolled chunk's index is opaque: neither)
UNROLL_KEY = "meta_schedule.unroll_explicit"  # read by MetaSchedule's unroll mutator and postproc


def row_schedule(sch: tvm.s_tir.Schedule, sample: bool = False, defaults: bool = False) -> bool:
    """Schedule a row program as the module docstring says and return True, or leave ``sch``
    untouched and return False when the program is not one (tried on a copy first). ``sample``:
    the vector width and the rows per task are MetaSchedule decisions (``defaults``: decided as
    :data:`VECTOR` and one row)."""
    trial = tvm.s_tir.Schedule(sch.mod)
    trial.work_on(next(iter(sch.mod.functions.keys())).name_hint)
    try:
        widths = _row_widths(trial)
        width = VECTOR if VECTOR in widths else (widths[-1] if widths else 1)
        _rows(trial, width, bool(widths))
    except (tvm.s_tir.ScheduleError, tvm.error.InternalError, ValueError):
        return False
    grain = 1
    if sample:
        grain = _choose(sch, ROW_GRAINS, 0, defaults)
        if widths:
            width = _choose(sch, widths, widths.index(width), defaults)
    _rows(sch, width, bool(widths), grain)
    return True


def _choose(sch: tvm.s_tir.Schedule, options, default: int, defaults: bool):
    """A MetaSchedule decision among ``options`` (``defaults``: the one at ``default``)."""
    return sch.sample_categorical(list(options), [1.0 / len(options)] * len(options),
                                  decision=default if defaults else None)


def _row_nests(sch: tvm.s_tir.Schedule):
    """The top-level blocks, the number of row loops they share, and each one's loop extents;
    ValueError when the program is not a row program. A block may have two inner loops where the
    second is a reduction (a contraction within the row: attention's ``q·k`` over ``d``)."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    extents = [[sch.get(loop).extent for loop in sch.get_loops(b)] for b in blocks]
    depth = min(sum(int(iv.iter_type) == _DATA_PARALLEL for iv in sch.get(b).iter_vars)
                for b in blocks)   # the rows: what every block computes one of
    if depth == 0 or not all(_fits_rows(sch, b, e, depth, extents[-1])
                             for b, e in zip(blocks, extents)) or \
            not _read_at_own_rows(sch, blocks, depth):
        raise ValueError("not a row program")
    return blocks, depth, extents


def _read_at_own_rows(sch: tvm.s_tir.Schedule, blocks, depth: int) -> bool:
    """Whether every block reads what an earlier block wrote at its own row: the first ``depth``
    indices of the buffer written and read are each block's first ``depth`` data-parallel
    variables. Equal extents are not enough — a running sum over a sequence of each position's
    row sum (``rows[b, j]`` summed over ``j <= i``) has rows ``(b, j)`` and ``(b, i)`` of one
    size: placed at ``(b, i)`` the producer's whole sequence was recomputed at every ``i``, its
    vectorised loop ``N`` lanes wide (a 500-position sequence took 32 s in LLVM)."""
    def rows(stmt):
        return [iv.var for iv in stmt.iter_vars if int(iv.iter_type) == _DATA_PARALLEL][:depth]

    def at_rows(region, own) -> bool:
        return len(region.region) >= depth and all(
            _same(rng.extent, tvm.tirx.IntImm("int32", 1)) and rng.min.same_as(v)
            for rng, v in zip(region.region[:depth], own))

    written: list = []
    for block in blocks:
        stmt = sch.get(block)
        own = rows(stmt)
        if any(any(r.source.same_as(b) for b in written) and not at_rows(r, own)
               for r in stmt.reads) or not all(at_rows(r, own) for r in stmt.writes):
            return False
        written += [r.source for r in stmt.writes]
    return True


def _fits_rows(sch, block, extents, depth: int, rows) -> bool:
    """Whether ``block`` loops over the ``rows`` (the last block's first ``depth`` extents) and
    then: nothing (an elementwise result per row), one loop, or a loop and a reduction inside it
    (a contraction)."""
    inner = len(extents) - depth
    if inner not in (0, 1, 2) or not all(_same(a, b) for a, b in zip(extents[:depth], rows)):
        return False
    parallel = _is_data_parallel(sch, block)
    return parallel if inner == 0 else (not parallel if inner == 2 else True)


def _row_widths(sch: tvm.s_tir.Schedule) -> list[int]:
    """The vector widths every single inner loop of the row program splits into (twice at least;
    a contraction's loops are left to LLVM's vectoriser)."""
    _, depth, extents = _row_nests(sch)
    inner = [e[-1] for e in extents if len(e) == depth + 1]
    if not inner or not all(isinstance(x, tvm.tirx.IntImm) for x in inner):
        return []
    return [w for w in ROW_WIDTHS if all(x.value % w == 0 and x.value >= 2 * w for x in inner)]


def _rows(sch: tvm.s_tir.Schedule, width, vectorize: bool, grain=1) -> None:
    blocks, depth, extents = _row_nests(sch)
    partials = []
    if vectorize:   # sums and maxima: a vector of partial results first
        for block, extent in zip(blocks, extents):
            if len(extent) == depth + 1 and not _is_data_parallel(sch, block):
                _, lanes = sch.split(sch.get_loops(block)[-1], [None, width])
                partials.append(sch.rfactor(lanes, 0))
    contractions = [b for b, e in zip(blocks, extents) if len(e) == depth + 2]
    copies = [c for b in contractions for c in _transposed_operands(sch, b)]
    row = sch.get_loops(blocks[-1])[depth - 1]
    for block in reversed(sch.get_child_blocks(sch.get_sblock("root"))[:-1]):
        if not any(sch.get(block).same_as(sch.get(c)) for c in copies):
            sch.compute_at(block, row)
    if copies:   # made once per outer row loop (per head), before that loop's rows
        if depth < 2:
            raise ValueError("a transposed operand needs a loop above the rows")
        for copy in copies:
            sch.compute_at(copy, sch.get_loops(blocks[-1])[depth - 2])
    for block in contractions:   # reduction outside, the other loop inside: LLVM vectorises
        loops = sch.get_loops(block)   # it (better than a TVM-vectorised split: 82 vs 100 ms
        sch.reorder(loops[-1], loops[-2])   # for causal attention S=1024 on 2 cores)
    if vectorize:
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            loops = sch.get_loops(block)
            if len(loops) == depth + 1 and _is_data_parallel(sch, block):
                _, lanes = sch.split(loops[-1], [None, width])
                sch.vectorize(lanes)
        for rf in partials:   # loops: rows, lanes, chunks -> rows, chunks, lanes (vectorised)
            loops = sch.get_loops(rf)
            sch.reorder(loops[-1], loops[-2])
            sch.vectorize(sch.get_loops(rf)[-1])
    rows = sch.get_loops(blocks[-1])[:depth]
    if copies:   # the copies sit between the outer row loops and the last one
        rows = rows[-1]
    else:
        rows = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    grained = not (isinstance(grain, int) and grain == 1)
    if grained:
        rows, _ = sch.split(rows, [None, grain])
    sch.parallel(rows)
    # after `parallel`, which wants whole reduction blocks: every reduction's initialisation
    # goes before its loops within the row, so that mask_bounds may cut those loops
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(block)
        kinds = [sch.get(lp).kind for lp in loops]
        if sch.get(block).init is None or tvm.tirx.ForKind.PARALLEL not in kinds:
            continue
        below = kinds.index(tvm.tirx.ForKind.PARALLEL) + (2 if grained else 1)
        if below < len(loops):
            sch.decompose_reduction(block, loops[below])


def _transposed_operands(sch: tvm.s_tir.Schedule, block) -> list:
    """For a contraction ``block`` (loops: rows, a spatial ``x``, a reduction ``r``): copies of
    the operands it reads along ``r`` as their last axis while indexing by ``x`` (attention's
    ``k[b, h, j, d]`` in ``q·k``), laid out with ``x`` last instead, so that the loop over ``x``
    reads consecutive elements. Returns the copy blocks (not yet placed)."""
    stmt = sch.get(block)
    reduce = [iv.var for iv in stmt.iter_vars if int(iv.iter_type) == _REDUCE]
    spatial = [iv.var for iv in stmt.iter_vars if int(iv.iter_type) == _DATA_PARALLEL]
    if len(reduce) != 1:
        raise ValueError("a contraction over one axis")
    r, x = reduce[0], spatial[-1]
    copies = []
    for index, region in enumerate(stmt.reads):
        mins = [rng.min for rng in region.region]
        if len(mins) < 2 or not _uses(mins[-1], r) or not any(_uses(m, x) for m in mins[:-1]):
            continue
        at = next(k for k, m in enumerate(mins[:-1]) if _uses(m, x))
        rank = len(mins)
        copy = sch.cache_read(block, index, "global")
        order = [k for k in range(rank) if k != at] + [at]
        index_map = tvm.tirx.IndexMap.from_func(lambda *axes: [axes[k] for k in order],
                                                ndim=rank)
        sch.transform_layout(copy, ("write", 0), index_map)
        copies.append(copy)
    return copies


def rolled_schedule(sch: tvm.s_tir.Schedule) -> None:
    """The CPU schedule of a rolling or split update lowered for the CPU (``fusion.py`` with
    ``parallel="cpu"``: the rows of every batch and head spread over the cores, each chunk's
    positions innermost, per-position values such as ``exp(s - m)`` computed once): an operand a
    chunk-local reduction reads along its reduction axis (the keys of ``q·k``) gets a copy with
    the positions' axis last, made once before the pass on all cores, so that the loop over a
    chunk's positions reads consecutive elements and LLVM vectorises it. A block this does not
    fit is left as it is."""
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        stmt = sch.get(block)
        if not stmt.name_hint.endswith("_local") or stmt.init is not None or \
                sum(int(iv.iter_type) == _REDUCE for iv in stmt.iter_vars) != 1:
            continue
        try:
            copies = _transposed_operands(sch, block)
        except (tvm.s_tir.ScheduleError, ValueError):
            continue
        for copy in copies:
            loops = sch.get_loops(copy)
            outer = sch.fuse(*loops[:-2]) if len(loops) > 3 else loops[0]
            sch.parallel(outer)


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in tvm.tirx.analysis.undefined_vars(expr, []))


def _same(a, b) -> bool:
    return isinstance(a, tvm.tirx.IntImm) and isinstance(b, tvm.tirx.IntImm) and \
        a.value == b.value


def cpu_default(sch: tvm.s_tir.Schedule) -> None:
    """The CPU template's defaults: the row schedule where it applies, else the outer loops
    parallel."""
    if not row_schedule(sch):
        parallelize_outer_loops(sch)


def parallelize_outer_loops(sch: tvm.s_tir.Schedule) -> None:
    """Mark the outermost loop of each top-level nest parallel where TVM agrees it is safe."""
    seen: list = []
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(block)
        if not loops:
            continue
        outer = sch.get(loops[0])
        if any(outer.same_as(s) for s in seen):
            continue
        seen.append(outer)
        try:
            sch.parallel(loops[0])
        except tvm.s_tir.ScheduleError:
            continue  # a reduction or a loop-carried dependence: leave it serial


def cpu_search_space(sch: tvm.s_tir.Schedule, defaults: bool = False) -> None:
    """The tunable CPU schedule. Used as a MetaSchedule ``ScheduleFn``; ``defaults=True`` takes
    the decisions of :func:`cpu_default`. A row program gets the row schedule with its vector
    width, rows per task and unroll depth sampled; others the outer loops parallel with sampled
    vector widths and unroll depth."""
    if row_schedule(sch, sample=True, defaults=defaults):
        _sample_unroll(sch, defaults)
        return
    parallelize_outer_loops(sch)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if not _is_data_parallel(sch, block):
            continue
        loops = sch.get_loops(block)
        if len(loops) < 2:
            continue  # the only loop is the parallel one
        extent = sch.get(loops[-1]).extent
        if not isinstance(extent, tvm.tirx.IntImm) or extent.value < 4:
            continue
        outer_inner = sch.sample_perfect_tile(loops[-1], n=2, max_innermost_factor=MAX_VECTOR,
                                              decision=[extent.value, 1] if defaults else None)
        _, inner = sch.split(loops[-1], factors=outer_inner)
        try:
            sch.vectorize(inner)
        except tvm.s_tir.ScheduleError:
            continue
    _sample_unroll(sch, defaults)


def _sample_unroll(sch: tvm.s_tir.Schedule, defaults: bool) -> None:
    sch.annotate(sch.get_sblock("root"), UNROLL_KEY, _choose(sch, UNROLL_DEPTHS, 0, defaults))


def _is_data_parallel(sch: tvm.s_tir.Schedule, block) -> bool:
    return all(int(iv.iter_type) == _DATA_PARALLEL for iv in sch.get(block).iter_vars)
