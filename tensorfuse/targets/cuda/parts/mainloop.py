"""Mainloops: the tensor-core products of a sweep — ``wgmma`` from shared-memory descriptors
(K-major and MN-major 128-byte-swizzled tiles), the A operand from registers — and the order in
which a block's products are issued and waited for."""
from __future__ import annotations


def attention_consumer_begin(c) -> str:
    """A consumer warpgroup takes its registers; its fragments (``o``, ``s``, ``p``) and the
    ring's slot and phase of a block."""
    return f"""
  // a consumer warpgroup: query rows [rb·BM + 64·cw, +64) of each tile it is handed
  tf_setmaxnreg_inc<CONSUMER_REGS>();
  const int cw = wg - 1;
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const float scale2 = {c.scale};
  const unsigned q_base = tf_smem_addr(q_tile), k_base = tf_smem_addr(k_tiles),
                 v_base = tf_smem_addr(v_tiles);
  float o[DV_ / 2];
  float m[2], l[2], corr[2];
  float s[BN / 2];
  uint4 p[BN / 16];
  unsigned mw[MASK_WORDS];   // TILED: this thread's mask bits of the block in s
  int use = 0;   // key/value blocks consumed in earlier tiles (the ring's slot and phase)

#define SCORE_ARGS mw, scale2, kc_{c.extra_args}
#define SLOT(it) ((use + (it)) % STAGES)
#define PHASE(it) (((use + (it)) / STAGES) & 1)
"""


def attention_issue_macros(c) -> str:
    """``q·kᵀ`` and ``p·v`` issued on ``wgmma`` (K-major keys, values from shared memory, P from
    registers), and the last block's 16-key steps that hold keys."""
    return f"""  // q·kᵀ of block `it` into the accumulators `acc` by `mma` (issued, not waited for)
#define ISSUE_S_INTO(acc, mma, it)                                                          \
  {{                                                                                          \
    const unsigned long long dq = tf_kmajor_desc(q_base, BM, cw * 64, 0),                   \
                             dk = tf_kmajor_desc(k_base + SLOT(it) * K_BYTES, BN, 0, 0);    \
    tf_mbar_wait(full_k + SLOT(it), PHASE(it));                                               \
    tf_wgmma_fence();                                                                         \
    _Pragma("unroll") for (int ks = 0; ks < {c.qk_steps}; ++ks)                                   \
      mma(acc, tf_desc_plus(dq, kmajor_step(BM, ks)), {c.key_step}, \
          ks > 0);                                                                            \
    tf_wgmma_commit();                                                                        \
  }}
  // o += p·v of block `it` over its first `steps` 16-key steps (issued, not waited for)
#define ISSUE_O(it, steps)                                                                  \
  {{                                                                                          \
    const unsigned vt = v_base + SLOT(it) * V_BYTES;                                          \
    tf_mbar_wait(full_v + SLOT(it), PHASE(it));                                               \
    tf_wgmma_fence();                                                                         \
    _Pragma("unroll") for (int ks = 0; ks < BN / 16; ++ks)                                   \
      if (ks < (steps)) {c.o_mma}({c.o_acc}, p[ks], tf_nmajor_desc(vt, BN, 0, ks * 16), 1);        \
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
"""


