"""Multi-SM tile distribution (``cluster_distribute``): one fused tile over a Hopper thread-block
cluster, its intermediates exchanged through distributed shared memory (DESIGN.md §4).

Two shapes of chain are distributed:

- GEMM chains ``act(X·W1)·W2`` (no fusion first): the intermediate's columns (``axis``, the second
  sum's axis) are split across the cluster's CTAs, each computes its slice and all-gathers it into
  its peers' shared memory through DSM, then each computes a share of the output columns from the
  cluster's whole intermediate (plan: :mod:`.gemm_chain_plan`, code:
  :mod:`tensorfuse.targets.cuda.gemm_chain`);
- a rolled softmax-weighted chain (attention after ``rolling_update``) for one query token: the keys
  (``axis``, the rolled axis) are split across the cluster and the partial states merged in DSM with
  the rolling-update correction — a split update inside the cluster
  (:mod:`tensorfuse.targets.cuda.cluster_decode`).
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import replace

from ..dsl import dtypes as dt
from ..dsl.expr import user_location
from ..errors import ScheduleError, TargetError
from ..interop import StreamScratch
from ..targets import TargetSpec
from ..targets.cuda.kernel import ClusterKernel, Launches, pointer
from ..targets.cuda.cluster_decode import (STATIC_SHARED_BYTES, decode_fits,
                                            decode_shared_bytes, decode_source,
                                            decode_tensor_maps, head_tiles, split_workspace)
from ..targets.cuda.gemm_chain import EPILOGUE_VEC, gemm_chain_source
from ..targets.cuda.gemm_chain_wgmma import PARTS as WGMMA_PARTS
from ..targets.cuda.parts import named_parts
from ..targets.cuda.module import (TENSOR_MAP, DriverLaunch, KernelEntry, cubin_for,
                                   local_gpu, max_active_clusters)
from ..targets.cuda.tma import DeviceMaps
from .attention import SMS
from .decode_plan import (DecodeKnobs, check_decode, cluster_decode_pays, knobs_of_setting,
                          plan_decode, splits_for)
from .gemm_chain_plan import ClusterKnobs, check_sizes, plan_gemm_chain, shared_bytes, wgmma_layout


def _check_target(target: TargetSpec) -> None:
    if not target.has_clusters:
        raise ScheduleError(f"cluster_distribute needs thread-block clusters (Hopper, "
                            f"target 'cuda:sm_90a'); the target is {target.name}", user_location())


GEMM_CHAIN_KNOBS = ("mma", "copy", "exchange", "block_m", "block_n", "block_k", "block_o", "stages",
                    "group_m", "warps", "ctas_per_sm")


def gemm_chain_knobs(plan, target: TargetSpec, sizes: tuple[int, int, int, int],
                     cluster: int | None, given: dict):
    """The knobs for sizes ``(M, K, N, O)``: the user's, and defaults for the rest, as measured
    best on the H100 (``benchmarks.cluster``) — wgmma on sm_90a (mma.sync for 16 warps or plain
    sm_90) fed by cp.async, H shared by peer reads in clusters of 8 with 256-column output tiles where O allows
    (all-gather in clusters of 2 when peer reads do not apply; smaller clusters and tiles where the
    sizes need them), 128-row blocks (64 where M ≤ 64 or H would not fit), and the pipeline with
    the most bytes in flight that fits."""
    M, K, N, O = sizes
    mma = given.get("mma", "wgmma" if target.has_wgmma and given.get("warps", 8) == 8
                    else "mma_sync")
    if mma == "wgmma" and not target.has_wgmma:
        raise ScheduleError(f"mma='wgmma' needs target cuda:sm_90a; the target is {target.name}",
                            user_location())
    peer = given.get("exchange", "peer" if mma == "wgmma" and
                     given.get("copy", "cp_async") in ("cp_async", "producer")
                     else "gather") == "peer"
    clusters = [cluster] if cluster else [8, 4, 2, 1] if peer else [2, 4, 1]
    candidates = [(c, {}) for c in clusters]
    if peer and not cluster and "block_n" not in given and len(plan.gates) == 1 and M >= 1024:
        # many row blocks: the first product is bound by L2 traffic per FLOP, which 128 × 256
        # tiles cut by a quarter (measured 4–6 % faster for GELU at M=1024/8192; at M=128 they
        # halve the CTAs and lose)
        candidates.insert(0, (4, {"block_n": 256}))
    errors = []   # the first plain candidate's refusal is the one to report
    for c, extra in candidates:   # the first default whose tiles divide these sizes and fit
        knobs = {**extra, **given}
        k = _knobs_for_cluster(plan, target, c, mma, peer, sizes, knobs)
        try:
            check_sizes(plan, k, M, K, N, O)
            return _deepest_pipeline(plan, target, k, knobs)
        except ScheduleError as exc:
            if not extra:
                errors.append(exc)
    raise errors[0]


def _knobs_for_cluster(plan, target: TargetSpec, c: int, mma: str, peer: bool,
                       sizes: tuple[int, int, int, int], given: dict):
    """Default block sizes for cluster size ``c`` (before the pipeline is chosen)."""
    M, K, N, O = sizes
    wgmma = mma == "wgmma"  # swizzled 128-byte rows: block_k 64 only
    widest = 256 if peer else 128
    block_o = given.get("block_o", next((bo for bo in (widest, 128) if O % (c * bo) == 0), 64))
    # 64-row blocks for few rows; wgmma then splits the columns over its two warpgroups, which
    # needs 64-column multiples per warpgroup
    small = M <= 64 and (not wgmma or (given.get("block_n", 128) % 128 == 0
                                       and block_o % 128 == 0))
    k = ClusterKnobs(**{"cluster": c, "block_m": 64 if small else 128, "block_o": block_o,
                        "mma": mma, "exchange": "peer" if peer else "gather", **given})
    smallest = {"block_k": given.get("block_k", 64 if wgmma else 32),
                "stages": given.get("stages", 3 if wgmma else 2)}
    if "block_m" not in given and not _fits(plan, target, replace(k, **smallest)):
        k = replace(k, block_m=64)
    return k


def _fits(plan, target: TargetSpec, knobs) -> bool:
    return shared_bytes(plan, knobs) * knobs.ctas_per_sm <= target.max_shared_memory


def _deepest_pipeline(plan, target: TargetSpec, k, given: dict):
    """The pipeline with the most bytes in flight that fits, ranked by the k-tiles its copies can
    run ahead of the MMAs (stages − 1 with mma.sync; with wgmma one more slot is still being read
    by the MMAs in flight — the wgmma kernel may copy fewer ahead where that measured faster,
    ``gemm_chain_plan.wgmma_lookahead``). Refuses knobs that fit no pipeline."""
    wgmma = k.mma == "wgmma"
    ahead = 2 if wgmma else 1
    choices = sorted(((bk, st) for bk in ((64,) if wgmma else (64, 32))
                      for st in range(ahead + 1, 7)
                      if given.get("block_k", bk) == bk and given.get("stages", st) == st),
                     key=lambda bk_st: (-(bk_st[1] - ahead) * bk_st[0], -bk_st[0], bk_st[1]))
    k = next((replace(k, block_k=bk, stages=st) for bk, st in choices
              if _fits(plan, target, replace(k, block_k=bk, stages=st))), k)
    if not _fits(plan, target, k):
        hint = ("the cluster's H takes block_m × cluster × block_n × 2 bytes: use a smaller "
                "cluster, block_m or block_n" if k.exchange == "gather" else
                "use a smaller block_o, block_n or block_m")
        raise ScheduleError(f"these knobs ({k}) need {shared_bytes(plan, k)} bytes of shared "
                            f"memory per CTA × {k.ctas_per_sm} CTAs per SM; {target.name} has "
                            f"{target.max_shared_memory}: {hint}", user_location())
    return k


def gemm_chain(kernel, target: TargetSpec, axis: str, cluster: int | None = None,
               **knobs) -> ClusterKernel:
    """The GEMM chain of ``kernel`` with ``axis`` (the intermediate's) split over clusters."""
    _check_target(target)
    program = kernel.program
    plan = plan_gemm_chain(program)
    if plan.gates_k_major or plan.w2_k_major:
        raise ScheduleError("cluster_distribute (GEMM chain): the cluster template reads weights "
                            "stored [in, out]; these are [out, in] as torch.nn.Linear keeps them "
                            "— apply_template('hopper_ffn') reads them as stored, or declare "
                            "them [in, out] and pass weight.t().contiguous()", user_location())
    if axis != plan.axis:
        raise ScheduleError(f"cluster_distribute(axis={axis!r}): for this GEMM chain the axis is "
                            f"{plan.axis!r}, the one the second sum runs over (the intermediate's "
                            "columns)", user_location())
    if cluster is not None and cluster not in (1, 2, 4, 8, 16):
        raise ScheduleError(f"cluster={cluster}: a GEMM chain's cluster is 1, 2, 4, 8 or 16 (its "
                            "tiles split the intermediate's and the output's columns evenly over "
                            "the cluster)", user_location())
    unknown = set(knobs) - set(GEMM_CHAIN_KNOBS)
    if unknown:
        raise ScheduleError(f"cluster_distribute has no knob {', '.join(sorted(unknown))} for GEMM "
                            f"chains; knobs: cluster, {', '.join(GEMM_CHAIN_KNOBS)}",
                            user_location())

    def layout(dims: dict) -> Launches:
        M, K, N, O = (dims[d] for d in plan.dims)
        k = gemm_chain_knobs(plan, target, (M, K, N, O), cluster, knobs)
        check_sizes(plan, k, M, K, N, O)
        layout_ = wgmma_layout(plan, k, M) if k.mma == "wgmma" else None
        source = gemm_chain_source(plan, k, layout_, M, K, N, O)
        smem = shared_bytes(plan, k)
        scalars = [p.name for p in program.scalar_params]
        n_scal = ("float32",) * len(scalars)
        tma = k.copy == "tma"
        entries = [KernelEntry("tf_chain_main",
                               ("handle",) * (3 + len(plan.gates) + tma) + n_scal),
                   KernelEntry("tf_chain_epilogue", ("handle", "handle") + n_scal)]
        grid_main = (N // k.block_n, math.ceil(M / k.block_m))
        map_cache = DeviceMaps()

        def tensor_maps(tensors, device):
            """TMA maps of x, the gate weights and w2 in one device buffer, made once per set of
            tensor addresses (the benchmark loop and repeated calls reuse them)."""
            from ..targets.cuda.tma import tensor_map_2d

            key = tuple(t.data_ptr() for t in tensors)
            boxes = [(M, K, k.block_m)] + [(K, N, k.block_k)] * len(plan.gates) + \
                [(N, O, k.block_k)]
            return map_cache.get(key, lambda: b"".join(
                tensor_map_2d(address, rows, cols, box_rows)
                for address, (rows, cols, box_rows) in zip(key, boxes)), device)

        def run(module, values, out, device):
            import torch

            ysum = torch.zeros((M, O), dtype=torch.float32, device=device)  # clusters add here
            sc = [float(values[s]) for s in scalars]
            # (torch_arguments gives 16-byte-aligned tensors; K, N and O are multiples of 64, so
            # every row of them is aligned too, as the 16-byte copies need)
            tensors = [values[plan.x], *(values[w] for w in plan.gates), values[plan.w2]]
            maps = [pointer(tensor_maps(tensors, device))] if tma else []
            module["tf_chain_main"](*(pointer(t) for t in tensors), pointer(ysum), *maps, *sc,
                                    grid_main[0], grid_main[1], k.threads, k.cluster, smem)
            module["tf_chain_epilogue"](pointer(ysum), pointer(out), *sc,
                                        math.ceil(M * O / (256 * EPILOGUE_VEC)), 1, 256, 1, 0)

        return Launches(source, entries, k, run, plan=plan,
                        parts=named_parts(WGMMA_PARTS, plan.parts) if k.mma == "wgmma" else ())

    return ClusterKernel(program, target, layout, f"cluster_distribute(axis={axis!r})")


DECODE_KNOBS = ("warps", "stages", "mma", "copy", "splits")
# From this many (batch, kv-head) pairs on, every lane's cp.async copies stream a large cache
# faster than bulk tensor copies: 1.7-2.9 % at 64, 128 and 2048 pairs of 16k-131k keys, while 4
# and 8 pairs lost 7-11 % (H200, ``benchmarks.decode_splits --pipeline``; teams of warps
# sharing a block copy it by TMA alone)
CP_ASYNC_FROM_PAIRS = 64


def decode_knobs(B: int, H: int, HKV: int, D: int, cluster: int | None, given: dict,
                 target: TargetSpec, resident: Callable | None = None, sms: int = SMS):
    """The user's decode knobs, and defaults for the rest. From sweeps on the H100
    (``benchmarks.cluster``, 32/8 heads, 32k keys, B = 1…8): the most warps (4, 2, 1) whose
    two-block buffers fit (a group of more than 16 heads: two teams of a warp per 16 heads, or
    one), tensor cores for groups up to 128 heads (their
    blocks staged by bulk tensor copies: 3.0 TB/s from 64 CTAs where ``cp.async`` reached
    2.3–2.7: ``tools/probe_decode_stream.py``; by ``cp.async`` from :data:`CP_ASYNC_FROM_PAIRS`
    pairs on), the CUDA-core sweep's by ``cp.async``.

    One cluster per (batch, kv-head) pair, all in one wave, with as many CTAs as that allows,
    was best: the largest power-of-two cluster (at most 16, at most one CTA per SM) of which the
    GPU holds all B·HKV clusters at once. ``resident(knobs)`` says how many clusters of
    ``knobs`` the GPU holds (the driver's count; a cluster must fit one GPC, so on the H100 it is
    7 of 16, 15 of 8, 30 of 4 and 66 of 2 — not SMs / cluster); without a GPU (``None``) the
    count of ``sms`` streaming multiprocessors decides. Where the pairs leave clusters of that
    size unused, each pair's keys are split over ``splits`` clusters, all still in one wave
    (``held // pairs``; a launch takes fewer on a short cache: :func:`.decode_plan.splits_for`):
    one pair's cluster of 16 read a 131k-key cache at 0.9 TB/s on the H200, seven of them at
    1.9 (``benchmarks.decode_splits``). Smaller clusters with more splits measured no faster
    for two pairs or more on short caches (the merge through L2 costs what the extra CTAs
    gain), so the cluster stays the largest that fits, and pairs that keep half the SMs busy
    are not split (``benchmarks.decode_grid``).
    """

    pairs = B * max(HKV, 1)
    group = H // max(HKV, 1)
    k = replace(DecodeKnobs(cluster=cluster or 1, mma="mma_sync" if group <= 128 else "fma"),
                **given)
    tiles = head_tiles(k, group)
    if "copy" not in given:
        many = pairs >= CP_ASYNC_FROM_PAIRS and tiles == 1
        k = replace(k, copy="tma" if k.mma == "mma_sync" and not many else "cp.async")
    if tiles > 1 and "stages" not in given and "warps" not in given:
        k = replace(k, stages=3)   # teams: 45 µs at 3 stages, 57 at 2 (B1, 64/1, 131k keys)
    if "warps" not in given:   # a larger group: teams of warps (2 or 1 of them)
        k = next((replace(k, warps=w) for w in ((4, 2, 1) if tiles == 1 else
                                                (2 * tiles, tiles))
                  if decode_fits(replace(k, warps=w), D, group, target.max_shared_memory)),
                 replace(k, warps=tiles))
        if not decode_fits(k, D, group, target.max_shared_memory):
            k = replace(k, stages=2)

    def held(c: int) -> int:
        return resident(replace(k, cluster=c)) if resident is not None else sms // c

    if tiles > 1 and not cluster:
        # teams compute 16 heads a warp on every byte: the CTAs the GPU holds at once, not the
        # cluster's size, bound them (B16 64/1: 64 CTAs in clusters of 4 reached 1.7 TB/s)
        fits = {c: n for c in (16, 8, 4, 2, 1) if sms // c >= pairs
                for n in (held(c),) if n >= pairs}
        busy = {c: c * pairs * (n // pairs) for c, n in fits.items()}
        c = max((c for c, n in busy.items() if n >= 0.75 * max(busy.values())), default=1)
        count = fits.get(c, pairs)
    else:
        c = cluster or min(16, 2 ** max(0, math.floor(math.log2(max(1, sms // pairs)))))
        count = held(c)
        while not cluster and c > 1 and count < pairs:
            c //= 2
            count = held(c)
        if 2 * c * pairs >= sms:   # half the SMs busy already: splitting cost more than it gave
            count = pairs          # (64 pairs, 1k keys: 18 µs unsplit, 24 in two splits)
    return replace(k, cluster=c, splits=given.get("splits", max(1, count // pairs)))


def _key_axis(program, plan) -> int:
    """Where the key count is among the key tensor's dimensions (``plan_decode`` has checked that
    keys and values are indexed by batch, kv-head and key in one order, the head dim last)."""
    return next(p for p in program.tensor_params if p.name == plan.k).dims.index(plan.dims[4])


def decode_launches(plan, dims: dict, given: dict, target: TargetSpec, n_axis: int,
                    origin: str | None = None) -> Launches:
    """The decode kernel for ``dims`` (every size but the key count, which each call passes)
    with the ``given`` knobs (``cluster`` None: sized by the driver's count of resident clusters
    where a GPU is present), its source, and a launch through the driver (the tensor maps by
    value, made per call for the call's keys and values); ``origin``: where the knobs come from,
    when not the defaults."""
    B, H, HKV, M, N, D = (dims[d] for d in plan.dims)
    knobs = dict(given)
    cluster = knobs.pop("cluster", None)
    gpu = local_gpu()
    asked = []   # "count of cluster" per size asked, for schedule_origin
    probes = {}  # one cubin per set of knobs but the cluster size, which is given at launch

    def resident(k) -> int:
        key = replace(k, cluster=1, splits=1)
        try:
            if key not in probes:
                check_decode(plan, key, dims)
                probes[key] = cubin_for(decode_source(plan, key, dims), target)
            count = max_active_clusters(probes[key], "tf_decode_cluster", k.cluster,
                                        32 * k.warps, decode_shared_bytes(k, D, H // HKV),
                                        gpu[0])
        except TargetError as exc:   # the kernel still runs; only the choice is blind
            warnings.warn(f"{exc}; cluster decode sizes its clusters by the SM count instead",
                          stacklevel=2)
            return B * HKV
        asked.append(f"{count} of {k.cluster}")
        return count

    k = decode_knobs(B, H, HKV, D, cluster, knobs, target, resident if gpu else None,
                     gpu[1] if gpu else SMS)
    split = f", each pair's keys split over up to {k.splits}" if k.splits > 1 else ""
    why = (f"{B * HKV} clusters (batch × kv-heads){split}; the GPU holds {', '.join(asked)} at "
           "once" if asked else "")
    check_decode(plan, k, dims)
    source = decode_source(plan, k, dims)
    smem = decode_shared_bytes(k, D, H // HKV)
    if not decode_fits(k, D, H // HKV, target.max_shared_memory):
        raise ScheduleError(f"warps={k.warps}, stages={k.stages} at head dim {D} and "
                            f"{H // HKV} heads per kv-head need {smem} bytes of shared memory "
                            f"per CTA beside up to {STATIC_SHARED_BYTES} static; {target.name} "
                            f"has {target.max_shared_memory}: use fewer warps or stages",
                            user_location())
    scalars = tuple("float32" if dt.is_float(t) else "int32" for _, t in plan.scalars)
    tma = k.copy == "tma"
    launch = DriverLaunch(source, target, "tf_decode_cluster",
                          ("handle",) * 4 + (TENSOR_MAP,) * (2 * tma) + ("int32",) +
                          ("handle",) * (2 + len(plan.tensors)) + scalars)
    threads = 32 * k.warps
    chosen = "splits" not in given   # the defaults' splits: fewer on a mid-length cache
    workspace = StreamScratch(split_workspace(B * HKV, k.splits, H // HKV, D, k.cluster)) \
        if k.splits > 1 else None

    def run(module, values, out, device):
        kv = (values[plan.k], values[plan.v])
        n = kv[0].shape[n_axis]
        maps = decode_tensor_maps(*(t.data_ptr() for t in kv), B, HKV, n, D, plan.dtype,
                                  plan.layouts[1]) if tma else ()
        splits = splits_for(k, n, chosen)
        # addresses as ints: the driver launch packs them without a ctypes object each
        buffers = [t.data_ptr() for t in workspace(device)] if splits > 1 else [0, 0]
        launch([values[plan.q].data_ptr(), *(t.data_ptr() for t in kv), out.data_ptr(), *maps,
                n, *buffers, *(values[name].data_ptr() for name, _ in plan.tensors),
                *(values[name] for name, _ in plan.scalars)], (B * HKV * k.cluster, splits),
               threads, k.cluster, smem, device)

    return Launches(source, [], k, run, why, plan, origin=origin)


def attention_decode(kernel, fusion, target: TargetSpec, axis: str, cluster: int | None = None,
                     description: str | None = None, tuned=None, routed: bool = False,
                     **knobs) -> ClusterKernel:
    """The rolled attention chain of ``kernel`` with its keys split over one cluster per
    (batch, kv-head) (``description``: how the kernel names itself; default the schedule step).
    ``tuned``: ``tf.compile``'s lookup of ``cluster_decode`` tuning records, used where no knob
    is given. ``routed``: ``tf.compile``'s choice, preferred only at the sizes where it beats
    the split update (:func:`.decode_plan.cluster_decode_pays`)."""
    _check_target(target)
    if fusion.axis != axis:
        raise ScheduleError(f"cluster_distribute(axis={axis!r}) after a rolling update over "
                            f"{fusion.axis!r}: distribute the rolled axis", user_location())
    program = kernel.program
    plan = plan_decode(program, fusion.names, axis)
    unknown = set(knobs) - set(DECODE_KNOBS)
    if unknown:
        raise ScheduleError(f"cluster_distribute has no knob {', '.join(sorted(unknown))} for "
                            f"attention; knobs: cluster, {', '.join(DECODE_KNOBS)}",
                            user_location())

    keys = plan.dims[4]
    n_axis = _key_axis(program, plan)
    made = {}   # launches per sizes but the key count, which the kernel takes as an argument

    def layout(dims: dict) -> Launches:
        found = tuned(dims) if tuned is not None and not knobs and cluster is None else None
        given = {"cluster": cluster, **knobs, **(knobs_of_setting(found[0]) if found else {})}
        at = tuple((d, x) for d, x in sorted(dims.items()) if d != keys) + \
            tuple(sorted(given.items()))
        if at not in made:
            made[at] = decode_launches(plan, dims, given, target, n_axis,
                                       f"cluster_decode tuned record ({found[1]})" if found
                                       else None)
        return made[at]

    def preferred(dims: dict) -> bool:
        size = lambda name: dims[name] if name in dims else int(name)   # noqa: E731
        b, _, hkv, _, n, d = (size(name) for name in plan.dims)
        return cluster_decode_pays(b * hkv, 2 * b * hkv * n * d * 2)   # bf16/f16 keys, values

    return ClusterKernel(program, target, layout,
                         description or f"cluster_distribute(axis={axis!r})",
                         origin="cluster_decode template defaults",
                         preferred=preferred if routed else None)
