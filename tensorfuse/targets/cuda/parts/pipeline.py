"""Pipeline parts: the warp roles (a TMA producer warpgroup, consumer warpgroups taking turns),
the shared-memory ring with its mbarriers, and the register reallocation between roles."""
from __future__ import annotations


def attention_config(c) -> str:
    """The pipeline's shape: tiles, ring slots, warpgroups, their registers, overlap and the
    consumers' turns."""
    rows = "" if not c.padded else (
        f"// the tensors' rows, narrower than the tiles (TMA fills the rest with zeros)\n"
        f"#define ROW_D_ {c.rows[0]}\n#define OUT_DV_ {c.rows[1]}\n")
    return f"""#define D_ {c.D}
#define DV_ {c.DV}   // the values' and the output's head dim
{rows}#define BM {c.knobs.block_m}
#define BN {c.bn}
// the sequence's last key block: LAST_N keys (what is left of N after whole blocks, to 16)
#define LAST_N {c.last_n}
#define STAGES {c.knobs.stages}
#define CONSUMERS {c.knobs.consumers}
#define THREADS {c.knobs.threads}
#define CTAS_PER_SM {c.knobs.ctas_per_sm}
#define CONSUMER_REGS {c.knobs.consumer_registers}
#define PRODUCER_REGS {c.knobs.producer_registers}
#define OVERLAP {int(c.knobs.overlap)}
// consumers take turns issuing MMAs
#define PINGPONG {int(c.knobs.pingpong and c.knobs.consumers > 1)}
#if PINGPONG
#define TURN_BEGIN tf_turn_wait(cw);
#define TURN_END tf_turn_pass(cw);
#else
#define TURN_BEGIN
#define TURN_END
#endif
"""


def attention_kernel_begin(c) -> str:
    """The kernel's signature, its shared memory (query tile, key/value ring, mask bits,
    mbarriers, the claimed tiles' slots) and the barriers' initialisation."""
    return f"""extern "C" __global__ void __launch_bounds__(THREADS, CTAS_PER_SM) {c.entry}(
    {c.params}) {{
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = (unsigned char*)(((unsigned long)smem_raw + 1023) & ~1023ul);
  unsigned char* q_tile = smem;
  unsigned char* k_tiles = smem + Q_BYTES;
  unsigned char* v_tiles = k_tiles + STAGES * K_BYTES;
  unsigned char* mask_tiles = v_tiles + STAGES * V_BYTES;   // TILED: the partial blocks' bits
{_score_tiles(c)}  unsigned long long* bars = (unsigned long long*)({_after_tiles(c)});
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
{"  const void* t_map = (const char*)maps + 384;   // the score's tensor" + chr(10) if c.score_tile else ""}
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
{_score_tile_barriers(c)}    }}
    tf_mbar_init(q_free, 128 * CONSUMERS);
    for (int s = 0; s < 2; ++s) {{
      tf_mbar_init(tile_full + s, 1);
      tf_mbar_init(tile_free + s, 128 * CONSUMERS);
    }}
    tf_mbar_init_fence();
  }}
  __syncthreads();

"""


def _score_tiles(c) -> str:
    """The slots of the score's tiles (after the mask bits: 1024-byte aligned, as the 128-byte
    swizzle needs), where the score reads a tensor by query and key."""
    if c.score_tile is None:
        return ""
    return ("  unsigned char* score_tiles = mask_tiles + STAGES * MASK_BYTES;   // the score's "
            "tensor\n"
            "  unsigned long long* full_t = "
            "(unsigned long long*)(score_tiles + STAGES * T_BYTES);\n"
            "  unsigned long long* empty_t = full_t + STAGES;   "
            "// the tiles' ring: read by the score\n")


def _score_tile_barriers(c) -> str:
    """The tiles' ring: one arrival (and the bytes) fills a slot, every consumer thread's frees
    it."""
    if c.score_tile is None:
        return ""
    return ("      tf_mbar_init(full_t + s, 1);\n"
            "      tf_mbar_init(empty_t + s, 128 * CONSUMERS);\n")


def _after_tiles(c) -> str:
    """Where the other mbarriers start: after the score tiles' ring, or the mask bits'."""
    return "empty_t + STAGES" if c.score_tile else "mask_tiles + STAGES * MASK_BYTES"


def attention_producer_begin(c) -> str:
    """The producer warpgroup gives its registers back; its one thread acquires the tensor maps."""
    tile = "      tf_tensormap_acquire(t_map);\n" if c.score_tile else ""
    return """  if (wg == 0) {   // the producer
    tf_setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      tf_tensormap_acquire(q_map);
      tf_tensormap_acquire(k_map);
      tf_tensormap_acquire(v_map);
""" + tile


