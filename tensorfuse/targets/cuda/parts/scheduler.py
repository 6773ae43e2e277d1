"""Tile schedulers: how CTAs walk a kernel's tiles — one CTA a tile, persistent CTAs claiming
tiles from a counter or in alternating rounds, and the last round's tiles cut along the keys into
pieces every CTA takes."""
from __future__ import annotations

import math

# how CTAs take tiles (the attention kernel's ``mode`` argument)
GRID, DYNAMIC, SNAKE, SPLIT = 0, 1, 2, 3
MODES = {"grid": GRID, "dynamic": DYNAMIC, "snake": SNAKE, "split": SPLIT}
# split tiles: pieces of at least this many key blocks (each piece's partial costs its merger a
# read of 34 KB a warpgroup at D = 128, about a third of a 176-key block's products)
MIN_PIECE = 4
# a split tile of this many pieces or more is merged in rounds (TREE_FAN pieces, or merged
# runs, a group): the one merger's serial reads of its pieces' partials otherwise set the
# kernel's end — one (batch, kv-head) pair of a packed decode cut over 132 CTAs read 131
# partials in turn (benchmarks.packed_decode, B1 64 heads at 131k keys: 86 µs, 46 on the cluster
# decode; 47.5 in two rounds of about √n); below it a round's fence and arrival cost about what
# the reads it saves do
TREE_FROM = 9
# pieces (or runs) a merge round takes: 0 for ⌈√n⌉ (two rounds). Measured on five few-pair
# packed decodes (B1–2, 32–128 heads, 8k–131k keys): fans 3, 4 and 6 within −4 … +6 % of it, 2
# (seven rounds at 128 pieces) 5–11 % slower — a round's fence and arrival cost about three
# partials' reads
TREE_FAN = 0


def merge_rounds(ctas: int) -> int:
    """The most merge rounds before a split tile's last (each with its own counters): a tile has
    at most ``ctas`` pieces and a round merges two or more."""
    return max(1, math.ceil(math.log2(max(ctas, 2))))

# MODE_SPLIT's tail (host and device code: the tests run it on the CPU).
TAIL_HELPERS = r"""
// MODE_SPLIT's tail: the last `tiles % ctas` tiles (C key blocks each), which would leave
// CTAs idle in a last partial round, cut into `pieces` of L consecutive key blocks -- a piece may
// end one tile and begin the next -- claimed after the whole tiles. The partial states of a
// tile's pieces are merged by whichever of them finishes last; no CTA waits for another.
struct Tail {
  int tile0;    // the first split tile (the tiles before it run whole)
  int C;        // key blocks of a tile
  int L;        // key blocks of a piece
  int pieces;   // pieces (0: nothing is split)
  int units;    // key blocks of the split tiles
};
__host__ __device__ __forceinline__ Tail tail_of(int tiles, int ctas, int C, bool split) {
  Tail s;
  const int r = split ? tiles % ctas : 0;
  int L = (r * C + ctas - 1) / ctas;
  L = L < MIN_PIECE ? MIN_PIECE : L;
  s.C = C;
  if (r == 0 || L >= C) {   // nothing to gain: every tile whole
    s.tile0 = tiles; s.L = C; s.pieces = 0; s.units = 0;
    return s;
  }
  s.tile0 = tiles - r; s.L = L; s.units = r * C; s.pieces = (s.units + L - 1) / L;
  return s;
}
// Work `c` of a launch (tile0 whole tiles, then the pieces) is one or two items: its x-th (0 or
// 1) is tile t's key blocks f … f + n - 1. False: it has no x-th item.
__host__ __device__ __forceinline__ bool item_at(int c, const Tail& s, int x, int& t, int& f,
                                                 int& n) {
  if (c < s.tile0) {
    t = c; f = 0; n = s.C;
    return x == 0;
  }
  if (x > 1) return false;
  int u = (c - s.tile0) * s.L;
  const int u1 = u + s.L < s.units ? u + s.L : s.units;
  if (x) u = (u / s.C + 1) * s.C;   // the piece's continuation into the next tile
  if (u >= u1) return false;
  const int tl = u / s.C, end = u1 < (tl + 1) * s.C ? u1 : (tl + 1) * s.C;
  t = s.tile0 + tl; f = u - tl * s.C; n = end - u;
  return true;
}
// The pieces holding key blocks of split tile `tl`: lo … hi.
__host__ __device__ __forceinline__ int first_piece(const Tail& s, int tl) {
  return tl * s.C / s.L;
}
__host__ __device__ __forceinline__ int last_piece(const Tail& s, int tl) {
  return ((tl + 1) * s.C - 1) / s.L;
}
// The workspace slot of piece p's part in split tile tl: 2p for the part it begins with, 2p + 1
// for its continuation into the next tile.
__host__ __device__ __forceinline__ int piece_slot(const Tail& s, int tl, int p) {
  return 2 * p + (p * s.L < tl * s.C ? 1 : 0);
}
// How split tile tl's pieces are merged: in rounds, each merging groups of merge_fan runs (a
// run: consecutive pieces whose states are merged into the slot of its first piece; a piece is a
// run of one) by the group's last arrival — the last round the whole tile, by its last arrival,
// which writes the rows. Under TREE_FROM pieces one round: the last piece merges every other.
__host__ __device__ __forceinline__ int merge_fan(const Tail& s, int tl) {
  const int n = last_piece(s, tl) - first_piece(s, tl) + 1;
  if (n < TREE_FROM) return n;
  if (TREE_FAN > 1) return TREE_FAN;
  int g = 2;
  while (g * g < n) ++g;
  return g;
}
// Round `round` of piece p's merge in split tile tl (runs of `span` = merge_fan^round pieces):
// its group's first and last pieces, the arrivals that complete the group, whether it is the
// tile's last round, and the group's counter — past the launch's first two, in units of the
// consumer warpgroups': per tile for the last round, per (round, slot of the group's first
// piece) before it, `ctas` CTAs' worth of each.
struct MergeRound {
  int g0, g1, arrivals, counter;
  bool last;
};
__host__ __device__ __forceinline__ MergeRound merge_round(const Tail& s, int tl, int p, int span,
                                                           int round, int ctas) {
  const int lo = first_piece(s, tl), hi = last_piece(s, tl), width = span * merge_fan(s, tl);
  MergeRound r;
  r.last = width > hi - lo;
  r.g0 = r.last ? lo : lo + (p - lo) / width * width;
  r.g1 = r.last || r.g0 + width - 1 > hi ? hi : r.g0 + width - 1;
  r.arrivals = (r.g1 - r.g0) / span + 1;
  r.counter = r.last ? tl : ctas * (1 + 2 * round) + piece_slot(s, tl, r.g0);
  return r;
}
"""


