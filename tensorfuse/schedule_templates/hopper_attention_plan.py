"""The Hopper attention template plan: a rolled softmax-attention chain as a warp-specialised
sm_90a kernel, as data (the CUDA C++: :mod:`tensorfuse.targets.cuda.hopper_attention`).

Each CTA owns ``block_m = 64 · consumers`` query rows of one (batch, head). A producer warp copies
the rows' queries once and then the key and value blocks its row block needs (``block_n`` keys
each) into a ring of ``stages`` slots with TMA bulk-tensor copies; each consumer warpgroup computes
``S = Q·Kᵀ`` for its 64 rows with ``wgmma``, turns it into the score the DSL program writes (score
modification, mask), keeps the running maximum and sum, and accumulates ``O += P·V`` with ``P``
from registers. With ``overlap`` a warpgroup issues the next block's ``Q·Kᵀ`` before the softmax
of the current one (FlashAttention-3's intra-warpgroup pipeline), so the tensor cores and the
exponentials work at the same time.

The plan is the recognised chain (:mod:`.attention_chain`) split into what the kernel does
differently: the *mask* (the condition of a top-level ``where(cond, s, -inf)``, sorted per call
into skipped, partial and full blocks by :mod:`.block_schedule`, so that whole blocks skip its
arithmetic and empty ones are never loaded), the *score* without it, and a *scale* folded into the
exponential where the score is the dot product times a value that is the same for every element.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..algebra.exprs import nodes
from ..dsl.expr import Const, DimSize, Expr, Load, Scalar, Where
from ..dsl.printer import to_text
from ..dsl.program import Program
from ..errors import ScheduleError
from ..targets.cuda.expr import to_cuda
from ..targets.cuda.parts.scheduler import MIN_PIECE
from ..targets.cuda.wgmma import fragment_bit_words, launch_registers, setmaxnreg_share
from .attention_chain import AttentionChain, check_head_map, recognise_attention
from .hopper_block_costs import length_bucket, wide_costs_less
from .score_factors import dot_factor, key_linear_score, reads_dot, separated_score
from .score_tiles import (ScoreTile, find_key_strip, find_score_tile, strip_bytes,
                          tile_bytes)
from .token_tiling import map_scalars, mask_reads_map

WHO = "hopper attention"
KNOBS = ("block_n", "stages", "consumers", "overlap", "pingpong", "schedule", "ctas",
         "ctas_per_sm")
SCHEDULES = ("auto", "grid", "dynamic", "snake", "split")
PRODUCER_REGISTERS = 24      # the producer warpgroup keeps the fewest setmaxnreg allows


@dataclass(frozen=True)
class HopperKnobs:
    """``consumers`` warpgroups of 64 query rows each; keys in blocks of ``block_n`` through a ring
    of ``stages`` shared-memory slots; ``overlap``: issue the next block's q·kᵀ before this
    block's softmax; ``schedule``: how CTAs take (row block, head) tiles — ``"grid"`` (one CTA
    per tile), ``"dynamic"`` (persistent CTAs claiming tiles from a counter), ``"snake"``
    (persistent CTAs in alternating rounds), ``"split"`` (``"dynamic"`` with the tiles of the last
    partial round cut along the keys into pieces for every CTA, merged by the last piece to
    finish; plans without a mask) or ``"auto"`` (:func:`schedule_for`); ``ctas``: how
    many persistent CTAs (0: ``ctas_per_sm`` per SM). The last two are launch arguments:
    every schedule runs the same cubin. ``ctas_per_sm``: CTAs resident on an SM at once (1 or 2;
    2 halves each CTA's registers and needs its shared memory twice over): where tiles are short
    (a few key blocks each) one CTA's fixed costs per tile — the queries' copy, the pipeline's
    fill, the output — run beside the other's blocks."""

    block_n: int = 128
    stages: int = 2
    consumers: int = 2
    overlap: bool = True
    pingpong: bool = True
    schedule: str = "auto"
    ctas: int = 0
    ctas_per_sm: int = 1

    @property
    def block_m(self) -> int:
        return 64 * self.consumers

    @property
    def producer_registers(self) -> int:
        return PRODUCER_REGISTERS

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def consumer_registers(self) -> int:
        """Registers per consumer thread after ``setmaxnreg`` (the producer keeps
        ``PRODUCER_REGISTERS``)."""
        return setmaxnreg_share(self.threads, self.consumers, PRODUCER_REGISTERS,
                                self.ctas_per_sm)

    @property
    def launch_registers(self) -> int:
        """Registers per thread the CTA is launched with (ptxas's limit for ``THREADS`` threads
        and ``ctas_per_sm`` CTAs per SM, in steps of 8): ``setmaxnreg`` only moves registers
        between the warpgroups of this pool — a consumer asking for more than the producer gave
        back waits forever (384 × 168: the producer at 24 leaves exactly 240 to two
        consumers)."""
        return launch_registers(self.threads, self.ctas_per_sm)

    def __str__(self) -> str:
        return (f"block_m={self.block_m}, block_n={self.block_n}, stages={self.stages}, "
                f"consumers={self.consumers}, overlap={self.overlap}, pingpong={self.pingpong}, "
                f"schedule={self.schedule}" + (f", ctas={self.ctas}" if self.ctas else "")
                + (f", ctas_per_sm={self.ctas_per_sm}" if self.ctas_per_sm != 1 else ""))


@dataclass(frozen=True)
class HopperAttentionPlan:
    """The chain, the score without its mask, the mask, and the scale folded into ``exp2``."""

    chain: AttentionChain
    score: Expr               # of the dot product and the axes; no top-level mask
    mask: Expr | None         # a condition on indices (and integer tensors): blocks are sorted
    scale: Expr | None        # score == dot · scale (+ key_bias · j) with scale the same everywhere
    tensors: tuple[tuple[str, str], ...]  # (name, dtype) of tensors the score or mask read
    # sizes the score or mask reads besides the chain's (a bias table's length): kernel arguments
    extra_sizes: tuple[str, ...] = ()
    # score == dot · scale + key_bias · j (+ terms free of the key j, dropped: each row's scores
    # shift by the same amount, which softmax does not see): an additive bias linear in the key
    # index, such as ALiBi's, evaluated one FFMA an element and the scale folded into exp2
    key_bias: Expr | None = None
    # the emitter's parts by role (``targets/cuda/parts``): the load policy, pipeline, mainloop,
    # row state, epilogue and tile scheduler this kernel is assembled from
    parts: tuple[tuple[str, str], ...] = (
        ("scheduler", "attention_tiles"), ("load", "tma_boxes"),
        ("pipeline", "warp_specialized_ring"), ("mainloop", "wgmma_qk_then_pv"),
        ("row_state", "online_softmax_base2"), ("epilogue", "deferred_register_store"))
    # a tensor the score reads by query and key (a bias [H, S, S]), copied as score tiles
    score_tile: ScoreTile | None = None   # with each key block's values (:mod:`.score_tiles`)
    key_strip: ScoreTile | None = None    # one it reads by key alone, copied as key strips
    wide: frozenset = frozenset()   # tensors read at 64-bit offsets at the call's sizes
    # k stored with the keys innermost and the head dim outside them (``[B, H, D, N]``, a cache
    # kept transposed): its tiles are the MN-major B operand of q·kᵀ, in boxes of 64 keys
    keys_innermost: bool = False

    @property
    def dtype(self) -> str:
        return self.chain.dtype

    def strip_bytes(self, knobs) -> int:
        """Bytes a slot's key strip takes with these knobs (0: none)."""
        strip = self.key_strip
        return 0 if strip is None else strip_bytes(knobs.block_n, strip.dtype)

    @property
    def arguments(self) -> tuple[tuple[str, str], ...]:
        """(name, dtype) of the tensors besides q, k, v and the outputs: the score's and the
        mask's, then the sinks (the epilogue's)."""
        return self.tensors + ((self.chain.sink[:2],) if self.chain.sink else ())

    @property
    def strided(self) -> bool:
        """Whether q, k, v and the output are addressed by their own strides (a layout other
        than the library's ``[b, h, tokens, d]``: the load and epilogue parts say so)."""
        return ("load", "tma_strided_boxes") in self.parts

    @property
    def lists_shared(self) -> bool:
        """Whether every batch position and head has the same block lists: the mask reads the
        query and key positions alone (causal, a window, a prefix — sizes and scalars besides),
        so the lists are made for one and read by all (the kernel's tile indexes them by its
        row block alone: ``parts/scheduler.py``): a new prompt length then sorts B·H times
        fewer blocks on the host."""
        if self.mask is None or self.tensors:
            return False
        return {a.uid for a in self.mask.axes} <= {a.uid for a in self.chain.axes[2:]}

    @property
    def reads_map(self) -> bool:
        """Whether the mask reads the queries or keys as a 2-D/3-D map: the kernel may visit it
        in patches (:mod:`.hopper_tiling`)."""
        return mask_reads_map(self.mask, self.chain.axes[2:])

    @property
    def map_scalars(self) -> tuple[str, ...]:
        """The scalars a visiting order in patches depends on (``token_tiling.map_scalars``)."""
        return map_scalars(self.mask, self.chain.axes[2:])

    def describe(self, knobs: HopperKnobs | None = None) -> str:
        c = self.chain
        b, h, hkv, m, n, d = c.dims
        lines = [f"hopper attention plan: {c.out}[{b}, {h}, {m}, {c.dv}] from {c.q}, {c.k}, {c.v} "
                 f"({hkv} kv-heads, {c.dtype}"
                 + (f"; q·k over {d}, p·v over {c.dv}" if c.value_dim else "")
                 + (f"; the output {c.out_dtype}" if c.out_dtype else "") + ")",
                 *(["  layouts by role (b batch, h head, i queries, j keys, d head dim): "
                    + ", ".join(f"{t} {lay}" for t, lay in
                                zip((c.q, c.k, c.v, c.out, c.lse), c.layouts))
                    + "; each read through a 4-D tensor map of its strides"
                    + (f"; {c.k}'s keys innermost: boxes of 64 keys, the MN-major operand of "
                       "q·kᵀ" if self.keys_innermost else "")]
                   if self.strided else []),
                 f"  score: {to_text(self.score)}"
                 + (f" (the factor {to_text(self.scale)} folded into exp2)"
                    if self.scale is not None else "")
                 + (f"; as dot · {to_text(self.scale)} + {to_text(self.key_bias)} · "
                    f"{c.axes[3].name}, its terms free of {c.axes[3].name} dropped (softmax does "
                    "not see a row's shift)" if self.key_bias is not None else ""),
                 "  mask: " + (f"{to_text(self.mask)} (blocks sorted per call into skipped, "
                               "partial and full)" if self.mask is not None else "none"),
                 *[f"  {t.describe()}" for t in (self.score_tile, self.key_strip) if t],
                 "  warp-specialised: a TMA producer warp, consumer warpgroups on wgmma "
                 "(q·kᵀ from shared memory, p·v with p in registers)"]
        if knobs is not None:
            lines.append(f"  knobs: {knobs}")
        return "\n".join(lines)


def _refuse(message: str, loc=None) -> ScheduleError:
    return ScheduleError(f"{WHO}: {message}", loc)


def plan_hopper_attention(program: Program, names: tuple[str, ...],
                          axis: str) -> HopperAttentionPlan:
    """Recognise the chain (softmax-weighted attention in bf16 or f16 — the output also float32,
    stored from the float32 accumulators —, with sinks — the epilogue
    adds ``exp(sink - m)`` to each row's sum — and rows a mask empties given 0); split its score."""
    chain = recognise_attention(program, names, axis, WHO, dtypes=("bf16", "f16"),
                                logsumexp=True, value_dims=True, sinks=True, empty_rows=True,
                                float32_output=True)
    score, mask = chain.score, None
    if isinstance(score, Where) and isinstance(score.b, Const) and score.b.value == -math.inf \
            and not reads_dot(score.cond, chain.dot) and not any(
                isinstance(n, Load) and n.param.dtype.startswith(("f", "bf"))
                for n in nodes(score.cond)):
        score, mask = score.a, score.cond
    scale, key_bias = dot_factor(score, chain.dot), None
    if scale is None:
        scale, key_bias = key_linear_score(score, chain)
    if scale is None:   # divided by a row's and a column's factors: by their reciprocals
        separated = separated_score(score, chain.dot, dict(chain.score_axes))
        score = score if separated is None else separated
    used = [score] + ([mask] if mask is not None else [])
    tile = find_score_tile(used, chain)
    tensors = sorted({(n.param.name, n.param.dtype) for e in used for n in nodes(e)
                      if isinstance(n, Load)})
    extra = sorted({d for e in used for n in nodes(e)
                    for d in (n.param.dims if isinstance(n, Load) else
                              (n.name,) if isinstance(n, DimSize) else ())
                    if isinstance(d, str) and d not in chain.dims})
    plan = HopperAttentionPlan(chain, score, mask, scale, tuple(tensors), tuple(extra),
                               key_bias, score_tile=tile)
    if tile is None and not plan.reads_map:   # (a map's key windows are no strips of keys)
        plan = replace(plan, key_strip=find_key_strip(score, chain))
    if tile is not None and plan.reads_map:
        raise _refuse(f"the score reads {tile.name} by query and key and the mask reads the "
                      "sequence as a map: the map's patches and the tiles are not copied "
                      "together; the attention template takes it")
    if chain.permuted:
        keys_innermost = chain.layouts[1].endswith("dj") and not plan.reads_map
        if head_dim_orders(chain.layouts, plan.reads_map):
            raise _refuse("TMA copies rows of the head dim: it must be the innermost axis of q, "
                          "v and the output, and of k or next to its innermost keys (their axes "
                          f"by role: {', '.join(chain.layouts)}); the attention template takes "
                          "other layouts")
        plan = replace(plan, keys_innermost=keys_innermost)
        # each tensor through a 4-D tensor map of its own strides, the output by its strides
        parts = dict(plan.parts)
        parts.update(load="tma_strided_boxes", epilogue="deferred_strided_store")
        plan = replace(plan, parts=tuple(parts.items()))
    for e, what in ((score, "the score"), (mask, "the mask")):   # refused now if not writable
        if e is not None:
            to_cuda(e, {chain.dot: "qk"}, what, axes=dict(chain.score_axes),
                    loads={t: t for t, _ in tensors})
    return plan


def head_dim_orders(layouts: tuple[str, ...], reads_map: bool = False) -> dict[int, tuple]:
    """The tensors of an attention chain (by place in ``layouts``: 0 q, 1 k, 2 v, 3 the output;
    their axes by role, :class:`.attention_chain.AttentionChain`) whose layout the template's
    TMA copies cannot take, each with the order of its axes that puts its head dim innermost:
    the copies move rows of the head dim, so it must be innermost — in k it may instead be next
    to its innermost keys (``[B, H, D, N]``: the MN-major operand of q·kᵀ), but not where the
    mask reads the sequence as a map (its patches are boxes of rows)."""
    found = {}
    for place, layout in enumerate(layouts[:4]):
        if layout[-1] == "d" or place == 1 and layout.endswith("dj") and not reads_map:
            continue
        found[place] = tuple(k for k, role in enumerate(layout) if role != "d") + \
            (layout.index("d"),)
    return found


def shared_bytes(knobs: HopperKnobs, D: int, tiled: bool = False, DV: int | None = None,
                 score_tile: bool = False, strip: int = 0) -> int:
    """Dynamic shared memory: the queries, ``stages`` key and value slots (the values ``DV``
    wide where p·v runs over another head dim than q·k; ``tiled``: and the
    slots of the partial blocks' mask bits, one bit per score; ``score_tile``: and the slots of
    a tensor the score reads by query and key, 16 bits a score, with a full and a free mbarrier
    each; ``strip``: and slots of ``strip`` bytes, a key block's strip, with two mbarriers
    each), the mbarriers (the queries', four per slot, the queries' release, two tile slots'
    full and free), the two claimed items (tile,
    first key block, key blocks) and the consumers' merge flags, plus 1 KiB for aligning the
    128-byte-swizzled tiles."""
    tiles = knobs.block_m * D * 2 + knobs.stages * knobs.block_n * (D + (DV or D)) * 2
    if tiled:
        tiles += knobs.stages * knobs.consumers * fragment_bit_words(knobs.block_n) * 128 * 4
    if score_tile:
        tiles += knobs.stages * (tile_bytes(knobs.block_m, knobs.block_n) + 16)   # and 2 mbarriers
    tiles += knobs.stages * (strip + 16) if strip else 0
    return tiles + 8 * (1 + 4 * knobs.stages + 1 + 4) + 48 + 1024


def split_workspace(knobs: HopperKnobs, ctas: int, DV: int) -> int:
    """Floats the ``"split"`` schedule's partial states take: two parts of each of at most
    ``ctas`` pieces, each consumer warpgroup's 64 rows of ``o`` (f32, ``DV`` wide) and their
    maxima and sums (a 16-byte piece per thread)."""
    return 2 * ctas * knobs.consumers * 128 * (DV // 8 + 1) * 4


def tile_head_dim(dim: int) -> int:
    """The head dim the kernel's tiles hold for a tensor's ``dim`` (a multiple of 8 from 32 to
    256): whole 128-byte swizzle atoms (:data:`HEAD_DIMS`), the next one up where ``dim`` is not
    one — TMA's boxes fill the columns past a row with zeros, which add nothing to q·kᵀ and make
    columns of the output that are not stored (96 runs as 128: the Triton template's tile pads it
    to a power of two alike)."""
    return -(-dim // 64) * 64


def tile_head_dims(plan: "HopperAttentionPlan", sizes: dict) -> tuple[int, int]:
    """``(D, DV)`` of the kernel's tiles at ``sizes`` (:func:`tile_head_dim`)."""
    return tile_head_dim(sizes[plan.chain.dims[5]]), tile_head_dim(sizes[plan.chain.dv])


def narrow_blocks(D: int, DV: int, score_tile: bool = False) -> bool:
    """Whether key blocks narrower than 128 are needed: the value accumulator past 128 (128
    registers a thread at 256), or two slots of 128 keys and values (and of a score tile) past
    the shared memory (256/128; 192/128 with a score tile)."""
    return DV > 128 or shared_bytes(HopperKnobs(), D, DV=DV, score_tile=score_tile) > SM90_SHARED


def default_hopper_knobs(plan: HopperAttentionPlan, sizes: dict, scalars: dict | None = None,
                         choose_block: bool = True) -> HopperKnobs:
    """128 query rows (two consumer warpgroups) and 128-key blocks in two slots for head dims up
    to 128; 64-key blocks for 256 (the value accumulator alone takes 128 registers per thread).
    At head dim 128, 176-key blocks where they pay (:func:`wide_blocks_pay`, the mask's
    ``scalars`` where it has some): fewer block boundaries (each a softmax correction and an O
    rescale) for the same registers — without a mask +1.7 to +3.3 % on the H100 at S = 4096 and
    16384 (``benchmarks.hopper_attention``). ``choose_block=False``: the block size is given
    (the mask's schedule is not sampled). Where q·k and p·v run over different head dims, the
    value accumulator's (``DV``) sets the registers and both the shared memory: 192/128 keeps
    128-key blocks (208 KiB in two slots), 256/128 takes 64. Head dims are the tiles'
    (:func:`tile_head_dim`)."""
    D, DV = tile_head_dims(plan, sizes)
    if narrow_blocks(D, DV, plan.score_tile is not None):
        return HopperKnobs(block_n=64, stages=2)
    if D != DV or plan.score_tile is not None:   # a score tile's boxes are 64 keys wide
        return HopperKnobs()
    # at head dim 64 only where the score is the scaled dot product (and a key-linear bias): a
    # score function of its own (soft-cap's tanh) spills the consumers at 192 keys (ptxas)
    # nor where the score reads a key strip (cosine similarity's norms: 280 bytes of spill
    # stores at 176 keys, 72 at 128, ptxas for sm_90a)
    wide = {128: WIDE_BLOCK_N, 64: WIDE_BLOCK_N_D64 if plan.scale is not None else None}.get(D)
    wide = None if plan.key_strip is not None else wide
    if plan.keys_innermost and wide is not None and wide % 64:   # keys in boxes of 64
        wide = None
    if wide is not None and choose_block and wide_blocks_pay(plan, sizes, scalars, wide):
        return HopperKnobs(block_n=wide)
    return HopperKnobs()


WIDE_BLOCK_N = 176
# At head dim 64 the registers allow 192-key blocks: causal, B2 H16 S4096, on the H200 0.196 ms
# at 128 keys, 0.188 at 176, 0.183 at 192 (cuDNN 0.184), in the library layout and in
# [B, S, H, D] alike (``benchmarks.user_kernels``' causal_bshd_d64). Where they pay is decided by
# the same block-cost model as 176 at head dim 128 (without a mask: the head-dim-128 rule).
WIDE_BLOCK_N_D64 = 192
SM90_SHARED = 227 * 1024   # dynamic shared memory a CTA may have on sm_90
HEAD_DIMS = (64, 128, 192, 256)   # of q·k and of p·v, each: whole 128-byte swizzle atoms
# q·k's head dim may be longer than p·v's up to this: its accumulator is the scores', the same
# at any head dim; 384 over values of 128 holds 128 queries and two slots of 64 keys in 225 KiB
# of shared memory (float32 operands stored as three bf16 parts: :mod:`.operand_stages`)
MAX_QK_DIM = 384


def wide_blocks_pay(plan: HopperAttentionPlan, sizes: dict, scalars: dict | None,
                    wide: int = WIDE_BLOCK_N) -> bool:
    """Whether ``wide``-key blocks cost less than 128-key ones: always without a mask; with a mask of
    indices and scalars, where its block schedule — sampled on a few row blocks of the default
    128 rows — costs less that way (:func:`.hopper_block_costs.wide_costs_less`: blocks visited ×
    (keys + a block's overhead)). A
    mask that leaves long runs of whole blocks (causal at long sequences) gains from the wider
    blocks; one whose blocks are mostly cut (a sliding window, a neighbourhood) visits more keys
    in them. Masks reading tensors (document ids: the lists change per call), masks whose
    scalars are not known here and masks over a 2-D/3-D map (its patches and key windows are
    powers of two) keep the narrower blocks. Decided per bucket of lengths
    (:func:`.hopper_block_costs.length_bucket`)."""
    if plan.mask is None:
        return True
    if plan.reads_map:   # a map's patches and key windows are powers of two
        return False
    needed = {x.name for x in nodes(plan.mask) if isinstance(x, Scalar)}
    if plan.tensors or not needed <= set(scalars or {}):
        return False
    key = (plan.mask.key(), plan.chain.dims, length_bucket(plan.chain, sizes),
           tuple(sorted((scalars or {}).items())), wide)
    if key not in _WIDE_PAYS:
        if len(_WIDE_PAYS) > 4096:
            _WIDE_PAYS.clear()
        at = dict(key[2])
        _WIDE_PAYS[key] = wide_costs_less(plan.mask, plan.chain, at, scalars, wide,
                                          HopperKnobs().block_m, HopperKnobs().block_n,
                                          tile_head_dims(plan, at)[0])
    return _WIDE_PAYS[key]


# wide_blocks_pay's answers by mask, length bucket, scalars and width: a new length inside a
# bucket decides without sampling its block schedule again (8191 tokens causal: 105 ms of host
# time at each new length, on the CPU of the CI machine)
_WIDE_PAYS: dict = {}


def last_block_keys(plan: HopperAttentionPlan, N: int, block_n: int) -> int:
    """The width of the sequence's last key block's ``Q·Kᵀ`` in the Hopper kernel: in a plan
    without a mask, what is left of the ``N`` keys after whole blocks, to a multiple of 16 (one
    wgmma N step) — 176-key blocks cover 4224 keys for 4096, and a whole last block would
    multiply 128 keys that are not there. ``block_n`` where N is a multiple of it, where the rest
    rounds up to a whole block, and in a masked plan. The kernel is compiled per value."""
    rest = -(-(N % block_n) // 16) * 16
    return block_n if plan.mask is not None or rest in (0, block_n) else rest


def knob_choices(plan: HopperAttentionPlan, sizes: dict) -> dict[str, tuple]:
    """The values tuning tries for each knob (integers: a schedule by its index in
    ``SCHEDULES``)."""
    D, DV = tile_head_dims(plan, sizes)
    # the defaults are a point of the space (a tuning job measures them first, and keeps them
    # where nothing beats them): 192 keys at head dim 64 where the score is the scaled product
    return {"block_n": _block_choices(plan, D, DV),
            "stages": (2, 3), "consumers": (1, 2, 3) if max(D, DV) <= 64 else (1, 2),
            "overlap": (True, False), "pingpong": (True, False), "ctas_per_sm": (1, 2),
            # "auto" is what tf.compile runs; "split" needs tiles of equal length (no mask)
            "schedule": tuple(i for i, name in enumerate(SCHEDULES)
                              if name != "split" or plan.mask is None)}


def _block_choices(plan: HopperAttentionPlan, D: int, DV: int) -> tuple[int, ...]:
    """Key-block widths tuning tries: narrow ones where 128 keys do not fit; 2ᵏ for a map's
    windows and a score tile's 64-key boxes; 176 too otherwise (it overflows at 192/128), and
    at head dim 64 with the scaled dot product 192, the default there."""
    tile = plan.score_tile is not None
    if narrow_blocks(D, DV, tile):
        return (64,) if tile else (64, 80)
    if plan.reads_map or D > 128 or tile or plan.keys_innermost:
        return (64, 128)
    wide = (WIDE_BLOCK_N_D64,) if max(D, DV) == 64 and plan.scale is not None else ()
    return (64, 128, 176) + wide


def check_hopper(plan: HopperAttentionPlan, knobs: HopperKnobs, sizes: dict,
                 max_shared: int, tiled: bool = False) -> None:
    """Refuse sizes and knobs the kernel cannot run, saying which."""
    B, H, HKV, M, N, D = (sizes[d] for d in plan.chain.dims)
    DV = sizes[plan.chain.dv]
    longer = MAX_QK_DIM if plan.chain.dv != plan.chain.dims[5] else 256   # q·k's own dim
    for name, dim, top in ((plan.chain.dims[5], D, longer), (plan.chain.dv, DV, 256)):
        if dim % 8 or not 32 <= dim <= top:
            raise _refuse(f"head dim {name}={dim}: the Hopper template handles multiples of 8 "
                          f"from 32 to {top} (rows of 16-byte pieces for TMA, padded to whole "
                          "128-byte swizzle atoms); the attention template takes the others")
    D, DV = tile_head_dims(plan, sizes)
    if plan.keys_innermost and plan.chain.strides(1, sizes)["d"] * 2 % 16:
        raise _refuse(f"{plan.chain.k}'s rows of N={N} keys are not a multiple of 16 bytes, which "
                      "a tensor map's stride must be; the attention template takes it")
    if H % HKV:
        raise _refuse(f"H={H} query heads do not share HKV={HKV} kv-heads evenly")
    check_head_map(plan.chain, sizes, H, H // HKV, WHO)
    if knobs.consumers not in (1, 2, 3):
        raise _refuse(f"consumers={knobs.consumers}: 1, 2 or 3 warpgroups of 64 query rows")
    if knobs.block_n % 16 or not 16 <= knobs.block_n <= 256:
        raise _refuse(f"block_n={knobs.block_n}: a multiple of 16 from 16 to 256 (one wgmma N "
                      "for q·kᵀ, k16 steps for p·v)")
    if knobs.schedule not in SCHEDULES:
        raise _refuse(f"schedule={knobs.schedule!r}: one of {', '.join(SCHEDULES)}")
    if knobs.schedule == "split" and plan.mask is not None:
        raise _refuse("schedule='split' cuts tiles of equal length along the keys; a mask gives "
                      "each row block its own key blocks: use 'dynamic' or 'snake'")
    if knobs.ctas < 0:
        raise _refuse(f"ctas={knobs.ctas}: a count of persistent CTAs (0: ctas_per_sm per SM)")
    if knobs.stages not in (2, 3, 4):
        raise _refuse(f"stages={knobs.stages}: 2, 3 or 4 key/value slots")
    if knobs.ctas_per_sm not in (1, 2):
        raise _refuse(f"ctas_per_sm={knobs.ctas_per_sm}: 1 or 2 CTAs resident on an SM")
    if plan.keys_innermost and knobs.block_n % 64:
        raise _refuse(f"block_n={knobs.block_n}: {plan.chain.k} holds its keys innermost, copied "
                      "in boxes of 64 keys, so key blocks are multiples of 64")
    if plan.score_tile is not None and knobs.block_n % 64:
        raise _refuse(f"block_n={knobs.block_n}: the score's tiles of {plan.score_tile.name} are "
                      "copied in boxes of 64 keys, so key blocks are multiples of 64")
    need = shared_bytes(knobs, D, tiled, DV, plan.score_tile is not None,
                        plan.strip_bytes(knobs))
    dims = f"{D}" if D == DV else f"{D}/{DV}"
    if need * knobs.ctas_per_sm > max_shared:
        per = f" × {knobs.ctas_per_sm} CTAs per SM" if knobs.ctas_per_sm > 1 else ""
        raise _refuse(f"{knobs} at head dim {dims} needs {need} bytes of shared memory{per}; the "
                      f"GPU has {max_shared}: use fewer stages, a smaller block_n"
                      + (" or one CTA per SM" if per else ""))
    live = DV // 2 + knobs.block_n // 2 + knobs.block_n // 4   # O, S (f32), P (16-bit pairs)
    if live + 40 > knobs.consumer_registers:
        raise _refuse(f"{knobs} at head dim {dims} keeps about {live + 40} registers per consumer "
                      f"thread live; {knobs.consumer_registers} are available: use a smaller "
                      "block_n or fewer consumers")
    for name, value in (("M", M), ("N", N)):
        if value < 1 or value >= 2 ** 31:
            raise _refuse(f"{name}={value} is outside what the kernel indexes")
    lists = B * H * math.ceil(M / knobs.block_m) * math.ceil(N / knobs.block_n)
    if plan.mask is not None and lists >= 2 ** 32:
        raise _refuse(f"{lists} (row block, key block) pairs: the block lists are indexed with "
                      "32 bits; use a larger block_n or split the batch")
    if not 1 <= B * H <= 65535:
        raise _refuse(f"B·H={B * H}: one CTA row per (batch, head) in the grid's y dimension, "
                      "which holds at most 65535")


def _schedule_name(value) -> str:
    """A schedule given by name, or by its index in ``SCHEDULES`` (tuning records keep
    integers)."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and 0 <= value < len(SCHEDULES):
        return SCHEDULES[value]
    raise _refuse(f"schedule={value!r}: one of {', '.join(SCHEDULES)} (or its index)")


def with_knobs(plan: HopperAttentionPlan, sizes: dict, given: dict,
               scalars: dict | None = None) -> HopperKnobs:
    """The defaults (at the call's ``scalars``) with the user's ``given`` knobs; a default of
    wide key blocks that the given knobs leave no shared memory for (``stages=3``) is narrowed
    back."""
    unknown = set(given) - set(KNOBS)
    if unknown:
        raise _refuse(f"no knob {', '.join(sorted(unknown))}; knobs: {', '.join(KNOBS)}")
    given = {n: bool(v) if n in ("overlap", "pingpong") else _schedule_name(v)
             if n == "schedule" else int(v) for n, v in given.items()}
    knobs = replace(default_hopper_knobs(plan, sizes, scalars, "block_n" not in given), **given)
    D, DV = tile_head_dims(plan, sizes)
    if "block_n" not in given and knobs.block_n == WIDE_BLOCK_N and \
            shared_bytes(knobs, D, DV=DV, score_tile=plan.score_tile is not None) > SM90_SHARED:
        knobs = replace(knobs, block_n=HopperKnobs().block_n)
    return knobs


def schedule_for(knobs: HopperKnobs, tiles: int, sms: int, masked: bool = True,
                 key_blocks: int = 0) -> tuple[str, int]:
    """The schedule and grid of a call with ``tiles`` (row block, head) tiles on ``sms`` SMs:
    the knob's, with ``"auto"`` resolved — one CTA per tile where there are fewer than two per
    SM (a persistent CTA would have at most two tiles, and the hardware's dynamic hand-out
    balances those better), else persistent CTAs claiming tiles from a counter (a masked kernel
    whose mask reads no tensor may still take the snake, decided per call from its block lists:
    :func:`.tile_order.pick_persistent`). On the H100 (S=4096) persistent CTAs
    gained 1.8–8 % over one CTA per tile. Without a mask (``masked=False``: tiles of equal
    length) where the last round would leave at least half of the CTAs idle, its tiles are split
    along the keys (``"split"``; the kernel splits where the pieces are at least ``MIN_PIECE``
    key blocks). On the H100 (``benchmarks.hopper_attention``, alternated rounds, two runs):
    S=16384 (4096 tiles, 4 in
    the last round of 132) +1.7/+2.4 % full, +3.4/+4.1 % ALiBi; S=4096 (1024 tiles, 100 in the
    last round) −0.5…+0.2 % — a part-full round seems to run that much faster. ``"split"``
    asked for with fewer tiles than resident CTAs cuts every tile (``key_blocks`` each) along
    the keys — and so does ``"auto"`` without a mask where the tiles are at most half the
    resident CTAs and each has two pieces' worth of key blocks or more."""
    slots = sms * knobs.ctas_per_sm   # CTAs resident at once
    ctas = min(tiles, knobs.ctas or slots)
    schedule = knobs.schedule
    if schedule == "auto" and not masked and 2 * tiles <= slots and \
            key_blocks >= 2 * MIN_PIECE:
        # one CTA per tile would leave half the GPU idle or more (latent queries over each
        # sequence's keys: 64 tiles); cut every tile along the keys over the CTAs, as the packed
        # decodes' few tiles are (benchmarks.packed_decode), a piece's merge a read costing
        # about a third of one key block's products (scheduler.MIN_PIECE). On the H200, 64
        # tiles of 256 queries × 4096 keys: 0.047 ms split, 0.060 one CTA a tile
        # (benchmarks.pipeline_kernels --only latent_cross_attention)
        schedule = "split"
    if schedule == "auto":
        last = tiles % ctas   # tiles of the last, partial round
        schedule = "grid" if tiles < 2 * slots else "dynamic" if masked or not last or \
            2 * last > ctas else "split"
    if schedule == "split" and tiles < (knobs.ctas or slots):
        # asked for with fewer tiles than CTAs (a decode's few (batch, kv-head) tiles over
        # long caches, ``benchmarks.packed_decode``): every tile is cut, over as many CTAs as
        # take pieces of MIN_PIECE key blocks or more
        ctas = min(knobs.ctas or slots, max(tiles, tiles * key_blocks // MIN_PIECE))
    return schedule, (tiles if schedule == "grid" else ctas)


def planned_schedule(plan: HopperAttentionPlan, knobs: HopperKnobs, sizes: dict,
                     row_blocks: int | None = None) -> tuple[str, int, int]:
    """``(schedule, CTAs, tiles)`` of ``knobs`` at ``sizes`` on the local GPU (an H100's 132 SMs
    where there is none): :func:`schedule_for` on this call's tile count. ``row_blocks``: per
    head, where a tiled order pads the rows (default: the rows in blocks)."""
    from ..targets.cuda.module import local_gpu

    B, H, _, M, N = (sizes[d] for d in plan.chain.dims[:5])
    tiles = (row_blocks or math.ceil(M / knobs.block_m)) * B * H
    gpu = local_gpu()
    return schedule_for(knobs, tiles, gpu[1] if gpu else 132, plan.mask is not None,
                        math.ceil(N / knobs.block_n)) + (tiles,)