def attention_turns_open(c) -> str:
    """With ``PINGPONG`` the last consumer warpgroup opens the first turn."""
    return """
  // With PINGPONG the consumers issue their MMAs in turns (0, 1, …), so that one warpgroup's
  // softmax runs while another's products use the tensor cores (FlashAttention-3's ping-pong).
  // The last warpgroup opens the first turn; the first one takes the extra turn at the end. Both
  // take the same number of turns in every tile, so the turns run on across tiles.
#if PINGPONG
  if (cw == CONSUMERS - 1) tf_turn_pass(cw);
#endif
"""


def attention_kernel_end(c) -> str:
    """With ``PINGPONG`` the first warpgroup takes the turn the last one opened."""
    return """#if PINGPONG
  if (cw == 0) tf_turn_wait(cw);   // the turn the last warpgroup opened
#endif
}
"""


def attention_turn_functions(c) -> str:
    """The consumers' turns on named barriers."""
    return """// Named barriers for the consumers' turns (ids 1 … CONSUMERS; 0 is __syncthreads): a warpgroup
// waits for its turn with bar.sync, hands it on with bar.arrive (128 + 128 threads each).
__device__ __forceinline__ void tf_turn_wait(int cw) {
  asm volatile("bar.sync %0, 256;" :: "r"(1 + cw) : "memory");
}
__device__ __forceinline__ void tf_turn_pass(int cw) {
  asm volatile("bar.arrive %0, 256;" :: "r"(1 + (cw + 1) % CONSUMERS) : "memory");
}
"""


def gemm_config(c) -> str:
    """The GEMM's tile (``64 · CONSUMERS × BN``, k-blocks of 64), weights, ring slots, cluster,
    operand layout and registers."""
    return f"""#define CONSUMERS {c.knobs.consumers}            // consumer warpgroups of 64 rows each
#define BM (64 * CONSUMERS)
#define BN {c.bn}
#define BK 64                   // one 128-byte swizzle row of bf16/f16
#define G {c.g}                   // weights, one accumulator each
#define STAGES {c.knobs.stages}
#define CLUSTER {c.knobs.cluster}
#define B_KMAJOR {int(c.plan.b_k_major)}
#define THREADS {c.knobs.threads}
#define PRODUCER_REGS {c.knobs.producer_registers}
#define CONSUMER_REGS {c.knobs.consumer_registers}
"""


def gemm_release_slot(c) -> str:
    """A ring slot released to the producers of the cluster."""
    return """
// A consumer warpgroup is done with ring slot `s`: one arrival on its CTA's "empty" barrier
// and, with a cluster, one on the peer's (whose producer multicast into the slot too).
__device__ __forceinline__ void release_slot(unsigned long long* empty, int s, int t,
                                             unsigned rank) {
  if (t == 0) tf_mbar_arrive(empty + s);
#if CLUSTER > 1
  if (t == 32) tf_mbar_arrive_cluster(empty + s, rank ^ 1);
#endif
}
"""


def gemm_kernel_begin(c) -> str:
    """The kernel's signature, its shared memory (operand ring, staging buffer, mbarriers), the
    walk's extents and the barriers' initialisation."""
    return f"""extern "C" __global__ void __launch_bounds__(THREADS, 1) {c.entry}(
    {c.params}) {{
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = (unsigned char*)(((unsigned long)smem_raw + 1023) & ~1023ul);
  unsigned char* a_tiles = smem;
  unsigned char* b_tiles = smem + STAGES * A_BYTES;              // slot s, weight x: (s·G + x)
  unsigned char* c_stage = b_tiles + STAGES * G * B_BYTES;      // STAGED: 8 KB per consumer
  unsigned long long* full = (unsigned long long*)(c_stage + STAGED * CONSUMERS * 64 * 128);
  unsigned long long* empty = full + STAGES;
  volatile int* last_piece = (volatile int*)(empty + STAGES);   // split tiles: the CTA finishes
  const void* a_map = maps;

  const int tiles_m = (M_ + BM - 1) / BM, tiles_n = (N_ + BN - 1) / BN;
  const int row_units = (tiles_m + CLUSTER - 1) / CLUSTER;   // a cluster takes CLUSTER row tiles
  const int kblocks = (K_ + BK - 1) / BK;
#if CLUSTER > 1
  const unsigned rank = tf_cluster_rank();
#else
  const unsigned rank = 0;
#endif
  const int first_unit = blockIdx.x / CLUSTER, unit_step = gridDim.x / CLUSTER;
  const int items = full_items + tail * pieces;
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {{
    for (int s = 0; s < STAGES; ++s) {{
      tf_mbar_init(full + s, 1);
      tf_mbar_init(empty + s, CONSUMERS * CLUSTER);   // a release per consumer warpgroup per CTA
    }}
    tf_mbar_init_fence();
  }}
#if CLUSTER > 1
  tf_cluster_sync();   // the peers' barriers exist before any multicast or remote arrival
#else
  __syncthreads();
#endif
  if (threadIdx.x == 0) tf_launch_dependents();   // every CTA of this grid is running

"""


