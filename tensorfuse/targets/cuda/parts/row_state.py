"""Row states: what a sweep keeps per row and how it is corrected as the sweep moves on — the
score the program writes, the online softmax in base 2, the rescale of the output — emitted from
the plan (the score and mask from the program's expression)."""
from __future__ import annotations


def attention_defines(c) -> str:
    """The base-2 constant and the margin by which a row's maximum may grow before it moves."""
    return """#define TF_LOG2E 1.4426950408889634f
#define RESCALE_MARGIN 8.0f   // a row's running maximum moves once it grows by more (base 2)
"""


def attention_softmax_macro(c) -> str:
    """A block's score and online softmax, once its ``q·kᵀ`` has landed (and, where the score
    reads a tensor as tiles, once the block's tile has; the tile is released after the score).
    The lines below end in Python's line continuation: the macro is one line of C++."""
    tile, arg, free = "", "", ""
    if c.score_tile is not None:
        within = f"(lane % 4) * {2 * _bytes(c)}" if c.score_tile.strip else \
            "(cw * 64 + warp * 16 + lane / 4) * 128 + (lane % 4) * 4"
        tile = (f"    const unsigned tt_ = tf_smem_addr(score_tiles) + SLOT(it) * T_BYTES + "
                f"{within};   tf_mbar_wait(full_t + SLOT(it), PHASE(it));   ")
        arg = ", tt_"
        free = ("    tf_mbar_arrive(empty_t + SLOT(it));   /* the tile is read: free to refill */"
                "   \\\n")
    return f"""  // the score and softmax of block `it` (`keys` wide), whose q·kᵀ has landed in `acc`
#define SOFTMAX_INTO(acc, it, keys)                                                         \
  {{                                                                                          \
    const int n0 = key_block(w, it, pi, fi) * BN;                                             \
{tile}    if ((it) < w.n_partial || (!TILED && n0 + (keys) > N_))                                   \
      score_block<true>(acc, row_lo, n0, w.bh / H_, w.bh % H_, lane, SCORE_ARGS{arg});             \
    else                                                                                      \
      score_block<false>(acc, row_lo, n0, w.bh / H_, w.bh % H_, lane, SCORE_ARGS{arg});            \
{free}    softmax_block(acc, m, l, corr, scale2);                                                   \
  }}
"""


def attention_exp2(c) -> str:
    """Base-2 exponent on the SFU."""
    return """__device__ __forceinline__ float tf_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
"""


def attention_score_function(c) -> str:
    """A block's score: the program's expression on the accumulator fragments, masked where the
    block is partial."""
    tile = c.score_tile is not None
    reader = "" if not tile else _strip_reader(c) if c.score_tile.strip else _score_tile_reader()
    return f"""{reader}// S of one key block (R = its keys / 2 registers: BN, or LAST_N for the sequence's last): the
// program's score on the fragment before its base-2 factor `scale2` (applied by softmax_block),
// masked (−∞) where `MASKED`.
// Fragment register r of warp w, lane l: row 16w + l/4 + 8·((r%4)/2),
// column 8·(r/4) + 2·(l%4) + r%2.
template <bool MASKED, int R>
__device__ __forceinline__ void score_block(float (&s)[R], int row_lo, int n0, int b, int h,
    int lane, const unsigned (&mw)[MASK_WORDS], float scale2, float kc_{c.extra_params}{
        ", unsigned tt_" if tile else ""}) {{
{"  tile_pair_t tb2_;" + chr(10) if tile else ""}  const int i0_ = row_lo, j0_ = n0 + 2 * (lane % 4);   // the fragment's first row and column
{c.begin}
  #pragma unroll
  for (int r = 0; r < R; ++r) {{
    const int di_ = 8 * ((r % 4) / 2), dj_ = 8 * (r / 4) + (r % 2);   // constants once unrolled
    const int i_ = i0_ + di_;
    const int j_ = j0_ + dj_;
    const float qk = s[r];
{_tile_element(c) if tile else ""}    float v = {c.score};
#if TILED
    if (MASKED) v = ((mw[r / 32] >> (r % 32)) & 1u) ? v : -INFINITY;
#else
{c.masked}
#endif
    s[r] = v;
  }}
}}

"""


def _bytes(c) -> int:
    return 4 if c.score_tile.dtype == "f32" else 2


def _tile_element(c) -> str:
    """The score tile's (or strip's) element at register ``r`` (its pair loaded at even ``r``)."""
    pick = "r % 2 ? tb2_.y : tb2_.x" if _bytes(c) == 4 else \
        "r % 2 ? __high2float(tb2_) : __low2float(tb2_)"
    # a strip's pair is the same for the fragment's two rows (r and r + 2): loaded once, so
    # that what the score computes of it (a reciprocal) is computed once too
    read = "tf_key_strip_pair(tt_, r)" if c.score_tile.strip else \
        "tf_score_tile_pair(tt_, r, lane)"
    return (f"    if (r % {4 if c.score_tile.strip else 2} == 0) tb2_ = {read};\n"
            f"    const float tb_ = {pick};\n")


def _strip_reader(c) -> str:
    """A key strip's two elements at fragment register r, from shared memory."""
    wide = _bytes(c) == 4
    load = ('asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(pair.x), "=f"(pair.y)'
            if wide else 'asm volatile("ld.shared.b32 %0, [%1];" : "=r"(*(unsigned*)&pair)')
    return f"""// Two elements of the key strip at fragment register r (even: r and r + 1 — columns
// 8·(r/4) + 2·(l%4) and the next — of the slot): `tt` is the slot's shared-memory address plus
// this thread's pair's offset; the four lanes of a row read four distinct pairs, the eight rows
// the same ones (a broadcast).
__device__ __forceinline__ tile_pair_t tf_key_strip_pair(unsigned tt, int r) {{
  tile_pair_t pair;
  {load}
               : "r"(tt + (r / 4) * {8 * _bytes(c)}));
  return pair;
}}
"""


