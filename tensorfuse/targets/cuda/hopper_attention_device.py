"""The device functions of the warp-specialised attention kernel (:mod:`.hopper_attention`
writes the kernel around them): base-2 exponent, the consumers' turns, wgmma descriptors of the
query, key and value tiles, a block's score (the program's expression on the accumulator
fragments, masked where the block is partial) and online softmax, ``P`` packed for ``P·V``,
``O``'s rescale, the tile list and its key blocks, the ``"split"`` schedule's tail and the merge
of its pieces, and the claim of the next tile. They read the kernel's ``#define``s (``BN``,
``D_``, ``CONSUMERS``, …), so they are emitted after them."""
from __future__ import annotations

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
"""


def device_functions(pair: str, pack: str, score: str, masked: str, extra_params: str,
                     begin: str = "") -> str:
    """C++ of the functions, for 16-bit pairs of type ``pair`` made by ``pack``, the score
    ``score`` of ``qk`` (and the indices ``b``, ``h``, ``i_``, ``j_``), the masking statement
    ``masked`` of a partial block and the parameters ``extra_params`` (tensors, sizes, scalars)
    the score and mask read; ``begin``: a statement a block's score starts with (a key-linear
    bias's per-block terms)."""
    return f"""__device__ __forceinline__ float tf_exp2(float x) {{
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}}
// Named barriers for the consumers' turns (ids 1 … CONSUMERS; 0 is __syncthreads): a warpgroup
// waits for its turn with bar.sync, hands it on with bar.arrive (128 + 128 threads each).
__device__ __forceinline__ void tf_turn_wait(int cw) {{
  asm volatile("bar.sync %0, 256;" :: "r"(1 + cw) : "memory");
}}
__device__ __forceinline__ void tf_turn_pass(int cw) {{
  asm volatile("bar.arrive %0, 256;" :: "r"(1 + (cw + 1) % CONSUMERS) : "memory");
}}
__device__ __forceinline__ unsigned tf_pack(float lo, float hi) {{
  {pair} v = {pack}(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}}
// K-major 128-byte-swizzled tile (atoms of 64 along the head dim): the wgmma descriptor of its
// first k16 step from row `row0` (step `ks` of a tile of `rows` rows: + kmajor_step(rows, ks)).
__device__ __forceinline__ unsigned long long kmajor_desc(unsigned tile, int row0) {{
  return tf_smem_desc_sw128_at(tile + row0 * 128, 16, 1024);
}}
// MN-major (the values: head dim contiguous) tile of BN key rows: k16 step `ks` over the keys.
__device__ __forceinline__ unsigned long long vmajor_desc(unsigned tile, int ks) {{
  return tf_smem_desc_sw128_at(tile + ks * 16 * 128, BN * 128, 1024);
}}
// What k16 step `ks` adds to kmajor_desc of a tile of `rows` rows: the descriptor's low field is
// the address / 16, and a shared-memory address (< 228 KB) never carries out of its 14 bits — so
// a block's q·kᵀ descriptors are one descriptor and constants, not a shift and masks per wgmma in
// the issuing warps (Nsight Compute, RESULTS.md session 31). p·v keeps vmajor_desc per wgmma, and
// the queries' descriptor is made again each block rather than kept across the loop: either
// way the other made ptxas spill in the consumers of the 176-key causal kernel.
__device__ __forceinline__ constexpr unsigned kmajor_step(int rows, int ks) {{
  return ((ks / 4) * rows * 128 + (ks % 4) * 32) >> 4;
}}
// `desc` moved on by `step` (the address / 16): added to the low word only — no carry to make,
// one add per wgmma (a 64-bit add cost an add with carry and moves).
__device__ __forceinline__ unsigned long long tf_desc_plus(unsigned long long desc,
                                                           unsigned step) {{
  return (desc & 0xFFFFFFFF00000000ull) | (unsigned)((unsigned)desc + step);
}}

// S of one key block (R = its keys / 2 registers: BN, or LAST_N for the sequence's last): the
// program's score on the fragment before its base-2 factor `scale2` (applied by softmax_block),
// masked (−∞) where `MASKED`.
// Fragment register r of warp w, lane l: row 16w + l/4 + 8·((r%4)/2),
// column 8·(r/4) + 2·(l%4) + r%2.
template <bool MASKED, int R>
__device__ __forceinline__ void score_block(float (&s)[R], int row_lo, int n0, int b, int h,
    int lane, const unsigned (&mw)[MASK_WORDS], float scale2, float kc_{extra_params}) {{
  const int i0_ = row_lo, j0_ = n0 + 2 * (lane % 4);   // the fragment's first row and column
{begin}
  #pragma unroll
  for (int r = 0; r < R; ++r) {{
    const int di_ = 8 * ((r % 4) / 2), dj_ = 8 * (r / 4) + (r % 2);   // constants once unrolled
    const int i_ = i0_ + di_;
    const int j_ = j0_ + dj_;
    const float qk = s[r];
    float v = {score};
#if TILED
    if (MASKED) v = ((mw[r / 32] >> (r % 32)) & 1u) ? v : -INFINITY;
#else
{masked}
#endif
    s[r] = v;
  }}
}}

// Online softmax of one block in base 2: new row maxima (two rows per thread), the correction of
// the old state, P = 2^(S·scale2 - m) in place, the thread's share of the row sums. With a
// positive factor the largest score times it is the largest base-2 score, and each element costs
// one FFMA and one ex2 (FlashAttention-3's fold); any other factor (never 1/√d) scales first.
// A row's m moves only when its maximum grows by more than RESCALE_MARGIN (base 2): below that
// m stays where it was — P, l and o are all taken against the same m, so o / l and the
// log-sum-exp are the same numbers, with P ≤ 2^RESCALE_MARGIN (in range for f16/bf16) — and the
// correction is 1, so the warps whose rows all kept theirs skip rescaling o (after the first
// blocks, nearly every block).
template <int R>
__device__ __forceinline__ void softmax_block(float (&s)[R], float (&m)[2], float (&l)[2],
                                              float (&corr)[2], float scale2) {{
  float k = scale2;
  if (!(scale2 > 0.0f)) {{
    #pragma unroll
    for (int r = 0; r < R; ++r) s[r] = s[r] == -INFINITY ? -INFINITY : s[r] * scale2;
    k = 1.0f;
  }}
  float mx[2] = {{s[0], s[2]}};
  #pragma unroll
  for (int r = 0; r < R; ++r) mx[(r % 4) / 2] = fmaxf(mx[(r % 4) / 2], s[r]);
  #pragma unroll
  for (int x = 0; x < 2; ++x) mx[x] = fmaxf(m[x], mx[x] * k);
  #pragma unroll
  for (int x = 0; x < 2; ++x) {{
    mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
    mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
    const bool grows = mx[x] > m[x] + RESCALE_MARGIN;   // (m = −∞: any finite maximum)
    const float kept = grows ? mx[x] : m[x];
    const float use = kept == -INFINITY ? 0.0f : kept;   // a row with nothing seen yet
    corr[x] = grows ? tf_exp2(m[x] - use) : 1.0f;
    m[x] = kept;
    mx[x] = use;
    l[x] *= corr[x];
  }}
  #pragma unroll
  for (int r = 0; r < R; ++r) {{
    s[r] = tf_exp2(fmaf(s[r], k, -mx[(r % 4) / 2]));
    l[(r % 4) / 2] += s[r];
  }}
}}

// A branch that never runs (a row sum is never negative), ending the basic block after a block's
// softmax: ptxas schedules within one, and hoisted the wait for the previous block's p·v above
// the softmax (every variant's SASS, sessions 37-38) — the warpgroup waited out its own p·v
// before its maximum and exps. With the branch the wait follows ~80 of a 176-key block's 90 exps
// (no new spills); a sleep, not a trap, in it: a trap there made ptxas spill hundreds of bytes.
__device__ __forceinline__ void tf_block_end(const float (&l)[2]) {{
  if (l[0] < 0.0f) asm volatile("nanosleep.u32 0;");
}}

// Lanes 4r … 4r + 3 (one row of the fragment) each hold a[j], the packed pair at columns
// 8·j + 2·(lane % 4); returned: lane q's 16 bytes at columns 8·q … 8·q + 7, the pairs of lanes
// 0 … 3 in turn. Two exchanges of 2×2 blocks (lanes q ^ 2, then q ^ 1): 4 shuffles, no indexing
// of registers by the lane.
__device__ __forceinline__ uint4 tf_quad_transpose(const unsigned (&a)[4], int lane) {{
  const bool hi = lane & 2, odd = lane & 1;
  const unsigned s0 = __shfl_xor_sync(0xffffffffu, hi ? a[0] : a[2], 2);
  const unsigned s1 = __shfl_xor_sync(0xffffffffu, hi ? a[1] : a[3], 2);
  const unsigned n0 = hi ? s0 : a[0], n1 = hi ? s1 : a[1];
  const unsigned n2 = hi ? a[2] : s0, n3 = hi ? a[3] : s1;
  const unsigned t0 = __shfl_xor_sync(0xffffffffu, odd ? n0 : n1, 1);
  const unsigned t1 = __shfl_xor_sync(0xffffffffu, odd ? n2 : n3, 1);
  return odd ? make_uint4(t0, n1, t1, n3) : make_uint4(n0, t0, n2, t1);
}}

// P of a block of 2·R keys into its first R / 8 16-key steps.
template <int R>
__device__ __forceinline__ void pack_p(const float (&s)[R], uint4 (&p)[BN / 16]) {{
  #pragma unroll
  for (int t = 0; t < R / 8; ++t)
    p[t] = make_uint4(tf_pack(s[8 * t], s[8 * t + 1]), tf_pack(s[8 * t + 2], s[8 * t + 3]),
                      tf_pack(s[8 * t + 4], s[8 * t + 5]), tf_pack(s[8 * t + 6], s[8 * t + 7]));
}}

// o's rows times their corrections — skipped where every row of the warp kept its m.
__device__ __forceinline__ void rescale(float (&o)[D_ / 2], const float (&corr)[2]) {{
  if (!__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) return;
  #pragma unroll
  for (int r = 0; r < D_ / 2; ++r) o[r] *= corr[(r % 4) / 2];
}}

// Tile `t` (batch·head-major, longest row block first): its row block, batch·head, kv-head and
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
  const int at = w.bh * row_blocks + w.rb;
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
// A piece of a split tile (MODE_SPLIT): the warpgroup's partial state of its 64 rows -- o
// unscaled, each row's base-2 maximum and sum (summed over the row's lanes) -- goes to the
// workspace in fragment order; the warpgroup that completes the rows' pieces last (a counter per
// tile and warpgroup, which it resets) merges the others' into its own and returns true: it
// writes the output. Every thread writes and reads its own fragment's 16-byte pieces.
__device__ __forceinline__ bool merge_piece(float (&o)[D_ / 2], float (&m)[2], float (&l)[2],
    const Tail& s, int tile, int first, int cw, int t, float4* work, int* counters,
    volatile int* flags) {{
  const int tl = tile - s.tile0, p = (tl * s.C + first) / s.L;
  const int lo = first_piece(s, tl), hi = last_piece(s, tl);
  const long stride = (D_ / 8 + 1) * 128;   // float4s of one warpgroup's partial
  float4* mine = work + ((long)piece_slot(s, tl, p) * CONSUMERS + cw) * stride + t;
  #pragma unroll
  for (int r = 0; r < D_ / 8; ++r)
    __stcg(mine + r * 128, make_float4(o[4 * r], o[4 * r + 1], o[4 * r + 2], o[4 * r + 3]));
  __stcg(mine + (D_ / 8) * 128, make_float4(m[0], m[1], l[0], l[1]));
  // the warpgroup's own named barrier: ids past the consumers' turns
  if (!tf_arrived_last(counters + 2 + tl * CONSUMERS + cw, hi - lo + 1, 1 + CONSUMERS + cw, 128,
                       t == 0, flags + cw))
    return false;
  for (int q = lo; q <= hi; ++q) {{
    if (q == p) continue;
    const float4* theirs = work + ((long)piece_slot(s, tl, q) * CONSUMERS + cw) * stride + t;
    const float4 ml = __ldcg(theirs + (D_ / 8) * 128);
    const float mq[2] = {{ml.x, ml.y}}, lq[2] = {{ml.z, ml.w}};
    float a[2], b[2];
    #pragma unroll
    for (int x = 0; x < 2; ++x) {{
      const float mx = fmaxf(m[x], mq[x]);
      const float use = mx == -INFINITY ? 0.0f : mx;
      a[x] = tf_exp2(m[x] - use);
      b[x] = tf_exp2(mq[x] - use);
      m[x] = mx;
      l[x] = l[x] * a[x] + lq[x] * b[x];
    }}
    #pragma unroll
    for (int r = 0; r < D_ / 8; ++r) {{
      const float4 v = __ldcg(theirs + r * 128);
      o[4 * r] = o[4 * r] * a[0] + v.x * b[0];
      o[4 * r + 1] = o[4 * r + 1] * a[0] + v.y * b[0];
      o[4 * r + 2] = o[4 * r + 2] * a[1] + v.z * b[1];
      o[4 * r + 3] = o[4 * r + 3] * a[1] + v.w * b[1];
    }}
  }}
  return true;
}}
// The k-th work of this CTA (`works` or more: none left). Called by the producer thread only.
__device__ __forceinline__ int claim_tile(int k, int mode, int* counters, int works) {{
  if (k == 0) return mode == MODE_GRID ? blockIdx.y * gridDim.x + blockIdx.x : blockIdx.x;
  if (mode == MODE_GRID) return works;
  if (mode != MODE_SNAKE) return atomicAdd(counters, 1) + gridDim.x;
  const int g = gridDim.x;
  return k * g + ((k & 1) ? g - 1 - (int)blockIdx.x : (int)blockIdx.x);
}}"""
