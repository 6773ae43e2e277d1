"""The attention backward for sm_90a: ``dK``, ``dV`` and ``dQ`` on ``wgmma`` from tensor maps (the
plan: :mod:`tensorfuse.schedule_templates.hopper_attention_backward`).

One CTA per (batch · key/value head, key block of 128 keys) — the heads side by side along the
grid's x, so that under a causal mask every head's longest CTAs (its first key blocks) start
first; or, where the dQ of the heads running at once would not stay in L2, a head's key blocks
side by side (the plan's ``keys_fastest``) —, three warpgroups:

- warpgroup 0, the producer, gives its registers back (``setmaxnreg.dec``); one thread copies the
  CTA's keys and values once (TMA boxes of the 128-byte swizzle), then, for every query block
  the CTA visits — every head of the group, every query block the mask keeps (the transposed
  block lists) or all of them — the block's queries and output gradient into a slot of a
  ring (:func:`ring_stages`: three slots at head dims 64 and 128); 64 of its threads copy the
  rows' base-2 log-sum-exps and ``Δ`` (+∞ and 0 past the last row, so that ``P`` is 0 there)
  beside them and arrive on the slot's mbarrier;
- each consumer warpgroup owns 64 of the keys and, per query block (64 queries, or 128 where
  the plan's ``block_queries`` says: head dims up to 64), computes in the transposed
  orientation (keys along the accumulator's rows, so no register tile is transposed):
  ``Sᵀ = K·Qᵀ`` and ``dPᵀ = V·dOᵀ`` (both operands K-major), ``Pᵀ = 2^(Sᵀ·scale₂ − LSE₂)``, the
  mask on partial blocks, ``dSᵀ = factor · Pᵀ ∘ (dPᵀ − Δ)``; ``dV += Pᵀ·dO`` and, after
  dQ's product below, ``dK += dSᵀ·Q``, with ``Pᵀ`` and ``dSᵀ`` as register A operands (the
  accumulator layout of ``m64nNk16`` is the A fragment layout), dO and Q read MN-major from
  the same tiles; dK runs on the tensor cores while the warpgroup writes and adds dQ's tile,
  and the visit's slot is given back when the next visit starts (dK has read its queries);
- ``dSᵀ`` goes to shared memory as ``dS`` by ``stmatrix`` (transposed 8×8 blocks; queries along
  the rows, keys K-major: the A operand of ``dQ = dS·K``), double-buffered so that one named
  barrier a block orders it; for head dims
  of 128 each warpgroup computes half of dQ's columns over all 128 keys, for 64 with blocks of
  128 queries its 64 of the queries over all 128 keys, with blocks of 64 all columns over its
  own keys; each warpgroup writes its part of dQ into a tile of shared
  memory (the 128-byte swizzle) that one thread adds into a float32 ``dQ`` by TMA
  (``cp.reduce.async.bulk.tensor``, rows past the last query not written), converted to the
  output dtype afterwards. Element-wise ``red.global.add`` from registers took a third of the
  kernel's time at S=4096 on the H200 (2.11 ms, 1.46 without them; the kernel as
  ``benchmarks.attention_backward --kernels`` times it).

``dK`` and ``dV`` (summed over the group's heads in registers: no second kernel for grouped
heads) are written once from registers, rows past the last key not written.
"""
from __future__ import annotations

import math

from .. import get_target
from .dsm import HELPERS as DSM_HELPERS
from .expr import C_TYPES, KernelArguments, scalar_arguments, tensor_arguments
from .hopper_backward_scores import (batch_values, mask_code, probabilities_and_ds,
                                     score_functions)
from .tma import HELPERS as TMA_HELPERS
from .parts import swap
from .parts.loads import flat_box
from .parts.mainloop import attention_pack_function
from .parts.row_state import attention_exp2
from .tma import MBARRIER_HELPERS, REDUCE_HELPERS, TENSOR_MAP_TYPE, load_helper
from .wgmma import HELPERS as WGMMA_HELPERS
from .wgmma import wgmma_function

