"""Load policies: what the producer copies into shared memory, and how (TMA boxes of a
``[batch·heads, tokens, D]`` view or of a map's patches and windows)."""
from __future__ import annotations

from ..map_tiles import tma_load_call, tma_prefetch_call
from ..tma import ELEMENT_BYTES
from ..wgmma import fragment_bit_words


def attention_policy_defines(c) -> str:
    """Where the key blocks come from (the block schedule's lists, or a map's windows) and the
    bits of a partial block's mask copied with them."""
    return f"""#define LISTS {int(c.lists)}
// queries in patches of a map, keys in windows of it (their mask as bits per element)
#define TILED {int(c.tiled)}
#define TILED_ROW_BLOCKS {c.tiling.rows.padded // c.knobs.block_m if c.tiled else 0}
#define WINDOWS {c.tiling.cols.bound if c.tiled else 0}   // list entries per row block
#define MASK_WORDS {fragment_bit_words(c.bn)}              // a consumer thread's bits of a block
#define MASK_BYTES (TILED ? CONSUMERS * MASK_WORDS * 128 * 4 : 0)
"""


def attention_tile_bytes(c) -> str:
    """The swizzle atoms along the head dims (q·k's, p·v's) and the bytes of a query tile, a
    key block and a value block."""
    tile = "" if c.score_tile is None else \
        "#define T_BYTES (BM * BN * 2)           // a key block's tile of the score's tensor\n" \
        if not c.score_tile.strip else \
        (f"#define T_COPY (BN * {ELEMENT_BYTES[c.score_tile.dtype]})   // a key block's strip\n"
         "#define T_BYTES ((T_COPY + 1023) / 1024 * 1024)   // its slot (aligned for a box of "
         "128 bytes, which TMA swizzles)\n")
    return """#define ATOMS (D_ / 64)                 // 128-byte swizzle atoms along q·k's head dim
#define V_ATOMS (DV_ / 64)              // and along the values'
#define Q_BYTES (BM * D_ * 2)
#define K_BYTES (BN * D_ * 2)
#define V_BYTES (BN * DV_ * 2)
""" + tile


def attention_producer_loads(c) -> str:
    """A tile's queries (prefetched into L2 first), then each key block's keys and values (and a
    partial block's mask bits) into its ring slot, by TMA: 3-D boxes of ``[batch·heads, tokens,
    D]``, or a map's boxes where the plan is tiled."""
    return f"""#if TILED
          int qc[{c.rank - 1}];
          bool q_ok;
          tf_map_corner(tf_row_token(w.rb * BM, q_ok), w.bh, qc);
#endif
          // the next tile's queries into L2 while the consumers finish this one: their copy
          // into the query buffer waits until it is free (q_free), then reads L2, not memory
          if (k >= 1) {{
            #pragma unroll
            for (int a = 0; a < ATOMS; ++a)
#if TILED
              {tma_prefetch_call(c.rank, "q_map", "a * 64", "qc")};
#else
              {flat_box(c, "prefetch", "q_map", "w.rb * BM", "w.bh", "H_")};
#endif
            tf_mbar_wait(q_free, (k - 1) & 1);
          }}
          tf_mbar_expect(bar_q, Q_BYTES);
          #pragma unroll
          for (int a = 0; a < ATOMS; ++a)
#if TILED
            {tma_load_call(c.rank, "q_tile + a * BM * 128", "q_map", "a * 64", "qc", "bar_q")};
#else
            {flat_box(c, "load", "q_map", "w.rb * BM", "w.bh", "H_", "q_tile + a * BM * 128",
                       "bar_q")};
#endif
          for (int it = 0; it < w.count; ++it) {{
            const int u = use + it, s = u % STAGES;
#if TILED
            int kc[{c.rank - 1}];
            tf_map_corner(key_block(w, it, pi, fi), w.kv, kc);   // the window's origin
            const bool bits = it < w.n_partial;
#else
            const int n0 = key_block(w, it, pi, fi) * BN;
            const bool bits = false;
#endif
            if (u >= STAGES) tf_mbar_wait(empty_k + s, ((u / STAGES) - 1) & 1);
            tf_mbar_expect(full_k + s, K_BYTES + (bits ? MASK_BYTES : 0));
            #pragma unroll
            for (int a = 0; a < {c.key_boxes}; ++a)
#if TILED
              {tma_load_call(c.rank, "k_tiles + s * K_BYTES + a * BN * 128", "k_map", "a * 64",
                             "kc", "full_k + s")};
            if (bits)
              tf_bulk_load(mask_tiles + s * MASK_BYTES,
                           mbits + (size_t)(mbits_off[w.rb] + it) * (MASK_BYTES / 4), MASK_BYTES,
                           full_k + s);
#else
              {_key_box(c)};
#endif
{_score_tile_loads(c)}            if (u >= STAGES) tf_mbar_wait(empty_v + s, ((u / STAGES) - 1) & 1);
            tf_mbar_expect(full_v + s, V_BYTES);
            #pragma unroll
            for (int a = 0; a < V_ATOMS; ++a)
#if TILED
              {tma_load_call(c.rank, "v_tiles + s * V_BYTES + a * BN * 128", "v_map", "a * 64",
                             "kc", "full_v + s")};
#else
              {flat_box(c, "load", "v_map", "n0", "w.kv", "HKV_",
                         "v_tiles + s * V_BYTES + a * BN * 128", "full_v + s")};
#endif
          }}
          use += w.count;
"""


