"""The CUDA C++ emitter of the GEMM-chain template: ``Y = epilogue(Σ_n act(X·W1, X·W3, …)[i, n] ·
W2[n, o])`` over a thread-block cluster, from a plan, its knobs and (wgmma) its pipeline layout
(``schedule_templates.gemm_chain_plan``), which say what to compute and how it is tiled.

The kernel (:func:`gemm_chain_source`): the ``cluster`` CTAs of a cluster own ``block_m`` rows
and ``cluster × block_n`` neighbouring columns of the intermediate, ``block_n`` each. A CTA computes
its slice ``H = act(X·W1[:, slice])`` on tensor cores (``wgmma`` on sm_90a by default, body in
:mod:`.gemm_chain_wgmma`; or ``ldmatrix`` + ``mma.sync``, here) through a multi-stage copy pipeline
(cp.async, or TMA with wgmma) and keeps it, as bf16, in shared memory. Each CTA then computes
``O / cluster`` output columns of ``H · W2[cluster's rows, :]`` from the cluster's whole ``H``, with
W2 streamed through a second pipeline — the intermediate never goes to global memory. The cluster
shares ``H`` in one of two ways (``exchange``): ``"gather"`` stores each slice into every peer's
shared memory too (``mapa`` + ``st.shared::cluster``, one cluster barrier), so each CTA holds the
whole ``H``; ``"peer"`` (wgmma, the default) keeps only the CTA's own slice, stored in the order of
wgmma's register A fragments, and the second product loads each k-tile's fragments from the owning
peer (``ld.shared::cluster``) into registers — so a CTA's shared memory no longer limits the
cluster's columns, and larger clusters mean fewer partial sums between clusters. Clusters (which own
different intermediate columns) meet in f32 vector atomics; a small epilogue kernel converts the
f32 sums. Clusters are rasterized in groups of ``group_m`` row blocks so that concurrent CTAs share
weight slices in L2.
"""
from __future__ import annotations

from .dsm import HELPERS
from .expr import scalar_name, size_macros, stored_value, to_cuda
from .gemm_chain_wgmma import wgmma_body
from .mma_sync import HELPERS as MMA_SYNC_HELPERS

WARPS_N = 4  # warps along the columns; the rows get warps / 4
EPILOGUE_VEC = 8        # outputs per thread of tf_chain_epilogue: its code is written for 8
                        # (two float4 loads, one 16-byte store); the launcher sizes the grid by it


def activation_code(plan) -> str:
    """The activation as C++ over the first-level sums ``g0``, ``g1``, …"""
    return to_cuda(plan.activation, {n: f"g{k}" for k, n in enumerate(plan.gate_sums)},
                   "the activation")


def epilogue_code(plan) -> str:
    """The epilogue as C++ over the second sum ``y`` (stored as bf16)."""
    return to_cuda(stored_value(plan.epilogue, "bf16"), {plan.second: "y"},
                   f"the output {plan.output}")


def gemm_chain_source(plan, knobs, layout, M: int, K: int, N: int, O: int) -> str:
    """CUDA C++ for ``tf_chain_main`` (adds into a zeroed f32 ``ysum``) and ``tf_chain_epilogue``.

    ``mma="wgmma"``: each warpgroup issues ``wgmma.mma_async`` m64nNk16 on descriptors of
    128-byte-swizzled shared-memory tiles (:mod:`.wgmma`), one k-tile's group in flight while the
    next is issued. ``mma="mma_sync"``: ``mma.sync.m16n8k16`` on fragments loaded with
    ``ldmatrix`` (``.trans`` for the weights, stored [in, out]); each warp owns a
    (block_m/(warps/4)) × (block_n/4) tile of the intermediate and a (block_m/(warps/4)) ×
    (block_o/4) tile of each output tile. ``plan``, ``knobs`` and ``layout`` (wgmma's pipeline
    geometry, None for mma.sync) come from ``schedule_templates.gemm_chain_plan``, sizes checked.
    """
    if knobs.mma == "wgmma":
        body = wgmma_body(plan, knobs, layout, activation_code(plan))
    else:
        body = _mma_sync_body(plan, knobs) + _MAIN
    return _header(plan, knobs, M, K, N, O) + body.replace("@GATE_ARGS@", "".join(
        f"const __nv_bfloat16* __restrict__ w{j}, " for j in range(len(plan.gates)))).replace(
        "@SCALAR_ARGS@", _scalar_parameters(plan)).replace(
        "@GATES@", ", ".join(f"w{j}" for j in range(len(plan.gates)))).replace(
        "@MAPS_ARG@", ", const char* __restrict__ maps" if knobs.copy == "tma" else "").replace(
        "@BOUNDS@", f"__launch_bounds__({knobs.threads}, {knobs.ctas_per_sm})")


