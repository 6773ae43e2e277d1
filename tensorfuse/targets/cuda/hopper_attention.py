"""Warp-specialised attention for sm_90a: the CUDA C++ emitter (the plan, its knobs and checks:
``schedule_templates.hopper_attention_plan``; the device functions the kernel calls:
:mod:`.hopper_attention_device`).

The work is a list of *tiles* (row block, batch·head), batch·head-major — the row blocks of one
head run together, so its keys and values are read from L2 by all of them — and, within a head,
the longest row blocks (masked variants) first. How CTAs take tiles is the kernel argument
``mode`` (one cubin serves all three):

- ``GRID`` (0): one CTA per tile, the hardware handing tiles to SMs as they free up;
- ``DYNAMIC`` (1): persistent CTAs (as many as fit the GPU at once) each take tile ``blockIdx.x``
  first, then the next unclaimed one from a global counter (``atomicAdd``) — greedy list
  scheduling, like the hardware's, but with the next tile's queries, keys and values loaded
  while this tile's last products and output store run. The counter pair resets itself: the last
  CTA to finish zeroes it, so the next launch (or a graph replay) starts from 0;
- ``SNAKE`` (2): persistent CTAs taking tiles in rounds of ``gridDim.x``, forwards in even rounds
  and backwards in odd ones (CTA c: tiles c, 2g − 1 − c, 2g + c, …), so that in the masked
  variants, whose costs fall within each head, the CTA with the longest tile of a round takes a
  short one in the next — no counter at all;
- ``SPLIT`` (3, plans without a mask): ``DYNAMIC``, but the tiles of the last partial round
  (``tiles % gridDim.x``, which would keep that many SMs busy while the others idle) are cut along
  the keys into pieces of at least ``MIN_PIECE`` key blocks, one claim each, a piece possibly
  ending one tile and beginning the next. Each piece's consumers write their partial state (``o``
  unscaled, the rows' maxima and sums) to a workspace; the warpgroup whose piece of the rows
  finishes last (a counter per tile and warpgroup, which it resets) merges the others into its
  own and writes the output — nobody waits, so concurrent launches cannot deadlock.

In the persistent modes the producer thread claims each tile and hands its index to the consumers
through a two-slot shared-memory ring (mbarriers ``tile_full``/``tile_free``); the query tile is
reloaded once every consumer has issued its last ``Q·Kᵀ`` of the previous tile (``q_free``) —
from L2, where the producer asked for it (a TMA prefetch) as soon as it claimed the tile —, and
the key/value ring's slots and phases run on across tiles.

Each tile: ``128 · (1 + consumers)`` threads,

- warpgroup 0 is the producer: it gives its registers back (``setmaxnreg.dec``) and one thread
  issues TMA bulk-tensor copies (:mod:`.tma`, 3-D maps over ``[batch·heads, rows, D]`` so that a
  box past the last row of one head reads zeros, not the next head) — the query rows once, then
  for each key block of the row block's schedule its keys and its values into slot
  ``use % stages``, each completing on its own "full" mbarrier, after waiting on the slot's
  "empty" mbarrier for the consumers to be done with its previous use;
- each consumer warpgroup (``setmaxnreg.inc``) owns 64 query rows: ``S = Q·Kᵀ`` on
  ``wgmma.mma_async`` from shared memory (both operands K-major, 128-byte swizzle), the score the
  program writes evaluated on the accumulator fragments (the mask only on partial blocks and the
  ragged last one), the running maximum and sum in base 2 (the scale folded into one multiply;
  a row's maximum moved only when it grows by more than ``RESCALE_MARGIN``, so that most blocks
  skip rescaling ``O``),
  ``P`` packed to 16-bit pairs in registers — the accumulator layout of ``m64nNk16`` is the A
  fragment layout of the next ``wgmma`` — and ``O += P·V`` with V from shared memory (a tile's
  last block only over the 16-key steps that hold keys, and its ``Q·Kᵀ`` at the width of the
  keys left after whole blocks: the ragged end of the sequence). With
  ``overlap`` the next block's ``Q·Kᵀ`` is issued before this block's ``P·V``, and the softmax
  of the next block runs while ``P·V`` is on the tensor cores; ``O`` is rescaled once that product
  has landed. Every consumer thread arrives on the "empty" mbarriers when its warpgroup's product
  on a slot is complete.

The output is written from registers, 16 bytes a lane after the four lanes of each row trade
their pairs (rows past M are not written; the output must start at a 16-byte aligned address);
rows whose every key is masked give 0/0 (NaN), as the unfused program does.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .dsm import HELPERS as DSM_HELPERS
from .expr import KernelArguments, scalar_arguments, size_aliases, tensor_arguments
from .hopper_attention_device import device_functions
from .hopper_attention_score import key_bias_function, score_expressions
from .map_tiles import corner_function, position_function, view_rank
from .parts import (Part, assemble, epilogue, loads, mainloop, named_parts, pipeline,
                    row_state, scheduler)
from .parts.scheduler import (DYNAMIC, GRID, MIN_PIECE, MODES, SNAKE, SPLIT,  # noqa: F401
                              TREE_FAN, TREE_FROM, merge_rounds)
from .split import HELPERS as SPLIT_HELPERS
from .tma import HELPERS as TMA_HELPERS
from .tma import BULK_HELPERS, MBARRIER_HELPERS, load_helper
from .wgmma import HELPERS as WGMMA_HELPERS
from .wgmma import wgmma_function

ENTRY = "tf_hopper_attention"

# What the PTX of every Hopper attention kernel holds (checked by the tests).
HOPPER_PTX = ("wgmma.mma_async", "cp.async.bulk.tensor.3d", "mbarrier.try_wait",
              "setmaxnreg.inc", "setmaxnreg.dec", "ex2.approx")


_PAIRS = {"bf16": "__nv_bfloat162", "f16": "__half2", "f32": "float2"}   # a tile's pair
_TYPES = {"bf16": ("__nv_bfloat16", "__nv_bfloat162", "__floats2bfloat162_rn"),
          "f16": ("__half", "__half2", "__floats2half2_rn")}


def kernel_arguments(plan) -> list[tuple[str, str, str]]:
    """(C++ name, TVM argument type, C++ type) of the kernel's arguments, in order: the tensor
    maps, the output, the log-sum-exp output (written where the plan has one: ``LSE``), the
    block lists, the tile counters, the split tiles' workspace and the scheduling mode, tensors
    the score or mask read, the sizes (the chain's, then the others the score or mask reads),
    the scalars. ``mbits``/``mbits_off``: a tiled kernel's partial blocks' mask bits (unused
    otherwise)."""
    lists = "const int* __restrict__"
    args = [("maps", "handle", "const void*"), ("out", "handle", "void*"),
            ("lse_out", "handle", "float* __restrict__"),
            ("pn", "handle", lists), ("pi", "handle", lists), ("fn", "handle", lists),
            ("fi", "handle", lists),
            ("mbits", "handle", "const unsigned* __restrict__"), ("mbits_off", "handle", lists),
            ("counters", "handle", "int* __restrict__"),
            ("work", "handle", "float4* __restrict__"), ("mode", "int32", "int")]
    return args + tensor_arguments(plan.arguments) + \
        [(d, "int32", "int") for d in ("B_", "H_", "HKV_", "M_", "N_")] + \
        [(f"TF_SIZE_{d}", "int32", "int") for d in plan.extra_sizes] + \
        scalar_arguments(plan.chain.scalars)


@dataclass(frozen=True)
class AttentionSource(KernelArguments):
    """What the parts of one Hopper attention kernel read: the plan
    (``schedule_templates.hopper_attention_plan.HopperAttentionPlan``), its knobs, the head dim,
    whether the key blocks come from the block schedule's lists (``lists``), the map tiling
    (``tiling``), the width of the sequence's last key block (``last_n``) and the head dim of the
    values and the output (``DV``, where p·v runs over another one than q·k); and the C++ names
    and expressions made from them once."""

    entry = ENTRY
    plan: object
    knobs: object
    D: int
    lists: bool
    tiling: object = None
    last_n: int | None = None
    DV: int | None = None
    # (D, DV) of the tensors where the tiles' are wider (padded to 128-byte swizzle atoms)
    rows: tuple[int, int] | None = None

    def __post_init__(self):
        if self.DV is None:
            object.__setattr__(self, "DV", self.D)
        bn, last_n = self.knobs.block_n, self.last_n
        if last_n is None:
            object.__setattr__(self, "last_n", bn)
        elif last_n != bn and (self.lists or self.tiling is not None or last_n % 16 or
                               not 16 <= last_n < bn):
            raise ValueError(f"a last key block of {last_n} keys: a multiple of 16 below "
                             f"block_n={bn}, in a plan without a mask")

    @property
    def chain(self):
        return self.plan.chain

    @property
    def bn(self) -> int:
        return self.knobs.block_n

    @property
    def shared_lists(self) -> bool:
        """Whether the lists are one batch·head's, read by all (``plan.lists_shared``)."""
        return self.lists and self.tiling is None and self.plan.lists_shared

    @property
    def tiled(self) -> bool:
        return self.tiling is not None

    @property
    def strided(self) -> bool:
        """Each tensor read and written by its own strides (a permuted layout)."""
        return self.plan.strided

    @property
    def rank(self) -> int:
        """Dimensions of the tensor maps: 3 (``[batch·heads, tokens, D]``), 4 (a permuted
        layout's head dim, tokens, head and batch by their strides), or a map view's."""
        if self.tiled:
            return view_rank(self.tiling.cols.dims, self.tiling.cols.dilation)
        return 4 if self.strided else 3

    @property
    def score_tile(self):
        """The tensor the score reads as tiles, or by key alone as strips
        (``schedule_templates.score_tiles.ScoreTile``, ``.strip``), or None: one ring of them."""
        return self.plan.score_tile or self.plan.key_strip

    @property
    def elem(self) -> str:
        return _TYPES[self.plan.dtype][0]

    @property
    def pair(self) -> str:
        return _TYPES[self.plan.dtype][1]

    @property
    def pack(self) -> str:
        return _TYPES[self.plan.dtype][2]

    @property
    def header(self) -> str:
        dtypes = {self.plan.dtype} | ({self.score_tile.dtype} - {"f32"} if self.score_tile
                                      else set())
        return "".join("#include <cuda_bf16.h>\n" if d == "bf16" else "#include <cuda_fp16.h>\n"
                       for d in sorted(dtypes))

    def _mma(self, kind: str, n: int) -> str:
        """The name :func:`.wgmma.wgmma_function` gives a product: ``kind`` "kk" (B K-major),
        "rs" (A from registers) or "" (A from shared memory, B MN-major)."""
        return f"tf_wgmma_{kind + '_' if kind else ''}m64n{n}k16" + \
            ("_f16" if self.plan.dtype == "f16" else "")

    @property
    def keys_innermost(self) -> bool:
        """Whether k holds its keys innermost (``[B, H, D, N]``): its tiles the MN-major B of
        q·kᵀ, in atoms of 64 keys × ``D_`` rows."""
        return self.plan.keys_innermost

    @property
    def key_boxes(self) -> str:
        """TMA boxes of a key block's keys: one per 64 head-dim columns, or per 64 keys."""
        return "BN / 64" if self.keys_innermost else "ATOMS"

    @property
    def key_step(self) -> str:
        """The keys' descriptor of q·kᵀ's 16-column step ``ks``."""
        return "tf_nmajor_desc(k_base + SLOT(it) * K_BYTES, D_, 0, ks * 16)" \
            if self.keys_innermost else "tf_desc_plus(dk, kmajor_step(BN, ks))"

    @property
    def s_mma(self) -> str:
        """q·kᵀ of a whole key block (keys K-major, or MN-major where kept innermost)."""
        return self._mma(self._qk_kind, self.bn)

    @property
    def sn_mma(self) -> str:
        """q·kᵀ of the sequence's last key block."""
        return self._mma(self._qk_kind, self.last_n)

    @property
    def _qk_kind(self) -> str:
        return "" if self.keys_innermost else "kk"

    @property
    def pv_n(self) -> int:
        """The columns ``p·v`` computes: the tile's, or a padded tile's columns that hold the
        values' (to a multiple of 8, wgmma's N step): DV = 96 held as 128 multiplies 96 columns
        of the values' tile, the accumulator's last 16 registers a thread left at zero."""
        return -(-self.rows[1] // 8) * 8 if self.padded else self.DV

    @property
    def o_mma(self) -> str:
        """p·v, P from registers."""
        return self._mma("rs", self.pv_n)

    @property
    def o_acc(self) -> str:
        """The accumulator ``p·v`` adds to: ``o``, or its first ``pv_n / 2`` registers."""
        return "o" if self.pv_n == self.DV else \
            f"*reinterpret_cast<float (*)[{self.pv_n // 2}]>(o)"

    @property
    def functions(self) -> str:
        """The kernel's ``wgmma`` functions."""
        dtype = self.plan.dtype
        keys = not self.keys_innermost   # K-major keys, else MN-major
        made = wgmma_function(self.bn, b_k_major=keys, dtype=dtype) + \
            wgmma_function(self.pv_n, a_in_registers=True, dtype=dtype)
        if self.last_n != self.bn:
            made += wgmma_function(self.last_n, b_k_major=keys, dtype=dtype)
        return made

    @cached_property
    def arguments(self) -> list:
        return kernel_arguments(self.plan)

    @property
    def forwarded_arguments(self) -> list:
        """What the score and mask may read: the arguments after ``mode``."""
        return self.arguments[[n for n, _, _ in self.arguments].index("mode") + 1:]

    @cached_property
    def _score(self) -> tuple[str, str, str, str, str]:
        """(score, masking statement, base-2 factor, a block's first statement, folds)."""
        return score_expressions(self.plan)

    score = property(lambda self: self._score[0])
    masked = property(lambda self: self._score[1])
    scale = property(lambda self: self._score[2])
    begin = property(lambda self: self._score[3])
    folds = property(lambda self: self._score[4])

    @property
    def padded(self) -> bool:
        """Whether the tiles' head dims are wider than the tensors' rows (:attr:`rows`)."""
        return self.rows is not None and self.rows != (self.D, self.DV)

    @property
    def qk_steps(self) -> str:
        """The 16-column steps of ``q·kᵀ``: the tile's, or only those holding a padded tile's
        columns of the tensors (past them TMA filled zeros, which add nothing — a head dim of 96
        held as 128 runs 6 steps, not 8)."""
        return "(ROW_D_ + 15) / 16" if self.padded else "D_ / 16"

    @property
    def sizes(self) -> str:
        dims = ("ROW_D_", "OUT_DV_") if self.padded else ("D_", "DV_")
        return size_aliases(zip(self.chain.dims + ((self.chain.value_dim,) if
                                                   self.chain.value_dim else ()),
                                ("B_", "H_", "HKV_", "M_", "N_") + dims))


def _head(c: AttentionSource) -> str:
    """Includes, the helpers the parts call, the ``wgmma`` functions, a map's arithmetic."""
    return f"""{c.header}#include <math.h>
{DSM_HELPERS}
{WGMMA_HELPERS}
{MBARRIER_HELPERS}
{TMA_HELPERS}
{SPLIT_HELPERS}
{load_helper(c.rank)}{_tile_load_helper(c)}
{BULK_HELPERS if c.tiled else ""}
{c.functions}
{_tiled_functions(c.tiling)}
"""


def _tile_load_helper(c: AttentionSource) -> str:
    """The TMA copy of the score tile's map, where its rank is not the others' (nor 2: the TMA
    helpers always have the 2-D copy)."""
    tile = c.score_tile
    return load_helper(tile.rank) if tile is not None and tile.rank not in (c.rank, 2) else ""


def _score_defines(c: AttentionSource) -> str:
    """The score's folded factors, the sizes' aliases, the element type."""
    tile = "" if c.score_tile is None else \
        f"typedef {_PAIRS[c.score_tile.dtype]} tile_pair_t;   // two elements of a score tile\n"
    return f"""{c.folds}
{c.sizes}
typedef {c.elem} elem_t;
{tile}
"""


def _device(c: AttentionSource) -> str:
    """The device functions (:mod:`.hopper_attention_device`) and the key-linear bias."""
    return f"""{device_functions(c)}
{key_bias_function(c.plan, c.extra_params)}

"""


def _tiled_functions(tiling) -> str:
    """A tiled kernel's map arithmetic (``tf_map_corner``, ``tf_row_token``); nothing without."""
    if tiling is None:
        return ""
    return corner_function("tf_map_corner", tiling.cols) + \
        position_function("tf_row_token", tiling.rows)


# The kernel's parts, by role (``tensorfuse show --parts``).
PARTS = (
    Part("scheduler", "attention_tiles", ("knobs.schedule", "knobs.block_m", "lists", "mask"),
         (scheduler.attention_defines, scheduler.attention_claim_loop_begin,
          scheduler.attention_claim_loop_end, scheduler.attention_consumer_tile,
          scheduler.attention_tile_functions, scheduler.attention_claim_function)),
    Part("load", "tma_boxes", ("D", "DV", "knobs.block_n", "knobs.stages", "lists", "tiling",
                               "score_tile"),
         (loads.attention_policy_defines, loads.attention_tile_bytes,
          loads.attention_producer_loads)),
    # a permuted layout: 4-D boxes of each tensor's own strides (head dim, tokens, head, batch)
    Part("load", "tma_strided_boxes", ("D", "DV", "knobs.block_n", "knobs.stages", "lists",
                                       "chain.layouts", "score_tile"),
         (loads.attention_policy_defines, loads.attention_tile_bytes,
          loads.attention_producer_loads)),
    Part("pipeline", "warp_specialized_ring",
         ("knobs.block_m", "knobs.block_n", "knobs.stages", "knobs.consumers",
          "knobs.ctas_per_sm", "knobs.overlap", "knobs.pingpong"),
         (pipeline.attention_config, pipeline.attention_kernel_begin,
          pipeline.attention_producer_begin, pipeline.attention_turns_open,
          pipeline.attention_kernel_end, pipeline.attention_turn_functions)),
    Part("mainloop", "wgmma_qk_then_pv", ("D", "DV", "dtype", "knobs.block_n", "knobs.overlap",
                                          "last_n"),
         (mainloop.attention_consumer_begin, mainloop.attention_issue_macros,
          mainloop.attention_step_macros, mainloop.attention_tile_blocks,
          mainloop.attention_pack_function, mainloop.attention_descriptors,
          mainloop.attention_pack_p)),
    Part("row_state", "online_softmax_base2", ("chain.score", "mask", "scale", "key_bias",
                                               "score_tile"),
         (row_state.attention_defines, row_state.attention_softmax_macro,
          row_state.attention_exp2, row_state.attention_score_function,
          row_state.attention_softmax_functions, row_state.attention_rescale)),
    Part("epilogue", "deferred_register_store", ("DV", "dtype", "chain.lse", "tiling"),
         (epilogue.attention_defines, epilogue.attention_deferred_store, epilogue.attention_store,
          epilogue.attention_quad_transpose, epilogue.attention_merge_piece)),
    # a permuted layout: rows and log-sum-exps stored at the offsets of the program's layout
    Part("epilogue", "deferred_strided_store", ("DV", "dtype", "chain.lse", "chain.layouts"),
         (epilogue.attention_defines, epilogue.attention_deferred_store, epilogue.attention_store,
          epilogue.attention_quad_transpose, epilogue.attention_merge_piece)),
)

# The kernel's source, fragment by fragment (the device functions: .hopper_attention_device).
KERNEL = (
    _head, pipeline.attention_config, loads.attention_policy_defines, epilogue.attention_defines,
    scheduler.attention_defines, loads.attention_tile_bytes, row_state.attention_defines,
    _score_defines, _device, pipeline.attention_kernel_begin, pipeline.attention_producer_begin,
    scheduler.attention_claim_loop_begin, loads.attention_producer_loads,
    scheduler.attention_claim_loop_end, mainloop.attention_consumer_begin,
    mainloop.attention_issue_macros, row_state.attention_softmax_macro,
    mainloop.attention_step_macros, pipeline.attention_turns_open,
    epilogue.attention_deferred_store, scheduler.attention_consumer_tile,
    mainloop.attention_tile_blocks, epilogue.attention_store, pipeline.attention_kernel_end,
)


def hopper_attention_source(plan, knobs, D: int, lists: bool, tiling=None,
                            last_n: int | None = None, DV: int | None = None,
                            rows: tuple[int, int] | None = None) -> str:
    """CUDA C++ for ``tf_hopper_attention``: grid (row blocks, B·H) in ``GRID`` mode, else
    (persistent CTAs, 1), ``knobs.threads`` threads, dynamic shared memory
    ``hopper_attention_plan.shared_bytes``. ``lists``: the row blocks' key blocks come from the
    block schedule (``pn``/``pi`` partial, ``fn``/``fi`` full) — a masked plan; otherwise every
    key block, none of them masked but the ragged last one. Sizes B, H, HKV, M, N are kernel
    arguments: one cubin serves every shape with this head dim and ``last_n`` — except with a
    ``tiling`` (``schedule_templates.hopper_tiling.HopperTiling``): the queries are visited in
    patches of a 2-D/3-D map and the keys in windows of it, both copied as boxes of the map
    (:mod:`.map_tiles`); the partial blocks' mask comes as bits per element (``mbits``), copied
    with the keys, and the cubin is made for that map. ``last_n`` (a multiple of 16 below
    ``block_n``; plans without a mask): the width of the sequence's last key block's ``Q·Kᵀ`` —
    what is left of N after whole blocks, not a whole block mostly past the end
    (``hopper_attention_plan.last_block_keys``). ``DV``: the values' and the output's head dim,
    where p·v runs over another one than q·k (``D``). ``rows``: the tensors' ``(D, DV)`` where
    the tiles' (``D``, ``DV``: whole 128-byte swizzle atoms) are wider — TMA fills the columns
    past a row with zeros, and the output's are not stored. Assembled from :data:`PARTS`."""
    named_parts(PARTS, plan.parts)
    return assemble(KERNEL, AttentionSource(plan, knobs, D, lists, tiling, last_n, DV, rows))