def _key_box(c) -> str:
    """One TMA box of a key block's keys: 64 head-dim elements of its rows (:func:`flat_box`),
    or, where k holds its keys innermost (``[B, H, D, N]``), 64 keys of every head-dim row — an
    atom of the MN-major operand of q·kᵀ, ``D_`` rows of 128 bytes."""
    if not c.keys_innermost:
        return flat_box(c, "load", "k_map", "n0", "w.kv", "HKV_",
                         "k_tiles + s * K_BYTES + a * BN * 128", "full_k + s")
    return (f"tf_tma_load_4d(k_tiles + s * K_BYTES + a * D_ * 128, k_map,\n{' ' * 29}"
            "n0 + a * 64, 0, w.kv % HKV_, w.kv / HKV_, full_k + s)")


def _score_tile_loads(c) -> str:
    """The key block's tile of the tensor the score reads by query and key: boxes of the row
    block's queries × 64 keys into a ring of their own (``full_t`` / ``empty_t``), copied right
    after the keys — the score needs it before the values — and released once the block's score
    is taken, not with the values after p·v (``benchmarks.unlisted_kernels``,
    ``biased_attention_bshd``: 10 % faster than counting the tiles with the values)."""
    if c.score_tile is None:
        return ""
    if c.score_tile.strip:   # one box: the block's keys of the strip
        at = c.score_tile.coordinates("n0", "", "w.bh / H_", "w.bh % H_")
        return f"""            if (u >= STAGES) tf_mbar_wait(empty_t + s, ((u / STAGES) - 1) & 1);
            tf_mbar_expect(full_t + s, T_COPY);
            tf_tma_load_{c.score_tile.rank}d(score_tiles + s * T_BYTES, t_map, {at}, full_t + s);
"""
    at = c.score_tile.coordinates("n0 + a * 64", "w.rb * BM", "w.bh / H_", "w.bh % H_")
    return f"""            if (u >= STAGES) tf_mbar_wait(empty_t + s, ((u / STAGES) - 1) & 1);
            tf_mbar_expect(full_t + s, T_BYTES);
            #pragma unroll
            for (int a = 0; a < BN / 64; ++a)   // the score's tile: 64 keys × BM rows a box
              tf_tma_load_{c.score_tile.rank}d(score_tiles + s * T_BYTES + a * BM * 128, t_map,
                             {at}, full_t + s);
"""


def flat_box(c, kind: str, tensor_map: str, token: str, head: str, heads: str, dst: str = "",
              bar: str = "") -> str:
    """One TMA box of the flat order: 64 head-dim elements of rows ``token …`` of the tile's
    (batch, head) ``head`` (``batch · heads + head``) — a 3-D box of the ``[batch·heads, tokens,
    D]`` view, or, in a permuted layout (``tma_strided_boxes``), a 4-D box of a map whose
    dimensions are the tensor's own strides (head dim, tokens, head, batch), so that
    ``[B, S, H, D]`` or ``[S, B, H, D]`` tensors are read in place."""
    rank, coords = (4, f"a * 64, {token}, {head} % {heads}, {head} / {heads}") if c.strided \
        else (3, f"a * 64, {token}, {head}")
    if kind == "prefetch":
        return f"tf_tma_prefetch_{rank}d({tensor_map}, {coords})"
    return f"tf_tma_load_{rank}d({dst}, {tensor_map},\n{' ' * 29}{coords}, {bar})"


