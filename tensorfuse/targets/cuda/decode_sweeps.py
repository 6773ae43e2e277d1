"""The cluster decode's sweeps over a warp's blocks of 32 keys (the ``mma`` knob): on CUDA cores,
or on tensor cores with the group's query heads as the rows of 16-row ``mma.sync`` tiles — the
CUDA C++ parts :func:`.cluster_decode.decode_source` assembles."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sweep:
    """The parts of the kernel that differ between the CUDA-core and tensor-core sweeps over the
    keys: device helpers, per-warp setup, the work on one block of 32 keys (``kblock``, ``vblock``
    in shared memory, first key ``j0``), and storing the warp's state into ``warp_m/l/o``."""

    helpers: str
    setup: str
    block: str
    store: str


def fma_sweep(score: str, G: int, D: int) -> Sweep:
    """CUDA cores: lane ``l`` scores key ``j0 + l`` for every head of the group (q from shared
    memory), one maximum per block and head, then each lane accumulates its D/32 elements of the
    weighted value rows."""
    dl = D // 32                        # value elements per lane
    vtype = {2: "unsigned", 4: "uint2", 8: "uint4"}[dl]
    if G % 4 == 0:  # four heads per shared-memory read (q is stored [d][head])
        dot = """for (int g4 = 0; g4 < G; g4 += 4) {
          const float4 qq = *reinterpret_cast<const float4*>(&qs[c + t][g4]);
          s[g4] += qq.x * kf[t]; s[g4 + 1] += qq.y * kf[t]; s[g4 + 2] += qq.z * kf[t];
          s[g4 + 3] += qq.w * kf[t];
        }"""
    else:
        dot = "for (int g = 0; g < G; ++g) s[g] += qs[c + t][g] * kf[t];"
    helpers = f"""#define DL {dl}
__device__ __forceinline__ void unpack8(float (&dst)[8], uint4 raw) {{
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
  #pragma unroll
  for (int t = 0; t < 4; ++t) {{
    float2 f = __bfloat1622float2(pairs[t]);
    dst[2 * t] = f.x; dst[2 * t + 1] = f.y;
  }}
}}

__device__ __forceinline__ void unpack_v(float (&dst)[DL], {vtype} raw) {{
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
  #pragma unroll
  for (int t = 0; t < DL / 2; ++t) {{
    float2 f = __bfloat1622float2(pairs[t]);
    dst[2 * t] = f.x; dst[2 * t + 1] = f.y;
  }}
}}

__device__ __forceinline__ float warp_max(float x) {{
  #pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}}
"""
    setup = """  for (int x = threadIdx.x; x < G * D; x += blockDim.x)
    qs[x % D][x / D] = __bfloat162float(q[((long)b * H_ + hk * G + x / D) * D + x % D]);
  __syncthreads();
  float m[G], l[G], o[G][DL];
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY; l[g] = 0.f;
    #pragma unroll
    for (int t = 0; t < DL; ++t) o[g][t] = 0.f;
  }"""
    block = f"""    const int j = j0 + lane;
    const bool valid = j < j_end;
    const __nv_bfloat16* krow = kblock + lane * KST;
    float s[G];
    #pragma unroll
    for (int g = 0; g < G; ++g) s[g] = 0.f;
    #pragma unroll
    for (int c = 0; c < D; c += 8) {{
      float kf[8];
      unpack8(kf, *reinterpret_cast<const uint4*>(krow + c));
      #pragma unroll
      for (int t = 0; t < 8; ++t) {{
        {dot}
      }}
    }}
    float p[G];
    #pragma unroll
    for (int g = 0; g < G; ++g) {{
      const int h = hk * G + g;
      const float qk = s[g];
      const float sc = valid ? ({score}) : -INFINITY;
      const float m_new = fmaxf(m[g], warp_max(sc));
      const bool live = m_new != -INFINITY;    // everything masked so far: nothing to add
      const float corr = live ? __expf(m[g] - m_new) : 1.f;
      p[g] = live ? __expf(sc - m_new) : 0.f;
      l[g] = l[g] * corr + p[g];
      #pragma unroll
      for (int t = 0; t < DL; ++t) o[g][t] *= corr;
      m[g] = m_new;
    }}
    #pragma unroll
    for (int jj = 0; jj < 32; ++jj) {{       // rows past the end were copied clamped; weight 0
      float vf[DL];
      unpack_v(vf, *reinterpret_cast<const {vtype}*>(vblock + jj * VST + lane * DL));
      #pragma unroll
      for (int g = 0; g < G; ++g) {{
        const float pj = __shfl_sync(0xffffffffu, p[g], jj);
        #pragma unroll
        for (int t = 0; t < DL; ++t) o[g][t] += pj * vf[t];
      }}
    }}"""
    store = """  #pragma unroll
  for (int g = 0; g < G; ++g) {
    const float lw = warp_sum(l[g]);
    if (lane == 0) { warp_m[warp][g] = m[g]; warp_l[warp][g] = lw; }
    #pragma unroll
    for (int t = 0; t < DL; ++t) warp_o[warp][g][lane * DL + t] = o[g][t];
  }"""
    return Sweep(helpers, setup, block, store)


