"""Epilogues: what leaves the registers — the output normalised, packed and stored (16 bytes a
lane, deferred behind the next tile's first product), the log-sum-exps, and the merge of a split
tile's pieces."""
from __future__ import annotations

from . import swap


def attention_defines(c) -> str:
    """Whether a tile's stores wait for the next tile's first product, and whether the log-sum-
    exp is written; in a permuted layout, where (batch, head, row) lands in the output and the
    log-sum-exps."""
    return f"""// a tile's output stores wait for the next tile's first q·kᵀ (registers allow it up to DV = 128)
#define DEFER (DV_ <= 128)
#define LSE {int(bool(c.chain.lse))}   // write each row's log-sum-exp (natural log) to lse_out
""" + (_strided_offsets(c) if c.strided else "")


_EXTENTS = {"b": "B_", "h": "H_", "i": "M_", "d": "DV_"}


def _offset_macro(name: str, layout: str, padded: bool = False) -> str:
    """``name(b, h, i)``: the element offset of row ``i`` of (batch ``b``, head ``h``) in a
    tensor contiguous in ``layout`` (its axes by role, outermost first); ``padded``: its rows
    are ``OUT_DV_`` wide, narrower than the tiles."""
    extents = {**_EXTENTS, "d": "OUT_DV_"} if padded else _EXTENTS
    terms, stride = {}, []
    for role in reversed(layout):
        terms[role] = " * ".join(stride) or "1"
        stride.insert(0, extents[role] if len(stride) else f"(long){extents[role]}")
    return (f"#define {name}(b, h, i) ((long)(b) * {terms['b']} + (long)(h) * {terms['h']} + "
            f"(long)(i) * {terms['i']})\n")


def _strided_offsets(c) -> str:
    lse = _offset_macro("LSE_AT", c.chain.layouts[4]) if c.chain.lse else ""
    return ("// the output and log-sum-exps in the layout the program writes (axes by role: "
            f"{', '.join(c.chain.layouts[3:])})\n"
            + _offset_macro("OUT_AT", c.chain.layouts[3], c.padded) + lse)


# where a row's output and log-sum-exp go: the library layout, or by the layout's strides
_FLAT_ROW = "((long)w.bh * M_ + row) * DV_"
_FLAT_LSE = "lse_out[pending_at[x] / DV_]"
_STRIDED_ROW = "OUT_AT(w.bh / H_, w.bh % H_, row)"
_STRIDED_LSE = "lse_out[pending_lse_at[x]]"
_PENDING_LSE = "  float pending_lse[2];\n"
_PENDING_LSE_AT = "  long pending_lse_at[2];\n"
_LSE_VALUE = "      pending_lse[x] = (m[x] + log2f(l[x])) * 0.6931471805599453f;\n"
_LSE_AT = "      pending_lse_at[x] = LSE_AT(w.bh / H_, w.bh % H_, row);\n"


def attention_deferred_store(c) -> str:
    """A tile's output kept in registers until the next tile's first product is issued, then
    stored 16 bytes a lane (with the log-sum-exps); a float32 output is stored as it is made
    (:func:`attention_store`), only its log-sum-exps wait."""
    store = swap(_DEFERRED_STORE, _PIECES, _PADDED_PIECES) if c.padded else _DEFERRED_STORE
    if c.chain.out_dtype == "f32":
        for piece in (_PADDED_PIECES if c.padded else _PIECES, _OUT_E, _PENDING, _DST):
            store = swap(store, piece, "")
        store = swap(store, _UNROLL_LSE, "#if LSE")
    if c.strided:
        return swap(swap(store, _FLAT_LSE, _STRIDED_LSE), _PENDING_LSE,
                     _PENDING_LSE + _PENDING_LSE_AT)
    return swap(store, _FLAT_LSE, _PADDED_LSE) if c.padded else store


_PIECES = "        for (int g = 0; g < DV_ / 32; ++g) dst[4 * g] = pending[x][g];\n"
# a row narrower than the tile (OUT_DV_ < DV_): a lane's 16-byte pieces past it are not stored
_PADDED_PIECES = ("        for (int g = 0; g < DV_ / 32; ++g)\n"
                  "          if (32 * g + 8 * (lane % 4) < OUT_DV_) dst[4 * g] = pending[x][g];\n")