def gemm_tile_bytes(c) -> str:
    """A k-block's bytes and each CTA's share of a weight tile (multicast over the cluster, or
    all of it by its leader)."""
    return f"""#define LEADER {int(c.knobs.multicast == "leader")}   // CTA 0 copies whole weight tiles for both
#define A_BYTES (BM * BK * 2)
#define B_BYTES (BN * BK * 2)
#define STAGE_BYTES (A_BYTES + G * B_BYTES)
// weight rows (K-major) or columns (MN-major) one producer copies
#define B_PART (LEADER ? BN : BN / CLUSTER)
"""


def gemm_producer_defines(c) -> str:
    """The producer's policies: waiting for a kernel before (a dependent launch), the weights'
    L2 policy, pacing the CTAs' copies to the grid's average."""
    return f"""#define DEPENDENT {int(c.dependent)}   // launched as a programmatic dependent
#define EVICT_WEIGHTS {int(c.knobs.weights_l2 == "evict_first")}   // weights: L2 evict-first policy
#define PACE {c.knobs.pace}         // a CTA issues at most PACE k-blocks more than the grid's average
#define PACE_EVERY 4        // k-blocks between a CTA's look at the average
// the most sleeps of 128 ns one look may wait: the average counts CTAs that have not started
// (another stream's kernel may hold their SMs while this grid's early CTAs wait), so a wait is
// bounded, never a condition for progress
#define PACE_SPINS 64
#define PACE_DONE (1u << 20)   // what a CTA that issued all its k-blocks adds: never waited for
// after the split tiles' counters: [0] k-blocks issued by the grid, [1] producers done (read from
// the kernel's parameters where used: the producer has 40 registers)
#define PACE_COUNTER ((unsigned*)counters + tail * CLUSTER)
"""


def gemm_weight_loads(c) -> str:
    """A k-block of every weight into a ring slot: this CTA's share, multicast, with the L2
    policy; weights with the batch axis as 3-D boxes of the tile's batch (no cluster, no
    policy: the plan refuses those knobs for them)."""
    if c.plan.weights_batched:
        return """
// Ring slot `s` gets k-block `kb` of every weight's tile at column n0 of batch z, counted on
// `bar` (3-D maps: [batch, N, K] or [batch, K, N]).
__device__ __forceinline__ void load_weights(unsigned char* b_tiles, const void* maps, int s,
                                             int kb, int n0, unsigned long long* bar,
                                             unsigned rank, unsigned long long policy, int z) {
  #pragma unroll
  for (int x = 0; x < G; ++x) {
    const void* b_map = (const char*)maps + 128 * (1 + x);
    unsigned char* b = b_tiles + (s * G + x) * B_BYTES;
#if B_KMAJOR    // [N, K]: BN rows of 64 k
    tf_tma_load_3d(b, b_map, kb * BK, n0, z, bar);
#else           // [K, N]: atoms of 64 columns × 64 k-rows
    #pragma unroll
    for (int a = 0; a < BN / 64; ++a)
      tf_tma_load_3d(b + a * BK * 128, b_map, n0 + a * 64, kb * BK, z, bar);
#endif
  }
}
"""
    return """
// One box of a weight at (c0, c1): multicast to the cluster, with the L2 policy where
// EVICT_WEIGHTS.
__device__ __forceinline__ void copy_weight_box(void* dst, const void* map, int c0, int c1,
                                                unsigned long long* bar,
                                                unsigned long long policy) {
#if CLUSTER > 1 && EVICT_WEIGHTS
  tf_tma_load_2d_multicast_hint(dst, map, c0, c1, bar, (1 << CLUSTER) - 1, policy);
#elif CLUSTER > 1
  tf_tma_load_2d_multicast(dst, map, c0, c1, bar, (1 << CLUSTER) - 1);
#elif EVICT_WEIGHTS
  tf_tma_load_2d_hint(dst, map, c0, c1, bar, policy);
#else
  tf_tma_load_2d(dst, map, c0, c1, bar);
#endif
}

// Ring slot `s` gets k-block `kb` of every weight's tile at column n0, counted on `bar`: this
// CTA's share (B_PART rows or columns), multicast to the cluster; with LEADER CTA 0 copies all
// of it and the others nothing.
__device__ __forceinline__ void load_weights(unsigned char* b_tiles, const void* maps, int s,
                                             int kb, int n0, unsigned long long* bar,
                                             unsigned rank, unsigned long long policy) {
#if LEADER
  if (rank != 0) return;
#endif
  #pragma unroll
  for (int x = 0; x < G; ++x) {
    const void* b_map = (const char*)maps + 128 * (1 + x);
    unsigned char* b = b_tiles + (s * G + x) * B_BYTES;
#if B_KMAJOR    // [N, K]: BN rows of 64 k; this CTA's share is rows [rank·B_PART, +B_PART)
    copy_weight_box(b + (LEADER ? 0 : rank) * B_PART * 128, b_map, kb * BK,
                    n0 + (LEADER ? 0 : rank) * B_PART, bar, policy);
#else           // [K, N]: atoms of 64 columns × 64 k-rows; this CTA's share is B_PART columns
    #pragma unroll
    for (int a = 0; a < B_PART / 64; ++a) {
      const int atom = (LEADER ? 0 : rank) * (B_PART / 64) + a;
      copy_weight_box(b + atom * BK * 128, b_map, n0 + atom * 64, kb * BK, bar, policy);
    }
#endif
  }
}
"""


