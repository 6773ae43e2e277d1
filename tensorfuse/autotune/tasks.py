"""Tuning tasks: one kernel at fixed sizes on one target, as a MetaSchedule workload and space.

The workload is the TensorIR the kernel is compiled from at those sizes, so the database is
keyed exactly by what ``tensorfuse.compile`` will look up:
- CPU (``llvm``): the plain lowering; the space is the CPU template's (parallel outer loops,
  sampled vector widths and unroll depth), built and run by TVM. A chain ``tf.compile`` runs
  fused on the CPU (attention-like: ``cpu_fused``): its fused lowering, the space its chunk and
  block of rows (:class:`.spaces.CpuFusedSpace`), each candidate lowered for its knobs and built
  in the job's process, run by TVM.
- GPU: the program with its reductions fused by the template ``auto`` picks (attention or row
  reduction), marked with the template's name; the space samples the template's knobs (tile
  sizes, warps, pipeline stages, split parts) with ``sample_categorical`` and records each
  choice as an annotation on the root block, which the Triton builder reads back.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import tvm

from ..binding import check_index_arithmetic
from ..dsl.program import Program, ProgramKernel
from ..errors import TuningError
from ..index_checks import IndexOutOfRange
from ..schedule_templates import lower_program
from ..schedule_templates.annotations import KNOB_PREFIX, TEMPLATE_ATTR
from ..schedule_templates.fusion import Fusion
from ..targets import TargetSpec, get_target
from .scalars import (SCALARS_ATTR, bind_scalars_of, check_scalars, plan_values, scalars_json,
                      scalars_label)

TASK_ATTR = "tensorfuse.task"
KNOB_ORDER = ("block_m", "block_n", "num_warps", "num_stages", "splits", "reload",  # Triton
              "stages", "consumers", "overlap", "pingpong", "schedule",     # hopper_attention
              "ctas_per_sm", "chunk", "rows",                               # … / cpu_fused
              "cluster", "warps", "copy",                                   # cluster_decode
              "block_k", "group_m", "stage_sides",                          # contraction
              "row_tiles", "lanes")                                         # row sums, lanes


def workload(program: Program, template: str, fusion: Fusion | None, dims: dict,
             scalars: dict | None = None, bind_scalars: bool = True) -> tvm.IRModule:
    """The TensorIR a kernel is tuned and looked up by (one function named ``main``).

    MetaSchedule measures functions of tensors only, so scalar parameters are bound: the plan
    scalars (masks, indices: :mod:`.scalars`) to ``scalars``' values or their defaults, the others
    to their canonical defaults, so that records are kept per mask geometry and not per softcap. A
    tuned trace replays on the unbound function as well, since the loops and blocks are the same.
    The function carries the task's name and its plan scalars' values as attributes, which is how
    a lookup finds the records of other values (:func:`.lookup.tuned`)."""
    if template in ("cpu", "cpu_fused"):   # lowered as tf.compile lowers it for the CPU, but
        cpu = get_target("llvm")          # exponentials written out: MetaSchedule counts flops
        mod = lower_program(program, () if template == "cpu" else (fusion,), dims, "int32",
                            None if template == "cpu" else "cpu", accumulate=cpu.accumulate,
                            vector_math=cpu.vector_math)
    else:   # a GPU template's fused chain; the contraction template's plain sums
        mod = lower_program(program, (fusion,) if fusion is not None else (), dims)
    func = next(iter(mod.functions.values()))
    if template == "cpu":   # computes every element, masked or not: no scalar changes its plan
        scalars = None
    if bind_scalars:
        func = bind_scalars_of(func, program, dims, scalars)
    plan = plan_values(program, template, dims, scalars)
    func = func.with_attr(TEMPLATE_ATTR, template).with_attr(
        TASK_ATTR, task_name(program.name, dims)).with_attr(SCALARS_ATTR, scalars_json(plan))
    return tvm.IRModule({"main": func})


def task_name(kernel_name: str, dims: dict) -> str:
    """``softmax[M=256,N=1024]``: a kernel at fixed sizes."""
    return f"{kernel_name}[{','.join(f'{k}={v}' for k, v in sorted(dims.items()))}]"


def task_label(base: str, plan: dict) -> str:
    """A task's name with its plan scalars by name: ``sliding_window[…]{window=2048}``,
    ``neighborhood_attention_2d[…]{dilation=2, radius=7, width=64}`` (sorted: the job names a
    task from the program's order, a candidate from its workload's JSON)."""
    return f"{base}{{{scalars_label({n: plan[n] for n in sorted(plan)})}}}" if plan else base


def tuning_target(target: TargetSpec) -> tvm.target.Target:
    """The TVM target records are made for: for the CPU, ``tf.compile``'s (this CPU's vector
    units, ``mcpu``) with its core count, which MetaSchedule's parallel rules read. Without
    ``mcpu`` candidates were built and timed for x86-64's SSE2 while ``tf.compile`` builds for
    AVX-512 (4096² softmax: 52 ms measured in tuning against 4.8 ms called), and the vector widths
    a job chose were chosen for another ISA."""
    if target.kind == "llvm":
        import os

        config = dict(target.tvm_target.export())
        return tvm.target.Target({"kind": "llvm", "mcpu": str(config.get("mcpu", "generic")),
                                  "num-cores": max(1, os.cpu_count() or 1)})
    return target.tvm_target


def knobs_of(mod: tvm.IRModule) -> dict[str, int]:
    """The template knobs recorded on a scheduled workload's root block."""
    func = mod["main"]
    annotations = func.body.block.annotations
    return {key[len(KNOB_PREFIX):]: int(value) for key, value in annotations.items()
            if key.startswith(KNOB_PREFIX)}