def attention_step_macros(c) -> str:
    """A tile's first block and each block after it: the products issued (the next block's
    ``q·kᵀ`` before this block's ``p·v`` with ``OVERLAP``), waited for, and the softmax between
    them."""
    return """  // block `it`'s q·kᵀ has landed: after the tile's last one the query tile may be reloaded
  // (a partial block's mask bits are read before its slot is released)
#define S_LANDED_INTO(acc, it)                                                              \
  {                                                                                          \
    tf_fence_regs(acc);                                                                       \
    if (TILED && (it) < w.n_partial) {                                                        \
      const unsigned* bits = (const unsigned*)(mask_tiles + SLOT(it) * MASK_BYTES) +          \
                             cw * MASK_WORDS * 128 + t;                                         \
      _Pragma("unroll") for (int x = 0; x < MASK_WORDS; ++x) mw[x] = bits[128 * x];           \
    }                                                                                         \
    tf_mbar_arrive(empty_k + SLOT(it));                                                       \
    if ((it) == w.count - 1) tf_mbar_arrive(q_free);                                    \
  }
  // a tile's first block (`keys` wide): its q·kᵀ into `acc` by `mma`, while the previous tile's
  // output is written (DEFER)
#define FIRST(acc, mma, keys)                                                               \
  {                                                                                          \
    TURN_BEGIN                                                                                \
    ISSUE_S_INTO(acc, mma, 0);                                                                \
    TURN_END                                                                                  \
    if (DEFER) write_out();                                                                   \
    tf_wgmma_wait<0>();                                                                       \
    S_LANDED_INTO(acc, 0);                                                                    \
    SOFTMAX_INTO(acc, 0, keys);                                                               \
    pack_p(acc, p);                                                                           \
  }
  // block `it` > 0 (`keys` wide): its q·kᵀ into `acc` by `mma`, the previous block's p·v
#if OVERLAP
#define STEP(it, acc, mma, keys)                                                            \
  {                                                                                          \
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
  }
#else
#define STEP(it, acc, mma, keys)                                                            \
  {                                                                                          \
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
  }
#endif
"""


def attention_tile_blocks(c) -> str:
    """A tile's rows' state reset, then its key blocks: the first, the steps (the sequence's
    last block at its own width), the last ``p·v``."""
    return f"""    const int row_lo = w.rb * BM + cw * 64 + warp * 16 + lane / 4;
    const float kc_ = tf_key_bias(w.bh / H_, w.bh % H_{c.extra_args});
    #pragma unroll
    for (int r = 0; r < DV_ / 2; ++r) o[r] = 0.0f;
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
        FIRST(sn, {c.sn_mma}, LAST_N)
      else
#endif
        FIRST(s, {c.s_mma}, BN)
#if LAST_N < BN
      for (int it = 1; it < w.count - 1; ++it) STEP(it, s, {c.s_mma}, BN);
      if (w.count > 1) {{
        if (ends)
          STEP(w.count - 1, sn, {c.sn_mma}, LAST_N)
        else
          STEP(w.count - 1, s, {c.s_mma}, BN)
      }}
#else
      for (int it = 1; it < w.count; ++it) STEP(it, s, {c.s_mma}, BN);
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

"""


def attention_pack_function(c) -> str:
    """Two floats to a 16-bit pair (``pair``, made by ``pack``)."""
    return f"""__device__ __forceinline__ unsigned tf_pack(float lo, float hi) {{
  {c.pair} v = {c.pack}(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}}
"""


def attention_descriptors(c) -> str:
    """wgmma descriptors of the query, key and value tiles and their k16 steps."""
    return """// What k16 step `ks` adds to tf_kmajor_desc of a tile of `rows` rows: the descriptor's low
// field is the address / 16, and a shared-memory address (< 228 KB) never carries out of its 14
// bits — so a block's q·kᵀ descriptors are one descriptor and constants, not a shift and masks per
// wgmma in the issuing warps (Nsight Compute on the attention kernel). p·v makes its descriptor
// per wgmma, and the queries' descriptor is made again each block rather than kept across the
// loop: either way the other made ptxas spill in the consumers of the 176-key causal kernel.
__device__ __forceinline__ constexpr unsigned kmajor_step(int rows, int ks) {
  return ((ks / 4) * rows * 128 + (ks % 4) * 32) >> 4;
}
// `desc` moved on by `step` (the address / 16): added to the low word only — no carry to make,
// one add per wgmma (a 64-bit add cost an add with carry and moves).
__device__ __forceinline__ unsigned long long tf_desc_plus(unsigned long long desc,
                                                           unsigned step) {
  return (desc & 0xFFFFFFFF00000000ull) | (unsigned)((unsigned)desc + step);
}

"""


