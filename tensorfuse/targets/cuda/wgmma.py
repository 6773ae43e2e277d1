"""Hopper warpgroup MMA (``wgmma.mma_async``, sm_90a) as inline PTX for generated CUDA.

Operands come from shared memory through 64-bit matrix descriptors (start address, leading and
stride byte offsets, layout type), as two probes on the H100 confirmed:

- no swizzle: the tile is cut into *core matrices* of 8 rows × 16 bytes, each stored as 128
  contiguous bytes; the leading byte offset is the distance between core matrices that neighbour
  along K, the stride byte offset along M or N — for a K-major A and for an MN-major B alike (B is
  read transposed, ``imm-trans-b`` = 1);
- 128-byte swizzle (what the kernels use): rows of 128 bytes (64 bf16) in atoms of 8 rows, chunk
  ``c`` of row ``r`` at chunk ``c ^ r % 8``. K-major: stride byte offset 1024 (the next 8 rows), the
  k16 steps advance the start address by 32 bytes; MN-major: leading byte offset = the distance
  between 64-column atoms, stride byte offset 1024 (the next 8 k-rows). The accumulators of ``m64nNk16`` are the
``mma.sync`` m16n8 layout repeated: warp ``w`` of the warpgroup holds rows ``16w + lane/4 (+8)``,
register ``4j + e`` column ``8j + 2(lane%4) + e%2``.

Reads of shared memory by ``wgmma`` go through the async proxy: data written by ordinary stores or
``cp.async`` must be published with ``fence.proxy.async`` before the barrier that precedes the MMA.
"""
from __future__ import annotations

HELPERS = r"""
// From a shared-memory address `a` (what the generated loops keep: with constant lbo and sbo the
// whole descriptor is a shift and an OR of `a`, nothing per call that the compiler cannot fold).
__device__ __forceinline__ unsigned long long tf_smem_desc_at(unsigned a, unsigned lbo,
                                                              unsigned sbo) {
  return (unsigned long long)((a & 0x3FFFF) >> 4) |
         ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
         ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32);
}
// The same for the 128-byte swizzle (layout type 1): rows of 128 bytes in atoms of 8 rows
// (1024 bytes, 1024-byte aligned), 16-byte chunk c of row r stored at chunk c ^ (r % 8).
__device__ __forceinline__ unsigned long long tf_smem_desc_sw128_at(unsigned a, unsigned lbo,
                                                                    unsigned sbo) {
  return tf_smem_desc_at(a, lbo, sbo) | (1ull << 62);
}
// Descriptors of 128-byte-swizzled operand tiles (`tile`: a shared-memory address, taken once
// per tile, not per descriptor). K-major (rows of 64 k, atoms of `rows` rows along k): the step
// at k (a multiple of 16) from row `row0`. MN-major (atoms of 64 columns, each `depth` k-rows
// deep): the step at k from column `col0` (a multiple of 64).
__device__ __forceinline__ unsigned long long tf_kmajor_desc(unsigned tile, int rows, int row0,
                                                             int k) {
  return tf_smem_desc_sw128_at(tile + (k / 64) * rows * 128 + row0 * 128 + (k % 64) * 2, 16,
                               1024);
}
__device__ __forceinline__ unsigned long long tf_nmajor_desc(unsigned tile, int depth, int col0,
                                                             int k) {
  return tf_smem_desc_sw128_at(tile + (col0 / 64) * depth * 128 + k * 128, depth * 128, 1024);
}
__device__ __forceinline__ void tf_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void tf_fence_proxy_async_cluster() {
  asm volatile("fence.proxy.async.shared::cluster;" ::: "memory");
}
__device__ __forceinline__ void tf_wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void tf_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void tf_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
// Warp specialization: a warpgroup gives registers back to the pool (`dec`) or takes them (`inc`,
// waiting until they are free); every warp of the warpgroup executes it.
template <int N>
__device__ __forceinline__ void tf_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N));
}
template <int N>
__device__ __forceinline__ void tf_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N));
}
// Keeps the compiler from moving accumulator registers across an asynchronous MMA.
template <int R>
__device__ __forceinline__ void tf_fence_regs(float (&d)[R]) {
  #pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
"""


REGISTERS = 65536   # per SM