ENTRY = "tf_hopper_attention_backward"
THREADS = 384
MAX_STAGES = 3   # the queries' ring: slots where shared memory holds them, up to this many
PRODUCER_REGS, CONSUMER_REGS = 40, 232
BN = 128
DQ_ROWS = 64   # a warpgroup's dQ tile: 64 queries × 64 columns (f32)
DQ_BYTES = 2 * DQ_ROWS * 64 * 4   # the two warpgroups' dQ tiles
# What the PTX of the kernel holds (checked by the tests).
BACKWARD_PTX = ("wgmma.mma_async", "cp.async.bulk.tensor.3d",
                "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add", "setmaxnreg.inc",
                "ex2.approx")

_PAIRS = {"bf16": ("__nv_bfloat162", "__floats2bfloat162_rn"),
          "f16": ("__half2", "__floats2half2_rn")}


def shared_bytes(head_dim: int, block_queries: int, stages: int | None = None) -> int:
    """Dynamic shared memory of the kernel at ``head_dim`` and ``block_queries`` queries a visit,
    with ``stages`` slots in the queries' ring (:func:`ring_stages`' by default): keys and
    values, the ring's queries and output gradients, two ``dS`` buffers, the dQ tiles, the rows'
    statistics, the mbarriers, and 1 KB to align the tiles to the swizzle's atoms."""
    n = ring_stages(head_dim, block_queries) if stages is None else stages
    bm = block_queries
    tiles = 2 * BN * head_dim * 2 + n * 2 * bm * head_dim * 2 + 2 * bm * BN * 2
    return tiles + DQ_BYTES + n * 2 * bm * 4 + 8 * (1 + 2 * n) + 1024


def ring_stages(head_dim: int, block_queries: int) -> int:
    """Slots of the ring of query blocks at ``head_dim``: as many as shared memory holds, up to
    :data:`MAX_STAGES`. A visit's slot is free only once its dK is done (the last product of
    the visit), so with two slots the next load had under one visit to land: a third took the
    kernel from 1.60 to 1.53 ms (full), 0.93 to 0.89 (causal) and, at head dim 64, 1.17 to 1.07;
    four or five slots at head dim 64 gained nothing (H200, S=4096, the kernel timed as
    ``benchmarks.attention_backward --kernels`` times it)."""
    room = get_target("cuda:sm_90a").max_shared_memory
    return max(n for n in range(2, MAX_STAGES + 1)
               if shared_bytes(head_dim, block_queries, n) <= room)


def kernel_arguments(hplan, scalars) -> list[tuple[str, str, str]]:
    """(C++ name, launch type, C++ type) of the kernel's arguments: five tensor maps by value
    (q, k, v, the output's gradient, the float32 dQ), the base-2 log-sum-exps and Δ, dK, dV, the
    transposed block lists, the score's base-2 factor and its factor on ``q·kᵀ``, the tensors
    the mask reads, the program's scalars (``(name, dtype)`` pairs)."""
    elem = C_TYPES[hplan.dtype]
    maps = [(f"{n}_map", "tensormap", "const __grid_constant__ TfTensorMap")
            for n in ("q", "k", "v", "do", "dq")]
    lists = [(n, "handle", "const int* __restrict__") for n in ("pn", "pi", "fn", "fi")]
    dtypes = {p.name: p.dtype for p in hplan.base.program.tensor_params}
    reads = tensor_arguments([(n, dtypes[n]) for n in hplan.mask_tensors])
    return maps + [("lse2", "handle", "const float* __restrict__"),
                   ("delta", "handle", "const float* __restrict__"),
                   ("dk", "handle", f"{elem}* __restrict__"),
                   ("dv", "handle", f"{elem}* __restrict__")] + lists + \
        [("scale2", "float32", "float"), ("factor", "float32", "float")] + reads + \
        scalar_arguments(scalars)


