"""The attention template: a rolled attention chain as one Triton kernel per (row tile, batch).

Query rows are tiled by ``tile_m``, keys swept ``tile_n`` at a time; q·kᵀ and p·v run on tensor
cores (wgmma on Hopper), the running maximum, sum and weighted sum stay in registers, masked blocks
are skipped and fully visible ones skip the mask (block lists from the DSL mask). Any chain the
rolling update accepts and whose shape fits (see ``targets.triton.rowtile``) can use it: all the
library's attention variants do.
"""
from __future__ import annotations

import math

from ..algebra import plan_chain
from ..algebra.exprs import nodes
from ..dsl import dtypes as dt
from ..dsl.expr import Load, is_gathered
from ..targets import TargetSpec
from ..targets.triton.kernel import TritonKernel, Tuned
from .fusion import Fusion
from .tile_plan import Knobs, RowTilePlan, TilePlanner
from .token_tiling import mask_reads_map


SMS = 132  # H100 SXM; enough parallel programs for any current GPU


def default_knobs(plan: RowTilePlan, target: TargetSpec) -> Knobs:
    """Tiles that fit one SM (128×128 with 8 warps for head dims up to 128 on Hopper, measured
    best on 2026-11-22); few query rows (decode) get the split update over the keys
    (:func:`decode_knobs`)."""
    if is_decode(plan):
        return decode_knobs(plan, target)
    if plan.feature_chunk is not None:
        return chunked_knobs(plan)
    if float32_products(plan):
        return F32_KNOBS
    if plan.feature_extent > 128:
        # q·k and p·v over different head dims (one block as wide as the wider): 128×64 tiles,
        # 8 warps, where their shared memory fits — on the H200 at 192/128, B2 H16 S4096 causal:
        # 0.806 → 0.615 ms (``benchmarks.user_kernels``); one head dim over 128 keeps 64×32
        wide = Knobs(block_m=128, block_n=64, num_warps=8, num_stages=2)
        if plan.two_feature_sizes and target.kind == "cuda" and \
                shared_bytes(plan, wide) <= target.max_shared_memory:
            return wide
        return Knobs(block_m=64, block_n=32, num_warps=4, num_stages=2)
    if target.kind == "cuda" and mask_reads_map(plan.map_mask, (plan.row, plan.col)):
        # a mask over a 2-D/3-D map: its index arithmetic beside a 128×128 score tile spills
        # (ptxas, sm_90a, D=128: 288–624 bytes), and smaller patches and windows waste fewer
        # keys at a neighbourhood's edges: tuning chose 64×64 (or ×32) with 4 warps and 3
        # stages for every case it was run on (H100, 2026-11-24: 1.3–1.6× over 128×64, 8 warps)
        return Knobs(block_m=64, block_n=64, num_warps=4, num_stages=3)
    if target.kind == "rocm":
        return Knobs(block_m=128, block_n=64, num_warps=4, num_stages=1)
    if target.kind != "cuda":
        return PREFILL_KNOBS[0]
    # a score reading a tensor by query and key (a bias [H, S, S]) pipelines its tiles too: three
    # stages of them do not fit an SM at D=128; nor do those of two scores' queries and keys
    # beside the values (differential attention's), two stages of 128 keys neither
    return next((k for k in PREFILL_KNOBS if shared_bytes(plan, k) <= target.max_shared_memory),
                PREFILL_KNOBS[-1])


# the prefill tiles, the first that fits shared memory (:func:`shared_bytes`) taken
PREFILL_KNOBS = (Knobs(block_m=128, block_n=128, num_warps=8, num_stages=3),
                 Knobs(block_m=128, block_n=128, num_warps=8, num_stages=2),
                 Knobs(block_m=128, block_n=64, num_warps=8, num_stages=3),
                 Knobs(block_m=128, block_n=64, num_warps=8, num_stages=2),
                 Knobs(block_m=64, block_n=64, num_warps=4, num_stages=2))