_PADDED_LSE = "lse_out[pending_at[x] / OUT_DV_]"
_TOKEN_ROW = "((long)w.bh * M_ + token) * DV_"
_OUT_E = "  elem_t* out_e = (elem_t*)out;\n"
_PENDING = "  uint4 pending[2][DV_ / 32];\n"
_DST = "        uint4* dst = (uint4*)(out_e + pending_at[x]) + lane % 4;\n"
_UNROLL_LSE = "        #pragma unroll\n#if LSE"   # the pieces' loop gone


_DEFERRED_STORE = """  // A tile's output, written once the next tile's first q·kᵀ is on the tensor cores (DEFER), so
  // that the stores overlap it: rows' element offsets (−1: past M), 16-byte pieces, log-sum-exps
  long pending_at[2] = {-1, -1};
  uint4 pending[2][DV_ / 32];
  float pending_lse[2];
  elem_t* out_e = (elem_t*)out;
  auto write_out = [&]() {
    #pragma unroll
    for (int x = 0; x < 2; ++x) {
      if (pending_at[x] >= 0) {
        uint4* dst = (uint4*)(out_e + pending_at[x]) + lane % 4;
        #pragma unroll
        for (int g = 0; g < DV_ / 32; ++g) dst[4 * g] = pending[x][g];
#if LSE
        if (lane % 4 == 0) lse_out[pending_at[x] / DV_] = pending_lse[x];
#endif
      }
      pending_at[x] = -1;
    }
  };
"""


def attention_store(c) -> str:
    """``o / l`` packed to 16-bit pairs and traded between a row's lanes for 16-byte stores, the
    split pieces merged by the last, the log-sum-exps; the last tile's stores. With attention
    sinks, ``o / (l + exp(sink - m))``: each row's sum takes the sink's share once the pieces
    are merged (m and l are in base 2 of the score); where the program writes
    ``where(l > 0, …, 0)``, rows that saw no key give 0."""
    sink = "" if not c.chain.sink else (_SINK_KEPT if c.chain.lse else _SINK).format(
        sink=f"t_{c.chain.sink[0]}", at="w.bh" if c.chain.sink[2] == "bh" else "w.bh % H_")
    inverse = _EMPTY + sink + _INVERSE_OR_ZERO if c.chain.empty_rows else sink + _INVERSE
    store = swap(_STORE, _INVERSE, inverse)
    if c.padded:   # rows OUT_DV_ wide in the output (the strided layout's macro has it)
        store = swap(store, _TOKEN_ROW, _TOKEN_ROW.replace("DV_", "OUT_DV_"))
        if not c.strided:
            store = swap(store, _FLAT_ROW, _FLAT_ROW.replace("DV_", "OUT_DV_"))
    if c.strided:
        store = swap(swap(store, _FLAT_ROW, _STRIDED_ROW), _LSE_VALUE,
                      _LSE_VALUE + (_LSE_AT if c.chain.lse else ""))
    if c.chain.sink and c.chain.lse:
        store = swap(store, _LSE_VALUE, _SINK_LSE_VALUE)
    if c.chain.out_dtype == "f32":
        store = swap(swap(store, _PACKED, ""), _TILE_LOOP_END,
                     _float32_store(c.padded) + _TILE_LOOP_END)
    return store


_TILE_LOOP_END = "    }\n#if !DEFER\n"
def _float32_store(padded: bool) -> str:
    """A float32 output from the accumulators' fragments as they are: two neighbouring outputs
    a lane (8 bytes; a row's four lanes write 32 contiguous bytes), no 16-bit packing and no
    trade between the lanes; stored at once (held for the next tile, they would take twice the
    registers of a packed tile). ``padded``: the columns past a row narrower than the tile
    (``OUT_DV_``) not stored."""
    guard = "          if (8 * n + 2 * (lane % 4) < OUT_DV_)\n  " if padded else ""
    return ("      if (pending_at[x] >= 0) {\n"
            "        float* dst = (float*)out + pending_at[x] + 2 * (lane % 4);\n"
            "        #pragma unroll\n"
            "        for (int n = 0; n < DV_ / 8; ++n)\n"
            f"{guard}          *reinterpret_cast<float2*>(dst + 8 * n) =\n"
            f"{'  ' if padded else ''}              make_float2(o[4 * n + 2 * x] * inv, "
            "o[4 * n + 2 * x + 1] * inv);\n"
            "      }\n")