def launch_registers(threads: int, ctas_per_sm: int = 1) -> int:
    """Registers per thread a CTA of ``threads`` threads is launched with (ptxas's limit at
    ``ctas_per_sm`` CTAs per SM, in steps of 8): the pool ``setmaxnreg`` moves registers within."""
    return min(255, REGISTERS // (threads * ctas_per_sm)) // 8 * 8


def setmaxnreg_share(threads: int, consumers: int, producer: int, ctas_per_sm: int = 1) -> int:
    """Registers a consumer warpgroup's thread can take (``setmaxnreg.inc``, at most 240) once
    the producer warpgroup has given its own back down to ``producer``: no more than the pool
    holds — an increase it cannot cover waits forever (a 64-register producer with consumers
    asking for 224 of the 216 there were hung a GEMM on the H100)."""
    pool = threads * launch_registers(threads, ctas_per_sm)
    share = (pool - 128 * producer) // (128 * consumers)
    return min(240, share // 8 * 8)


def wgmma_function(n: int, a_in_registers: bool = False, b_k_major: bool = False,
                   dtype: str = "bf16", a_mn_major: bool = False) -> str:
    """``tf_wgmma_m64n{n}k16(d, desc_a, desc_b, accumulate)``: D[64, n] = A[64, 16] · B[16, n]
    (+ D when ``accumulate``), bf16 in, f32 accumulate, A K-major and B MN-major (transposed) from
    shared memory. With ``a_in_registers``: ``tf_wgmma_rs_m64n{n}k16(d, a, desc_b, accumulate)``,
    A from the four ``b32`` registers ``a`` of the warp's 16-row slice, in the ``mma.sync``
    A-fragment layout (:mod:`.mma_sync`). ``b_k_major``: B stored K-major like A (a transposed
    operand such as the keys of q·kᵀ; ``tf_wgmma_kk_…``). ``a_mn_major``: A from shared memory
    stored M-major (transposed: a weight gradient's xᵀ; ``tf_wgmma_ta_…``). ``dtype``:
    ``"bf16"`` or ``"f16"`` operands (``…_f16`` in the name)."""
    if dtype not in ("bf16", "f16"):
        raise ValueError(f"wgmma operands here are bf16 or f16, not {dtype}")
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma has N = 8, 16, …, 256; not {n}")
    regs = n // 2
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    slots = ", ".join(f"%{i}" for i in range(regs))
    trans_b = "0" if b_k_major else "1"
    if a_in_registers and a_mn_major:
        raise ValueError("an A operand in registers has no layout to transpose")
    if a_in_registers:   # no transpose flag for a register A
        a_param, n_a = "const uint4& a", 4
        a_slot = "{" + ", ".join(f"%{regs + i}" for i in range(4)) + "}"
        ins, flags = '"r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w)', f"1, 1, {trans_b}"
    else:
        a_param, n_a = "unsigned long long da", 1
        a_slot, ins, flags = f"%{regs}", '"l"(da)', f"1, 1, {int(a_mn_major)}, {trans_b}"
    name = (f"tf_wgmma_{'ta_' if a_mn_major else ''}{'kk_' if b_k_major else ''}"
            f"{'rs_' if a_in_registers else ''}m64n{n}k16"
            f"{'_f16' if dtype == 'f16' else ''}")
    return (f"__device__ __forceinline__ void {name}(float (&d)[{regs}], "
            f"{a_param}, unsigned long long db, int accumulate = 1) {{\n"
            '  asm volatile("{\\n.reg .pred p;\\n"\n'
            f'               "setp.ne.b32 p, %{regs + n_a + 1}, 0;\\n"\n'
            f'               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype} "\n'
            f'               "{{{slots}}}, {a_slot}, %{regs + n_a}, p, {flags};\\n}}\\n"\n'
            f'               : {outs}\n'
            f'               : {ins}, "l"(db), "r"(accumulate));\n}}\n')


def fragment_bit_words(block_n: int) -> int:
    """32-bit words holding one bit per element of a thread's ``m64nN`` accumulator
    (``block_n / 2`` elements)."""
    return -(-block_n // 64)


def fragment_elements(block_m: int, block_n: int):
    """Which element of a ``block_m × block_n`` tile each bit of the consumers' per-thread words
    stands for: ``(rows, cols)``, int arrays of shape ``[block_m / 64, words, 128, 32]``
    (warpgroup, word, thread, bit), −1 past the fragment. Element ``r`` of thread ``t``'s
    accumulator (warp ``w = t / 32``, lane ``l``) is row ``16w + l/4 + 8·((r%4)/2)`` of its
    warpgroup's 64 and column ``8·(r/4) + 2·(l%4) + r%2``; it is bit ``r % 32`` of word ``r / 32``."""
    import numpy as np

    words = fragment_bit_words(block_n)
    cw, word, t, bit = np.meshgrid(np.arange(block_m // 64), np.arange(words), np.arange(128),
                                   np.arange(32), indexing="ij")
    r = 32 * word + bit
    lane = t % 32
    rows = 64 * cw + 16 * (t // 32) + lane // 4 + 8 * ((r % 4) // 2)
    cols = 8 * (r // 4) + 2 * (lane % 4) + r % 2
    past = r >= block_n // 2
    return np.where(past, -1, rows), np.where(past, -1, cols)