def attention_pack_p(c) -> str:
    """P packed to 16-bit pairs: the A operand of ``p·v``."""
    return """// P of a block of 2·R keys into its first R / 8 16-key steps.
template <int R>
__device__ __forceinline__ void pack_p(const float (&s)[R], uint4 (&p)[BN / 16]) {
  #pragma unroll
  for (int t = 0; t < R / 8; ++t)
    p[t] = make_uint4(tf_pack(s[8 * t], s[8 * t + 1]), tf_pack(s[8 * t + 2], s[8 * t + 3]),
                      tf_pack(s[8 * t + 4], s[8 * t + 5]), tf_pack(s[8 * t + 6], s[8 * t + 7]));
}

"""


def gemm_consumer_begin(c) -> str:
    """A consumer warpgroup takes its registers and its accumulators."""
    return """  } else {   // a consumer warpgroup: rows [m0 + 64·cw, +64) of each tile
    tf_setmaxnreg_inc<CONSUMER_REGS>();
    const int cw = wg - 1;
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const unsigned a_base = tf_smem_addr(a_tiles), b_base = tf_smem_addr(b_tiles);
    float acc[G][BN / 2];
    int it = 0;
"""


def gemm_k_loop(c) -> str:
    """Each work item's k-blocks: four ``wgmma`` m64nBNk16 a weight, one k-block in flight while
    the previous slot is released."""
    return f"""    for (int item = first_unit; item < items; item += unit_step) {{
      int m0, n0{c.z};
      const Work w = tile_at(item, full_items, pieces, kblocks, row_units, tiles_n, group_m,
                             rank, m0, n0{c.z});
      for (int kb = w.k0; kb < w.k1; ++kb, ++it) {{
        const int s = it % STAGES;
        tf_mbar_wait(full + s, (it / STAGES) & 1);
        tf_wgmma_fence();
        #pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) {{
          {_a_descriptor(c)}
          #pragma unroll
          for (int x = 0; x < G; ++x) {{
            const unsigned b = b_base + (s * G + x) * B_BYTES;
#if B_KMAJOR
            const unsigned long long db = tf_kmajor_desc(b, BN, 0, ks * 16);
#else
            const unsigned long long db = tf_nmajor_desc(b, BK, 0, ks * 16);
#endif
            {c.mma}(acc[x], da, db, kb > w.k0 || ks > 0);
          }}
        }}
        tf_wgmma_commit();
        // the previous k-block's MMAs are done: release its slot (to both producers)
        tf_wgmma_wait<1>();
        if (kb > w.k0) release_slot(empty, (it - 1) % STAGES, t, rank);
      }}
      tf_wgmma_wait<0>();
      #pragma unroll
      for (int x = 0; x < G; ++x) tf_fence_regs(acc[x]);
      release_slot(empty, (it - 1) % STAGES, t, rank);
"""


def _a_descriptor(c) -> str:
    """The rows operand's descriptor of this warpgroup's 64 rows at k-step ``ks``."""
    if c.plan.a_k_major:
        return """// a: K-major, 128-byte rows; this warpgroup's 64 rows start at row 64·cw
          const unsigned long long da = tf_kmajor_desc(a_base + s * A_BYTES, BM, cw * 64,
                                                       ks * 16);"""
    return """// a: M-major (stored [K, M]), atoms of 64 rows × 64 k; this warpgroup's is atom cw
          const unsigned long long da = tf_nmajor_desc(a_base + s * A_BYTES, BK, cw * 64,
                                                       ks * 16);"""


def chain_peer_fragment(c) -> str:
    """Where a lane's A fragment of H lives in a CTA's slice (``exchange="peer"``)."""
    return """
// exchange="peer": the byte offset of lane `lane`'s A fragment (16 bytes) of 16-row block `rb`
// and k16 step `s` in a CTA's slice of H.
__device__ __forceinline__ unsigned hf_fragment(int rb, int s, int lane) {
  return ((rb * (BN / 16) + s) * 32 + lane) * 16;
}

"""