def _scalar_parameters(plan) -> str:
    """The kernels' scalar parameters (floats), after their other parameters."""
    return "".join(f", float {scalar_name(s)}" for s in plan.scalars)


def _header(plan, knobs, M: int, K: int, N: int, O: int) -> str:
    """Sizes and knobs as macros, the DSM helpers, the f32 epilogue kernel and the rasterization
    both tensor-core paths share."""
    scalar_args = _scalar_parameters(plan)
    epilogue = epilogue_code(plan)
    return f"""#include <cuda_bf16.h>
{HELPERS}
{size_macros(dict(zip(plan.dims, (M, K, N, O))))}#define BM {knobs.block_m}
#define BN {knobs.block_n}
#define BK {knobs.block_k}
#define BO {knobs.block_o}
#define STAGES {knobs.stages}
#define CLUSTER {knobs.cluster}
#define GROUP_M {knobs.group_m}
#define G {len(plan.gates)}
#define M_ {M}
#define K_ {K}
#define N_ {N}
#define O_ {O}
#define HW (CLUSTER * BN)      // the cluster's intermediate columns: the second GEMM's depth
#define OC (O_ / CLUSTER)      // output columns per CTA

// The f32 sums through the epilogue into the bf16 output, EPILOGUE_VEC elements per thread (O is
// a multiple of 64): one element per thread took 7.5 µs at M=128 on the H100 (ncu), 7 % of the call.
#define EPILOGUE_VEC {EPILOGUE_VEC}
extern "C" __global__ void tf_chain_epilogue(const float* __restrict__ ysum,
                                             __nv_bfloat16* __restrict__ out{scalar_args}) {{
  const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * EPILOGUE_VEC;
  if (i >= (long)M_ * O_) return;
  const float4 lo = *reinterpret_cast<const float4*>(ysum + i);
  const float4 hi = *reinterpret_cast<const float4*>(ysum + i + 4);
  const float sums[EPILOGUE_VEC] = {{lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w}};
  unsigned packed[EPILOGUE_VEC / 2];
  #pragma unroll
  for (int e = 0; e < EPILOGUE_VEC; e += 2) {{
    float y = sums[e];
    const float first = {epilogue};
    y = sums[e + 1];
    const __nv_bfloat162 pair = __floats2bfloat162_rn(first, {epilogue});
    packed[e / 2] = *reinterpret_cast<const unsigned*>(&pair);
  }}
  *reinterpret_cast<uint4*>(out + i) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}}

// Adds one accumulator fragment to the clusters' f32 sums. Lanes l and l ^ 1 hold columns c, c + 1
// and c + 2, c + 3 of rows `row` and `row` + 8 (the mma.sync / wgmma layout): they swap halves so
// that the even lane adds row `row`'s four columns and the odd lane row `row` + 8's — one 16-byte
// vector atomic each instead of two 8-byte ones. Every lane of the warp must call it.
__device__ __forceinline__ void add_to_sums(float* __restrict__ ysum, int row, int col, float a0,
                                            float a1, float b0, float b1) {{
  const bool odd = threadIdx.x & 1;
  const float g0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
  const float g1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
  const int r = odd ? row + 8 : row;
  if (r < M_)
    atomicAdd(reinterpret_cast<float4*>(ysum + (long)r * O_ + (col & ~3)),
              odd ? make_float4(g0, g1, b0, b1) : make_float4(a0, a1, g0, g1));
}}

// This CTA's rows m0 and intermediate columns n0. Clusters are numbered in launch order and walk
// GROUP_M row blocks for each group of columns before moving on, so that the weight slices one
// wave reads are read again from L2 by the rows beside it, not from memory.
__device__ __forceinline__ void tile_of_cta(unsigned rank, int& m0, int& n0) {{
  const int ncl = gridDim.x / CLUSTER, per_group = GROUP_M * ncl;
  const int cid = blockIdx.y * ncl + blockIdx.x / CLUSTER;
  const int first = cid / per_group * GROUP_M, rows = min((int)gridDim.y - first, GROUP_M);
  const int in_group = cid % per_group;
  m0 = (first + in_group % rows) * BM;
  n0 = ((in_group / rows) * CLUSTER + rank) * BN;
}}
"""


