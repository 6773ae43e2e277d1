"""The public entry points: schedule a kernel, compile it."""
from __future__ import annotations

from dataclasses import replace

from .compiled import CompiledKernel
from .dsl.expr import user_location
from .dsl.program import TracedKernel, is_kernel
from .errors import ScheduleError
from .read_other_ways import PROGRAM_REWRITES, read_other_way, scan_refused
from .records import cpu_record, template_records
from .schedule import Schedule
from .schedule_templates import lower_program
from .schedule_templates.auto import cpu_fusion
from .schedule_templates.default import apply_default_schedule, cpu_fused
from .targets import TargetSpec, get_target
from .auto_kernel import AutoKernel
from .torch_graph import in_graph


def schedule(kernel: TracedKernel, target: "str | TargetSpec" = "auto", **dims: int) -> Schedule:
    """An interactive schedule of ``kernel`` for ``target``; sizes given here are fixed in the IR."""
    return Schedule(kernel, target, **dims)


def compile(kernel: "TracedKernel | Schedule",  # noqa: A001 - tensorfuse.compile
            target: "str | TargetSpec | None" = None,
            template: str | None = "auto", dynamic: "bool | None" = None):
    """A callable kernel. A :class:`Kernel` on a GPU target gets a template when one fits
    (``template="auto"``: its reductions fused by a rolling update into one Triton kernel), else
    TVM's default schedule; on the CPU an attention-like chain (members contracting over the
    fused axis) runs fused by a rolling update in chunks of 128 keys, other programs get the CPU
    template's row schedule (:mod:`tensorfuse.schedule_templates.cpu`); built per shape
    signature. ``template=None`` forces the default schedule, unfused (TVM code generation).
    ``target="auto"``: the local GPU if any, else the CPU. A :class:`Schedule` is compiled as
    scheduled.

    ``dynamic``: how a Triton template's kernel meets new sizes
    (:mod:`tensorfuse.targets.triton.size_builds`). ``None`` (default): the first sizes are
    written into the kernel, and a size seen at a second value becomes a kernel argument from
    then on: one build then serves every value for which the plan decides the same (a width in
    the same power-of-two block, any row count), as ``torch.compile``'s automatic dynamic
    shapes. ``True``: every size an argument from the first call; ``False``: one build per
    sizes. ``cache_info()`` on the result lists the builds and the sizes each serves."""
    if isinstance(kernel, Schedule):
        if target is not None and get_target(target).name != kernel.target.name:
            raise ScheduleError(f"this schedule is for {kernel.target.name}, not "
                                f"{get_target(target).name}", user_location())
        return kernel.compile()
    if dynamic not in (None, True, False):
        raise ScheduleError(f"dynamic must be None, True or False, not {dynamic!r}",
                            user_location())
    return in_graph(_compile(kernel, target, template, dynamic=dynamic))


