"""Decode attention with the key sequence of each query split across a thread-block cluster.

A split update inside one cluster: the ``cluster`` CTAs of a cluster each sweep a contiguous part
of the keys for one (batch, kv-head) pair and all the query heads that share it (GQA), keeping the
running state of the chain — maximum ``m``, sum ``l``, weighted sum ``o`` — in registers (two rows
per warp, 16-byte loads, the online-softmax correction per key). The 16 half-warp states of a CTA
are merged in its shared memory, then the CTAs' states are merged through distributed shared memory
(``mapa`` + ``ld.shared::cluster`` after a cluster barrier): every state is corrected from its own
maximum to the cluster's with ``exp(m_part − m)``, the correction the rolling-update algebra derives
for this chain (:func:`plan_decode` checks that it applies). No partial state goes to global memory.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...algebra import plan_chain
from ...algebra.exprs import nodes
from ...dsl.expr import Binary, Load, Ref, Unary
from ...dsl.program import Program
from ...errors import ScheduleError
from .dsm import HELPERS
from .expr import size_macros, to_cuda

THREADS = 256
HALF_WARPS = THREADS // 16


@dataclass(frozen=True)
class DecodePlan:
    """The chain's tensors and the score expression (C++ over ``qk``, the scaled-or-not dot
    product, with axes ``b``, ``h``, ``i``, ``j``)."""

    q: str
    k: str
    v: str
    score: str
    out: str
    scalars: tuple[tuple[str, str], ...]
    dims: tuple[str, str, str, str, str, str]   # B, H, HKV, M, N, D size names


@dataclass(frozen=True)
class DecodeKnobs:
    cluster: int = 8
    unroll: int = 4     # key pairs per warp in flight

    def __str__(self) -> str:
        return f"cluster={self.cluster}, unroll={self.unroll}"


def _refuse(message: str, loc=None) -> ScheduleError:
    return ScheduleError(f"cluster_distribute (attention): {message}", loc)


def _through_elementwise(e) -> list:
    """The nodes of ``e`` and of the elementwise computes it references."""
    out = []
    for n in nodes(e):
        out.append(n)
        if isinstance(n, Ref) and not n.compute.is_reduction:
            out.extend(_through_elementwise(n.compute.bodies[0]))
    return out


def plan_decode(program: Program, names: tuple[str, ...], axis: str) -> DecodePlan:
    """Check that the rolled chain is softmax-weighted attention and read its pieces."""
    chain = plan_chain(program, names, axis)  # raises when no correction exists
    by_name = {c.name: c for c in program.computes}
    members = [by_name[n] for n in names]
    maxes = [c for c in members if c.monoid.name == "max"]
    sums = [c for c in members if c.monoid.name == "sum"]
    if len(maxes) != 1 or len(sums) != 2:
        raise _refuse(f"the chain {', '.join(names)} is not max → sum(exp) → weighted sum; cluster "
                      "decode merges softmax states only (use split_update for other chains)")
    m = maxes[0]
    outputs = [c for c in program.computes if c.is_output]
    out = outputs[0]
    body = out.bodies[0]
    weighted = [c for c in sums if any(isinstance(n, Load) for n in nodes(c.bodies[0]))]
    plain = [c for c in sums if all(c is not w for w in weighted)]
    if len(weighted) != 1 or len(plain) != 1 or not (
            isinstance(body, Binary) and body.op == "div" and isinstance(body.a, Ref)
            and body.a.compute is weighted[0] and isinstance(body.b, Ref)
            and body.b.compute is plain[0]):
        raise _refuse(f"the output must be the weighted sum divided by the sum of weights", out.loc)
    # the scores: m's body is s (an elementwise compute over a dot product over d)
    s = m.bodies[0]
    s_c = s.compute if isinstance(s, Ref) else None
    dots = [c for c in program.computes if c.is_reduction and all(c is not x for x in members)]
    if s_c is None or len(dots) != 1:
        raise _refuse("the scores must be one dot product q·k with elementwise terms", m.loc)
    dot = dots[0]
    loads = [n for n in nodes(dot.bodies[0]) if isinstance(n, Load)]
    v_loads = [n for n in nodes(weighted[0].bodies[0]) if isinstance(n, Load)]
    if len(loads) != 2 or len(v_loads) != 1:
        raise _refuse("the scores must be sum(q[...] * k[...], over=d) and the weighted sum must "
                      "read one value tensor", dot.loc)
    on_keys = [ld for ld in loads if any(a.name == axis for a in ld.axes)]
    if len(on_keys) != 1:
        raise _refuse(f"exactly one operand of the scores must run over {axis!r} (the keys)",
                      dot.loc)
    k_load = on_keys[0]
    q_load = next(ld for ld in loads if ld is not k_load)
    p = next((n for n in _through_elementwise(weighted[0].bodies[0])
              if isinstance(n, Unary) and n.op == "exp"), None)
    if p is None:
        raise _refuse("the weights must be exp(s - m)", weighted[0].loc)
    axes = {"b": "b", "h": "h", "i": "0", "j": "j"}
    score = to_cuda(s_c.bodies[0], {dot.name: "qk"}, "the score", axes=axes)
    qp = next(x for x in program.tensor_params if x.name == q_load.param.name)
    kp = next(x for x in program.tensor_params if x.name == k_load.param.name)
    if len(qp.dims) != 4 or len(kp.dims) != 4:
        raise _refuse("q must be [B, H, M, D] and k, v [B, HKV, N, D]")
    del chain
    return DecodePlan(qp.name, kp.name, v_loads[0].param.name, score, out.name,
                      tuple((x.name, x.dtype) for x in program.scalar_params),
                      (str(qp.dims[0]), str(qp.dims[1]), str(kp.dims[1]), str(qp.dims[2]),
                       str(kp.dims[2]), str(qp.dims[3])))


def decode_source(plan: DecodePlan, knobs: DecodeKnobs, sizes: dict) -> str:
    """CUDA C++ for ``tf_decode_cluster``: grid (B·HKV·cluster), cluster (cluster)."""
    B, H, HKV, M, N, D = (sizes[d] for d in plan.dims)
    if M != 1:
        raise _refuse(f"cluster decode is for one query token (M=1), got M={M}; prefill uses the "
                      "attention template")
    if D not in (128, 256):
        raise _refuse(f"head dim D={D}: cluster decode handles 128 and 256 (16-byte loads, a "
                      "half-warp per key row)")
    if H % HKV:
        raise _refuse(f"H={H} query heads do not share HKV={HKV} kv-heads evenly")
    G = H // HKV
    C, U = knobs.cluster, knobs.unroll
    if C not in (1, 2, 4, 8, 16):
        raise _refuse(f"cluster={C} is not 1, 2, 4, 8 or 16")
    vec = D // 16                       # elements per lane (a half-warp spans a row)
    scalar_args = "".join(f", {'float' if t.startswith('f') else 'int'} {n}"
                          for n, t in plan.scalars)
    return f"""#include <cuda_bf16.h>
{HELPERS}
{size_macros(sizes)}#define G {G}
#define D {D}
#define N_ {N}
#define HKV_ {HKV}
#define H_ {H}
#define CLUSTER {C}
#define VEC {vec}
#define U {U}
#define HW {HALF_WARPS}

