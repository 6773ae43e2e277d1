"""The interactive schedule: every optimisation of a kernel is a step that can be shown and undone.

>>> sch = tensorfuse.schedule(attention, target="cuda", B=2, H=16, M=4096, N=4096, D=128)
>>> sch.rolling_update("m", "l", "out_sum", axis="j")   # tensorfuse primitive
>>> sch.show()                                          # TVMScript after each step
>>> blk = sch.get_sblock("l_update"); sch.get_loops(blk) # any TVM s_tir primitive, forwarded
>>> f = sch.compile()

Fusion primitives (rolling and split updates) change how the program is lowered, so they come
before any TVM primitive. TVM primitives are forwarded to a ``tvm.s_tir.Schedule`` whose trace
records them. Sizes given when the schedule is made are fixed in the IR; sizes not given stay
symbolic and the compiled kernel accepts any value for them.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm

from .compiled import CompiledKernel
from .dsl.expr import user_location
from .dsl.program import TracedKernel, is_kernel
from .errors import CallError, ScheduleError, TensorfuseError
from .binding import split_scalars
from .records import template_records
from .schedule_templates import lower_program, tvm_schedule
from .schedule_templates.annotations import annotate_template
from .algebra import plan_chain
from .schedule_templates.default import apply_default_schedule, cpu_fused
from .schedule_templates.fusion import Fusion
from .schedule_templates.rolling_update import default_chunk
from .targets import TargetSpec, get_target
from .torch_graph import in_graph

# TVM schedule methods that only look: they are forwarded without becoming a step.
_READ_ONLY = {"get_sblock", "get_loops", "get", "get_child_blocks", "get_producers",
              "get_consumers", "get_output_blocks", "show", "trace", "mod", "state", "copy",
              "func_working_on", "work_on", "fork_seed", "sample_perfect_tile",
              "sample_categorical", "sample_compute_location", "get_sref", "seed"}


# templates that visit a mask's map in patches (``Schedule.tile_as``)
TILED_TEMPLATES = ("attention", "hopper_attention")


@dataclass
class Step:
    description: str
    before: tvm.s_tir.Schedule
    fusions_before: tuple
    is_fusion: bool
    template_before: tuple | None = None
    tiling_before: "dict | bool" = True


class Schedule:
    """A kernel's schedule for one target; see the module docstring."""

    def __init__(self, kernel: TracedKernel, target: "str | TargetSpec" = "auto", **dims: int):
        if not is_kernel(kernel):
            raise ScheduleError(f"tensorfuse.schedule takes a @tensorfuse.kernel, got "
                                f"{type(kernel).__name__}", user_location())
        self.kernel = kernel
        self.program = kernel.program
        self.target = get_target(target)
        problem = self.program.size_problems(dims, complete=False)
        if problem:
            raise ScheduleError(problem, user_location())
        self.dims = dict(dims)
        self.fusions: tuple = ()
        self.template: tuple | None = None
        self.tiling: "dict | bool" = True   # the attention template's visiting order (tile_as)
        self.steps: list[Step] = []
        self._tvm = tvm_schedule(self._lower())

    # -- state -----------------------------------------------------------------------------------
    def _lower(self) -> tvm.IRModule:
        return lower_program(self.program, self.fusions, self.dims,
                             accumulate=self.target.accumulate,
                             vector_math=self.target.vector_math)

    @property
    def mod(self) -> tvm.IRModule:
        """The current TensorIR module."""
        return self._tvm.mod

    @property
    def tvm_schedule(self) -> tvm.s_tir.Schedule:
        """The underlying TVM schedule (its trace holds the TVM steps)."""
        return self._tvm

    def show(self) -> None:
        """Print the current TensorIR as TVMScript."""
        print(self.script())

    def script(self) -> str:
        return self.mod.script()

    def history(self) -> list[str]:
        """The steps applied so far, oldest first."""
        return [s.description for s in self.steps]

    def _record(self, description: str, is_fusion: bool = False) -> None:
        self.steps.append(Step(description, self._tvm.copy(), self.fusions, is_fusion,
                               self.template, self.tiling))

    def undo(self) -> str:
        """Take back the last step; returns its description."""
        if not self.steps:
            raise ScheduleError("nothing to undo", user_location())
        step = self.steps.pop()
        self._tvm, self.fusions, self.template, self.tiling = step.before, \
            step.fusions_before, step.template_before, step.tiling_before
        return step.description

    # -- tensorfuse primitives ----------------------------------------------------------------
    def _require_fresh(self, what: str) -> None:
        if self.template is not None:
            raise ScheduleError(f"{what} after apply_template: undo() the template first",
                                user_location())
        if any(not step.is_fusion for step in self.steps):
            raise ScheduleError(
                f"{what} rewrites how the program is lowered, so it must come before TVM "
                "schedule primitives; undo() those first, or start from a new schedule",
                user_location())

    def _apply_fusion(self, fusion, description: str, strict: bool) -> None:
        self._require_fresh(description)
        self._record(description, is_fusion=True)
        try:
            self.fusions = self.fusions + (fusion,)
            self._tvm = tvm_schedule(self._lower())
            if strict:
                plan_chain(self.program, fusion.names, fusion.axis, strict=True)
        except TensorfuseError as exc:
            self.undo()
            if exc.location is None:
                raise type(exc)(exc.message, user_location()) from None
            raise

    def rolling_update(self, *names: str, axis: str, chunk: int | None = None,
                       rows: int = 1, strict: bool = False) -> "Schedule":
        """Fuse the reductions ``names`` (DSL variable names) into one pass over ``axis``, ``chunk``
        elements at a time (default: 32 on a GPU, 128 on the CPU, whose chunk loops LLVM
        vectorises), with derived corrections (see :meth:`corrections`). ``rows`` (CPU only):
        how many consecutive rows a core sweeps together, each loaded key and value serving all
        of them (``tf.compile`` takes 4). A member whose
        fused value loses much more precision than the unfused one (checked in float32 on data
        far from zero and around it when the fusion is planned) is warned about once
        (:class:`~tensorfuse.errors.FusedPrecisionWarning`), or with ``strict`` refused."""
        if rows != 1 and self.target.is_gpu:
            raise ScheduleError(f"rows={rows}: a block of rows is how the CPU sweeps a fused "
                                "chain; on a GPU the templates tile rows (apply_template's "
                                "knobs)", user_location())
        fusion = Fusion(tuple(names), axis, self._chunk(chunk), 1, rows)
        self._apply_fusion(fusion, fusion.describe(), strict)
        return self

    def split_update(self, *names: str, axis: str, splits: int, chunk: int | None = None,
                     strict: bool = False) -> "Schedule":
        """Like :meth:`rolling_update`, in ``splits`` independent parts of ``axis`` merged at the
        end (flash-decoding)."""
        fusion = Fusion(tuple(names), axis, self._chunk(chunk), splits)
        self._apply_fusion(fusion, fusion.describe(), strict)
        return self

    def _chunk(self, chunk: int | None) -> int:
        return chunk if chunk is not None else default_chunk(self.target.is_gpu)

    def apply_template(self, name: str, **knobs) -> "Schedule":
        """Compile the fused chain with a GPU template: ``"attention"`` (``tile_m``, ``tile_n``,
        ``num_warps``, ``num_stages``) or ``"row_reduction"`` (``rows``, ``block``,
        ``num_warps``, ``num_stages``, ``reload``), which generate Triton kernels; or
        ``"hopper_attention"`` (``block_n``, ``stages``, ``consumers``, ``overlap``,
        ``pingpong``, ``schedule``, ``ctas``): softmax attention as warp-specialised
        CUDA C++ for sm_90a (TMA, wgmma, mbarriers); these need one rolling update first. Or
        ``"hopper_gemm"`` (``block_n``, ``stages``, ``cluster``, ``group_m``), on a fresh
        schedule: one or two sums of products sharing their rows operand (a GEMM, a linear
        layer, a gated pair) and an elementwise output, as a persistent warp-specialised sm_90a
        kernel."""
        from .schedule_templates import TEMPLATES

        if name not in TEMPLATES:
            raise ScheduleError(f"unknown template {name!r}; templates: {', '.join(TEMPLATES)}",
                                user_location())
        template = TEMPLATES[name]
        if not getattr(template, "needs_fusion", True):   # a GEMM: no chain to fuse
            if self.fusions or any(not step.is_fusion for step in self.steps):
                raise ScheduleError(f"the {name} template generates the whole kernel from the "
                                    "program: apply it to a fresh schedule (undo() the steps "
                                    "before it)", user_location())
        elif len(self.fusions) != 1 or self.fusions[0].splits != 1:
            raise ScheduleError(f"the {name} template compiles one rolling update: call "
                                "rolling_update(...) first (and only once)", user_location())
        if not self.target.is_gpu:
            raise ScheduleError(f"the {name} template generates GPU kernels; on {self.target.name} "
                                "compile the fused schedule as it is", user_location())
        import inspect

        accepted = [k for k in list(inspect.signature(template).parameters)[3:]
                    if k not in ("tuned", "prefill_only")]
        unknown = sorted(set(knobs) - set(accepted))
        if unknown:
            raise ScheduleError(f"the {name} template has no knob {', '.join(unknown)}; its knobs: "
                                f"{', '.join(accepted)}", user_location())
        self._record(f"apply_template({name!r}" + "".join(f", {k}={v}" for k, v in knobs.items())
                     + ")", is_fusion=True)
        self.template = (name, dict(knobs))
        annotate_template(self._tvm, name, knobs)
        return self

    def tile_as(self, patch: "tuple[int, ...] | None" = None,
                key_patch: "tuple[int, ...] | None" = None,
                dilation: "tuple[int, ...] | None" = None, enabled: bool = True) -> "Schedule":
        """Visit the sequence as the 2-D/3-D map its mask reads it as (``i // W``, ``i % W``):
        query blocks are patches of ``patch`` tokens (sides outermost first, multiplying to the
        template's ``tile_m``), key blocks windows of ``key_patch`` tokens placed over each
        query patch's visible keys (multiplying to ``tile_n``), each sub-map of a ``dilation``
        visited on its own. What is not given is chosen by counting blocks, as ``tf.compile``
        does for the ``attention`` template; ``enabled=False`` keeps the flat order. The
        ``hopper_attention`` template takes it too (patches of its 64·consumers query rows and
        block_n keys, copied as TMA boxes).
        ``sch.plan(**sizes, **scalars)`` shows the order and the share of blocks visited.
        ``sch.tile_as(patch=(8, 8), dilation=(2, 2))`` (blocks of 64 queries)"""
        if self.template is not None and self.template[0] not in TILED_TEMPLATES:
            raise ScheduleError(f"tile_as orders the blocks of the {' and '.join(TILED_TEMPLATES)}"
                                f" templates; this schedule has the {self.template[0]} template",
                                user_location())
        request: "dict | bool" = enabled
        if enabled:
            request = {k: tuple(int(x) for x in v) for k, v in (("patch", patch),
                       ("key_patch", key_patch), ("dilation", dilation)) if v is not None}
            request = request or True
        args = [f"{k}={v}" for k, v in (("patch", patch), ("key_patch", key_patch),
                                         ("dilation", dilation)) if v is not None]
        self._record(f"tile_as({', '.join(args + ([] if enabled else ['enabled=False']))})",
                     is_fusion=True)
        self.tiling = request
        return self

    def cluster_distribute(self, axis: str, cluster: int | None = None, **knobs) -> "Schedule":
        """Spread each fused tile over a Hopper thread-block cluster of ``cluster`` CTAs (over 8
        uses the non-portable size), splitting ``axis`` across them and exchanging partial
        results through distributed shared memory instead of global memory. ``cluster=None``
        chooses per size; ``compile().schedule_origin(**sizes)`` says what was chosen and why.

        - GEMM chains ``act(X·W1)·W2`` (no fusion before): ``axis`` is the intermediate's (the
          second sum's); each CTA computes its slice of the intermediate and keeps it in shared
          memory, then computes a share of the outputs from the cluster's whole intermediate,
          read from its peers. Cluster 1, 2, 4, 8 or 16 (default: 8 where the sizes allow). Knobs
          ``mma`` (``"wgmma"``, the default on sm_90a, or ``"mma_sync"``), ``copy``
          (``"cp_async"``, ``"tma"``, ``"producer"``), ``exchange`` (``"peer"``, ``"gather"``),
          ``block_m``, ``block_n``, ``block_k``, ``block_o``, ``stages``, ``group_m``, ``warps``,
          ``ctas_per_sm``.
        - attention decode (one query token, after ``rolling_update`` over the keys): ``axis`` is
          the rolled axis; the partial softmax states are merged in DSM with the derived
          correction. Cluster 1 to 16 (default: the largest power of two whose clusters all run
          at once on the GPU). Knobs ``warps``, ``stages``, ``mma`` (``"mma_sync"``, ``"fma"``).
        Generates CUDA C++ for sm_90a (``compile().source(...)``, ``.ptx(...)``)."""
        from .schedule_templates.cluster import attention_decode, gemm_chain

        if self.template is not None:
            raise ScheduleError("cluster_distribute after a template: undo() it first",
                                user_location())
        if any(not step.is_fusion for step in self.steps):
            raise ScheduleError("cluster_distribute generates the whole kernel, so it cannot "
                                "follow TVM schedule primitives; undo() those first",
                                user_location())
        if len(self.fusions) > 1 or any(f.splits != 1 for f in self.fusions):
            raise ScheduleError("cluster_distribute takes at most one rolling update before it",
                                user_location())
        if cluster is not None and (not isinstance(cluster, int) or not 1 <= cluster <= 16):
            raise ScheduleError(f"cluster={cluster!r}: a cluster has 1 to 16 CTAs (over 8 is "
                                "non-portable, Hopper only)", user_location())
        if self.fusions:
            made = attention_decode(self.kernel, self.fusions[0], self.target, axis, cluster,
                                    **knobs)
        else:
            made = gemm_chain(self.kernel, self.target, axis, cluster, **knobs)
        text = ", ".join([repr(axis)] + ([f"cluster={cluster}"] if cluster else [])
                         + [f"{k}={v}" for k, v in knobs.items()])
        self._record(f"cluster_distribute({text})", is_fusion=True)
        self.template = ("cluster", made)
        annotate_template(self._tvm, "cluster", {"axis": axis, **({"cluster": cluster}
                                                                  if cluster else {}), **knobs})
        return self

    def corrections(self) -> str:
        """The running states and correction terms of every fusion, in readable form."""
        return "\n".join(plan_chain(self.program, f.names, f.axis).describe() for f in self.fusions)

    def plan(self, **sizes: int) -> str:
        """What this schedule compiles, in readable form: each fusion's chain plan (running
        states, corrections), then the template's plan — with ``sizes``, the plan made for them:
        the axes' roles, tensor-core products, states, mask, the visiting order of a map-shaped
        mask (scalars it reads given by name too), and the knobs chosen and where from.
        ``print(sch.plan(B=2, H=16, M=4096, N=4096, D=128))``."""
        lines = []
        for f in self.fusions:
            lines.append(f.describe())
            lines += ["  " + line for line in
                      plan_chain(self.program, f.names, f.axis).describe().splitlines()]
        if self.template is None:
            lines.append("no template: " + ("the fused TensorIR, its loops spread over threads "
                                            "or cores" if self.fusions else
                                            "TVM's default schedule (dlight on GPUs)"))
            return "\n".join(lines)
        name = self.template[0]
        if not sizes:
            lines.append(f"template {name}; plan(**sizes) shows its tiles for given sizes (this "
                         f"kernel's: {', '.join(self.program.dim_names())})")
            return "\n".join(lines)
        sizes, scalars = split_scalars(self.program, sizes)
        problem = self.program.size_problems(sizes, complete=False)
        if problem:
            raise ScheduleError(problem, user_location())
        dims = {**self.dims, **sizes}
        compiled = self.compile()
        if not hasattr(compiled, "launches"):   # a Triton template (CUDA C++ plans name theirs)
            lines.append(f"template {name}:")
        lines.append(compiled.describe_plan(scalars, **dims))
        return "\n".join(lines)

    # -- TVM primitives, forwarded ------------------------------------------------------------
    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        target = getattr(self._tvm, name)
        if not callable(target) or name in _READ_ONLY:
            return target

        def forwarded(*args, **kwargs):
            self._record(_call_text(name, args, kwargs))
            try:
                return target(*args, **kwargs)
            except tvm.s_tir.ScheduleError as exc:
                self.steps.pop()
                raise ScheduleError(f"TVM refused {name}: {exc}", user_location()) from None

        forwarded.__doc__ = target.__doc__
        return forwarded

    # -- compile ---------------------------------------------------------------------------------
    def compile(self) -> CompiledKernel:
        """A callable kernel built from this schedule. What is not scheduled yet is filled in:
        fused chains get their data-parallel loops spread over threads (GPU) or cores (CPU), other
        GPU code gets TVM's default (dlight) schedule. Inside ``torch.compile`` the kernel runs as
        a PyTorch custom operator (:mod:`tensorfuse.torch_graph`)."""
        return in_graph(self._compiled())

    def _compiled(self):
        if self.template is not None and self.template[0] == "cluster":
            return self.template[1]
        if self.template is not None:
            from .schedule_templates import TEMPLATES

            name, knobs = self.template
            fusion = self.fusions[0] if self.fusions else None
            records = template_records(self.program, name, fusion, self.target)
            if self.tiling is not True and name not in TILED_TEMPLATES:
                raise ScheduleError(f"tile_as orders the blocks of the "
                                    f"{' and '.join(TILED_TEMPLATES)} templates, not the "
                                    f"{name} template's", user_location())
            if name in TILED_TEMPLATES:
                knobs = {"tiling": self.tiling, **knobs}
            return TEMPLATES[name](self.kernel, fusion, self.target, **knobs, tuned=records)
        fixed = dict(self.dims)
        layout_only = bool(self.fusions) and all(step.is_fusion for step in self.steps)
        scheduled = None if layout_only else apply_default_schedule(self.mod, self.target)

        def build(dims: dict, index_dtype: str) -> tvm.IRModule:
            clash = {k: v for k, v in dims.items() if k in fixed and fixed[k] != v}
            if clash:
                raise CallError(f"this schedule was made for "
                                f"{', '.join(f'{k}={fixed[k]}' for k in clash)} but the call has "
                                f"{', '.join(f'{k}={v}' for k, v in clash.items())}; make a schedule "
                                "for these sizes, or leave them symbolic", user_location())
            if layout_only and not self.target.is_gpu:
                return cpu_fused(self.program, self.fusions, {**dims, **fixed}, index_dtype,
                                 self.target)
            if layout_only:
                return lower_program(self.program, self.fusions, {**dims, **fixed}, index_dtype,
                                     "gpu", accumulate=self.target.accumulate,
                                     vector_math=self.target.vector_math)
            if index_dtype != "int32":
                raise CallError("tensors this large need 64-bit indexing; make the schedule with "
                                "fixed sizes or use tensorfuse.compile", user_location())
            return scheduled

        return CompiledKernel(self.program, self.target, build,
                              f"schedule ({', '.join(self.history()) or 'default'})")

    def __repr__(self) -> str:
        steps = "; ".join(self.history()) or "no steps yet"
        return f"<Schedule of {self.program.name} for {self.target.name}: {steps}>"


def _call_text(name: str, args, kwargs) -> str:
    parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _short(value) -> str:
    text = repr(value) if isinstance(value, (str, int, float, list, tuple)) else type(value).__name__
    return text if len(text) < 40 else text[:37] + "..."