def backward_source(hplan, scalars) -> str:
    """CUDA C++ of ``tf_hopper_attention_backward`` for ``hplan``
    (:class:`~tensorfuse.schedule_templates.hopper_attention_backward.HopperBackwardPlan`) and the
    program's ``scalars`` (``(name, dtype)``): grid (batch · key/value heads, key blocks), or
    (key blocks, batch · key/value heads) where the plan says (``keys_fastest``),
    :data:`THREADS` threads, :func:`shared_bytes` of dynamic shared memory. The sizes are
    compiled in (as the Triton backward's)."""
    c = _Source(hplan, scalars)
    return "".join(part(c) for part in (_head, _defines, _device_functions, _kernel_begin,
                                        _producer, _consumer_products, _consumer_dq,
                                        _consumer_end))


class _Source(KernelArguments):
    """What the kernel's parts read: the plan, the sizes, the element types, the arguments, and
    how dQ is shared by the consumer warpgroups — from head dim 128 each takes half the columns
    over all 128 keys (a barrier of both a block, for the other's half of dS); with 128 queries
    a visit (the plan's ``block_queries``) each its 64 of the queries over all 128 keys (the
    same barrier); else each all columns over its own 64 keys (no barrier between them). Each
    over its own keys at 128 took 30 % longer (ptxas serialises its wgmmas for want of
    registers; H200, S=4096, as ``benchmarks.attention_backward --kernels`` times the
    kernel)."""

    def __init__(self, hplan, scalars):
        self.hplan, self.base = hplan, hplan.base
        self.D, self.dtype = hplan.tile_dim, hplan.dtype
        self.row_d = hplan.head_dim   # the tensors' rows (narrower than the tiles: padded)
        self.M, self.N = self.base.extent(self.base.row), self.base.extent(self.base.col)
        self.pair, self.pack = _PAIRS[self.dtype]
        self.f16 = "_f16" if self.dtype == "f16" else ""
        self.bm = hplan.block_queries
        self.strided = hplan.strided   # q, k, v, dO through 4-D maps of their own strides
        self.split_n = self.D >= 128
        self.split_m = not self.split_n and self.bm == 2 * DQ_ROWS
        self.keys_along, self.heads_along = ("x", "y") if hplan.keys_fastest else ("y", "x")
        self.grid_comment = (
            "// key blocks along x: the CTAs running at once add into one head's dQ, in L2"
            if hplan.keys_fastest else
            "// key blocks along y: every head's first key blocks (under a causal mask the\n"
            "  // longest) start first, so the short ones fill the last wave")
        self.dqn = self.D // 2 if self.split_n else self.D
        self.arguments = kernel_arguments(hplan, scalars)
        # what the mask may read: the tensors and scalars after the factors
        names = [n for n, _, _ in self.arguments]
        self.forwarded_arguments = self.arguments[names.index("factor") + 1:]


def _head(c: _Source) -> str:
    """Includes, the shared helpers, the wgmma functions, the tensor map type."""
    functions = (wgmma_function(c.bm, b_k_major=True, dtype=c.dtype) +
                 wgmma_function(c.D, a_in_registers=True, dtype=c.dtype) +
                 wgmma_function(c.dqn, dtype=c.dtype))
    header = "#include <cuda_bf16.h>\n" if c.dtype == "bf16" else "#include <cuda_fp16.h>\n"
    return f"""{header}#include <math.h>
{DSM_HELPERS}
{WGMMA_HELPERS}
{MBARRIER_HELPERS}
{TMA_HELPERS}
{REDUCE_HELPERS}
{load_helper(4 if c.strided else 3)}
{functions}
{attention_exp2(c)}
{attention_pack_function(c)}
{TENSOR_MAP_TYPE}
"""


