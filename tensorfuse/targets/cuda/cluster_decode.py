"""Decode attention with the key sequence of each query split across a thread-block cluster: the
CUDA C++ emitter (the plan and its checks: ``schedule_templates.decode_plan``).

A split update inside one cluster: the ``cluster`` CTAs of a cluster each sweep a contiguous part
of the keys for one (batch, kv-head) pair and all the query heads that share it (GQA) — all the
keys, or those between the mask's bounds, read once per pair (``schedule_templates.key_range``:
a static cache's length in device memory, a sliding window) — keeping the running state of the
chain — maximum ``m``, sum ``l``, weighted sum ``o`` — in registers. Each warp copies blocks of
32 key and value rows into its own shared memory (``cp.async`` or bulk tensor copies,
:mod:`.decode_copies`; ``stages − 1`` blocks ahead of the one it computes on) and updates the
state once per block (bf16 or fp16):

- ``mma="mma_sync"`` (default while a group has at most 128 heads): the group's heads are the
  rows of 16-row tensor-core tiles, so the block's scores are ``mma.sync`` products of q's
  fragments (in registers for the whole sweep) with key rows from ``ldmatrix``; the online
  softmax runs on the score fragments, and the weights, still in registers, are the A operand
  of ``p·v``. A group of more than 16 heads takes a team of warps per block, 16 heads a warp:
  the team's first warp copies the block, a named barrier per team releases it;
- ``mma="fma"``: CUDA cores, each lane scoring one key of the block for every head (q from shared
  memory) and accumulating its slice of the head dimension over the block's weighted value rows.

The warps' states of a CTA are merged in its shared memory, then the CTAs' states are merged
through distributed shared memory (``mapa`` + ``ld.shared::cluster`` after a cluster barrier):
every state is corrected from its own maximum to the cluster's with ``exp(m_part − m)``, the
correction the rolling-update algebra derives for this chain (``plan_decode`` checks that it
applies).

Where the pairs are too few to spread over the GPU (one cluster is confined to one GPC), the
keys of a pair are split further over ``n_splits`` clusters (the grid's second dimension: the
launch chooses it from the key count). Each cluster then writes its merged state to a workspace
and the last cluster to arrive merges them with the same correction (:mod:`.split`: nobody
waits). With one split no state goes to global memory.
"""
from __future__ import annotations

from ...errors import ScheduleError
from .decode_copies import TEAM_SYNC, cp_async_copy, tma_copy, zero_tail
from .decode_sweeps import fma_sweep, mma_sweep
from .dsm import HELPERS
from .split import HELPERS as SPLIT_HELPERS
from .mma_sync import HELPERS as MMA_SYNC_HELPERS
from .parts import swap
from .expr import scalar_arguments, size_macros, tensor_arguments, to_cuda
from .tma import MBARRIER_HELPERS, TENSOR_MAP_TYPE, load_helper, tensor_map

NL = "\n"   # inside the kernel's f-string (a backslash may not appear in its expressions)
# copy="tma": the key and value tensor maps, passed by value (TENSOR_MAP_TYPE: made on the host
# per call, the key count changes them)
MAP_PARAMS = (",\n                  const __grid_constant__ TfTensorMap k_map, "
              "const __grid_constant__ TfTensorMap v_map")


# The kernel is written for bf16; for fp16 each bf16 name is swapped for its fp16 counterpart
# (the same sizes, the same mma.sync fragment layouts), in this order (longer names first).
_FP16_NAMES = (("cuda_bf16.h", "cuda_fp16.h"), ("__nv_bfloat162", "__half2"),
               ("__nv_bfloat16", "__half"), ("__floats2bfloat162_rn", "__floats2half2_rn"),
               ("__bfloat1622float2", "__half22float2"), ("__bfloat162float", "__half2float"),
               ("__float2bfloat16", "__float2half"), (".f32.bf16.bf16.f32", ".f32.f16.f16.f32"),
               ("tf_pack_bf16x2", "tf_pack_f16x2"))


def _in_dtype(source: str, dtype: str) -> str:
    """``source`` (written for bf16) for ``dtype``."""
    if dtype == "bf16":
        return source
    if "__float2bfloat16_rn(" in source:   # the template's bf16 names are swapped, not a cast's
        raise ScheduleError("a cast to bf16 in a decode of f16 tensors: cast to f16 or f32")
    for bf16, other in _FP16_NAMES:
        source = source.replace(bf16, other)
    return source