# features past one block, in chunks (.feature_chunks): a 64-row tile's value accumulator is 128
# f32 registers a thread at 512 features with 8 warps, and 32-key slots of keys and values (70
# KiB at 576 / 512) beside the query tile (74 KiB) fit two stages in an SM's shared memory
CHUNKED_KNOBS = Knobs(block_m=64, block_n=32, num_warps=8, num_stages=2)
# ... and in float32 half the rows and keys: 64 registers a thread of accumulator, 208 KiB of
# tiles at 576 / 512 (:func:`chunked_shared_bytes`)
CHUNKED_F32_KNOBS = Knobs(block_m=32, block_n=16, num_warps=8, num_stages=2)


def chunked_knobs(plan: RowTilePlan) -> Knobs:
    """The tiles of a plan whose features are in chunks, by the products' type."""
    return CHUNKED_F32_KNOBS if float32_products(plan) else CHUNKED_KNOBS


# float32 operands multiply at float32's accuracy (``dot_precision``: three TF32 products of their
# halves): small tiles — 128×128 with 8 warps and 3 stages took 28 s to compile at D=64 with
# IEEE products on the FMA units (Triton 3.6, sm_90a) and did not fit shared memory at D=128
F32_KNOBS = Knobs(block_m=64, block_n=32, num_warps=4, num_stages=2)


def float32_products(plan: RowTilePlan) -> bool:
    """Whether a contraction of the chain multiplies float32 operands."""
    return any(c.dot_dtype == "f32" for c in plan.locals.values()) or \
        any(sp.contraction.dot_dtype == "f32" for sp in plan.states if sp.contraction)


# rows per (batch, head group) up to which a chain is a decode: the keys are split over programs
DECODE_ROWS = 64


def is_decode(plan: RowTilePlan) -> bool:
    """Whether the keys are split over programs: few rows (a query token, a GQA group), or up to
    twice as many without a mask where even 64-row tiles leave SMs idle (128 query heads on one
    MQA cache)."""
    if plan.rows <= DECODE_ROWS:
        return True
    return plan.rows <= 2 * DECODE_ROWS and plan.mask is None and \
        plan.grid_batch_size * math.ceil(plan.rows / DECODE_ROWS) < SMS


