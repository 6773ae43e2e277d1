"""Pick a template for a kernel when the user asks for none: fuse the reductions that share the
most-reduced axis and use the GPU template that fits (a native CUDA C++ one first where the GPU
has one for the chain); otherwise keep the default schedule."""
from __future__ import annotations

from dataclasses import replace

from ..algebra import chain_candidates, plan_chain
from ..algebra.chain import Chain
from ..dsl import dtypes as dt
from ..dsl.program import Program
from ..errors import RollingUpdateError, ScheduleError, TargetError
from ..targets import TargetSpec
from .cluster import attention_decode
from .contraction import triton_contraction
from .contraction_plan import gemm_shaped, plan_contraction
from .elementwise import elementwise_form
from .fusion import Fusion
from .hopper_attention import hopper_attention
from .hopper_ffn import hopper_ffn
from .hopper_gemm import hopper_gemm
from .rolling_update import CPU_CHUNK, DEFAULT_CHUNK
from .tile_plan import plan_rowtile
from .unit_rows import with_unit_row


def choose(program: Program, target: TargetSpec):
    """``(template name, fusion)`` for ``program`` on ``target``, or ``None``."""
    if not target.is_gpu:
        return None
    return next((found for found, _ in _gpu_candidates(program) if found is not None), None)


def flat_templated(program: Program, sizes: dict, target: TargetSpec) -> Program | None:
    """``program`` swept as one axis over the axes it reduces together
    (:mod:`.flat_sweeps`) at ``sizes``, where a template on ``target`` takes that flat program;
    else None. What ``tf.compile`` runs such a chain as, and so what tuning tunes."""
    from .flat_sweeps import flatten_sweeps, swept_together

    if swept_together(program) is None:
        return None
    flat = flatten_sweeps(program, sizes)
    return flat if flat is not None and choose(flat, target) is not None else None


def templated_stages(program: Program, target: TargetSpec, sizes: dict | None = None) -> tuple:
    """The stages ``tf.compile``'s floor cuts ``program`` into (:func:`.stages.plan_stages`, by
    what a template on ``target`` takes — at ``sizes`` where given: a chain whose feature axis
    is wider than a row tile at the call's sizes is cut there), where a template takes at least
    one of them; else ``()`` (TVM's default schedule of the whole program is as good as its
    pieces')."""
    from .stages import NotStageable, plan_stages

    try:   # the program itself swept as one over several axes was tf.compile's try before
        stages = plan_stages(program, lambda sub: takes_stage(sub, target,
                                                              swept_as_one=sub is not program,
                                                              sizes=sizes))
    except NotStageable:
        return ()
    return stages if any(s.templated for s in stages) else ()


def takes_stage(program: Program, target: TargetSpec, swept_as_one: bool = True,
                sizes: dict | None = None) -> bool:
    """Whether a template takes a stage of the floor: the contraction template its GEMMs, the
    row-tile template the rest. Sums only, of which some are GEMMs the contraction template
    refuses together (two weight gradients into differently indexed outputs), are cut further:
    the row-tile template would take them whole at a placeholder size and then run them a row at
    a time on the CUDA cores, or not at all at the real sizes. ``swept_as_one``: a stage whose
    reductions sweep several axes together counts where a template takes it swept as one axis
    (:func:`flat_templated`: a group norm's backward, its statistics over c and p). ``sizes``:
    a chain counts only where its row tile plans at them (its feature axis held whole)."""
    if not target.is_gpu:
        return False
    if scatters(program) or _contraction_takes(program, sizes):
        return True
    if not any(c.is_reduction for c in program.computes):   # the elementwise template's
        return elementwise_form(program) is not None
    if all(c.monoid.name == "sum" for c in program.computes if c.is_reduction) and \
            gemm_shaped(program):
        return False
    found = choose(program, target)
    if found is None:
        one_row = with_unit_row(program)
        if one_row is not None:   # a value over no axis: one row (tf.compile rewrites it so)
            return takes_stage(one_row[0], target, swept_as_one)
        # reductions over several axes together, a template's once swept as one
        return swept_as_one and \
            flat_templated(program, dict.fromkeys(program.dim_names(), 64), target) is not None
    if sizes is not None and not _plans_at(program, found[1], sizes, target):
        return False
    # a chain whose row kernel adds sums down the rows up (column_sums) is staged where that
    # kernel does not fit: the sums then run as a stage of their own
    return not sums_down_rows(program, found[1])