def mma_sweep(score: str, D: int, tiles: int = 1) -> Sweep:
    """Tensor cores (``mma.sync`` m16n8k16): the group's query heads are the 16 rows of the MMA
    tile (rows past G are zero and masked; a group of more than 16 takes a team of ``tiles``
    warps, warp ``tile`` holding heads ``tile·16`` …, all reading the team's blocks and keeping
    one state a team, indexed by ``sweeper``), so S = Q·Kᵀ for a block of 32 keys is four 16×8
    tiles (K rows from ``ldmatrix``, Q's fragments held in registers for the whole sweep), the
    online softmax runs on S's fragments (row maxima across the four lanes of a quad), and
    O += P·V takes P from S's registers as its A operand (V through ``ldmatrix.trans``). Up to
    D = 128 a warp skips o's rescale where no row's maximum moved (at D = 256 the sweep keeps
    255 registers, and the branch made ptxas spill)."""
    lazy = D <= 128
    rescale_test = "__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)" if lazy else "true"
    block = f"""    float s[4][4];
    #pragma unroll
    for (int nt = 0; nt < 4; ++nt) {{   // S = Q · Kᵀ: keys nt·8 … nt·8 + 7 of the block
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
      #pragma unroll
      for (int kk = 0; kk < D / 32; ++kk) {{
        unsigned kf[4];
        ldsm_x4(kf, k_at(kblock, nt * 8 + lane % 8, kk * 32 + (lane / 8) * 8));
        mma16816(s[nt], qa[2 * kk], kf[0], kf[1]);
        mma16816(s[nt], qa[2 * kk + 1], kf[2], kf[3]);
      }}
    }}
    float mx[2] = {{-INFINITY, -INFINITY}};
    #pragma unroll
    for (int nt = 0; nt < 4; ++nt)
      #pragma unroll
      for (int e = 0; e < 4; ++e) {{
        const int g = row0 + (e / 2) * 8, j = j0 + nt * 8 + col0 + e % 2, h = hk * G + g;
        const float qk = s[nt][e];
        s[nt][e] = (g < G && j < j_end) ? ({score}) : -INFINITY;
        mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
      }}
    float corr[2];
    #pragma unroll
    for (int r = 0; r < 2; ++r) {{   // row maxima over the quad's four lanes
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      const bool live = m_new != -INFINITY;    // everything masked so far: nothing to add
      corr[r] = live ? __expf(m[r] - m_new) : 1.f;
      l[r] *= corr[r];
      m[r] = live ? m_new : -INFINITY;
    }}
    unsigned pa[2][4];   // P as the A operand of O += P · V, keys 16·kk …
    #pragma unroll
    for (int nt = 0; nt < 4; ++nt) {{
      float p[4];
      #pragma unroll
      for (int e = 0; e < 4; ++e) {{
        p[e] = m[e / 2] == -INFINITY ? 0.f : __expf(s[nt][e] - m[e / 2]);
        l[e / 2] += p[e];
      }}
      pa[nt / 2][(nt % 2) * 2] = tf_pack_bf16x2(p[0], p[1]);
      pa[nt / 2][(nt % 2) * 2 + 1] = tf_pack_bf16x2(p[2], p[3]);
    }}
    // o's rescale only where a row's maximum moved (a warp-uniform branch: once the maxima
    // settle, most blocks skip these D / 2 multiplies a lane; multiplying by 1 is exact; at
    // D = 256 every block rescales: the branch made ptxas spill)
    if ({rescale_test}) {{
      #pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) {{
        o[nt][0] *= corr[0]; o[nt][1] *= corr[0]; o[nt][2] *= corr[1]; o[nt][3] *= corr[1];
      }}
    }}
    #pragma unroll
    for (int kk = 0; kk < 2; ++kk)
      #pragma unroll
      for (int np = 0; np < D / 16; ++np) {{
        unsigned vf[4];
        ldsm_x4_t(vf, v_at(vblock, kk * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                           np * 16 + (lane / 16) * 8));
        mma16816(o[2 * np], pa[kk], vf[0], vf[1]);
        mma16816(o[2 * np + 1], pa[kk], vf[2], vf[3]);
      }}"""
    setup = f"""  // lane holds rows row0 and row0 + 8 (query heads of the group) at columns col0, col0 + 1
  const int row0 = {"tile * 16 + " if tiles > 1 else ""}lane / 4, col0 = (lane % 4) * 2;
""" + """  unsigned qa[D / 16][4];   // Q's A fragments, k16 step by step
  {
    auto q_pair = [&](int g, int d) -> unsigned {
      return g < G ? *reinterpret_cast<const unsigned*>(q + ((long)b * H_ + hk * G + g) * D + d)
                   : 0u;
    };
    #pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      qa[ks][0] = q_pair(row0, ks * 16 + col0);
      qa[ks][1] = q_pair(row0 + 8, ks * 16 + col0);
      qa[ks][2] = q_pair(row0, ks * 16 + col0 + 8);
      qa[ks][3] = q_pair(row0 + 8, ks * 16 + col0 + 8);
    }
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};   // l: this lane's columns only
  float o[D / 8][4];
  #pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;"""
    state = "sweeper" if tiles > 1 else "warp"   # whose slot of warp_m/l/o
    store = f"""  #pragma unroll
  for (int r = 0; r < 2; ++r) {{   // the quad's partial sums, then rows below G to shared memory
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int g = row0 + r * 8;
    if (g < G && lane % 4 == 0) {{ warp_m[{state}][g] = m[r]; warp_l[{state}][g] = l[r]; }}
  }}
  #pragma unroll
  for (int nt = 0; nt < D / 8; ++nt)
    #pragma unroll
    for (int e = 0; e < 4; ++e) {{
      const int g = row0 + (e / 2) * 8;
      if (g < G) warp_o[{state}][g][nt * 8 + col0 + e % 2] = o[nt][e];
    }}"""
    return Sweep("", setup, block, store)
