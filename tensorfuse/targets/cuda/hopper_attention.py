"""Warp-specialised attention for sm_90a: the CUDA C++ emitter (the plan, its knobs and checks:
``schedule_templates.hopper_attention_plan``).

One CTA per (row block, batch·head), ``128 · (1 + consumers)`` threads:

- warpgroup 0 is the producer: it gives its registers back (``setmaxnreg.dec``) and one thread
  issues TMA bulk-tensor copies (:mod:`.tma`, 3-D maps over ``[batch·heads, rows, D]`` so that a
  box past the last row of one head reads zeros, not the next head) — the query rows once, then
  for each key block of the row block's schedule its keys and its values into slot
  ``use % stages``, each completing on its own "full" mbarrier, after waiting on the slot's
  "empty" mbarrier for the consumers to be done with its previous use;
- each consumer warpgroup (``setmaxnreg.inc``) owns 64 query rows: ``S = Q·Kᵀ`` on
  ``wgmma.mma_async`` from shared memory (both operands K-major, 128-byte swizzle), the score the
  program writes evaluated on the accumulator fragments (the mask only on partial blocks and the
  ragged last one), the running maximum and sum in base 2 (the scale folded into one multiply),
  ``P`` packed to 16-bit pairs in registers — the accumulator layout of ``m64nNk16`` is the A
  fragment layout of the next ``wgmma`` — and ``O += P·V`` with V from shared memory. With
  ``overlap`` the next block's ``Q·Kᵀ`` is issued before this block's ``P·V``, and the softmax
  of the next block runs while ``P·V`` is on the tensor cores; ``O`` is rescaled once that product
  has landed. Every consumer thread arrives on the "empty" mbarriers when its warpgroup's product
  on a slot is complete.

The output is written from registers (rows past M are not written); rows whose every key is
masked give 0/0 (NaN), as the unfused program does.
"""
from __future__ import annotations

from .dsm import HELPERS as DSM_HELPERS
from .expr import forwarded, scalar_arguments, size_aliases, tensor_arguments, to_cuda
from .tma import HELPERS as TMA_HELPERS
from .tma import HELPERS_3D, MBARRIER_HELPERS
from .wgmma import HELPERS as WGMMA_HELPERS
from .wgmma import wgmma_function

ENTRY = "tf_hopper_attention"

# What the PTX of every Hopper attention kernel holds (checked by the tests).
HOPPER_PTX = ("wgmma.mma_async", "cp.async.bulk.tensor.3d", "mbarrier.try_wait",
              "setmaxnreg.inc", "setmaxnreg.dec", "ex2.approx")

_TYPES = {"bf16": ("__nv_bfloat16", "__nv_bfloat162", "__floats2bfloat162_rn"),
          "f16": ("__half", "__half2", "__floats2half2_rn")}


def kernel_arguments(plan) -> list[tuple[str, str, str]]:
    """(C++ name, TVM argument type, C++ type) of the kernel's arguments, in order: the tensor
    maps, the output, the block lists, tensors the score or mask read, the sizes, the scalars."""
    lists = "const int* __restrict__"
    args = [("maps", "handle", "const void*"), ("out", "handle", "void*"),
            ("pn", "handle", lists), ("pi", "handle", lists), ("fn", "handle", lists),
            ("fi", "handle", lists)]
    return args + tensor_arguments(plan.tensors) + \
        [(d, "int32", "int") for d in ("B_", "H_", "HKV_", "M_", "N_")] + \
        scalar_arguments(plan.chain.scalars)


def _expressions(plan) -> tuple[str, str, str]:
    """C++ for the score in base 2 (of ``qk``, ``b``, ``h``, ``i_``, ``j_``), the mask and the
    once-per-CTA scale (``"1.0f"`` when not folded)."""
    chain = plan.chain
    axes = {name: {"b": "b", "h": "h", "0": "i_", "j": "j_"}[role]
            for name, role in chain.score_axes}
    loads = {t: f"t_{t}" for t, _ in plan.tensors}
    if plan.scale is not None:
        scale = f"({to_cuda(plan.scale, {}, 'the scale', axes=axes, loads=loads)} * TF_LOG2E)"
        score = "(qk * scale2)"
    else:
        scale = "TF_LOG2E"
        written = to_cuda(plan.score, {chain.dot: "qk"}, "the score", axes, loads=loads)
        score = f"({written} * scale2)"
    mask = "true" if plan.mask is None else to_cuda(plan.mask, {}, "the mask", axes, loads=loads)
    return score, mask, scale