def chain_first_product(c) -> str:
    """Phase 1: the gate products of this warpgroup's rows and columns on ``wgmma``."""
    return f"""  // Phase 1: acc[j] = x · w_j[:, n0 : n0 + BN] for this warpgroup's 64 rows × NW columns.
  float acc[G][NW / 2];
  #pragma unroll
  for (int j = 0; j < G; ++j)
    #pragma unroll
    for (int i = 0; i < NW / 2; ++i) acc[j][i] = 0.f;
  // all zeroed before the first wgmma (else the compiler may zero the second gate's accumulators
  // between the first k-tile's wgmmas, and ptxas serializes them: C7517, seen with TMA SwiGLU)
  #pragma unroll
  for (int j = 0; j < G; ++j) tf_fence_regs(acc[j]);
#if TMA_WARP
  int pending = -1;       // the last slot whose MMAs may still be running
#elif !PRODUCER
  for (int u = 0; u < AHEAD1 && u < KT; ++u) fill_stage(pipe, full, empty, plan, u);
#endif
  for (int kt = 0; kt < KT; ++kt) {{
#if TMA_WARP
    tf_mbar_wait(full + kt % STAGES, (kt / STAGES) & 1);
    const char* xs = pipe + (kt % STAGES) * SLOT;
#else
    wait_full_slot(full, kt, STAGES);
    const char* xs = pipe + (kt % STAGES) * STAGE_BYTES;
#endif
    const unsigned xs_at = tf_smem_addr(xs);
    tf_wgmma_fence();
    #pragma unroll
    for (int s = 0; s < BK / 16; ++s) {{
      const unsigned long long da = tf_kmajor_desc(xs_at, BM, gm * 64, s * 16);
      #pragma unroll
      for (int j = 0; j < G; ++j)
        tf_wgmma_m64n{c.nw}k16(acc[j], da,
                               tf_nmajor_desc(xs_at + BM * BK * 2 + j * BK * BN * 2, BK, gn * NW,
                                              s * 16));
    }}
    tf_wgmma_commit();
    tf_wgmma_wait<1>();   // k-tile kt - 1 is done; kt's MMAs run on while the loop goes round
#if TMA_WARP
    if (pending >= 0) release_slot(empty, pending, STAGES);
    pending = kt;
#else
    if (kt > 0) release_slot(empty, kt - 1, STAGES);
#if !PRODUCER
    if (kt + AHEAD1 < KT) fill_stage(pipe, full, empty, plan, kt + AHEAD1);
#endif
#endif
  }}
  tf_wgmma_wait<0>();
#if TMA_WARP
  release_slot(empty, pending, STAGES);   // each slot is released exactly once per use
  pending = -1;
#elif PRODUCER
  release_slot(empty, KT - 1, STAGES);    // the producer waits for it before refilling for W2
#endif
  #pragma unroll
  for (int j = 0; j < G; ++j) tf_fence_regs(acc[j]);

"""