def _compile(kernel, target, template, untemplated: str | None = None,
             dynamic: "bool | None" = False):
    """:func:`compile` for a kernel (the result before it gets its PyTorch operator);
    ``untemplated``: on a GPU, why no template takes it — what ``schedule_origin()`` then says
    of the default schedule; ``dynamic``: as :func:`compile` says."""
    if not is_kernel(kernel):
        raise ScheduleError(f"tensorfuse.compile takes a @tensorfuse.kernel or a schedule, got "
                            f"{type(kernel).__name__}", user_location())
    spec = get_target(target or "auto")
    program = kernel.program
    if template == "auto":
        from .schedule_templates import TEMPLATES
        from .schedule_templates.auto import (choose, computed_in_float64,
                                              contraction_templates, native_templates)

        if spec.is_gpu:   # arguments a Triton template would overwrite: named otherwise
            from .schedule_templates.renamed_params import renamed_kernel

            renamed = renamed_kernel(kernel, spec, lambda part: _compile(part, spec, "auto",
                                                                         dynamic=dynamic))
            if renamed is not None:
                return renamed
        one_row = _unit_rows(kernel, spec, dynamic) if spec.is_gpu else None
        if one_row is not None:   # values over no axis: the templates plan rows
            return one_row
        # a one-hot sum (a gathered read's gradient) as the scatter it is, a reduction up to
        # each output's own position (a cumulative sum) as the scan it is, before a template
        # takes either as a dense reduction over every output element
        read_otherwise = read_other_way(kernel, spec, dynamic) \
            if spec.is_gpu and _triton_available() else None
        if read_otherwise is not None:
            return _routed(read_otherwise, spec, dynamic)
        # the gradient of attention is planned from its forward (AttentionGradientKernel,
        # below), not rewritten as a program of its own
        from .attention_gradient import attention_forward

        attention = attention_forward(kernel, spec) if spec.is_gpu else None
        for rewrite in PROGRAM_REWRITES if spec.is_gpu and attention is None else ():
            windowed = _rewritten(kernel, spec, rewrite, dynamic)
            if windowed is not None:
                return windowed
        if spec.is_gpu and (wide := computed_in_float64(program)):   # as precise as asked
            return _untemplated(kernel, spec, wide)
        rows = _widened(kernel, spec, dynamic) if spec.is_gpu else None
        if rows is not None:
            return rows
        rewritten = _monoids_rewritten(kernel, spec, dynamic) if spec.is_gpu else None
        if rewritten is not None:
            return rewritten
        choice = choose(program, spec)
        if choice is not None and _triton_available():
            name, fusion = choice
            fallback = _compile(kernel, spec, template=None)
            # a kernel derived from another (the forward that also writes what its backward
            # reads) is tuned as that one: the same loops, one more store per row
            tuned_as = getattr(kernel, "tuned_as", None) or program
            # the Triton template takes a record of the nearest sizes in a bucket where its own
            # sizes have none (falling back to its defaults where those knobs do not fit)
            records = template_records(tuned_as, name, fusion, spec, nearest=True)
            made = TEMPLATES[name](kernel, fusion, spec, tuned=records, dynamic=dynamic,
                                   **({"staged_few_tiles": True} if name == "row_reduction"
                                      else {}))
            # the Hopper attention checks a record of other sizes of the bucket runs (the
            # cluster decode keeps records of its own sizes only)
            # (native template, why it refuses the program at any sizes)
            refused: list = scan_refused(program)
            ahead = native_templates(kernel, name, fusion, spec, records=lambda template, of=None:
                                     template_records(of or tuned_as, template, fusion, spec,
                                                      nearest=template == "hopper_attention"),
                                     refused=refused)
            ahead += _hopper_gemm_staged(kernel, spec, dynamic)
            if any(t == "hopper_attention" for t, _ in refused) and _triton_available():
                from .staged import AttentionEpilogueStages, ComputedOperandStages

                def compile_stage(part):
                    return _compile(part, spec, "auto", dynamic=dynamic)
                for stages in (AttentionEpilogueStages, ComputedOperandStages):
                    ahead += stages.made(kernel, fusion, spec, compile_stage, AutoKernel,
                                         refused)
            ahead += contraction_templates(kernel, spec, template_records(
                tuned_as, "contraction", None, spec, nearest=True), dynamic)
            ahead = _written_out(kernel, spec, dynamic) + ahead
            return _routed(AutoKernel(made, fallback, ahead=ahead,
                                      floor=_floor(kernel, spec, fusion, dynamic),
                                      refused=refused), spec, dynamic)
        gemms = contraction_templates(kernel, spec, template_records(
            program, "contraction", None, spec, nearest=True), dynamic) \
            if _triton_available() else ()
        if gemms:   # sums that are GEMMs and no chain the row-tile template takes
            return _routed(AutoKernel(gemms[0], _compile(kernel, spec, template=None),
                                      ahead=_hopper_gemm_staged(kernel, spec, dynamic),
                                      refused=scan_refused(program)), spec, dynamic)
        if spec.is_gpu:
            from .schedule_templates.auto import why_no_template

            pointwise = _pointwise(kernel, spec, dynamic)
            if pointwise is not None:   # no reductions: one flat pass over the outputs
                return _routed(pointwise, spec, dynamic)
            flat = _flattened(kernel, spec, dynamic)
            if flat is not None:
                return _routed(flat, spec, dynamic)
            why = why_no_template(program, spec)
            from .attention_gradient import AttentionGradientKernel

            def floor():
                return _staged(kernel, spec, why, dynamic=dynamic) or \
                    _untemplated(kernel, spec, why)
            # tf.grad of attention: FlashAttention-2's backward, not stages storing the scores
            return AttentionGradientKernel(kernel, spec, attention, floor, compile) \
                if attention is not None else floor()
    elif template is not None:
        raise ScheduleError(f"template must be 'auto' or None here; to pick one, use "
                            f"tensorfuse.schedule(...).rolling_update(...).apply_template"
                            f"({template!r})", user_location())

    fusion = None if spec.is_gpu or template is None else cpu_fusion(program)
    fused_records = None if fusion is None else \
        template_records(program, "cpu_fused", fusion, spec)

    def build(dims: dict, index_dtype: str):
        # records are kept for 32-bit indexing at fully given sizes
        recorded = index_dtype == "int32" and set(dims) == set(program.dim_names())
        if fusion is not None:   # attention-like chains: the rolling update, on all cores
            found = fused_records(dims) if recorded else None   # its chunk and rows (cpu_fused)
            at = fusion if found is None else replace(fusion, **found[0])
            fused = f"template defaults ({at.describe()})" if found is None else \
                f"tuned record ({at.describe()}; {found[1]})"
            return cpu_fused(program, (at,), dims, index_dtype, spec), fused
        # CPU records of the row schedule (of unfused programs only: a chain that runs fused
        # is tuned as that, above)
        found = cpu_record(program, spec, dims) if recorded and spec.kind == "llvm" else None
        if found is not None:
            return found[0], f"tuned record ({found[1]})"
        return apply_default_schedule(lower_program(program, (), dims, index_dtype,
                                                    accumulate=spec.accumulate,
                                                    vector_math=spec.vector_math), spec), \
            untemplated or "template defaults"

    return CompiledKernel(program, spec, build,
                          untemplated or "default schedule, or a tuned record")