# o / l packed to 16-bit pairs and traded between a row's four lanes (:data:`_STORE`'s)
_PACKED = """      #pragma unroll
      for (int g = 0; g < DV_ / 32; ++g) {
        unsigned a[4];
        #pragma unroll
        for (int j = 0; j < 4; ++j)
          a[j] = tf_pack(o[4 * (4 * g + j) + 2 * x] * inv, o[4 * (4 * g + j) + 2 * x + 1] * inv);
        pending[x][g] = tf_quad_transpose(a, lane);
      }
"""
_INVERSE = "      const float inv = 1.0f / l[x];\n"
# where(l > 0, o / l, 0): a row that saw no key (every score -inf: l = 0, o = 0) gives 0; the
# sum is tested before a sink's share is added to it
_EMPTY = "      const bool seen = l[x] > 0.0f;   // where(l > 0, …, 0)\n"
_INVERSE_OR_ZERO = "      const float inv = seen ? 1.0f / l[x] : 0.0f;\n"
_SINK = ("      l[x] += exp2f((float){sink}[{at}] * 1.4426950408889634f - m[x]);"
         "   // the sink's share\n")
# with the log-sum-exp written: the sink's term is in it (what the backward's P = exp(S − lse)
# needs); a row that saw no key has only that term (m is −inf there)
_SINK_KEPT = ("      const float g2 = (float){sink}[{at}] * 1.4426950408889634f;   // base 2\n"
              "      const bool kept = l[x] > 0.0f;\n"
              "      l[x] += exp2f(g2 - m[x]);   // the sink's share\n")
_SINK_LSE_VALUE = ("      pending_lse[x] = (kept ? m[x] + log2f(l[x]) : g2) * "
                   "0.6931471805599453f;\n")


_STORE = """    // o / l from the fragments, rows row_lo (registers r % 4 < 2) and row_lo + 8, packed to
    // 16-bit pairs: the four lanes of a row trade their pairs so that each holds 8 neighbouring
    // outputs — 16-byte stores, a row's 4 lanes writing 64 contiguous bytes (4-byte stores of 8
    // rows per warp instruction held up the tile's end: benchmarks.hopper_attention)
    #pragma unroll
    for (int x = 0; x < 2; ++x) {
      l[x] += __shfl_xor_sync(0xffffffffu, l[x], 1);
      l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
    }
    // a piece of a split tile: the rows are written by the piece merged last (the others pack
    // their outputs all the same and drop them, so that `pending` is dead through the loop)
#if LISTS
    const bool keep = true;
#else
    const bool keep = (w.first == 0 && w.count == C_) ||
                      merge_piece(o, m, l, TAIL, tile, w.first, cw, t, work, counters, flags);
#endif
    #pragma unroll
    for (int x = 0; x < 2; ++x) {
      const float inv = 1.0f / l[x];
      const int row = row_lo + 8 * x;
""" + _PACKED + """#if TILED
      bool ok;
      const int token = tf_row_token(row, ok);   // row: a position of the tiled order
      pending_at[x] = keep && ok ? ((long)w.bh * M_ + token) * DV_ : -1;
#else
      pending_at[x] = keep && row < M_ ? ((long)w.bh * M_ + row) * DV_ : -1;
#endif
      // m and l are in base 2 of the score: ln Σ e^s = (m + log2 l) · ln 2; −inf when empty
      pending_lse[x] = (m[x] + log2f(l[x])) * 0.6931471805599453f;
    }
#if !DEFER
    write_out();
#endif
  }
  write_out();   // the last tile's
"""


def attention_quad_transpose(c) -> str:
    """A row's four lanes trade their packed pairs (16-byte stores)."""
    return """// Lanes 4r … 4r + 3 (one row of the fragment) each hold a[j], the packed pair at columns
// 8·j + 2·(lane % 4); returned: lane q's 16 bytes at columns 8·q … 8·q + 7, the pairs of lanes
// 0 … 3 in turn. Two exchanges of 2×2 blocks (lanes q ^ 2, then q ^ 1): 4 shuffles, no indexing
// of registers by the lane.
__device__ __forceinline__ uint4 tf_quad_transpose(const unsigned (&a)[4], int lane) {
  const bool hi = lane & 2, odd = lane & 1;
  const unsigned s0 = __shfl_xor_sync(0xffffffffu, hi ? a[0] : a[2], 2);
  const unsigned s1 = __shfl_xor_sync(0xffffffffu, hi ? a[1] : a[3], 2);
  const unsigned n0 = hi ? s0 : a[0], n1 = hi ? s1 : a[1];
  const unsigned n2 = hi ? a[2] : s0, n3 = hi ? a[3] : s1;
  const unsigned t0 = __shfl_xor_sync(0xffffffffu, odd ? n0 : n1, 1);
  const unsigned t1 = __shfl_xor_sync(0xffffffffu, odd ? n2 : n3, 1);
  return odd ? make_uint4(t0, n1, t1, n3) : make_uint4(n0, t0, n2, t1);
}

"""


