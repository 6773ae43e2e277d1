"""Decode attention with the key sequence of each query split across a thread-block cluster.

A split update inside one cluster: the ``cluster`` CTAs of a cluster each sweep a contiguous part
of the keys for one (batch, kv-head) pair and all the query heads that share it (GQA), keeping the
running state of the chain — maximum ``m``, sum ``l``, weighted sum ``o`` — in registers. A warp
takes 32 keys at a time: each lane scores one key for every query head of the group (q is read from
shared memory, four heads per read; the next block's keys and values are copied into the warp's
shared memory while it computes), the block's maximum corrects the state once, and each lane
accumulates its slice of the head dimension over the 32 weighted value rows. The warps' states of a
CTA are merged in its shared memory, then the CTAs' states are merged through distributed shared memory
(``mapa`` + ``ld.shared::cluster`` after a cluster barrier): every state is corrected from its own
maximum to the cluster's with ``exp(m_part − m)``, the correction the rolling-update algebra derives
for this chain (:func:`plan_decode` checks that it applies). No partial state goes to global memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...algebra import inline_elementwise, plan_chain
from ...algebra.exprs import factors, substitute
from ...dsl.evaluate import evaluate_plain
from ...dsl.expr import Axis, Binary, Const, DimSize, Expr, Load, Ref, Symbol, Unary
from ...dsl.program import Program
from ...errors import ScheduleError
from .dsm import HELPERS
from .expr import size_macros, to_cuda


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
    kv_head: Expr      # the kv-head index of k and v, in the query head axis
    head_axis: str     # that axis's name


@dataclass(frozen=True)
class DecodeKnobs:
    cluster: int = 8
    warps: int = 8      # each sweeps blocks of 32 keys

    def __str__(self) -> str:
        return f"cluster={self.cluster}, warps={self.warps}"


def _refuse(message: str, loc=None) -> ScheduleError:
    return ScheduleError(f"cluster_distribute (attention): {message}", loc)


def _same(a, b) -> bool:
    return a.key() == b.key()


def _is_axis(e, axis) -> bool:
    return isinstance(e, Axis) and e.uid == axis.uid


def plan_decode(program: Program, names: tuple[str, ...], axis: str) -> DecodePlan:
    """Check that the rolled chain is exactly softmax-weighted attention — ``m = max(s)``,
    ``l = sum(exp(s - m))``, ``o = sum(exp(s - m) * v)``, output ``o / l`` — with the layouts the
    kernel indexes, and read its pieces. Anything else is refused: the kernel's merge hard-codes
    this chain's correction ``exp(m_part - m)``."""
    plan_chain(program, names, axis)  # refuses chains that have no correction at all
    by_name = {c.name: c for c in program.computes}
    members = [by_name[n] for n in names]
    maxes = [c for c in members if c.monoid.name == "max"]
    sums = [c for c in members if c.monoid.name == "sum"]
    if len(maxes) != 1 or len(sums) != 2:
        raise _refuse(f"the chain {', '.join(names)} is not max → sum(exp) → weighted sum; cluster "
                      "decode merges softmax states only (use split_update for other chains)")
    m = maxes[0]
    scores = inline_elementwise(m.bodies[0])
    bodies = {c.name: factors(inline_elementwise(c.bodies[0])) for c in sums}
    plain = [c for c in sums if len(bodies[c.name]) == 1]
    weighted = [c for c in sums if len(bodies[c.name]) == 2]
    if len(plain) != 1 or len(weighted) != 1:
        raise _refuse("the chain's sums must be sum(p) and sum(p * v)", m.loc)
    p = bodies[plain[0].name][0]
    if not (isinstance(p, Unary) and p.op == "exp" and isinstance(p.a, Binary) and p.a.op == "sub"
            and _same(p.a.a, scores) and isinstance(p.a.b, Ref) and p.a.b.compute is m):
        raise _refuse(f"the weights of {plain[0].name} must be exp(s - {m.name}) with s the "
                      f"scores {m.name} maximises; the cluster merge corrects by exactly that",
                      plain[0].loc)
    v_load = [f for f in bodies[weighted[0].name] if not _same(f, p)]
    if len(v_load) != 1 or not isinstance(v_load[0], Load):
        raise _refuse(f"{weighted[0].name} must be sum(p * v[...]) with the same weights p as "
                      f"{plain[0].name}", weighted[0].loc)
    v_load = v_load[0]
    outputs = [c for c in program.computes if c.is_output]
    out = outputs[0]
    body = out.bodies[0]
    if len(outputs) != 1 or not (
            isinstance(body, Binary) and body.op == "div" and isinstance(body.a, Ref)
            and body.a.compute is weighted[0] and isinstance(body.b, Ref)
            and body.b.compute is plain[0]) or out.dtypes[0] != "bf16":
        raise _refuse(f"the output must be the weighted sum divided by the sum of weights, in "
                      "bf16", out.loc)
    dots = [c for c in program.computes if c.is_reduction and all(c is not x for x in members)]
    if len(dots) != 1 or len(dots[0].over) != 1:
        raise _refuse("the scores must be one dot product q·k with elementwise terms", m.loc)
    dot = dots[0]
    loads = factors(dot.bodies[0])
    on_keys = [ld for ld in loads if isinstance(ld, Load) and any(a.name == axis for a in ld.axes)]
    if len(loads) != 2 or not all(isinstance(ld, Load) for ld in loads) or len(on_keys) != 1:
        raise _refuse(f"the scores must be sum(q[...] * k[...], over=d) with k running over "
                      f"{axis!r}", dot.loc)
    k_load = on_keys[0]
    q_load = next(ld for ld in loads if ld is not k_load)
    # layouts: q[b, h, i, d], k[b, hk, j, d], v[b, hk, j, e], out[b, h, i, e]
    d_axis, j_axis = dot.over[0], m.over[0]
    if len(q_load.indices) != 4 or not all(isinstance(x, Axis) for x in q_load.indices) or \
            not _is_axis(q_load.indices[3], d_axis):
        raise _refuse("q must be indexed [b, h, i, d] by plain axes", dot.loc)
    b_axis, h_axis, i_axis = q_load.indices[:3]
    kv_head = k_load.indices[1] if len(k_load.indices) == 4 else None
    e_axis = out.axes[-1] if len(out.axes) == 4 else None
    if kv_head is None or not (
            _is_axis(k_load.indices[0], b_axis) and _is_axis(k_load.indices[2], j_axis)
            and _is_axis(k_load.indices[3], d_axis) and len(v_load.indices) == 4
            and _is_axis(v_load.indices[0], b_axis) and _same(v_load.indices[1], kv_head)
            and _is_axis(v_load.indices[2], j_axis) and _is_axis(v_load.indices[3], e_axis)
            and all(_is_axis(a, x) for a, x in zip(out.axes, (b_axis, h_axis, i_axis, e_axis)))):
        raise _refuse("k and v must be indexed [b, kv-head, j, d] and [b, kv-head, j, e] with one "
                      "kv-head expression, and the output [b, h, i, e]", dot.loc)
    axes = {b_axis.name: "b", h_axis.name: "h", i_axis.name: "0", j_axis.name: "j"}
    score = to_cuda(scores, {dot.name: "qk"}, "the score", axes=axes)
    qp = next(x for x in program.tensor_params if x.name == q_load.param.name)
    kp = next(x for x in program.tensor_params if x.name == k_load.param.name)
    return DecodePlan(qp.name, kp.name, v_load.param.name, score, out.name,
                      tuple((x.name, x.dtype) for x in program.scalar_params),
                      (str(qp.dims[0]), str(qp.dims[1]), str(kp.dims[1]), str(qp.dims[2]),
                       str(kp.dims[2]), str(qp.dims[3])), kv_head, h_axis.name)


