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

from .dsm import HELPERS as DSM_HELPERS
from .expr import forwarded, scalar_arguments, size_aliases, tensor_arguments
from .hopper_attention_device import device_functions
from .hopper_attention_score import key_bias_function, score_expressions
from .map_tiles import (corner_function, position_function, tma_load_call,
                        tma_prefetch_call, view_rank)
from .split import HELPERS as SPLIT_HELPERS
from .tma import HELPERS as TMA_HELPERS
from .tma import BULK_HELPERS, MBARRIER_HELPERS, load_helper
from .wgmma import HELPERS as WGMMA_HELPERS
from .wgmma import fragment_bit_words, wgmma_function

ENTRY = "tf_hopper_attention"
# how CTAs take tiles (the kernel's ``mode`` argument)
GRID, DYNAMIC, SNAKE, SPLIT = 0, 1, 2, 3
MODES = {"grid": GRID, "dynamic": DYNAMIC, "snake": SNAKE, "split": SPLIT}
# split tiles: pieces of at least this many key blocks (each piece's partial costs its merger a
# read of 34 KB a warpgroup at D = 128, about a third of a 176-key block's products)
MIN_PIECE = 4

# What the PTX of every Hopper attention kernel holds (checked by the tests).
HOPPER_PTX = ("wgmma.mma_async", "cp.async.bulk.tensor.3d", "mbarrier.try_wait",
              "setmaxnreg.inc", "setmaxnreg.dec", "ex2.approx")


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
    return args + tensor_arguments(plan.tensors) + \
        [(d, "int32", "int") for d in ("B_", "H_", "HKV_", "M_", "N_")] + \
        [(f"TF_SIZE_{d}", "int32", "int") for d in plan.extra_sizes] + \
        scalar_arguments(plan.chain.scalars)


def _tiled_functions(tiling) -> str:
    """A tiled kernel's map arithmetic (``tf_map_corner``, ``tf_row_token``); nothing without."""
    if tiling is None:
        return ""
    return corner_function("tf_map_corner", tiling.cols) + \
        position_function("tf_row_token", tiling.rows)


