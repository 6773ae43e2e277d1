// The rate at which TMA streams a decode's cache into shared memory and nothing else: K and V of
// B16 x 16k keys x D128 bf16 (134 MB), each CTA (one an SM) taking consecutive 128-key tiles
// through three 64 KB slots, its consumers only waiting for each slot and freeing it. Three ways
// to copy a tile: two 2-D boxes of 128-byte rows (as the Hopper attention kernel), one 4-D box of
// whole 256-byte rows, one 1-D bulk copy; L2 flushed before each call by a write (as triton's
// do_bench, which the benchmarks use) or by a read. The ceiling of any decode kernel at this size
// (docs/templates.md, "A group's heads as rows").
//
//   nvcc -O2 -arch=sm_90a -std=c++17 -o /tmp/tma_stream_rate tools/tma_stream_rate.cu
//   /tmp/tma_stream_rate
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define BN 128
#define STAGES 3
#define TILE (BN * 256)

__device__ __forceinline__ unsigned sa(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mb_init(unsigned long long* b, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n));
}
__device__ __forceinline__ void mb_expect(unsigned long long* b, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)),
               "r"(bytes) : "memory");
}
__device__ __forceinline__ void mb_arrive(unsigned long long* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(b)) : "memory");
}
__device__ __forceinline__ void mb_wait(unsigned long long* b, unsigned phase) {
  asm volatile(
      "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra W;\n}" ::"r"(sa(b)), "r"(phase) : "memory");
}
__device__ __forceinline__ void tma2(void* dst, const CUtensorMap* m, int c0, int c1,
                                     unsigned long long* b) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(sa(dst)), "l"(m), "r"(c0), "r"(c1), "r"(sa(b))
      : "memory");
}
__device__ __forceinline__ void tma4(void* dst, const CUtensorMap* m, int c3,
                                     unsigned long long* b) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(sa(dst)), "l"(m), "r"(0), "r"(0), "r"(0),
      "r"(c3), "r"(sa(b)) : "memory");
}
__device__ __forceinline__ void bulk(void* dst, const void* src, int bytes,
                                     unsigned long long* b) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(b)) : "memory");
}

struct Maps {
  CUtensorMap k2, v2, k4, v4;   // 2-D maps of 128-byte boxes, 4-D maps of whole rows
};

// MODE 0: two 2-D boxes a tile and tensor; 1: one 4-D box; 2: one 1-D bulk copy.
template <int MODE>
__global__ void __launch_bounds__(256) stream(const __grid_constant__ Maps maps, const char* kp,
                                              const char* vp, int blocks, int* sink) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* sm = (unsigned char*)(((unsigned long)raw + 1023) & ~1023ul);
  __shared__ unsigned long long full[STAGES], empty[STAGES];
  const int per = (blocks + gridDim.x - 1) / gridDim.x;
  const int b0 = blockIdx.x * per, b1 = min(blocks, b0 + per);
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mb_init(full + s, 1);
      mb_init(empty + s, 128);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x < 128) {   // the producer: one thread
    if (threadIdx.x != 0) return;
    for (int b = b0, u = 0; b < b1; ++b, ++u) {
      const int s = u % STAGES;
      if (u >= STAGES) mb_wait(empty + s, ((u / STAGES) - 1) & 1);
      unsigned char* kd = sm + s * 2 * TILE;
      unsigned char* vd = kd + TILE;
      mb_expect(full + s, 2 * TILE);
      if (MODE == 0) {
        tma2(kd, &maps.k2, 0, b * BN, full + s);
        tma2(kd + TILE / 2, &maps.k2, 64, b * BN, full + s);
        tma2(vd, &maps.v2, 0, b * BN, full + s);
        tma2(vd + TILE / 2, &maps.v2, 64, b * BN, full + s);
      } else if (MODE == 1) {
        tma4(kd, &maps.k4, b * BN / 8, full + s);
        tma4(vd, &maps.v4, b * BN / 8, full + s);
      } else {
        bulk(kd, kp + (long)b * TILE, TILE, full + s);
        bulk(vd, vp + (long)b * TILE, TILE, full + s);
      }
    }
    return;
  }
  int acc = 0;   // the consumers: each slot waited for, touched and freed
  for (int b = b0, u = 0; b < b1; ++b, ++u) {
    const int s = u % STAGES;
    mb_wait(full + s, (u / STAGES) & 1);
    acc += sm[s * 2 * TILE + (threadIdx.x - 128) * 4];
    mb_arrive(empty + s);
  }
  if (acc == 123456789) sink[0] = acc;
}