def _defines(c: _Source) -> str:
    """The sizes, tiles and switches the kernel is compiled with."""
    rows = f"#define ROW_D_ {c.row_d}   // the tensors' rows (the tiles past them: zeros)\n" \
        if c.row_d != c.D else ""
    if c.strided:   # the 4-D maps' (batch, head) of a flattened batch index
        heads = c.base.extent(c.base.batch[-1]) if c.base.batch else 1
        rows += f"#define H_ {heads}\n#define HKV_ {heads // c.base.group}\n"
    return f"""#define D_ {c.D}
{rows}#define BN {BN}
#define BM {c.bm}
#define STAGES {ring_stages(c.D, c.bm)}
#define GROUP {c.base.group}
#define M_ {c.M}
#define N_ {c.N}
#define NQB {math.ceil(c.M / c.bm)}
#define NKB {math.ceil(c.N / BN)}
#define LISTS {int(c.hplan.masked)}
#define SPLIT_N {int(c.split_n)}
#define SPLIT_M {int(c.split_m)}
#define DQN {c.dqn}
#define KV_BYTES (BN * D_ * 2)
#define Q_BYTES (BM * D_ * 2)
#define DS_BYTES (BM * BN * 2)
#define DQ_ROWS {DQ_ROWS}
typedef {C_TYPES[c.dtype]} elem_t;

"""


def _device_functions(c: _Source) -> str:
    """Barriers, stmatrix, the mask, the cursor over the visited query blocks."""
    return f"""__device__ __forceinline__ void tf_bar_wg(int cw) {{
  asm volatile("bar.sync %0, 128;" :: "r"(2 + cw) : "memory");
}}
__device__ __forceinline__ void tf_stmatrix_x4_trans(unsigned addr, const uint4& r) {{
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {{%1, %2, %3, %4}};"
               :: "r"(addr), "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w) : "memory");
}}

// Before dQ's product: the dS it reads written — both warpgroups' halves (dQ split by columns
// or by queries) or this warpgroup's own (split by keys: the warpgroups never wait for each
// other).
__device__ __forceinline__ void tf_bar_ds(int cw) {{
  if (SPLIT_N || SPLIT_M) asm volatile("bar.sync 1, 256;" ::: "memory");
  else asm volatile("bar.sync %0, 128;" :: "r"(2 + cw) : "memory");
}}
// The mask at query i_, key j_ (batch values from bh).
__device__ __forceinline__ bool tf_kept(int bh, int i_, int j_{c.extra_params}) {{
{batch_values(c.base)}
  return {mask_code(c.hplan)};
}}
{score_functions(c)}
// The query blocks a CTA visits, in order: per head of the group, the partial blocks of the
// transposed lists (masked), then the full ones; without a mask every block. `next` moves the
// cursor to the next visit and says whether there is one: its flattened query batch index
// `bh`, query block `mb` and whether it is `partial`. One loop over the visits, not loops over
// the heads around loops over the blocks: around those ptxas spilled the dK/dV accumulators.
struct Visits {{
  int g = 0, kind = 0, t = -1;
  __device__ __forceinline__ bool next(int bhk, int kb, const int* __restrict__ pn,
                                       const int* __restrict__ pi, const int* __restrict__ fn,
                                       const int* __restrict__ fi, int& bh, int& mb,
                                       bool& partial) {{
    ++t;
    for (;;) {{
      bh = bhk * GROUP + g;
      const int prog = bh * NKB + kb;
      const int count = !LISTS ? NQB : kind == 0 ? pn[prog] : fn[prog];
      if (t < count) {{
        mb = !LISTS ? t : (kind == 0 ? pi : fi)[(long long)prog * NQB + t];
        partial = LISTS && kind == 0;
        return true;
      }}
      t = 0;
      if (LISTS && kind == 0) {{ kind = 1; continue; }}
      kind = 0;
      if (++g == GROUP) return false;
    }}
  }}
}};

"""