def _mma_sync_body(plan, knobs) -> str:
    """The mma.sync path's device functions: fragments and MMA, the first product's pipeline and
    the activation into shared memory."""
    return _mma_sync_fragments(knobs) + _MMA_SYNC_LOADS + _mma_sync_first_products(plan)


def _mma_sync_fragments(knobs) -> str:
    """Warp tiles, the ldmatrix/mma.sync helpers, a warp's k16 step and zeroing."""
    wm_rows, wn_cols, wo_cols = (knobs.block_m // knobs.warps_m, knobs.block_n // WARPS_N,
                                 knobs.block_o // WARPS_N)
    return f"""#define WM {wm_rows}
#define WN {wn_cols}
#define WO {wo_cols}
#define MI {wm_rows // 16}
#define NI {wn_cols // 8}
#define NI2 {wo_cols // 8}
#define WARPS_N {WARPS_N}
#define LDX (BK + 8)
#define LDW (BN + 8)
#define LDW2 (BO + 8)

{MMA_SYNC_HELPERS}
// One k16 step of a warp tile: A rows from a row-major [rows][lda] tile, B from a row-major
// [k][ldb] tile (ldmatrix.trans gives the column operand), ACC[MI][NT][4] += A · B.
template <int NT>
__device__ __forceinline__ void warp_mma_k16(float (&acc)[MI][NT][4], const __nv_bfloat16* a,
    int lda, const __nv_bfloat16* b, int ldb, int lane) {{
  unsigned af[MI][4];
  #pragma unroll
  for (int i = 0; i < MI; ++i) ldsm_x4(af[i], a + (i * 16 + lane % 16) * lda + (lane / 16) * 8);
  #pragma unroll
  for (int jn = 0; jn < NT / 2; ++jn) {{
    unsigned bf[4];
    ldsm_x4_t(bf, b + (lane % 8 + ((lane / 8) % 2) * 8) * ldb + jn * 16 + (lane / 16) * 8);
    #pragma unroll
    for (int i = 0; i < MI; ++i) {{
      mma16816(acc[i][2 * jn], af[i], bf[0], bf[1]);
      mma16816(acc[i][2 * jn + 1], af[i], bf[2], bf[3]);
    }}
  }}
}}
template <int A, int B>
__device__ __forceinline__ void zero(float (&acc)[A][B][4]) {{
  #pragma unroll
  for (int i = 0; i < A; ++i)
    #pragma unroll
    for (int j = 0; j < B; ++j)
      #pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}}

"""


# One pipeline stage (x and each gate weight) and a W2 tile by cp.async.
_MMA_SYNC_LOADS = r"""// Loads one pipeline stage: x rows [m0, m0 + BM) × k [k0, k0 + BK), and each gate weight's
// k rows × this CTA's BN intermediate columns.
__device__ __forceinline__ void load_stage(char* stage, const __nv_bfloat16* __restrict__ x,
    const __nv_bfloat16* const* ws, int m0, int n0, int k0) {
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(stage);
  for (int c = threadIdx.x; c < BM * BK / 8; c += blockDim.x) {
    int r = c / (BK / 8), col = (c % (BK / 8)) * 8;
    bool ok = m0 + r < M_;
    tf_cp_async16(xs + r * LDX + col, x + (long)(ok ? m0 + r : 0) * K_ + k0 + col, ok);
  }
  #pragma unroll
  for (int j = 0; j < G; ++j) {
    __nv_bfloat16* wsm = xs + BM * LDX + j * BK * LDW;
    for (int c = threadIdx.x; c < BK * BN / 8; c += blockDim.x) {
      int r = c / (BN / 8), col = (c % (BN / 8)) * 8;
      tf_cp_async16(wsm + r * LDW + col, ws[j] + (long)(k0 + r) * N_ + n0 + col, true);
    }
  }
}

// BK rows (from n0) × BO columns (from o0) of W2 into a [BK][LDW2] tile.
__device__ __forceinline__ void load_w2(__nv_bfloat16* dst, const __nv_bfloat16* __restrict__ w2,
                                        int n0, int o0) {
  for (int c = threadIdx.x; c < BK * BO / 8; c += blockDim.x) {
    int r = c / (BO / 8), col = (c % (BO / 8)) * 8;
    tf_cp_async16(dst + r * LDW2 + col, w2 + (long)(n0 + r) * O_ + o0 + col, true);
  }
}

"""


def _mma_sync_first_products(plan) -> str:
    """Phase 1 through the cp.async pipeline, and the activation into shared memory."""
    gate_values = "".join(f"float g{j} = acc[{j}][i][k][2 * half + e]; "
                          for j in range(len(plan.gates)))
    activation = activation_code(plan)
    return f"""// Phase 1: acc[j] = x[m0 : m0 + BM] · w_j[:, n0 : n0 + BN] on tensor cores, through a
// STAGES-deep cp.async pipeline in `pipe`; on return the pipeline buffers are free.
__device__ __forceinline__ void first_products(float (&acc)[G][MI][NI][4], char* pipe,
    const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* const* ws, int m0, int n0, int wm,
    int wn, int lane) {{
  const int stage_bytes = BM * LDX * 2 + G * BK * LDW * 2;
  #pragma unroll
  for (int j = 0; j < G; ++j) zero(acc[j]);
  const int KT = K_ / BK;
  #pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {{
    if (s < KT) load_stage(pipe + s * stage_bytes, x, ws, m0, n0, s * BK);
    tf_cp_async_commit();
  }}
  for (int kt = 0; kt < KT; ++kt) {{
    tf_cp_async_wait<STAGES - 2>();
    __syncthreads();
    int next = kt + STAGES - 1;
    if (next < KT) load_stage(pipe + (next % STAGES) * stage_bytes, x, ws, m0, n0, next * BK);
    tf_cp_async_commit();
    const __nv_bfloat16* xs = reinterpret_cast<const __nv_bfloat16*>(pipe + (kt % STAGES) * stage_bytes);
    #pragma unroll
    for (int kk = 0; kk < BK; kk += 16)
      #pragma unroll
      for (int j = 0; j < G; ++j)
        warp_mma_k16<NI>(acc[j], xs + wm * WM * LDX + kk, LDX,
                         xs + BM * LDX + j * BK * LDW + kk * LDW + wn * WN, LDW, lane);
  }}
  tf_cp_async_wait<0>();
  __syncthreads();
}}

// The activation, elementwise on the accumulators, into hs[row][col0 + col] as bf16.
__device__ __forceinline__ void store_activation(const float (&acc)[G][MI][NI][4],
    __nv_bfloat16* hs, int ldh, int col0, int wm, int wn, int lane) {{
  const int gr = lane / 4, tq = lane % 4;
  #pragma unroll
  for (int i = 0; i < MI; ++i)
    #pragma unroll
    for (int k = 0; k < NI; ++k)
      #pragma unroll
      for (int half = 0; half < 2; ++half) {{
        float h[2];
        #pragma unroll
        for (int e = 0; e < 2; ++e) {{
          {gate_values}
          h[e] = {activation};
        }}
        const int row = wm * WM + i * 16 + gr + 8 * half, col = col0 + wn * WN + k * 8 + 2 * tq;
        *reinterpret_cast<__nv_bfloat162*>(hs + row * ldh + col) = __floats2bfloat162_rn(h[0], h[1]);
      }}
}}
"""


# H all-gathered through DSM, each CTA computing its share of the outputs.
_MAIN = r"""
#define LDHF (HW + 8)

extern "C" __global__ void @BOUNDS@
tf_chain_main(const __nv_bfloat16* __restrict__ x, @GATE_ARGS@const __nv_bfloat16* __restrict__ w2,
              float* __restrict__ ysum@SCALAR_ARGS@) {
  extern __shared__ __align__(128) char smem[];
  tf_cluster_arrive();  // this CTA has started; after the matching wait peers may write into it
  const __nv_bfloat16* ws[G] = {@GATES@};
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int gr = lane / 4, tq = lane % 4;
  const unsigned rank = tf_cluster_rank();
  int m0, n0;
  tile_of_cta(rank, m0, n0);
  __nv_bfloat16* hf = reinterpret_cast<__nv_bfloat16*>(smem);  // H of the cluster: BM × HW
  char* pipe = smem + BM * LDHF * 2;

  float acc[G][MI][NI][4];
  first_products(acc, pipe, x, ws, m0, n0, wm, wn, lane);
  store_activation(acc, hf, LDHF, rank * BN, wm, wn, lane);
  __syncthreads();
  tf_cluster_wait();    // every peer has started
  // All-gather: this CTA's slice of H into each peer's copy (16-byte DSM stores).
  for (int p = 1; p < CLUSTER; ++p) {
    const unsigned peer = (rank + p) % CLUSTER;
    for (int c = threadIdx.x; c < BM * BN / 8; c += blockDim.x) {
      const __nv_bfloat16* src = hf + (c / (BN / 8)) * LDHF + rank * BN + (c % (BN / 8)) * 8;
      tf_st_dsm_v4(tf_mapa(tf_smem_addr(src), peer), *reinterpret_cast<const uint4*>(src));
    }
  }
  tf_cluster_arrive();  // release: our stores are seen by each peer after its wait

  // Phase 2: ysum[m0 rows, this CTA's OC columns] += H · W2[cluster rows, OC columns], W2 through
  // a STAGES-deep pipeline of BK × BO tiles, BO columns at a time.
  const int nc = n0 - (int)rank * BN, o_base = rank * OC;
  const int KS = HW / BK, T = (OC / BO) * KS;
  __nv_bfloat16* w2p = reinterpret_cast<__nv_bfloat16*>(pipe);
  #pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < T) load_w2(w2p + s * BK * LDW2, w2, nc + (s % KS) * BK, o_base + (s / KS) * BO);
    tf_cp_async_commit();
  }
  tf_cluster_wait();    // acquire: every slice of H is in place
  float acc2[MI][NI2][4];
  zero(acc2);
  for (int it = 0; it < T; ++it) {
    tf_cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int next = it + STAGES - 1;
    if (next < T)
      load_w2(w2p + (next % STAGES) * BK * LDW2, w2, nc + (next % KS) * BK,
                  o_base + (next / KS) * BO);
    tf_cp_async_commit();
    const int ks = it % KS;
    const __nv_bfloat16* w2s = w2p + (it % STAGES) * BK * LDW2;
    #pragma unroll
    for (int kk = 0; kk < BK; kk += 16)
      warp_mma_k16<NI2>(acc2, hf + wm * WM * LDHF + ks * BK + kk, LDHF, w2s + kk * LDW2 + wn * WO,
                        LDW2, lane);
    if (ks == KS - 1) {   // this output tile is complete: add it to the other clusters' sums
      const int o0 = o_base + (it / KS) * BO + wn * WO + 2 * tq;
      #pragma unroll
      for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int k = 0; k < NI2; ++k)
          add_to_sums(ysum, m0 + wm * WM + i * 16 + gr, o0 + k * 8, acc2[i][k][0], acc2[i][k][1],
                      acc2[i][k][2], acc2[i][k][3]);
      zero(acc2);
    }
  }
}
"""
