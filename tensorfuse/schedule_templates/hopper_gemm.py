"""The Hopper GEMM template (``apply_template("hopper_gemm")``, and ``tf.compile``'s choice for
GEMM-shaped programs on sm_90a): a persistent, warp-specialised sm_90a kernel (plan:
:mod:`.hopper_gemm_plan`, code: :mod:`tensorfuse.targets.cuda.hopper_gemm`).

One cubin per (program, knobs): M, N and K are kernel arguments. The TMA tensor maps are made per
set of operand addresses (cached); the grid is as many CTAs as the GPU holds at once (clusters of
two: as many as the driver says fit), each walking the tiles in the same grouped order.
"""
from __future__ import annotations

import functools
import math
import warnings
from dataclasses import replace

from ..dsl.expr import user_location
from ..errors import ScheduleError, TargetError
from ..interop import StreamScratch
from ..targets import TargetSpec
from ..targets.cuda.expr import wide_tensors
from ..targets.cuda.hopper_gemm import ENTRY, PARTS, hopper_gemm_source, kernel_arguments
from ..targets.cuda.kernel import ClusterKernel, Launches, pointer
from ..targets.cuda.module import (DriverLaunch, KernelEntry, cubin_for, local_gpu,
                                   max_active_clusters)
from ..targets.cuda.parts import named_parts
from ..targets.cuda.tma import DeviceMaps, tensor_map
from .hopper_gemm_plan import (BLOCK_K, HopperGemmPlan, batches, check_gemm, plan_hopper_gemm,
                               shared_bytes, split_tail, tile_units, with_knobs)


def operand_maps(plan: HopperGemmPlan, knobs, sizes: tuple[int, int, int], batches: int = 1):
    """``maps(values, device)``: the TMA maps of the rows operand and the weights in one device
    buffer, made once per set of addresses (:class:`DeviceMaps`); an operand with the batch axis
    as a 3-D map (``batches`` slices, boxes of one)."""
    M, K, N = sizes
    cache = DeviceMaps()

    def mapped(address: int, shape: tuple, box: tuple, batched: bool) -> bytes:
        if batched:
            shape, box = (batches, *shape), (1, *box)
        return tensor_map(address, shape, box, plan.dtype)

    def maps(values: dict, device):
        tensors = [values[plan.a]] + [values[w] for w in plan.weights]
        key = tuple(t.data_ptr() for t in tensors)

        def blob() -> bytes:
            made = mapped(key[0], (M, K), (knobs.block_m, BLOCK_K), plan.a_batched) \
                if plan.a_k_major else mapped(key[0], (K, M), (BLOCK_K, 64), plan.a_batched)
            part = knobs.block_n // (knobs.cluster if knobs.multicast == "split" else 1)
            for address in key[1:]:
                made += (mapped(address, (N, K), (part, BLOCK_K), plan.weights_batched)
                         if plan.b_k_major else
                         mapped(address, (K, N), (BLOCK_K, 64), plan.weights_batched))
            return made

        return cache.get(key, blob, device)

    return maps


def resident_ctas(source: str, knobs, smem: int, target: TargetSpec) -> tuple[int, str]:
    """How many CTAs of this kernel run at once on the local GPU (and how that was found): the SM
    count, or for clusters what the driver says fits; 132 (an H100) where there is no GPU."""
    gpu = local_gpu()
    if gpu is None:
        return 132, "no GPU here: sized for an H100's 132 SMs"
    if knobs.cluster == 1:
        return gpu[1], f"{gpu[1]} SMs"
    try:
        clusters = _clusters_at_once(source, target, knobs.cluster, knobs.threads, smem, gpu[0])
    except TargetError as exc:
        warnings.warn(f"{exc}; the GEMM sizes its grid by the SM count instead", stacklevel=2)
        return gpu[1] // knobs.cluster * knobs.cluster, f"{gpu[1]} SMs"
    return clusters * knobs.cluster, f"{clusters} clusters of {knobs.cluster} fit at once"


@functools.lru_cache(maxsize=64)
def _clusters_at_once(source: str, target: TargetSpec, cluster: int, threads: int, smem: int,
                      device: int) -> int:
    """The driver's count, asked once per kernel source and device (it loads the module):
    every size of a GEMM, and both GEMMs of an FFN, share a source."""
    return max_active_clusters(cubin_for(source, target), ENTRY, cluster, threads, smem, device)