def gemm_producer_begin(c) -> str:
    """The producer warpgroup gives its registers back; its thread acquires the tensor maps,
    makes the L2 policy and waits for a kernel before."""
    return """  if (wg == 0) {   // the producer
    tf_setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      tf_tensormap_acquire(a_map);
      for (int x = 0; x < G; ++x) tf_tensormap_acquire((const char*)maps + 128 * (1 + x));
#if EVICT_WEIGHTS
      const unsigned long long policy = tf_l2_evict_first();
#else
      const unsigned long long policy = 0;
#endif
#if DEPENDENT
      tf_wait_prerequisite();   // the rows operand is the kernel before's output: read after it
#endif
"""


def gemm_kernel_end(c) -> str:
    """No CTA of a cluster leaves while its peer may still write into its shared memory."""
    return """  }
#if CLUSTER > 1
  tf_cluster_sync();   // no CTA leaves while its peer may still write into its shared memory
#endif
}
"""


def chain_config(c) -> str:
    """The GEMM chain's copy paths (cp.async by every thread, a TMA producer warp or a producer
    warpgroup), registers, ring bytes, warpgroup tiles and lookahead."""
    return f"""#define TMA {int(c.tma)}
#define PEER {int(c.peer)}        // H stays in each CTA; phase 2 reads it from the peers
// TMA with the all-gather: a producer warp issues the copies into one ring; with peer reads one
// consumer thread issues them into the two rings the cp.async copies use
#define TMA_WARP (TMA && !PEER)
#define PRODUCER {int(c.producer)}    // a producer warpgroup issues every copy (warps WARPS …)
#define PRODUCER_THREADS {c.producer_threads}
#define COPIERS {c.producer_threads if c.producer else "THREADS"}   // threads that issue cp.async copies
// Registers per thread after `setmaxnreg`: the launch gives every thread 65536 / THREADS rounded
// down to 8 (168 for three warpgroups); the producer hands most of its share to the consumers,
// whose 128 f32 accumulators (128 × 256 tiles) need more than 168.
#define PRODUCER_REGS 56
#define CONSUMER_REGS 224
#define PIPE_BYTES {c.pipe_bytes}
#define SLOT {c.pipe_bytes // c.knobs.stages}     // one TMA slot: a stage of either product
#define STAGE_BYTES (BM * BK * 2 + G * BK * BN * 2)  // cp.async: a first-product stage
#define W2_BYTES (BK * BO * 2)                        // and a W2 tile
#define W2_SLOT {c.layout.w2_slot_bytes}   // a W2 slot (with the producer: H's k-tile, then W2)
#define W2_AT (W2_SLOT - W2_BYTES)           // where the W2 tile starts in its slot
#define WGN {c.wg_n}
#define NW {c.nw}                 // first-product columns per warpgroup
#define OW {c.ow}                 // output columns per warpgroup
// Phase 2 reuses the pipeline's bytes for W2 tiles, as many as fit (capped): where the first
// product's stages are larger (128 × 256 tiles, SwiGLU's two weights) W2 runs deeper than STAGES.
#define W2_STAGES {c.w2_stages}
#define AHEAD1 {c.ahead1}   // k-tiles copied ahead of the one being multiplied (wgmma_lookahead)
#define AHEAD2 {c.ahead2}   // W2 tiles likewise
#define TF_MIN(a, b) ((a) < (b) ? (a) : (b))
#define WARPS {c.knobs.warps}             // consumer warps (with TMA, warp WARPS is the producer)
"""


def chain_ring(c) -> str:
    """The rings' slots on mbarriers: wait until full, release, wait until free."""
    return """
// The pipelines are rings of slots on mbarriers (no CTA barrier per k-tile): `full[u % slots]`
// completes when the copies of use u have landed — with cp.async, one arrival per thread
// (tf_cp_async_mbar_arrive), with TMA the bytes — and `empty[u % slots]` when both warpgroups' MMAs
// on use u are done (one arrival per warpgroup), after which use u + slots may refill the slot.
__device__ __forceinline__ void wait_full_slot(unsigned long long* full, int u, int slots) {
  tf_mbar_wait(full + u % slots, (u / slots) & 1);
#if !TMA
  tf_fence_proxy_async();   // cp.async copies (generic proxy) are seen by this thread's wgmma
#endif
}
__device__ __forceinline__ void release_slot(unsigned long long* empty, int u, int slots) {
  if ((threadIdx.x & 127) == 0) tf_mbar_arrive(empty + u % slots);
}
__device__ __forceinline__ void wait_free_slot(unsigned long long* empty, int u, int slots) {
  if (u >= slots) tf_mbar_wait(empty + u % slots, (u / slots - 1) & 1);
}
"""


