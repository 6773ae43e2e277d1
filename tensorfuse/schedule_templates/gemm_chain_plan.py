"""The GEMM-chain template plan: ``Y = epilogue(Σ_n act(X·W1, X·W3, …)[i, n] · W2[n, o])`` over a
thread-block cluster (``cluster_distribute``), as data.

:func:`plan_gemm_chain` reads the chain from the program: first-level sums over ``k`` of
``x[i, k] · w[k, n]`` sharing ``x`` (one for GELU, two for SwiGLU), an elementwise activation of
them over ``[i, n]``, a second sum over ``n`` of that activation times ``w2[n, o]``, and an
elementwise epilogue to the output; anything else is refused with the reason and the user's line.
:class:`ClusterKnobs` are the tiles, pipeline, cluster and instruction choices; :func:`check_sizes`
refuses what the kernel cannot tile; :func:`shared_bytes` and the ``wgmma_*`` functions size the
pipelines (:func:`wgmma_layout` hands them to the emitter). The CUDA C++ is written by
:mod:`tensorfuse.targets.cuda.gemm_chain` from the plan, the knobs and the layout.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra import inline_elementwise
from ..algebra.exprs import factors, nodes
from ..dsl.expr import Axis, Binary, Expr, Load, Ref
from ..dsl.printer import to_text
from ..dsl.program import Program
from ..errors import ScheduleError
from ..targets.cuda.expr import to_cuda
from ..targets.cuda.gemm_chain import WARPS_N
from ..targets.cuda.gemm_chain_wgmma import PRODUCER_THREADS


@dataclass(frozen=True)
class GemmChainPlan:
    """What the kernel computes: ``x`` and the first-level weights (``gates``, in the order their
    sums appear), ``w2``, the activation (an expression of the first-level sums), the epilogue
    (an expression of the second sum), the output's name, and the size names of the axes i, k, n,
    o."""

    x: str
    gates: tuple[str, ...]
    w2: str
    activation: Expr
    epilogue: Expr
    output: str
    dims: tuple[str, str, str, str]
    scalars: tuple[str, ...]
    axis: str
    gate_sums: tuple[str, ...]   # the first-level sums the activation reads (as g0, g1, …)
    second: str                  # the second sum, which the epilogue reads (as y)
    gates_k_major: bool = False  # the first-level weights stored [N, K] (nn.Linear's [out, in])
    w2_k_major: bool = False     # w2 stored [O, N]
    # the wgmma body's parts by role (``targets/cuda/parts``; ``mma="wgmma"``)
    parts: tuple[tuple[str, str], ...] = (
        ("load", "cp_async_tma_or_producer"), ("pipeline", "mbarrier_rings"),
        ("mainloop", "wgmma_two_products"), ("epilogue", "activation_exchange_atomic_sums"))

    def describe(self) -> str:
        i, k, n, o = self.dims
        return "\n".join([
            f"GEMM-chain plan: {self.output}[{i}, {o}] from {self.x}[{i}, {k}] and "
            f"{', '.join(self.gates)}[{k}, {n}], {self.w2}[{n}, {o}]",
            f"  first products: {', '.join(self.gate_sums)} (tensor cores), kept in shared memory",
            f"  activation over [{i}, {n}]: {to_text(self.activation)}",
            f"  second product over {self.axis} (split across the cluster), epilogue: "
            f"{to_text(self.epilogue)}"])


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
    ``exchange="peer"`` only; on the H100 cp.async is the fastest of the three:
    ``benchmarks.cluster``), and
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


_IN_OUT = (" — weights stored [in, out], or [out, in] as torch.nn.Linear keeps them (the Hopper "
           "FFN reads either as stored; the cluster template needs [in, out])")


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
                and len(f.indices) == 2 and
                ((_is_axis(f.indices[0], n_axis) and _is_axis(f.indices[1], o_axis)) or
                 (_is_axis(f.indices[0], o_axis) and _is_axis(f.indices[1], n_axis)))]
    if len(w2_loads) != 1:
        raise _refuse(f"{r2.name} must multiply by a weight indexed [{n_axis.name}, "
                      f"{o_axis.name}]{_IN_OUT}", r2)
    w2 = w2_loads[0]
    w2_k_major = _is_axis(w2.indices[0], o_axis)
    act_factors = [f for f in factors(r2.bodies[0]) if f is not w2]
    act = inline_elementwise(act_factors[0])
    for f in act_factors[1:]:
        act = Binary("mul", act, inline_elementwise(f), "f32", f.loc)
    # first-level sums: x[i, k] * w[k, n], all with the same x
    x_name, gates, layouts = None, [], set()
    for c in first:
        loads = factors(c.bodies[0])
        if len(c.over) != 1 or len(loads) != 2 or not all(isinstance(f, Load) for f in loads):
            raise _refuse(f"{c.name} must be sum(x[i, k] * w[k, n], over=k)", c)
        k = c.over[0]
        xs = [f for f in loads if _is_axis(f.indices[0], i_axis) and _is_axis(f.indices[-1], k)]
        ws = [f for f in loads if all(f is not x for x in xs) and len(f.indices) == 2
              and ((_is_axis(f.indices[0], k) and _is_axis(f.indices[1], n_axis))
                   or (_is_axis(f.indices[0], n_axis) and _is_axis(f.indices[1], k)))]
        if len(xs) != 1 or len(ws) != 1 or len(xs[0].indices) != 2:
            raise _refuse(f"{c.name} must be sum(x[{i_axis.name}, k] * w[k, {n_axis.name}], "
                          f"over=k){_IN_OUT}", c)
        if x_name not in (None, xs[0].param.name):
            raise _refuse(f"{c.name} reads {xs[0].param.name}, the others {x_name}; the "
                          "first-level products must share their left operand", c)
        x_name = xs[0].param.name
        gates.append((c.name, ws[0].param.name))
        layouts.add(_is_axis(ws[0].indices[0], n_axis))
    if len(layouts) > 1:
        raise _refuse("the first-level weights are stored in different layouts ([in, out] and "
                      "[out, in]); store them alike", out)
    gates_k_major = layouts.pop()
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
    to_cuda(act, refs, "the activation")  # refused now if the emitter cannot write it
    epi = out.bodies[0] if out is not r2 else Ref(r2)
    epilogue = inline_elementwise(epi)
    to_cuda(epilogue, {r2.name: "y"}, f"the output {out.name}")

    def dim(param_name: str, pos: int) -> str:
        p = next(p for p in program.tensor_params if p.name == param_name)
        return str(p.dims[pos])

    dims = (dim(x_name, 0), dim(x_name, 1), dim(gates[0][1], 0 if gates_k_major else 1),
            dim(w2.param.name, 0 if w2_k_major else 1))
    return GemmChainPlan(x_name, tuple(w for _, w in gates), w2.param.name, act, epilogue,
                         out.name, dims, tuple(p.name for p in program.scalar_params),
                         n_axis.name, tuple(name for name, _ in gates), r2.name,
                         gates_k_major, w2_k_major)


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
    M=1024/8192: 3 % with three; the bytes in flight crowd L2): two (``benchmarks.cluster``)."""
    if M <= 2 * knobs.block_m:
        return knobs.stages - 1, min(3, w2_stages - 1)
    return min(2, knobs.stages - 1), 2


@dataclass(frozen=True)
class WgmmaLayout:
    """The wgmma kernel's pipeline geometry for one set of knobs and rows: the pipeline's bytes
    (``stages`` slots of the larger stage), a W2 slot's bytes and phase 2's ring depth, and how
    many k-tiles each ring's copies run ahead (:func:`wgmma_lookahead`)."""

    pipe_bytes: int
    w2_slot_bytes: int
    w2_stages: int
    ahead1: int
    ahead2: int


def wgmma_layout(plan: GemmChainPlan, knobs: ClusterKnobs, M: int) -> WgmmaLayout:
    w2_stages = wgmma_w2_stages(plan, knobs)
    return WgmmaLayout(wgmma_pipeline_bytes(plan, knobs), wgmma_w2_slot_bytes(knobs), w2_stages,
                       *wgmma_lookahead(knobs, M, w2_stages))