def attention_defines(c) -> str:
    """The ``mode`` argument's values and the split tiles' smallest piece."""
    return f"""#define MODE_GRID {GRID}      // the ``mode`` argument: how CTAs take tiles
#define MODE_DYNAMIC {DYNAMIC}
#define MODE_SPLIT {SPLIT}
#define MODE_SNAKE {SNAKE}
#define MIN_PIECE {MIN_PIECE}
#define TREE_FROM {TREE_FROM}
#define TREE_FAN {TREE_FAN}
"""


def attention_claim_loop_begin(c) -> str:
    """The producer's claims: each work of the launch (whole tiles, then split pieces) handed to
    the consumers through the two tile slots."""
    return """      const Tail tail = TAIL;
      const int works = tail.tile0 + tail.pieces;   // whole tiles, then pieces
      int use = 0;   // key/value blocks loaded so far: the ring's slot and phase run on
      int k = 0;     // items handed to the consumers
      for (int claim = 0, done = 0; !done; ++claim) {
        const int c = claim_tile(claim, mode, counters, works);
        for (int x = 0;; ++x, ++k) {
          int t = tiles, f = 0, n = 0;   // `tiles`: none left
          if (c < works && !item_at(c, tail, x, t, f, n)) break;   // the claim's items handed on
          if (k >= 2) tf_mbar_wait(tile_free + (k & 1), ((k >> 1) - 1) & 1);
          tile_ids[4 * (k & 1)] = t;
          tile_ids[4 * (k & 1) + 1] = f;
          tile_ids[4 * (k & 1) + 2] = n;
          tf_mbar_arrive(tile_full + (k & 1));
          if (t >= tiles) {
            done = 1;
            break;
          }
          Tile w = tile_at(t, row_blocks, pn, fn, H_, HKV_, N_);
#if !LISTS
          w.first = f;
          w.count = n;
#endif
"""


def attention_claim_loop_end(c) -> str:
    """The end of the claims: the last CTA out resets the tile counters for the next launch."""
    return """        }
      }
      // the last CTA out resets the counters for the next launch
      if (mode == MODE_DYNAMIC || mode == MODE_SPLIT) {
        __threadfence();
        if (atomicAdd(counters + 1, 1) == (int)gridDim.x - 1) {
          atomicExch(counters, 0);
          atomicExch(counters + 1, 0);
        }
      }
    }
    return;
  }
"""


def attention_consumer_tile(c) -> str:
    """A consumer's next tile from the producer's slots (its key blocks in split pieces)."""
    return """  for (int k = 0;; ++k) {
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
"""


