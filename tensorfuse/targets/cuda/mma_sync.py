"""Warp-level tensor-core MMA (``mma.sync`` m16n8k16, bf16 → f32) and ``ldmatrix``, as inline PTX
for generated CUDA — shared by the GEMM chain's ``mma="mma_sync"`` path and the decode kernel.

Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"): lane ``l`` holds A rows
``l/4`` and ``l/4 + 8`` at columns ``2(l%4) + {0, 1}`` (and ``+ 8``), B column ``l/4`` at rows
``2(l%4) + {0, 1}`` (and ``+ 8``), and C/D rows ``l/4`` (registers 0, 1) and ``l/4 + 8``
(registers 2, 3) at columns ``2(l%4) + {0, 1}``. Two neighbouring C tiles of 8 columns are
therefore one A fragment of 16 columns — how a product's result feeds the next product in
registers.
"""
from __future__ import annotations

HELPERS = r"""
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tf_smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tf_smem_addr(p)));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  // not volatile: a pure register operation the compiler may interleave with other work
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned tf_pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}
"""