def _score_tile_reader() -> str:
    """The score tile's element at a fragment register, from shared memory."""
    return """// Two elements of the score tile at fragment register r (even: r and r + 1 — row
// 16w + l/4 + 8·((r%4)/2), columns 8·(r/4) + 2·(l%4) and the next — of the slot): rows of 64
// keys (128 bytes; a box each 64 keys) in TMA's 128-byte swizzle, a row's 16-byte chunk c at
// c ^ (row % 8), and row % 8 = l/4 here. `tt` is the slot's shared-memory address plus this
// thread's row · 128 and its pair's 4 bytes: one 32-bit load, a warp's in 32 distinct banks.
__device__ __forceinline__ tile_pair_t tf_score_tile_pair(unsigned tt, int r, int lane) {
  const int chunk = ((r / 4) % 8) ^ (lane / 4);
  unsigned bits;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(bits)
               : "r"(tt + (r / 32) * (BM * 128) + ((r % 4) / 2) * 1024 + chunk * 16));
  return *reinterpret_cast<const tile_pair_t*>(&bits);
}
"""


def attention_softmax_functions(c) -> str:
    """A block's online softmax in base 2, and the branch that ends its basic block. Where the
    score reads a tensor as tiles (a mask may hold its dtype's lowest value), a block whose rows'
    scores are huge takes them to base 2 first, bounded: see :data:`_HUGE_ROWS`."""
    return _SOFTMAX_FUNCTIONS.replace("@HUGE_ROWS@", _HUGE_ROWS if c.score_tile else "")


# A warp's rows whose base-2 scores pass 2^20 (a mask's lowest values, −3.39e38 in bf16 as
# transformers writes masks): FlashAttention-3's fold (one FFMA s·k − m against the rounded
# maximum m) leaves a residual of half an ulp of m (2^(10^30) at 1e38: inf), and s·k itself
# overflows past 2.4e38 (a row of nothing else: 0/0 where the math weighs its keys equally). In
# such a block the scores are scaled first, the finite ones bounded by ±1e38: subtractions of
# base-2 scores of one magnitude are exact. ±∞ stay (a row of −∞ gives 0/0, as the unfused
# program does). Other blocks keep the fold: the check is a vote per block, not work per score
# (benchmarks.unlisted_kernels, biased_attention_bshd: bounding every score cost 14 %).
_HUGE_ROWS = """  if (__any_sync(0xffffffffu, !(fabsf(mx[0] * k) <= 0x1p20f && fabsf(mx[1] * k) <= 0x1p20f))) {
    #pragma unroll
    for (int r = 0; r < R; ++r)
      s[r] = fabsf(s[r]) == INFINITY ? s[r] : fminf(fmaxf(s[r], -1e38f), 1e38f) * k;
    #pragma unroll
    for (int x = 0; x < 2; ++x)
      mx[x] = fabsf(mx[x]) == INFINITY ? mx[x] : fminf(fmaxf(mx[x], -1e38f), 1e38f) * k;
    k = 1.0f;
  }
"""


_SOFTMAX_FUNCTIONS = """// Online softmax of one block in base 2: new row maxima (two rows per thread), the correction of
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
                                              float (&corr)[2], float scale2) {
  float k = scale2;
  if (!(scale2 > 0.0f)) {
    #pragma unroll
    for (int r = 0; r < R; ++r) s[r] = s[r] == -INFINITY ? -INFINITY : s[r] * scale2;
    k = 1.0f;
  }
  float mx[2] = {s[0], s[2]};
  #pragma unroll
  for (int r = 0; r < R; ++r) mx[(r % 4) / 2] = fmaxf(mx[(r % 4) / 2], s[r]);
@HUGE_ROWS@  #pragma unroll
  for (int x = 0; x < 2; ++x) mx[x] = fmaxf(m[x], mx[x] * k);
  #pragma unroll
  for (int x = 0; x < 2; ++x) {
    mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
    mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
    const bool grows = mx[x] > m[x] + RESCALE_MARGIN;   // (m = −∞: any finite maximum)
    const float kept = grows ? mx[x] : m[x];
    const float use = kept == -INFINITY ? 0.0f : kept;   // a row with nothing seen yet
    corr[x] = grows ? tf_exp2(m[x] - use) : 1.0f;
    m[x] = kept;
    mx[x] = use;
    l[x] *= corr[x];
  }
  #pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r] = tf_exp2(fmaf(s[r], k, -mx[(r % 4) / 2]));
    l[(r % 4) / 2] += s[r];
  }
}

// A branch that never runs (a row sum is never negative), ending the basic block after a block's
// softmax: ptxas schedules within one, and hoisted the wait for the previous block's p·v above
// the softmax (in every variant's SASS) — the warpgroup waited out its own p·v
// before its maximum and exps. With the branch the wait follows ~80 of a 176-key block's 90 exps
// (no new spills); a sleep, not a trap, in it: a trap there made ptxas spill hundreds of bytes.
__device__ __forceinline__ void tf_block_end(const float (&l)[2]) {
  if (l[0] < 0.0f) asm volatile("nanosleep.u32 0;");
}

"""


def attention_rescale(c) -> str:
    """``o``'s rows times their corrections."""
    return """// o's rows times their corrections — skipped where every row of the warp kept its m.
__device__ __forceinline__ void rescale(float (&o)[DV_ / 2], const float (&corr)[2]) {
  if (!__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) return;
  #pragma unroll
  for (int r = 0; r < DV_ / 2; ++r) o[r] *= corr[(r % 4) / 2];
}

"""