def gemm_producer_loop(c) -> str:
    """The producer's copies: each work item's k-blocks of the rows operand and of the weights
    into the ring, paced where ``PACE``; with a batch axis, of the tile's batch."""
    d, z = ("3", ", z") if c.plan.a_batched else ("2", "")
    a_copy = f"tf_tma_load_{d}d(a_tiles + s * A_BYTES, a_map, kb * BK, m0{z}, full + s)" \
        if c.plan.a_k_major else \
        (f"// a stored [K, M]: atoms of 64 rows × 64 k\n          #pragma unroll\n"
         f"          for (int a = 0; a < BM / 64; ++a)\n"
         f"            tf_tma_load_{d}d(a_tiles + s * A_BYTES + a * BK * 128, a_map, "
         f"m0 + a * 64,\n                             kb * BK{z}, full + s)")
    weights_z = ", z" if c.plan.weights_batched else ""
    return f"""      int it = 0;
      for (int item = first_unit; item < items; item += unit_step) {{
        int m0, n0{c.z};
        const Work w = tile_at(item, full_items, pieces, kblocks, row_units, tiles_n, group_m,
                               rank, m0, n0{c.z});
        for (int kb = w.k0; kb < w.k1; ++kb, ++it) {{
          const int s = it % STAGES;
#if PACE
          // CTAs that read the same k-blocks at once share DRAM pages: one that ran ahead waits
          // a while (the slowest never does: it is at or below the average)
          if (it > 0 && it % PACE_EVERY == 0) {{
            tf_pace_add(PACE_COUNTER, PACE_EVERY);
            for (int n = 0; n < PACE_SPINS && it > PACE &&
                 (unsigned)(it - PACE) * gridDim.x > tf_pace_read(PACE_COUNTER); ++n)
              __nanosleep(128);
          }}
#endif
          if (it >= STAGES) tf_mbar_wait(empty + s, ((it / STAGES) - 1) & 1);
          tf_mbar_expect(full + s, STAGE_BYTES);
          {a_copy};
          load_weights(b_tiles, maps, s, kb, n0, full + s, rank, policy{weights_z});
        }}
      }}
#if PACE
      tf_pace_add(PACE_COUNTER, it % PACE_EVERY + PACE_DONE);   // the rest, and: done
      __threadfence();
      if (atomicAdd(PACE_COUNTER + 1, 1u) == gridDim.x - 1) {{   // the last producer resets
        atomicExch(PACE_COUNTER, 0u);
        atomicExch(PACE_COUNTER + 1, 0u);
      }}
#endif
    }}
"""