def gemm_launches(plan: HopperGemmPlan, target: TargetSpec, dims: dict, given: dict,
                  dependent: bool = False) -> Launches:
    """The launch of one GEMM at ``dims`` with the user's ``given`` knobs (defaults for the
    rest). ``dependent``: launched through the driver as a programmatic dependent of the kernel
    before it (:class:`DriverLaunch`; the FFN's second GEMM), which must be the one that
    writes its rows operand."""
    gpu = local_gpu()
    knobs, why = with_knobs(plan, dims, given, gpu[1] if gpu else 132, target.max_shared_memory)
    check_gemm(plan, knobs, dims, target.max_shared_memory)
    M, K, N = (dims[d] for d in plan.dims)
    Z = batches(plan, dims)
    # an epilogue tensor past 2^31 elements (a residual [M, N] of a vocabulary's logits) read
    # at 64-bit offsets, in a source of its own
    wide = wide_tensors(zip((t for t, _ in plan.tensors), plan.tensor_dims), dims)
    source = hopper_gemm_source(replace(plan, wide=wide) if wide else plan, knobs, dependent)
    smem = shared_bytes(plan, knobs)
    ctas, fit = resident_ctas(source, knobs, smem, target)
    units = Z * tile_units(M, N, knobs.block_m, knobs.block_n, knobs.cluster)
    full_items, tail, pieces = split_tail(units, ctas // knobs.cluster,
                                          math.ceil(K / BLOCK_K)) if knobs.split_tail else \
        (units, 0, 1)
    grid = min((full_items + tail * pieces) * knobs.cluster, ctas)
    maps = operand_maps(plan, knobs, (M, K, N), Z)
    entries = [KernelEntry(ENTRY, tuple(t for _, t, _ in kernel_arguments(plan)))]
    launch = DriverLaunch(source, target, ENTRY, entries[0].arg_types, dependent=True) \
        if dependent else None
    part = len(plan.weights) * knobs.block_m * knobs.block_n   # floats per CTA and piece
    # the split tail's partial sums and counters, then the two of pacing (all reset themselves),
    # per device and stream
    split_buffers = StreamScratch([((max(1, tail * pieces * knobs.cluster * part),), "f32", False),
                                   ((tail * knobs.cluster + 2,), "i32", True)])

    def run(module, values, out, device):
        if knobs.epilogue == "staged" and out.data_ptr() % 16:
            raise TargetError("the hopper_gemm staged epilogue writes 16-byte pieces: the output "
                              "must start at a 16-byte aligned address (pass a contiguous "
                              "tensor, not an offset view)")
        tensors = [pointer(values[t]) for t, _ in plan.tensors]
        scalars = [values[n] for n, _ in plan.scalars]
        partials, counters = split_buffers(device)
        args = [pointer(maps(values, device)), pointer(out), *tensors, M, N, K,
                *([Z] if plan.batch else []), *scalars,
                pointer(partials), pointer(counters), full_items, tail, pieces, knobs.group_m]
        if launch is None:
            module[ENTRY](*args, grid, 1, knobs.threads, knobs.cluster, smem)
        else:
            launch(args, grid, knobs.threads, knobs.cluster, smem, device)

    split = (f"; the last {tail} tiles split {pieces} ways along K" if tail else "")
    return Launches(source, entries, knobs, run,
                    f"{why}; {grid} persistent CTAs ({fit}){split}", plan,
                    parts=named_parts(PARTS, plan.parts))


def hopper_gemm(kernel, fusion, target: TargetSpec, block_n: int | None = None,
                stages: int | None = None, cluster: int | None = None,
                group_m: int | None = None, consumers: int | None = None,
                multicast: str | None = None, epilogue: str | None = None,
                split_tail: bool | None = None, weights_l2: str | None = None,
                pace: int | None = None, tuned=None, automatic: bool = False) -> ClusterKernel:
    """A callable persistent GEMM kernel for ``kernel`` (one or two sums of products sharing the
    rows operand, and an elementwise output of them). Knobs (defaults per size: see
    :func:`.hopper_gemm_plan.default_gemm_knobs`): ``block_n`` output columns per tile,
    ``consumers`` warpgroups of 64 rows (the tile's rows), ``stages`` ring slots, ``cluster``
    (2: weight tiles shared by TMA multicast, ``multicast="split"`` or ``"leader"``),
    ``group_m`` row units (a cluster's tiles) per rasterisation group, ``epilogue`` (``"direct"`` or
    ``"staged"``), ``split_tail`` (split a mostly idle last wave's tiles along K:
    :func:`split_tail`), ``weights_l2`` (``"evict_first"``: the weights' copies leave L2 to
    other data; for weights read once), ``pace`` (k-blocks a CTA may run ahead of the grid's
    average; 0: off). ``fusion`` is not used (a GEMM needs none); ``tuned``
    is accepted for the template interface (the knobs are not tuned yet). ``automatic``:
    ``tf.compile``'s choice, which leaves a rows operand stored ``[K, M]`` to the Triton
    contraction (:func:`chosen_automatically`)."""
    if target.kind != "cuda" or target.arch != "sm_90a":
        raise ScheduleError(f"the hopper_gemm template generates sm_90a code (wgmma, TMA); the "
                            f"target is {target.name}", user_location())
    program = kernel.program if hasattr(kernel, "program") else kernel
    plan = plan_hopper_gemm(program)
    given = {k: v for k, v in (("block_n", block_n), ("stages", stages), ("cluster", cluster),
                               ("group_m", group_m), ("consumers", consumers),
                               ("multicast", multicast), ("epilogue", epilogue),
                               ("split_tail", split_tail), ("weights_l2", weights_l2),
                               ("pace", pace))
             if v is not None}
    passed_over = automatic and not chosen_automatically(plan)
    return ClusterKernel(program, target, lambda dims: gemm_launches(plan, target, dims, given),
                         f"hopper_gemm ({', '.join(plan.sums)} over {plan.dims[1]})",
                         origin="hopper_gemm template defaults" if not given else
                         "hopper_gemm template",
                         preferred=(lambda dims: False) if passed_over else None)


def chosen_automatically(plan: HopperGemmPlan) -> bool:
    """Whether tf.compile runs this GEMM on the Hopper GEMM: not where its rows operand is
    stored [K, M] (a Gram matrix, a weight gradient; wgmma's transposed A), which the Triton
    contraction ran as fast or faster on the H100 from CUDA graphs (a ``probe`` on
    ``benchmarks.unlisted_kernels``' shapes): xᵀx at [65536, 1024] 202.4 µs against the
    contraction's 194.6 (torch 192.9), aᵀb at [16384, 8]ᵀ[16384, 4096] 87.4 against 52.1, at
    [8192, 4096]ᵀ[8192, 4096] 396.8 against 386.0 (torch 367.7), xᵀwᵀ at 8192 × 4096 × 4096
    392.8 against 397.1 (torch 377.7)."""
    return plan.a_k_major


hopper_gemm.needs_fusion = False