def _check_head_map(plan: DecodePlan, sizes: dict, H: int, G: int) -> None:
    """The kernel gives query heads ``hk·G … hk·G + G - 1`` to kv-head ``hk``; the program's
    kv-head expression must say the same for every query head."""
    def replace(n):
        if isinstance(n, Axis) and n.name == plan.head_axis:
            return Symbol(n.name, "i64")
        if isinstance(n, DimSize):
            return Const(sizes[n.name], "i64")
        return None

    heads = np.arange(H, dtype=np.int64)
    try:
        got = np.broadcast_to(evaluate_plain(substitute(plan.kv_head, replace),
                                             {plan.head_axis: heads}), heads.shape)
    except Exception:  # noqa: BLE001 - anything the evaluator cannot do is not a head map
        got = None
    if got is None or not np.array_equal(got, heads // G):
        raise _refuse(f"the kv-head index {plan.kv_head} does not give query heads "
                      f"hk·{G}…hk·{G}+{G - 1} to kv-head hk (the grouping the kernel uses)")


def decode_source(plan: DecodePlan, knobs: DecodeKnobs, sizes: dict) -> str:
    """CUDA C++ for ``tf_decode_cluster``: grid (B·HKV·cluster), cluster (cluster), dynamic shared
    memory :func:`decode_shared_bytes`."""
    B, H, HKV, M, N, D = (sizes[d] for d in plan.dims)
    if M != 1:
        raise _refuse(f"cluster decode is for one query token (M=1), got M={M}; prefill uses the "
                      "attention template")
    if D not in (64, 128, 256):
        raise _refuse(f"head dim D={D}: cluster decode handles 64, 128 and 256")
    if H % HKV:
        raise _refuse(f"H={H} query heads do not share HKV={HKV} kv-heads evenly")
    G = H // HKV
    _check_head_map(plan, sizes, H, G)
    C, W = knobs.cluster, knobs.warps
    if C not in (1, 2, 4, 8, 16):
        raise _refuse(f"cluster={C} is not 1, 2, 4, 8 or 16")
    if W not in (2, 4, 8, 16):
        raise _refuse(f"warps={W} is not 2, 4, 8 or 16")
    dl = D // 32                        # value elements per lane
    vtype = {2: "unsigned", 4: "uint2", 8: "uint4"}[dl]
    scalar_args = "".join(f", {'float' if t.startswith('f') else 'int'} {n}"
                          for n, t in plan.scalars)
    if G % 4 == 0:  # four heads per shared-memory read (q is stored [d][head])
        dot = """for (int g4 = 0; g4 < G; g4 += 4) {
          const float4 qq = *reinterpret_cast<const float4*>(&qs[c + t][g4]);
          s[g4] += qq.x * kf[t]; s[g4 + 1] += qq.y * kf[t]; s[g4 + 2] += qq.z * kf[t];
          s[g4 + 3] += qq.w * kf[t];
        }"""
    else:
        dot = "for (int g = 0; g < G; ++g) s[g] += qs[c + t][g] * kf[t];"
    return f"""#include <cuda_bf16.h>
{HELPERS}
{size_macros(sizes)}#define G {G}
#define D {D}
#define DL {dl}
#define N_ {N}
#define HKV_ {HKV}
#define H_ {H}
#define CLUSTER {C}
#define WARPS {W}
#define KST (D + 8)   // key rows in shared memory: 16-byte skew, conflict-free row-per-lane reads

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

__device__ __forceinline__ float warp_sum(float x) {{
  #pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
tf_decode_cluster(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                  const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ out{scalar_args}) {{
  extern __shared__ __align__(16) char dsmem[];   // per warp: two blocks of 32 key rows
  __shared__ __align__(16) float qs[D][G];
  __shared__ float warp_m[WARPS][G], warp_l[WARPS][G];
  __shared__ __align__(16) float warp_o[WARPS][G][D];
  __shared__ float cta_m[G], cta_l[G];
  __shared__ __align__(16) float cta_o[G][D];
  const unsigned rank = tf_cluster_rank();
  const int pair = blockIdx.x / CLUSTER;      // (batch, kv head)
  const int b = pair / HKV_, hk = pair % HKV_;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int chunk = (N_ + CLUSTER - 1) / CLUSTER;
  const int j_begin = rank * chunk, j_end = min(N_, j_begin + chunk);
  const __nv_bfloat16* kb = k + ((long)b * HKV_ + hk) * N_ * D;
  const __nv_bfloat16* vb = v + ((long)b * HKV_ + hk) * N_ * D;
  for (int x = threadIdx.x; x < G * D; x += blockDim.x)
    qs[x % D][x / D] = __bfloat162float(q[((long)b * H_ + hk * G + x / D) * D + x % D]);
  __syncthreads();

  // Blocks of 32 keys per warp: lane `lane` scores key j0 + lane for every head of the group;
  // one maximum per block and head, then the weighted values (lane owns DL elements of each).
  float m[G], l[G], o[G][DL];
  #pragma unroll
  for (int g = 0; g < G; ++g) {{
    m[g] = -INFINITY; l[g] = 0.f;
    #pragma unroll
    for (int t = 0; t < DL; ++t) o[g][t] = 0.f;
  }}
  __nv_bfloat16* kbuf = reinterpret_cast<__nv_bfloat16*>(dsmem) + warp * 2 * 32 * (KST + D);
  __nv_bfloat16* vbuf = kbuf + 2 * 32 * KST;
  // the warp copies the next block of 32 key and value rows, coalesced, into its own buffers
  // (cp.async) while it computes on the current one
  auto load_keys = [&](int buf, int first) {{
    for (int c = lane; c < 32 * D / 8; c += 32) {{
      const int r = c / (D / 8), col = (c % (D / 8)) * 8;
      const long row = min(first + r, j_end - 1);
      tf_cp_async16(kbuf + (buf * 32 + r) * KST + col, kb + row * D + col, true);
      tf_cp_async16(vbuf + (buf * 32 + r) * D + col, vb + row * D + col, true);
    }}
    tf_cp_async_commit();
  }};
  if (j_begin + warp * 32 < j_end) load_keys(0, j_begin + warp * 32);
  int it = 0;
  for (int j0 = j_begin + warp * 32; j0 < j_end; j0 += WARPS * 32, ++it) {{
    if (j0 + WARPS * 32 < j_end) load_keys((it + 1) & 1, j0 + WARPS * 32);
    else tf_cp_async_commit();
    tf_cp_async_wait<1>();
    __syncwarp();
    const int j = j0 + lane;
    const bool valid = j < j_end;
    const __nv_bfloat16* krow = kbuf + ((it & 1) * 32 + lane) * KST;
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
      const float sc = valid ? ({plan.score}) : -INFINITY;
      const float m_new = fmaxf(m[g], warp_max(sc));
      const bool live = m_new != -INFINITY;    // everything masked so far: nothing to add
      const float corr = live ? __expf(m[g] - m_new) : 1.f;
      p[g] = live ? __expf(sc - m_new) : 0.f;
      l[g] = l[g] * corr + p[g];
      #pragma unroll
      for (int t = 0; t < DL; ++t) o[g][t] *= corr;
      m[g] = m_new;
    }}
    const __nv_bfloat16* vblock = vbuf + (it & 1) * 32 * D;
    #pragma unroll
    for (int jj = 0; jj < 32; ++jj) {{       // rows past the end were copied clamped; weight 0
      float vf[DL];
      unpack_v(vf, *reinterpret_cast<const {vtype}*>(vblock + jj * D + lane * DL));
      #pragma unroll
      for (int g = 0; g < G; ++g) {{
        const float pj = __shfl_sync(0xffffffffu, p[g], jj);
        #pragma unroll
        for (int t = 0; t < DL; ++t) o[g][t] += pj * vf[t];
      }}
    }}
    __syncwarp();  // the buffer is read: the copy after next may overwrite it
  }}
  #pragma unroll
  for (int g = 0; g < G; ++g) {{
    const float lw = warp_sum(l[g]);
    if (lane == 0) {{ warp_m[warp][g] = m[g]; warp_l[warp][g] = lw; }}
    #pragma unroll
    for (int t = 0; t < DL; ++t) warp_o[warp][g][lane * DL + t] = o[g][t];
  }}
  __syncthreads();
  // merge the warps' states: each thread owns (g, e) elements
  for (int x = threadIdx.x; x < G * D; x += blockDim.x) {{
    const int g = x / D, e = x % D;
    float mm = -INFINITY;
    for (int w = 0; w < WARPS; ++w) mm = fmaxf(mm, warp_m[w][g]);
    float ll = 0.f, oo = 0.f;
    if (mm != -INFINITY)
      for (int w = 0; w < WARPS; ++w) {{
        const float c = __expf(warp_m[w][g] - mm);
        ll += warp_l[w][g] * c; oo += warp_o[w][g][e] * c;
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


def decode_shared_bytes(knobs: DecodeKnobs, head_dim: int) -> int:
    """Dynamic shared memory of the decode kernel: two blocks of 32 key and value rows per warp."""
    return knobs.warps * 2 * 32 * (2 * head_dim + 8) * 2