def _kernel_begin(c: _Source) -> str:
    """The signature, the shared memory's tiles and mbarriers."""
    return f"""extern "C" __global__ void __launch_bounds__({THREADS}, 1) {ENTRY}(
    {c.params}) {{
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // aligned by an offset from smem_raw, not through an integer: the compiler then knows every
  // pointer below is shared memory and reads and writes it with LDS/STS, not generic LD/ST
  unsigned char* smem = smem_raw + ((1024 - (tf_smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* k_tile = smem;
  unsigned char* v_tile = k_tile + KV_BYTES;
  unsigned char* q_tiles = v_tile + KV_BYTES;
  unsigned char* do_tiles = q_tiles + STAGES * Q_BYTES;
  unsigned char* ds_tiles = do_tiles + STAGES * Q_BYTES;
  unsigned char* dq_tiles = ds_tiles + 2 * DS_BYTES;   // per warpgroup: DQN / 32 atoms
  float* lse_s = (float*)(dq_tiles + {DQ_BYTES});
  float* delta_s = lse_s + STAGES * BM;
  unsigned long long* bars = (unsigned long long*)(delta_s + STAGES * BM);
  unsigned long long* kv_full = bars;
  unsigned long long* full = bars + 1;
  unsigned long long* empty = full + STAGES;
  {c.grid_comment}
  const int kb = blockIdx.{c.keys_along}, bhk = blockIdx.{c.heads_along}, n0 = kb * BN;
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {{
    tf_mbar_init(kv_full, 1);
    for (int s = 0; s < STAGES; ++s) {{
      tf_mbar_init(full + s, 1 + BM);
      tf_mbar_init(empty + s, 256);
    }}
    tf_mbar_init_fence();
  }}
  __syncthreads();
"""


def _producer(c: _Source) -> str:
    """Warpgroup 0: keys and values once, then each visit's queries, output gradient and
    row statistics into the ring."""
    return f"""  if (wg == 0) {{
    tf_setmaxnreg_dec<{PRODUCER_REGS}>();
    const int t = threadIdx.x;
    if (t < BM) {{
      if (t == 0) {{
        tf_mbar_expect(kv_full, 2 * KV_BYTES);
        for (int a = 0; a < D_ / 64; ++a) {{
          {flat_box(c, "load", "&k_map", "n0", "bhk", "HKV_", "k_tile + a * BN * 128",
                    "kv_full")};
          {flat_box(c, "load", "&v_map", "n0", "bhk", "HKV_", "v_tile + a * BN * 128",
                    "kv_full")};
        }}
      }}
      Visits visits;
      int bh, mb;
      bool partial;
      for (int it = 0; visits.next(bhk, kb, pn, pi, fn, fi, bh, mb, partial); ++it) {{
        const int s = it % STAGES;
        tf_mbar_wait(empty + s, ((it / STAGES) & 1) ^ 1);
        if (t == 0) {{
          tf_mbar_expect(full + s, 2 * Q_BYTES);
          for (int a = 0; a < D_ / 64; ++a) {{
            {flat_box(c, "load", "&q_map", "mb * BM", "bh", "H_",
                      "q_tiles + s * Q_BYTES + a * BM * 128", "full + s")};
            {flat_box(c, "load", "&do_map", "mb * BM", "bh", "H_",
                      "do_tiles + s * Q_BYTES + a * BM * 128", "full + s")};
          }}
        }}
        const int row = mb * BM + t;
        lse_s[s * BM + t] = row < M_ ? lse2[(long long)bh * M_ + row] : INFINITY;
        delta_s[s * BM + t] = row < M_ ? delta[(long long)bh * M_ + row] : 0.0f;
        tf_mbar_arrive(full + s);
      }}
    }}
"""


