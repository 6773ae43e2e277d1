"""The GEMM-chain kernel's body on Hopper's warpgroup MMA (``mma="wgmma"``).

The same algorithm as the mma.sync body in :mod:`.gemm_chain` — first product into H in shared
memory, shared over the cluster through DSM, then ``O / cluster`` output columns per CTA — with the
tensor-core work issued by two warpgroups as ``wgmma.mma_async`` on shared-memory descriptors, and,
with ``exchange="peer"``, the second product's A operand in registers loaded from the peers' slices
(``ld.shared::cluster``, two register sets: one feeds the k-tile in flight, the other is refilled).
Every tile (x, the gate weights, H, W2) is kept in the 128-byte-swizzled layout, so that the
cp.async copies read whole 128-byte lines *and* write 128-byte spans of shared memory. (A first
version used the unswizzled core-matrix layout: its scattered shared-memory destinations split
each copy into 2.7× the L2 requests of the mma.sync path — ncu: L2 87 % busy — and it ran 1.4×
slower.) With ``copy="tma"`` and the all-gather a producer warp fills the same tiles by bulk
tensor copies (:mod:`.tma`) into one ring of slots — phase 1's stages, then phase 2's W2 tiles —
and the consumer warpgroups release each slot on an mbarrier when their MMAs on it are done; with
``copy="tma"`` and peer reads one consumer thread issues them into the cp.async rings below. With
``copy="producer"`` a third warpgroup (``setmaxnreg``) issues every cp.async copy and copies each
k-tile of H from its owner into the ring, so both products read A from shared memory. Both measured
slower than cp.async by every thread (RESULTS.md, "FFN v8"). With cp.async the same
two mbarriers per slot drive two rings (phase 1's stages, then W2's tiles): every thread's copies
arrive on the slot's "full" barrier as they land (``cp.async.mbarrier.arrive``), each warpgroup
arrives on "empty" once its MMAs on the slot are done, and the copies run up to ``slots − 1`` k-tiles
ahead with no CTA barrier per k-tile (a ``__syncthreads`` version ran ``STAGES − 2`` ahead:
RESULTS.md, "FFN v7"). Each thread's copies follow a plan made once per CTA (``CopyPlan``): with
only two warps per scheduler, the per-copy address arithmetic had made the first product bound by
instruction issue (ncu; RESULTS.md, "FFN v6").
"""
from __future__ import annotations

from .tma import HELPERS as TMA_HELPERS
from .tma import MBARRIER_HELPERS
from .wgmma import HELPERS, wgmma_function


PRODUCER_THREADS = 128  # copy="producer": one warpgroup (setmaxnreg works per warpgroup)


