"""The Hopper GEMM plan: ``out[i, j] = epilogue(Σ_k a[i, k] · w_g[k, j], …)`` as one persistent,
warp-specialised sm_90a kernel (the CUDA C++: :mod:`tensorfuse.targets.cuda.hopper_gemm`), or one
per index of a batch axis ``z`` (``out[z, i, j]``, ``torch.bmm``; several, ``[B, H, ·, ·]``,
walked as one index): either operand may carry it (``a[z, i, k]``, ``w[z, k, j]``), the other is
shared by every batch.

:func:`plan_hopper_gemm` reads the pattern from a program: one or two sums over the same axis
``k`` into ``[i, j]``, each the product of the shared rows ``a[i, k]`` and a weight indexed
``[k, j]`` (stored ``[K, N]``) or ``[j, k]`` (``torch.nn.Linear``'s ``[N, K]``, read as it is,
without a copy), and an elementwise output of those sums — a plain GEMM, a GEMM with bias and
activation, or a gated pair such as SwiGLU's ``silu(x·w1) ⊙ (x·w3)``. Anything else is refused
with the reason. :class:`GemmKnobs` are the tile width, the pipeline depth, the cluster (TMA
multicast of the weight tiles) and the rasterisation group; :func:`default_gemm_knobs` picks them
for the sizes and the GPU's SM count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..algebra import inline_elementwise
from ..algebra.exprs import factors, nodes
from ..dsl.expr import Axis, Expr, Load, Ref
from ..dsl.printer import to_text
from ..dsl.program import Program
from ..errors import ScheduleError
from ..targets.cuda.hopper_gemm import epilogue_code
from ..targets.cuda.wgmma import launch_registers, setmaxnreg_share

WHO = "hopper GEMM"
BLOCK_K = 64
MAX_SHARED = 232448          # bytes of dynamic shared memory per CTA on sm_90
KNOBS = ("block_n", "stages", "cluster", "group_m", "consumers", "multicast", "epilogue",
         "split_tail", "weights_l2", "pace")


@dataclass(frozen=True)
class GemmKnobs:
    """Output tiles of ``64·consumers × block_n`` (``consumers`` warpgroups of 64 rows; ``block_n``
    64–256: a multiple of 64 for weights stored ``[K, N]``, of 16 for ``[N, K]``), k-blocks of 64
    through a ring of ``stages`` slots, ``cluster`` CTAs sharing each weight tile by TMA multicast
    (1 or 2; ``multicast="split"``: each CTA copies half of the tile into both, ``"leader"``: the
    first CTA copies all of it), ``group_m`` row units (a cluster's tiles) per rasterisation group
    (:func:`group_rows`), and how the output leaves (``epilogue``: ``"direct"`` 4-byte stores from
    the accumulator fragments, or ``"staged"``: 64 columns at a time through shared memory and
    16-byte coalesced stores; 16-bit outputs), and whether a last wave that would leave most CTAs
    idle has its tiles split along K (``split_tail``); ``weights_l2``: the L2 policy of the weights'
    copies (``"normal"``, or ``"evict_first"``: weights read once — the rows fit one tile — leave L2
    to the data around them); ``pace``: a CTA's producer issues at most this many k-blocks more than
    the grid's average (0: off), so that the CTAs read the weights' k-blocks together."""

    block_n: int = 256
    stages: int = 4
    cluster: int = 1
    group_m: int = 8
    consumers: int = 2
    multicast: str = "split"
    epilogue: str = "direct"
    split_tail: bool = True
    weights_l2: str = "normal"
    pace: int = 0

    @property
    def block_m(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)   # a producer warpgroup and the consumers

    @property
    def producer_registers(self) -> int:
        return 24 if self.consumers > 2 else 40

    @property
    def consumer_registers(self) -> int:
        """Registers per consumer thread after ``setmaxnreg`` (at most 240)."""
        return setmaxnreg_share(self.threads, self.consumers, self.producer_registers)

    def __str__(self) -> str:
        return (f"block_m={self.block_m}, block_n={self.block_n}, stages={self.stages}, "
                f"cluster={self.cluster}" + (f" ({self.multicast} multicast)"
                                             if self.cluster > 1 else "")
                + f", group_m={self.group_m}"
                + (", staged epilogue" if self.epilogue == "staged" else "")
                + (f", weights L2 {self.weights_l2}" if self.weights_l2 != "normal" else "")
                + (f", pace={self.pace}" if self.pace else ""))


@dataclass(frozen=True)
class HopperGemmPlan:
    """The rows operand ``a``, the weights (one per sum, in the order of ``sums``), whether they
    are stored ``[N, K]`` (``b_k_major``), the output's expression of the sums, its name and
    dtype, the size names (M, K, N), the output's axis names (i, j), and the tensors and scalars
    the epilogue reads."""

    a: str
    weights: tuple[str, ...]
    b_k_major: bool
    sums: tuple[str, ...]
    epilogue: Expr
    output: str
    out_dtype: str
    dtype: str
    dims: tuple[str, str, str]
    axes: tuple[str, str]
    tensors: tuple[tuple[str, str], ...]
    scalars: tuple[tuple[str, str], ...]
    # batch axes (a product per batch index, ``torch.bmm``; several — ``[B, H, ·, ·]`` — walked
    # as one, row-major): (name, size name) each, outermost first, and which operands they index
    # (the other one is shared by every batch)
    batch: tuple[tuple[str, str], ...] = ()
    a_batched: bool = False
    weights_batched: bool = False
    tensor_dims: tuple = ()           # the dims of each of ``tensors``
    wide: frozenset = frozenset()     # of those, the ones read at 64-bit offsets at the sizes
    # the rows operand stored [K, M] (``a[k, i]``: a weight gradient's x^T, x passed as x.t()),
    # read as M-major tiles (wgmma's transposed A) rather than K-major rows
    a_k_major: bool = True
    # the emitter's parts by role (``targets/cuda/parts``)
    parts: tuple[tuple[str, str], ...] = (
        ("scheduler", "grouped_persistent_tiles"), ("load", "tma_multicast"),
        ("pipeline", "warp_specialized_ring"), ("mainloop", "wgmma_from_shared"),
        ("epilogue", "register_or_staged_store"))

    def describe(self, knobs: GemmKnobs | None = None) -> str:
        m, k, n = self.dims
        z = "".join(f"{size}, " for _, size in self.batch)
        zw = z if self.weights_batched else ""
        layout = f"[{zw}{n}, {k}] (K-major, as nn.Linear)" if self.b_k_major else \
            f"[{zw}{k}, {n}]"
        rows = f"{m}, {k}]" if self.a_k_major else f"{k}, {m}] (M-major)"
        lines = [f"hopper GEMM plan: {self.output}[{z}{m}, {n}] ({self.out_dtype}) from "
                 f"{self.a}[{z if self.a_batched else ''}{rows} and "
                 f"{', '.join(self.weights)} {layout} ({self.dtype})",
                 f"  sums: {', '.join(self.sums)} over {k} (wgmma, f32 accumulators)",
                 f"  epilogue: {to_text(self.epilogue)}",
                 "  persistent CTAs: a TMA producer warp, consumer warpgroups of 64 rows"]
        if knobs is not None:
            lines.append(f"  knobs: {knobs}")
        return "\n".join(lines)


def _refuse(message: str, where=None) -> ScheduleError:
    """The refusal, at the user's line of ``where`` (a compute) where there is one."""
    return ScheduleError(f"{WHO}: {message}", getattr(where, "loc", None))


def _is_axis(e: Expr, axis: Axis) -> bool:
    return isinstance(e, Axis) and e.uid == axis.uid


def _indexed(load: Load, batch: tuple[Axis, ...], axes: tuple[Axis, Axis]) -> bool:
    """Whether ``load`` is indexed ``[axes]``, or ``[*batch, axes]``."""
    wanted = [batch + axes, axes] if batch else [axes]
    return any(len(load.indices) == len(w) and all(_is_axis(x, y) for x, y in
                                                   zip(load.indices, w)) for w in wanted)


def plan_hopper_gemm(program: Program) -> HopperGemmPlan:
    """The GEMM's pieces, or a :class:`ScheduleError` saying what does not fit the pattern."""
    outputs = [c for c in program.computes if c.is_output]
    if len(outputs) != 1:
        raise _refuse(f"{program.name} has {len(outputs)} outputs; one is supported")
    out = outputs[0]
    sums = [c for c in program.computes if c.is_reduction]
    if not 1 <= len(sums) <= 2:
        raise _refuse(f"{program.name} has {len(sums)} reductions; the GEMM template takes one "
                      "or two sums over the same axis", out)
    first = sums[0]
    for c in sums:
        if c.monoid.name != "sum":
            raise _refuse(f"{c.name} is a {c.monoid.name} reduction; the GEMM template takes "
                          "sums of products", c)
        if len(c.over) != 1 or len(c.axes) < 2:
            raise _refuse(f"{c.name} is not a sum over one axis into [rows, columns] or "
                          "[batch…, rows, columns]", c)
    k_axis = first.over[0]
    z_axes = tuple(first.axes[:-2])
    i_axis, j_axis = first.axes[-2:]
    a_name, weights, k_major, batched, a_major = None, [], set(), set(), set()
    for c in sums:
        if c.over[0].uid != k_axis.uid or len(c.axes) != len(first.axes) or \
                not all(_is_axis(x, y) for x, y in zip(c.axes, first.axes)):
            raise _refuse(f"{c.name} sums over another axis or into other axes than "
                          f"{first.name}", c)
        loads = factors(c.bodies[0])
        z = "".join(f"{a.name}, " for a in z_axes)
        if len(loads) != 2 or not all(isinstance(f, Load) for f in loads):
            raise _refuse(f"{c.name} must be sum(a[{z}{i_axis.name}, {k_axis.name}] * "
                          f"w[{z}{k_axis.name}, {j_axis.name}], over={k_axis.name})", c)
        rows = [f for f in loads if _indexed(f, z_axes, (i_axis, k_axis))]
        a_major.add(bool(rows))
        rows = rows or [f for f in loads if _indexed(f, z_axes, (k_axis, i_axis))]
        if len(rows) != 1:
            raise _refuse(f"{c.name}: one factor must be indexed [{z}{i_axis.name}, "
                          f"{k_axis.name}] or [{z}{k_axis.name}, {i_axis.name}] (the rows)", c)
        w = next(f for f in loads if f is not rows[0])
        if _indexed(w, z_axes, (k_axis, j_axis)):
            k_major.add(False)
        elif _indexed(w, z_axes, (j_axis, k_axis)):
            k_major.add(True)
        else:
            raise _refuse(f"{c.name}: the weight {w.param.name} must be indexed "
                          f"[{z}{k_axis.name}, {j_axis.name}] or [{z}{j_axis.name}, "
                          f"{k_axis.name}]", c)
        batched.add((len(rows[0].indices) > 2, len(w.indices) > 2))
        if a_name not in (None, rows[0].param.name):
            raise _refuse(f"{c.name} reads {rows[0].param.name}, {first.name} reads {a_name}; "
                          "the sums must share their rows operand", c)
        a_name = rows[0].param.name
        weights.append(w.param.name)
    if len(k_major) > 1:
        raise _refuse("the weights are stored in different layouts ([K, N] and [N, K]); store "
                      "them alike", out)
    b_k_major = k_major.pop()
    if len(a_major) > 1:
        raise _refuse("the sums read their rows operand in different layouts", out)
    a_k_major = a_major.pop()
    a_batched, weights_batched = batched.pop() if len(batched) == 1 else (None, None)
    if a_batched is None:
        raise _refuse("the weights differ in whether they have the batch axis; index them alike",
                      out)
    params = {p.name: p for p in program.tensor_params}
    dtypes = {params[n].dtype for n in [a_name, *weights]}
    if len(dtypes) != 1 or not dtypes <= {"bf16", "f16"}:
        raise _refuse(f"the operands are {', '.join(sorted(dtypes))}; the tensor cores take "
                      "bf16 or f16, the same for all operands", out)
    if out.dtypes[0] not in ("bf16", "f16", "f32"):
        raise _refuse(f"the output {out.name} is {out.dtypes[0]}; it can be bf16, f16 or f32",
                      out)
    if len(out.axes) != len(first.axes) or \
            not all(_is_axis(x, y) for x, y in zip(out.axes, first.axes)):
        raise _refuse(f"the output {out.name} must be indexed "
                      f"[{', '.join(a.name for a in first.axes)}] like the sums", out)
    epilogue = inline_elementwise(out.bodies[0]) if out not in sums else Ref(out)
    names = tuple(c.name for c in sums)
    for e in nodes(epilogue):
        if isinstance(e, Ref) and e.compute.name not in names:
            raise _refuse(f"the output reads {e.compute.name}, which the GEMM does not compute",
                          out)
        if isinstance(e, Load) and e.param.name in [a_name, *weights]:
            raise _refuse(f"the output reads {e.param.name} elementwise; only the sums, other "
                          "tensors, scalars and indices", out)
    tensors = tuple(sorted({(e.param.name, e.param.dtype) for e in nodes(epilogue)
                            if isinstance(e, Load)}))
    a_dims, w_dims = params[a_name].dims[-2:], params[weights[0]].dims[-2:]
    m_dim, k_dim = a_dims if a_k_major else a_dims[::-1]
    dims = (str(m_dim), str(k_dim), str(w_dims[0 if b_k_major else 1]))
    batched_operand = params[a_name] if a_batched else params[weights[0]]
    batch = tuple((a.name, str(d)) for a, d in zip(z_axes, batched_operand.dims))
    plan = HopperGemmPlan(a_name, tuple(weights), b_k_major, names, epilogue, out.name,
                          out.dtypes[0], dtypes.pop(), dims, (i_axis.name, j_axis.name), tensors,
                          tuple((p.name, p.dtype) for p in program.scalar_params), batch,
                          a_batched, weights_batched, tuple(params[t].dims for t, _ in tensors),
                          a_k_major=a_k_major)
    try:
        epilogue_code(plan)   # refused now if the emitter cannot write it
    except ScheduleError as exc:
        several = "; several batch axes are walked as one index, which the output cannot read " \
            "apart" if len(batch) > 1 else ""
        raise _refuse(f"{exc.message}{several}", out) from None
    return plan


def shared_bytes(plan: HopperGemmPlan, knobs: GemmKnobs) -> int:
    """Dynamic shared memory: ``stages`` slots of the rows tile and every weight tile, the
    mbarriers, and 1 KiB for aligning the swizzled tiles."""
    stage = (knobs.block_m + len(plan.weights) * knobs.block_n) * BLOCK_K * 2
    staging = knobs.consumers * 64 * 128 if knobs.epilogue == "staged" else 0
    return knobs.stages * stage + staging + 16 * knobs.stages + 16 + 1024


def deepest_stages(plan: HopperGemmPlan, knobs: GemmKnobs, max_shared: int = MAX_SHARED) -> int:
    """The most ring slots that fit shared memory (at most 6)."""
    return max(s for s in range(2, 7)
               if s == 2 or shared_bytes(plan, replace(knobs, stages=s)) <= max_shared)


def batches(plan: HopperGemmPlan, sizes: dict) -> int:
    """The batch's extent (1 without a batch axis): the kernel walks that many GEMMs' tiles."""
    return math.prod(int(sizes[size]) for _, size in plan.batch)


def wave_efficiency(tiles: int, sms: int) -> float:
    """The share of the SMs' time spent on tiles when ``tiles`` equal tiles run on ``sms``."""
    return tiles / (math.ceil(tiles / sms) * sms)


def row_units(M: int, block_m: int, cluster: int) -> int:
    """How many rows of work units the M rows make (a unit: ``cluster`` vertically neighbouring
    tiles of ``block_m`` rows); each reads every weight tile once."""
    return math.ceil(math.ceil(M / block_m) / cluster)


def tile_units(M: int, N: int, block_m: int, block_n: int, cluster: int) -> int:
    """The units of work a GEMM's CTAs (clusters) take: ``cluster`` vertically neighbouring
    tiles of ``block_m × block_n`` each."""
    return row_units(M, block_m, cluster) * math.ceil(N / block_n)


def split_tail(units: int, slots: int, kblocks: int, least: int = 4) -> tuple[int, int, int]:
    """``(whole units, split units, pieces each)``: a last wave of ``units`` tiles on ``slots``
    CTAs (or clusters) that would leave half of them idle split along K into pieces that fill
    it (each ``least`` k-blocks or more), the last piece to finish summing all in order (224
    tiles on 66 clusters: the fourth wave split in two took 0.73 of a whole one's time)."""
    whole, tail = divmod(units, slots)
    pieces = min(slots // tail, kblocks // least) if tail else 1
    if pieces < 2:
        return units, 0, 1
    return whole * slots, tail, pieces


# What a last wave split into ``pieces`` costs, in whole waves: SPLIT_WAVE_COST / pieces (H100,
# M=1024, K=4096, N=14336 [K, N]: four whole waves 0.1934 ms, three and the fourth split in two
# 0.1803 ms — the partial sums' round trip and each piece's pipeline ramp; ``benchmarks.gemm``)
SPLIT_WAVE_COST = 1.46
# Tile widths tried for weights stored [N, K] (their TMA boxes take any multiple of 8 rows), and
# how much shorter a narrower tile's modelled time must be to be chosen over 256 columns (the
# model leaves out that a narrower tile reads more operand bytes per product)
K_MAJOR_WIDTHS = (256, 224, 192)
NARROWER_GAIN = 0.03


def modeled_time(M: int, N: int, K: int, block_n: int, cluster: int, sms: int) -> float:
    """The GEMM's time in units of one column of a 128-row tile: the waves of ``128·cluster ×
    block_n`` tiles on ``sms`` SMs (a split last wave as :data:`SPLIT_WAVE_COST` says) times
    ``block_n`` (a tile's time grows with its width). Used to pick the tile width where the
    waves of 256-column tiles fit the GPU badly."""
    slots = sms // cluster
    units = tile_units(M, N, 128, block_n, cluster)
    whole, tail, pieces = split_tail(units, slots, math.ceil(K / BLOCK_K))
    waves = math.ceil(whole / slots) + (min(1.0, SPLIT_WAVE_COST / pieces) if tail else 0.0)
    return waves * block_n


def _tile_width(plan: HopperGemmPlan, M: int, N: int, K: int, cluster: int, sms: int) -> int:
    """256 columns, or for ``[N, K]`` weights filling at least one wave a narrower width whose
    waves fit the GPU enough better (:func:`modeled_time`; M=1024, K=4096, N=14336 on 132 SMs:
    224 columns make 3.9 waves of clusters where 256 make 3.4, the last split along K). Below a
    wave the model is no guide: at M=200 and 256 (K=4096, N=14336) it favours 224 columns
    (128 SMs busy instead of 112), which measured the same as 256 and 2 % faster in CUDA graphs;
    192 columns (150 CTAs) 14 % slower (H100, ``benchmarks.gemm``)."""
    if not plan.b_k_major or tile_units(M, N, 128, 256, cluster) < sms // cluster:
        return 256   # [K, N] weights; or less than a wave of tiles
    times = {bn: modeled_time(M, N, K, bn, cluster, sms) for bn in K_MAJOR_WIDTHS}
    best = min(times, key=times.get)
    return best if times[best] < (1 - NARROWER_GAIN) * times[256] else 256


def _one_wave_width(N: int, sms: int) -> int:
    """For rows that fit one tile and one ``[N, K]`` weight: the narrowest multiple of 16
    columns (at most 128) whose tiles fit one wave — every SM streams weights (M=128, K=4096,
    N=14336 on 132 SMs: 128 tiles of 112 columns instead of 112 of 128, 0.7–2.3 % faster by
    do_bench and in CUDA graphs over two H100 runs of ``benchmarks.gemm``; 96 or 64 columns, two
    waves,
    6–9 % slower). A gated pair keeps 128: its FFN (`nn.Linear` SwiGLU, M=128) timed 1 % slower
    with 112 in another run than with 128 (not alternated in one run)."""
    return min(128, max(64, -(-N // (sms * 16)) * 16))


def _default_width(plan: HopperGemmPlan, M: int, N: int, K: int, cluster: int, sms: int,
                   batch: int = 1) -> int:
    """The tile width :func:`default_gemm_knobs` describes for ``batch`` GEMMs of ``M`` rows:
    256 columns for one weight on rows of more than one tile (narrower for ``[N, K]`` weights
    where that fits the waves better), 128 for two weights; on rows that fit one tile 64 where
    every GEMM's tiles together fit one wave, else 128 (one ``[N, K]`` weight: the width that
    fills one wave). A batch of GEMMs whose rows fit one tile each streams its weights as one
    such GEMM does (DeepSeek's latent decode, 8 × [128 × 4096] · [4096 × 512]: 64 columns,
    each tile split along K in two, 26.5 µs against 34.8 for 256 columns split in eight;
    8 × [128 × 576] · [576 × 4096]: 128 columns, 24.6 against 25.9; H200, CUDA graphs, L2
    flushed)."""
    if M > 128:
        return _tile_width(plan, batch * M, N, K, cluster, sms) if len(plan.weights) == 1 \
            else 128
    if batch * math.ceil(N / 64) <= sms:
        return 64
    return _one_wave_width(batch * N, sms) if plan.b_k_major and len(plan.weights) == 1 \
        else 128


def default_gemm_knobs(plan: HopperGemmPlan, sizes: dict, sms: int = 132,
                       max_shared: int = MAX_SHARED) -> tuple[GemmKnobs, str]:
    """The knobs for these sizes and why, as measured best on the H100 (``benchmarks.gemm``,
    ``benchmarks.gemm``): 128 × 256 tiles (128 × 128 where two weights share the accumulator
    registers), the
    two CTAs of a cluster sharing each weight tile by split multicast (it halves the weights' L2
    traffic: 0.85× → 0.97–1.00× cuBLAS at 8192³, where a CTA's operand reads from L2 bound the
    kernel), rasterisation groups whose waves read the fewest bytes (:func:`group_rows`), 16-bit
    outputs staged through shared memory (coalesced 16-byte stores: 0.96 → 1.00× cuBLAS at 8192³,
    0.59 → 0.94× at K=512), the deepest ring that fits; 64-row tiles (one consumer warpgroup) and no
    cluster where M ≤ 64; 128-column tiles for one weight where the rows fit one tile (M ≤ 128): the
    GEMM then streams its weights (for ``[N, K]`` weights as many columns as fill one wave:
    :func:`_one_wave_width`), and twice the tiles fill the GPU without splitting them along K
    (M=128, K=4096, N=14336: 0.87 → 0.98× cuBLAS; K=14336, N=4096: 0.91 → 0.98×;
    ``benchmarks.gemm``) — and
    64-column tiles where even those fit one wave, so that each is split along K into fewer pieces
    (M=128, K=14336, N=4096: 64 tiles in 2 pieces instead of 32 in 4, 5–7 % faster in CUDA graphs;
    ``benchmarks.gemm``); for ``[N, K]`` weights, a narrower tile where the waves of 256-column
    ones fit the
    GPU badly (:func:`_tile_width`); where the rows fit one tile (or one cluster's), one weight's
    copies take the L2 evict-first policy (:func:`_weight_policy`); one wave of whole tiles on one
    row of them has its CTAs paced (:func:`_default_pace`)."""
    M, K, N = (sizes[d] for d in plan.dims)
    # a cluster multicasts 2-D weight tiles: weights of their own per batch take none
    cluster = 2 if M > 128 and not plan.weights_batched else 1
    # the tile models count every batch's rows (:func:`_default_width`)
    bn = _default_width(plan, M, N, K, cluster, sms, batches(plan, sizes))
    epilogue = "direct" if plan.out_dtype == "f32" else "staged"
    if M <= 64:
        knobs = GemmKnobs(bn, consumers=1, cluster=1, group_m=16, epilogue=epilogue)
        why = f"M={M}: one warpgroup of 64 rows"
    else:
        knobs = GemmKnobs(bn, cluster=cluster, group_m=16, epilogue=epilogue)
        units = batches(plan, sizes) * tile_units(M, N, 128, bn, cluster)
        why = (f"{units} tiles of {128 * cluster} × {bn} (cluster of {cluster}) on {sms} SMs: "
               f"{wave_efficiency(units * cluster, sms):.0%} of the last wave busy")
    knobs = _with_derived(plan, sizes, knobs, sms)
    if knobs.weights_l2 != "normal":
        why += "; weights read once: copied L2 evict-first"
    if knobs.pace:
        why += f"; CTAs paced within {knobs.pace} k-blocks of the average"
    return replace(knobs, stages=deepest_stages(plan, knobs, max_shared)), why


def _with_derived(plan: HopperGemmPlan, sizes: dict, knobs: GemmKnobs, sms: int,
                  given: tuple = ()) -> GemmKnobs:
    """``knobs`` with the knobs that follow from the tiles and the cluster — the weights' L2
    policy and the pacing — derived for them, but those in ``given``."""
    M, K, N = (sizes[d] for d in plan.dims)
    rows = batches(plan, sizes) * M
    # (a batch's own weights: the 2-D L2 hint does not copy them; pacing measured unbatched)
    derived = {"weights_l2": "normal" if plan.weights_batched else
               _weight_policy(plan, rows, knobs),
               "pace": 0 if plan.batch else _default_pace(M, N, K, knobs, sms),
               "group_m": group_rows(rows, N, knobs.block_m, knobs.block_n, knobs.cluster,
                                     len(plan.weights), sms)}
    return replace(knobs, **{k: v for k, v in derived.items() if k not in given})


GROUP_CHOICES = (16, 8, 32, 4, 2, 1)   # 16 first: it wins ties (the default before the wave model)
SAMPLED_WAVES = 16


def wave_operand_rows(M: int, N: int, block_m: int, block_n: int, cluster: int, weights: int,
                      sms: int, group_m: int) -> int:
    """The rows of operand tiles (rows of ``a`` plus rows of weight columns, each ``K`` long)
    that the waves of a GEMM read from memory, summed over its first :data:`SAMPLED_WAVES`
    waves, when its units (``cluster`` vertically neighbouring tiles) go in groups of
    ``group_m`` row units as the kernel's ``tile_of`` orders them: a wave reads each distinct
    row unit's rows and each distinct column tile's weight columns once (the CTAs of a wave
    stream the same k-blocks at about the same time; the rest come from L2)."""
    row_count = row_units(M, block_m, cluster)
    tiles_n = math.ceil(N / block_n)
    units, slots = row_count * tiles_n, max(1, sms // cluster)
    total = 0
    for first in range(0, min(units, SAMPLED_WAVES * slots), slots):
        rows, cols = set(), set()
        for u in range(first, min(units, first + slots)):
            group, within = divmod(u, group_m * tiles_n)
            height = min(row_count - group * group_m, group_m)
            rows.add(group * group_m + within % height)
            cols.add(within // height)
        total += len(rows) * cluster * block_m + len(cols) * block_n * weights
    return total


def group_rows(M: int, N: int, block_m: int, block_n: int, cluster: int, weights: int,
               sms: int) -> int:
    """The rasterisation group (``group_m`` row units) whose waves read the fewest operand bytes
    from memory (:func:`wave_operand_rows`; ties to 16, where the rows make at most that many
    units and the group does not change the order). A large GEMM runs at the H100's power
    limit, where the SM clock follows the energy spent, and memory reads are a good part of it:
    cuBLAS and our kernel did the same work per clock at 8192 × 14336 × 4096, cuBLAS at
    1380–1425 MHz and ours at 1335–1380; groups of 8 units of 256 rows (12 % fewer bytes than
    16 by this model) measured 1.8–2.3 % faster there by do_bench, and 0.7–1.5 % faster in CUDA
    graphs on each of the three large shapes of issue 18 (``benchmarks.gemm``)."""
    costs = {g: wave_operand_rows(M, N, block_m, block_n, cluster, weights, sms, g)
             for g in GROUP_CHOICES}
    return min(GROUP_CHOICES, key=lambda g: costs[g])


def _weight_policy(plan: HopperGemmPlan, M: int, knobs: GemmKnobs) -> str:
    """``"evict_first"`` for one weight whose every tile is read once (the rows fit one tile, or
    the tiles of one cluster, which multicast it), else ``"normal"`` (later row tiles read it
    again, from L2 where it stayed). A weight streamed with the normal policy pushes out of L2
    what the kernels around the GEMM use: on the H100 (``benchmarks.gemm``) evict-first made the
    few-row
    GEMMs of one weight 5–8 % faster in CUDA graphs and 3–9 % by ``do_bench`` (after its L2
    flush, whose dirty lines the streamed weight would otherwise write back). A gated pair
    (SwiGLU's first GEMM) measured 3–8 % slower with it by ``do_bench``, up to 3 % in graphs."""
    once = row_units(M, knobs.block_m, knobs.cluster) == 1
    return "evict_first" if once and len(plan.weights) == 1 else "normal"


def _default_pace(M: int, N: int, K: int, knobs: GemmKnobs, sms: int) -> int:
    """2 where the rows fit one tile, without a cluster, and every CTA streams one whole tile's
    weights (one wave, no tile split along K), else 0 (off). There the slowest CTAs ended their
    k-loops 4.6 µs after the median (the same bytes each; on other tiles and SMs each run), and
    CTAs held within 2 k-blocks of the grid's average took 2.3 µs off the GELU FFN at M=128
    (0.1015 → 0.0992 ms by do_bench, 0.0985 → 0.0959 in graphs; 4: 0.1011, 8: 0.1015; a second
    run 0.1013 → 0.0994; H100, ``benchmarks.gemm``). Paced split tiles (the FFN's second GEMM)
    measured
    1.3 µs slower."""
    units = tile_units(M, N, knobs.block_m, knobs.block_n, 1)
    if knobs.cluster > 1 or row_units(M, knobs.block_m, 1) > 1 or units > sms:
        return 0   # measured on one wave of one row of tiles only
    split = knobs.split_tail and split_tail(units, sms, math.ceil(K / BLOCK_K))[1] > 0
    return 0 if split else 2


def check_gemm(plan: HopperGemmPlan, knobs: GemmKnobs, sizes: dict,
               max_shared: int = MAX_SHARED) -> None:
    """Refuse sizes and knobs the kernel cannot run, saying which."""
    M, K, N = (sizes[d] for d in plan.dims)
    bn = knobs.block_n
    if not 64 <= bn <= 256 or bn % (16 if plan.b_k_major else 64):
        raise _refuse(f"block_n={bn}: " + (
            "a multiple of 16 from 64 to 256 (weight rows in 8-row swizzle atoms, halved by a "
            "cluster; one wgmma N)" if plan.b_k_major else
            "64, 128, 192 or 256 (weights stored [K, N] are copied in atoms of 64 columns; one "
            "wgmma N)"))
    if knobs.consumers not in (1, 2, 3):
        raise _refuse(f"consumers={knobs.consumers}: 1, 2 or 3 warpgroups of 64 rows")
    # ptxas allocates every thread what it has at launch (65536 / threads) — or less, what
    # setmaxnreg gives the consumers: the accumulators and ~26 more must fit in that
    budget = min(launch_registers(knobs.threads), knobs.consumer_registers)
    acc = len(plan.weights) * bn // 2
    if acc + 26 > budget:
        raise _refuse(f"{knobs} keeps {acc} accumulators per thread; with {knobs.threads} threads "
                      f"a thread has {budget} registers: use fewer consumers or a smaller "
                      "block_n")
    if knobs.consumers == 3 and knobs.cluster > 1:
        raise _refuse(f"{knobs}: three consumer warpgroups with a cluster spill registers (a "
                      "thread starts with 128 at 512 threads); use cluster=1 or two consumers")
    if knobs.epilogue not in ("direct", "staged"):
        raise _refuse(f"epilogue={knobs.epilogue!r}: 'direct' (stores from registers) or "
                      "'staged' (through shared memory, 16-byte stores)")
    if knobs.epilogue == "staged" and plan.out_dtype == "f32":
        raise _refuse("epilogue='staged' stages 64 columns in 128-byte rows: bf16 or f16 "
                      "outputs only")
    if knobs.multicast not in ("split", "leader"):
        raise _refuse(f"multicast={knobs.multicast!r}: 'split' or 'leader'")
    if knobs.cluster not in (1, 2):
        raise _refuse(f"cluster={knobs.cluster}: 1, or 2 CTAs sharing each weight tile")
    if knobs.cluster == 2 and knobs.multicast == "split" and bn % 128 and not plan.b_k_major:
        raise _refuse(f"cluster=2 splits each weight tile's {bn} columns into two halves of "
                      "whole 64-column atoms: block_n 128 or 256")
    if knobs.group_m < 1:
        raise _refuse(f"group_m={knobs.group_m}: at least 1")
    if knobs.stages < 2:
        raise _refuse(f"stages={knobs.stages}: at least 2 slots")
    if not isinstance(knobs.pace, int) or knobs.pace < 0:
        raise _refuse(f"pace={knobs.pace!r}: k-blocks a CTA may run ahead of the average, 0 "
                      "(off) or more")
    if knobs.pace and knobs.cluster > 1:
        raise _refuse(f"pace={knobs.pace} with cluster={knobs.cluster}: a CTA waiting for the "
                      "average would hold its peer's multicast copies; use cluster=1")
    if knobs.weights_l2 not in ("normal", "evict_first"):
        raise _refuse(f"weights_l2={knobs.weights_l2!r}: 'normal' or 'evict_first'")
    if plan.weights_batched and (knobs.cluster > 1 or knobs.weights_l2 != "normal"):
        raise _refuse(f"{knobs}: weights with the batch axis are copied as 3-D boxes, without "
                      "multicast or an L2 policy: use cluster=1, weights_l2='normal'")
    need = shared_bytes(plan, knobs)
    if need > max_shared:
        raise _refuse(f"{knobs} needs {need} bytes of shared memory; the GPU has {max_shared}: "
                      "use fewer stages or a smaller block_n")
    Z = batches(plan, sizes)
    if not 1 <= Z < 2 ** 31:
        raise _refuse(f"{' × '.join(s for _, s in plan.batch)} = {Z} batches: outside what the "
                      "kernel indexes")
    for name, value in (("M", M), ("N", N), ("K", K)):
        if not 1 <= value < 2 ** 31:
            raise _refuse(f"{name}={value} is outside what the kernel indexes")
        if (name != "M" or not plan.a_k_major) and value % 8:
            raise _refuse(f"{name}={value}: TMA copies need rows of a multiple of 16 bytes "
                          f"({name} a multiple of 8)")


def with_knobs(plan: HopperGemmPlan, sizes: dict, given: dict, sms: int = 132,
               max_shared: int = MAX_SHARED) -> tuple[GemmKnobs, str]:
    """The defaults with the user's ``given`` knobs (a given ``block_n`` or ``consumers`` gets the
    deepest ring that fits unless ``stages`` is given too; a cluster whose weight tiles cannot be
    split into 64-column halves multicasts from its first CTA)."""
    unknown = set(given) - set(KNOBS)
    if unknown:
        raise _refuse(f"no knob {', '.join(sorted(unknown))}; knobs: {', '.join(KNOBS)}")
    knobs, why = default_gemm_knobs(plan, sizes, sms, max_shared)
    if ("block_n" in given or "consumers" in given) and "stages" not in given:
        given = {**given, "stages": deepest_stages(plan, replace(knobs, **given), max_shared)}
    chosen = replace(knobs, **given)
    # the tiles and cluster given decide the L2 policy and the pacing, where those are not given
    knobs = _with_derived(plan, sizes, chosen, sms, tuple(given))
    if chosen.cluster > 1 and chosen.block_n % 128 and not plan.b_k_major and \
            "multicast" not in given:
        given = {**given, "multicast": "leader"}   # halves would not be whole 64-column atoms
    if given:
        why = "given: " + ", ".join(f"{k}={v}" for k, v in given.items())
    return replace(knobs, **given), why