def chain_swizzle(c) -> str:
    """Where a chunk of a 128-byte-swizzled tile lands."""
    return """
// 128-byte-swizzled tiles (see wgmma.py): a K-major tile of `rows` rows is cut into atoms of 64
// k (128 bytes per row); chunk `chunk` (8 elements) of row r of atom a lands at
// a·rows·128 + r·128 + ((chunk ^ r % 8) · 16). An N-major tile of `depth` k-rows is cut into atoms
// of 64 columns the same way, k playing the row. Eight threads that copy one 128-byte row of
// global memory write one 128-byte span of shared memory: whole lines, no bank conflicts.
__device__ __forceinline__ int swizzled(int atom, int row, int chunk, int rows) {
  return atom * rows * 128 + row * 128 + ((chunk ^ (row % 8)) * 16);
}

"""


def chain_copy_geometry(c) -> str:
    """How the copying threads share a tile's rows and chunks."""
    return """#define THREADS (32 * WARPS)           // consumer threads
#define X_ROWS (COPIERS / 8)           // x rows per pass of the copying threads (BK = 64: 8 chunks)
// An N-major weight tile row of BN (or BO) columns is BN / 8 chunks; at most COPIERS / 8 threads
// share a row (LANES), so that a pass covers a multiple of 8 rows, and each copies REPS chunks
// LANES apart in it (LANES is a multiple of 8: the same chunk of a later atom).
#define W_LANES TF_MIN(BN / 8, COPIERS / 8)
#define W_ROWS (COPIERS / W_LANES)     // gate-weight k-rows per pass
#define W_REPS (BN / 8 / W_LANES)
#define W2_LANES TF_MIN(BO / 8, COPIERS / 8)
#define W2_ROWS (COPIERS / W2_LANES)   // W2 k-rows per pass
#define W2_REPS (BO / 8 / W2_LANES)
"""


def chain_cp_async(c) -> str:
    """Each thread's cp.async copies, planned once per CTA: a first-product stage, a W2 tile."""
    return """
// What one thread copies with cp.async: the same 16-byte column of every X_ROWS-th x row, every
// W_ROWS-th weight k-row and every W2_ROWS-th W2 k-row (W_REPS / W2_REPS columns, LANES chunks
// apart, where 128 producer threads copy 256-column tiles). Those strides are multiples of 8 rows, so a
// chunk's 128-byte swizzle is the same in every pass: the thread's shared offsets and global
// addresses differ between passes and k-tiles only by constants, and are computed once here
// instead of per copy (phase 1 was bound by its warps' instruction issue: Nsight Compute).
struct CopyPlan {
  const __nv_bfloat16* x;    // row m0 + t / 8, column 8·(t % 8)
  const __nv_bfloat16* x0;   // row 0 of that column: the address for rows past M (zero-filled)
  unsigned x_rows_ok;        // bit i: pass i's row is inside M
  unsigned x_smem, w_smem, w2_smem;
  const __nv_bfloat16* w[G];
  const __nv_bfloat16* w2;   // k-row t / (BO / 8), column 8·(t % (BO / 8)); + n0 rows, + o0
};

// `t`: the thread's index among the COPIERS.
__device__ __forceinline__ CopyPlan copy_plan(const __nv_bfloat16* __restrict__ x,
    const __nv_bfloat16* const* ws, const __nv_bfloat16* __restrict__ w2, int m0, int n0, int t) {
  CopyPlan p;
  const int xr = t / 8, xc = t % 8;
  p.x0 = x + xc * 8;
  p.x = p.x0 + (long)(m0 + xr) * K_;
  p.x_rows_ok = 0;
  #pragma unroll
  for (int i = 0; i < BM / X_ROWS; ++i)
    if (m0 + xr + i * X_ROWS < M_) p.x_rows_ok |= 1u << i;
  p.x_smem = swizzled(0, xr, xc, BM);
  const int wk = t / W_LANES, wc = t % W_LANES;
  #pragma unroll
  for (int j = 0; j < G; ++j) p.w[j] = ws[j] + (long)wk * N_ + n0 + wc * 8;
  p.w_smem = swizzled(wc / 8, wk, wc % 8, BK);
  const int vk = t / W2_LANES, vc = t % W2_LANES;
  p.w2 = w2 + (long)vk * O_ + vc * 8;
  p.w2_smem = swizzled(vc / 8, vk, vc % 8, BK);
  return p;
}

// One first-product stage: x rows [m0, m0 + BM) × k [k0, k0 + BK) (K-major), then each gate
// weight's k rows × BN columns (N-major).
__device__ __forceinline__ void load_stage(char* stage, const CopyPlan& p, int k0) {
  const unsigned s = tf_smem_addr(stage);
  #pragma unroll
  for (int i = 0; i < BM / X_ROWS; ++i) {
    const bool ok = (p.x_rows_ok >> i) & 1;
    tf_cp_async16_at(s + p.x_smem + i * X_ROWS * 128,
                     ok ? p.x + (long)i * X_ROWS * K_ + k0 : p.x0, ok);
  }
  #pragma unroll
  for (int j = 0; j < G; ++j)
    #pragma unroll
    for (int i = 0; i < BK / W_ROWS; ++i)
      #pragma unroll
      for (int r = 0; r < W_REPS; ++r)
        tf_cp_async16_at(s + BM * BK * 2 + j * BK * BN * 2 + p.w_smem + i * W_ROWS * 128 +
                         r * (W_LANES / 8) * BK * 128,
                         p.w[j] + (long)(k0 + i * W_ROWS) * N_ + r * W_LANES * 8, true);
}

// BK rows (from n0) × BO columns (from o0) of W2, N-major.
__device__ __forceinline__ void load_w2(char* dst, const CopyPlan& p, int n0, int o0) {
  const unsigned s = tf_smem_addr(dst);
  #pragma unroll
  for (int i = 0; i < BK / W2_ROWS; ++i)
    #pragma unroll
    for (int r = 0; r < W2_REPS; ++r)
      tf_cp_async16_at(s + p.w2_smem + i * W2_ROWS * 128 + r * (W2_LANES / 8) * BK * 128,
                       p.w2 + (long)(n0 + i * W2_ROWS) * O_ + o0 + r * W2_LANES * 8, true);
}
"""