# the layout by role of a cache whose (batch, kv-head) pairs are one axis of a 3-D tensor map
PAIRED = "bhjd"


def decode_tensor_maps(k_address: int, v_address: int, batch: int, kv_heads: int, keys: int,
                       head_dim: int, dtype: str = "bf16",
                       layout: str = PAIRED) -> tuple[bytes, bytes]:
    """The key and value tensor maps of ``copy="tma"`` (128 bytes each) of caches of ``dtype``
    contiguous in ``layout`` (their axes by role, outermost first: b, h the kv-head, j the keys,
    d the head dim, innermost), copied in boxes of 32 rows × 64 columns in the 128-byte swizzle:
    ``[pairs, keys, head_dim]`` where (batch, kv-head) pairs are one axis (:data:`PAIRED`), else
    ``[batch, kv_heads, keys, head_dim]`` by the layout's strides (a ``[B, N, HKV, D]`` cache's
    rows of one pair are ``HKV · D`` apart). A box past a pair's last key reads zeros, not the
    next pair's keys. (:func:`.tma.tensor_map` keeps each map encoded once.)"""
    if layout == PAIRED:
        return tuple(tensor_map(address, (batch * kv_heads, keys, head_dim), (1, 32, 64), dtype)
                     for address in (k_address, v_address))
    extent = {"b": batch, "h": kv_heads, "j": keys, "d": head_dim}
    stride, strides = 1, {}
    for role in reversed(layout):
        strides[role] = stride
        stride *= extent[role]
    return tuple(tensor_map(address, (batch, kv_heads, keys, head_dim), (1, 1, 32, 64), dtype,
                            tuple(strides[r] for r in "bhj"))
                 for address in (k_address, v_address))


def cache_addressing(layout: str, batch: int) -> tuple[str, str]:
    """C++ of a cache contiguous in ``layout`` (as :func:`decode_tensor_maps`): the offset of
    pair ``(b, hk)``'s first key and the distance between its keys, in elements (``N_``: the key
    count, ``HKV_``: kv-heads, ``D``: the head dim)."""
    size = {"b": str(batch), "h": "HKV_", "j": "N_", "d": "D"}
    index = {"b": "b", "h": "hk", "j": ""}
    base = ""
    for role in layout[:-1]:
        if not base:
            base = f"(long){index[role]}" if index[role] else ""
        elif index[role]:
            base = f"({base} * {size[role]} + {index[role]})"
        else:
            base = f"{base} * {size[role]}"
    row = " * ".join(size[r] for r in layout[layout.index("j") + 1:])
    return f"{base} * {size[layout[-1]]}" if base else "0", row


def tensor_loads(plan) -> dict:
    """The C++ pointer (``t_<name>``) of each tensor the score and the key bounds read."""
    return {name: f"t_{name}" for name, _ in plan.tensors}


def score_code(plan) -> str:
    """The score as C++ over the dot product ``qk`` and the axes ``b``, ``h``, ``0``, ``j``."""
    return to_cuda(plan.score, {plan.dot: "qk"}, "the score", axes=dict(plan.score_axes),
                   loads=tensor_loads(plan))


def bound_code(plan) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The plan's lower and upper key bounds as C++ integers of ``b`` (the query index is 0)."""
    axes = {name: c for name, c in plan.score_axes if c in ("b", "0")}
    loads = tensor_loads(plan)
    return tuple(tuple(f"(int)({to_cuda(x, {}, 'a bound on the keys', axes=axes, loads=loads)})"
                       for x in side) for side in (plan.lower, plan.upper))