def hopper_attention_source(plan, knobs, D: int, lists: bool) -> str:
    """CUDA C++ for ``tf_hopper_attention``: grid (row blocks, B·H), ``knobs.threads`` threads,
    dynamic shared memory ``hopper_attention_plan.shared_bytes``. ``lists``: the row blocks'
    key blocks come from the block schedule (``pn``/``pi`` partial, ``fn``/``fi`` full) — a masked
    plan; otherwise every key block, none of them masked but the ragged last one. Sizes B, H, HKV,
    M, N are kernel arguments: one cubin serves every shape with this head dim."""
    chain = plan.chain
    elem, pair, pack = _TYPES[plan.dtype]
    header = "#include <cuda_bf16.h>\n" if plan.dtype == "bf16" else "#include <cuda_fp16.h>\n"
    suffix = "_f16" if plan.dtype == "f16" else ""
    bn = knobs.block_n
    s_mma = f"tf_wgmma_kk_m64n{bn}k16{suffix}"
    o_mma = f"tf_wgmma_rs_m64n{D}k16{suffix}"
    functions = wgmma_function(bn, b_k_major=True, dtype=plan.dtype) + \
        wgmma_function(D, a_in_registers=True, dtype=plan.dtype)
    args = kernel_arguments(plan)
    params = ",\n    ".join(f"{c} {n}" for n, _, c in args)
    # what the score and mask may read: tensors, sizes, scalars
    extra_params, extra_args = forwarded(args[6:])
    score, mask, scale = _expressions(plan)
    sizes = size_aliases(zip(chain.dims, ("B_", "H_", "HKV_", "M_", "N_", "D_")))
    return f"""{header}#include <math.h>
{DSM_HELPERS}
{WGMMA_HELPERS}
{MBARRIER_HELPERS}
{TMA_HELPERS}
{HELPERS_3D}
{functions}
#define D_ {D}
#define BM {knobs.block_m}
#define BN {bn}
#define STAGES {knobs.stages}
#define CONSUMERS {knobs.consumers}
#define THREADS {knobs.threads}
#define CONSUMER_REGS {knobs.consumer_registers}
#define PRODUCER_REGS 24
#define OVERLAP {int(knobs.overlap)}
// consumers take turns issuing MMAs
#define PINGPONG {int(knobs.pingpong and knobs.consumers > 1)}
#if PINGPONG
#define TURN_BEGIN tf_turn_wait(cw);
#define TURN_END tf_turn_pass(cw);
#else
#define TURN_BEGIN
#define TURN_END
#endif
#define LISTS {int(lists)}
#define ATOMS (D_ / 64)                 // 128-byte swizzle atoms along the head dim
#define Q_BYTES (BM * D_ * 2)
#define KV_BYTES (BN * D_ * 2)
#define TF_LOG2E 1.4426950408889634f
{sizes}
typedef {elem} elem_t;

__device__ __forceinline__ float tf_exp2(float x) {{
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
// The i-th key block of this row block's schedule, and whether it needs the mask.
struct Schedule {{
  const int* partial;
  const int* full;
  int n_partial, count;
  __device__ __forceinline__ int block(int it) const {{
#if LISTS
    return it < n_partial ? partial[it] : full[it - n_partial];
#else
    return it;
#endif
  }}
}};

// K-major 128-byte-swizzled tile of `rows` rows (atoms of 64 along the head dim): the wgmma
// descriptor of k16 step `ks` from row `row0`.
__device__ __forceinline__ unsigned long long kmajor_desc(unsigned tile, int rows, int row0,
                                                          int ks) {{
  return tf_smem_desc_sw128_at(tile + (ks / 4) * rows * 128 + row0 * 128 + (ks % 4) * 32, 16,
                               1024);
}}
// MN-major (the values: head dim contiguous) tile of BN key rows: k16 step `ks` over the keys.
__device__ __forceinline__ unsigned long long vmajor_desc(unsigned tile, int ks) {{
  return tf_smem_desc_sw128_at(tile + ks * 16 * 128, BN * 128, 1024);
}}

// S (log2 units) of one key block: the program's score on the fragment, masked where `masked`.
// Fragment register r of warp w, lane l: row 16w + l/4 + 8·((r%4)/2),
// column 8·(r/4) + 2·(l%4) + r%2.
template <bool MASKED>
__device__ __forceinline__ void score_block(float (&s)[BN / 2], int row_lo, int n0, int b, int h,
    int lane, float scale2{extra_params}) {{
  #pragma unroll
  for (int r = 0; r < BN / 2; ++r) {{
    const int i_ = row_lo + 8 * ((r % 4) / 2);
    const int j_ = n0 + 8 * (r / 4) + 2 * (lane % 4) + (r % 2);
    const float qk = s[r];
    float v = {score};
    if (MASKED) v = (j_ < N_ && ({mask})) ? v : -INFINITY;
    s[r] = v;
  }}
}}

// Online softmax of one block in base 2: new row maxima (two rows per thread), the correction of
// the old state, P = 2^(S - m) in place, the thread's share of the row sums.
__device__ __forceinline__ void softmax_block(float (&s)[BN / 2], float (&m)[2], float (&l)[2],
                                              float (&corr)[2]) {{
  float mx[2] = {{m[0], m[1]}};
  #pragma unroll
  for (int r = 0; r < BN / 2; ++r) mx[(r % 4) / 2] = fmaxf(mx[(r % 4) / 2], s[r]);
  #pragma unroll
  for (int x = 0; x < 2; ++x) {{
    mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
    mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
    const float use = mx[x] == -INFINITY ? 0.0f : mx[x];   // a row with nothing seen yet
    corr[x] = tf_exp2(m[x] - use);
    m[x] = mx[x];
    mx[x] = use;
    l[x] *= corr[x];
  }}
  #pragma unroll
  for (int r = 0; r < BN / 2; ++r) {{
    s[r] = tf_exp2(s[r] - mx[(r % 4) / 2]);
    l[(r % 4) / 2] += s[r];
  }}
}}

__device__ __forceinline__ void pack_p(const float (&s)[BN / 2], uint4 (&p)[BN / 16]) {{
  #pragma unroll
  for (int t = 0; t < BN / 16; ++t)
    p[t] = make_uint4(tf_pack(s[8 * t], s[8 * t + 1]), tf_pack(s[8 * t + 2], s[8 * t + 3]),
                      tf_pack(s[8 * t + 4], s[8 * t + 5]), tf_pack(s[8 * t + 6], s[8 * t + 7]));
}}

__device__ __forceinline__ void rescale(float (&o)[D_ / 2], const float (&corr)[2]) {{
  #pragma unroll
  for (int r = 0; r < D_ / 2; ++r) o[r] *= corr[(r % 4) / 2];
}}

extern "C" __global__ void __launch_bounds__(THREADS, 1) {ENTRY}(
    {params}) {{
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = (unsigned char*)(((unsigned long)smem_raw + 1023) & ~1023ul);
  unsigned char* q_tile = smem;
  unsigned char* k_tiles = smem + Q_BYTES;
  unsigned char* v_tiles = k_tiles + STAGES * KV_BYTES;
  unsigned long long* bars = (unsigned long long*)(v_tiles + STAGES * KV_BYTES);
  unsigned long long* bar_q = bars;
  unsigned long long* full_k = bars + 1;
  unsigned long long* full_v = full_k + STAGES;
  unsigned long long* empty_k = full_v + STAGES;
  unsigned long long* empty_v = empty_k + STAGES;
  const void* q_map = (const char*)maps;
  const void* k_map = (const char*)maps + 128;
  const void* v_map = (const char*)maps + 256;

  const int row_blocks = (M_ + BM - 1) / BM;
  const int rb = row_blocks - 1 - blockIdx.x;     // longest rows first (masked variants)
  const int bh = blockIdx.y;
  const int b = bh / H_, h = bh % H_;
  const int kv = b * HKV_ + h / (H_ / HKV_);
  Schedule sched;
#if LISTS
  const int col_blocks = (N_ + BN - 1) / BN;
  const int at = bh * row_blocks + rb;
  sched.partial = pi + (long)at * col_blocks;
  sched.full = fi + (long)at * col_blocks;
  sched.n_partial = pn[at];
  sched.count = pn[at] + fn[at];
#else
  sched.partial = sched.full = nullptr;
  sched.n_partial = 0;
  sched.count = (N_ + BN - 1) / BN;
#endif
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {{
    tf_mbar_init(bar_q, 1);
    for (int s = 0; s < STAGES; ++s) {{
      tf_mbar_init(full_k + s, 1);
      tf_mbar_init(full_v + s, 1);
      tf_mbar_init(empty_k + s, 128 * CONSUMERS);
      tf_mbar_init(empty_v + s, 128 * CONSUMERS);
    }}
    tf_mbar_init_fence();
  }}
  __syncthreads();

  if (wg == 0) {{   // the producer
    tf_setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x == 0) {{
      tf_tensormap_acquire(q_map);
      tf_tensormap_acquire(k_map);
      tf_tensormap_acquire(v_map);
      tf_mbar_expect(bar_q, Q_BYTES);
      #pragma unroll
      for (int a = 0; a < ATOMS; ++a)
        tf_tma_load_3d(q_tile + a * BM * 128, q_map, a * 64, rb * BM, bh, bar_q);
      for (int it = 0; it < sched.count; ++it) {{
        const int s = it % STAGES;
        const int n0 = sched.block(it) * BN;
        if (it >= STAGES) tf_mbar_wait(empty_k + s, ((it / STAGES) - 1) & 1);
        tf_mbar_expect(full_k + s, KV_BYTES);
        #pragma unroll
        for (int a = 0; a < ATOMS; ++a)
          tf_tma_load_3d(k_tiles + s * KV_BYTES + a * BN * 128, k_map, a * 64, n0, kv, full_k + s);
        if (it >= STAGES) tf_mbar_wait(empty_v + s, ((it / STAGES) - 1) & 1);
        tf_mbar_expect(full_v + s, KV_BYTES);
        #pragma unroll
        for (int a = 0; a < ATOMS; ++a)
          tf_tma_load_3d(v_tiles + s * KV_BYTES + a * BN * 128, v_map, a * 64, n0, kv, full_v + s);
      }}
    }}
    return;
  }}

  // a consumer warpgroup: query rows [rb·BM + 64·cw, +64)
  tf_setmaxnreg_inc<CONSUMER_REGS>();
  const int cw = wg - 1;
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int row_lo = rb * BM + cw * 64 + warp * 16 + lane / 4;
  const float scale2 = {scale};
  const unsigned q_base = tf_smem_addr(q_tile), k_base = tf_smem_addr(k_tiles),
                 v_base = tf_smem_addr(v_tiles);
  float o[D_ / 2];
  #pragma unroll
  for (int r = 0; r < D_ / 2; ++r) o[r] = 0.0f;
  float m[2] = {{-INFINITY, -INFINITY}}, l[2] = {{0.0f, 0.0f}}, corr[2];
  float s[BN / 2];
  uint4 p[BN / 16];
  tf_mbar_wait(bar_q, 0);

#define SCORE_ARGS scale2{extra_args}
  // q·kᵀ of use `it` into s (issued, not waited for)
#define ISSUE_S(it)                                                                         \\
  {{                                                                                          \\
    const unsigned kt = k_base + ((it) % STAGES) * KV_BYTES;                                  \\
    tf_mbar_wait(full_k + (it) % STAGES, ((it) / STAGES) & 1);                               \\
    tf_wgmma_fence();                                                                         \\
    _Pragma("unroll") for (int ks = 0; ks < D_ / 16; ++ks)                                   \\
      {s_mma}(s, kmajor_desc(q_base, BM, cw * 64, ks), kmajor_desc(kt, BN, 0, ks), ks > 0);   \\
    tf_wgmma_commit();                                                                        \\
  }}
  // o += p·v of use `it` (issued, not waited for)
#define ISSUE_O(it)                                                                         \\
  {{                                                                                          \\
    const unsigned vt = v_base + ((it) % STAGES) * KV_BYTES;                                  \\
    tf_mbar_wait(full_v + (it) % STAGES, ((it) / STAGES) & 1);                               \\
    tf_wgmma_fence();                                                                         \\
    _Pragma("unroll") for (int ks = 0; ks < BN / 16; ++ks)                                   \\
      {o_mma}(o, p[ks], vmajor_desc(vt, ks), 1);                                         \\
    tf_wgmma_commit();                                                                        \\
  }}
  // the score and softmax of use `it`, whose q·kᵀ has landed in s
#define SOFTMAX(it)                                                                         \\
  {{                                                                                          \\
    const int n0 = sched.block(it) * BN;                                                      \\
    if ((it) < sched.n_partial || n0 + BN > N_)                                               \\
      score_block<true>(s, row_lo, n0, b, h, lane, SCORE_ARGS);                               \\
    else                                                                                      \\
      score_block<false>(s, row_lo, n0, b, h, lane, SCORE_ARGS);                              \\
    softmax_block(s, m, l, corr);                                                             \\
  }}

  // With PINGPONG the consumers issue their MMAs in turns (0, 1, …), so that one warpgroup's
  // softmax runs while another's products use the tensor cores (FlashAttention-3's ping-pong).
  // The last warpgroup opens the first turn; the first one takes the extra turn at the end.
#if PINGPONG
  if (cw == CONSUMERS - 1) tf_turn_pass(cw);
#endif
  if (sched.count > 0) {{
    TURN_BEGIN
    ISSUE_S(0);
    TURN_END
    tf_wgmma_wait<0>();
    tf_fence_regs(s);
    tf_mbar_arrive(empty_k + 0);
    SOFTMAX(0);
    pack_p(s, p);
    for (int it = 1; it < sched.count; ++it) {{
#if OVERLAP
      TURN_BEGIN
      ISSUE_S(it);
      ISSUE_O(it - 1);
      TURN_END
      tf_wgmma_wait<1>();            // q·kᵀ of `it` has landed; p·v of `it - 1` may still run
      tf_fence_regs(s);
      tf_mbar_arrive(empty_k + it % STAGES);
      SOFTMAX(it);
      tf_wgmma_wait<0>();
      tf_fence_regs(o);
      tf_mbar_arrive(empty_v + (it - 1) % STAGES);
      rescale(o, corr);
      pack_p(s, p);
#else
      TURN_BEGIN
      ISSUE_O(it - 1);
      tf_wgmma_wait<0>();
      tf_fence_regs(o);
      tf_mbar_arrive(empty_v + (it - 1) % STAGES);
      ISSUE_S(it);
      TURN_END
      tf_wgmma_wait<0>();
      tf_fence_regs(s);
      tf_mbar_arrive(empty_k + it % STAGES);
      SOFTMAX(it);
      rescale(o, corr);
      pack_p(s, p);
#endif
    }}
    TURN_BEGIN
    ISSUE_O(sched.count - 1);
    TURN_END
    tf_wgmma_wait<0>();
    tf_fence_regs(o);
    tf_mbar_arrive(empty_v + (sched.count - 1) % STAGES);
  }}
#if PINGPONG
  if (cw == 0) tf_turn_wait(cw);   // the turn the last warpgroup opened
#endif

  // o / l, written from the fragments: row_lo (registers r % 4 < 2) and row_lo + 8
  #pragma unroll
  for (int x = 0; x < 2; ++x) {{
    l[x] += __shfl_xor_sync(0xffffffffu, l[x], 1);
    l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
  }}
  const float inv[2] = {{1.0f / l[0], 1.0f / l[1]}};
  elem_t* out_e = (elem_t*)out;
  #pragma unroll
  for (int x = 0; x < 2; ++x) {{
    const int row = row_lo + 8 * x;
    if (row < M_) {{
      unsigned* dst = (unsigned*)(out_e + ((long)bh * M_ + row) * D_ + 2 * (lane % 4));
      #pragma unroll
      for (int jj = 0; jj < D_ / 8; ++jj)
        dst[4 * jj] = tf_pack(o[4 * jj + 2 * x] * inv[x], o[4 * jj + 2 * x + 1] * inv[x]);
    }}
  }}
}}
"""