def _routed(kernel, spec, dynamic: "bool | None"):
    """``kernel`` (a template's: an :class:`AutoKernel`, the elementwise, scan or scatter
    template's) with the routes of calls whose tensors lie in another axis order: each set of
    orders compiled as its own program (:mod:`.memory_order`)."""
    from .dsl.program import ProgramKernel
    from .memory_order import MemoryOrderRoutes

    kernel.routes = MemoryOrderRoutes(kernel, lambda program: _compile(
        ProgramKernel(program), spec, "auto", dynamic=dynamic))
    return kernel


def _untemplated(kernel, spec, why: str) -> CompiledKernel:
    """A GPU kernel no template takes: TVM's default GPU schedule, unfused, said once (a
    :class:`~tensorfuse.errors.NoTemplateWarning`) and by ``schedule_origin()`` with the
    reasons."""
    import warnings

    from .errors import NoTemplateWarning

    origin = f"TVM's default GPU schedule, unfused (no template takes {kernel.program.name}: {why})"
    compiled = _compile(kernel, spec, None, origin)
    warnings.warn(f"tensorfuse.compile: no template takes {kernel.program.name} on {spec.name} "
                  f"({why}); it runs on TVM's default GPU schedule, unfused and without "
                  "shared-memory tiles, which can be far slower than torch", NoTemplateWarning,
                  stacklevel=3)
    return compiled