def _consumer_products(c: _Source) -> str:
    """A consumer warpgroup's first part of a visit: Sᵀ, dPᵀ, P, dS, and dV, dK issued."""
    return f"""  }} else {{
    tf_setmaxnreg_inc<{CONSUMER_REGS}>();
    const int cw = wg - 1, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const unsigned k_base = tf_smem_addr(k_tile), v_base = tf_smem_addr(v_tile);
    const unsigned q_base = tf_smem_addr(q_tiles), do_base = tf_smem_addr(do_tiles);
    const unsigned ds_base = tf_smem_addr(ds_tiles);
    float dv_acc[D_ / 2], dk_acc[D_ / 2];
    #pragma unroll
    for (int r = 0; r < D_ / 2; ++r) {{ dv_acc[r] = 0.0f; dk_acc[r] = 0.0f; }}
    // this thread's accumulator rows (keys) and first column (queries)
    const int row_lo = 16 * warp + lane / 4, col_lo = 2 * (lane % 4);
    const int key_lo = n0 + 64 * cw + row_lo;
    // a ragged last key block: its keys past N are zeros (TMA), their P must still be 0 (a dS
    // of 2^(−LSE₂) times 0 keys would be inf · 0 in dQ)
    const bool edge = n0 + BN > N_;
    tf_mbar_wait(kv_full, 0);
    Visits visits;
    int bh, mb;
    bool partial;
    #pragma unroll 1
    for (int it = 0; visits.next(bhk, kb, pn, pi, fn, fi, bh, mb, partial); ++it) {{
      const int s = it % STAGES;
      tf_mbar_wait(full + s, (it / STAGES) & 1);
      const unsigned qs = q_base + s * Q_BYTES, dos = do_base + s * Q_BYTES;
      float st[BM / 2], dp[BM / 2];
      // the last visit's dK (it read that visit's queries): done before Sᵀ would start anyway
      tf_wgmma_wait<0>();
      tf_fence_regs(dk_acc);
      if (it > 0) tf_mbar_arrive(empty + (it - 1) % STAGES);
      tf_wgmma_fence();
      #pragma unroll
      for (int ks = 0; ks < D_ / 16; ++ks)
        tf_wgmma_kk_m64n{c.bm}k16{c.f16}(st, tf_kmajor_desc(k_base, BN, 64 * cw, ks * 16),
                               tf_kmajor_desc(qs, BM, 0, ks * 16), ks > 0);
      tf_wgmma_commit();
      #pragma unroll
      for (int ks = 0; ks < D_ / 16; ++ks)
        tf_wgmma_kk_m64n{c.bm}k16{c.f16}(dp, tf_kmajor_desc(v_base, BN, 64 * cw, ks * 16),
                               tf_kmajor_desc(dos, BM, 0, ks * 16), ks > 0);
      tf_wgmma_commit();
      tf_wgmma_wait<1>();
      tf_fence_regs(st);
{probabilities_and_ds(c)}      tf_wgmma_fence();
      #pragma unroll
      for (int u = 0; u < BM / 16; ++u)
        tf_wgmma_rs_m64n{c.D}k16{c.f16}(dv_acc, pa[u], tf_nmajor_desc(dos, BM, 0, u * 16));
      tf_wgmma_commit();
"""