def knob_space(choices: dict[str, tuple[int, ...]], fixed: dict[str, int] | None = None):
    """A MetaSchedule schedule function sampling one value per knob (uniformly); with ``fixed``,
    the decisions that pick those values (the template defaults, measured first)."""
    names = [n for n in KNOB_ORDER if n in choices]

    def space(sch: tvm.s_tir.Schedule) -> None:
        root = sch.get_sblock("root")
        for name in names:
            values = [int(v) for v in choices[name]]
            decision = values.index(fixed[name]) if fixed else None
            picked = sch.sample_categorical(values, [1.0 / len(values)] * len(values),
                                            decision=decision)
            sch.annotate(root, KNOB_PREFIX + name, picked)

    return space


@dataclass
class TuningTask:
    """One kernel at fixed sizes on one target."""

    kernel: object            # a tensorfuse Kernel
    dims: dict
    target: TargetSpec
    template: str             # "cpu", "cpu_fused", "attention", "row_reduction", "hopper_attention",
    #                           "cluster_decode", "contraction"
    fusion: Fusion | None = None
    scalars: dict = field(default_factory=dict)   # the user's values (others: the defaults)
    mod: tvm.IRModule = field(init=False, repr=False)
    name: str = field(init=False)   # kernel, sizes and plan scalars: sliding[…]{window=2048}
    _kernels: dict = field(init=False, repr=False, default_factory=dict)
    _unfit: dict = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self):
        program = self.kernel.program
        self.mod = workload(program, self.template, self.fusion, self.dims, self.scalars)
        self.name = task_label(task_name(self.kernel.name, self.dims),
                               plan_values(program, self.template, self.dims, self.scalars))

    @functools.cached_property
    def space(self):
        """The template's knob space (:mod:`.spaces`)."""
        from .spaces import space_of

        return space_of(self)

    @property
    def space_size(self) -> int | None:
        """How many schedules the space holds (template knobs only; None for the CPU space)."""
        if self.template == "cpu":
            return None
        return math.prod(len(v) for v in self.choices().values())

    def choices(self) -> dict[str, tuple[int, ...]]:
        """The template's knob values for these sizes."""
        return self.space.choices()

    def unfit(self, knobs: dict) -> str | None:
        """Why a setting of the knobs cannot run on the target (shared memory, registers), or
        None; such settings are never proposed (:class:`.pruning.FitsDevice`)."""
        if self.template == "cpu":
            return None
        key = tuple(sorted(knobs.items()))
        if key not in self._unfit:
            self._unfit[key] = self.space.unfit(knobs)
        return self._unfit[key]

    def default_schedule(self) -> tvm.s_tir.Schedule | None:
        """The template defaults as a point of the space (None where they are not one)."""
        sch = tvm.s_tir.Schedule(self.mod)
        if self.template == "cpu":
            from ..schedule_templates.cpu import cpu_search_space

            cpu_search_space(sch, defaults=True)
            return sch
        choices = self.choices()
        knobs = self.space.defaults()
        if any(knobs[name] not in values for name, values in choices.items()):
            return None
        knob_space(choices, {name: knobs[name] for name in choices})(sch)
        return sch

    def candidate(self, knobs: dict[str, int] | None):
        """The template's kernel with ``knobs`` fixed (``None``: the template defaults), made
        once per knob setting (the builder's kernel is the one the runner times)."""
        key = tuple(sorted((knobs or {}).items()))
        if key not in self._kernels:
            self._kernels[key] = self.space.candidate(knobs)
        return self._kernels[key]