def _floor(kernel, spec, fusion, dynamic: "bool | None"):
    """Where the row-tile template does not fit a call's sizes, the program's stages rather than
    TVM's untiled schedule — ``floor(why, sizes)`` makes them once, at the first sizes that need
    them. Sums only, some of them GEMMs (an FFN; a feature axis wider than a tile holds: each
    GEMM on the contraction template), and a chain whose row kernel adds sums down the rows up
    in its pass (a norm's backward, rows wider than a block: the sums then a kernel of their own,
    ``schedule_templates.column_sums``) are cut as at any sizes; any other chain is cut where its
    row tile does not plan at those sizes — attention over head dims past a tile (DeepSeek's
    latent 576 / 512), a softmax over a GEMM's wide contraction (a language model head's
    log-sum-exp over 4096 features): the scores are stored between the stages, as the unfused
    torch sequence stores them, where TVM's default schedule kept the chain in one untiled
    kernel (``benchmarks.user_kernels``' table in issue 55's terms: 2–1,000× slower than
    torch)."""
    from .schedule_templates.auto import sums_down_rows
    from .schedule_templates.contraction_plan import gemm_shaped

    program = kernel.program
    if not spec.is_gpu:
        return None
    gemms = gemm_shaped(program) and \
        all(c.monoid.name == "sum" for c in program.computes if c.is_reduction)
    at_sizes = not (gemms or sums_down_rows(program, fusion))
    return lambda why, sizes: _staged(kernel, spec, why, dynamic=dynamic,
                                      sizes=sizes if at_sizes else None)


def _pointwise(kernel, spec, dynamic: "bool | None" = None, sizes: dict | None = None):
    """A kernel without reductions (an activation, a mean's gradient), or whose reductions are
    over a few elements of literal extents (or extents in ``sizes``: a pooling window), as the
    elementwise template's one flat pass (:func:`.schedule_templates.elementwise.
    elementwise_form`, those reductions written out); else ``None``."""
    from .schedule_templates.elementwise import elementwise_form
    from .targets.triton.elementwise import ElementwiseKernel

    form = elementwise_form(kernel.program, sizes) if _triton_available() else None
    if form is None:
        return None
    made = ElementwiseKernel(form[0], spec, dynamic)
    if form[1]:
        made.description += f"; {form[1]}"
    return made


def _widened(kernel, spec, dynamic: "bool | None" = None):
    """A kernel whose chain reads tensors alone for the axes only some members have (a masked
    mean: :mod:`.schedule_templates.widened_rows`) compiled with those axes as rows; else
    ``None``."""
    from .schedule_templates.widened_rows import widened

    return _rewritten(kernel, spec, widened, dynamic)


def _unit_rows(kernel, spec, dynamic: "bool | None" = None):
    """A kernel with values reduced over every axis compiled with an axis of one element on them
    (:mod:`.schedule_templates.unit_rows`); else ``None``."""
    from .schedule_templates.unit_rows import with_unit_row

    return _rewritten(kernel, spec, with_unit_row, dynamic)


def _monoids_rewritten(kernel, spec, dynamic: "bool | None" = None):
    """A kernel reducing with ``T.logsumexp`` or an arg reduction compiled as reductions the
    templates keep (:mod:`.schedule_templates.monoid_rewrites`); else ``None``."""
    from .schedule_templates.monoid_rewrites import rewritten_monoids

    return _rewritten(kernel, spec, rewritten_monoids, dynamic)


def _rewritten(kernel, spec, rewrite, dynamic: "bool | None"):
    """The kernel of the equivalent program ``rewrite(program)`` gives (with a note saying what it
    rewrote), compiled as ``tf.compile`` compiles any, behind the user's program; else ``None``."""
    from .dsl.program import ProgramKernel
    from .widened_kernel import RewrittenKernel, quiet_if_staged

    found = rewrite(kernel.program) if _triton_available() else None
    if found is None:
        return None
    program, note = found
    inner = quiet_if_staged(lambda: _compile(ProgramKernel(program), spec, "auto",
                            dynamic=dynamic), getattr(rewrite, "staged_by_design", False))
    return RewrittenKernel(kernel.program, inner, note)


def _written_out(kernel, spec, dynamic: "bool | None" = None) -> tuple:
    """The route ahead of the templates for a kernel whose reductions may be a few elements (a
    window: :mod:`.written_out`), or nothing."""
    from .schedule_templates.elementwise import foldable
    from .written_out import WrittenOutRoute

    if not foldable(kernel.program):
        return ()
    return (WrittenOutRoute(kernel.program, spec,
                            lambda sizes: _pointwise(kernel, spec, dynamic, sizes)),)


