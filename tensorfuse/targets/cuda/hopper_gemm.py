"""The Hopper GEMM mainloop: persistent, warp-specialised sm_90a CUDA C++ for
``out[i, j] = epilogue(Σ_k a[i, k] · b_g[k, j] for each weight g)`` (the plan and its knobs:
``schedule_templates.hopper_gemm_plan``).

``gridDim.x`` CTAs (a multiple of the cluster size, at most as many as fit the GPU at once) walk
the output tiles of ``BM × BN`` in a grouped order (``group_m`` row units — a cluster's tiles —
per group, so that the tiles in flight at one time share their operands in L2); every CTA walks
the same sequence of tiles, ``128 · (1 + CONSUMERS)`` threads each:

- warpgroup 0 is the producer: it gives its registers back (``setmaxnreg.dec``) and one thread
  issues TMA bulk-tensor copies of each k-block (64 deep) of the a rows and of every weight into a
  ring of ``STAGES`` slots; each slot has a "full" mbarrier (the copies' bytes) and an "empty" one
  (the consumers' releases). The producer runs up to ``STAGES`` k-blocks ahead — across tile
  boundaries, so the next tile's operands load while the consumers write the last one's output.
  With ``CLUSTER`` = 2 the two CTAs of a cluster take vertically neighbouring tiles, which share
  their weight tiles: each producer copies half of every weight tile and multicasts it to both
  CTAs (``.multicast::cluster``), halving the weights' L2 traffic; a slot is then released to a
  producer only when the consumers of both CTAs are done with it;
- each consumer warpgroup (``setmaxnreg.inc``) owns 64 rows of the tile: per k-block four
  ``wgmma.mma_async`` m64nBNk16 per weight on the shared-memory tiles (128-byte swizzle; weights
  K-major when stored ``[N, K]`` as ``torch.nn.Linear`` keeps them, MN-major when ``[K, N]``),
  keeping one k-block's MMAs in flight while the previous slot is released;
- the epilogue evaluates the program's output expression on the accumulator fragments (with the
  tensors and scalars it reads) and writes it from registers (``STAGED``: 64 columns at a time
  through shared memory, 16-byte stores); rows and columns past the edge are not written, and
  the copies read zeros there (ragged M, N and K).

Weights whose tiles are each read once may be copied with an L2 evict-first policy
(``EVICT_WEIGHTS``), so that streaming them does not push out what the kernels around the GEMM
use. With ``PACE`` a producer adds the k-blocks it issued to a grid-wide count and, while it is
more than ``PACE`` k-blocks ahead of the grid's average, sleeps a bounded while before its next
copies: CTAs that read the weights' k-blocks together finish together (few-row GEMMs).

Where the last wave of tiles would leave most clusters idle, the host splits its tiles along K
(``full_items``, ``tail``, ``pieces``): each piece stores its f32 partial accumulators in ``ws``,
and the last piece of a tile to finish (an atomic counter, reset by that piece) adds the others
and runs the epilogue.
"""
from __future__ import annotations

from .dsm import HELPERS as DSM_HELPERS
from .expr import C_TYPES, forwarded, scalar_arguments, size_aliases, tensor_arguments, to_cuda
from .split import HELPERS as SPLIT_HELPERS
from .tma import HELPERS as TMA_HELPERS
from .tma import MBARRIER_HELPERS
from .wgmma import HELPERS as WGMMA_HELPERS
from .wgmma import wgmma_function

ENTRY = "tf_hopper_gemm"

# What the PTX of every Hopper GEMM holds (checked by the tests); with a cluster also MULTICAST_PTX.
GEMM_PTX = ("wgmma.mma_async", "cp.async.bulk.tensor.2d", "mbarrier.try_wait",
            "setmaxnreg.inc", "setmaxnreg.dec")
MULTICAST_PTX = ("multicast::cluster", "mapa.shared::cluster", "barrier.cluster.arrive")


_STORE = {"bf16": ("__nv_bfloat162", "__floats2bfloat162_rn({}, {})"),
          "f16": ("__half2", "__floats2half2_rn({}, {})"),
          "f32": ("float2", "make_float2({}, {})")}

