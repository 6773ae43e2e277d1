"""Device helpers for thread-block clusters and distributed shared memory (DSM), as inline PTX.

TVM 0.27 has these operations as ``tvm.backend.cuda`` intrinsics (``tirx.cuda.cluster_sync``,
DSM bulk copies) for its ``tirx`` tile language, which our generated CUDA source cannot call, so
the few we need are spelled out here:

- ``tf_cluster_rank``: this CTA's rank in its cluster (``%cluster_ctarank``);
- ``tf_cluster_arrive`` / ``tf_cluster_wait``: the two halves of the cluster barrier
  (``barrier.cluster.arrive.release`` / ``barrier.cluster.wait.acquire``), split so that work can
  run between them; together they order every CTA's shared-memory writes before any peer's reads;
- ``tf_mapa``: the address of the same shared-memory location in another CTA of the cluster
  (``mapa.shared::cluster``);
- ``tf_ld_dsm_f32x4`` / ``tf_ld_dsm_f32`` / ``tf_ld_dsm_u32x4``: loads from a peer's shared memory
  (``ld.shared::cluster``); ``tf_st_dsm_v4``: a 16-byte store into a peer's shared memory
  (``st.shared::cluster``); ``tf_st_smem_v4`` / ``tf_st_smem_b32`` / ``tf_ld_smem_v4``: the
  same into and out of this CTA's own shared memory;
- ``tf_cp_async16`` (``_at``: to a shared-memory address; ``_l2``: with the L2 prefetch-size
  hint), ``tf_cp_async_commit``,
  ``tf_cp_async_wait``: the Ampere-style asynchronous copy into shared memory.
"""
from __future__ import annotations

HELPERS = r"""
__device__ __forceinline__ unsigned tf_cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void tf_cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void tf_cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void tf_cluster_sync() {
  tf_cluster_arrive();
  tf_cluster_wait();
}
__device__ __forceinline__ unsigned tf_smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ unsigned tf_mapa(unsigned addr, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ float4 tf_ld_dsm_f32x4(unsigned addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float tf_ld_dsm_f32(unsigned addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint4 tf_ld_dsm_u32x4(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared::cluster.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}
// 16 bytes into this CTA's own shared memory (a plain C++ store through a generic pointer
// compiles to a generic ST.E: measured in the producer's copies of H).
__device__ __forceinline__ void tf_st_smem_v4(unsigned addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};"
               :: "r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void tf_st_smem_b32(unsigned addr, unsigned v) {
  asm volatile("st.shared.b32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint4 tf_ld_smem_v4(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void tf_st_dsm_v4(unsigned addr, uint4 v) {
  asm volatile("st.shared::cluster.v4.b32 [%0], {%1, %2, %3, %4};"
               :: "r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void tf_cp_async16_at(unsigned smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(smem), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void tf_cp_async16(void* smem, const void* gmem, bool valid) {
  tf_cp_async16_at(tf_smem_addr(smem), gmem, valid);
}
// The same with the L2 prefetch-size hint: L2 fetches the whole 128-byte line of a 16-byte copy.
// For streams read once (decode's keys and values) it measured 1-2 % faster on the H100.
__device__ __forceinline__ void tf_cp_async16_l2_at(unsigned smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;"
               :: "r"(smem), "l"(gmem) : "memory");
}
__device__ __forceinline__ void tf_cp_async16_l2(void* smem, const void* gmem) {
  tf_cp_async16_l2_at(tf_smem_addr(smem), gmem);
}
__device__ __forceinline__ void tf_cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void tf_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
"""

# The PTX every cluster kernel must contain (checked by the tests on nvcc's output), besides its
# DSM loads (ld.shared::cluster) or stores (st.shared::cluster).
CLUSTER_PTX = ("mapa.shared::cluster", "barrier.cluster.arrive", "barrier.cluster.wait",
               "%cluster_ctarank")