def _flattened(kernel, spec, dynamic: "bool | None" = False):
    """A kernel whose chain reduces over several axes together (a paged cache's pages and slots)
    where a template takes it swept as one axis (:mod:`.schedule_templates.flat_sweeps`): that
    template, made per the sizes of those axes; else ``None``."""
    from .dsl.program import ProgramKernel
    from .flat_kernel import FlatSweepKernel
    from .schedule_templates.auto import flat_templated
    from .schedule_templates.flat_sweeps import flatten_sweeps, swept_together

    program = kernel.program
    if not _triton_available() or \
            flat_templated(program, dict.fromkeys(program.dim_names(), 64), spec) is None:
        return None

    def make(sizes: dict):
        # a few elements swept together (a pooling window's rows and columns): written out
        written = _pointwise(kernel, spec, dynamic, sizes)
        if written is not None:
            return written
        flat = flatten_sweeps(program, sizes)
        return _compile(ProgramKernel(flat), spec,
                        "auto", dynamic=dynamic)
    return FlatSweepKernel(program, spec, swept_together(program), make)


def _hopper_gemm_staged(kernel, spec, dynamic: "bool | None" = False) -> tuple:
    """On sm_90a, a GEMM whose sides are computed or scaled as its stages — the computed sides
    stored (``tf.compile``'s choice for them), then the Hopper GEMM with the scales in its
    epilogue — or a GEMM whose columns are reduced after it as its stages — the Hopper GEMM's
    values stored, then the reductions (:mod:`tensorfuse.schedule_templates.gemm_stages`) —, as
    a one-kernel tuple for ``AutoKernel``'s ``ahead``; else ``()``."""
    from .dsl.program import ProgramKernel
    from .schedule_templates import TEMPLATES
    from .schedule_templates.gemm_stages import hopper_gemm_stages, hopper_gemm_then_columns
    from .staged import GemmStages

    if spec.kind != "cuda" or spec.arch != "sm_90a" or not _triton_available():
        return ()
    found = hopper_gemm_stages(kernel.program) or \
        hopper_gemm_then_columns(kernel.program, spec)
    if found is None:
        return ()
    parts = [ProgramKernel(s.program)
             for s in found.stages]
    kernels = tuple(TEMPLATES["hopper_gemm"](part, None, spec) if k == found.gemm else
                    _compile(part, spec, "auto", dynamic=dynamic)
                    for k, part in enumerate(parts))
    return (GemmStages(kernel.program, spec, kernels, found),)


def _staged(kernel, spec, why: str, planned_for=None, dynamic: "bool | None" = False,
            sizes: dict | None = None):
    """The floor for a kernel no template takes whole: its stages (each a kernel of its own, cut
    where a reduction needs another's final value), where a template takes at least one of
    them; else ``None``. Said once (a :class:`~tensorfuse.errors.NoTemplateWarning`).
    ``planned_for``: the GPU target whose templates decide the cuts (default ``spec``; the CPU
    tests run a GPU's stages on the CPU target); ``sizes``: the call's, where the templates'
    row tiles decide at them (:func:`.schedule_templates.auto.templated_stages`)."""
    from .dsl.program import ProgramKernel
    import warnings

    from .errors import NoTemplateWarning
    from .schedule_templates.auto import templated_stages
    from .staged import StagedKernel

    planned_for = planned_for or spec
    stages = templated_stages(kernel.program, planned_for, sizes) if _triton_available() else ()
    if not stages:
        return None
    kernels = []
    for stage in stages:
        part = ProgramKernel(stage.program)
        kind = "one reduction" if stage.reduces else "elementwise"
        kernels.append(_compile(part, spec, "auto", dynamic=dynamic) if stage.templated else
                       _compile(part, spec, None,
                                f"TVM's default {spec.kind.upper()} schedule ({kind})"))
    staged = StagedKernel(kernel.program, spec, tuple(stages), tuple(kernels), why)
    warnings.warn(f"tensorfuse.compile: no template takes {kernel.program.name} whole on "
                  f"{planned_for.name} ({why}); it runs as {len(stages)} kernels, each with its "
                  "own template where one takes it, their results stored between them: "
                  + "; ".join(s.describe() for s in stages), NoTemplateWarning, stacklevel=4)
    return staged


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
