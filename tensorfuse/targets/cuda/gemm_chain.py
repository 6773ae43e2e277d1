"""GEMM chains ``Y = epilogue(Σ_n act(X·W1, X·W3, …)[i, n] · W2[n, o])`` over a thread-block cluster.

The plan (:func:`plan_gemm_chain`) reads the chain from the program: first-level sums over ``k`` of
``x[i, k] · w[k, n]`` sharing ``x`` (one for GELU, two for SwiGLU), an elementwise activation of
them over ``[i, n]``, a second sum over ``n`` of that activation times ``w2[n, o]``, and an
elementwise epilogue to the output. Anything else is refused with the reason and the user's line.

The kernel (:func:`gemm_chain_source`): the ``cluster`` CTAs of a cluster own ``block_m`` rows
and ``cluster × block_n`` neighbouring columns of the intermediate, ``block_n`` each. A CTA computes
its slice ``H = act(X·W1[:, slice])`` on tensor cores (``wgmma`` on sm_90a by default, body in
:mod:`.gemm_chain_wgmma`; or ``ldmatrix`` + ``mma.sync``, here) through a multi-stage copy pipeline
(cp.async, or TMA with wgmma) and keeps it, as bf16, in shared memory. Each CTA then computes
``O / cluster`` output columns of ``H · W2[cluster's rows, :]`` from the cluster's whole ``H``, with
W2 streamed through a second pipeline — the intermediate never goes to global memory. The cluster
shares ``H`` in one of two ways (``exchange``): ``"gather"`` stores each slice into every peer's
shared memory too (``mapa`` + ``st.shared::cluster``, one cluster barrier), so each CTA holds the
whole ``H``; ``"peer"`` (wgmma, the default) keeps only the CTA's own slice, stored in the order of
wgmma's register A fragments, and the second product loads each k-tile's fragments from the owning
peer (``ld.shared::cluster``) into registers — so a CTA's shared memory no longer limits the
cluster's columns, and larger clusters mean fewer partial sums between clusters. Clusters (which own
different intermediate columns) meet in f32 vector atomics; a small epilogue kernel converts the
f32 sums. Clusters are rasterized in groups of ``group_m`` row blocks so that concurrent CTAs share
weight slices in L2.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...algebra import inline_elementwise
from ...algebra.exprs import factors, nodes
from ...dsl.expr import Axis, Binary, Expr, Load, Ref
from ...dsl.program import Program
from ...errors import ScheduleError
from .dsm import HELPERS
from .expr import size_macros, to_cuda
from .mma_sync import HELPERS as MMA_SYNC_HELPERS

WARPS_N = 4  # warps along the columns; the rows get warps / 4
PRODUCER_THREADS = 128  # copy="producer": one warpgroup (setmaxnreg works per warpgroup)
EPILOGUE_VEC = 8        # outputs per thread of tf_chain_epilogue: its code is written for 8
                        # (two float4 loads, one 16-byte store); the launcher sizes the grid by it


@dataclass(frozen=True)
class GemmChainPlan:
    """What the kernel computes: ``x`` and the first-level weights (``gates``, in the order their
    sums appear), ``w2``, the activation (C++ over ``g0``, ``g1``, …), the epilogue (C++ over
    ``y``), the output's name, and the size names of the axes i, k, n, o."""

    x: str
    gates: tuple[str, ...]
    w2: str
    activation: str
    epilogue: str
    output: str
    dims: tuple[str, str, str, str]
    scalars: tuple[str, ...]
    axis: str