__device__ __forceinline__ void load_row(float (&dst)[VEC], const __nv_bfloat16* src) {{
  #pragma unroll
  for (int c = 0; c < VEC; c += 8) {{
    uint4 raw = *reinterpret_cast<const uint4*>(src + c);
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
    #pragma unroll
    for (int t = 0; t < 4; ++t) {{
      float2 f = __bfloat1622float2(pairs[t]);
      dst[c + 2 * t] = f.x; dst[c + 2 * t + 1] = f.y;
    }}
  }}
}}

extern "C" __global__ void __launch_bounds__({THREADS})
tf_decode_cluster(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                  const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ out{scalar_args}) {{
  __shared__ float part_m[HW][G], part_l[HW][G];
  __shared__ __align__(16) float part_o[HW][G][D];
  __shared__ float cta_m[G], cta_l[G];
  __shared__ __align__(16) float cta_o[G][D];
  const unsigned rank = tf_cluster_rank();
  const int pair = blockIdx.x / CLUSTER;      // (batch, kv head)
  const int b = pair / HKV_, hk = pair % HKV_;
  const int lane16 = threadIdx.x % 16, hw = threadIdx.x / 16;
  const int e0 = lane16 * VEC;
  const int chunk = (N_ + CLUSTER - 1) / CLUSTER;
  const int j_begin = rank * chunk, j_end = min(N_, j_begin + chunk);
  const __nv_bfloat16* kb = k + ((long)b * HKV_ + hk) * N_ * D;
  const __nv_bfloat16* vb = v + ((long)b * HKV_ + hk) * N_ * D;

  float qv[G][VEC], m[G], l[G], o[G][VEC];
  #pragma unroll
  for (int g = 0; g < G; ++g) {{
    load_row(qv[g], q + ((long)b * H_ + hk * G + g) * D + e0);
    m[g] = -INFINITY; l[g] = 0.f;
    #pragma unroll
    for (int t = 0; t < VEC; ++t) o[g][t] = 0.f;
  }}
  for (int j0 = j_begin + hw; j0 < j_end; j0 += HW * U) {{
    float kr[U][VEC], vr[U][VEC];
    #pragma unroll
    for (int u = 0; u < U; ++u) {{
      int j = j0 + u * HW;
      const long row = j < j_end ? j : j_begin;   // past the end: a harmless in-bounds row
      load_row(kr[u], kb + row * D + e0); load_row(vr[u], vb + row * D + e0);
    }}
    #pragma unroll
    for (int u = 0; u < U; ++u) {{
      const int j = j0 + u * HW;
      const bool valid = j < j_end;     // both half-warps must reach every shuffle
      #pragma unroll
      for (int g = 0; g < G; ++g) {{
        const int h = hk * G + g;
        float qk = 0.f;
        #pragma unroll
        for (int t = 0; t < VEC; ++t) qk += qv[g][t] * kr[u][t];
        #pragma unroll
        for (int off = 8; off > 0; off >>= 1) qk += __shfl_xor_sync(0xffffffffu, qk, off, 16);
        const float s = valid ? ({plan.score}) : -INFINITY;
        const float m_new = fmaxf(m[g], s);
        const bool live = m_new != -INFINITY;   // everything masked so far: nothing to add
        const float corr = live ? __expf(m[g] - m_new) : 1.f, p = live ? __expf(s - m_new) : 0.f;
        l[g] = l[g] * corr + p;
        #pragma unroll
        for (int t = 0; t < VEC; ++t) o[g][t] = o[g][t] * corr + p * vr[u][t];
        m[g] = m_new;
      }}
    }}
  }}
  #pragma unroll
  for (int g = 0; g < G; ++g) {{
    if (lane16 == 0) {{ part_m[hw][g] = m[g]; part_l[hw][g] = l[g]; }}
    #pragma unroll
    for (int t = 0; t < VEC; ++t) part_o[hw][g][e0 + t] = o[g][t];
  }}
  __syncthreads();
  // merge the half-warps' states: each thread owns (g, e) elements
  for (int x = threadIdx.x; x < G * D; x += blockDim.x) {{
    const int g = x / D, e = x % D;
    float mm = -INFINITY;
    for (int w = 0; w < HW; ++w) mm = fmaxf(mm, part_m[w][g]);
    float ll = 0.f, oo = 0.f;
    if (mm != -INFINITY)
      for (int w = 0; w < HW; ++w) {{
        const float c = __expf(part_m[w][g] - mm);
        ll += part_l[w][g] * c; oo += part_o[w][g][e] * c;
      }}
    cta_o[g][e] = oo;
    if (e == 0) {{ cta_m[g] = mm; cta_l[g] = ll; }}
  }}
  tf_cluster_sync();  // every CTA's state is in its shared memory
  // merge the cluster's states through DSM: CTA `rank` finishes its share of the outputs
  const int per = (G * D + CLUSTER - 1) / CLUSTER;
  for (int x = rank * per + threadIdx.x; x < min(G * D, (int)(rank + 1) * per); x += blockDim.x) {{
    const int g = x / D, e = x % D;
    const unsigned am = tf_smem_addr(&cta_m[g]), al = tf_smem_addr(&cta_l[g]),
                   ao = tf_smem_addr(&cta_o[g][e]);
    float mp[CLUSTER], mm = -INFINITY;
    #pragma unroll
    for (int p = 0; p < CLUSTER; ++p) {{ mp[p] = tf_ld_dsm_f32(tf_mapa(am, p)); mm = fmaxf(mm, mp[p]); }}
    float ll = 0.f, oo = 0.f;
    #pragma unroll
    for (int p = 0; p < CLUSTER; ++p) {{
      const float c = mm == -INFINITY ? 0.f : __expf(mp[p] - mm);
      ll += tf_ld_dsm_f32(tf_mapa(al, p)) * c;
      oo += tf_ld_dsm_f32(tf_mapa(ao, p)) * c;
    }}
    out[((long)b * H_ + hk * G + g) * D + e] = __float2bfloat16(oo / ll);
  }}
  tf_cluster_sync();  // peers may still read this CTA's state
}}
"""