def _consumer_dq(c: _Source) -> str:
    """dS to shared memory, dQ = dS·K, its tile added into dQ by TMA."""
    return f"""      // dS (queries along the rows, keys K-major in 64-key atoms of the 128-byte
      // swizzle):
      // dSᵀ's 8×8 blocks stored transposed by stmatrix, four a instruction — the registers of
      // da[u] are blocks (keys 0–7 | 8–15 of the warp's 16, queries 16u… | 16u + 8…); lane l
      // gives the address of row l % 8 (a query) of block l / 8: its 8 keys, 16 bytes
      {{
        const unsigned ds = ds_base + (it % 2) * DS_BYTES + cw * BM * 128;
        const int m = lane / 8, key0 = 16 * warp + 8 * (m % 2);
        #pragma unroll
        for (int u = 0; u < BM / 16; ++u) {{
          const int q = 16 * u + 8 * (m / 2) + lane % 8;
          tf_stmatrix_x4_trans(ds + q * 128 + ((((key0 / 8) ^ q) & 7) << 4), da[u]);
        }}
      }}
      tf_fence_proxy_async();
      if (t == 0) tf_bulk_wait_read();   // the last block's dQ tile has left shared memory
      tf_bar_ds(cw);
      float dq[DQN / 2];
      const unsigned dss = ds_base + (it % 2) * DS_BYTES;
      tf_wgmma_fence();
      #pragma unroll
      for (int ks = 0; ks < (SPLIT_N || SPLIT_M ? BN : 64) / 16; ++ks) {{
        const int k = (SPLIT_N || SPLIT_M ? 0 : 64 * cw) + ks * 16;
        tf_wgmma_m64n{c.dqn}k16{c.f16}(dq, tf_kmajor_desc(dss, BM, SPLIT_M ? 64 * cw : 0, k),
                                 tf_nmajor_desc(k_base, BN, SPLIT_N ? 64 * cw : 0, k), ks > 0);
      }}
      tf_wgmma_commit();
      // dK last: it runs on the tensor cores while dQ's tile is written and added
      #pragma unroll
      for (int u = 0; u < BM / 16; ++u)
        tf_wgmma_rs_m64n{c.D}k16{c.f16}(dk_acc, da[u], tf_nmajor_desc(qs, BM, 0, u * 16));
      tf_wgmma_commit();
      tf_wgmma_wait<1>();   // dV and dQ
      tf_fence_regs(dq);
      tf_fence_regs(dv_acc);
      {{
        // dQ's fragment into this warpgroup's tile: 32-column atoms of the 128-byte swizzle
        // (16-byte chunk k of row q at chunk k ^ q % 8), then added into dQ by TMA
        unsigned char* tile = dq_tiles + cw * (DQN / 32) * DQ_ROWS * 128;
        #pragma unroll
        for (int r = 0; r < DQN / 2; r += 2) {{
          const int q = row_lo + 8 * ((r % 4) / 2), c = 8 * (r / 4) + col_lo;
          const int at = (c / 32) * DQ_ROWS * 128 + q * 128 + (((((c % 32) / 4) ^ q) & 7) << 4) +
                         (c % 4) * 4;
          *reinterpret_cast<float2*>(tile + at) = make_float2(dq[r], dq[r + 1]);
        }}
        tf_fence_proxy_async();
        tf_bar_wg(cw);
        if (t == 0) {{
          #pragma unroll
          for (int a = 0; a < DQN / 32; ++a)
            tf_tma_reduce_add_3d(&dq_map, tile + a * DQ_ROWS * 128, (SPLIT_N ? 64 * cw : 0) +
                                 32 * a, mb * BM + (SPLIT_M ? 64 * cw : 0), bh);
          tf_bulk_commit();
        }}
      }}
    }}
    tf_wgmma_wait<0>();   // the last dK
    tf_fence_regs(dk_acc);
    if (t == 0) tf_bulk_wait();   // the last dQ tile added before the CTA's memory goes
"""


def _consumer_end(c: _Source) -> str:
    """dK and dV written from registers once every visit is done (the columns past a padded
    row not written)."""
    if c.row_d != c.D:
        return swap(swap(_END, "if (key < N_) {", "if (key < N_ && c < ROW_D_) {"),
                    "* N_ + key) * D_ + c", "* N_ + key) * ROW_D_ + c")
    return _END


_END = """    // dK, dV: rows past the last key are not written
    #pragma unroll
    for (int r = 0; r < D_ / 2; r += 2) {
      const int key = key_lo + 8 * ((r % 4) / 2), c = 8 * (r / 4) + col_lo;
      if (key < N_) {
        const long long at = ((long long)bhk * N_ + key) * D_ + c;
        *reinterpret_cast<unsigned*>(dk + at) = tf_pack(dk_acc[r], dk_acc[r + 1]);
        *reinterpret_cast<unsigned*>(dv + at) = tf_pack(dv_acc[r], dv_acc[r + 1]);
      }
    }
  }
}
"""