MULTICAST_HELPERS = r"""
// Box at (c0, c1) into the same shared-memory offset of every CTA in `mask`, each CTA's copy
// counted on its own mbarrier at `bar`'s offset.
__device__ __forceinline__ void tf_tma_load_2d_multicast(void* dst, const void* map, int c0,
                                                         int c1, unsigned long long* bar,
                                                         unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;"
               :: "r"(tf_smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(tf_smem_addr(bar)),
                  "h"(mask) : "memory");
}
// The same copies with an L2 cache policy (`policy`: from tf_l2_evict_first): weights that are
// read once need not push out of L2 what the kernels before and after use (nor write back the
// dirty lines they would evict while the GEMM streams).
__device__ __forceinline__ unsigned long long tf_l2_evict_first() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void tf_tma_load_2d_hint(void* dst, const void* map, int c0, int c1,
                                                    unsigned long long* bar,
                                                    unsigned long long policy) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;"
               :: "r"(tf_smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(tf_smem_addr(bar)),
                  "l"(policy) : "memory");
}
__device__ __forceinline__ void tf_tma_load_2d_multicast_hint(void* dst, const void* map, int c0,
                                                              int c1, unsigned long long* bar,
                                                              unsigned short mask,
                                                              unsigned long long policy) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               ".multicast::cluster.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5, %6;"
               :: "r"(tf_smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(tf_smem_addr(bar)),
                  "h"(mask), "l"(policy) : "memory");
}
// Pacing (PACE): a relaxed add to, and a relaxed read of, the count of k-blocks every CTA of the
// grid has issued.
__device__ __forceinline__ void tf_pace_add(unsigned* counter, unsigned n) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" :: "l"(counter), "r"(n) : "memory");
}
__device__ __forceinline__ unsigned tf_pace_read(const unsigned* counter) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
  return v;
}
// Programmatic dependent launch: a GEMM lets the next kernel of its stream start once every
// CTA is running (a kernel launched without the attribute ignores it); a GEMM launched with it
// waits for the kernel before it (its memory visible) before reading what that one wrote.
__device__ __forceinline__ void tf_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void tf_wait_prerequisite() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
// One arrival on the mbarrier at `bar`'s offset in CTA `rank` of the cluster. CTA-scope release
// (the default): it releases a slot whose reads (wgmma) have completed, with no writes to order.
// `.release.cluster` compiled to MEMBAR.ALL.GPU before every arrival, which stalled the
// warpgroup once per k-block: multicast ran 1.3-1.9x slower than no cluster (H100, 2026-11-24).
__device__ __forceinline__ void tf_mbar_arrive_cluster(unsigned long long* bar, unsigned rank) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];"
               :: "r"(tf_mapa(tf_smem_addr(bar), rank)) : "memory");
}
"""


def kernel_arguments(plan) -> list[tuple[str, str, str]]:
    """(C++ name, TVM argument type, C++ type) of the kernel's arguments, in order: the tensor
    maps (a, then each weight), the output, the tensors the epilogue reads, the sizes, the
    scalars, then :data:`SPLIT_ARGUMENTS` and :data:`ORDER_ARGUMENTS`."""
    return [("maps", "handle", "const void*"), ("out", "handle", "void*")] + \
        tensor_arguments(plan.tensors) + [(d, "int32", "int") for d in ("M_", "N_", "K_")] + \
        scalar_arguments(plan.scalars) + list(SPLIT_ARGUMENTS) + list(ORDER_ARGUMENTS)


# The split of the last wave (see hopper_gemm_source), last in the argument list: partial
# accumulators, one arrival counter per split tile and CTA, whole units, split units, pieces each.
SPLIT_ARGUMENTS = (("ws", "handle", "float* __restrict__"), ("counters", "handle", "int*"),
                   ("full_items", "int32", "int"), ("tail", "int32", "int"),
                   ("pieces", "int32", "int"))
# The tiles' order, after the split's: row units per rasterisation group (a launch argument, so
# that one cubin serves every size; the plan picks it per size)
ORDER_ARGUMENTS = (("group_m", "int32", "int"),)