def decode_source(plan, knobs, sizes: dict) -> str:
    """CUDA C++ for ``tf_decode_cluster``: grid (B·HKV·cluster, splits), cluster (cluster),
    dynamic shared memory :func:`decode_shared_bytes`. Its arguments: q, k, v (bf16 or fp16:
    the plan's dtype), out (the same, or float32: the plan's ``out_dtype``); with
    ``copy="tma"`` the key and value tensor maps by value (:func:`decode_tensor_maps`,
    ``__grid_constant__``); the key count; the workspace of the
    splits, the grid's second dimension (:func:`split_workspace`; null pointers for one);
    the tensors the score and the key bounds read (``t_<name>``); the program's scalars. The
    key count and the splits are arguments, not part of the source, so that one kernel serves
    a cache that grows by a key per step (every other size is compiled in; ``sizes``' key count
    is not used). ``plan`` and ``knobs`` come from ``schedule_templates.decode_plan`` (checked
    against these sizes there)."""
    B, H, HKV, M, N, D = (sizes[d] for d in plan.dims)
    keys = plan.dims[4]
    G, C, W = H // HKV, knobs.cluster, knobs.warps
    tensor_cores = knobs.mma == "mma_sync"
    tma = knobs.copy == "tma"
    tiles = head_tiles(knobs, G)
    team = tiles > 1   # warps share blocks: "sweeper" indexes buffers and states, not "warp"
    sw, SW = ("sweeper", "SWEEPERS") if team else ("warp", "WARPS")
    aliased = states_over_buffers(knobs, G)
    scalar_args = "".join(f", {c} {n}" for n, _, c in scalar_arguments(plan.scalars))
    tensor_args = "".join(f", {c} {n}" for n, _, c in tensor_arguments(plan.tensors))
    sweep = mma_sweep(score_code(plan), D, tiles) if tensor_cores else \
        fma_sweep(score_code(plan), G, D)
    layout = plan.layouts[1]   # k's and v's (plan_decode has checked they are the same)
    base, row = cache_addressing(layout, B)
    copy = tma_copy(team, layout == PAIRED) if tma else cp_async_copy(D, tensor_cores, row)
    return _in_dtype(_float32_output(f"""#include <cuda_bf16.h>
{HELPERS}{SPLIT_HELPERS}
{MMA_SYNC_HELPERS if tensor_cores else ""}
{MBARRIER_HELPERS + load_helper(3 if layout == PAIRED else 4) if tma else ""}
{size_macros({d: x for d, x in sizes.items() if d != keys})}#define TF_SIZE_{keys} n_keys   // the key count: an argument (kernel code only)
#define G {G}
#define D {D}
#define N_ n_keys
#define HKV_ {HKV}
#define H_ {H}
#define CLUSTER {C}
#define SPLIT_FLOATS (G * D + 2 * G)   // a cluster's state in the workspace
#define WARPS {W}
{f"#define TILES {tiles}   // warps a block of keys is shared by{NL}#define SWEEPERS {W // tiles}{NL}"
 if team else ""}#define STAGES {knobs.stages}
{copy.macros}{TEAM_SYNC if team else ""}
__device__ __forceinline__ float warp_sum(float x) {{
  #pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}}
{copy.address}{sweep.helpers}{TENSOR_MAP_TYPE if tma else ""}
extern "C" __global__ void __launch_bounds__(WARPS * 32)
tf_decode_cluster(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                  const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ out{
                      MAP_PARAMS if tma else ""}, int n_keys,
                  float* __restrict__ partial, int* __restrict__ arrivals{tensor_args}{
                      scalar_args}) {{
  // Shared memory, all of it dynamic (decode_shared_bytes): per warp STAGES blocks of 32 key and
  // value rows, then {"the warps' copy barriers, " if tma else ""}{
      "q as [d][head], " if not tensor_cores else ""}the warps' and the CTA's states.
{copy.base}  char* states = dsmem + {SW} * STAGES * 32 * (KST + VST) * 2;
{_carve(G, D, W // tiles, not tensor_cores, knobs.stages if tma else 0, aliased)}  const unsigned rank = tf_cluster_rank();
  const int pair = blockIdx.x / CLUSTER;      // (batch, kv head)
  const int split = blockIdx.y, n_splits = gridDim.y;   // which of the pair's clusters
  const int b = pair / HKV_, hk = pair % HKV_;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
{"  const int tile = warp % TILES, sweeper = warp / TILES;   // its 16 heads; its team" + NL
 if team else ""}{_key_split(plan)}  const __nv_bfloat16* kb = k + {base};
  const __nv_bfloat16* vb = v + {base};
{sweep.setup}
  __nv_bfloat16* kbuf = reinterpret_cast<__nv_bfloat16*>(dsmem) +
                        {sw} * STAGES * 32 * (KST + VST);
  __nv_bfloat16* vbuf = kbuf + STAGES * 32 * KST;
  // the warp copies blocks of 32 key and value rows into its own buffers, STAGES − 1 blocks ahead
  // of the one it computes on
{copy.load}  const int j_first = j_begin + {sw} * 32, j_step = {SW} * 32;
  #pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {{
    if (j_first + s * j_step < j_end) load_keys(s, j_first + s * j_step);
{copy.commit}  }}
  int it = 0;
  for (int j0 = j_first; j0 < j_end; j0 += j_step, ++it) {{
    const int j_ahead = j0 + (STAGES - 1) * j_step;
    if (j_ahead < j_end) load_keys((it + STAGES - 1) % STAGES, j_ahead);
{copy.commit}{copy.wait}{zero_tail(D, team) if tma and plan.upper else ""}    const __nv_bfloat16* kblock = kbuf + (it % STAGES) * 32 * KST;
    const __nv_bfloat16* vblock = vbuf + (it % STAGES) * 32 * VST;
{sweep.block}
    {"tf_team_sync(sweeper);  // the team's" if team else "__syncwarp();  // the"
     } buffers are read: a later copy may overwrite them
  }}
{"  __syncthreads();  // every team has swept: its states go over the buffers" + NL
 if aliased else ""}{sweep.store}
  __syncthreads();
{_merge_cluster(SW)}  tf_cluster_sync();  // peers may still read this CTA's state
{_merge_splits()}}}
""", plan.out_dtype), plan.dtype)