def chain_tma(c) -> str:
    """The stages by TMA, issued by one thread."""
    return """
#if TMA
// The stages by TMA, issued by one thread: x as one box of BM rows, each weight (and W2) as
// 64-column boxes of BK rows (rows of x past M arrive as zeros); the bytes complete on `bar`.
__device__ __forceinline__ void load_stage_tma(char* stage, const char* map_x, const char* maps,
    int m0, int n0, int k0, unsigned long long* bar, bool issue = true) {
  tf_mbar_expect(bar, BM * BK * 2 + G * BK * BN * 2, issue);
  tf_tma_load_2d(stage, map_x, k0, m0, bar, issue);
  #pragma unroll
  for (int j = 0; j < G; ++j)
    #pragma unroll
    for (int a = 0; a < BN / 64; ++a)
      tf_tma_load_2d(stage + BM * BK * 2 + j * BK * BN * 2 + a * BK * 128, maps + (1 + j) * 128,
                     n0 + 64 * a, k0, bar, issue);
}
__device__ __forceinline__ void load_w2_tma(char* dst, const char* map_w2, int n0, int o0,
                                            unsigned long long* bar, bool issue = true) {
  tf_mbar_expect(bar, BK * BO * 2, issue);
  #pragma unroll
  for (int a = 0; a < BO / 64; ++a)
    tf_tma_load_2d(dst + a * BK * 128, map_w2, o0 + 64 * a, n0, bar, issue);
}
// What the copying thread needs: the tensor maps (x, the gate weights, w2) and the CTA's tile.
struct TmaPlan {
  const char* maps;
  int m0, n0;
};
typedef TmaPlan Plan;
#else
typedef CopyPlan Plan;
#endif

"""


def chain_h_tiles(c) -> str:
    """The producer warpgroup's copies of H's k-tiles from the owning peer."""
    return """#if PRODUCER
// Which CTA of the cluster holds k-tile `ks` of the cluster's H, and where in its K-major slice
// (one 128-byte-swizzled atom of BM rows, BM × BK × 2 bytes).
#define H_OWNER(ks) ((ks) / (BN / BK))
#define H_ATOM_AT(ks) (((ks) % (BN / BK)) * BM * BK * 2)
#define H_CHUNKS (BM * BK * 2 / 16 / PRODUCER_THREADS)   // 16-byte chunks per producer thread
// Phase 2, by the producer warpgroup (thread `t` of it): k-tile `ks` of the cluster's H from the
// owning peer into the slot's first BM × BK bytes, byte for byte (the same rows, so the same
// swizzle), published to the consumers' wgmma (async proxy) and counted on the slot's "full"
// barrier. (Reading the CTA's own k-tiles in place instead, and loading the next k-tile while
// waiting for a slot, measured no faster: benchmarks.cluster.)
__device__ __forceinline__ void copy_h_tile(char* slot, unsigned hf_addr, int ks, int t,
                                            unsigned long long* full) {
  const unsigned src = tf_mapa(hf_addr + H_ATOM_AT(ks), H_OWNER(ks)), dst = tf_smem_addr(slot);
  uint4 v[H_CHUNKS];
  #pragma unroll
  for (int i = 0; i < H_CHUNKS; ++i) v[i] = tf_ld_dsm_u32x4(src + (t + i * PRODUCER_THREADS) * 16);
  #pragma unroll
  for (int i = 0; i < H_CHUNKS; ++i) tf_st_smem_v4(dst + (t + i * PRODUCER_THREADS) * 16, v[i]);
  tf_fence_proxy_async();
  tf_mbar_arrive(full);
}
#endif

"""