def attention_merge_piece(c) -> str:
    """The split pieces' partial states merged by the last to finish (in rounds where a tile has
    many pieces)."""
    return """// One warpgroup's partial state of a split tile's 64 rows in the workspace: per
// thread, its fragment's o (unscaled) in 16-byte pieces, then each row's base-2 maximum and sum.
#define PARTIAL_VEC4 ((DV_ / 8 + 1) * 128)
__device__ __forceinline__ void store_partial(const float (&o)[DV_ / 2], const float (&m)[2],
                                              const float (&l)[2], float4* at) {
  #pragma unroll
  for (int r = 0; r < DV_ / 8; ++r)
    __stcg(at + r * 128, make_float4(o[4 * r], o[4 * r + 1], o[4 * r + 2], o[4 * r + 3]));
  __stcg(at + (DV_ / 8) * 128, make_float4(m[0], m[1], l[0], l[1]));
}
// The partial state at `theirs` merged into (o, m, l).
__device__ __forceinline__ void merge_partial(float (&o)[DV_ / 2], float (&m)[2], float (&l)[2],
                                              const float4* theirs) {
  const float4 ml = __ldcg(theirs + (DV_ / 8) * 128);
  const float mq[2] = {ml.x, ml.y}, lq[2] = {ml.z, ml.w};
  float a[2], b[2];
  #pragma unroll
  for (int x = 0; x < 2; ++x) {
    const float mx = fmaxf(m[x], mq[x]);
    const float use = mx == -INFINITY ? 0.0f : mx;
    a[x] = tf_exp2(m[x] - use);
    b[x] = tf_exp2(mq[x] - use);
    m[x] = mx;
    l[x] = l[x] * a[x] + lq[x] * b[x];
  }
  #pragma unroll
  for (int r = 0; r < DV_ / 8; ++r) {
    const float4 v = __ldcg(theirs + r * 128);
    o[4 * r] = o[4 * r] * a[0] + v.x * b[0];
    o[4 * r + 1] = o[4 * r + 1] * a[0] + v.y * b[0];
    o[4 * r + 2] = o[4 * r + 2] * a[1] + v.z * b[1];
    o[4 * r + 3] = o[4 * r + 3] * a[1] + v.w * b[1];
  }
}
// A piece of a split tile (MODE_SPLIT): the warpgroup's partial state goes to the workspace
// slot of its part; the warpgroup that completes the tile's pieces last merges all of them, in
// their order, and returns true: it writes the output. Many pieces merge in rounds (merge_fan):
// the last of a group of runs merges them into the slot of the group's first piece — a run of
// the next round — and the last round's merger the whole tile (merge_round: the groups and
// their counters); each counter left at 0 by the arrival that completes it. Every thread writes
// and reads its own fragment's 16-byte pieces.
__device__ __forceinline__ bool merge_piece(float (&o)[DV_ / 2], float (&m)[2], float (&l)[2],
    const Tail& s, int tile, int first, int cw, int t, float4* work, int* counters,
    volatile int* flags) {
  const int tl = tile - s.tile0, p = (tl * s.C + first) / s.L, fan = merge_fan(s, tl);
  // the slot of piece q's part in this tile: this thread's 16-byte pieces
  #define TF_PARTIAL(q) (work + ((long)piece_slot(s, tl, q) * CONSUMERS + cw) * PARTIAL_VEC4 + t)
  store_partial(o, m, l, TF_PARTIAL(p));
  // the warpgroup's own named barrier: ids past the consumers' turns
  const int bar = 1 + CONSUMERS + cw;
  for (int span = 1, round = 0;; span *= fan, ++round) {   // span: pieces in a run
    const MergeRound r = merge_round(s, tl, p, span, round, gridDim.x);
    if (!tf_arrived_last(counters + 2 + r.counter * CONSUMERS + cw, r.arrivals, bar, 128, t == 0,
                         flags + cw))
      return false;
    // every run of the group, its own read back too, merged in their order from an empty
    // state: the same bits whichever run finished last (its registers first had made the
    // merge's order depend on it)
    #pragma unroll
    for (int x = 0; x < 2; ++x) { m[x] = -INFINITY; l[x] = 0.f; }
    #pragma unroll
    for (int i = 0; i < DV_ / 2; ++i) o[i] = 0.f;
    for (int q = r.g0; q <= r.g1; q += span) merge_partial(o, m, l, TF_PARTIAL(q));
    if (r.last) break;
    store_partial(o, m, l, TF_PARTIAL(r.g0));   // the run the next round reads
  }
  #undef TF_PARTIAL
  return true;
}
"""