def chain_fill(c) -> str:
    """A ring's next use filled once its slot is free (either product), and phase 2's advance."""
    return """#if !TMA_WARP
// Use u of a ring, once the slot is free: the first product's stage (k-tile u) or W2's tile u (of
// T: k-tile u % KS of output tile u / KS) — with cp.async every copying thread's share, with TMA
// (peer reads) all of it from thread 0 (predicated: every thread waits for the slot as with
// cp.async, and no thread-divergent branch makes ptxas serialize the wgmma in flight).
__device__ __forceinline__ void fill_stage(char* pipe, unsigned long long* full,
    unsigned long long* empty, const Plan& plan, int u) {
  wait_free_slot(empty, u, STAGES);
#if TMA
  load_stage_tma(pipe + (u % STAGES) * STAGE_BYTES, plan.maps, plan.maps, plan.m0, plan.n0,
                 u * BK, full + u % STAGES, threadIdx.x == 0);
#else
  load_stage(pipe + (u % STAGES) * STAGE_BYTES, plan, u * BK);
  tf_cp_async_mbar_arrive(full + u % STAGES);
#endif
}
__device__ __forceinline__ void fill_w2(char* pipe, unsigned long long* full,
    unsigned long long* empty, const Plan& plan, int u, int KS, int nc, int o_base) {
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
}
// Phase 2, W2 tile `it` (of T): the shared-memory address of its slot once its copies landed; and,
// once its MMAs are issued and tile it − 1's are done, releasing it − 1 and refilling ahead.
__device__ __forceinline__ unsigned w2_ready(char* pipe, unsigned long long* full, int it) {
  wait_full_slot(full, it, W2_STAGES);
  return tf_smem_addr(pipe + (it % W2_STAGES) * W2_SLOT);
}
__device__ __forceinline__ void w2_advance(char* pipe, unsigned long long* full,
    unsigned long long* empty, const Plan& plan, int it, int T, int KS, int nc, int o_base) {
  if (it > 0) release_slot(empty, it - 1, W2_STAGES);
  if (it + AHEAD2 < T) fill_w2(pipe, full, empty, plan, it + AHEAD2, KS, nc, o_base);
}
#endif

"""


def chain_consumers_sync(c) -> str:
    """A barrier of the consumer warps only (with a producer warp)."""
    return """#if TMA_WARP
// Warp-specialized: a producer warp (warp WARPS) issues every copy into the STAGES slots of one
// stream — phase 1's KT stages, then phase 2's W2 tiles — waiting until the consumers have
// released a slot (`empty`, one arrival per consumer warpgroup); consumers wait on `full`.
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" :: "n"(32 * WARPS) : "memory");
}
#else
__device__ __forceinline__ void consumers_sync() { __syncthreads(); }
#endif

"""


def chain_kernel_begin(c) -> str:
    """The kernel's signature, its shared memory and the rings' barriers."""
    return """extern "C" __global__ void @BOUNDS@
tf_chain_main(const __nv_bfloat16* __restrict__ x, @GATE_ARGS@const __nv_bfloat16* __restrict__ w2,
              float* __restrict__ ysum@MAPS_ARG@@SCALAR_ARGS@) {
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
  const __nv_bfloat16* ws[G] = {@GATES@};   // (TMA reads the gate weights through maps)
#endif
  // two rings over the same bytes: the first product's stages, then W2's tiles
  unsigned long long* full2 = empty + STAGES;
  unsigned long long* empty2 = full2 + W2_STAGES;
  if (threadIdx.x == 0) {
    for (int i = 0; i < STAGES; ++i) {        // TMA: one arrival and the bytes
      tf_mbar_init(full + i, TMA ? 1 : COPIERS);  // cp.async: every copying thread's copies
      tf_mbar_init(empty + i, THREADS / 128);   // every consumer warpgroup's MMAs
    }
    for (int i = 0; i < W2_STAGES; ++i) {      // (with the producer: its copies of H's k-tile too)
      tf_mbar_init(full2 + i, TMA ? 1 : COPIERS * (1 + PRODUCER));
      tf_mbar_init(empty2 + i, THREADS / 128);
    }
    tf_mbar_init_fence();
#if TMA
    for (int i = 0; i < G + 2; ++i) tf_tensormap_acquire(maps + i * 128);
#endif
  }
  __syncthreads();
"""