def make_tasks(kernel, dims: dict, target: TargetSpec,
               scalars: dict | None = None) -> list[TuningTask]:
    """The tasks tuning ``kernel`` at ``dims`` makes: :func:`make_task`'s one, or where no GPU
    template takes the kernel whole and ``tf.compile`` runs it as stages
    (:mod:`~tensorfuse.schedule_templates.stages`), one per stage a template takes — each under
    the stage program's name and sizes, which is how the staged kernel's stages look their
    records up."""
    from ..schedule_templates.auto import templated_stages

    try:
        return [make_task(kernel, dims, target, scalars)]
    except TuningError as refused:
        stages = templated_stages(kernel.program, target) if target.is_gpu else ()
        if not stages:
            raise refused from None
    scalars = scalars or {}
    tasks, untunable = [], []
    for stage in (s for s in stages if s.templated):
        own = set(stage.program.dim_names())
        named = {p.name for p in stage.program.scalar_params}
        part = ProgramKernel(stage.program)
        try:
            tasks.append(make_task(part, {n: v for n, v in dims.items() if n in own}, target,
                                   {n: v for n, v in scalars.items() if n in named}))
        except TuningError as exc:   # a stage on a template with no tuning space yet
            untunable.append(exc)
    if not tasks:
        raise untunable[0]
    return tasks


def _refuse_elementwise(kernel, form, target: TargetSpec) -> None:
    """A :class:`TuningError` where ``tf.compile`` runs ``kernel`` on the elementwise template
    (``form``: :func:`~tensorfuse.schedule_templates.elementwise.elementwise_form`'s answer)."""
    if form is not None:
        how = form[1] or "no reductions"
        raise TuningError(f"{kernel.name} runs on the elementwise template on {target.name} "
                          f"({how}), which has no knobs to tune")