# a float32 output (a float32 term of the score makes one): stored as the merged value is, not
# rounded to 16 bits — the output pointer and its two stores (the cluster's merge, the splits')
_OUTPUT_16 = ("__nv_bfloat16* __restrict__ out", "= __float2bfloat16(oo / ll);",
              "= __float2bfloat16(oo[t] / ll[t]);")
_OUTPUT_32 = ("float* __restrict__ out", "= oo / ll;", "= oo[t] / ll[t];")


def _float32_output(source: str, out_dtype: str) -> str:
    """``source`` storing a float32 output where ``out_dtype`` says (else as it is)."""
    if out_dtype != "f32":
        return source
    for narrow, wide in zip(_OUTPUT_16, _OUTPUT_32):
        source = swap(source, narrow, wide)
    return source


def _merge_cluster(SW: str) -> str:
    """Merge the states of the CTA's warps (``SW``: their count, ``WARPS`` or ``SWEEPERS`` — one
    state a team) in its shared memory, then the cluster's CTAs' states through distributed
    shared memory: CTA ``rank`` finishes its share of the outputs, or writes it to the workspace
    when the pair's keys are split over several clusters."""
    return f"""  // merge the warps' states: each thread owns (g, e) elements
  for (int x = threadIdx.x; x < G * D; x += blockDim.x) {{
    const int g = x / D, e = x % D;
    float mm = -INFINITY;
    for (int w = 0; w < {SW}; ++w) mm = fmaxf(mm, warp_m[w][g]);
    float ll = 0.f, oo = 0.f;
    if (mm != -INFINITY)
      for (int w = 0; w < {SW}; ++w) {{
        const float c = __expf(warp_m[w][g] - mm);
        ll += warp_l[w][g] * c; oo += warp_o[w][g][e] * c;
      }}
    cta_o[g][e] = oo;
    if (e == 0) {{ cta_m[g] = mm; cta_l[g] = ll; }}
  }}
  tf_cluster_sync();  // every CTA's state is in its shared memory
  // merge the cluster's states through DSM: CTA `rank` finishes its share of the outputs
  const int per = (G * D + CLUSTER - 1) / CLUSTER;
  const int x_begin = rank * per, x_end = min(G * D, (int)(rank + 1) * per);
  // with several clusters per pair, this cluster's state goes to the workspace:
  // o [G][D], then m [G], then l [G], per (pair, split)
  float* part = partial + ((long)pair * n_splits + split) * SPLIT_FLOATS;
  for (int x = x_begin + threadIdx.x; x < x_end; x += blockDim.x) {{
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
    if (n_splits == 1) {{
      out[((long)b * H_ + hk * G + g) * D + e] = __float2bfloat16(oo / ll);
    }} else {{
      part[x] = oo;
      if (e == 0 || x == x_begin) {{ part[G * D + g] = mm; part[G * D + G + g] = ll; }}
    }}
  }}
"""


