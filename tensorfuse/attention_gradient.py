"""``tf.grad`` of softmax attention on a GPU through the attention backward template.

The gradient program of attention is no chain a template takes whole (dQ needs Δ = rowsum(dO ∘ O)
before its pass), so ``tf.compile`` would cut it into the floor's stages, which store the scores
— B·H·M·N floats — between them. What autograd runs instead is FlashAttention-2's backward,
memory linear in the sequence: the forward with each row's log-sum-exp saved, then the attention
backward template (:mod:`.schedule_templates.attention_backward`; the Hopper kernel where
:func:`.schedule_templates.hopper_attention_backward.hopper_backward` chooses it). A
``tf.grad`` kernel of attention runs the same two, called as any ``tf.grad`` kernel is (the
forward's arguments and ``d_<output>``), and the floor at sizes the template refuses.
"""
from __future__ import annotations

from .binding import CallBinder
from .composed import call_device, filled
from .dsl import dtypes as dt
from .errors import TensorfuseError
from .targets import TargetSpec
from .torch_graph import GraphCallable


def attention_forward(gradient, target: TargetSpec):
    """``(forward program, its fusion)`` where ``gradient`` is a ``tf.grad`` kernel on a CUDA
    ``target`` whose forward is softmax attention (:func:`attention_of`) and each parameter's
    gradient is one output — what an :class:`AttentionGradientKernel` is made of; else None."""
    forward = getattr(gradient, "forward", None)
    if target.kind != "cuda" or forward is None or getattr(gradient, "saved", None) is not None:
        return None
    params = [o.param for o in gradient.outputs]
    if len(params) != len(set(params)):
        return None
    return attention_of(forward.program, target)


def attention_of(program, target: TargetSpec):
    """``(program as tf.compile reads it, its fusion)`` where ``program`` is softmax attention
    (the attention template's choice, a max → sum(exp) → weighted-sum chain), else None: what
    the attention backward plans from. Attention written another way (weights then their sum,
    in base two) is read as its equivalent program
    (:func:`~tensorfuse.read_other_ways.equivalent_program`): the same function, so the same
    gradients."""
    from .read_other_ways import equivalent_program
    from .schedule_templates.attention_chain import softmax_states
    from .schedule_templates.auto import choose

    program = equivalent_program(program)
    choice = choose(program, target)
    if choice is None or choice[0] != "attention":
        return None
    try:   # the rolled chain is softmax attention's (the template also rolls other chains)
        softmax_states(program, choice[1].names)
    except TensorfuseError:
        return None
    return program, choice[1]


class AttentionGradientKernel(GraphCallable):
    """A ``tf.grad`` kernel of attention: the forward with its log-sum-exp, then the attention
    backward template, per call's sizes; the floor where the template refuses them."""

    def __init__(self, gradient, target: TargetSpec, attention: tuple, floor, compile_kernel):
        self.gradient, self.target = gradient, target
        # the forward the template plans from (an equivalent program of the gradient's own) and
        # its fusion: :func:`attention_forward`
        self.forward, self.fusion = attention
        self._compile = compile_kernel
        self.program = gradient.program
        self._floor_factory, self._floor = floor, None
        self._saving = None
        self._templates: dict = {}   # sizes -> the backward template, or why it refused them
        self._calls = None
        forward_names = {p.name for p in self.forward.params}
        grads = [p for p in self.program.tensor_params if p.name not in forward_names]
        self.d_out = grads[0].name   # the attention's one output's gradient

    def __repr__(self) -> str:
        return f"<AttentionGradientKernel {self.program.name} for {self.target.name}>"

    def template(self, **dims):
        """The backward template at these sizes, or the reason it refuses them (a string)."""
        key = tuple(sorted(dims.items()))
        if key not in self._templates:
            from .schedule_templates.attention_backward import frozen_refusal
            from .schedule_templates.hopper_attention_backward import backward_template

            made = backward_template(self.forward, self.fusion, dict(dims), self.target)
            if not isinstance(made, str):
                made = frozen_refusal(made.plan, [o.param for o in self.gradient.outputs]) \
                    or made
            self._templates[key] = made
        return self._templates[key]

    def invoke(self, key, args: tuple, kwargs: dict):
        if self._calls is None:
            self._calls = CallBinder(self.program, call_device(self.target))
        bound = self._calls(args, kwargs, key)
        made = self.template(**bound.dims)
        if isinstance(made, str):
            return self.floor().invoke(key, args, kwargs)
        values = {**bound.arrays, **bound.scalars}
        forward_args = {p.name: values[p.name] for p in self.forward.params}
        out, lse = self.saving().invoke(False, (), forward_args)
        tensors = {p.name: values[p.name] for p in self.forward.tensor_params}
        scalars = {p.name: values[p.name] for p in self.forward.scalar_params}
        gradients = made(tensors, scalars, out, values[self.d_out], lse)
        by_param = {x.param.name: g for x, g in zip(made.plan.differentiated, gradients)}
        results = [by_param[o.param].to(_torch_dtype(c.dtypes[0]))
                   for o, c in zip(self.gradient.outputs, self.program.outputs)]
        if bound.outs is not None:
            return filled(bound.outs, results)
        return results[0] if len(results) == 1 else tuple(results)

    def saving(self):
        """The forward that also writes each row's log-sum-exp (compiled on first use)."""
        if self._saving is None:
            from .dsl.program import ProgramKernel
            from .schedule_templates.attention_chain import with_logsumexp

            # the plain forward's tuning records apply
            saving = ProgramKernel(with_logsumexp(self.forward, self.fusion.names),
                                   tuned_as=self.forward)
            self._saving = self._compile(saving, target=self.target)
        return self._saving

    def floor(self):
        if self._floor is None:
            self._floor = self._floor_factory()
        return self._floor

    def _at(self, dims: dict):
        return self.template(**{n: v for n, v in dims.items() if n in self.program.dim_names()})

    def schedule_origin(self, **dims) -> str:
        made = self._at(dims)
        if isinstance(made, str):
            return f"{self.floor().schedule_origin(**dims)} (the attention backward template " \
                   f"refuses these sizes: {made})"
        return (f"attention backward template ({type(made).__name__}): the forward again with "
                f"its log-sum-exp saved, then FlashAttention-2's backward, nothing of B·H·M·N "
                f"stored")

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        """The floor's stages and their plans where the template refuses these sizes."""
        if isinstance(self._at(dims), str):
            return self.floor().describe_plan(scalars, **dims)
        return self.schedule_origin(**dims)

    def source(self, **dims) -> str:
        """The backward template's source at these sizes (the floor's where it refuses them)."""
        made = self._at(dims)
        return self.floor().source(**dims) if isinstance(made, str) else made.source

    def assembly(self, **dims) -> str:
        """The backward template's kernels' assembly at these sizes, in launch order (the
        floor's where it refuses them)."""
        from .targets.triton.launch import assembly_of

        made = self._at(dims)
        if isinstance(made, str):
            return self.floor().assembly(**dims)
        return "\n".join(assembly_of(c, self.target) for c in made.compiled(self.target))

    def cache_info(self) -> list:
        return (self._saving.cache_info() if self._saving is not None else []) + \
            (self._floor.cache_info() if self._floor is not None else [])


def _torch_dtype(dtype: str):
    from .interop import torch_dtype

    return torch_dtype(dt.resolve(dtype))