def gemm_defines(c) -> str:
    """Whether the output is staged through shared memory."""
    return f"""#define STAGED {int(c.knobs.epilogue == "staged")}   // the output through shared memory
"""


def gemm_split_defines(c) -> str:
    """A split tile's partial accumulators per CTA."""
    return """
// One CTA's partial accumulators of a split tile, in float4s: [weight, 4-register group, thread].
#define PART_VEC4 (G * (BN / 8) * CONSUMERS * 128)

"""


def gemm_warpgroup_barrier(c) -> str:
    """A consumer warpgroup's own named barrier."""
    return """
// The 128 threads of consumer warpgroup `cw` (named barrier 1 + cw; 0 is __syncthreads).
__device__ __forceinline__ void tf_bar_sync_wg(int cw) {
  asm volatile("bar.sync %0, 128;" :: "r"(1 + cw) : "memory");
}
"""


def gemm_value_function(c) -> str:
    """The program's output element from the accumulators."""
    return f"""
// The program's output element from the accumulators at (row, col).
__device__ __forceinline__ float epilogue_value({c.gate_params}, int row, int col{c.z_param}{c.extra_params}) {{
  return {c.epilogue};
}}

"""


def gemm_split_combine(c) -> str:
    """A split tile's pieces: partial accumulators to the workspace, the last piece adds them
    up, all of them in the pieces' order (deterministic)."""
    return """      if (w.piece >= 0) {   // a piece of a split tile: the last piece to finish adds them up
        const int ct = cw * 128 + t;
        float4* mine = (float4*)ws + (long)(w.slot * CLUSTER + rank) * PART_VEC4;
        #pragma unroll
        for (int x = 0; x < G; ++x) {
          #pragma unroll
          for (int g = 0; g < BN / 8; ++g)
            __stcg(mine + (x * (BN / 8) + g) * CONSUMERS * 128 + ct,
                   make_float4(acc[x][4 * g], acc[x][4 * g + 1], acc[x][4 * g + 2],
                               acc[x][4 * g + 3]));
        }
        // every consumer thread (named barrier CONSUMERS + 1; 1 … CONSUMERS are the warpgroups')
        if (!tf_arrived_last(counters + (w.unit - full_items) * CLUSTER + rank, pieces,
                             CONSUMERS + 1, CONSUMERS * 128, ct == 0, last_piece))
          continue;
        // every piece, its own read back too, added in the pieces' order: the same sum
        // whichever piece finishes last (its registers first had made the sum's order, and the
        // output's last bits, differ from run to run: a latent decode's repeated calls on the
        // H100). The read back costs a small GEMM's tail: 1000×520×776 in 2 ways 15.5 → 17.0
        // µs, 8192×4096×14336 in 6 ways unchanged (``benchmarks.gemm --no-sweep``)
        const int first_slot = (w.unit - full_items) * pieces;
        #pragma unroll
        for (int x = 0; x < G; ++x) {
          #pragma unroll
          for (int i = 0; i < BN / 2; ++i) acc[x][i] = 0.f;
        }
        for (int p = 0; p < pieces; ++p) {
          const float4* part = (const float4*)ws + (long)((first_slot + p) * CLUSTER + rank)
                               * PART_VEC4;
          #pragma unroll
          for (int x = 0; x < G; ++x) {
            #pragma unroll
            for (int g = 0; g < BN / 8; ++g) {
              const float4 v = __ldcg(part + (x * (BN / 8) + g) * CONSUMERS * 128 + ct);
              acc[x][4 * g] += v.x;
              acc[x][4 * g + 1] += v.y;
              acc[x][4 * g + 2] += v.z;
              acc[x][4 * g + 3] += v.w;
            }
          }
        }
      }
"""