def _contraction_takes(program: Program, sizes: dict | None) -> bool:
    """Whether the contraction template plans ``program`` and does not leave it to the row-tile
    template at ``sizes`` (:func:`.contraction.left_to_row_tiles`; names ``sizes`` lacks: at the
    placeholder 64)."""
    from .contraction import left_to_row_tiles

    try:
        plan = plan_contraction(program)
    except ScheduleError:
        return False
    return not left_to_row_tiles(plan, {n: (sizes or {}).get(n, 64)
                                        for n in program.dim_names()})


def _plans_at(program: Program, fusion: Fusion, sizes: dict, target: TargetSpec) -> bool:
    """Whether the row-tile plan of ``program`` (fused by ``fusion``) takes these sizes (names
    ``sizes`` lacks: at the placeholder 64), at its default knobs one kernel for them
    (:func:`.row_reduction.few_tiles_for_outputs`), its features in chunks as the attention
    template's defaults take them (:func:`.attention.chunked_refusal`)."""
    from ..targets.triton.rowtile import held_refusal
    from .row_reduction import default_knobs, few_tiles_for_outputs

    at = {n: sizes.get(n, 64) for n in program.dim_names()}
    try:
        plan = plan_rowtile(program, plan_chain(program, fusion.names, fusion.axis,
                                                held=fusion.held), at)
    except TargetError:
        return False
    if held_refusal(plan, default_knobs(plan, target)):   # members held to a block: a wider
        return False                                      # row runs as the floor's stages
    if plan.feature_chunk is not None:   # features in chunks: as the attention template's
        from .attention import chunked_refusal, default_knobs as attention_knobs   # defaults
        return chunked_refusal(plan, attention_knobs(plan, target), target) is None
    return few_tiles_for_outputs(plan, default_knobs(plan, target), target) is None


def scans_apart(program: Program) -> bool:
    """Whether ``program``'s reductions (two or more) are each a scan that the scan template
    does not take together (a chain's states, or a sum over a row axis after the scan): a
    gradient's sums to the end discounted each its own way — the row template would take them
    together as N² terms a row."""
    from .chain_scans import plan_chain_scan
    from .scan import is_scan, plan_scan, planned

    reductions = [c for c in program.computes if c.is_reduction]
    return len(reductions) > 1 and all(is_scan(c) for c in reductions) and \
        not planned(plan_scan, program) and not planned(plan_chain_scan, program)


def scatters(program: Program) -> bool:
    """Whether ``program`` is a scatter-add (:mod:`.scatter`: a gathered read's gradient)."""
    from .scan import planned
    from .scatter import plan_scatter

    return planned(plan_scatter, program)


def sums_down_rows(program: Program, fusion: Fusion) -> bool:
    """Whether the row-tile plan of ``program`` fused by ``fusion`` adds sums down the rows up
    in its pass (:mod:`.column_sums`)."""
    chain = plan_chain(program, fusion.names, fusion.axis, held=fusion.held)
    return bool(plan_rowtile(program, chain, dict.fromkeys(program.dim_names(), 64)).column_sums)


def contraction_templates(kernel, spec: TargetSpec, records=None,
                          dynamic: "bool | None" = None) -> tuple:
    """The contraction template (GEMM tiles on the tensor cores, :mod:`.contraction`) where
    the program's sums are GEMMs, on every GPU target; after the native Hopper templates (the
    Hopper GEMM takes the GEMMs it can: faster where both run) and before the row-tile
    template, which runs GEMMs a row at a time on the CUDA cores. ``records``: the compile
    entry point's lookup of its tuning records; ``dynamic``: ``tf.compile``'s."""
    if not spec.is_gpu or not spec.has_tensor_cores:
        return ()
    return tuple(_made(triton_contraction, kernel, spec, tuned=records, dynamic=dynamic,
                       routed=True))


def computed_in_float64(program: Program) -> str | None:
    """Why the GPU templates other than the scan, band and scatter-add do not take ``program``:
    it computes values in float64 (read as f64 and not cast), and they keep their running
    states, partials and products in float32 — they returned f64 outputs at f32's precision
    (a log-sum-exp of f64 rows 3e-8 off). None where nothing is computed in float64."""
    # (the values' own types: an output stored as f64 from f32 values is computed in f32)
    wide = [c.name for c in program.computes
            if "f64" in (dt.resolve(b.dtype) for b in c.bodies)]
    return None if not wide else (f"{', '.join(wide)} computed in float64, which the GPU "
                                  "templates keep in float32")


