"""The knob spaces of the templates a tuning task can sample (GPU templates; the CPU's fused
chains, :class:`CpuFusedSpace`): values per knob, the template
defaults, which settings cannot run on the GPU (left out before anything is built), and the
candidate kernel of a setting.

- Triton templates (``attention``, ``row_reduction``): tile sizes, warps, pipeline stages, split
  parts; the kernel compiles on its first launch, where the GPU is.
- ``hopper_attention`` (``tf.compile``'s choice for prefill on sm_90a): keys per block, ring
  slots, consumer warpgroups, the intra-warpgroup overlap and the ping-pong (0/1 in the space);
  its CUDA is built by nvcc ahead of the measurement (cubins cached by source), so a batch's
  builds run in parallel on the CPUs.
- ``contraction`` (GEMM-shaped programs, any GPU): tile rows, columns and depth, warps, stages,
  the rasterisation group; a Triton kernel like the first.
- ``cluster_decode`` (``tf.compile``'s choice for one query token on sm_90a where it beats the
  split update: ``decode_plan.cluster_decode_pays``): CTAs per cluster,
  warps per CTA, blocks of keys per warp in shared memory, and how a warp copies them (0: bulk
  tensor copies, 1: ``cp.async``); built by nvcc ahead of the measurement like the above.
"""
from __future__ import annotations

from dataclasses import asdict, replace

import tvm

from ..errors import ScheduleError
from ..targets import TargetSpec

NATIVE = ("hopper_attention", "cluster_decode")   # CUDA C++ templates with a tuning space
TUNABLE = NATIVE + ("contraction",)   # what native_template may name that has a space


class TritonSpace:
    """The space of a Triton template (``schedule_templates.<template>``'s ``knob_choices``)."""

    # a job's runner plans, writes and compiles each candidate as it hands it out (off the
    # search's thread), so a job's builder only names it
    made_by_runner = True

    def __init__(self, task):
        import importlib

        from ..algebra import plan_chain
        from ..schedule_templates.tile_plan import TilePlanner

        self.task = task
        self.module = importlib.import_module(f"tensorfuse.schedule_templates.{task.template}")
        program = task.kernel.program
        self.planner = TilePlanner(program, plan_chain(program, task.fusion.names,
                                                       task.fusion.axis, held=task.fusion.held))
        self.plan = self.planner.plan(task.dims)

    def choices(self) -> dict[str, tuple[int, ...]]:
        return self.module.knob_choices(self.plan, self.task.target)

    def defaults(self) -> dict[str, int]:
        return asdict(self.module.default_knobs(self.plan, self.task.target))

    def unfit(self, knobs: dict) -> str | None:
        check = getattr(self.module, "unfit", None)
        full = replace(self.module.default_knobs(self.plan, self.task.target), **knobs)
        return check(self.plan, full, self.task.target) if check else None

    def candidate(self, knobs: dict | None):
        from ..targets.triton.kernel import TritonKernel

        def pick(plan):
            default = self.module.default_knobs(plan, self.task.target)
            return replace(default, **knobs) if knobs else default

        return TritonKernel(self.planner, self.task.target, pick,
                            f"{self.task.template} template, tuning candidate {knobs}",
                            self.task.fusion)

    def prepare(self, kernel, compile_ahead: bool) -> None:
        """Plan and source (bad knobs fail here); compiled too where asked (works without a
        GPU: a job leaves it to the first launch, which compiles for the real arguments)."""
        kernel.build(**self.task.dims)
        if compile_ahead:
            kernel.compiled(**self.task.dims)