def make_task(kernel, dims: dict, target: TargetSpec, scalars: dict | None = None) -> TuningTask:
    """The task for ``kernel`` at ``dims`` (and the scalar values ``scalars``, measured with and
    keyed by where they change the plan): the template ``compile`` would use on ``target``."""
    problem = kernel.program.size_problems(dims, complete=True)
    if problem:
        raise TuningError(f"tuning {kernel.name}: {problem}")
    # keyed as calls bind them: with the sizes the kernel derives (a SwiGLU's half row), or a
    # call at the tuned sizes never finds the records
    dims = kernel.program.with_derived_sizes(dims)
    try:   # not where an index leaves its dimension: no record of a kernel reading past it
        check_index_arithmetic(kernel.program, dims)
    except IndexOutOfRange as exc:
        raise TuningError(f"tuning {kernel.name}: {exc}") from None
    scalars = check_scalars(kernel.program, scalars)
    if not target.is_gpu:
        from ..schedule_templates.auto import cpu_fusion

        fusion = cpu_fusion(kernel.program)   # what tf.compile runs fused on the CPU
        if fusion is not None:
            return TuningTask(kernel, dict(dims), target, "cpu_fused", fusion, scalars)
        return TuningTask(kernel, dict(dims), target, "cpu", scalars=scalars)
    from ..schedule_templates.renamed_params import with_safe_names

    renamed, names = with_safe_names(kernel.program)
    if names:   # tf.compile runs it under other names (renamed_params): that program's records
        return make_task(ProgramKernel(renamed), dims, target,
                         {names.get(n, n): v for n, v in scalars.items()})
    from ..schedule_templates.auto import choose, flat_templated, scatters
    from ..schedule_templates.elementwise import elementwise_form
    from ..schedule_templates.bands import band_window, bands
    from ..schedule_templates.scan import scans
    from ..schedule_templates.monoid_rewrites import rewritten_monoids
    from ..schedule_templates.widened_rows import widened

    if scatters(kernel.program):   # tf.compile's scatter-add template, before any other
        raise TuningError(f"{kernel.name} runs on the scatter-add template on {target.name}, "
                          "which has no knobs to tune")
    for reads, template in ((scans, "scan"), (bands, "band")):   # before the row template
        if reads(kernel.program):
            raise TuningError(f"{kernel.name} runs on the {template} template on "
                              f"{target.name}, whose tiles are not tuned")
    # reductions written out at these sizes (literal extents, or a window's named ones)
    _refuse_elementwise(kernel, elementwise_form(kernel.program, dims), target)
    band = band_window(kernel.program)
    if band is not None:   # tf.compile runs the band over a window axis (same name)
        return make_task(ProgramKernel(band[0]), dims, target, scalars)
    rows = widened(kernel.program)
    if rows is not None:   # tf.compile runs the chain as rows of that program (same name)
        return make_task(ProgramKernel(rows[0]),
                         dims, target, scalars)
    monoids = rewritten_monoids(kernel.program)
    if monoids is not None:   # and a logsumexp or arg reduction as the reductions it writes
        return make_task(ProgramKernel(monoids[0]), dims, target, scalars)
    choice = choose(kernel.program, target)
    flat = flat_templated(kernel.program, dims, target) if choice is None else None
    if flat is not None:   # tf.compile runs it swept as one axis: that program is what it tunes
        # (same name and sizes: its records are the ones the flat kernel looks up)
        return make_task(ProgramKernel(flat), dims,
                         target, scalars)
    if choice is None and _on_contraction(kernel, dims, target):
        return TuningTask(kernel, dict(dims), target, "contraction", None, scalars)
    if choice is None:
        raise TuningError(f"{kernel.name} fits no GPU template (no reduction chain the rolling "
                          "update accepts along one axis), so there is nothing to tune on "
                          f"{target.name}; it runs on TVM's default schedule")
    template, fusion = choice
    from ..algebra import plan_chain
    from ..errors import TargetError
    from ..schedule_templates.tile_plan import plan_rowtile
    from ..schedule_templates.lifted_kernel import LiftedKernel
    from .spaces import TUNABLE, native_template

    found = native_template(kernel, fusion, template, dims, target, scalars)
    if isinstance(found, LiftedKernel):   # a rewrite of the program (unit axes, merged heads,
        # views, shared queries) on a template: tf.compile looks up the rewritten program's
        # records at its sizes (schedule_templates.auto), so that program is what is tuned
        return make_task(ProgramKernel(found.inner.program), found.inner_sizes(dict(dims)),
                         target, scalars)
    native = None if found is None else found.description.split(" ")[0]
    if native in TUNABLE:   # the contraction template tunes the program's plain sums
        return TuningTask(kernel, dict(dims), target, native,
                          None if native == "contraction" else fusion, scalars)
    if native is not None:
        raise TuningError(f"{kernel.name} at these sizes runs on the {native} template on "
                          f"{target.name} (what tf.compile picks there), whose knobs are not in "
                          "the tuning space yet; tuning the Triton template would not change what "
                          "tf.compile runs")
    try:
        plan_rowtile(kernel.program, plan_chain(kernel.program, fusion.names, fusion.axis,
                                                held=fusion.held), dims)
    except TargetError as exc:
        raise TuningError(f"{kernel.name} at these sizes does not fit the {template} template "
                          f"({exc.message}); it runs on TVM's default schedule") from None
    return TuningTask(kernel, dict(dims), target, template, fusion, scalars)


def _on_contraction(kernel, dims: dict, target: TargetSpec) -> bool:
    """Whether ``tf.compile`` runs ``kernel`` at ``dims`` on the contraction template."""
    from ..schedule_templates.auto import contraction_templates

    return any(k.fits(None, **dims) for k in contraction_templates(kernel, target))