def attention_tile_functions(c) -> str:
    """A tile's row block, heads and key-block schedule (a mask over the positions alone: one
    batch·head's lists, read by all)."""
    return f"""// Tile `t` (batch·head-major, longest row block first): its row block, batch·head, kv-head and
// key-block schedule — `count` blocks, the first `n_partial` of them partial (from the lists at
// `base`). Kept small: the producer runs on 32 registers, and a consumer at block_n = 176 on
// nearly all of its 240.
struct Tile {{
  int rb, bh, kv, n_partial, first, count;
  unsigned base;
}};
__device__ __forceinline__ Tile tile_at(int t, int row_blocks, const int* pn, const int* fn,
                                        int H_, int HKV_, int N_) {{
  Tile w;
  w.bh = t / row_blocks;
  w.rb = row_blocks - 1 - t % row_blocks;
  w.kv = (w.bh / H_) * HKV_ + (w.bh % H_) / (H_ / HKV_);
#if LISTS
  const int at = {"" if c.shared_lists else "w.bh * row_blocks + "}w.rb;
  w.base = (unsigned)at * (unsigned)(TILED ? WINDOWS : (N_ + BN - 1) / BN);
  w.n_partial = pn[at];
  w.count = pn[at] + fn[at];
#else
  w.base = 0;
  w.n_partial = 0;
  w.first = 0;
  w.count = (N_ + BN - 1) / BN;
#endif
  return w;
}}
// The it-th key block of a tile's schedule.
__device__ __forceinline__ int key_block(const Tile& w, int it, const int* pi, const int* fi) {{
#if LISTS
  return it < w.n_partial ? pi[w.base + it] : fi[w.base + it - w.n_partial];
#else
  return w.first + it;
#endif
}}

{TAIL_HELPERS}
"""


def attention_claim_function(c) -> str:
    """The next work of a CTA, by ``mode``."""
    return """// The k-th work of this CTA (`works` or more: none left). Called by the producer thread only.
__device__ __forceinline__ int claim_tile(int k, int mode, int* counters, int works) {
  if (k == 0) return mode == MODE_GRID ? blockIdx.y * gridDim.x + blockIdx.x : blockIdx.x;
  if (mode == MODE_GRID) return works;
  if (mode != MODE_SNAKE) return atomicAdd(counters, 1) + gridDim.x;
  const int g = gridDim.x;
  return k * g + ((k & 1) ? g - 1 - (int)blockIdx.x : (int)blockIdx.x);
}"""


def gemm_work(c) -> str:
    """A work item: a whole tile, or a piece of a split tile's k-blocks."""
    return """// Work item `item`: the first `full_items` are whole tiles (units); the rest split the last
// `tail` units' k-blocks into `pieces` ranges each (slot: the piece's partial in ws).
struct Work {
  int unit, k0, k1, piece, slot;
};
__device__ __forceinline__ Work work_of(int item, int full_items, int pieces, int kblocks) {
  Work w;
  if (item < full_items) {
    w.unit = item; w.k0 = 0; w.k1 = kblocks; w.piece = -1; w.slot = 0;
  } else {
    const int j = item - full_items;
    w.unit = full_items + j / pieces;
    w.piece = j % pieces;
    w.slot = j;
    w.k0 = kblocks * w.piece / pieces;
    w.k1 = kblocks * (w.piece + 1) / pieces;
  }
  return w;
}
"""


def gemm_tile_order(c) -> str:
    """Tiles in grouped order (``group_m`` row units a group), a cluster's CTAs on neighbouring
    row tiles; with a batch axis, each batch's tiles so, one batch after another."""
    if c.batched:
        what, z_param = "the origin (m0, n0) of its tile in this CTA and its batch z", \
            ",\n                                        int& z"
        unit = """  z = w.unit / (row_units * tiles_n);   // the batch; its tiles as unbatched
  tile_of(w.unit - z * row_units * tiles_n, row_units, tiles_n, group_m, mu, nt);"""
    else:
        what, z_param = "the origin (m0, n0) of its tile in this CTA", ""
        unit = "  tile_of(w.unit, row_units, tiles_n, group_m, mu, nt);"
    return f"""
// Tile `u` of the grouped order over (row units, column tiles): group_m row units per group, the
// column tiles of a group in order, the row units of a column tile next to each other.
__device__ __forceinline__ void tile_of(int u, int row_units, int tiles_n, int group_m, int& mu,
                                        int& nt) {{
  const int per_group = group_m * tiles_n;
  const int group = u / per_group;
  const int first = group * group_m;
  const int rows = min(row_units - first, group_m);
  const int in = u - group * per_group;
  mu = first + in % rows;
  nt = in / rows;
}}

// Work item `item`'s k-blocks and {what}.
__device__ __forceinline__ Work tile_at(int item, int full_items, int pieces, int kblocks,
                                        int row_units, int tiles_n, int group_m, unsigned rank,
                                        int& m0, int& n0{z_param}) {{
  const Work w = work_of(item, full_items, pieces, kblocks);
  int mu, nt;
{unit}
  m0 = (mu * CLUSTER + (int)rank) * BM;
  n0 = nt * BN;
  return w;
}}
"""