@dataclass(frozen=True)
class ClusterKnobs:
    """``block_m`` rows × ``block_n`` intermediate columns per CTA, ``block_k`` per pipeline stage
    (``stages`` deep), ``block_o`` output columns per tile of the second product, ``cluster`` CTAs
    per cluster, ``group_m`` row blocks per rasterization group, 8 or 16 ``warps`` per CTA, and
    the tensor-core instruction (``mma``: ``"wgmma"`` or ``"mma_sync"``), how tiles are copied
    to shared memory (``copy``: ``"cp_async"`` by every thread; ``"tma"``, wgmma only: bulk
    tensor copies completing on mbarriers, issued by a producer warp with the all-gather and by
    one consumer thread with peer reads; or ``"producer"``: a producer warpgroup issues every
    cp.async copy and, in the second product, copies each k-tile of H from the owning peer into
    the local pipeline, so the consumers only run wgmma on shared memory — wgmma with
    ``exchange="peer"`` only; on the H100 cp.async is the fastest of the three, RESULTS.md), and
    how the cluster shares H (``exchange``: ``"gather"``, every CTA stores its slice into every
    peer's shared memory, or ``"peer"``, every CTA keeps its slice and the second product reads it
    from the peers' shared memory — into registers as A fragments with cp.async or TMA, into the
    pipeline with the producer)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    block_o: int = 64
    stages: int = 3
    cluster: int = 2
    warps: int = 8
    ctas_per_sm: int = 1
    group_m: int = 8
    mma: str = "wgmma"
    copy: str = "cp_async"
    exchange: str = "gather"

    @property
    def threads(self) -> int:
        """Consumer warps, plus the producer warp that issues the TMA copies (all-gather) or the
        producer warpgroup that issues the cp.async copies."""
        extra = {"tma": 32 if self.exchange != "peer" else 0, "producer": PRODUCER_THREADS}
        return 32 * self.warps + extra.get(self.copy, 0)

    @property
    def warps_m(self) -> int:
        return self.warps // WARPS_N


def _is_axis(e: Expr, axis: Axis) -> bool:
    return isinstance(e, Axis) and e.uid == axis.uid


_IN_OUT = (" — weights stored [in, out]; torch.nn.Linear keeps its weight as [out, in], so "
           "declare it [in, out] and pass linear.weight.t().contiguous(), transposed once")


def _refuse(message: str, c) -> ScheduleError:
    return ScheduleError(f"cluster_distribute (GEMM chain): {message}", getattr(c, "loc", None))


def plan_gemm_chain(program: Program) -> GemmChainPlan:
    """The chain's pieces, or a :class:`ScheduleError` saying what does not fit the pattern."""
    outputs = [c for c in program.computes if c.is_output]
    if len(outputs) != 1:
        raise _refuse(f"{program.name} has {len(outputs)} outputs; one is supported", None)
    out = outputs[0]
    reductions = [c for c in program.computes if c.is_reduction]
    if any(c.monoid.name != "sum" for c in reductions):
        bad = next(c for c in reductions if c.monoid.name != "sum")
        keys = {a.uid for a in bad.over}
        chain = [c.name for c in reductions if {a.uid for a in c.over} == keys]
        hint = (f"; for attention decode, roll the chain over the keys first: rolling_update("
                f"{', '.join(map(repr, chain))}, axis={bad.over[0].name!r})"
                if bad.monoid.name in ("max", "logsumexp") and len(bad.over) == 1 else "")
        raise _refuse(f"{bad.name} is a {bad.monoid.name} reduction; GEMM chains are sums{hint}",
                      bad)
    second = [c for c in reductions if any(isinstance(n, Ref) and n.compute.is_reduction
                                           for n in nodes(inline_elementwise(c.bodies[0])))]
    first = [c for c in reductions if all(c is not r for r in second)]
    if len(second) != 1 or not first:
        raise _refuse(f"{program.name} is not act(X·W1)·W2: it needs first-level sums feeding one "
                      f"second sum (found {len(first)} and {len(second)})", out)
    r2 = second[0]
    if len(r2.over) != 1 or len(r2.axes) != 2:
        raise _refuse(f"{r2.name} must sum over one axis into [rows, columns] (batch "
                      "dimensions go into the rows: declare x as [M, K] and pass "
                      "x.reshape(-1, K))", r2)
    i_axis, o_axis = r2.axes
    n_axis = r2.over[0]
    # second sum: (activation over [i, n]) * w2[n, o]
    w2_loads = [f for f in factors(r2.bodies[0]) if isinstance(f, Load)
                and len(f.indices) == 2 and _is_axis(f.indices[0], n_axis)
                and _is_axis(f.indices[1], o_axis)]
    if len(w2_loads) != 1:
        raise _refuse(f"{r2.name} must multiply by a weight indexed [{n_axis.name}, "
                      f"{o_axis.name}]{_IN_OUT}", r2)
    w2 = w2_loads[0]
    act_factors = [f for f in factors(r2.bodies[0]) if f is not w2]
    act = inline_elementwise(act_factors[0])
    for f in act_factors[1:]:
        act = Binary("mul", act, inline_elementwise(f), "f32", f.loc)
    # first-level sums: x[i, k] * w[k, n], all with the same x
    x_name, gates = None, []
    for c in first:
        loads = factors(c.bodies[0])
        if len(c.over) != 1 or len(loads) != 2 or not all(isinstance(f, Load) for f in loads):
            raise _refuse(f"{c.name} must be sum(x[i, k] * w[k, n], over=k)", c)
        k = c.over[0]
        xs = [f for f in loads if _is_axis(f.indices[0], i_axis) and _is_axis(f.indices[-1], k)]
        ws = [f for f in loads if all(f is not x for x in xs) and len(f.indices) == 2
              and _is_axis(f.indices[0], k) and _is_axis(f.indices[1], n_axis)]
        if len(xs) != 1 or len(ws) != 1 or len(xs[0].indices) != 2:
            raise _refuse(f"{c.name} must be sum(x[{i_axis.name}, k] * w[k, {n_axis.name}], "
                          f"over=k){_IN_OUT}", c)
        if x_name not in (None, xs[0].param.name):
            raise _refuse(f"{c.name} reads {xs[0].param.name}, the others {x_name}; the "
                          "first-level products must share their left operand", c)
        x_name = xs[0].param.name
        gates.append((c.name, ws[0].param.name))
    for p in program.tensor_params:
        if p.dtype != "bf16":
            raise _refuse(f"{p.name} is {p.dtype}; the cluster GEMM chain takes bf16 tensors", None)
    if out.dtypes[0] != "bf16":
        raise _refuse(f"the output {out.name} is {out.dtypes[0]}; the cluster GEMM chain writes "
                      "bf16", out)
    refs = {name: f"g{idx}" for idx, (name, _) in enumerate(gates)}
    for n in nodes(act):
        if isinstance(n, (Load, Axis)) or \
                (isinstance(n, Ref) and n.compute.name not in refs):
            raise _refuse(f"the activation between the two sums may only use "
                          f"{', '.join(refs)} and constants", r2)
    activation = to_cuda(act, refs, "the activation")
    epi = out.bodies[0] if out is not r2 else Ref(r2)
    epilogue = to_cuda(inline_elementwise(epi),
                       {r2.name: "y"}, f"the output {out.name}")

    def dim(param_name: str, pos: int) -> str:
        p = next(p for p in program.tensor_params if p.name == param_name)
        return str(p.dims[pos])

    dims = (dim(x_name, 0), dim(x_name, 1), dim(gates[0][1], 1), dim(w2.param.name, 1))
    return GemmChainPlan(x_name, tuple(w for _, w in gates), w2.param.name, activation, epilogue,
                         out.name, dims, tuple(p.name for p in program.scalar_params),
                         n_axis.name)