def gemm_store(c) -> str:
    """The output from the fragments: its values first, in place of the accumulators, then 4-byte
    stores, or 64 columns at a time through shared memory and 16-byte stores (``STAGED``)."""
    return f"""      // the epilogue, from the fragments: register 4·jj + 2·x + e holds row r0 + 8·x,
      // column n0 + 8·jj + 2·(lane % 4) + e
      const int r0 = m0 + cw * 64 + warp * 16 + lane / 4;{c.batch_output}
      // the output's values in place of the first accumulator, all of them before any store,
      // at coordinates clamped into the output (what lies past its edge is not stored): with no
      // store (an asm with a memory clobber) and no bounds check between them, what the
      // epilogue reads per row or per column is loaded once — a 128 × 256 tile scaled by a row
      // and a column vector loaded 238 values a thread, each at its use
      #pragma unroll
      for (int x = 0; x < 2; ++x) {{
        const int row = min(r0 + 8 * x, M_ - 1);
        #pragma unroll
        for (int jj = 0; jj < BN / 8; ++jj) {{
          const int r = 4 * jj + 2 * x, c0 = n0 + 8 * jj + 2 * (lane % 4);
          const int col = min(c0, N_ - 1), col1 = min(c0 + 1, N_ - 1);
          const float v0 = epilogue_value({c.gate_args("r")}, row, col{c.z}{c.extra_args});
          const float v1 = epilogue_value({c.gate_args("r + 1")}, row, col1{c.z}{c.extra_args});
          acc[0][r] = v0;
          acc[0][r + 1] = v1;
        }}
      }}
#if STAGED
      // 64 columns at a time through this warpgroup's 64 × 64 buffer (128-byte rows, swizzled
      // like the operand tiles: conflict-free both ways), then 16-byte coalesced stores; a tile
      // whose width is not a multiple of 64 (K-major weights) ends on a narrower chunk
      const unsigned buf = tf_smem_addr(c_stage) + cw * 64 * 128;
      #pragma unroll
      for (int a = 0; a < (BN + 63) / 64; ++a) {{
        #pragma unroll
        for (int x = 0; x < 2; ++x) {{
          const int lr = warp * 16 + lane / 4 + 8 * x;
          #pragma unroll
          for (int j8 = 0; j8 < 8 && 8 * a + j8 < BN / 8; ++j8) {{
            const int r = 4 * (8 * a + j8) + 2 * x;
            out_pair_t v = {c.make_pair.format("acc[0][r]", "acc[0][r + 1]")};
            tf_st_smem_b32(buf + lr * 128 + ((j8 ^ (lr % 8)) * 16) + (lane % 4) * 4,
                           *reinterpret_cast<unsigned*>(&v));
          }}
        }}
        tf_bar_sync_wg(cw);
        #pragma unroll
        for (int i = 0; i < 4; ++i) {{
          const int c = t + 128 * i, lr = c / 8, ch = c % 8;
          const int row = m0 + cw * 64 + lr, col = n0 + 64 * a + 8 * ch;
          if (64 * a + 8 * ch >= BN) continue;   // past a narrower last chunk
          const uint4 v = tf_ld_smem_v4(buf + lr * 128 + ((ch ^ (lr % 8)) * 16));
          if (row < M_ && col < N_) *(uint4*)((out_t*){c.out} + (long)row * N_ + col) = v;
        }}
        tf_bar_sync_wg(cw);   // read out before the next 64 columns overwrite it
      }}
#else
      #pragma unroll
      for (int x = 0; x < 2; ++x) {{
        const int row = r0 + 8 * x;
        if (row < M_) {{
          out_pair_t* dst = (out_pair_t*){c.out} + ((long)row * N_ + n0 + 2 * (lane % 4)) / 2;
          #pragma unroll
          for (int jj = 0; jj < BN / 8; ++jj) {{
            const int col = n0 + 8 * jj + 2 * (lane % 4), r = 4 * jj + 2 * x;
            if (col < N_) dst[4 * jj] = {c.make_pair.format("acc[0][r]", "acc[0][r + 1]")};
          }}
        }}
      }}
#endif
    }}
"""