def why_no_template(program: Program, target: TargetSpec) -> str:
    """Why :func:`choose` found no GPU template for ``program``: each candidate chain's
    refusal, or that it has no reduction chain to fuse."""
    reasons = [why for found, why in _gpu_candidates(program) if found is None]
    return "; ".join(reasons) or "it has no reductions over one axis to fuse"


def _gpu_candidates(program: Program):
    """For the reductions sharing each axis, the most shared first: ``((template name, fusion),
    None)`` where the row-tile template takes them, else ``(None, why not)``. Reductions that
    are each a scan (:func:`scans_apart`) are left to the floor's stages: the row template
    would sweep every prefix."""
    if scans_apart(program):
        yield None, ("its reductions are each a scan of their own, not one together: a stage "
                     "each (N terms a row, not N² on the row template)")
        return
    for members, axis in chain_candidates(program):
        fusion = Fusion(tuple(m.name for m in members), axis.name, DEFAULT_CHUNK)
        try:
            fusion, chain = _chain_or_held(program, fusion, axis)
            plan_rowtile(program, chain, {d: 64 for d in program.dim_names()})
        except (RollingUpdateError, TargetError) as exc:
            yield None, f"{', '.join(fusion.names)} over {axis.name}: {exc}"
            continue
        yield ("attention" if _contracts(chain) else "row_reduction", fusion), None


def _chain_or_held(program: Program, fusion: Fusion, axis) -> tuple[Fusion, Chain]:
    """``fusion`` and its chain over ``axis``; where a member no correction carries refuses it,
    the chain with such members held to rows of one block and the fusion marked so (the
    row-tile template's, where a block holds the row; wider rows run as the floor's) — not a
    chain that contracts (attention's keys are swept in blocks): the refusal stands there."""
    try:
        return fusion, plan_chain(program, fusion.names, axis)
    except RollingUpdateError as refused:
        held = plan_chain(program, fusion.names, axis, held=True)
        if _contracts(held):
            raise refused
        return replace(fusion, held=True), held


def cpu_fusion(program: Program) -> Fusion | None:
    """The rolling update ``tf.compile`` uses on the CPU: a chain whose members contract over
    the fused axis (attention's ``p·v``, or scores recomputed per chunk) runs fused, one chunk
    of keys per step with its per-key values computed once (measured faster than the unfused
    rows: ``benchmarks.cpu``), :data:`CPU_ROWS` rows at a time; other programs
    (softmax, norms: one row in cache) keep the row schedule."""
    for fusion, chain in _fusions(program, CPU_CHUNK):
        return replace(fusion, rows=CPU_ROWS) if _contracts(chain) else None
    return None


# rows of a fused chain one core sweeps together on the CPU (Fusion.rows). Causal attention,
# B=1, H=8, D=64, 2 Zen 4 cores, f32, one row at a time → 4: 256 keys 1.34 → 1.09 ms, 1024 keys
# 14.5 → 12.3, 2048 57.3 → 43.2, 4096 236.9 → 164.7 (bf16 similar); sliding window 23.7 → 17.1,
# other variants 1-6 % faster (``benchmarks.cpu``); 8 rows spilled.
CPU_ROWS = 4


def _fusions(program: Program, chunk: int):
    """``(fusion, chain)`` for the reductions sharing each axis, the most shared axis first,
    where they fuse."""
    for members, axis in chain_candidates(program):
        fusion = Fusion(tuple(m.name for m in members), axis.name, chunk)
        try:
            yield fusion, plan_chain(program, fusion.names, axis)
        except RollingUpdateError:
            continue


def _contracts(chain) -> bool:
    return bool(chain.local_reductions) or any(len(m.axes) > len(chain.common_axes)
                                               for m in chain.members)