def hopper_attention_source(plan, knobs, D: int, lists: bool, tiling=None,
                            last_n: int | None = None) -> str:
    """CUDA C++ for ``tf_hopper_attention``: grid (row blocks, B·H) in ``GRID`` mode, else
    (persistent CTAs, 1), ``knobs.threads`` threads,
    dynamic shared memory ``hopper_attention_plan.shared_bytes``. ``lists``: the row blocks'
    key blocks come from the block schedule (``pn``/``pi`` partial, ``fn``/``fi`` full) — a masked
    plan; otherwise every key block, none of them masked but the ragged last one. Sizes B, H, HKV,
    M, N are kernel arguments: one cubin serves every shape with this head dim and ``last_n`` —
    except with a ``tiling`` (``schedule_templates.hopper_tiling.HopperTiling``): the queries
    are visited in patches of a 2-D/3-D map and the keys in windows of it, both copied as boxes
    of the map (:mod:`.map_tiles`); the partial blocks' mask comes as bits per element
    (``mbits``), copied with the keys, and the cubin is made for that map. ``last_n`` (a multiple of 16 below
    ``block_n``; plans without a mask): the width of the sequence's last key block's ``Q·Kᵀ`` —
    what is left of N after whole blocks, not a whole block mostly past the end
    (``hopper_attention_plan.last_block_keys``)."""
    chain = plan.chain
    elem, pair, pack = _TYPES[plan.dtype]
    header = "#include <cuda_bf16.h>\n" if plan.dtype == "bf16" else "#include <cuda_fp16.h>\n"
    suffix = "_f16" if plan.dtype == "f16" else ""
    bn = knobs.block_n
    s_mma = f"tf_wgmma_kk_m64n{bn}k16{suffix}"
    o_mma = f"tf_wgmma_rs_m64n{D}k16{suffix}"
    last_n = bn if last_n is None else last_n
    if last_n != bn and (lists or tiling is not None or last_n % 16 or
                         not 16 <= last_n < bn):
        raise ValueError(f"a last key block of {last_n} keys: a multiple of 16 below "
                         f"block_n={bn}, in a plan without a mask")
    functions = wgmma_function(bn, b_k_major=True, dtype=plan.dtype) + \
        wgmma_function(D, a_in_registers=True, dtype=plan.dtype)
    sn_mma = f"tf_wgmma_kk_m64n{last_n}k16{suffix}"
    if last_n != bn:
        functions += wgmma_function(last_n, b_k_major=True, dtype=plan.dtype)
    args = kernel_arguments(plan)
    params = ",\n    ".join(f"{c} {n}" for n, _, c in args)
    # what the score and mask may read: tensors, sizes, scalars
    first_extra = [n for n, _, _ in args].index("mode") + 1
    extra_params, extra_args = forwarded(args[first_extra:])
    tiled = tiling is not None
    rank = view_rank(tiling.cols.dims, tiling.cols.dilation) if tiled else 3
    score, masked, scale, begin, folds = score_expressions(plan)
    sizes = size_aliases(zip(chain.dims, ("B_", "H_", "HKV_", "M_", "N_", "D_")))
    return f"""{header}#include <math.h>
{DSM_HELPERS}
{WGMMA_HELPERS}
{MBARRIER_HELPERS}
{TMA_HELPERS}
{SPLIT_HELPERS}
{load_helper(rank)}
{BULK_HELPERS if tiled else ""}
{functions}
{_tiled_functions(tiling)}
#define D_ {D}
#define BM {knobs.block_m}
#define BN {bn}
// the sequence's last key block: LAST_N keys (what is left of N after whole blocks, to 16)
#define LAST_N {last_n}
#define STAGES {knobs.stages}
#define CONSUMERS {knobs.consumers}
#define THREADS {knobs.threads}
#define CTAS_PER_SM {knobs.ctas_per_sm}
#define CONSUMER_REGS {knobs.consumer_registers}
#define PRODUCER_REGS {knobs.producer_registers}
#define OVERLAP {int(knobs.overlap)}
// consumers take turns issuing MMAs
#define PINGPONG {int(knobs.pingpong and knobs.consumers > 1)}
#if PINGPONG
#define TURN_BEGIN tf_turn_wait(cw);
#define TURN_END tf_turn_pass(cw);
#else
#define TURN_BEGIN
#define TURN_END
#endif
#define LISTS {int(lists)}
// queries in patches of a map, keys in windows of it (their mask as bits per element)
#define TILED {int(tiled)}
#define TILED_ROW_BLOCKS {tiling.rows.padded // knobs.block_m if tiled else 0}
#define WINDOWS {tiling.cols.bound if tiled else 0}   // list entries per row block
#define MASK_WORDS {fragment_bit_words(bn)}              // a consumer thread's bits of a block
#define MASK_BYTES (TILED ? CONSUMERS * MASK_WORDS * 128 * 4 : 0)
// a tile's output stores wait for the next tile's first q·kᵀ (registers allow it up to D = 128)
#define DEFER (D_ <= 128)
#define LSE {int(bool(chain.lse))}   // write each row's log-sum-exp (natural log) to lse_out
#define MODE_GRID {GRID}      // the ``mode`` argument: how CTAs take tiles
#define MODE_DYNAMIC {DYNAMIC}
#define MODE_SPLIT {SPLIT}
#define MODE_SNAKE {SNAKE}
#define MIN_PIECE {MIN_PIECE}
#define ATOMS (D_ / 64)                 // 128-byte swizzle atoms along the head dim
#define Q_BYTES (BM * D_ * 2)
#define KV_BYTES (BN * D_ * 2)
#define TF_LOG2E 1.4426950408889634f
#define RESCALE_MARGIN 8.0f   // a row's running maximum moves once it grows by more (base 2)
{folds}
{sizes}
typedef {elem} elem_t;

{device_functions(pair, pack, score, masked, extra_params, begin)}
{key_bias_function(plan, extra_params)}

extern "C" __global__ void __launch_bounds__(THREADS, CTAS_PER_SM) {ENTRY}(
    {params}) {{
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = (unsigned char*)(((unsigned long)smem_raw + 1023) & ~1023ul);
  unsigned char* q_tile = smem;
  unsigned char* k_tiles = smem + Q_BYTES;
  unsigned char* v_tiles = k_tiles + STAGES * KV_BYTES;
  unsigned char* mask_tiles = v_tiles + STAGES * KV_BYTES;   // TILED: the partial blocks' bits
  unsigned long long* bars = (unsigned long long*)(mask_tiles + STAGES * MASK_BYTES);
  unsigned long long* bar_q = bars;
  unsigned long long* full_k = bars + 1;
  unsigned long long* full_v = full_k + STAGES;
  unsigned long long* empty_k = full_v + STAGES;
  unsigned long long* empty_v = empty_k + STAGES;
  unsigned long long* q_free = empty_v + STAGES;      // every consumer's last q·kᵀ of a tile issued
  unsigned long long* tile_full = q_free + 1;         // two slots of claimed tile indices
  unsigned long long* tile_free = tile_full + 2;
  volatile int* tile_ids = (volatile int*)(tile_free + 2);   // two slots: tile, first block, blocks
  volatile int* flags = tile_ids + 8;                         // a warpgroup's "merged last"
  const void* q_map = (const char*)maps;
  const void* k_map = (const char*)maps + 128;
  const void* v_map = (const char*)maps + 256;

  const int row_blocks = TILED ? TILED_ROW_BLOCKS : (M_ + BM - 1) / BM;
  const int tiles = row_blocks * B_ * H_;
  // key blocks of an unmasked tile, and the split tiles (computed where used: the consumers
  // keep no registers for them through the loop)
#define C_ ((N_ + BN - 1) / BN)
#define TAIL tail_of(tiles, gridDim.x, C_, !LISTS && mode == MODE_SPLIT)
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {{
    tf_mbar_init(bar_q, 1);
    for (int s = 0; s < STAGES; ++s) {{
      tf_mbar_init(full_k + s, 1);
      tf_mbar_init(full_v + s, 1);
      tf_mbar_init(empty_k + s, 128 * CONSUMERS);
      tf_mbar_init(empty_v + s, 128 * CONSUMERS);
    }}
    tf_mbar_init(q_free, 128 * CONSUMERS);
    for (int s = 0; s < 2; ++s) {{
      tf_mbar_init(tile_full + s, 1);
      tf_mbar_init(tile_free + s, 128 * CONSUMERS);
    }}
    tf_mbar_init_fence();
  }}
  __syncthreads();

  if (wg == 0) {{   // the producer
    tf_setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x == 0) {{
      tf_tensormap_acquire(q_map);
      tf_tensormap_acquire(k_map);
      tf_tensormap_acquire(v_map);
      const Tail tail = TAIL;
      const int works = tail.tile0 + tail.pieces;   // whole tiles, then pieces
      int use = 0;   // key/value blocks loaded so far: the ring's slot and phase run on
      int k = 0;     // items handed to the consumers
      for (int claim = 0, done = 0; !done; ++claim) {{
        const int c = claim_tile(claim, mode, counters, works);
        for (int x = 0;; ++x, ++k) {{
          int t = tiles, f = 0, n = 0;   // `tiles`: none left
          if (c < works && !item_at(c, tail, x, t, f, n)) break;   // the claim's items handed on
          if (k >= 2) tf_mbar_wait(tile_free + (k & 1), ((k >> 1) - 1) & 1);
          tile_ids[4 * (k & 1)] = t;
          tile_ids[4 * (k & 1) + 1] = f;
          tile_ids[4 * (k & 1) + 2] = n;
          tf_mbar_arrive(tile_full + (k & 1));
          if (t >= tiles) {{
            done = 1;
            break;
          }}
          Tile w = tile_at(t, row_blocks, pn, fn, H_, HKV_, N_);
#if !LISTS
          w.first = f;
          w.count = n;
#endif
#if TILED
          int qc[{rank - 1}];
          bool q_ok;
          tf_map_corner(tf_row_token(w.rb * BM, q_ok), w.bh, qc);
#endif
          // the next tile's queries into L2 while the consumers finish this one: their copy
          // into the query buffer waits until it is free (q_free), then reads L2, not memory
          if (k >= 1) {{
            #pragma unroll
            for (int a = 0; a < ATOMS; ++a)
#if TILED
              {tma_prefetch_call(rank, "q_map", "a * 64", "qc")};
#else
              tf_tma_prefetch_3d(q_map, a * 64, w.rb * BM, w.bh);
#endif
            tf_mbar_wait(q_free, (k - 1) & 1);
          }}
          tf_mbar_expect(bar_q, Q_BYTES);
          #pragma unroll
          for (int a = 0; a < ATOMS; ++a)
#if TILED
            {tma_load_call(rank, "q_tile + a * BM * 128", "q_map", "a * 64", "qc", "bar_q")};
#else
            tf_tma_load_3d(q_tile + a * BM * 128, q_map, a * 64, w.rb * BM, w.bh, bar_q);
#endif
          for (int it = 0; it < w.count; ++it) {{
            const int u = use + it, s = u % STAGES;
#if TILED
            int kc[{rank - 1}];
            tf_map_corner(key_block(w, it, pi, fi), w.kv, kc);   // the window's origin
            const bool bits = it < w.n_partial;
#else
            const int n0 = key_block(w, it, pi, fi) * BN;
            const bool bits = false;
#endif
            if (u >= STAGES) tf_mbar_wait(empty_k + s, ((u / STAGES) - 1) & 1);
            tf_mbar_expect(full_k + s, KV_BYTES + (bits ? MASK_BYTES : 0));
            #pragma unroll
            for (int a = 0; a < ATOMS; ++a)
#if TILED
              {tma_load_call(rank, "k_tiles + s * KV_BYTES + a * BN * 128", "k_map", "a * 64",
                             "kc", "full_k + s")};
            if (bits)
              tf_bulk_load(mask_tiles + s * MASK_BYTES,
                           mbits + (size_t)(mbits_off[w.rb] + it) * (MASK_BYTES / 4), MASK_BYTES,
                           full_k + s);
#else
              tf_tma_load_3d(k_tiles + s * KV_BYTES + a * BN * 128, k_map, a * 64, n0, w.kv,
                             full_k + s);
#endif
            if (u >= STAGES) tf_mbar_wait(empty_v + s, ((u / STAGES) - 1) & 1);
            tf_mbar_expect(full_v + s, KV_BYTES);
            #pragma unroll
            for (int a = 0; a < ATOMS; ++a)
#if TILED
              {tma_load_call(rank, "v_tiles + s * KV_BYTES + a * BN * 128", "v_map", "a * 64",
                             "kc", "full_v + s")};
#else
              tf_tma_load_3d(v_tiles + s * KV_BYTES + a * BN * 128, v_map, a * 64, n0, w.kv,
                             full_v + s);
#endif
          }}
          use += w.count;
        }}
      }}
      // the last CTA out resets the counters for the next launch
      if (mode == MODE_DYNAMIC || mode == MODE_SPLIT) {{
        __threadfence();
        if (atomicAdd(counters + 1, 1) == (int)gridDim.x - 1) {{
          atomicExch(counters, 0);
          atomicExch(counters + 1, 0);
        }}
      }}
    }}
    return;
  }}

  // a consumer warpgroup: query rows [rb·BM + 64·cw, +64) of each tile it is handed
  tf_setmaxnreg_inc<CONSUMER_REGS>();
  const int cw = wg - 1;
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const float scale2 = {scale};
  const unsigned q_base = tf_smem_addr(q_tile), k_base = tf_smem_addr(k_tiles),
                 v_base = tf_smem_addr(v_tiles);
  float o[D_ / 2];
  float m[2], l[2], corr[2];
  float s[BN / 2];
  uint4 p[BN / 16];
  unsigned mw[MASK_WORDS];   // TILED: this thread's mask bits of the block in s
  int use = 0;   // key/value blocks consumed in earlier tiles (the ring's slot and phase)

#define SCORE_ARGS mw, scale2, kc_{extra_args}
#define SLOT(it) ((use + (it)) % STAGES)
#define PHASE(it) (((use + (it)) / STAGES) & 1)
  // q·kᵀ of block `it` into the accumulators `acc` by `mma` (issued, not waited for)
#define ISSUE_S_INTO(acc, mma, it)                                                          \
  {{                                                                                          \
    const unsigned long long dq = kmajor_desc(q_base, cw * 64),                             \
                             dk = kmajor_desc(k_base + SLOT(it) * KV_BYTES, 0);             \
    tf_mbar_wait(full_k + SLOT(it), PHASE(it));                                               \
    tf_wgmma_fence();                                                                         \
    _Pragma("unroll") for (int ks = 0; ks < D_ / 16; ++ks)                                   \
      mma(acc, tf_desc_plus(dq, kmajor_step(BM, ks)), tf_desc_plus(dk, kmajor_step(BN, ks)), \
          ks > 0);                                                                            \
    tf_wgmma_commit();                                                                        \
  }}
  // o += p·v of block `it` over its first `steps` 16-key steps (issued, not waited for)
#define ISSUE_O(it, steps)                                                                  \
  {{                                                                                          \
    const unsigned vt = v_base + SLOT(it) * KV_BYTES;                                         \
    tf_mbar_wait(full_v + SLOT(it), PHASE(it));                                               \
    tf_wgmma_fence();                                                                         \
    _Pragma("unroll") for (int ks = 0; ks < BN / 16; ++ks)                                   \
      if (ks < (steps)) {o_mma}(o, p[ks], vmajor_desc(vt, ks), 1);                       \
    tf_wgmma_commit();                                                                        \
  }}
  // the 16-key steps of a tile's last block that hold keys: all but where it is the ragged end
  // of the sequence (p is 0 past it). A dense tile's last block is that one: 176-key blocks
  // cover 4224 keys for 4096, and this skips 8 of the last block's 11 p·v products (its q·kᵀ
  // runs at LAST_N, into accumulators of its own: STEP / FIRST with `sn`). The
  // count is broadcast from lane 0 so that ptxas sees a warp-uniform branch around the wgmma
  // (otherwise it serialises them, C7520; uniform, it only fences each one, C7519).
#define LAST_STEPS(it)                                                                      \
  (TILED ? BN / 16 : __shfl_sync(0xffffffffu,                                               \
      (min(BN, N_ - key_block(w, it, pi, fi) * BN) + 15) / 16, 0))
  // the score and softmax of block `it` (`keys` wide), whose q·kᵀ has landed in `acc`
#define SOFTMAX_INTO(acc, it, keys)                                                         \
  {{                                                                                          \
    const int n0 = key_block(w, it, pi, fi) * BN;                                             \
    if ((it) < w.n_partial || (!TILED && n0 + (keys) > N_))                                   \
      score_block<true>(acc, row_lo, n0, w.bh / H_, w.bh % H_, lane, SCORE_ARGS);             \
    else                                                                                      \
      score_block<false>(acc, row_lo, n0, w.bh / H_, w.bh % H_, lane, SCORE_ARGS);            \
    softmax_block(acc, m, l, corr, scale2);                                                   \
  }}
  // block `it`'s q·kᵀ has landed: after the tile's last one the query tile may be reloaded
  // (a partial block's mask bits are read before its slot is released)
#define S_LANDED_INTO(acc, it)                                                              \
  {{                                                                                          \
    tf_fence_regs(acc);                                                                       \
    if (TILED && (it) < w.n_partial) {{                                                        \
      const unsigned* bits = (const unsigned*)(mask_tiles + SLOT(it) * MASK_BYTES) +          \
                             cw * MASK_WORDS * 128 + t;                                         \
      _Pragma("unroll") for (int x = 0; x < MASK_WORDS; ++x) mw[x] = bits[128 * x];           \
    }}                                                                                         \
    tf_mbar_arrive(empty_k + SLOT(it));                                                       \
    if ((it) == w.count - 1) tf_mbar_arrive(q_free);                                    \
  }}
  // block `it` > 0 (`keys` wide): its q·kᵀ into `acc` by `mma`, the previous block's p·v
  // a tile's first block (`keys` wide): its q·kᵀ into `acc` by `mma`, while the previous tile's
  // output is written (DEFER)
#define FIRST(acc, mma, keys)                                                               \
  {{                                                                                          \
    TURN_BEGIN                                                                                \
    ISSUE_S_INTO(acc, mma, 0);                                                                \
    TURN_END                                                                                  \
    if (DEFER) write_out();                                                                   \
    tf_wgmma_wait<0>();                                                                       \
    S_LANDED_INTO(acc, 0);                                                                    \
    SOFTMAX_INTO(acc, 0, keys);                                                               \
    pack_p(acc, p);                                                                           \
  }}
#if OVERLAP
#define STEP(it, acc, mma, keys)                                                            \
  {{                                                                                          \
    TURN_BEGIN                                                                                \
    ISSUE_S_INTO(acc, mma, it);                                                               \
    ISSUE_O((it) - 1, BN / 16);                                                               \
    TURN_END                                                                                  \
    tf_wgmma_wait<1>();            /* q·kᵀ of `it` has landed; p·v of `it - 1` may still run */ \
    S_LANDED_INTO(acc, it);                                                                   \
    SOFTMAX_INTO(acc, it, keys);                                                              \
    tf_block_end(l);                                                                          \
    tf_wgmma_wait<0>();                                                                       \
    tf_fence_regs(o);                                                                         \
    tf_mbar_arrive(empty_v + SLOT((it) - 1));                                                 \
    rescale(o, corr);                                                                         \
    pack_p(acc, p);                                                                           \
  }}
#else
#define STEP(it, acc, mma, keys)                                                            \
  {{                                                                                          \
    TURN_BEGIN                                                                                \
    ISSUE_O((it) - 1, BN / 16);                                                               \
    tf_wgmma_wait<0>();                                                                       \
    tf_fence_regs(o);                                                                         \
    tf_mbar_arrive(empty_v + SLOT((it) - 1));                                                 \
    ISSUE_S_INTO(acc, mma, it);                                                               \
    TURN_END                                                                                  \
    tf_wgmma_wait<0>();                                                                       \
    S_LANDED_INTO(acc, it);                                                                   \
    SOFTMAX_INTO(acc, it, keys);                                                              \
    rescale(o, corr);                                                                         \
    pack_p(acc, p);                                                                           \
  }}
#endif

  // With PINGPONG the consumers issue their MMAs in turns (0, 1, …), so that one warpgroup's
  // softmax runs while another's products use the tensor cores (FlashAttention-3's ping-pong).
  // The last warpgroup opens the first turn; the first one takes the extra turn at the end. Both
  // take the same number of turns in every tile, so the turns run on across tiles.
#if PINGPONG
  if (cw == CONSUMERS - 1) tf_turn_pass(cw);
#endif
  // A tile's output, written once the next tile's first q·kᵀ is on the tensor cores (DEFER), so
  // that the stores overlap it: rows' element offsets (−1: past M), 16-byte pieces, log-sum-exps
  long pending_at[2] = {{-1, -1}};
  uint4 pending[2][D_ / 32];
  float pending_lse[2];
  elem_t* out_e = (elem_t*)out;
  auto write_out = [&]() {{
    #pragma unroll
    for (int x = 0; x < 2; ++x) {{
      if (pending_at[x] >= 0) {{
        uint4* dst = (uint4*)(out_e + pending_at[x]) + lane % 4;
        #pragma unroll
        for (int g = 0; g < D_ / 32; ++g) dst[4 * g] = pending[x][g];
#if LSE
        if (lane % 4 == 0) lse_out[pending_at[x] / D_] = pending_lse[x];
#endif
      }}
      pending_at[x] = -1;
    }}
  }};
  for (int k = 0;; ++k) {{
    tf_mbar_wait(tile_full + (k & 1), (k >> 1) & 1);
    const int tile = tile_ids[4 * (k & 1)];
#if !LISTS
    const int first = tile_ids[4 * (k & 1) + 1], count = tile_ids[4 * (k & 1) + 2];
#endif
    tf_mbar_arrive(tile_free + (k & 1));
    if (tile >= tiles) break;
    Tile w = tile_at(tile, row_blocks, pn, fn, H_, HKV_, N_);
#if !LISTS
    w.first = first;
    w.count = count;
#endif
    const int row_lo = w.rb * BM + cw * 64 + warp * 16 + lane / 4;
    const float kc_ = tf_key_bias(w.bh / H_, w.bh % H_{extra_args});
    #pragma unroll
    for (int r = 0; r < D_ / 2; ++r) o[r] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
    tf_mbar_wait(bar_q, k & 1);
    if (w.count > 0) {{
#if LAST_N < BN
      // whether this item ends with the sequence's last key block (LAST_N keys): its q·kᵀ at
      // that width, into accumulators of their own (ptxas serialises a kernel's wgmma where
      // two shapes write the same registers)
      const bool ends = __shfl_sync(0xffffffffu, w.first + w.count == C_, 0);
      float sn[LAST_N / 2];
      if (ends && w.count == 1)
        FIRST(sn, {sn_mma}, LAST_N)
      else
#endif
        FIRST(s, {s_mma}, BN)
#if LAST_N < BN
      for (int it = 1; it < w.count - 1; ++it) STEP(it, s, {s_mma}, BN);
      if (w.count > 1) {{
        if (ends)
          STEP(w.count - 1, sn, {sn_mma}, LAST_N)
        else
          STEP(w.count - 1, s, {s_mma}, BN)
      }}
#else
      for (int it = 1; it < w.count; ++it) STEP(it, s, {s_mma}, BN);
#endif
      TURN_BEGIN
      ISSUE_O(w.count - 1, LAST_STEPS(w.count - 1));
      TURN_END
      tf_wgmma_wait<0>();
      tf_fence_regs(o);
      tf_mbar_arrive(empty_v + SLOT(w.count - 1));
    }} else {{
      tf_mbar_arrive(q_free);      // no key block: the queries were not used
#if DEFER
      write_out();
#endif
    }}
    use += w.count;

    // o / l from the fragments, rows row_lo (registers r % 4 < 2) and row_lo + 8, packed to
    // 16-bit pairs: the four lanes of a row trade their pairs so that each holds 8 neighbouring
    // outputs — 16-byte stores, a row's 4 lanes writing 64 contiguous bytes (4-byte stores of 8
    // rows per warp instruction held up the tile's end: RESULTS.md, session 25)
    #pragma unroll
    for (int x = 0; x < 2; ++x) {{
      l[x] += __shfl_xor_sync(0xffffffffu, l[x], 1);
      l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
    }}
    // a piece of a split tile: the rows are written by the piece merged last (the others pack
    // their outputs all the same and drop them, so that `pending` is dead through the loop)
#if LISTS
    const bool keep = true;
#else
    const bool keep = (w.first == 0 && w.count == C_) ||
                      merge_piece(o, m, l, TAIL, tile, w.first, cw, t, work, counters, flags);
#endif
    #pragma unroll
    for (int x = 0; x < 2; ++x) {{
      const float inv = 1.0f / l[x];
      const int row = row_lo + 8 * x;
      #pragma unroll
      for (int g = 0; g < D_ / 32; ++g) {{
        unsigned a[4];
        #pragma unroll
        for (int j = 0; j < 4; ++j)
          a[j] = tf_pack(o[4 * (4 * g + j) + 2 * x] * inv, o[4 * (4 * g + j) + 2 * x + 1] * inv);
        pending[x][g] = tf_quad_transpose(a, lane);
      }}
#if TILED
      bool ok;
      const int token = tf_row_token(row, ok);   // row: a position of the tiled order
      pending_at[x] = keep && ok ? ((long)w.bh * M_ + token) * D_ : -1;
#else
      pending_at[x] = keep && row < M_ ? ((long)w.bh * M_ + row) * D_ : -1;
#endif
      // m and l are in base 2 of the score: ln Σ e^s = (m + log2 l) · ln 2; −inf when empty
      pending_lse[x] = (m[x] + log2f(l[x])) * 0.6931471805599453f;
    }}
#if !DEFER
    write_out();
#endif
  }}
  write_out();   // the last tile's
#if PINGPONG
  if (cw == 0) tf_turn_wait(cw);   // the turn the last warpgroup opened
#endif
}}
"""