__global__ void read_flush(const float4* p, long n, int* sink) {
  float a = 0;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n;
       i += (long)gridDim.x * blockDim.x)
    a += p[i].x;
  if (a == 1234.5f) sink[0] = 1;
}

typedef CUresult (*Encode)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                           const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                           const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                           CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static CUresult encode(Encode enc, CUtensorMap* map, void* base, int rank,
                       const cuuint64_t* dims, const cuuint64_t* strides,
                       const cuuint32_t* box) {
  const cuuint32_t ones[4] = {1, 1, 1, 1};
  return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, base, dims, strides, box, ones,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

int main() {
  Encode enc;
  cudaDriverEntryPointQueryResult found;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&enc, 12000,
                                   cudaEnableDefault, &found);
  const long R = 16L * 16384;   // rows of each tensor (B16, 16k keys), 256 bytes each
  const int SETS = 4;           // copies taken in turn, so that no call finds the last in L2
  std::vector<char*> K(SETS), V(SETS);
  std::vector<Maps> maps(SETS);
  for (int i = 0; i < SETS; ++i) {
    cudaMalloc(&K[i], R * 256);
    cudaMalloc(&V[i], R * 256);
    cudaMemset(K[i], 1, R * 256);
    cudaMemset(V[i], 1, R * 256);
    const cuuint64_t d2[2] = {128, (cuuint64_t)R}, s2[1] = {256};
    const cuuint32_t b2[2] = {64, BN};
    // a row's halves as a dimension of their own: boxes of whole rows, 8-row swizzle atoms
    const cuuint64_t d4[4] = {64, 8, 2, (cuuint64_t)(R / 8)}, s4[3] = {256, 128, 2048};
    const cuuint32_t b4[4] = {64, 8, 2, BN / 8};
    if (encode(enc, &maps[i].k2, K[i], 2, d2, s2, b2) ||
        encode(enc, &maps[i].v2, V[i], 2, d2, s2, b2) ||
        encode(enc, &maps[i].k4, K[i], 4, d4, s4, b4) ||
        encode(enc, &maps[i].v4, V[i], 4, d4, s4, b4)) {
      printf("cuTensorMapEncodeTiled failed\n");
      return 1;
    }
  }
  const long flush_n = (256L << 20) / 16;
  float* flush;
  int* sink;
  cudaMalloc(&flush, flush_n * 16);
  cudaMemset(flush, 0, flush_n * 16);
  cudaMalloc(&sink, 64);
  const int smem = STAGES * 2 * TILE + 1024;
  cudaFuncSetAttribute(stream<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(stream<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(stream<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const char* names[3] = {"two 2-D boxes", "one 4-D box", "1-D bulk"};
  for (int ctas : {128, 132})
    for (int by_read = 0; by_read < 2; ++by_read)
      for (int mode = 0; mode < 3; ++mode) {
        std::vector<float> times;
        for (int rep = 0; rep < 60; ++rep) {
          const int i = rep % SETS;
          if (by_read)
            read_flush<<<528, 512>>>((const float4*)flush, flush_n, sink);
          else
            cudaMemsetAsync(flush, rep, flush_n * 16);
          cudaEventRecord(a);
          if (mode == 0) stream<0><<<ctas, 256, smem>>>(maps[i], K[i], V[i], R / BN, sink);
          if (mode == 1) stream<1><<<ctas, 256, smem>>>(maps[i], K[i], V[i], R / BN, sink);
          if (mode == 2) stream<2><<<ctas, 256, smem>>>(maps[i], K[i], V[i], R / BN, sink);
          cudaEventRecord(b);
          cudaEventSynchronize(b);
          float ms;
          cudaEventElapsedTime(&ms, a, b);
          if (rep >= 4) times.push_back(ms);
        }
        std::sort(times.begin(), times.end());
        const float ms = times[times.size() / 2];
        printf("%3d CTAs, L2 flushed by a %-5s %-14s %7.1f us  %6.0f GB/s\n", ctas,
               by_read ? "read" : "write", names[mode], ms * 1e3,
               2.0 * R * 256 / (ms * 1e-3) / 1e9);
      }
  const cudaError_t err = cudaDeviceSynchronize();
  printf("status: %s\n", cudaGetErrorString(err));
  return err != cudaSuccess;
}