def decode_knobs(plan: RowTilePlan, target: TargetSpec) -> Knobs:
    """The split update for few query rows: one row tile holds every row that shares the keys
    (``tl.dot`` needs at least 16; the heads of an MQA cache or a GQA group: the keys are read
    once per tile), the keys split into parts for about one program per SM — two where the keys
    are gathered (a page table), whose loads need more in flight — each part of at least two
    key blocks, and not split once the row tiles alone give a program per SM; 128-key blocks
    (64 for gathered keys once there are more (batch × head-group) rows than half the SMs),
    4 warps and a 3-stage pipeline.
    Measured on the H200 (``benchmarks.decode_knobs --only grid``, bf16, 4k keys): unsplit
    128-key blocks at 128–512 (batch, kv-head) pairs took 0.064, 0.122 and 0.241 ms (B4 and B8
    32/32, B64 32/8; SDPA cuDNN 0.064, 0.125, 0.242), where two parts of 64-key blocks took
    0.067, 0.145 and 0.269 and unsplit 64-key blocks 0.068, 0.125 and 0.278.
    Measured on the H200 (2026-11-29, GPU time, ``benchmarks.decode_knobs``): MQA 64 heads on one
    cache, B16 N16k, 0.102 → 0.051 ms (16-row tiles, 8 warps, 8 parts: four tiles read every
    key); GQA 32/8 without a query axis, B8 N32k, 0.244 either way (SDPA cuDNN 0.244); the same
    over pages of 64 keys, 0.322 → 0.250 ms (2 → 4 parts, 8 → 4 warps). Before, on the H100
    (2026-11-24, 4k keys; ``benchmarks.decode_sweep``): B=1 32/8 heads 11.3 us with 16 parts of
    128 (64 parts of 64 keys: 34.8)."""
    chunked = chunked_knobs(plan)
    block_m = min(chunked.block_m if plan.feature_chunk is not None else DECODE_ROWS,
                  max(16, 1 << max(0, plan.rows - 1).bit_length()))
    batch = plan.grid_batch_size
    programs = batch * math.ceil(plan.rows / block_m)
    gathered = gathers_columns(plan)
    block_n = chunked.block_n if plan.feature_chunk is not None else \
        F32_KNOBS.block_n if float32_products(plan) else \
        64 if gathered and 2 * batch > SMS else 128
    blocks = math.ceil(plan.cols / block_n)
    per_sm = 2 if gathered or narrow_keys(plan) else 1
    splits = max(1, min(round(per_sm * SMS / programs), blocks // 2, 64))
    warps, stages = (4, 3) if target.kind == "cuda" else (4, 2)   # ROCm: not measured
    if plan.feature_chunk is not None:
        warps, stages = chunked.num_warps, chunked.num_stages
    return Knobs(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages,
                 splits=splits)


def narrow_keys(plan: RowTilePlan) -> bool:
    """Whether the products read a key or value tensor of 1-byte elements (an int8 cache): its
    blocks carry half a bf16 block's bytes, so twice the parts keep as many in flight — GQA 32/8
    decode over an int8 cache with a scale per key, B8 N16k, 0.122 → 0.106 ms on the H200 (2 → 4
    parts; 8 parts 0.111, 8 warps slower: ``benchmarks.variant_kernels``' kernel through
    :func:`attention`'s knobs; the default is the suite's row)."""
    return any(isinstance(n, Load) and dt.to_numpy(n.param.dtype).itemsize == 1
               for side in plan.column_sides for n in nodes(side))


def gathers_columns(plan: RowTilePlan) -> bool:
    """Whether the column operands (keys, values) are read through an index tensor."""
    return any(isinstance(n, Load) and any(is_gathered(i) for i in n.indices)
               for side in plan.column_sides for n in nodes(side))


def knob_choices(plan: RowTilePlan, target: TargetSpec) -> dict[str, tuple[int, ...]]:
    """The values tuning tries for each knob (the defaults among them)."""
    default = default_knobs(plan, target)
    if plan.feature_chunk is not None:   # the accumulators of 512 features and 32-key slots
        return {"block_m": tuple(sorted({16, 32, default.block_m})), "block_n": (16, 32),
                "num_warps": (4, 8), "num_stages": (1, 2),
                "splits": tuple(sorted({1, default.splits, default.splits * 2}))}
    if is_decode(plan):
        splits = sorted({default.splits, max(1, default.splits // 2), min(128, default.splits * 2)})
        return {"block_m": tuple(sorted({16, default.block_m})), "block_n": (32, 64, 128),
                "num_warps": (2, 4, 8),
                "num_stages": (1, 2, 3, 4), "splits": tuple(splits)}
    wide = plan.feature_extent > 128
    return {"block_m": (32, 64) if wide else (64, 128), "block_n": (16, 32, 64) if wide else
            (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2, 3, 4), "splits": (1,)}


def shared_bytes(plan: RowTilePlan, knobs: Knobs) -> int:
    """Shared memory Triton's pipeline gives a prefill kernel: the key and value tiles (one slot
    per stage) and the query tile — Triton 3.6's ``metadata.shared`` on sm_90a exactly, for head
    dims 64 and 128 over this template's whole tuning space with 2–4 stages (2026-11-24); an upper
    bound with 1 — each tensor the products read once: two scores' queries and keys and one
    value tensor (differential attention's) took 360448 bytes at 128 × 128, 3 stages, D=64, 128
    (sm_90a). Operands computed from several tensors count each, which over-counts: rotary
    tables applied to q and k in the scores gave 327680 at 128 × 32, 2 stages, where Triton took
    229376 — the defaults are then smaller than need be, and tuning leaves such tiles out. The
    split (decode) kernels keep one slot fewer and use at least :func:`decode_shared_floor`."""
    width, size = plan.feature_width, _element_size(plan)
    rows, columns = _product_operands(plan)
    return knobs.num_stages * knobs.block_n * columns * width * size + \
        rows * knobs.block_m * width * size + \
        max(0, knobs.num_stages - 1) * knobs.block_m * knobs.block_n * _score_tile_bytes(plan)


def _product_operands(plan: RowTilePlan) -> tuple[int, int]:
    """The tensors the tensor-core products read along the rows (queries) and along the swept
    axis (keys, values), each counted once (a value tensor two products read is one tile)."""
    def tensors(sides) -> int:
        return len({n.param.name for side in sides for n in nodes(side) if isinstance(n, Load)})
    return max(1, tensors(c.left for c in plan.locals.values())), \
        max(2, tensors(plan.column_sides))


def _score_tile_bytes(plan: RowTilePlan) -> int:
    """Bytes an element of the tensors the score reads by query and key together (a bias
    ``[H, S, S]``): Triton pipelines each as a block_m × block_n tile in ``stages - 1`` slots
    (Triton 3.6, sm_90a, D=128, 128 × 128, 3 stages: 294912 bytes, 65536 over the key, value and
    query tiles)."""
    both = {plan.row.uid, plan.col.uid}
    seen, total = set(), 0
    for body in (b for m in plan.chain.members for b in plan.chain.bodies[m.name]):
        for n in nodes(body):
            if isinstance(n, Load) and both <= {a.uid for a in n.axes} and \
                    n.param.name not in seen:
                seen.add(n.param.name)
                total += _stored_bytes(n.param.dtype)
    return total


def decode_shared_floor(plan: RowTilePlan, knobs: Knobs) -> int:
    """A lower bound of a split (decode) kernel's shared memory: ``stages - 1`` key and value
    slots (Triton 3.6, sm_90a: 196608 of 204800 bytes at 128 keys, 4 stages, D=128)."""
    return (knobs.num_stages - 1) * knobs.block_n * _product_operands(plan)[1] * \
        plan.feature_width * _element_size(plan)


def chunked_refusal(plan: RowTilePlan, knobs: Knobs, target: TargetSpec) -> str | None:
    """Why the defaults of a plan whose features are in chunks leave it to the floor's stages
    (tiles the target's shared memory cannot hold, :func:`unfit`; keys split over parts,
    :func:`chunked_split_refusal`), or None — also None for features in one block."""
    if plan.feature_chunk is None:
        return None
    return unfit(plan, knobs, target) or chunked_split_refusal(plan, knobs)


def chunked_split_refusal(plan: RowTilePlan, knobs: Knobs) -> str | None:
    """Why features in chunks with the keys split over parts (a decode: DeepSeek's latent
    attention) do not run as one kernel by default, or None. Every program holds a query tile of
    every chunk and one slot of keys and values a stage (one program an SM), and its products
    and softmax wait on one another block after block: on the H100, B8 with 128 heads over a
    latent cache of 4096 keys took 82.5 µs (16384: 245.5) where the floor's stages — the scores
    through the Hopper GEMM, stored, then the softmax and p·v — took 69.6 (216.9) and
    torch.compile 53.2 (190.4) (``benchmarks.unlisted_kernels --only latent_attention_decode``:
    its row "tensorfuse one kernel"; the best of seven tile and part settings 79.2). A tuned
    record keeps the one kernel where it measured faster."""
    if knobs.splits == 1:
        return None
    return (f"features in chunks with the keys split over {knobs.splits} parts (a decode): the "
            "floor's stages measured faster than one kernel")


def chunked_shared_bytes(plan: RowTilePlan, knobs: Knobs) -> int:
    """Shared memory of a kernel whose features are in chunks (:mod:`.feature_chunks`), split
    or not: the query tile's chunks (every block's products read them there) and a slot of keys
    and values a stage, each tile as wide as its own feature's chunks — Triton 3.6's on sm_90a
    exactly with 2 stages (212992 bytes at 576 / 512, 64 rows, 32 keys; 143360 at 16 keys), over
    with 1 (counted 143360, took 106496)."""
    def width(axis) -> int:
        return plan.feature_chunks(axis) * plan.feature_block
    features = [plan.program.compute(name).over[0] for name in plan.locals]
    rows = sum(width(a) for a in features)
    columns = sum(width(a) for a in features) + sum(
        width(plan.state_feature(sp)) for sp in plan.states if sp.contraction is not None)
    products = list(plan.locals.values()) + [sp.contraction for sp in plan.states
                                             if sp.contraction is not None]
    size = max(dt.to_numpy(c.dot_dtype).itemsize for c in products)   # as the products read
    return (knobs.block_m * rows + max(1, knobs.num_stages) * knobs.block_n * columns) * size


def _element_size(plan: RowTilePlan) -> int:
    return max(4 if p.dtype == "f32" else 2 for p in plan.program.tensor_params
               if p.dtype.startswith(("f", "bf")))


def _stored_bytes(dtype: str) -> int:
    """Bytes of a score tile's element as the bound counts it: its own, two at least (a 1-byte
    mask as a 16-bit one: the bound was measured with those); never fewer, which would let a
    tile of 32- or 64-bit elements past the shared memory it needs."""
    return max(2, dt.to_numpy(dtype).itemsize)


def unfit(plan: RowTilePlan, knobs: Knobs, target: TargetSpec) -> str | None:
    """Why ``knobs`` cannot run on ``target`` (tuning leaves such candidates out), or None. Only
    settings certain not to fit are refused: decode's by a lower bound of what they need."""
    need = chunked_shared_bytes(plan, knobs) if plan.feature_chunk is not None else \
        shared_bytes(plan, knobs) if knobs.splits == 1 else decode_shared_floor(plan, knobs)
    if target.kind == "cuda" and need > target.max_shared_memory:
        return (f"needs {need} bytes of shared memory; {target.name} has "
                f"{target.max_shared_memory}")
    return None


def attention(kernel, fusion: Fusion, target: TargetSpec, tile_m: int | None = None,
              tile_n: int | None = None, num_warps: int | None = None,
              num_stages: int | None = None, splits: int | None = None,
              tiling: "dict | bool" = True, tuned: Tuned | None = None,
              dynamic: "bool | None" = False) -> TritonKernel:
    """A callable Triton kernel for ``kernel`` with ``fusion`` (a rolling update) applied;
    ``splits`` > 1 sweeps the keys in that many parallel parts merged at the end (decode).
    ``tiling``: the visiting order of a mask that reads the sequence as a map — ``True``
    chooses (patches of queries, windows of keys, or the flat order: ``token_tiling``),
    ``False`` keeps the flat order, a dict (``Schedule.tile_as``) fixes ``patch``,
    ``key_patch``, ``dilation``. ``tuned``: the compile entry point's lookup of tuning records
    (used unless knobs are given). ``dynamic``: which sizes the kernel reads as arguments
    (:mod:`~tensorfuse.targets.triton.size_builds`)."""
    program = kernel.program if hasattr(kernel, "program") else kernel
    chain = plan_chain(program, fusion.names, fusion.axis)

    def knobs(plan: RowTilePlan) -> Knobs:
        k = default_knobs(plan, target)
        return Knobs(tile_m or k.block_m, tile_n or k.block_n, num_warps or k.num_warps,
                     num_stages if num_stages is not None else k.num_stages, splits or k.splits)

    def refuse(plan: RowTilePlan, k: Knobs) -> str | None:
        """Features in chunks whose tiles the target's shared memory cannot hold (an A100's
        163 KiB at 576 / 512), or whose keys the defaults split over parts: the floor's stages
        run those sizes."""
        return chunked_refusal(plan, k, target)

    explicit = any(v is not None for v in (tile_m, tile_n, num_warps, num_stages, splits))
    return TritonKernel(TilePlanner(program, chain), target, knobs,
                        f"attention template ({fusion.describe()})", fusion,
                        tuned=None if explicit else tuned, tiling=tiling, dynamic=dynamic,
                        refuse=None if explicit else refuse,
                        given=dict(tile_m=tile_m, tile_n=tile_n, num_warps=num_warps,
                                   num_stages=num_stages, splits=splits))