class HopperAttentionSpace:
    """The space of the warp-specialised sm_90a attention template."""

    made_by_runner = False   # nvcc runs in the builder's threads

    def __init__(self, task):
        from ..schedule_templates.hopper_attention_plan import plan_hopper_attention

        self.task = task
        self.plan = plan_hopper_attention(task.kernel.program, task.fusion.names,
                                          task.fusion.axis)

    def choices(self) -> dict[str, tuple[int, ...]]:
        from ..schedule_templates.hopper_attention_plan import knob_choices

        return {n: tuple(int(v) for v in values)
                for n, values in knob_choices(self.plan, self.task.dims).items()}

    def defaults(self) -> dict[str, int]:
        from ..schedule_templates.hopper_attention_plan import SCHEDULES, default_hopper_knobs

        from .scalars import plan_values

        # what tf.compile runs untuned (the block size may follow from the mask's scalars)
        values = plan_values(self.task.kernel.program, self.task.template, self.task.dims,
                             self.task.scalars)
        knobs = default_hopper_knobs(self.plan, self.task.dims, values)
        if self.plan.reads_map:   # a map's tile shape, by the cost model tf.compile uses
            from ..schedule_templates.hopper_attention import map_tile_knobs

            knobs, _ = map_tile_knobs(self.plan, knobs, {}, self.task.dims, values,
                                      self.task.target.max_shared_memory)
        return {n: SCHEDULES.index(v) if n == "schedule" else int(v)
                for n, v in asdict(knobs).items() if n != "ctas"}

    def unfit(self, knobs: dict) -> str | None:
        from ..schedule_templates.hopper_attention_plan import check_hopper, with_knobs

        try:
            full = with_knobs(self.plan, self.task.dims, knobs)   # 0/1 switches become bools
            # a mask over a map runs tiled, with its bits' slots in shared memory
            check_hopper(self.plan, full, self.task.dims, self.task.target.max_shared_memory,
                         self.plan.reads_map)
        except ScheduleError as exc:
            return exc.message
        return None

    def candidate(self, knobs: dict | None):
        from ..schedule_templates.hopper_attention import hopper_attention

        return hopper_attention(self.task.kernel, self.task.fusion, self.task.target,
                                **(knobs or {}))

    def prepare(self, kernel, compile_ahead: bool) -> None:
        """Source and cubin (nvcc runs without a GPU; the cubin is cached by source, so the
        runner's module load finds it)."""
        from ..targets.cuda.module import cubin_for

        from .scalars import plan_values

        values = plan_values(self.task.kernel.program, self.task.template, self.task.dims,
                             self.task.scalars)   # a map's scalars: its tiling is compiled in
        for source in kernel.launches(values, **self.task.dims).sources:
            cubin_for(source, self.task.target)


