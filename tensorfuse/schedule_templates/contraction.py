"""The contraction template: programs whose sums are GEMMs (:mod:`.contraction_plan`) as Triton
tensor-core tiles, on every GPU Triton generates code for (the source:
:mod:`tensorfuse.targets.triton.contraction`; the callable: :class:`ContractionKernel`).

``tf.compile`` tries it after the native Hopper templates and before the row-tile template, so a
GEMM-shaped program gets tensor-core tiles on an A100, an RTX card and an MI300 as well — and a
GEMM the Hopper GEMM refuses (a weight gradient reading its rows operand transposed, an operand
computed from several tensors) on the H100 too. Sizes are kernel arguments once a call brings a
second value of one (:mod:`tensorfuse.targets.triton.size_builds`: a new number of tokens does
not build again).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..algebra.exprs import has_axis, nodes
from ..dsl import dtypes as dt
from ..dsl.expr import Load
from ..errors import ScheduleError, TargetError
from ..targets import TargetSpec
from ..targets.triton.contraction import grid_of
from ..targets.triton.rowtile import MAX_FEATURE
from .attention import SMS
from .contraction_plan import ContractionPlan, plan_contraction


@dataclass(frozen=True)
class ContractionKnobs:
    """Output tiles of ``block_m × block_n`` over blocks of ``block_k`` contracted indices,
    ``num_warps`` warps, ``num_stages`` blocks of loads in flight (Triton's pipeliner), tiles
    visited in groups of ``group_m`` row blocks; ``stage_sides``: computed sides stored once
    before the tiles (1) or computed in every tile that reads them (0); ``splits``: the
    contracted axis split into this many parts, a program each per tile, their f32 tiles added
    by a second kernel in the parts' order (deterministic) — for outputs of too few tiles to
    fill the GPU (a Gram matrix, a small layer's weight gradient); where reductions over the
    columns follow (a bilinear form), the columns split so, each part's row states combined."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 8
    num_stages: int = 3
    group_m: int = 8
    stage_sides: int = 0
    splits: int = 1

    def __str__(self) -> str:
        return (f"block_m={self.block_m}, block_n={self.block_n}, block_k={self.block_k}, "
                f"warps={self.num_warps}, stages={self.num_stages}, group_m={self.group_m}"
                + (", computed sides staged" if self.stage_sides else "")
                + (f", in {self.splits} parts" if self.splits > 1 else ""))


def _pow2_at_least(n: int, low: int) -> int:
    return max(low, 1 << max(0, int(n) - 1).bit_length())


def operand_bytes(plan: ContractionPlan) -> int:
    """Bytes of one element of the widest operand the tensor cores read (4 where only pairwise
    reductions, computed in f32, read them)."""
    return max((4 if p.dtype == "f32" else 2 for p in plan.products), default=4)


def _loads(side) -> dict:
    return {n.key(): n for n in nodes(side) if isinstance(n, Load)}


def shared_bytes(plan: ContractionPlan, knobs: ContractionKnobs) -> int:
    """Shared memory the pipeliner keeps: ``num_stages`` blocks of every tensor each side reads,
    as stored (a side computed from two f32 tensors stages both: ptxas's count for SwiGLU's
    gate gradient was 2.3× the operands'; a staged side, its stored tensor)."""
    plan = plan.for_knobs(knobs)
    rows, cols = {}, {}
    for p in plan.products:
        rows.update(_loads(p.rows_side))
        cols.update(_loads(p.cols_side))
    for p in plan.pairwise:   # each load a tile of the side whose free axis it reads
        for key, n in _loads(p.body).items():
            if any(has_axis(n, k) for k in plan.ks):
                (rows if has_axis(n, plan.rows) else cols)[key] = n
    per_stage = sum(knobs.block_m * knobs.block_k * dt.to_numpy(n.param.dtype).itemsize
                    for n in rows.values())
    per_stage += sum(knobs.block_k * knobs.block_n * dt.to_numpy(n.param.dtype).itemsize
                     for n in cols.values())
    return knobs.num_stages * per_stage


def default_contraction_knobs(plan: ContractionPlan, sizes: dict, target: TargetSpec,
                              stage_sides: int | None = None) -> ContractionKnobs:
    """Tiles of 128 × 128 (128 × 256 on sm_90 with one sum: ``wgmma``'s widest efficient tile,
    as Triton's own matmul tutorial picks for the H100), narrowed to the rows and columns there
    are (a few rows: 16 at least, what ``tl.dot`` takes), one accumulator's registers shared
    between several sums, three pipeline stages (two on CDNA, whose LDS is 64 KiB) or fewer
    where the shared memory does not hold them, then shallower and narrower blocks; f32
    operands (IEEE products on the CUDA cores) in 64 × 64 tiles of 32, two stages; computed
    sides staged where several tiles would compute them again (:func:`_reread`; or as
    ``stage_sides`` says). On the H200 these were within 0.6 % of the best of 12 tiles, warps
    and stages around them for ``nn.Linear``, SwiGLU's gate-weight gradient and its gated pair
    at 8192 × 4096 × 14336 (``python -m benchmarks.contraction --sweep``). A contracted axis of
    :data:`SHORT_BLOCKS` blocks or fewer takes 128 × 128 tiles, 4 warps, 2 stages."""
    rows, cols = (plan.extent(a, sizes) for a in (plan.rows, plan.cols))
    if not plan.products:
        depth = contracted_depth(plan, sizes)
        knobs = ContractionKnobs(*(PAIRWISE_TILE if depth >= PAIRWISE_LONG
                                   else PAIRWISE_SHORT_TILE))
    elif operand_bytes(plan) == 4:
        knobs = ContractionKnobs(64, 64, 32, 4, 2)
    else:
        wide = target.kind == "cuda" and target.compute_capability >= (9, 0)
        sums = len(plan.products)
        knobs = ContractionKnobs(128, (256 if wide else 128) if sums == 1 else
                                 128 if sums == 2 else 64)
    if plan.over_columns and not plan.products:   # a program a row block, sweeping the columns
        knobs = replace(knobs, num_warps=4, **(dict(block_n=128) if depth >= PAIRWISE_LONG
                                               else dict(block_m=16, block_n=256)))
        knobs = replace(knobs, block_m=_rows_a_program(plan, sizes, knobs.block_m))
    elif plan.over_columns:   # tensor-core tiles of 64 rows; the columns split to fill the GPU
        knobs = replace(knobs, block_m=OVER_COLUMNS_ROWS, **(
            dict(block_n=128) if len(plan.over_columns) > WIDE_COLUMN_STATES else {}))
    knobs = replace(knobs, block_m=min(knobs.block_m, _pow2_at_least(int(rows), 16)),
                    block_n=min(knobs.block_n, _pow2_at_least(int(cols), 16)))
    if knobs.block_m * knobs.block_n <= 64 * 64 and plan.products:
        knobs = replace(knobs, num_warps=4)
    short = -(-contracted_depth(plan, sizes) // knobs.block_k) <= SHORT_BLOCKS
    if short and plan.products and not plan.over_columns and knobs.block_m == 128 and \
            knobs.block_n >= 128:
        knobs = replace(knobs, block_n=128, num_warps=4, num_stages=2)
    knobs = replace(knobs, stage_sides=int(_reread(plan, knobs, sizes)) if stage_sides is None
                    else stage_sides)
    if target.kind == "rocm":
        knobs = replace(knobs, num_stages=2)
    room = shared_room(target)
    for stages in range(knobs.num_stages, 1, -1):
        if shared_bytes(plan, replace(knobs, num_stages=stages)) <= room:
            knobs = replace(knobs, num_stages=stages)
            break
    else:
        knobs = replace(knobs, num_stages=2)   # then narrower blocks of k, then of columns
        while shared_bytes(plan, knobs) > room and knobs.block_k > 16:
            knobs = replace(knobs, block_k=knobs.block_k // 2)
        while shared_bytes(plan, knobs) > room and knobs.block_n > 16:
            knobs = replace(knobs, block_n=knobs.block_n // 2)
    return replace(knobs, splits=default_splits(plan, knobs, sizes))


# A contracted axis of at most this many blocks (k ≤ 128) bounds a product by its output's
# stores, not by the tensor cores: 128 × 128 tiles, 4 warps, 2 stages, so that several programs
# an SM overlap one tile's stores with the next one's loads. A bmm of 16 × 2048 × 128 × 2048 on
# the H200: 0.068 ms against 0.081 in 128 × 256 tiles of 8 warps, 3 stages (64 × 128: 0.076;
# ``python -m benchmarks.contraction --sweep --only batched_product``)
SHORT_BLOCKS = 2


def contracted_depth(plan: ContractionPlan, sizes: dict) -> int:
    """Elements each output sums over: the contracted axes' extents multiplied."""
    return math.prod(int(plan.extent(a, sizes)) for a in plan.ks)


# A part of a split contraction sums at least this many blocks of the contracted axis: its tile
# is stored and read back once (32-64 KB a tile), against that many blocks of operands loaded
MIN_PART_BLOCKS = 8
MAX_SPLITS = 16


# A tensor-core program that reduces over the columns (a bilinear form, a GEMM's row maxima)
# takes 64 rows × 256 columns, and the columns are split into parts for about 8 programs an SM,
# each part 4 column blocks at least, rather than its rows narrowed to 16 for the SMs. On the H200
# (``python -m benchmarks.contraction --splits``): a bilinear form over 4096 rows, 4096² weights,
# 0.751 ms in 16-row programs → 0.284 in 4 parts (2–8 parts 0.283–0.286; 128 × 128 tiles in 8
# parts 0.267; torch.compile 0.223); each of 8192 rows' best match over 65536 keys of 256
# dimensions 1.84 → 0.628 ms in 8 parts (1 part 0.731; torch.compile 0.757)
OVER_COLUMNS_ROWS = 64
# Each reduction over the columns keeps a tile-sized state beside the accumulator: in 64 × 256
# tiles three of them (a max, a sum and a min of x·yᵀ) spilled 332 bytes (255 registers;
# ptxas -v on the sm_90a code), 128 columns none (186); two (a kernel regression's) fit in 248
WIDE_COLUMN_STATES = 2
COLUMN_PROGRAMS_PER_SM = 8
MIN_COLUMN_BLOCKS = 4


def splittable(plan: ContractionPlan) -> bool:
    """Whether a launch can be split into parts: the columns where reductions over them follow
    (each part's states are combined after), else the contracted axis of sums on the tensor
    cores alone (pairwise reductions finish inside one program)."""
    return bool(plan.over_columns) or bool(plan.products) and not plan.pairwise


def default_splits(plan: ContractionPlan, knobs: ContractionKnobs, sizes: dict) -> int:
    """Parts of the columns of tensor-core sums reduced over them: about
    :data:`COLUMN_PROGRAMS_PER_SM` programs an SM, each part :data:`MIN_COLUMN_BLOCKS` column
    blocks at least (pairwise reductions over the columns narrow their rows instead:
    :func:`_rows_a_program`). Parts of the contracted axis elsewhere: 1 where the tiles
    (and batch indices) give half the SMs a program or more; else about a program per SM, each
    part :data:`MIN_PART_BLOCKS` blocks deep at least. On the H200 (``python -m
    benchmarks.contraction --splits``) this picked the fastest of 1–32 parts each time: a Gram
    matrix of 1024 columns over 65536 rows (32 tiles) 0.593 ms unsplit → 0.198 in 4 parts
    (cuBLAS 0.189), 8 and 16 rows of a weight gradient over 16384 tokens (16 tiles) 0.147 →
    0.050 in 8 (cuBLAS 0.046); a 4096² gradient over 2048 tokens (512 tiles) is not split, and
    2 parts took it from 0.103 to 0.188 ms."""
    if not splittable(plan) or plan.over_columns and not plan.products:
        return 1
    tiles, batch = grid_of(plan, knobs, sizes)   # the launch's programs unsplit
    programs = int(tiles) * int(batch)
    if plan.over_columns:
        column_blocks = -(-int(plan.extent(plan.cols, sizes)) // knobs.block_n)
        return max(1, min(round(COLUMN_PROGRAMS_PER_SM * SMS / programs),
                          column_blocks // MIN_COLUMN_BLOCKS, MAX_SPLITS))
    if 2 * programs > SMS:
        return 1
    blocks = -(-contracted_depth(plan, sizes) // knobs.block_k)
    return max(1, min(round(SMS / programs), blocks // MIN_PART_BLOCKS, MAX_SPLITS))


# Pairwise reductions alone: blocks of 4 contracted indices, 2 stages; 128 × 128 pairs a tile on
# 4 warps over a long contracted axis (64 indices or more), 64 × 64 on 2 warps over a short one.
# On the H200 these were the best of 13 tiles, warps, depths and stages for squared and L1
# distances of 4096² and 16384² pairs over 128 dimensions (within 5 % of each other there) and
# over 16 dimensions (where 128 × 128 was 15 % slower); blocks of 8 and 8 warps were 10-40 %
# slower (``python -m benchmarks.contraction --pairs``).
PAIRWISE_TILE = (128, 128, 4, 4, 2)
PAIRWISE_SHORT_TILE = (64, 64, 4, 2, 2)
PAIRWISE_LONG = 64
# A program sweeping a row block's columns (a reduction over them) takes 16 × 256 pairs a block
# over a short contracted axis and 32 × 128 over a long one, 4 warps: for a Gaussian kernel's sum
# over 16384² and 4096² points the best of 6 row blocks in 3 dimensions (the next 1.3× and 1.5×
# slower) and within 2 % of the best (64 × 128) in 64, where 16 × 256 took 1.3× as long
# (``python -m benchmarks.contraction --pairs``).


def _rows_a_program(plan: ContractionPlan, sizes: dict, widest: int) -> int:
    """Rows a program for a plan whose programs each sweep all the columns (reductions over
    them): at most 64 and ``widest``, narrowed (to 16 at least) until there are programs for
    two on each SM."""
    rows = int(plan.extent(plan.rows, sizes))
    batch = 1
    for axis in plan.batch:
        batch *= int(plan.extent(axis, sizes))
    block = min(64, widest)
    while block > 16 and -(-rows // block) * batch < 2 * SMS:
        block //= 2
    return block


def _reread(plan: ContractionPlan, knobs: ContractionKnobs, sizes: dict) -> bool:
    """Whether some computed side would be computed again by several tiles along the other
    side's free axis (then it is staged: one pass over its tensors, and a 16-bit tensor read by
    the tiles; SwiGLU's gate-weight gradient, 32 row blocks over two f32 tensors, ran at 0.4×
    eager computed in the tiles: ``benchmarks.contraction``)."""
    if plan.staging is None:
        return False
    rows, cols = (plan.extent(a, sizes) for a in (plan.rows, plan.cols))
    tiles = {"rows": -(-cols // knobs.block_n), "cols": -(-rows // knobs.block_m)}
    return any(tiles[s.side] > 1 for s in plan.staging.staged)


def shared_room(target: TargetSpec) -> int:
    """Shared memory the operands' stages may take: the GPU's, less 8 KiB for what Triton keeps
    besides (the epilogue's layout conversions)."""
    return target.max_shared_memory - 8 * 1024


def contraction_choices(plan: ContractionPlan, sizes: dict, target: TargetSpec) -> dict:
    """The values tuning tries for each knob: tiles of 64 to 256 (no wider than the rows and
    columns there are, the defaults always among them), depths of 32 and 64, 4 or 8 warps, 2 to
    4 stages, groups of 4, 8 or 16 row blocks, computed sides staged or not."""
    defaults = default_contraction_knobs(plan, sizes, target)

    def upto(extent, values, default):
        cap = _pow2_at_least(int(extent), 16)
        return tuple(sorted({v for v in values if v <= cap} | {default}))

    rows, cols = (plan.extent(a, sizes) for a in (plan.rows, plan.cols))
    if not plan.products:   # pairwise reductions: narrower tiles and blocks (PAIRWISE_TILE)
        return {"block_m": upto(rows, (32, 64, 128), defaults.block_m),
                "block_n": upto(cols, (32, 64, 128), defaults.block_n),
                "block_k": (2, 4, 8), "num_warps": (2, 4, 8), "num_stages": (1, 2, 3),
                "group_m": (4, 8, 16), "stage_sides": (0,)}
    splits = (defaults.splits,) if defaults.splits == 1 else \
        tuple(sorted({max(2, defaults.splits // 2), defaults.splits,
                      min(MAX_SPLITS * 2, defaults.splits * 2)}))
    return {"block_m": upto(rows, (64, 128, 256), defaults.block_m),
            "block_n": upto(cols, (64, 128, 256), defaults.block_n),
            "block_k": tuple(sorted({32, 64, defaults.block_k})),
            "num_warps": tuple(sorted({4, 8, defaults.num_warps})),
            "num_stages": tuple(sorted({2, 3, 4, defaults.num_stages})),
            "group_m": (4, 8, 16),
            "stage_sides": (0, 1) if plan.staging is not None else (0,),
            "splits": splits}


def check_contraction(plan: ContractionPlan, knobs: ContractionKnobs, target: TargetSpec) -> None:
    """A :class:`TargetError` where ``knobs`` cannot run on ``target``."""
    for name in ("block_m", "block_n", "block_k"):
        value = getattr(knobs, name)
        if value < 1 or value & (value - 1):
            raise TargetError(f"{name}={value}: tiles are powers of two")
        if value < 16 and (plan.products or name != "block_k"):
            raise TargetError(f"{name}={value}: tiles are at least 16 "
                              "(tl.dot's smallest; the pairs' rows and columns too)")
    if not plan.products and knobs.block_k > 16:
        raise TargetError(f"block_k={knobs.block_k}: pairwise reductions take blocks of at "
                          "most 16 indices (each index of a block is unrolled)")
    if not 1 <= knobs.splits <= 64:
        raise TargetError(f"splits={knobs.splits}: the contracted axis splits into 1 to 64 parts")
    if knobs.splits > 1 and not splittable(plan):
        raise TargetError(f"splits={knobs.splits}: only sums on the tensor cores split along the "
                          "contracted axis (pairwise reductions finish in one program), and the "
                          "columns where reductions over them follow")
    if knobs.stage_sides not in (0, 1):
        raise TargetError(f"stage_sides={knobs.stage_sides}: 0 or 1")
    if knobs.stage_sides and plan.staging is None:
        raise TargetError("stage_sides=1: every side of this plan is a load; none to stage")
    room = shared_room(target)
    if shared_bytes(plan, knobs) > room:
        raise TargetError(f"{knobs} needs {shared_bytes(plan, knobs)} bytes of shared memory; "
                          f"{target.name} has {room}")


def left_to_row_tiles(plan: ContractionPlan, sizes: dict) -> bool:
    """Whether ``tf.compile`` leaves ``plan`` at ``sizes`` to the row-tile template: a softmax
    normaliser over the columns of tensor-core sums whose contracted depth the row tile holds
    (up to :data:`MAX_FEATURE`; its rolling update fuses the same pass there, as measured), not
    over pairwise values (no other template fuses those)."""
    return any(r.of for r in plan.over_columns) and bool(plan.products) and \
        contracted_depth(plan, sizes) <= MAX_FEATURE


def triton_contraction(kernel, target: TargetSpec, tuned=None, dynamic: "bool | None" = None,
                       routed: bool = False, **given):
    """A callable GEMM-tile kernel for ``kernel`` on ``target`` (a GPU), with knobs
    :class:`ContractionKnobs` fields given here fixed (the rest the defaults at each call's
    sizes, or where ``tuned`` — the compile entry point's lookup of tuning records — has a
    record for them, its knobs); ``dynamic``: when sizes become kernel arguments, as
    ``tf.compile`` says; a :class:`ScheduleError` where the program is not a contraction.
    ``routed``: ``tf.compile``'s choice, which leaves a softmax normaliser over the columns of
    tensor-core sums (:func:`.contraction_plan.normaliser_of`) to the row-tile template up to the
    features that template holds (its rolling update fuses the same pass there, as it has been
    measured to); over pairwise values no other template fuses it."""
    from ..targets.triton.contraction_kernel import ContractionKernel

    if not target.is_gpu:
        raise ScheduleError(f"the contraction template generates Triton GPU kernels; the target "
                            f"is {target.name}")
    unknown = set(given) - set(ContractionKnobs.__dataclass_fields__)
    if unknown:
        raise ScheduleError(f"the contraction template has no knob {', '.join(sorted(unknown))}; "
                            f"its knobs: {', '.join(ContractionKnobs.__dataclass_fields__)}")
    program = kernel.program if hasattr(kernel, "program") else kernel
    plan = plan_contraction(program)

    def knobs_at(sizes: dict) -> tuple[ContractionKnobs, str | None]:
        """The knobs at ``sizes`` and, where a tuning record gave them, where it is from."""
        if routed and left_to_row_tiles(plan, sizes):
            raise TargetError(f"the row-tile template takes a softmax normaliser over these "
                              f"columns in one pass up to {MAX_FEATURE} features; this one sums "
                              f"{contracted_depth(plan, sizes)}")
        defaults = replace(default_contraction_knobs(plan, sizes, target,
                                                     given.get("stage_sides")), **given)
        if given and "stage_sides" not in given:   # decided again on the tiles given
            defaults = replace(defaults, stage_sides=int(_reread(plan, defaults, sizes)))
        found = tuned(sizes) if tuned is not None and not given else None
        if found is not None:
            knobs = replace(defaults, **found[0])
            try:   # a record of other sizes of the bucket may not run these
                check_contraction(plan, knobs, target)
                return knobs, f"contraction tuned record ({found[1]})"
            except TargetError:
                pass
        check_contraction(plan, defaults, target)
        return defaults, None

    return ContractionKernel(plan, target, knobs_at, given, dynamic)