def wgmma_body(plan, knobs, layout, activation: str) -> str:
    """Device code after :func:`gemm_chain._header` for ``mma="wgmma"``: ``layout`` is the
    pipeline geometry the template chose (``gemm_chain_plan.WgmmaLayout``), ``activation`` the
    activation's C++."""
    g = len(plan.gates)
    wg_m = knobs.block_m // 64          # warpgroups along the rows (1 or 2)
    wg_n = 2 // wg_m                    # and along the columns
    nw, ow = knobs.block_n // wg_n, knobs.block_o // wg_n
    peer = knobs.exchange == "peer"
    producer = knobs.copy == "producer"
    functions = wgmma_function(nw) + (wgmma_function(ow, a_in_registers=True)
                                      if peer and not producer else
                                      wgmma_function(ow) if ow != nw else "")
    gate_values = "".join(f"float g{j} = acc[{j}][4 * jj + 2 * half + e]; " for j in range(g))
    tma = knobs.copy == "tma"
    pipe_bytes = layout.pipe_bytes   # STAGES slots of the larger stage
    w2_stages = layout.w2_stages
    ahead1, ahead2 = layout.ahead1, layout.ahead2
    return f"""{HELPERS}
{MBARRIER_HELPERS}
{TMA_HELPERS if tma else ""}
{functions}
#define TMA {int(tma)}
#define PEER {int(peer)}        // H stays in each CTA; phase 2 reads it from the peers
// TMA with the all-gather: a producer warp issues the copies into one ring; with peer reads one
// consumer thread issues them into the two rings the cp.async copies use
#define TMA_WARP (TMA && !PEER)
#define PRODUCER {int(producer)}    // a producer warpgroup issues every copy (warps WARPS …)
#define PRODUCER_THREADS {PRODUCER_THREADS}
#define COPIERS {PRODUCER_THREADS if producer else "THREADS"}   // threads that issue cp.async copies
// Registers per thread after `setmaxnreg`: the launch gives every thread 65536 / THREADS rounded
// down to 8 (168 for three warpgroups); the producer hands most of its share to the consumers,
// whose 128 f32 accumulators (128 × 256 tiles) need more than 168.
#define PRODUCER_REGS 56
#define CONSUMER_REGS 224
#define PIPE_BYTES {pipe_bytes}
#define SLOT {pipe_bytes // knobs.stages}     // one TMA slot: a stage of either product
#define STAGE_BYTES (BM * BK * 2 + G * BK * BN * 2)  // cp.async: a first-product stage
#define W2_BYTES (BK * BO * 2)                        // and a W2 tile
#define W2_SLOT {layout.w2_slot_bytes}   // a W2 slot (with the producer: H's k-tile, then W2)
#define W2_AT (W2_SLOT - W2_BYTES)           // where the W2 tile starts in its slot
#define WGN {wg_n}
#define NW {nw}                 // first-product columns per warpgroup
#define OW {ow}                 // output columns per warpgroup
// Phase 2 reuses the pipeline's bytes for W2 tiles, as many as fit (capped): where the first
// product's stages are larger (128 × 256 tiles, SwiGLU's two weights) W2 runs deeper than STAGES.
#define W2_STAGES {w2_stages}
#define AHEAD1 {ahead1}   // k-tiles copied ahead of the one being multiplied (wgmma_lookahead)
#define AHEAD2 {ahead2}   // W2 tiles likewise
#define TF_MIN(a, b) ((a) < (b) ? (a) : (b))
#define WARPS {knobs.warps}             // consumer warps (with TMA, warp WARPS is the producer)

// 128-byte-swizzled tiles (see wgmma.py): a K-major tile of `rows` rows is cut into atoms of 64
// k (128 bytes per row); chunk `chunk` (8 elements) of row r of atom a lands at
// a·rows·128 + r·128 + ((chunk ^ r % 8) · 16). An N-major tile of `depth` k-rows is cut into atoms
// of 64 columns the same way, k playing the row. Eight threads that copy one 128-byte row of
// global memory write one 128-byte span of shared memory: whole lines, no bank conflicts.
__device__ __forceinline__ int swizzled(int atom, int row, int chunk, int rows) {{
  return atom * rows * 128 + row * 128 + ((chunk ^ (row % 8)) * 16);
}}

#define THREADS (32 * WARPS)           // consumer threads
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

// What one thread copies with cp.async: the same 16-byte column of every X_ROWS-th x row, every
// W_ROWS-th weight k-row and every W2_ROWS-th W2 k-row (W_REPS / W2_REPS columns, LANES chunks
// apart, where 128 producer threads copy 256-column tiles). Those strides are multiples of 8 rows, so a
// chunk's 128-byte swizzle is the same in every pass: the thread's shared offsets and global
// addresses differ between passes and k-tiles only by constants, and are computed once here
// instead of per copy (phase 1 was bound by its warps' instruction issue: ncu, RESULTS.md).
struct CopyPlan {{
  const __nv_bfloat16* x;    // row m0 + t / 8, column 8·(t % 8)
  const __nv_bfloat16* x0;   // row 0 of that column: the address for rows past M (zero-filled)
  unsigned x_rows_ok;        // bit i: pass i's row is inside M
  unsigned x_smem, w_smem, w2_smem;
  const __nv_bfloat16* w[G];
  const __nv_bfloat16* w2;   // k-row t / (BO / 8), column 8·(t % (BO / 8)); + n0 rows, + o0
}};

// `t`: the thread's index among the COPIERS.
__device__ __forceinline__ CopyPlan copy_plan(const __nv_bfloat16* __restrict__ x,
    const __nv_bfloat16* const* ws, const __nv_bfloat16* __restrict__ w2, int m0, int n0, int t) {{
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
}}

// One first-product stage: x rows [m0, m0 + BM) × k [k0, k0 + BK) (K-major), then each gate
// weight's k rows × BN columns (N-major).
__device__ __forceinline__ void load_stage(char* stage, const CopyPlan& p, int k0) {{
  const unsigned s = tf_smem_addr(stage);
  #pragma unroll
  for (int i = 0; i < BM / X_ROWS; ++i) {{
    const bool ok = (p.x_rows_ok >> i) & 1;
    tf_cp_async16_at(s + p.x_smem + i * X_ROWS * 128,
                     ok ? p.x + (long)i * X_ROWS * K_ + k0 : p.x0, ok);
  }}
  #pragma unroll
  for (int j = 0; j < G; ++j)
    #pragma unroll
    for (int i = 0; i < BK / W_ROWS; ++i)
      #pragma unroll
      for (int r = 0; r < W_REPS; ++r)
        tf_cp_async16_at(s + BM * BK * 2 + j * BK * BN * 2 + p.w_smem + i * W_ROWS * 128 +
                         r * (W_LANES / 8) * BK * 128,
                         p.w[j] + (long)(k0 + i * W_ROWS) * N_ + r * W_LANES * 8, true);
}}

// BK rows (from n0) × BO columns (from o0) of W2, N-major.
__device__ __forceinline__ void load_w2(char* dst, const CopyPlan& p, int n0, int o0) {{
  const unsigned s = tf_smem_addr(dst);
  #pragma unroll
  for (int i = 0; i < BK / W2_ROWS; ++i)
    #pragma unroll
    for (int r = 0; r < W2_REPS; ++r)
      tf_cp_async16_at(s + p.w2_smem + i * W2_ROWS * 128 + r * (W2_LANES / 8) * BK * 128,
                       p.w2 + (long)(n0 + i * W2_ROWS) * O_ + o0 + r * W2_LANES * 8, true);
}}

// exchange="peer": the byte offset of lane `lane`'s A fragment (16 bytes) of 16-row block `rb`
// and k16 step `s` in a CTA's slice of H.
__device__ __forceinline__ unsigned hf_fragment(int rb, int s, int lane) {{
  return ((rb * (BN / 16) + s) * 32 + lane) * 16;
}}

// A finished output tile of a warpgroup (rows from `row`, columns from `col`) into the sums.
__device__ __forceinline__ void add_tile(float* __restrict__ ysum, const float (&acc2)[OW / 2],
                                         int row, int col) {{
  #pragma unroll
  for (int jj = 0; jj < OW / 8; ++jj)
    add_to_sums(ysum, row, col + 8 * jj, acc2[4 * jj], acc2[4 * jj + 1], acc2[4 * jj + 2],
                acc2[4 * jj + 3]);
}}

// The pipelines are rings of slots on mbarriers (no CTA barrier per k-tile): `full[u % slots]`
// completes when the copies of use u have landed — with cp.async, one arrival per thread
// (tf_cp_async_mbar_arrive), with TMA the bytes — and `empty[u % slots]` when both warpgroups' MMAs
// on use u are done (one arrival per warpgroup), after which use u + slots may refill the slot.
__device__ __forceinline__ void wait_full_slot(unsigned long long* full, int u, int slots) {{
  tf_mbar_wait(full + u % slots, (u / slots) & 1);
#if !TMA
  tf_fence_proxy_async();   // cp.async copies (generic proxy) are seen by this thread's wgmma
#endif
}}
__device__ __forceinline__ void release_slot(unsigned long long* empty, int u, int slots) {{
  if ((threadIdx.x & 127) == 0) tf_mbar_arrive(empty + u % slots);
}}
__device__ __forceinline__ void wait_free_slot(unsigned long long* empty, int u, int slots) {{
  if (u >= slots) tf_mbar_wait(empty + u % slots, (u / slots - 1) & 1);
}}

#if TMA
// The stages by TMA, issued by one thread: x as one box of BM rows, each weight (and W2) as
// 64-column boxes of BK rows (rows of x past M arrive as zeros); the bytes complete on `bar`.
__device__ __forceinline__ void load_stage_tma(char* stage, const char* map_x, const char* maps,
    int m0, int n0, int k0, unsigned long long* bar, bool issue = true) {{
  tf_mbar_expect(bar, BM * BK * 2 + G * BK * BN * 2, issue);
  tf_tma_load_2d(stage, map_x, k0, m0, bar, issue);
  #pragma unroll
  for (int j = 0; j < G; ++j)
    #pragma unroll
    for (int a = 0; a < BN / 64; ++a)
      tf_tma_load_2d(stage + BM * BK * 2 + j * BK * BN * 2 + a * BK * 128, maps + (1 + j) * 128,
                     n0 + 64 * a, k0, bar, issue);
}}
__device__ __forceinline__ void load_w2_tma(char* dst, const char* map_w2, int n0, int o0,
                                            unsigned long long* bar, bool issue = true) {{
  tf_mbar_expect(bar, BK * BO * 2, issue);
  #pragma unroll
  for (int a = 0; a < BO / 64; ++a)
    tf_tma_load_2d(dst + a * BK * 128, map_w2, o0 + 64 * a, n0, bar, issue);
}}
// What the copying thread needs: the tensor maps (x, the gate weights, w2) and the CTA's tile.
struct TmaPlan {{
  const char* maps;
  int m0, n0;
}};
typedef TmaPlan Plan;
#else
typedef CopyPlan Plan;
#endif

#if !TMA_WARP
// Use u of a ring, once the slot is free: the first product's stage (k-tile u) or W2's tile u (of
// T: k-tile u % KS of output tile u / KS) — with cp.async every copying thread's share, with TMA
// (peer reads) all of it from thread 0 (predicated: every thread waits for the slot as with
// cp.async, and no thread-divergent branch makes ptxas serialize the wgmma in flight).
__device__ __forceinline__ void fill_stage(char* pipe, unsigned long long* full,
    unsigned long long* empty, const Plan& plan, int u) {{
  wait_free_slot(empty, u, STAGES);
#if TMA
  load_stage_tma(pipe + (u % STAGES) * STAGE_BYTES, plan.maps, plan.maps, plan.m0, plan.n0,
                 u * BK, full + u % STAGES, threadIdx.x == 0);
#else
  load_stage(pipe + (u % STAGES) * STAGE_BYTES, plan, u * BK);
  tf_cp_async_mbar_arrive(full + u % STAGES);
#endif
}}
__device__ __forceinline__ void fill_w2(char* pipe, unsigned long long* full,
    unsigned long long* empty, const Plan& plan, int u, int KS, int nc, int o_base) {{
  wait_free_slot(empty, u, W2_STAGES);
#if TMA
  load_w2_tma(pipe + (u % W2_STAGES) * W2_SLOT + W2_AT, plan.maps + (1 + G) * 128,
              nc + (u % KS) * BK, o_base + (u / KS) * BO, full + u % W2_STAGES,
              threadIdx.x == 0);
#else
  load_w2(pipe + (u % W2_STAGES) * W2_SLOT + W2_AT, plan, nc + (u % KS) * BK,
          o_base + (u / KS) * BO);
  tf_cp_async_mbar_arrive(full + u % W2_STAGES);
#endif
}}
// Phase 2, W2 tile `it` (of T): the shared-memory address of its slot once its copies landed; and,
// once its MMAs are issued and tile it − 1's are done, releasing it − 1 and refilling ahead.
__device__ __forceinline__ unsigned w2_ready(char* pipe, unsigned long long* full, int it) {{
  wait_full_slot(full, it, W2_STAGES);
  return tf_smem_addr(pipe + (it % W2_STAGES) * W2_SLOT);
}}
__device__ __forceinline__ void w2_advance(char* pipe, unsigned long long* full,
    unsigned long long* empty, const Plan& plan, int it, int T, int KS, int nc, int o_base) {{
  if (it > 0) release_slot(empty, it - 1, W2_STAGES);
  if (it + AHEAD2 < T) fill_w2(pipe, full, empty, plan, it + AHEAD2, KS, nc, o_base);
}}
#endif

#if PRODUCER
// Which CTA of the cluster holds k-tile `ks` of the cluster's H, and where in its K-major slice
// (one 128-byte-swizzled atom of BM rows, BM × BK × 2 bytes).
#define H_OWNER(ks) ((ks) / (BN / BK))
#define H_ATOM_AT(ks) (((ks) % (BN / BK)) * BM * BK * 2)
#define H_CHUNKS (BM * BK * 2 / 16 / PRODUCER_THREADS)   // 16-byte chunks per producer thread
// Phase 2, by the producer warpgroup (thread `t` of it): k-tile `ks` of the cluster's H from the
// owning peer into the slot's first BM × BK bytes, byte for byte (the same rows, so the same
// swizzle), published to the consumers' wgmma (async proxy) and counted on the slot's "full"
// barrier. (Reading the CTA's own k-tiles in place instead, and loading the next k-tile while
// waiting for a slot, measured no faster: RESULTS.md, "FFN v8".)
__device__ __forceinline__ void copy_h_tile(char* slot, unsigned hf_addr, int ks, int t,
                                            unsigned long long* full) {{
  const unsigned src = tf_mapa(hf_addr + H_ATOM_AT(ks), H_OWNER(ks)), dst = tf_smem_addr(slot);
  uint4 v[H_CHUNKS];
  #pragma unroll
  for (int i = 0; i < H_CHUNKS; ++i) v[i] = tf_ld_dsm_u32x4(src + (t + i * PRODUCER_THREADS) * 16);
  #pragma unroll
  for (int i = 0; i < H_CHUNKS; ++i) tf_st_smem_v4(dst + (t + i * PRODUCER_THREADS) * 16, v[i]);
  tf_fence_proxy_async();
  tf_mbar_arrive(full);
}}
#endif

// Descriptors: a K-major operand (rows from `row0`, k from `k`, a multiple of 16) and an N-major
// one (columns from `col0`, a multiple of 64; k from `k`).
// `tile` is a shared-memory address (tf_smem_addr), taken once per tile, not per descriptor.
__device__ __forceinline__ unsigned long long kmajor_desc(unsigned tile, int rows, int row0,
                                                          int k) {{
  return tf_smem_desc_sw128_at(tile + (k / 64) * rows * 128 + row0 * 128 + (k % 64) * 2, 16, 1024);
}}
__device__ __forceinline__ unsigned long long nmajor_desc(unsigned tile, int depth, int col0,
                                                          int k) {{
  return tf_smem_desc_sw128_at(tile + (col0 / 64) * depth * 128 + k * 128, depth * 128, 1024);
}}

#if TMA_WARP
// Warp-specialized: a producer warp (warp WARPS) issues every copy into the STAGES slots of one
// stream — phase 1's KT stages, then phase 2's W2 tiles — waiting until the consumers have
// released a slot (`empty`, one arrival per consumer warpgroup); consumers wait on `full`.
__device__ __forceinline__ void consumers_sync() {{
  asm volatile("bar.sync 1, %0;" :: "n"(32 * WARPS) : "memory");
}}
#else
__device__ __forceinline__ void consumers_sync() {{ __syncthreads(); }}
#endif

extern "C" __global__ void @BOUNDS@
tf_chain_main(const __nv_bfloat16* __restrict__ x, @GATE_ARGS@const __nv_bfloat16* __restrict__ w2,
              float* __restrict__ ysum@MAPS_ARG@@SCALAR_ARGS@) {{
  extern __shared__ __align__(128) char smem[];
  tf_cluster_arrive();  // this CTA has started; after the matching wait peers may write into it
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wg = warp / 4;
  const int gm = wg / WGN, gn = wg % WGN;            // this warpgroup's row and column block
  const int erow = gm * 64 + (warp % 4) * 16 + lane / 4, ecol = 2 * (lane % 4);  // accumulators
  const unsigned rank = tf_cluster_rank();
  int m0, n0;
  tile_of_cta(rank, m0, n0);
  // swizzled tiles need 1024-byte alignment (the launch asks for 1 KB more than the tiles)
  char* hf = reinterpret_cast<char*>((reinterpret_cast<unsigned long long>(smem) + 1023) & ~1023ull);
#if PEER
  char* pipe = hf + BM * BN * 2;    // hf: this CTA's slice of H as A fragments (hf_fragment)
#else
  char* pipe = hf + BM * HW * 2;                      // hf: H of the cluster, BM × HW, K-major
#endif
  const int nc = n0 - (int)rank * BN, o_base = rank * OC;
  const int KT = K_ / BK, KS = HW / BK, T = (OC / BO) * KS;
  unsigned long long* full = reinterpret_cast<unsigned long long*>(pipe + PIPE_BYTES);
  unsigned long long* empty = full + STAGES;
#if !TMA_WARP
#if !TMA
  const __nv_bfloat16* ws[G] = {{@GATES@}};   // (TMA reads the gate weights through maps)
#endif
  // two rings over the same bytes: the first product's stages, then W2's tiles
  unsigned long long* full2 = empty + STAGES;
  unsigned long long* empty2 = full2 + W2_STAGES;
  if (threadIdx.x == 0) {{
    for (int i = 0; i < STAGES; ++i) {{        // TMA: one arrival and the bytes
      tf_mbar_init(full + i, TMA ? 1 : COPIERS);  // cp.async: every copying thread's copies
      tf_mbar_init(empty + i, THREADS / 128);   // every consumer warpgroup's MMAs
    }}
    for (int i = 0; i < W2_STAGES; ++i) {{      // (with the producer: its copies of H's k-tile too)
      tf_mbar_init(full2 + i, TMA ? 1 : COPIERS * (1 + PRODUCER));
      tf_mbar_init(empty2 + i, THREADS / 128);
    }}
    tf_mbar_init_fence();
#if TMA
    for (int i = 0; i < G + 2; ++i) tf_tensormap_acquire(maps + i * 128);
#endif
  }}
  __syncthreads();
#if PRODUCER
  if (warp >= WARPS) {{   // the producer warpgroup: every copy, ahead of the consumers
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
    for (int it = 0; it < T; ++it) {{
      if (it >= W2_STAGES) fill_w2(pipe, full2, empty2, plan, it, KS, nc, o_base);
      copy_h_tile(pipe + (it % W2_STAGES) * W2_SLOT, hf_addr, it % KS, t, full2 + it % W2_STAGES);
    }}
    tf_cluster_arrive();  // no CTA leaves while a peer's producer may still read its slice
    tf_cluster_wait();
    return;
  }}
  tf_setmaxnreg_inc<CONSUMER_REGS>();
#elif TMA
  const TmaPlan plan{{maps, m0, n0}};
#else
  const CopyPlan plan = copy_plan(x, ws, w2, m0, n0, threadIdx.x);
#endif
#else
  // One ring for the whole copy stream: KT first-product stages, then T W2 tiles.
  const char* map_x = maps;                           // maps: x, the gate weights, w2
  const char* map_w2 = maps + (1 + G) * 128;
  if (threadIdx.x == 0) {{
    for (int i = 0; i < STAGES; ++i) {{
      tf_mbar_init(full + i, 1);
      tf_mbar_init(empty + i, 32 * WARPS / 128);   // one arrival per consumer warpgroup
    }}
    tf_mbar_init_fence();
    for (int i = 0; i < G + 2; ++i) tf_tensormap_acquire(maps + i * 128);
  }}
  __syncthreads();
  if (warp == WARPS) {{   // the producer warp
    if (lane == 0)
      for (int u = 0; u < KT; ++u) {{
        wait_free_slot(empty, u, STAGES);
        load_stage_tma(pipe + (u % STAGES) * SLOT, map_x, maps, m0, n0, u * BK, full + u % STAGES);
      }}
    __syncwarp();
    tf_cluster_wait();    // the same cluster barriers as the consumers; nothing of ours to publish
    tf_cluster_arrive();
    if (lane == 0)        // W2 streams in while the consumers exchange H
      for (int it = 0; it < T; ++it) {{
        const int u = KT + it;
        wait_free_slot(empty, u, STAGES);
        load_w2_tma(pipe + (u % STAGES) * SLOT, map_w2, nc + (it % KS) * BK,
                    o_base + (it / KS) * BO, full + u % STAGES);
      }}
    __syncwarp();
    tf_cluster_wait();
    return;
  }}
#endif

  // Phase 1: acc[j] = x · w_j[:, n0 : n0 + BN] for this warpgroup's 64 rows × NW columns.
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
      const unsigned long long da = kmajor_desc(xs_at, BM, gm * 64, s * 16);
      #pragma unroll
      for (int j = 0; j < G; ++j)
        tf_wgmma_m64n{nw}k16(acc[j], da, nmajor_desc(xs_at + BM * BK * 2 + j * BK * BN * 2, BK,
                                                     gn * NW, s * 16));
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

  // The activation, elementwise on the accumulators, into this CTA's columns of H: the two
  // columns a lane holds in accumulator group jj, rows + 8·half, as a bf16 pair.
  auto activated = [&](int jj, int half) -> __nv_bfloat162 {{
    float h[2];
    #pragma unroll
    for (int e = 0; e < 2; ++e) {{
      {gate_values}
      h[e] = {activation};
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

  // Phase 2: ysum[m0 rows, this CTA's OC columns] += H · W2[cluster rows, OC columns], W2 through
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
      tf_wgmma_rs_m64n{ow}k16(acc2, a[s], nmajor_desc(w2s_at, BK, gn * OW, s * 16),
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
#else   // A from shared memory: the cluster's H (gather), or the producer's copy of its k-tile
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
        tf_wgmma_m64n{ow}k16(acc2, kmajor_desc(a_at, BM, gm * 64, a_k + s * 16),
                             nmajor_desc(w2s_at + W2_AT, BK, gn * OW, s * 16), ks > 0 || s > 0);
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