def chain_second_product_peer(c) -> str:
    """Phase 2 with A from the peers' registers (``exchange="peer"``): two register sets, one in
    flight, one refilled by DSM loads."""
    return f"""  // Phase 2: ysum[m0 rows, this CTA's OC columns] += H · W2[cluster rows, OC columns], W2 through
  // a pipeline of BK × BO tiles, BO columns at a time.
#if !TMA_WARP && !PRODUCER
  for (int u = 0; u < AHEAD2 && u < T; ++u) fill_w2(pipe, full2, empty2, plan, u, KS, nc, o_base);
#endif
  tf_cluster_wait();    // acquire: every slice of H is in place
  tf_fence_proxy_async();
#if PEER && !PRODUCER
  // A fragments of k-tile `ks` of the cluster's H for this warp's 16 rows: k16 step kc lives in
  // CTA kc / (BN / 16). Two register sets: one feeds the k-tile in flight, the other is refilled
  // (DSM loads) once the MMAs that read it are done.
  const unsigned hf_addr = tf_smem_addr(hf);
  auto load_a = [&](uint4 (&a)[BK / 16], int ks) {{
    #pragma unroll
    for (int s = 0; s < BK / 16; ++s) {{
      const int kc = ks * (BK / 16) + s;
      a[s] = tf_ld_dsm_u32x4(tf_mapa(hf_addr + hf_fragment(erow / 16, kc % (BN / 16), lane),
                                     kc / (BN / 16)));
    }}
  }};
  uint4 a_even[BK / 16], a_odd[BK / 16];
  load_a(a_even, 0);
  float acc2[OW / 2];      // each output tile starts from its first product (accumulate = 0)
  auto step = [&](int t, int ks, const uint4 (&a)[BK / 16], uint4 (&a_next)[BK / 16]) {{
    const int it = t * KS + ks;
    const unsigned w2s_at = w2_ready(pipe, full2, it);
    tf_wgmma_fence();
    #pragma unroll
    for (int s = 0; s < BK / 16; ++s)
      tf_wgmma_rs_m64n{c.ow}k16(acc2, a[s], tf_nmajor_desc(w2s_at, BK, gn * OW, s * 16),
                              ks > 0 || s > 0);
    tf_wgmma_commit();
    tf_wgmma_wait<1>();    // the previous k-tile's MMAs are done: its registers are free
    load_a(a_next, (ks + 1) % KS);
    w2_advance(pipe, full2, empty2, plan, it, T, KS, nc, o_base);
  }};
  for (int t = 0; t < OC / BO; ++t) {{
    for (int ks = 0; ks < KS; ks += 2) {{
      step(t, ks, a_even, a_odd);
      step(t, ks + 1, a_odd, a_even);
    }}
    tf_wgmma_wait<0>();   // this output tile is complete: add it to the other clusters' sums
    tf_fence_regs(acc2);
    add_tile(ysum, acc2, m0 + erow, o_base + t * BO + gn * OW + ecol);
  }}
  tf_cluster_arrive();    // no CTA leaves while a peer may still read its slice
  tf_cluster_wait();
"""


def chain_second_product_shared(c) -> str:
    """Phase 2 with A from shared memory (the gathered H, or the producer's copy of its k-tile)."""
    return f"""#else   // A from shared memory: the cluster's H (gather), or the producer's copy of its k-tile
  const unsigned hf_at = tf_smem_addr(hf);
  float acc2[OW / 2];      // each output tile starts from its first product (accumulate = 0)
  for (int t = 0; t < OC / BO; ++t) {{
    for (int ks = 0; ks < KS; ++ks) {{
      const int it = t * KS + ks;
#if TMA_WARP
      const int u = KT + it;
      tf_mbar_wait(full + u % STAGES, (u / STAGES) & 1);
      const unsigned w2s_at = tf_smem_addr(pipe + (u % STAGES) * SLOT);
#else
      const unsigned w2s_at = w2_ready(pipe, full2, it);
#endif
#if PRODUCER   // A: the producer's copy of H's k-tile, in the slot
      const unsigned a_at = w2s_at;
      const int a_k = 0;
#else          // A: the cluster's H, gathered here
      const unsigned a_at = hf_at;
      const int a_k = ks * BK;
#endif
      tf_wgmma_fence();
      #pragma unroll
      for (int s = 0; s < BK / 16; ++s)
        tf_wgmma_m64n{c.ow}k16(acc2, tf_kmajor_desc(a_at, BM, gm * 64, a_k + s * 16),
                             tf_nmajor_desc(w2s_at + W2_AT, BK, gn * OW, s * 16),
                             ks > 0 || s > 0);
      tf_wgmma_commit();
      tf_wgmma_wait<1>();
#if TMA_WARP
      if (pending >= 0) release_slot(empty, pending, STAGES);
      pending = u;
#elif PRODUCER
      if (it > 0) release_slot(empty2, it - 1, W2_STAGES);
#else
      w2_advance(pipe, full2, empty2, plan, it, T, KS, nc, o_base);
#endif
    }}
    tf_wgmma_wait<0>();   // this output tile is complete: add it to the other clusters' sums
#if TMA_WARP
    release_slot(empty, pending, STAGES);
    pending = -1;
#endif
    tf_fence_regs(acc2);
    add_tile(ysum, acc2, m0 + erow, o_base + t * BO + gn * OW + ecol);
  }}
#if PRODUCER
  tf_cluster_arrive();    // no CTA leaves while a peer's producer may still read its slice
  tf_cluster_wait();
#endif
#endif
}}
"""