class ClusterDecodeSpace:
    """The space of the cluster decode kernel (``schedule_templates.cluster.attention_decode``)."""

    made_by_runner = False   # nvcc runs in the builder's threads

    def __init__(self, task):
        from ..schedule_templates.decode_plan import plan_decode

        self.task = task
        self.plan = plan_decode(task.kernel.program, task.fusion.names, task.fusion.axis)
        self._defaults = None   # tf.compile's knobs at the task's sizes (asked once)

    def _default_knobs(self):
        if self._defaults is None:
            self._defaults = self.candidate(None).launches(**self.task.dims).knobs
        return self._defaults

    def choices(self) -> dict[str, tuple[int, ...]]:
        tensor_cores = self._default_knobs().mma == "mma_sync"   # else cp.async only
        # 8 warps: two teams where a group takes 4 warps a block (64 heads; unfit() drops what
        # does not divide or fit)
        return {"cluster": (1, 2, 4, 8, 16), "warps": (1, 2, 4, 8), "stages": (2, 3, 4),
                "copy": (0, 1) if tensor_cores else (1,)}

    def defaults(self) -> dict[str, int]:
        """What ``tf.compile`` runs untuned (the cluster sized by the driver where a GPU is)."""
        from ..schedule_templates.decode_plan import COPIES

        knobs = self._default_knobs()
        return {"cluster": knobs.cluster, "warps": knobs.warps, "stages": knobs.stages,
                "copy": COPIES.index(knobs.copy)}

    def unfit(self, knobs: dict) -> str | None:
        from ..schedule_templates.decode_plan import DecodeKnobs, check_decode, knobs_of_setting
        from ..targets.cuda.cluster_decode import decode_shared_bytes

        full = DecodeKnobs(**{**asdict(self._default_knobs()), **knobs_of_setting(knobs)})
        try:
            check_decode(self.plan, full, self.task.dims)
        except ScheduleError as exc:
            return exc.message
        dims, (_, H, HKV, _, _, D) = self.task.dims, self.plan.dims
        need = decode_shared_bytes(full, dims[D], dims[H] // dims[HKV])
        if need > self.task.target.max_shared_memory:
            return f"{full} needs {need} bytes of shared memory per CTA"
        return None

    def candidate(self, knobs: dict | None):
        from ..schedule_templates.cluster import attention_decode
        from ..schedule_templates.decode_plan import knobs_of_setting

        fusion = self.task.fusion
        return attention_decode(self.task.kernel, fusion, self.task.target, fusion.axis,
                                **knobs_of_setting(knobs or {}))

    def prepare(self, kernel, compile_ahead: bool) -> None:
        """The cubin (nvcc runs without a GPU; cached by source, where the launch finds it)."""
        from ..targets.cuda.module import cubin_for

        if compile_ahead:
            for source in kernel.launches(**self.task.dims).sources:
                cubin_for(source, self.task.target)


class CpuFusedSpace:
    """The space of a chain ``tf.compile`` runs fused on the CPU (``cpu_fused``): the chunk of
    positions per step and the block of rows a core sweeps together (``Fusion.chunk``,
    ``Fusion.rows``). These change the lowering itself — loop extents, the loops over a block's
    rows — not a schedule of one loop nest, so each candidate is lowered for its knobs and
    built in the job's process (:class:`.builder.CpuBuilder`); TVM's runner times it."""

    made_by_runner = False
    CHUNKS = (32, 64, 128, 256)
    ROWS = (1, 2, 4)

    def __init__(self, task):
        self.task = task

    def choices(self) -> dict[str, tuple[int, ...]]:
        defaults = self.defaults()
        return {"chunk": tuple(sorted(set(self.CHUNKS) | {defaults["chunk"]})),
                "rows": tuple(sorted(set(self.ROWS) | {defaults["rows"]}))}

    def defaults(self) -> dict[str, int]:
        return {"chunk": self.task.fusion.chunk, "rows": self.task.fusion.rows}

    def unfit(self, knobs: dict) -> str | None:
        return None

    def candidate(self, knobs: dict | None) -> tvm.IRModule:
        """The function ``tf.compile`` builds with these knobs, its scalars bound as the
        workload's (one function ``main``, the workload's signature)."""
        from ..schedule_templates.default import cpu_fused
        from .scalars import bind_scalars_of

        task, program = self.task, self.task.kernel.program
        fusion = replace(task.fusion, **{**self.defaults(), **(knobs or {})})
        mod = cpu_fused(program, (fusion,), task.dims, "int32", task.target)
        func = bind_scalars_of(next(iter(mod.functions.values())), program, task.dims,
                               task.scalars)
        return tvm.IRModule({"main": func})

    def prepare(self, kernel, compile_ahead: bool) -> None:
        pass


class ContractionSpace:
    """The space of the contraction template (GEMM tiles, :mod:`..schedule_templates.contraction`):
    tile rows, columns and depth, warps, pipeline stages, the rasterisation group, computed
    sides staged before the tiles or computed in them; a Triton
    kernel, compiled on its first launch like the row-tile template's."""

    made_by_runner = True

    def __init__(self, task):
        from ..schedule_templates.contraction_plan import plan_contraction

        self.task = task
        self.plan = plan_contraction(task.kernel.program)

    def _default_knobs(self):
        from ..schedule_templates.contraction import default_contraction_knobs

        return default_contraction_knobs(self.plan, self.task.dims, self.task.target)

    def choices(self) -> dict[str, tuple[int, ...]]:
        from ..schedule_templates.contraction import contraction_choices

        return contraction_choices(self.plan, self.task.dims, self.task.target)

    def defaults(self) -> dict[str, int]:
        return asdict(self._default_knobs())

    def unfit(self, knobs: dict) -> str | None:
        from ..errors import TargetError
        from ..schedule_templates.contraction import check_contraction

        try:
            check_contraction(self.plan, replace(self._default_knobs(), **knobs),
                              self.task.target)
        except TargetError as exc:
            return exc.message
        return None

    def candidate(self, knobs: dict | None):
        from ..schedule_templates.contraction import triton_contraction

        return triton_contraction(self.task.kernel, self.task.target, **(knobs or {}))

    def prepare(self, kernel, compile_ahead: bool) -> None:
        kernel.build(**self.task.dims)
        if compile_ahead:
            kernel.compiled(**self.task.dims)


def space_of(task):
    if task.template == "cpu_fused":
        return CpuFusedSpace(task)
    spaces = {"hopper_attention": HopperAttentionSpace, "cluster_decode": ClusterDecodeSpace,
              "contraction": ContractionSpace}
    return spaces.get(task.template, TritonSpace)(task)


def native_template(kernel, fusion, name: str, dims: dict, target: TargetSpec,
                    scalars: dict | None = None):
    """The kernel of the CUDA C++ template ``tf.compile`` runs ``kernel`` on at ``dims`` (and
    the scalar values ``scalars``, with the defaults for the others: a map's width decides
    whether its patches fit TMA boxes) ahead of the Triton one (sm_90a) — its ``description``
    names the template first, or the rewrite of the program as written that it runs (a
    :class:`~tensorfuse.schedule_templates.lifted_kernel.LiftedKernel`'s) —, or None where it
    runs the Triton template."""
    from ..schedule_templates.auto import contraction_templates, native_templates
    from .scalars import keyed_scalars

    values = keyed_scalars(kernel.program, dims, scalars)
    return next((k for k in native_templates(kernel, name, fusion, target)
                 + contraction_templates(kernel, target) if k.fits(values, **dims)), None)