def chain_add_tile(c) -> str:
    """A finished output tile into the clusters' f32 sums."""
    return """// A finished output tile of a warpgroup (rows from `row`, columns from `col`) into the sums.
__device__ __forceinline__ void add_tile(float* __restrict__ ysum, const float (&acc2)[OW / 2],
                                         int row, int col) {
  #pragma unroll
  for (int jj = 0; jj < OW / 8; ++jj)
    add_to_sums(ysum, row, col + 8 * jj, acc2[4 * jj], acc2[4 * jj + 1], acc2[4 * jj + 2],
                acc2[4 * jj + 3]);
}
"""


def chain_activation_exchange(c) -> str:
    """The activation into this CTA's H (K-major, or as A fragments), shared with the cluster
    (all-gather or peer reads)."""
    return f"""  // The activation, elementwise on the accumulators, into this CTA's columns of H: the two
  // columns a lane holds in accumulator group jj, rows + 8·half, as a bf16 pair.
  auto activated = [&](int jj, int half) -> __nv_bfloat162 {{
    float h[2];
    #pragma unroll
    for (int e = 0; e < 2; ++e) {{
      {c.gate_values}
      h[e] = {c.activation};
    }}
    return __floats2bfloat162_rn(h[0], h[1]);
  }};
#if PRODUCER || !PEER
  // K-major and swizzled like a pipeline's x tile: the all-gather's H holds the cluster's columns
  // (this CTA's from rank · BN), the producer's only this CTA's, whose k-tiles the peers'
  // producers copy byte for byte into their pipelines.
  const int h_col0 = PRODUCER ? 0 : rank * BN;
  #pragma unroll
  for (int jj = 0; jj < NW / 8; ++jj)
    #pragma unroll
    for (int half = 0; half < 2; ++half) {{
      const int row = erow + 8 * half, col = h_col0 + gn * NW + 8 * jj + ecol;
      *reinterpret_cast<__nv_bfloat162*>(hf + swizzled(col / 64, row, (col % 64) / 8, BM) +
                                         (col % 8) * 2) = activated(jj, half);
    }}
#endif
#if PRODUCER
  tf_cluster_wait();    // (every peer has started)
  tf_cluster_arrive();  // release: our slice is seen by each peer's producer after its wait
#elif PEER
  // As A fragments: the accumulators of columns 16s … 16s + 15 are, lane for lane, the A fragment
  // of k16 step s (mma.sync layout), so each lane stores its four registers as one 16-byte chunk.
  #pragma unroll
  for (int sl = 0; sl < NW / 16; ++sl) {{
    unsigned packed[4];
    #pragma unroll
    for (int q = 0; q < 4; ++q) {{   // register q: columns + 8·(q / 2), rows + 8·(q % 2)
      const __nv_bfloat162 pair = activated(2 * sl + q / 2, q % 2);
      packed[q] = *reinterpret_cast<const unsigned*>(&pair);
    }}
    *reinterpret_cast<uint4*>(hf + hf_fragment(erow / 16, gn * NW / 16 + sl, lane)) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }}
  consumers_sync();     // every warpgroup's MMAs are done before W2 tiles reuse the pipeline
  tf_cluster_wait();    // (every peer has started)
  tf_cluster_arrive();  // release: our slice is seen by each peer after its wait
#else
  consumers_sync();     // this CTA's slice is complete (and every pipeline copy has landed)
  tf_cluster_wait();    // every peer has started
  // All-gather: this CTA's slice of H (BN / 64 whole atoms, contiguous) into each peer.
  for (int p = 1; p < CLUSTER; ++p) {{
    const unsigned peer = (rank + p) % CLUSTER;
    for (int c = threadIdx.x; c < BM * BN / 8; c += 32 * WARPS) {{
      const char* src = hf + rank * BM * BN * 2 + c * 16;
      tf_st_dsm_v4(tf_mapa(tf_smem_addr(src), peer), *reinterpret_cast<const uint4*>(src));
    }}
  }}
  tf_fence_proxy_async();          // our own slice, written by ordinary stores, for our wgmma
  tf_fence_proxy_async_cluster();  // for the peers' wgmma, which read through the async proxy
  tf_cluster_arrive();  // release: our stores are seen by each peer after its wait
#endif

"""