def native_templates(kernel, name: str, fusion, spec: TargetSpec, records=None,
                     refused: list | None = None) -> tuple:
    """Templates generated as CUDA C++ for this GPU that ``tf.compile`` tries before the Triton
    one, on sm_90a: GEMM-shaped programs (one or two sums of products sharing their rows operand,
    with an elementwise output) get the persistent Hopper GEMM, GEMM chains (FFN) with more than
    32 rows two of them (the activation in the first's epilogue) and fewer rows the cluster
    template (the intermediate kept in the cluster's shared memory); softmax attention gets the
    warp-specialised Hopper template for prefill (more than 64 query rows) and, for one query
    token (decode), the cluster decode kernel (the keys of each (batch, kv-head) split over a
    thread-block cluster, states merged in distributed shared memory) where it beats the split
    update: under 32 (batch, kv-head) pairs over caches under 256 MB
    (:func:`.decode_plan.cluster_decode_pays`, from ``benchmarks.decode_grid --routes``); other
    few-row calls, and decode chains it refuses, go to the Triton template's split update — a
    mask that reads the sequence as a 2-D/3-D map in patches copied as TMA boxes where the call's
    map allows it (``hopper_tiling``), else on the Triton template, which gathers the patches —
    each measured faster than the Triton template (``benchmarks.hopper_attention``,
    ``benchmarks.cluster``, ``benchmarks.neighborhood``). Sizes a native template refuses go to
    the Triton one.
    ``records(template name, program=None)``: the compile entry point's lookup of tuning records
    for a template with a tuning space (``hopper_attention``, ``cluster_decode``), of ``program``
    where given (a lifted decode's) instead of the kernel's. ``refused``: where given, gets
    ``(template, reason)`` for each attention template that refuses the program at any sizes (a
    user asking why the Triton template runs an attention: its output in float32, say)."""
    if spec.kind != "cuda" or spec.arch != "sm_90a":
        return ()
    made = _made(hopper_gemm, kernel, fusion, spec, automatic=True) + \
        _ffn_templates(kernel, fusion, spec)
    if name == "attention":
        made += _made(hopper_attention, kernel, fusion, spec, prefill_only=True,
                      tuned=records("hopper_attention") if records else None,
                      refused=refused) or _merged_heads(kernel, fusion, spec, records) or \
            _one_cache_prefill(kernel, fusion, spec, records) or \
            _selected_prefill(kernel, fusion, spec, records) or \
            _shared_queries_prefill(kernel, fusion, spec, records) or \
            _reordered_prefill(kernel, fusion, spec, records)
        made += _packed_decodes(kernel, fusion, spec)
        decode = dict(description=f"cluster_decode (the keys {fusion.axis} split over a cluster "
                                  "per (batch, kv-head))", routed=True)
        made += _made(attention_decode, kernel, fusion, spec, fusion.axis,
                      tuned=records("cluster_decode") if records else None, **decode) or \
            _lifted_decode(kernel, fusion, spec, decode, records)
    return tuple(made)


def _lifted_decode(kernel, fusion, spec: TargetSpec, knobs: dict, records=None) -> list:
    """The cluster decode of a decode written without its query axis (and kv-head axis: every
    head on one cache), lifted to four axes: the split update that took it otherwise sweeps few
    (batch, head) rows poorly — benchmarks.packed_decode, one batch of 8 heads over 131k keys on
    one cache: 55 µs, where the decode written with both axes runs the cluster kernel's 37. Its
    tuning records are the lifted program's at the lifted sizes (what
    :func:`~tensorfuse.autotune.tasks.make_task` tunes for such a decode):
    ``records(template, program)``."""
    from .packed_lift import lift_to_four_axes

    return _on_lifted(kernel, fusion, spec, lift_to_four_axes, attention_decode,
                      "cluster_decode", records, fusion.axis, **knobs)


def _on_lifted(kernel, fusion, spec: TargetSpec, lift, template, record: str, records,
               *args, **knobs) -> list:
    """``template`` on the program ``lift`` makes of ``kernel``'s (unit axes added), as kernels
    of the program as written (:class:`.lifted_kernel.LiftedKernel`: the caller's tensors viewed
    with the unit axes); the lifted program's tuning records of ``record``'s template."""
    from ..dsl.program import ProgramKernel
    from .lifted_kernel import LiftedKernel
    from .packed_lift import added_units

    lifted = lift(kernel.program, fusion.names, fusion.axis)
    if lifted is None:
        return []
    program, inserts = lifted
    tuned = records(record, program) if records else None
    return [LiftedKernel(kernel.program, inserts, inner, spec, added_units(program))
            for inner in _made(template, ProgramKernel(program), fusion, spec, *args,
                               tuned=tuned, **knobs)]


