"""The Hopper attention template (``apply_template("hopper_attention")``): a rolled
softmax-attention chain as one warp-specialised sm_90a kernel — TMA producer, wgmma consumers,
the score and mask written from the DSL (plan: :mod:`.hopper_attention_plan`, code:
:mod:`tensorfuse.targets.cuda.hopper_attention`).

One cubin per (variant, head dim, knobs): the batch, head and sequence sizes are kernel arguments.
A masked plan sorts each row block's key blocks per call (:mod:`.block_schedule`; cached while the
mask reads only sizes and scalars), so that fully visible blocks skip the mask and fully masked
ones are never loaded.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..dsl.expr import user_location
from ..errors import ScheduleError, TargetError
from ..interop import StreamScratch, data_key, kept_copies, kept_empty
from ..targets import TargetSpec
from ..targets.cuda.hopper_attention import (ENTRY, MODES, PARTS, hopper_attention_source,
                                             kernel_arguments, merge_rounds)
from ..targets.cuda.expr import wide_tensors
from ..targets.cuda.parts import named_parts
from ..targets.cuda.kernel import ClusterKernel, Launches, pointer
from ..targets.cuda.module import KernelEntry
from ..targets.cuda.map_tiles import view_box, view_sizes
from ..targets.cuda.tma import DeviceMaps, tensor_map
from .block_schedule import block_lists_and_counts
from .fusion import Fusion
from .hopper_attention_plan import (HopperKnobs, check_hopper, last_block_keys,
                                    plan_hopper_attention, planned_schedule, shared_bytes,
                                    split_workspace, tile_head_dims, with_knobs)
from .hopper_tiling import HopperTiling, choose_hopper_tiling, tile_shape_for_map, tiled_lists
from .tile_order import pick_persistent


class _Lists:
    """The block lists of one launches' sizes at the last (scalars, device, mask tensors) seen
    (one per :class:`Launches`, so the sizes need no key of their own): tensors the mask reads
    (document ids, boolean masks) are recognised by :func:`tensorfuse.interop.data_key` and held
    with the lists, so that lists are made again when their data may have changed. With
    ``pick_among`` (CTAs: the call runs persistent and may take either schedule) each kept set
    also carries the persistent schedule its costs favour (:func:`.tile_order.pick_persistent`)
    — only for masks of sizes and scalars, whose lists are kept: reading them back costs a
    synchronisation."""

    def __init__(self, plan, knobs, pick_among: int | None, tiling=None):
        self.plan, self.knobs, self.tiling = plan, knobs, tiling
        self.pick_among = pick_among if plan.mask is not None and not plan.tensors else None
        self.cache: dict = {}
        self.held: tuple = ()   # the tensors the cached lists were made from
        self.empty = None

    def __call__(self, values: dict, sizes: dict, device) -> tuple[tuple, str | None]:
        """``((pn, pi, fn, fi, mask bits, their offsets), the persistent schedule the costs
        favour or None)``; the bits (a tiled kernel's) are the lists' first entry otherwise."""
        import torch

        if self.plan.mask is None:
            if self.empty is None:
                self.empty = kept_empty((1,), torch.int32, device).zero_()
            return (self.empty,) * 6, None
        key = (tuple([values[n] for n, _ in self.plan.chain.scalars]), device,
               data_key([values[t] for t, _ in self.plan.tensors]))
        found = self.cache.get(key)
        if found is not None:   # tensors the mask reads: the same memory, not written since
            return found
        scalars = {n: values[n] for n, _ in self.plan.chain.scalars}
        b, h, i, j = self.plan.chain.axes
        tensors = {t: values[t] for t, _ in self.plan.tensors}
        if self.tiling is not None:
            made = tiled_lists(self.plan, self.tiling, sizes, scalars, self.knobs.block_m,
                               self.knobs.block_n, device)
            row_blocks = self.tiling.rows.padded // self.knobs.block_m
            visited = None
        else:   # shared: one batch·head's lists, which the kernel reads for every one
            batch = [] if self.plan.lists_shared else [b, h]
            made, visited = block_lists_and_counts(self.plan.mask, batch, i, j, sizes, tensors,
                                                   scalars, self.knobs.block_m,
                                                   self.knobs.block_n, device, keep=True)
            made = (*made, made[0], made[0])
            row_blocks = math.ceil(sizes[self.plan.chain.dims[3]] / self.knobs.block_m)
        kept = made if visited is not None else kept_copies(made)   # the host's: kept already
        if kept is None:
            return made, None
        favoured = None
        if self.pick_among is not None:
            if visited is None:   # read back from the device: a synchronisation
                pn, _, fn = kept[:3]
                visited = (pn + fn).cpu().numpy()
            # key blocks per tile in the kernel's order: batch·head-major, last row block first
            blocks = visited.reshape(-1, row_blocks)[:, ::-1].reshape(-1)
            if self.plan.lists_shared:   # every batch·head's tiles alike
                B, H = (sizes[d] for d in self.plan.chain.dims[:2])
                blocks = np.tile(blocks, B * H)
            favoured = pick_persistent(blocks, self.pick_among)
        self.cache = {key: (kept, favoured)}
        self.held = tuple(tensors.values())
        return self.cache[key]


def _runs(plan, knobs: dict, dims: dict, scalars: dict | None, max_shared: int) -> bool:
    """Whether ``knobs`` (a record tuned at other sizes) run the flat order at ``dims``."""
    try:
        check_hopper(plan, with_knobs(plan, dims, knobs, scalars), dims, max_shared, False)
    except ScheduleError:
        return False
    return True


def map_tile_knobs(plan, knobs: HopperKnobs, given: dict, sizes: dict, scalars: dict | None,
                   max_shared: int) -> "tuple[HopperKnobs, HopperTiling | None]":
    """``knobs`` with the tile shape — query rows, key block, CTAs an SM, the overlap — that
    :func:`.hopper_tiling.tile_shape_for_map` finds cheapest for a mask over a map at the call's
    ``scalars``, among the shapes that agree with the ``given`` knobs and run with the others
    (shared memory at their stages, registers), and the visiting order it was costed on; ``knobs``
    and None where the consumers are given, the map's scalars are unknown or no shape tiles."""
    if "consumers" in given or not set(plan.map_scalars) <= set(scalars or {}):
        return knobs, None

    def runs(shape: tuple) -> bool:
        rows, block_n, ctas_per_sm = shape
        if given.get("block_n", block_n) != block_n or \
                given.get("ctas_per_sm", ctas_per_sm) != ctas_per_sm:
            return False
        try:
            check_hopper(plan, replace(knobs, consumers=rows // 64, block_n=block_n,
                                       ctas_per_sm=ctas_per_sm), sizes, max_shared, True)
        except ScheduleError:
            return False
        return True

    picked = tile_shape_for_map(plan, sizes, scalars, runs, given.get("overlap"))
    if picked is None:
        return knobs, None
    (rows, block_n, ctas_per_sm, overlap), tiled = picked
    return replace(knobs, consumers=rows // 64, block_n=block_n, ctas_per_sm=ctas_per_sm,
                   overlap=overlap), tiled


def hopper_attention(kernel, fusion: Fusion, target: TargetSpec, block_n: int | None = None,
                     stages: int | None = None, consumers: int | None = None,
                     overlap: bool | None = None, pingpong: bool | None = None,
                     schedule: str | None = None, ctas: int | None = None,
                     ctas_per_sm: int | None = None, tiling: "dict | bool" = True, tuned=None,
                     prefill_only: bool = False) -> ClusterKernel:
    """A callable warp-specialised attention kernel for ``kernel`` after a rolling update over the
    keys. Knobs (defaults from the plan): ``block_n`` keys per block, ``stages`` key/value slots,
    ``consumers`` warpgroups of 64 query rows, ``overlap`` (FlashAttention-3's intra-warpgroup
    pipeline), ``pingpong`` (consumers take turns on the tensor cores), ``schedule`` (``"grid"``,
    ``"dynamic"``, ``"snake"`` or ``"auto"``: how CTAs take tiles), ``ctas`` (persistent CTAs,
    0: one per resident slot) and ``ctas_per_sm`` (1 or 2 CTAs resident on an SM). ``tiling``:
    the visiting order of a mask that reads the sequence as a 2-D/3-D map — ``True`` chooses
    (query patches and key windows copied as TMA boxes, or the flat order:
    :mod:`.hopper_tiling`), ``False`` keeps the flat order, a dict (``Schedule.tile_as``) fixes
    ``patch``, ``key_patch``, ``dilation``. ``tuned``: the compile
    entry point's lookup of tuning records (used unless knobs are given), per sizes and the
    call's values of the scalars records are kept by. ``prefill_only``: ``tf.compile``'s use —
    prefer this kernel only for more than 64 query rows (decode goes to the split update), and
    for a mask over a map only where it visits the map in patches (elsewhere the Triton
    template's gathers are 5–20× faster than the flat order here: ``benchmarks.neighborhood``)."""
    if target.kind != "cuda" or target.arch != "sm_90a":
        raise ScheduleError(f"the hopper_attention template generates sm_90a code (wgmma, TMA); "
                            f"the target is {target.name}", user_location())
    program = kernel.program if hasattr(kernel, "program") else kernel
    plan = plan_hopper_attention(program, fusion.names, fusion.axis)
    given = {k: v for k, v in (("block_n", block_n), ("stages", stages),
                               ("consumers", consumers), ("overlap", overlap),
                               ("pingpong", pingpong), ("schedule", schedule),
                               ("ctas", ctas), ("ctas_per_sm", ctas_per_sm)) if v is not None}
    arguments = [t for _, t, _ in kernel_arguments(plan)]
    # a mask over a map: kernels are made per the values of its scalars (its width, radius…)
    map_scalars = plan.map_scalars if tiling is not False else ()

    sources: dict = {}   # (knobs, D, DV, last_n) -> the source (the flat order's)
    scratches: dict = {}   # the scratch's layout -> its kept buffers (StreamScratch)

    read = [(p.name, p.dims) for p in program.tensor_params if p.name in dict(plan.tensors)]

    def layout(dims: dict, scalars: dict | None = None) -> Launches:
        B, H, HKV, M, N, D = (dims[d] for d in plan.chain.dims)
        DV = dims[plan.chain.dv]
        found = tuned(dims, scalars) if tuned is not None and not given else None
        if found and found[2] and \
                not _runs(plan, found[0], dims, scalars, target.max_shared_memory):
            found = None   # a record of other sizes of the bucket that cannot run these
        chosen = found[0] if found else given
        knobs = with_knobs(plan, dims, chosen, scalars)
        tiled, order = None, ""
        if map_scalars and tiling is True:   # the tile shape by the cost model
            knobs, tiled = map_tile_knobs(plan, knobs, chosen, dims, scalars,
                                          target.max_shared_memory)
        if tiled is None and (map_scalars or isinstance(tiling, dict)):
            tiled, order = choose_hopper_tiling(plan, knobs.block_m, knobs.block_n, dims,
                                                scalars, tiling)
        if prefill_only and map_scalars and tiled is None:
            raise ScheduleError(f"{plan.chain.out}: the mask reads the sequence as a map, and "
                                f"this kernel would visit it in the flat order ({order}); the "
                                "attention template gathers its patches instead")
        check_hopper(plan, knobs, dims, target.max_shared_memory, tiled is not None)
        why = plan.score_tile.why_not(dims) if plan.score_tile is not None else None
        if why:
            raise ScheduleError(f"hopper attention: {why}; the attention template takes it")
        strip = plan.key_strip if plan.key_strip is not None and \
            not plan.key_strip.why_not(dims) else None   # else read element by element
        sized = replace(plan, key_strip=strip)
        last_n = last_block_keys(plan, N, knobs.block_n) if tiled is None else None
        # tensors the score or mask read element by element past 2^31 elements (a boolean mask
        # [B, 1, S, S] at B3 S32k): their offsets in 64 bits, in a source of their own
        wide = wide_tensors(read, dims)
        # the source depends on no size but these: written once for them (a new prompt length
        # in a known bucket then costs no assembly: ``tools/profile_new_sizes.py``)
        written = (knobs, D, DV, last_n, wide, strip is not None) \
            if tiled is None else None
        source = sources.get(written) if written is not None else None
        TD, TDV = tile_head_dims(plan, dims)   # the tiles' (96 runs as 128: zeros past the row)
        if source is None:
            source = hopper_attention_source(replace(sized, wide=wide), knobs, TD,
                                             plan.mask is not None, tiled, last_n, TDV,
                                             rows=(D, DV))
            if written is not None:
                sources[written] = source
        smem = shared_bytes(knobs, TD, tiled is not None, TDV, plan.score_tile is not None,
                            sized.strip_bytes(knobs))
        padding = "" if (TD, TDV) == (D, DV) else \
            (f"head dims {D}/{DV} held as {TD}/{TDV} (whole 128-byte swizzle atoms: TMA's zeros "
             "past the rows); ")
        entries = [KernelEntry(ENTRY, tuple(arguments))]
        maps = DeviceMaps()
        row_blocks = tiled.rows.padded // knobs.block_m if tiled is not None else \
            math.ceil(M / knobs.block_m)
        how, ctas, tiles = planned_schedule(plan, knobs, dims, row_blocks)
        # (claimed, finished CTAs, then a count of merged pieces per split tile and consumer
        # warpgroup, then per merge round, group's first slot and warpgroup: 2 slots a piece, at
        # most one piece a CTA); the split tiles' partial states, a workspace slot each
        counts = 2 + ctas * knobs.consumers * (1 + 2 * merge_rounds(ctas))
        layout_of_scratch = (((counts,), "i32", True),
                             ((split_workspace(knobs, ctas, TDV) if how == "split" else 4,),
                              "f32", False))
        # one set per layout, whatever the sizes: launches on a stream run one after another,
        # and the counters are left at zero (a new prompt length allocates no kept memory)
        scratch = scratches.get(layout_of_scratch)
        if scratch is None:
            scratch = scratches[layout_of_scratch] = StreamScratch(layout_of_scratch)
        # "auto" that came out persistent: the mask's block costs may favour the snake
        lists = _Lists(plan, knobs, ctas if knobs.schedule == "auto" and how == "dynamic"
                       else None, tiled)

        # (sizes, box, strides) of q, k, v: rows of [batch·heads, tokens, D] (v's DV wide), or
        # boxes of the map — patches of queries, windows of keys (row-major: strides None)
        if tiled is not None:
            sides, dilation = tiled.cols.dims, tiled.cols.dilation
            shapes = [(view_sizes(sides, dilation, heads, width), view_box(patch, dilation), None)
                      for heads, patch, width in ((B * H, tiled.rows.patch, D),
                                                  (B * HKV, tiled.cols.patch, D),
                                                  (B * HKV, tiled.cols.patch, DV))]
        elif plan.strided:   # (batch, head, tokens, D) by each tensor's own strides
            outer = [("b", "h", "i"), ("b", "h", "j"), ("b", "h", "j")]
            shapes = [((B, heads, tokens, width), (1, 1, rows, 64), None)
                      for heads, tokens, rows, width in (
                          (H, M, knobs.block_m, D), (HKV, N, knobs.block_n, D),
                          (HKV, N, knobs.block_n, DV))]
            if plan.keys_innermost:   # k's [batch, head, D, keys]: boxes of 64 keys × TD rows
                outer[1] = ("b", "h", "d")
                shapes[1] = ((B, HKV, D, N), (1, 1, TD, 64), None)
        else:
            shapes = [((heads, tokens, width), (1, rows, 64), None)
                      for heads, tokens, rows, width in ((B * H, M, knobs.block_m, D),
                                                         (B * HKV, N, knobs.block_n, D),
                                                         (B * HKV, N, knobs.block_n, DV))]

        mapped = [(t, plan.dtype) for t in (plan.chain.q, plan.chain.k, plan.chain.v)]
        tile = plan.score_tile or strip
        if tile is not None:   # the score's tiles: boxes of the row block's queries × 64 keys
            shapes.append(tile.map_shape(dims, knobs.block_m, knobs.block_n))   # (or a strip)
            mapped.append((tile.name, tile.dtype))
        dtypes = [dtype for _, dtype in mapped]

        own = plan.strided and tiled is None   # q, k, v through maps of the views' own strides

        def tensor_maps(values, device):
            """TMA maps of q, k and v (and the score tile's tensor) in one device buffer, made
            once per set of addresses (and, read by their own strides, of q's, k's and v's
            strides: the caller's views are taken as they are)."""
            addresses = tuple(values[t].data_ptr() for t, _ in mapped)
            key = addresses + (tuple(values[t].stride() for t, _ in mapped[:3]) if own else ())

            def encoded() -> bytes:   # on a miss only: a repeated call looks its key up
                made = shapes
                if own:
                    made = [(sizes, box, role_strides(values[t], layout, roles,
                                                      plan.chain.strides(k, dims)))
                            for k, ((sizes, box, _), (t, _), layout, roles) in enumerate(
                                zip(shapes, mapped, plan.chain.layouts, outer))] + shapes[3:]
                return b"".join(tensor_map(address, sizes, box, dtype, strides)
                                for address, dtype, (sizes, box, strides)
                                in zip(addresses, dtypes, made))
            return maps.get(key, encoded, device)

        def run(module, values, out, device):
            c = plan.chain
            out, lse = out if c.lse else (out, out)   # lse: not written without the output
            if out.data_ptr() % 16:
                raise TargetError("the hopper_attention template writes its output in 16-byte "
                                  "pieces: the output must start at a 16-byte aligned address "
                                  "(pass a contiguous tensor, not an offset view)")
            (pn, pi, fn, fi, bits, bits_at), favoured = lists(values, dims, device)
            tensors = [pointer(values[t]) for t, _ in plan.arguments]
            scalars = [values[n] for n, _ in c.scalars]
            now = favoured or how
            grid = (row_blocks, B * H) if now == "grid" else (ctas, 1)
            counters, work = scratch(device) if now in ("dynamic", "split") else (pn, pn)
            module[ENTRY](pointer(tensor_maps(values, device)),
                          pointer(out), pointer(lse), pointer(pn), pointer(pi), pointer(fn),
                          pointer(fi), pointer(bits), pointer(bits_at),
                          pointer(counters), pointer(work), MODES[now], *tensors, B, H, HKV, M, N,
                          *(dims[d] for d in plan.extra_sizes), *scalars,
                          *grid, knobs.threads, 1, smem)

        persistent = (" (or the snake, where the block lists' costs favour it)"
                      if lists.pick_among is not None else "")
        return Launches(source, entries, knobs, run, plan=plan,
                        parts=named_parts(PARTS, plan.parts),
                        strided=(plan.chain.q, plan.chain.k, plan.chain.v) if own else (),
                        why=padding + (f"visiting order: {tiled.describe()}; " if tiled else
                             f"flat order ({order}); " if order else "")
                        + f"{tiles} tiles: {how} schedule"
                        + (f" on {ctas} persistent CTAs" if how != "grid" else "") + persistent,
                        origin=f"hopper_attention tuned record ({found[1]})" if found else None)

    rows = plan.chain.dims[3]
    return ClusterKernel(program, target, layout, f"hopper_attention ({fusion.describe()})",
                         origin="hopper_attention template defaults",
                         preferred=(lambda dims: dims[rows] > 64) if prefill_only else None,
                         keyed_scalars=tuple(dict.fromkeys(
                             (getattr(tuned, "scalar_names", ()) if not given else ())
                             + map_scalars)),
                         choice_scalars=map_scalars if prefill_only else ())


def role_strides(tensor, layout: str, roles: tuple[str, ...], declared: dict) -> tuple:
    """The element strides of ``tensor`` (its axes by role ``layout``) for the roles ``roles``,
    as a tensor map takes them: its own, or ``declared`` (contiguous ones) on an axis of one
    element, whose stride torch leaves arbitrary and no copy moves along."""
    at = {role: k for k, role in enumerate(layout)}
    return tuple(tensor.stride(at[r]) if tensor.shape[at[r]] > 1 else declared[r]
                 for r in roles)