def chain_producers(c) -> str:
    """The producer warpgroup or warp: every copy of both products, ahead of the consumers."""
    return """#if PRODUCER
  if (warp >= WARPS) {   // the producer warpgroup: every copy, ahead of the consumers
    tf_setmaxnreg_dec<PRODUCER_REGS>();
    const int t = threadIdx.x - THREADS;
    const CopyPlan plan = copy_plan(x, ws, w2, m0, n0, t);
    for (int u = 0; u < KT; ++u) fill_stage(pipe, full, empty, plan, u);
    // W2's ring reuses the stages' bytes: wait for the consumers' MMAs on the last use of each
    for (int u = KT; u < KT + STAGES; ++u) wait_free_slot(empty, u, STAGES);
    tf_cluster_wait();    // the consumers' cluster barriers; nothing of ours to publish
    tf_cluster_arrive();
    for (int u = 0; u < W2_STAGES && u < T; ++u) fill_w2(pipe, full2, empty2, plan, u, KS, nc, o_base);
    tf_cluster_wait();    // acquire: every slice of H is in place
    const unsigned hf_addr = tf_smem_addr(hf);
    for (int it = 0; it < T; ++it) {
      if (it >= W2_STAGES) fill_w2(pipe, full2, empty2, plan, it, KS, nc, o_base);
      copy_h_tile(pipe + (it % W2_STAGES) * W2_SLOT, hf_addr, it % KS, t, full2 + it % W2_STAGES);
    }
    tf_cluster_arrive();  // no CTA leaves while a peer's producer may still read its slice
    tf_cluster_wait();
    return;
  }
  tf_setmaxnreg_inc<CONSUMER_REGS>();
#elif TMA
  const TmaPlan plan{maps, m0, n0};
#else
  const CopyPlan plan = copy_plan(x, ws, w2, m0, n0, threadIdx.x);
#endif
#else
  // One ring for the whole copy stream: KT first-product stages, then T W2 tiles.
  const char* map_x = maps;                           // maps: x, the gate weights, w2
  const char* map_w2 = maps + (1 + G) * 128;
  if (threadIdx.x == 0) {
    for (int i = 0; i < STAGES; ++i) {
      tf_mbar_init(full + i, 1);
      tf_mbar_init(empty + i, 32 * WARPS / 128);   // one arrival per consumer warpgroup
    }
    tf_mbar_init_fence();
    for (int i = 0; i < G + 2; ++i) tf_tensormap_acquire(maps + i * 128);
  }
  __syncthreads();
  if (warp == WARPS) {   // the producer warp
    if (lane == 0)
      for (int u = 0; u < KT; ++u) {
        wait_free_slot(empty, u, STAGES);
        load_stage_tma(pipe + (u % STAGES) * SLOT, map_x, maps, m0, n0, u * BK, full + u % STAGES);
      }
    __syncwarp();
    tf_cluster_wait();    // the same cluster barriers as the consumers; nothing of ours to publish
    tf_cluster_arrive();
    if (lane == 0)        // W2 streams in while the consumers exchange H
      for (int it = 0; it < T; ++it) {
        const int u = KT + it;
        wait_free_slot(empty, u, STAGES);
        load_w2_tma(pipe + (u % STAGES) * SLOT, map_w2, nc + (it % KS) * BK,
                    o_base + (it / KS) * BO, full + u % STAGES);
      }
    __syncwarp();
    tf_cluster_wait();
    return;
  }
#endif

"""
