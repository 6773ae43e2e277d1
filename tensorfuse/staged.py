"""A kernel run as a sequence of stage kernels: the floor for a program no template takes whole
(:mod:`tensorfuse.schedule_templates.stages` cuts it; each stage is compiled as a kernel of its
own, with a template where one takes it)."""
from __future__ import annotations

import math
import warnings

from .binding import CallBinder, output_shape, param_shape, signature_key, split_scalars
from .composed import call_device, filled
from .dsl.dtypes import to_numpy
from .dsl.program import Program
from .errors import NoTemplateWarning
from .schedule_templates.stages import Stage
from .targets import TargetSpec
from .targets.signature_call import try_fast_call
from .torch_graph import GraphCallable


def _amount(nbytes: int) -> str:
    """Bytes as a reader wants them: KiB, MiB or GiB past a thousand of the unit below."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


def _out_of_memory(exc: Exception) -> bool:
    """Whether ``exc`` says memory ran out (torch's ``OutOfMemoryError`` is a ``RuntimeError``)."""
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"


class StagedKernel(GraphCallable):
    """``program`` computed by ``kernels`` in order, one per stage: each takes the user's
    arguments and the earlier stages' results it reads, by name; the results later stages read
    are kept (on the device, in their compute's dtype) only for the call."""

    def __init__(self, program: Program, target: TargetSpec, stages: tuple[Stage, ...],
                 kernels: tuple, why: str):
        self.program, self.target = program, target
        self.stages, self.kernels, self.why = tuple(stages), tuple(kernels), why
        # what a stage stores for a later one (not an output), and after which stage each such
        # value has had its last reader
        outputs = {c.name for c in program.outputs}
        last_read = {n: k for k, stage in enumerate(self.stages) for n in stage.inputs}
        self.passed_on = [n for stage in self.stages for n in stage.produces
                          if n in last_read and n not in outputs]
        self._done_after = [[n for n in self.passed_on if last_read[n] == k]
                            for k in range(len(self.stages))]
        # the stages that make program outputs alone, each in the output's dtype: given the
        # caller's out= arrays, they write them themselves (no copy after the call: a
        # memory-order route's output is as large as the input it normalises)
        dtypes = {c.name: c.dtypes[0] for c in program.outputs}
        self._writes_outputs = [all(dtypes.get(n) == c.dtypes[0]
                                    for n, c in zip(stage.produces, stage.program.outputs))
                                for stage in self.stages]
        self.description = (f"{len(stages)} stage kernels ({self._staged_because()}): "
                            + "; ".join(s.describe() for s in stages))
        # a signature checked in full once (a staged call's host time is the sum of its
        # stages' and its own: tools/profile_host_paths.py --only staged); made on the first
        # call, which is where a missing GPU is reported
        self._calls = None
        # a signature key -> the stages' fast calls in order (:class:`StagedFastCall`), where
        # every stage has one: ``tf.compile``'s kernel keeps it, and a repeated call binds
        # nothing and looks up no stage's kernel
        self._fast: dict = {}

    def _staged_because(self) -> str:
        return f"no template takes {self.program.name} whole"

    def __repr__(self) -> str:
        return f"<StagedKernel {self.program.name} for {self.target.name}: {self.description}>"

    def invoke(self, key, args: tuple, kwargs: dict):
        # called without a key (a memory-order route's inner kernel): the fast call is kept and
        # found under the call's own signature
        key, fast, done = try_fast_call(self._fast, key, args, kwargs)
        if done is not None:
            return done
        if self._calls is None:
            self._calls = CallBinder(self.program, call_device(self.target))
        bound = self._calls(args, kwargs, key)
        values = {**bound.arrays, **bound.scalars}
        given = dict(zip((p.name for p in self.program.params), args), **kwargs)
        # the stages' fast calls, while every stage has one and the call's tensors (its out=
        # arrays too: a memory-order route gives the inner kernel its outputs) are the user's
        # own (not copies made by the binding: NumPy arrays, other frameworks')
        fasts = [] if key is not None and fast is None and \
            all(given.get(n) is t for n, t in bound.arrays.items()) and \
            _own_outputs(kwargs.get("out"), bound.outs) else None
        into = dict(zip((c.name for c in self.program.outputs), bound.outs)) \
            if bound.outs is not None else {}
        for k, (stage, kernel) in enumerate(zip(self.stages, self.kernels)):
            named = {n: values[n] for n in stage.inputs}
            if into and self._writes_outputs[k]:
                made_into = [into[n] for n in stage.produces]
                named["out"] = made_into[0] if len(made_into) == 1 else tuple(made_into)
            try:
                made = kernel.invoke(False, (), named)
            except Exception as exc:
                if not _out_of_memory(exc):
                    raise
                raise type(exc)(f"{self.program.name}: stage {k + 1} of {len(self.stages)} "
                                f"({stage.describe()}) ran out of memory; the stages store "
                                f"what they pass on ({self._staged_because()}), as the unfused "
                                f"sequence does: {exc}") from exc
            made = made if isinstance(made, tuple) else (made,)
            values.update(zip(stage.produces, made))
            for name in self._done_after[k]:   # a floor's scores are B·H·M·N floats
                del values[name]
            if fasts is not None:
                stage_key = signature_key((), named)
                fast = getattr(kernel, "_fast", {}).get(stage_key) if stage_key else None
                fasts = fasts + [fast] if fast is not None else None
        if fasts is not None:
            self._fast[key] = StagedFastCall(self, fasts)
        results = [values[c.name] for c in self.program.outputs]
        if bound.outs is not None:
            return filled(bound.outs, results)
        return results[0] if len(results) == 1 else tuple(results)

    def stored(self, **dims) -> list[tuple[str, tuple[int, ...], str, int]]:
        """``(name, shape, dtype, bytes)`` of each value a stage stores for a later one at these
        sizes (the floor's price: an attention's scores are B·H·M·N floats)."""
        found = []
        for stage in self.stages:
            own = stage.program.with_derived_sizes(dims)
            for name, compute in zip(stage.produces, stage.program.outputs):
                if name in self.passed_on:
                    shape = tuple(output_shape(compute, own))
                    dtype = compute.dtypes[0]
                    found.append((name, shape, dtype,
                                  math.prod(shape) * to_numpy(dtype).itemsize))
        return found

    def stored_fraction(self, **dims) -> float:
        """What the stages store for later ones (:meth:`stored`) over the bytes of the
        program's tensors, at these sizes: the floor's price beside what it reads anyway."""
        read = sum(math.prod(param_shape(p, dims)) * to_numpy(p.dtype).itemsize
                   for p in self.program.tensor_params)
        return sum(b for *_, b in self.stored(**dims)) / max(read, 1)

    def schedule_origin(self, **dims) -> str:
        """Which kernels run the program, and each one's schedule at these sizes."""
        parts = [f"[{k}] {stage.describe()}: "
                 f"{kernel.schedule_origin(**self._own(stage, dims))}"
                 for k, (stage, kernel) in enumerate(zip(self.stages, self.kernels), 1)]
        return (f"staged: {len(self.stages)} kernels, their results between them stored "
                f"({self._staged_because()}: {self.why}); " + "; ".join(parts))

    def _stored_line(self, dims: dict) -> str:
        found = self.stored(**split_scalars(self.program, dims)[0])
        if not found:
            return ""
        total = sum(b for *_, b in found)
        return (f"stored between the stages: {_amount(total)} ("
                + ", ".join(f"{n} {d} {list(shape)}" for n, shape, d, _ in found) + ")\n")

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        """Each stage, its kernel and plan at these sizes, in stage order."""
        dims = {**dims, **(scalars or {})}
        parts = []
        for k, (stage, kernel) in enumerate(zip(self.stages, self.kernels), 1):
            sizes, named = split_scalars(stage.program, self._own(stage, dims))
            parts.append(f"[{k}] {stage.describe()}\n{kernel.describe_plan(named, **sizes)}")
        return self._stored_line(dims) + "\n".join(parts)

    def source(self, **dims) -> str:
        """Each stage kernel's generated source at these sizes, in stage order."""
        return "\n".join(f"# ---- stage {k}: {stage.describe()} ----\n"
                         + kernel.source(**self._own(stage, dims))
                         for k, (stage, kernel) in enumerate(zip(self.stages, self.kernels), 1))

    def assembly(self, **dims) -> str:
        """Each stage kernel's assembly at these sizes, in stage order."""
        return "\n".join(kernel.assembly(**self._own(stage, dims))
                         for stage, kernel in zip(self.stages, self.kernels))

    def _own(self, stage, dims: dict) -> dict:
        """The sizes and scalars among ``dims`` that ``stage``'s program has, with the sizes it
        derives from them (an operand stored in parts over ``3·D``)."""
        own = set(stage.program.dim_names()) | {p.name for p in stage.program.scalar_params}
        return {n: v for n, v in stage.program.with_derived_sizes(dims).items() if n in own}

    def cache_info(self) -> list:
        """The stage kernels' builds, in stage order (each stage's own ``cache_info()``)."""
        return [b for k in self.kernels for b in k.cache_info()]


def _own_outputs(given, outs) -> bool:
    """Whether a call's bound ``out=`` arrays are the ones the caller gave (or none was)."""
    if outs is None:
        return given is None
    given = list(given) if isinstance(given, (tuple, list)) else [given]
    return len(given) == len(outs) and all(g is o for g, o in zip(given, outs))


class StagedFastCall:
    """A staged kernel's repeated call of one signature: each stage's fast call in turn on the
    values by name (the call's arguments, the earlier stages' results), those the later stages no
    longer read dropped, the caller's ``out=`` arrays given to the stages that write them (as
    the checked path gives them); None — the checked path redoes the whole call — where a
    stage's fast call leaves its call to the checked path."""

    def __init__(self, staged: StagedKernel, fasts: list):
        self.names = [p.name for p in staged.program.params]
        self.steps = [(stage.inputs, stage.produces, done, fast, writes) for
                      stage, done, fast, writes in zip(staged.stages, staged._done_after, fasts,
                                                       staged._writes_outputs)]
        self.outputs = [c.name for c in staged.program.outputs]

    def __call__(self, args: tuple, kwargs: dict):
        outs, into = None, {}
        if "out" in kwargs:
            given = kwargs["out"]
            outs = list(given) if isinstance(given, (tuple, list)) else [given]
            into = dict(zip(self.outputs, outs))
            kwargs = {n: v for n, v in kwargs.items() if n != "out"}
        values = dict(zip(self.names, args), **kwargs)
        for inputs, produces, done, fast, writes in self.steps:
            named = {n: values[n] for n in inputs}
            if into and writes:
                made_into = [into[n] for n in produces]
                named["out"] = made_into[0] if len(made_into) == 1 else tuple(made_into)
            made = fast((), named)
            if made is None:
                return None
            values.update(zip(produces, made if isinstance(made, tuple) else (made,)))
            for name in done:
                del values[name]
        results = [values[n] for n in self.outputs]
        if outs is not None:
            return filled(outs, results)
        return results[0] if len(results) == 1 else tuple(results)


class GemmStages(StagedKernel):
    """A GEMM as stages around the Hopper GEMM (``plan``: a
    :class:`~tensorfuse.schedule_templates.gemm_stages.GemmStagePlan`): its computed sides
    stored, then the GEMM; or the GEMM stored, then the reductions over its columns. It fits the
    sizes where storing pays (``plan.pays``) and that GEMM runs them (``tf.compile`` tries it
    before the contraction template)."""

    def __init__(self, program: Program, target: TargetSpec, kernels: tuple, plan):
        super().__init__(program, target, plan.stages, kernels, plan.why)
        self.pays, self.gemm = plan.pays, plan.gemm

    def _staged_because(self) -> str:
        return "the Hopper GEMM's stages, before the contraction template"

    def fits(self, scalars: dict | None = None, **dims) -> bool:
        return self.pays(dims) and \
            self.kernels[self.gemm].fits(scalars, **self._own(self.stages[self.gemm], dims))


class NativeStages(StagedKernel):
    """A program as stages, cut by :meth:`stages_of` where a native template (the Hopper
    attention) refuses the whole: the stages that compute the fused chain's reductions must run
    natively (the others store what they read, or finish what they leave). It fits the sizes
    where each of those routes to a native kernel: at others the Triton template takes the
    program whole."""

    why = ""

    @staticmethod
    def stages_of(program, fusion) -> tuple:   # pragma: no cover - each subclass has one
        raise NotImplementedError

    @staticmethod
    def native_of(stages: tuple) -> list[int]:
        """The stages that must run natively: those reducing the fused chain."""
        return [k for k, stage in enumerate(stages) if stage.reduces]

    @classmethod
    def made(cls, kernel, fusion, target: TargetSpec, compile_stage, routed: type,
             refused: list | None = None) -> tuple:
        """The stages of ``kernel`` (fused by ``fusion``), each compiled by
        ``compile_stage(ProgramKernel)``, as a one-kernel tuple for ``AutoKernel``'s ``ahead``
        where each stage that must run natively has native templates to route to (``routed``:
        the class of such a kernel); else ``()``, and ``refused`` (where given) gets ``(what
        these stages are, why the stage that must run natively cannot)`` — the native
        templates' own reasons, e.g. that computed operands would be stored in float32."""
        from .dsl.program import ProgramKernel

        stages = cls.stages_of(kernel.program, fusion)
        if not stages:
            return ()
        kernels = tuple(compile_stage(ProgramKernel(s.program)) for s in stages)
        for k in cls.native_of(stages):
            if not (isinstance(kernels[k], routed) and kernels[k].ahead):
                if refused is not None:
                    refused.append((f"{cls._what} as stages", cls._not_native(
                        stages, k, kernels[k])))
                return ()
        return (cls(kernel.program, target, stages, kernels, cls.why),)

    _what = "the program"

    @staticmethod
    def _not_native(stages: tuple, k: int, kernel) -> str:
        """Why stage ``k`` (compiled as ``kernel``) has no native template to run on."""
        why = "; ".join(f"{name}: {reason}" for name, reason in getattr(kernel, "refused", ()))
        return f"its stage {stages[k].program.name} runs on no native template" + \
            (f" ({why})" if why else "")

    def fits(self, scalars: dict | None = None, **dims) -> bool:
        for k in self.native_of(self.stages):
            with warnings.catch_warnings():   # a stage no template takes is not run: unsaid
                warnings.simplefilter("ignore", NoTemplateWarning)
                if not self.kernels[k].runs_natively(scalars, **self._own(self.stages[k], dims)):
                    return False
        return True


class AttentionEpilogueStages(NativeStages):
    """Attention whose output is a function of ``o / l`` — of one chain, or of several over the
    same keys (differential attention) — as stages
    (:mod:`tensorfuse.schedule_templates.attention_epilogue`): each chain's attention on the
    Hopper template, then the function."""

    why = "the Hopper template writes o / l alone"
    _what = "each chain's attention, then the function of o / l"

    @staticmethod
    def stages_of(program, fusion) -> tuple:
        from .schedule_templates.attention_epilogue import attention_epilogue_stages

        return attention_epilogue_stages(program, fusion.names)

    def _staged_because(self) -> str:
        chains = len(self.stages) - 1
        return ("the Hopper attention, then the function of its output" if chains == 1 else
                f"the Hopper attention of each of {chains} chains, then the function of their "
                "outputs")


class ComputedOperandStages(NativeStages):
    """Attention whose q·k operands are computed where the scores are made (rotary embeddings)
    as stages (:mod:`tensorfuse.schedule_templates.operand_stages`): each computed operand stored
    as the tensor cores take it, then the Hopper attention over them."""

    why = "the Hopper template copies its operands, computing nothing on the way"
    _what = "the computed q·k operands stored"

    @staticmethod
    def _not_native(stages: tuple, k: int, kernel) -> str:
        why = NativeStages._not_native(stages, k, kernel)
        computed = {n for stage in stages[:k] for n in stage.produces}   # the stored operands
        wide = [p.name for p in stages[k].program.tensor_params
                if p.name in computed and p.dtype in ("f32", "f64")]
        if not wide:
            return why
        return (f"{why}. The computed operands {', '.join(wide)} are stored as float32, the "
                "dtype their products take (a float32 table times a 16-bit q gives float32); "
                "the Hopper template's tensor cores take 16-bit operands: cast the table or the "
                "product to q's dtype (as transformers' rotary embedding casts its cos and sin) "
                "to run there")

    @staticmethod
    def stages_of(program, fusion) -> tuple:
        from .schedule_templates.operand_stages import computed_operand_stages

        return computed_operand_stages(program, fusion.names, fusion.axis)

    def _staged_because(self) -> str:
        parts = " (float32 products as bf16 parts)" if any(s.note for s in self.stages) else ""
        return f"the computed q·k operands stored{parts}, then the Hopper attention over them"