def epilogue_code(plan) -> str:
    """C++ of the output element from the accumulators ``g0, g1, …`` at ``row``, ``col``."""
    i, j = plan.axes
    return to_cuda(plan.epilogue, {name: f"g{x}" for x, name in enumerate(plan.sums)},
                   f"the output {plan.output}", axes={i: "row", j: "col"},
                   loads={t: f"t_{t}" for t, _ in plan.tensors})


def hopper_gemm_source(plan, knobs, dependent: bool = False) -> str:
    """CUDA C++ for ``tf_hopper_gemm``: a 1-D grid of ``knobs.cluster``-CTA clusters,
    ``knobs.threads`` threads, dynamic shared memory ``hopper_gemm_plan.shared_bytes``. M, N, K
    are kernel arguments: one cubin serves every size. Every GEMM lets a programmatic
    dependent launched after it start once all its CTAs run. ``dependent``: this one is such a
    dependent (the FFN's second GEMM): its CTAs start, set up their barriers and tensor maps
    while the kernel before finishes, and its producer waits for that kernel before the first
    copy (the rows operand is its output; everything the consumers write follows from it)."""
    g = len(plan.weights)
    bn = knobs.block_n
    suffix = "_f16" if plan.dtype == "f16" else ""
    mma = f"tf_wgmma_{'kk_' if plan.b_k_major else ''}m64n{bn}k16{suffix}"
    functions = wgmma_function(bn, b_k_major=plan.b_k_major, dtype=plan.dtype)
    args = kernel_arguments(plan)
    params = ",\n    ".join(f"{c} {n}" for n, _, c in args)
    pair, make_pair = _STORE[plan.out_dtype]
    out_elem = C_TYPES[plan.out_dtype]
    sizes = size_aliases(zip(plan.dims, ("M_", "K_", "N_")))
    # what the epilogue may read: tensors, sizes, scalars
    extra_params, extra_args = forwarded(args[2:-len(SPLIT_ARGUMENTS) - len(ORDER_ARGUMENTS)])
    gate_params = ", ".join(f"float g{x}" for x in range(g))

    def gate_args(r: str) -> str:
        return ", ".join(f"acc[{x}][{r}]" for x in range(g))

    epilogue = epilogue_code(plan)
    header = "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n"
    return f"""{header}#include <math.h>
{DSM_HELPERS}
{WGMMA_HELPERS}
{MBARRIER_HELPERS}
{TMA_HELPERS}
{MULTICAST_HELPERS}
{SPLIT_HELPERS}
{functions}
#define CONSUMERS {knobs.consumers}            // consumer warpgroups of 64 rows each
#define BM (64 * CONSUMERS)
#define BN {bn}
#define BK 64                   // one 128-byte swizzle row of bf16/f16
#define G {g}                   // weights, one accumulator each
#define STAGES {knobs.stages}
#define CLUSTER {knobs.cluster}
#define B_KMAJOR {int(plan.b_k_major)}
#define THREADS {knobs.threads}
#define PRODUCER_REGS {knobs.producer_registers}
#define CONSUMER_REGS {knobs.consumer_registers}
#define LEADER {int(knobs.multicast == "leader")}   // CTA 0 copies whole weight tiles for both
#define A_BYTES (BM * BK * 2)
#define B_BYTES (BN * BK * 2)
#define STAGE_BYTES (A_BYTES + G * B_BYTES)
// weight rows (K-major) or columns (MN-major) one producer copies
#define B_PART (LEADER ? BN : BN / CLUSTER)
{sizes}
typedef {pair} out_pair_t;
typedef {out_elem} out_t;
#define STAGED {int(knobs.epilogue == "staged")}   // the output through shared memory
#define DEPENDENT {int(dependent)}   // launched as a programmatic dependent
#define EVICT_WEIGHTS {int(knobs.weights_l2 == "evict_first")}   // weights: L2 evict-first policy
#define PACE {knobs.pace}         // a CTA issues at most PACE k-blocks more than the grid's average
#define PACE_EVERY 4        // k-blocks between a CTA's look at the average
// the most sleeps of 128 ns one look may wait: the average counts CTAs that have not started
// (another stream's kernel may hold their SMs while this grid's early CTAs wait), so a wait is
// bounded, never a condition for progress
#define PACE_SPINS 64
#define PACE_DONE (1u << 20)   // what a CTA that issued all its k-blocks adds: never waited for
// after the split tiles' counters: [0] k-blocks issued by the grid, [1] producers done (read from
// the kernel's parameters where used: the producer has 40 registers)
#define PACE_COUNTER ((unsigned*)counters + tail * CLUSTER)

// One CTA's partial accumulators of a split tile, in float4s: [weight, 4-register group, thread].
#define PART_VEC4 (G * (BN / 8) * CONSUMERS * 128)

// Work item `item`: the first `full_items` are whole tiles (units); the rest split the last
// `tail` units' k-blocks into `pieces` ranges each (slot: the piece's partial in ws).
struct Work {{
  int unit, k0, k1, piece, slot;
}};
__device__ __forceinline__ Work work_of(int item, int full_items, int pieces, int kblocks) {{
  Work w;
  if (item < full_items) {{
    w.unit = item; w.k0 = 0; w.k1 = kblocks; w.piece = -1; w.slot = 0;
  }} else {{
    const int j = item - full_items;
    w.unit = full_items + j / pieces;
    w.piece = j % pieces;
    w.slot = j;
    w.k0 = kblocks * w.piece / pieces;
    w.k1 = kblocks * (w.piece + 1) / pieces;
  }}
  return w;
}}

// The 128 threads of consumer warpgroup `cw` (named barrier 1 + cw; 0 is __syncthreads).
__device__ __forceinline__ void tf_bar_sync_wg(int cw) {{
  asm volatile("bar.sync %0, 128;" :: "r"(1 + cw) : "memory");
}}

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

// Work item `item`'s k-blocks and the origin (m0, n0) of its tile in this CTA.
__device__ __forceinline__ Work tile_at(int item, int full_items, int pieces, int kblocks,
                                        int row_units, int tiles_n, int group_m, unsigned rank,
                                        int& m0, int& n0) {{
  const Work w = work_of(item, full_items, pieces, kblocks);
  int mu, nt;
  tile_of(w.unit, row_units, tiles_n, group_m, mu, nt);
  m0 = (mu * CLUSTER + (int)rank) * BM;
  n0 = nt * BN;
  return w;
}}

// A consumer warpgroup is done with ring slot `s`: one arrival on its CTA's "empty" barrier
// and, with a cluster, one on the peer's (whose producer multicast into the slot too).
__device__ __forceinline__ void release_slot(unsigned long long* empty, int s, int t,
                                             unsigned rank) {{
  if (t == 0) tf_mbar_arrive(empty + s);
#if CLUSTER > 1
  if (t == 32) tf_mbar_arrive_cluster(empty + s, rank ^ 1);
#endif
}}

// One box of a weight at (c0, c1): multicast to the cluster, with the L2 policy where
// EVICT_WEIGHTS.
__device__ __forceinline__ void copy_weight_box(void* dst, const void* map, int c0, int c1,
                                                unsigned long long* bar,
                                                unsigned long long policy) {{
#if CLUSTER > 1 && EVICT_WEIGHTS
  tf_tma_load_2d_multicast_hint(dst, map, c0, c1, bar, (1 << CLUSTER) - 1, policy);
#elif CLUSTER > 1
  tf_tma_load_2d_multicast(dst, map, c0, c1, bar, (1 << CLUSTER) - 1);
#elif EVICT_WEIGHTS
  tf_tma_load_2d_hint(dst, map, c0, c1, bar, policy);
#else
  tf_tma_load_2d(dst, map, c0, c1, bar);
#endif
}}

// Ring slot `s` gets k-block `kb` of every weight's tile at column n0, counted on `bar`: this
// CTA's share (B_PART rows or columns), multicast to the cluster; with LEADER CTA 0 copies all
// of it and the others nothing.
__device__ __forceinline__ void load_weights(unsigned char* b_tiles, const void* maps, int s,
                                             int kb, int n0, unsigned long long* bar,
                                             unsigned rank, unsigned long long policy) {{
#if LEADER
  if (rank != 0) return;
#endif
  #pragma unroll
  for (int x = 0; x < G; ++x) {{
    const void* b_map = (const char*)maps + 128 * (1 + x);
    unsigned char* b = b_tiles + (s * G + x) * B_BYTES;
#if B_KMAJOR    // [N, K]: BN rows of 64 k; this CTA's share is rows [rank·B_PART, +B_PART)
    copy_weight_box(b + (LEADER ? 0 : rank) * B_PART * 128, b_map, kb * BK,
                    n0 + (LEADER ? 0 : rank) * B_PART, bar, policy);
#else           // [K, N]: atoms of 64 columns × 64 k-rows; this CTA's share is B_PART columns
    #pragma unroll
    for (int a = 0; a < B_PART / 64; ++a) {{
      const int atom = (LEADER ? 0 : rank) * (B_PART / 64) + a;
      copy_weight_box(b + atom * BK * 128, b_map, n0 + atom * 64, kb * BK, bar, policy);
    }}
#endif
  }}
}}

// The program's output element from the accumulators at (row, col).
__device__ __forceinline__ float epilogue_value({gate_params}, int row, int col{extra_params}) {{
  return {epilogue};
}}

extern "C" __global__ void __launch_bounds__(THREADS, 1) {ENTRY}(
    {params}) {{
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

  if (wg == 0) {{   // the producer
    tf_setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x == 0) {{
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
      int it = 0;
      for (int item = first_unit; item < items; item += unit_step) {{
        int m0, n0;
        const Work w = tile_at(item, full_items, pieces, kblocks, row_units, tiles_n, group_m,
                               rank, m0, n0);
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
          tf_tma_load_2d(a_tiles + s * A_BYTES, a_map, kb * BK, m0, full + s);
          load_weights(b_tiles, maps, s, kb, n0, full + s, rank, policy);
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
  }} else {{   // a consumer warpgroup: rows [m0 + 64·cw, +64) of each tile
    tf_setmaxnreg_inc<CONSUMER_REGS>();
    const int cw = wg - 1;
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const unsigned a_base = tf_smem_addr(a_tiles), b_base = tf_smem_addr(b_tiles);
    float acc[G][BN / 2];
    int it = 0;
    for (int item = first_unit; item < items; item += unit_step) {{
      int m0, n0;
      const Work w = tile_at(item, full_items, pieces, kblocks, row_units, tiles_n, group_m,
                             rank, m0, n0);
      for (int kb = w.k0; kb < w.k1; ++kb, ++it) {{
        const int s = it % STAGES;
        tf_mbar_wait(full + s, (it / STAGES) & 1);
        tf_wgmma_fence();
        #pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) {{
          // a: K-major, 128-byte rows; this warpgroup's 64 rows start at row 64·cw
          const unsigned long long da = tf_smem_desc_sw128_at(
              a_base + s * A_BYTES + cw * 64 * 128 + ks * 32, 16, 1024);
          #pragma unroll
          for (int x = 0; x < G; ++x) {{
            const unsigned b = b_base + (s * G + x) * B_BYTES;
#if B_KMAJOR
            const unsigned long long db = tf_smem_desc_sw128_at(b + ks * 32, 16, 1024);
#else
            const unsigned long long db = tf_smem_desc_sw128_at(b + ks * 16 * 128, BK * 128,
                                                                1024);
#endif
            {mma}(acc[x], da, db, kb > w.k0 || ks > 0);
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
      if (w.piece >= 0) {{   // a piece of a split tile: the last piece to finish adds them up
        const int ct = cw * 128 + t;
        float4* mine = (float4*)ws + (long)(w.slot * CLUSTER + rank) * PART_VEC4;
        #pragma unroll
        for (int x = 0; x < G; ++x) {{
          #pragma unroll
          for (int g = 0; g < BN / 8; ++g)
            __stcg(mine + (x * (BN / 8) + g) * CONSUMERS * 128 + ct,
                   make_float4(acc[x][4 * g], acc[x][4 * g + 1], acc[x][4 * g + 2],
                               acc[x][4 * g + 3]));
        }}
        // every consumer thread (named barrier CONSUMERS + 1; 1 … CONSUMERS are the warpgroups')
        if (!tf_arrived_last(counters + (w.unit - full_items) * CLUSTER + rank, pieces,
                             CONSUMERS + 1, CONSUMERS * 128, ct == 0, last_piece))
          continue;
        const int first_slot = (w.unit - full_items) * pieces;
        for (int p = 0; p < pieces; ++p) {{
          if (first_slot + p == w.slot) continue;
          const float4* other = (const float4*)ws + (long)((first_slot + p) * CLUSTER + rank)
                                * PART_VEC4;
          #pragma unroll
          for (int x = 0; x < G; ++x) {{
            #pragma unroll
            for (int g = 0; g < BN / 8; ++g) {{
              const float4 v = __ldcg(other + (x * (BN / 8) + g) * CONSUMERS * 128 + ct);
              acc[x][4 * g] += v.x;
              acc[x][4 * g + 1] += v.y;
              acc[x][4 * g + 2] += v.z;
              acc[x][4 * g + 3] += v.w;
            }}
          }}
        }}
      }}
      // the epilogue, from the fragments: register 4·jj + 2·x + e holds row r0 + 8·x,
      // column n0 + 8·jj + 2·(lane % 4) + e
      const int r0 = m0 + cw * 64 + warp * 16 + lane / 4;
#if STAGED
      // 64 columns at a time through this warpgroup's 64 × 64 buffer (128-byte rows, swizzled
      // like the operand tiles: conflict-free both ways), then 16-byte coalesced stores; a tile
      // whose width is not a multiple of 64 (K-major weights) ends on a narrower chunk
      const unsigned buf = tf_smem_addr(c_stage) + cw * 64 * 128;
      #pragma unroll
      for (int a = 0; a < (BN + 63) / 64; ++a) {{
        #pragma unroll
        for (int x = 0; x < 2; ++x) {{
          const int row = r0 + 8 * x, lr = warp * 16 + lane / 4 + 8 * x;
          #pragma unroll
          for (int j8 = 0; j8 < 8 && 8 * a + j8 < BN / 8; ++j8) {{
            const int jj = 8 * a + j8, r = 4 * jj + 2 * x;
            const int col = n0 + 8 * jj + 2 * (lane % 4);
            float v0 = 0.0f, v1 = 0.0f;
            if (row < M_ && col < N_) {{   // the epilogue may read tensors at (row, col)
              v0 = epilogue_value({gate_args("r")}, row, col{extra_args});
              v1 = epilogue_value({gate_args("r + 1")}, row, col + 1{extra_args});
            }}
            out_pair_t v = {make_pair.format("v0", "v1")};
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
          if (row < M_ && col < N_) *(uint4*)((out_t*)out + (long)row * N_ + col) = v;
        }}
        tf_bar_sync_wg(cw);   // read out before the next 64 columns overwrite it
      }}
#else
      #pragma unroll
      for (int x = 0; x < 2; ++x) {{
        const int row = r0 + 8 * x;
        if (row < M_) {{
          out_pair_t* dst = (out_pair_t*)out + ((long)row * N_ + n0 + 2 * (lane % 4)) / 2;
          #pragma unroll
          for (int jj = 0; jj < BN / 8; ++jj) {{
            const int col = n0 + 8 * jj + 2 * (lane % 4);
            if (col < N_) {{
              const int r = 4 * jj + 2 * x;
              const float v0 = epilogue_value({gate_args("r")}, row, col{extra_args});
              const float v1 = epilogue_value({gate_args("r + 1")}, row, col + 1{extra_args});
              dst[4 * jj] = {make_pair.format("v0", "v1")};
            }}
          }}
        }}
      }}
#endif
    }}
  }}
#if CLUSTER > 1
  tf_cluster_sync();   // no CTA leaves while its peer may still write into its shared memory
#endif
}}
"""