def _merge_splits() -> str:
    """With several clusters per pair: CTA ``rank`` of the cluster that arrives last for its
    share of the outputs merges that share of every cluster's state from the workspace, split by
    split as the rolling update merges blocks (``exp(m_old − m)``, ``exp(m_split − m)``), and
    writes it; the counter is left at 0. A thread keeps its ``EPT`` elements' states in
    registers, so each split costs one round trip to L2 for all of them (element by element,
    the merge's dependent loads had made short caches several times slower)."""
    return """  if (n_splits > 1) {
    __shared__ int last_flag;
    if (tf_arrived_last(arrivals + pair * CLUSTER + rank, n_splits, 1, WARPS * 32,
                        threadIdx.x == 0, &last_flag)) {
      // elements a thread merges at once (at most 8: their states stay in registers)
      constexpr int NEED = ((G * D + CLUSTER - 1) / CLUSTER + WARPS * 32 - 1) / (WARPS * 32);
      constexpr int EPT = NEED < 8 ? NEED : 8;
      const float* parts = partial + (long)pair * n_splits * SPLIT_FLOATS;
      for (int x0 = x_begin; x0 < x_end; x0 += EPT * WARPS * 32) {
        float mm[EPT], ll[EPT], oo[EPT];
        #pragma unroll
        for (int t = 0; t < EPT; ++t) { mm[t] = -INFINITY; ll[t] = 0.f; oo[t] = 0.f; }
        #pragma unroll 2
        for (int s = 0; s < n_splits; ++s) {
          const float* p = parts + s * SPLIT_FLOATS;
          #pragma unroll
          for (int t = 0; t < EPT; ++t) {
            const int x = x0 + threadIdx.x + t * WARPS * 32, g = x / D;
            if (x < x_end) {
              const float ms = __ldcg(p + G * D + g), ls = __ldcg(p + G * D + G + g),
                          os = __ldcg(p + x);
              const float m_new = fmaxf(mm[t], ms);
              if (m_new != -INFINITY) {   // a split with no keys adds nothing
                const float a = __expf(mm[t] - m_new), c = __expf(ms - m_new);
                ll[t] = ll[t] * a + ls * c; oo[t] = oo[t] * a + os * c; mm[t] = m_new;
              }
            }
          }
        }
        #pragma unroll
        for (int t = 0; t < EPT; ++t) {
          const int x = x0 + threadIdx.x + t * WARPS * 32, g = x / D, e = x % D;
          if (x < x_end)
            out[((long)b * H_ + hk * G + g) * D + e] = __float2bfloat16(oo[t] / ll[t]);
        }
      }
    }
  }
"""


def _key_split(plan) -> str:
    """The keys ``[j_begin, j_end)`` this CTA sweeps: its share of the pair's keys — all of
    them, or those between the plan's bounds (clamped into the key tensor: a bound past the
    keys given, or below 0, reads nothing outside them) — split in ``n_splits × CLUSTER``
    contiguous parts, the clusters of a pair taking consecutive ones."""
    lower, upper = bound_code(plan)
    part = "  const int share = split * CLUSTER + rank, parts = n_splits * CLUSTER;\n"
    if not lower and not upper:
        return part + """  const int chunk = (N_ + parts - 1) / parts;
  const int j_begin = share * chunk, j_end = min(N_, j_begin + chunk);
"""
    low = "0"
    for x in lower:
        low = f"max({low}, {x})"
    high = "N_"
    for x in upper:
        high = f"min({high}, {x})"
    return part + f"""  // the keys the mask keeps: its bounds on them, read once per (batch, kv-head)
  const int j_low = {low}, j_high = {high};
  const int chunk = (max(j_high - j_low, 0) + parts - 1) / parts;
  const int j_begin = j_low + share * chunk, j_end = min(j_high, j_begin + chunk);
"""


def _state_arrays(group: int, head_dim: int, warps: int, with_q: bool):
    """The shared-memory arrays after the key/value buffers, in order: (name, C++ shape, floats)."""
    G, D, W = group, head_dim, warps
    arrays = [("qs", f"[{D}][{G}]", D * G)] if with_q else []
    return arrays + [("warp_o", f"[{W}][{G}][{D}]", W * G * D), ("cta_o", f"[{G}][{D}]", G * D),
                     ("warp_m", f"[{W}][{G}]", W * G), ("warp_l", f"[{W}][{G}]", W * G),
                     ("cta_m", f"[{G}]", G), ("cta_l", f"[{G}]", G)]