def check_sizes(plan: GemmChainPlan, knobs: ClusterKnobs, M: int, K: int, N: int, O: int) -> None:
    """Refuse sizes the kernel cannot tile, saying which knob or size to change."""
    problems = []
    if K % knobs.block_k:
        problems.append(f"K={K} is not a multiple of block_k={knobs.block_k}")
    if N % (knobs.block_n * knobs.cluster):
        problems.append(f"N={N} is not a multiple of block_n×cluster={knobs.block_n}×"
                        f"{knobs.cluster}")
    if O % (knobs.block_o * knobs.cluster):
        problems.append(f"O={O} is not a multiple of block_o×cluster={knobs.block_o}×"
                        f"{knobs.cluster} (each CTA computes O/cluster output columns)")
    if (knobs.cluster * knobs.block_n) % knobs.block_k:
        problems.append(f"block_k={knobs.block_k} must divide cluster×block_n")
    if knobs.group_m < 1:
        problems.append(f"group_m={knobs.group_m} must be at least 1")
    if knobs.cluster not in (1, 2, 4, 8, 16):
        problems.append(f"cluster={knobs.cluster} is not 1, 2, 4, 8 or 16")
    if knobs.warps not in (8, 16):
        problems.append(f"warps={knobs.warps} is not 8 or 16")
    elif knobs.block_m % (16 * knobs.warps_m) or knobs.block_n % (16 * WARPS_N) or \
            knobs.block_o % (16 * WARPS_N) or knobs.block_k % 16:
        problems.append(f"block_m must be a multiple of {16 * knobs.warps_m}, block_n and block_o "
                        "of 64, block_k of 16")
    if knobs.mma not in ("wgmma", "mma_sync"):
        problems.append(f"mma={knobs.mma!r} is not 'wgmma' or 'mma_sync'")
    elif knobs.mma == "wgmma":
        if knobs.warps != 8 or knobs.block_m not in (64, 128):
            problems.append("wgmma runs two warpgroups (warps=8) over block_m 64 or 128 rows")
        elif knobs.block_k != 64 or (knobs.block_o * knobs.block_m // 128) % 64 or \
                (knobs.block_n * knobs.block_m // 128) % 64:
            problems.append("wgmma's swizzled tiles take block_k=64 and 64-column multiples per "
                            "warpgroup (block_n and block_o ≥ 128 when block_m=64)")
        elif knobs.block_n not in (64, 128, 256) or knobs.block_o not in (64, 128, 256):
            # one wgmma is at most 256 wide, and each thread's copy plan repeats every 8·k rows
            # only when a row of the tile is 8, 16 or 32 chunks of 16 bytes
            problems.append(f"wgmma takes block_n and block_o of 64, 128 or 256 (got "
                            f"{knobs.block_n} and {knobs.block_o})")
        if knobs.stages < 3:
            problems.append("wgmma keeps one k-tile's MMAs in flight: stages must be at least 3")
    if knobs.copy not in ("cp_async", "tma", "producer"):
        problems.append(f"copy={knobs.copy!r} is not 'cp_async', 'tma' or 'producer'")
    elif knobs.copy in ("tma", "producer") and knobs.mma != "wgmma":
        problems.append(f"copy={knobs.copy!r} lands swizzled tiles for wgmma: use mma='wgmma'")
    elif knobs.copy == "producer" and knobs.exchange != "peer":
        problems.append("copy='producer' copies each CTA's k-tiles of H from the peers: use "
                        "exchange='peer'")
    if knobs.exchange not in ("gather", "peer"):
        problems.append(f"exchange={knobs.exchange!r} is not 'gather' or 'peer'")
    elif knobs.exchange == "peer" and knobs.mma != "wgmma":
        problems.append("exchange='peer' reads H from the peers into wgmma's operands: use "
                        "mma='wgmma'")
    elif knobs.exchange == "peer" and knobs.copy != "producer" and \
            (knobs.cluster * knobs.block_n // knobs.block_k) % 2:
        problems.append("exchange='peer' double-buffers the A fragments by k-tile pairs: "
                        "cluster×block_n must be an even number of block_k tiles")
    if knobs.ctas_per_sm not in (1, 2):
        problems.append(f"ctas_per_sm={knobs.ctas_per_sm} is not 1 or 2")
    elif knobs.ctas_per_sm == 2 and knobs.mma == "wgmma":
        # two CTAs share the register file: 128 registers per thread, of which a warpgroup's f32
        # accumulators take (columns per warpgroup) / 2 — ptxas gives up beyond 64 of them
        wg_cols = 2 if knobs.block_m == 64 else 1   # warpgroups side by side along the columns
        acc = max(len(plan.gates) * knobs.block_n, knobs.block_o) // wg_cols // 2
        if knobs.copy == "producer":
            problems.append("copy='producer' runs three warpgroups per CTA: ctas_per_sm must be 1")
        elif acc > 64:
            problems.append(f"ctas_per_sm=2 leaves 128 registers per thread; {acc} f32 accumulators "
                            "per thread do not fit beside the operands: use block_o (and gates × "
                            "block_n) of at most 128 per warpgroup, or ctas_per_sm=1")
    if knobs.stages < 2:
        problems.append("stages must be at least 2")
    if problems:
        raise ScheduleError("cluster_distribute cannot tile this GEMM chain: " + "; ".join(problems))


def shared_bytes(plan: GemmChainPlan, knobs: ClusterKnobs) -> int:
    """Dynamic shared memory of ``tf_chain_main``: the cluster's H (kept from the end of the first
    product to the last output tile; peers write into it) — only this CTA's slice with
    ``exchange="peer"`` — plus the larger of the two pipelines."""
    g = len(plan.gates)
    bm, bn, bk, bo, st = (knobs.block_m, knobs.block_n, knobs.block_k, knobs.block_o,
                          knobs.stages)
    if knobs.mma == "wgmma":  # swizzled tiles: no padding, 1 KB to align them to 1024 bytes
        # "full" and "empty" mbarriers per slot: TMA's one ring, cp.async's two (stages, W2 tiles:
        # with the producer, each W2 slot also holds a k-tile of H)
        one_ring = knobs.copy == "tma" and knobs.exchange != "peer"
        slots = st if one_ring else st + wgmma_w2_stages(plan, knobs)
        barriers = 2 * slots * 8
        h_columns = bn if knobs.exchange == "peer" else knobs.cluster * bn
        return 1024 + bm * h_columns * 2 + wgmma_pipeline_bytes(plan, knobs) + barriers
    first = st * (bm * (bk + 8) * 2 + g * bk * (bn + 8) * 2)
    return bm * (knobs.cluster * bn + 8) * 2 + max(first, st * bk * (bo + 8) * 2)


def wgmma_pipeline_bytes(plan: GemmChainPlan, knobs: ClusterKnobs) -> int:
    """The wgmma path's pipeline buffers: the larger of the two products' stages (unpadded)."""
    bk, st = knobs.block_k, knobs.stages
    first = st * (knobs.block_m * bk * 2 + len(plan.gates) * bk * knobs.block_n * 2)
    # phase 2's ring: as many slots as phase 1's with cp.async; with the producer, whose slots
    # also hold H's k-tile, at least three (one under the MMAs in flight, one next, one filling)
    # and otherwise whatever phase 1's stages leave (``stages`` stays phase 1's depth)
    return max(first, (3 if knobs.copy == "producer" else st) * wgmma_w2_slot_bytes(knobs))


MAX_W2_STAGES = 8   # phase 2's cp.async ring: deeper only adds barriers


def wgmma_w2_slot_bytes(knobs: ClusterKnobs) -> int:
    """One slot of phase 2's ring: a BK × BO tile of W2 and, with the producer warpgroup, the
    BM × BK tile of H it copied from the owning peer."""
    a_tile = knobs.block_m * knobs.block_k * 2 if knobs.copy == "producer" else 0
    return knobs.block_k * knobs.block_o * 2 + a_tile


def wgmma_w2_stages(plan: GemmChainPlan, knobs: ClusterKnobs) -> int:
    """Slots of phase 2's cp.async ring: as many as the pipeline's bytes hold (phase 1's stages
    are larger for 128 × 256 tiles and SwiGLU's two weights, so W2 runs deeper)."""
    return min(wgmma_pipeline_bytes(plan, knobs) // wgmma_w2_slot_bytes(knobs), MAX_W2_STAGES)


def wgmma_lookahead(knobs: ClusterKnobs, M: int, w2_stages: int) -> tuple[int, int]:
    """How many k-tiles the wgmma kernel's copies run ahead of the one being multiplied, in phase
    1's ring and in W2's. A single row block (``M ≤ 2 × block_m``: each weight byte streamed once
    from DRAM) goes as deep as the rings allow (phase 2 at most 3 tiles). With many row blocks the
    weights are re-read from L2, and more than two tiles ahead per SM measured slower (SwiGLU
    M=1024/8192: 3 % with three; the bytes in flight crowd L2): two (RESULTS.md, "FFN v7")."""
    if M <= 2 * knobs.block_m:
        return knobs.stages - 1, min(3, w2_stages - 1)
    return min(2, knobs.stages - 1), 2


def gemm_chain_source(plan: GemmChainPlan, knobs: ClusterKnobs, M: int, K: int, N: int,
                      O: int) -> str:
    """CUDA C++ for ``tf_chain_main`` (adds into a zeroed f32 ``ysum``) and ``tf_chain_epilogue``.

    ``mma="wgmma"``: each warpgroup issues ``wgmma.mma_async`` m64nNk16 on descriptors of
    128-byte-swizzled shared-memory tiles (:mod:`.wgmma`), one k-tile's group in flight while the
    next is issued. ``mma="mma_sync"``: ``mma.sync.m16n8k16`` on fragments loaded with
    ``ldmatrix`` (``.trans`` for the weights, stored [in, out]); each warp owns a
    (block_m/(warps/4)) × (block_n/4) tile of the intermediate and a (block_m/(warps/4)) ×
    (block_o/4) tile of each output tile."""
    check_sizes(plan, knobs, M, K, N, O)
    if knobs.mma == "wgmma":
        from .gemm_chain_wgmma import wgmma_body

        body = wgmma_body(plan, knobs, M)
    else:
        body = _mma_sync_body(plan, knobs) + _MAIN
    return _header(plan, knobs, M, K, N, O) + body.replace("@GATE_ARGS@", "".join(
        f"const __nv_bfloat16* __restrict__ w{j}, " for j in range(len(plan.gates)))).replace(
        "@SCALAR_ARGS@", "".join(f", float {s}" for s in plan.scalars)).replace(
        "@GATES@", ", ".join(f"w{j}" for j in range(len(plan.gates)))).replace(
        "@MAPS_ARG@", ", const char* __restrict__ maps" if knobs.copy == "tma" else "").replace(
        "@BOUNDS@", f"__launch_bounds__({knobs.threads}, {knobs.ctas_per_sm})")


def _header(plan: GemmChainPlan, knobs: ClusterKnobs, M: int, K: int, N: int, O: int) -> str:
    """Sizes and knobs as macros, the DSM helpers, the f32 epilogue kernel and the rasterization
    both tensor-core paths share."""
    scalar_args = "".join(f", float {s}" for s in plan.scalars)
    return f"""#include <cuda_bf16.h>
{HELPERS}
{size_macros(dict(zip(plan.dims, (M, K, N, O))))}#define BM {knobs.block_m}
#define BN {knobs.block_n}
#define BK {knobs.block_k}
#define BO {knobs.block_o}
#define STAGES {knobs.stages}
#define CLUSTER {knobs.cluster}
#define GROUP_M {knobs.group_m}
#define G {len(plan.gates)}
#define M_ {M}
#define K_ {K}
#define N_ {N}
#define O_ {O}
#define HW (CLUSTER * BN)      // the cluster's intermediate columns: the second GEMM's depth
#define OC (O_ / CLUSTER)      // output columns per CTA

// The f32 sums through the epilogue into the bf16 output, EPILOGUE_VEC elements per thread (O is
// a multiple of 64): one element per thread took 7.5 µs at M=128 on the H100 (ncu), 7 % of the call.
#define EPILOGUE_VEC {EPILOGUE_VEC}
extern "C" __global__ void tf_chain_epilogue(const float* __restrict__ ysum,
                                             __nv_bfloat16* __restrict__ out{scalar_args}) {{
  const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * EPILOGUE_VEC;
  if (i >= (long)M_ * O_) return;
  const float4 lo = *reinterpret_cast<const float4*>(ysum + i);
  const float4 hi = *reinterpret_cast<const float4*>(ysum + i + 4);
  const float sums[EPILOGUE_VEC] = {{lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w}};
  unsigned packed[EPILOGUE_VEC / 2];
  #pragma unroll
  for (int e = 0; e < EPILOGUE_VEC; e += 2) {{
    float y = sums[e];
    const float first = {plan.epilogue};
    y = sums[e + 1];
    const __nv_bfloat162 pair = __floats2bfloat162_rn(first, {plan.epilogue});
    packed[e / 2] = *reinterpret_cast<const unsigned*>(&pair);
  }}
  *reinterpret_cast<uint4*>(out + i) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}}

// Adds one accumulator fragment to the clusters' f32 sums. Lanes l and l ^ 1 hold columns c, c + 1
// and c + 2, c + 3 of rows `row` and `row` + 8 (the mma.sync / wgmma layout): they swap halves so
// that the even lane adds row `row`'s four columns and the odd lane row `row` + 8's — one 16-byte
// vector atomic each instead of two 8-byte ones. Every lane of the warp must call it.
__device__ __forceinline__ void add_to_sums(float* __restrict__ ysum, int row, int col, float a0,
                                            float a1, float b0, float b1) {{
  const bool odd = threadIdx.x & 1;
  const float g0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
  const float g1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
  const int r = odd ? row + 8 : row;
  if (r < M_)
    atomicAdd(reinterpret_cast<float4*>(ysum + (long)r * O_ + (col & ~3)),
              odd ? make_float4(g0, g1, b0, b1) : make_float4(a0, a1, g0, g1));
}}

// This CTA's rows m0 and intermediate columns n0. Clusters are numbered in launch order and walk
// GROUP_M row blocks for each group of columns before moving on, so that the weight slices one
// wave reads are read again from L2 by the rows beside it, not from memory.
__device__ __forceinline__ void tile_of_cta(unsigned rank, int& m0, int& n0) {{
  const int ncl = gridDim.x / CLUSTER, per_group = GROUP_M * ncl;
  const int cid = blockIdx.y * ncl + blockIdx.x / CLUSTER;
  const int first = cid / per_group * GROUP_M, rows = min((int)gridDim.y - first, GROUP_M);
  const int in_group = cid % per_group;
  m0 = (first + in_group % rows) * BM;
  n0 = ((in_group / rows) * CLUSTER + rank) * BN;
}}
"""


def _mma_sync_body(plan: GemmChainPlan, knobs: ClusterKnobs) -> str:
    """The mma.sync path's device functions: fragments and MMA, the first product's pipeline and
    the activation into shared memory."""
    wm_rows, wn_cols, wo_cols = (knobs.block_m // knobs.warps_m, knobs.block_n // WARPS_N,
                                 knobs.block_o // WARPS_N)
    gate_values = "".join(f"float g{j} = acc[{j}][i][k][2 * half + e]; "
                          for j in range(len(plan.gates)))
    return f"""#define WM {wm_rows}
#define WN {wn_cols}
#define WO {wo_cols}
#define MI {wm_rows // 16}
#define NI {wn_cols // 8}
#define NI2 {wo_cols // 8}
#define WARPS_N {WARPS_N}
#define LDX (BK + 8)
#define LDW (BN + 8)
#define LDW2 (BO + 8)

{MMA_SYNC_HELPERS}
// One k16 step of a warp tile: A rows from a row-major [rows][lda] tile, B from a row-major
// [k][ldb] tile (ldmatrix.trans gives the column operand), ACC[MI][NT][4] += A · B.
template <int NT>
__device__ __forceinline__ void warp_mma_k16(float (&acc)[MI][NT][4], const __nv_bfloat16* a,
    int lda, const __nv_bfloat16* b, int ldb, int lane) {{
  unsigned af[MI][4];
  #pragma unroll
  for (int i = 0; i < MI; ++i) ldsm_x4(af[i], a + (i * 16 + lane % 16) * lda + (lane / 16) * 8);
  #pragma unroll
  for (int jn = 0; jn < NT / 2; ++jn) {{
    unsigned bf[4];
    ldsm_x4_t(bf, b + (lane % 8 + ((lane / 8) % 2) * 8) * ldb + jn * 16 + (lane / 16) * 8);
    #pragma unroll
    for (int i = 0; i < MI; ++i) {{
      mma16816(acc[i][2 * jn], af[i], bf[0], bf[1]);
      mma16816(acc[i][2 * jn + 1], af[i], bf[2], bf[3]);
    }}
  }}
}}
template <int A, int B>
__device__ __forceinline__ void zero(float (&acc)[A][B][4]) {{
  #pragma unroll
  for (int i = 0; i < A; ++i)
    #pragma unroll
    for (int j = 0; j < B; ++j)
      #pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}}

// Loads one pipeline stage: x rows [m0, m0 + BM) × k [k0, k0 + BK), and each gate weight's
// k rows × this CTA's BN intermediate columns.
__device__ __forceinline__ void load_stage(char* stage, const __nv_bfloat16* __restrict__ x,
    const __nv_bfloat16* const* ws, int m0, int n0, int k0) {{
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(stage);
  for (int c = threadIdx.x; c < BM * BK / 8; c += blockDim.x) {{
    int r = c / (BK / 8), col = (c % (BK / 8)) * 8;
    bool ok = m0 + r < M_;
    tf_cp_async16(xs + r * LDX + col, x + (long)(ok ? m0 + r : 0) * K_ + k0 + col, ok);
  }}
  #pragma unroll
  for (int j = 0; j < G; ++j) {{
    __nv_bfloat16* wsm = xs + BM * LDX + j * BK * LDW;
    for (int c = threadIdx.x; c < BK * BN / 8; c += blockDim.x) {{
      int r = c / (BN / 8), col = (c % (BN / 8)) * 8;
      tf_cp_async16(wsm + r * LDW + col, ws[j] + (long)(k0 + r) * N_ + n0 + col, true);
    }}
  }}
}}

// BK rows (from n0) × BO columns (from o0) of W2 into a [BK][LDW2] tile.
__device__ __forceinline__ void load_w2(__nv_bfloat16* dst, const __nv_bfloat16* __restrict__ w2,
                                        int n0, int o0) {{
  for (int c = threadIdx.x; c < BK * BO / 8; c += blockDim.x) {{
    int r = c / (BO / 8), col = (c % (BO / 8)) * 8;
    tf_cp_async16(dst + r * LDW2 + col, w2 + (long)(n0 + r) * O_ + o0 + col, true);
  }}
}}

// Phase 1: acc[j] = x[m0 : m0 + BM] · w_j[:, n0 : n0 + BN] on tensor cores, through a
// STAGES-deep cp.async pipeline in `pipe`; on return the pipeline buffers are free.
__device__ __forceinline__ void first_products(float (&acc)[G][MI][NI][4], char* pipe,
    const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* const* ws, int m0, int n0, int wm,
    int wn, int lane) {{
  const int stage_bytes = BM * LDX * 2 + G * BK * LDW * 2;
  #pragma unroll
  for (int j = 0; j < G; ++j) zero(acc[j]);
  const int KT = K_ / BK;
  #pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {{
    if (s < KT) load_stage(pipe + s * stage_bytes, x, ws, m0, n0, s * BK);
    tf_cp_async_commit();
  }}
  for (int kt = 0; kt < KT; ++kt) {{
    tf_cp_async_wait<STAGES - 2>();
    __syncthreads();
    int next = kt + STAGES - 1;
    if (next < KT) load_stage(pipe + (next % STAGES) * stage_bytes, x, ws, m0, n0, next * BK);
    tf_cp_async_commit();
    const __nv_bfloat16* xs = reinterpret_cast<const __nv_bfloat16*>(pipe + (kt % STAGES) * stage_bytes);
    #pragma unroll
    for (int kk = 0; kk < BK; kk += 16)
      #pragma unroll
      for (int j = 0; j < G; ++j)
        warp_mma_k16<NI>(acc[j], xs + wm * WM * LDX + kk, LDX,
                         xs + BM * LDX + j * BK * LDW + kk * LDW + wn * WN, LDW, lane);
  }}
  tf_cp_async_wait<0>();
  __syncthreads();
}}

// The activation, elementwise on the accumulators, into hs[row][col0 + col] as bf16.
__device__ __forceinline__ void store_activation(const float (&acc)[G][MI][NI][4],
    __nv_bfloat16* hs, int ldh, int col0, int wm, int wn, int lane) {{
  const int gr = lane / 4, tq = lane % 4;
  #pragma unroll
  for (int i = 0; i < MI; ++i)
    #pragma unroll
    for (int k = 0; k < NI; ++k)
      #pragma unroll
      for (int half = 0; half < 2; ++half) {{
        float h[2];
        #pragma unroll
        for (int e = 0; e < 2; ++e) {{
          {gate_values}
          h[e] = {plan.activation};
        }}
        const int row = wm * WM + i * 16 + gr + 8 * half, col = col0 + wn * WN + k * 8 + 2 * tq;
        *reinterpret_cast<__nv_bfloat162*>(hs + row * ldh + col) = __floats2bfloat162_rn(h[0], h[1]);
      }}
}}
"""


# H all-gathered through DSM, each CTA computing its share of the outputs.
_MAIN = r"""
#define LDHF (HW + 8)

extern "C" __global__ void @BOUNDS@
tf_chain_main(const __nv_bfloat16* __restrict__ x, @GATE_ARGS@const __nv_bfloat16* __restrict__ w2,
              float* __restrict__ ysum@SCALAR_ARGS@) {
  extern __shared__ __align__(128) char smem[];
  tf_cluster_arrive();  // this CTA has started; after the matching wait peers may write into it
  const __nv_bfloat16* ws[G] = {@GATES@};
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int gr = lane / 4, tq = lane % 4;
  const unsigned rank = tf_cluster_rank();
  int m0, n0;
  tile_of_cta(rank, m0, n0);
  __nv_bfloat16* hf = reinterpret_cast<__nv_bfloat16*>(smem);  // H of the cluster: BM × HW
  char* pipe = smem + BM * LDHF * 2;

  float acc[G][MI][NI][4];
  first_products(acc, pipe, x, ws, m0, n0, wm, wn, lane);
  store_activation(acc, hf, LDHF, rank * BN, wm, wn, lane);
  __syncthreads();
  tf_cluster_wait();    // every peer has started
  // All-gather: this CTA's slice of H into each peer's copy (16-byte DSM stores).
  for (int p = 1; p < CLUSTER; ++p) {
    const unsigned peer = (rank + p) % CLUSTER;
    for (int c = threadIdx.x; c < BM * BN / 8; c += blockDim.x) {
      const __nv_bfloat16* src = hf + (c / (BN / 8)) * LDHF + rank * BN + (c % (BN / 8)) * 8;
      tf_st_dsm_v4(tf_mapa(tf_smem_addr(src), peer), *reinterpret_cast<const uint4*>(src));
    }
  }
  tf_cluster_arrive();  // release: our stores are seen by each peer after its wait

  // Phase 2: ysum[m0 rows, this CTA's OC columns] += H · W2[cluster rows, OC columns], W2 through
  // a STAGES-deep pipeline of BK × BO tiles, BO columns at a time.
  const int nc = n0 - (int)rank * BN, o_base = rank * OC;
  const int KS = HW / BK, T = (OC / BO) * KS;
  __nv_bfloat16* w2p = reinterpret_cast<__nv_bfloat16*>(pipe);
  #pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < T) load_w2(w2p + s * BK * LDW2, w2, nc + (s % KS) * BK, o_base + (s / KS) * BO);
    tf_cp_async_commit();
  }
  tf_cluster_wait();    // acquire: every slice of H is in place
  float acc2[MI][NI2][4];
  zero(acc2);
  for (int it = 0; it < T; ++it) {
    tf_cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int next = it + STAGES - 1;
    if (next < T)
      load_w2(w2p + (next % STAGES) * BK * LDW2, w2, nc + (next % KS) * BK,
                  o_base + (next / KS) * BO);
    tf_cp_async_commit();
    const int ks = it % KS;
    const __nv_bfloat16* w2s = w2p + (it % STAGES) * BK * LDW2;
    #pragma unroll
    for (int kk = 0; kk < BK; kk += 16)
      warp_mma_k16<NI2>(acc2, hf + wm * WM * LDHF + ks * BK + kk, LDHF, w2s + kk * LDW2 + wn * WO,
                        LDW2, lane);
    if (ks == KS - 1) {   // this output tile is complete: add it to the other clusters' sums
      const int o0 = o_base + (it / KS) * BO + wn * WO + 2 * tq;
      #pragma unroll
      for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int k = 0; k < NI2; ++k)
          add_to_sums(ysum, m0 + wm * WM + i * 16 + gr, o0 + k * 8, acc2[i][k][0], acc2[i][k][1],
                      acc2[i][k][2], acc2[i][k][3]);
      zero(acc2);
    }
  }
}
"""