def _merged_heads(kernel, fusion, spec: TargetSpec, records=None) -> list:
    """The Hopper attention of grouped-query attention written with its query heads as two
    axes (:mod:`.merged_heads`), which the Triton template took otherwise; its tuning records are
    the merged program's."""
    from .lifted_kernel import MergedHeadsKernel
    from .merged_heads import merge_head_axes

    merged = merge_head_axes(kernel.program, fusion.names, fusion.axis)
    if merged is None:
        return []
    return _hopper_prefill_of(merged.program, fusion, spec, records,
                              lambda inner: MergedHeadsKernel(kernel.program, merged, inner, spec))


def _hopper_prefill_of(program, fusion, spec: TargetSpec, records, wrap) -> list:
    """The Hopper attention (prefill) of ``program``, a rewrite of a kernel's, each kernel
    wrapped by ``wrap`` as a kernel of the program as written; tuned by ``program``'s records."""
    from ..dsl.program import ProgramKernel

    tuned = records("hopper_attention", program) if records else None
    return [wrap(inner) for inner in _made(hopper_attention, ProgramKernel(program), fusion,
                                           spec, prefill_only=True, tuned=tuned)]


def _one_cache_prefill(kernel, fusion, spec: TargetSpec, records=None) -> list:
    """The Hopper attention of multi-query attention written with no head axis on its keys and
    values (:func:`.packed_lift.lift_one_cache`: a unit kv-head axis added, the caller's k and
    v viewed with it), which the Triton template took otherwise."""
    from .packed_lift import lift_one_cache

    return _on_lifted(kernel, fusion, spec, lift_one_cache, hopper_attention,
                      "hopper_attention", records, prefill_only=True)


def _selected_prefill(kernel, fusion, spec: TargetSpec, records=None) -> list:
    """The Hopper attention of attention whose tensors are read at constant indices (q, k and v
    the slices of one packed ``qkv``: :mod:`.selected_views`), run on the caller's slices (views,
    read by their strides), which the Triton template took otherwise; its tuning records are the
    selected program's."""
    from .selected_views import SelectedKernel, select_constant_indices

    selected = select_constant_indices(kernel.program)
    if selected is None:
        return []
    return _hopper_prefill_of(selected.program, fusion, spec, records,
                              lambda inner: SelectedKernel(kernel.program, selected, inner, spec))


def _shared_queries_prefill(kernel, fusion, spec: TargetSpec, records=None) -> list:
    """The Hopper attention of attention whose queries are shared by the batch (learned latent
    queries: :mod:`.shared_queries`, q copied once per sequence), which the Triton template
    took otherwise; its tuning records are the rewritten program's."""
    from .shared_queries import SharedQueriesKernel, lift_shared_queries

    shared = lift_shared_queries(kernel.program, fusion.names, fusion.axis)
    if shared is None:
        return []
    return _hopper_prefill_of(shared.program, fusion, spec, records,
                              lambda inner: SharedQueriesKernel(kernel.program, shared, inner,
                                                                spec))


# Decodes whose kv-heads each serve a large group of query heads, as (smallest group, largest
# group, consumer warpgroups, fewest (batch, kv-head) pairs, knobs — where shared memory does not
# hold them, the template's defaults): packed as the rows of the Hopper attention kernel, split
# along the keys over every CTA. benchmarks.packed_decode, B16 at 16k keys: 64 heads on one
# cache 57 µs against the cluster decode's 82, 128 heads 63 against 145; a third key slot where
# shared memory holds it (head dims to 128): 64 heads 57 → 53 µs, 128 heads (blocks of 64 keys)
# 63 → 57; at 64k keys within 1 %. Groups of 32–63 (H200, graph-replayed, against the cluster
# decode): 32 heads B4 at 32k keys 48 µs against 57, B8 at 4k 22 against 30, B16 at 8k 37 against
# 61, 48 heads B8 at 16k 41 against 49. With few pairs a tile is cut over every SM and its pieces
# merged in two rounds (parts/scheduler.TREE_FROM): one pair of 128 heads at 131k keys 51 µs
# against 75, two pairs of 64 heads at 64k 45 against 50, of 32 heads 44 against 46; one pair of
# 64 heads at 131k ties (47.5 against 46.4), one of 32 at 32k loses (27 against 25).
PACKED_DECODES = ((32, 63, 1, 2, dict(stages=3)), (64, 64, 1, 2, dict(stages=3)),
                  (65, 128, 2, 1, dict(stages=3, block_n=64)))