def _carve(group: int, head_dim: int, warps: int, with_q: bool, barrier_stages: int = 0,
           over_buffers: bool = False) -> str:
    """C++ references that name the state arrays inside the dynamic shared memory (16-byte
    aligned: every array before the last ones is a multiple of 16 bytes), after the warps'
    copy barriers (``kv_bars``: ``barrier_stages`` a warp) where there are any; with
    ``over_buffers``, the warps' states ``warp_o`` over the key/value buffers instead
    (:func:`states_over_buffers`)."""
    lines, offset = [], 0
    if barrier_stages:
        lines.append("  unsigned long long* kv_bars = reinterpret_cast<unsigned long long*>(states);")
        offset = _barrier_bytes(warps, barrier_stages)
    for name, shape, floats in _state_arrays(group, head_dim, warps, with_q):
        if over_buffers and name == "warp_o":
            lines.append(f"  float (&{name}){shape} = *reinterpret_cast<float (*){shape}>(dsmem);"
                         "   // over the buffers, once every team has swept")
            continue
        lines.append(f"  float (&{name}){shape} = *reinterpret_cast<float (*){shape}>"
                     f"(states + {offset});")
        offset += 4 * floats
    return "\n".join(lines) + "\n"


def states_over_buffers(knobs, group: int) -> bool:
    """Whether the teams' states (``warp_o``, ``group × D`` floats a team) go over their key/value
    buffers (``stages`` blocks of 32 rows of ``2 D`` bf16 a team), which are dead once every team
    has swept: where teams share blocks (:func:`head_tiles`) and the states fit there — 64 heads
    over 2 stages then take 99 KB of shared memory, not 164."""
    return head_tiles(knobs, group) > 1 and group <= 32 * knobs.stages


def _barrier_bytes(warps: int, stages: int) -> int:
    """Bytes of the warps' copy barriers (8 a stage), rounded to 16 so that the state arrays after
    them stay aligned."""
    return (warps * stages * 8 + 15) // 16 * 16


def split_workspace(pairs: int, splits: int, group: int, head_dim: int, cluster: int) -> list:
    """The buffers of a launch with up to ``splits`` clusters per pair, as
    :class:`~tensorfuse.interop.StreamScratch` lays them out: each cluster's merged state
    (``o``, ``m``, ``l``: ``group × (head_dim + 2)`` floats) and a counter per pair and CTA rank,
    zeroed once (the last arrival leaves it at 0)."""
    return [((max(1, pairs * splits * group * (head_dim + 2)),), "f32", False),
            ((pairs * cluster,), "i32", True)]


def head_tiles(knobs, group: int) -> int:
    """Warps that share each block of keys: the group's 16-head ``mma.sync`` tiles on tensor cores
    (one warp a tile), 1 on CUDA cores (a warp takes every head)."""
    return -(-group // 16) if knobs.mma == "mma_sync" else 1


def sweepers(knobs, group: int) -> int:
    """Teams of warps sweeping their own blocks of keys (each a buffer of its own)."""
    return knobs.warps // head_tiles(knobs, group)


def decode_shared_bytes(knobs, head_dim: int, group: int) -> int:
    """Shared memory of the decode kernel (all dynamic): ``stages`` blocks of 32 key and value rows
    per warp, then the states the warps and the cluster merge (and q, for the CUDA-core path).
    ``cp.async`` skews key rows by 16 bytes (value rows too for the tensor-core path's
    ``ldmatrix``); ``tma`` keeps rows unpadded in the 128-byte swizzle, adds the warps' copy
    barriers and 1 KB to align the buffers (the swizzle's boxes start at 1 KB). A team of warps
    (:func:`head_tiles`) shares one buffer and one state."""
    teams = sweepers(knobs, group)
    states = _state_arrays(group, head_dim, teams, knobs.mma != "mma_sync")
    state_bytes = 4 * sum(f for name, _, f in states
                          if not (name == "warp_o" and states_over_buffers(knobs, group)))
    if knobs.copy == "tma":
        return (teams * knobs.stages * 32 * 4 * head_dim + 1024 + state_bytes +
                _barrier_bytes(teams, knobs.stages))
    row_bytes = (2 * head_dim + 8 + (8 if knobs.mma == "mma_sync" else 0)) * 2
    return teams * knobs.stages * 32 * row_bytes + state_bytes


# the kernel's static shared memory beside the dynamic, which the driver counts against a CTA's
# most: the split merge's flag in a section aligned as the dynamic buffers (1 KB with the bulk
# copies' boxes), and the 1 KB the GPU reserves — 1040 bytes with cp.async, 2048 with bulk copies
# (cuobjdump --dump-resource-usage of the sm_90a cubins)
STATIC_SHARED_BYTES = 2048


def decode_fits(knobs, head_dim: int, group: int, limit: int) -> bool:
    """Whether the decode kernel's dynamic and static shared memory fit ``limit`` bytes (the
    target's most for one CTA)."""
    return decode_shared_bytes(knobs, head_dim, group) + STATIC_SHARED_BYTES <= limit