# A decode written without its query axis, every head on one cache (``q[b, h, d]``,
# ``k[b, j, d]``: lifted to four axes) packs at every pair count: the Triton split update that
# takes it otherwise splits few (batch) rows poorly — benchmarks.packed_decode, one or two
# batches of 32–64 heads at 32k–131k keys: 143–259 µs against the packed kernel's 27–46.
LIFTED_PACKED_DECODES = tuple((low, high, consumers, 1, knobs)
                              for low, high, consumers, _, knobs in PACKED_DECODES)


def _packed_decodes(kernel, fusion, spec: TargetSpec) -> list:
    """The packed decode routes (:data:`PACKED_DECODES`) for a decode with no mask (a mask
    keeps the Hopper kernel off its split schedule) written with a kv-head axis (the Hopper
    attention plans it), or without one and its query axis (:data:`LIFTED_PACKED_DECODES`)."""
    from .hopper_attention_plan import plan_hopper_attention
    from .packed_kernel import PackedDecodeRoute
    from .packed_lift import lift_to_four_axes
    from .packed_rows import reads_query_head

    routes, program = PACKED_DECODES, kernel.program
    try:
        plan = plan_hopper_attention(program, fusion.names, fusion.axis)
    except ScheduleError:
        lifted = lift_to_four_axes(program, fusion.names, fusion.axis)
        if lifted is None:
            return []
        program = lifted[0]
        try:
            plan = plan_hopper_attention(program, fusion.names, fusion.axis)
        except ScheduleError:
            return []
        routes = LIFTED_PACKED_DECODES
    if plan.mask is not None or plan.chain.sink is not None:   # packing refuses sinks
        return []
    if plan.keys_innermost:   # keys kept transposed: checked on the GPU unpacked only
        return []
    # a term per query head (a temperature, an ALiBi slope) packs, but is then read and applied
    # per score element: 64 heads on one cache at 16k keys, B16, with a temperature per head
    # took 170 µs packed against the cluster decode's 86 (H200; ALiBi over 32-head groups, B8:
    # 132 against 78)
    refusal = ""
    if reads_query_head(program, plan.chain):
        refusal = ("it reads the query head apart from q·k, which packed rows apply per score "
                   "element (measured twice the cluster decode's time; packed_attention() runs "
                   "it)")
    return [PackedDecodeRoute(kernel, fusion, spec, plan.chain.dims[:4], (low, high), pairs,
                              refusal=refusal, consumers=consumers, schedule="split", **chosen)
            for low, high, consumers, pairs, knobs in routes for chosen in (knobs, {})]


def _reordered_prefill(kernel, fusion, spec: TargetSpec, records=None) -> list:
    """The Hopper attention of attention with one tensor holding its head dim outside another
    axis (:mod:`.reordered_operands`: that tensor copied with it innermost before each call),
    which the Triton template took otherwise; its tuning records are the reordered program's."""
    from ..targets.triton.elementwise import ElementwiseKernel
    from .elementwise import elementwise_form
    from .reordered_operands import ReorderedKernel, head_dims_innermost

    reordered = head_dims_innermost(kernel.program, fusion.names, fusion.axis)
    if reordered is None:
        return []

    def copy(program):   # a transpose: the elementwise template's tiles
        return ElementwiseKernel(elementwise_form(program)[0], spec)
    return _hopper_prefill_of(reordered.program, fusion, spec, records,
                              lambda inner: ReorderedKernel(kernel.program, reordered, inner,
                                                            spec, copy))


def _made(template, *args, refused: list | None = None, **knobs) -> list:
    """``[template(*args, **knobs)]``, or ``[]`` where the program is not its pattern (and
    ``(the template's name, its reason)`` appended to ``refused`` where given)."""
    try:
        return [template(*args, **knobs)]
    except ScheduleError as exc:
        if refused is not None:
            refused.append((template.__name__, exc.message))
        return []


def _ffn_templates(kernel, fusion, spec: TargetSpec) -> list:
    """GEMM chains: the Hopper FFN above ``hopper_ffn.FEW_ROWS`` rows and the cluster template at
    fewer (the intermediate kept in the cluster's shared memory, the weights read once), or —
    where the cluster template cannot read the weights (``[out, in]``) — the Hopper FFN at every
    M (the Triton template took 97 ms at M=128 there; the Hopper FFN 0.16 ms)."""
    from .cluster import gemm_chain
    from .gemm_chain_plan import plan_gemm_chain

    cluster = _made(lambda: gemm_chain(kernel, spec, plan_gemm_chain(kernel.program).axis))
    return _made(hopper_ffn, kernel, fusion, spec, prefill_only=bool(cluster)) + cluster
