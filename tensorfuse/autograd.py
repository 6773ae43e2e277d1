"""Gradients of tensorfuse kernels: ``tf.grad`` and PyTorch autograd.

``tf.grad(kernel)`` is the kernel's backward pass as a kernel of its own (its program from
:func:`tensorfuse.dsl.gradients.gradient_program`): compile it, schedule it, tune it like any
other. Called, it takes the forward's arguments and the gradient of each floating-point output
(by keyword, ``d_<output>``, or positionally after the forward's) and returns the gradient of each
differentiable tensor parameter.

A compiled kernel called on PyTorch tensors that require grad (with grad mode on) returns a
differentiable result: the call goes through the kernel's custom operator
(:mod:`.torch_graph`), whose backward (``torch.library.register_autograd``) runs the compiled
backward kernel on the same target — eagerly, and inside ``torch.compile`` graphs.
"""
from __future__ import annotations

from typing import Sequence

from .dsl import dtypes as dt
from .dsl.gradients import GradientOutput, gradient_program
from .dsl.program import Program, ProgramKernel, ScalarParam, is_kernel
from .errors import TensorfuseError
from .torch_graph import DIFFERENTIATION


class GradientKernel:
    """The backward pass of a traced kernel, itself a traced kernel (``tf.compile`` takes it)."""

    def __init__(self, forward, wrt: Sequence[str] | None = None, saved_outputs: bool = False):
        if not is_kernel(forward):
            raise TypeError(f"tf.grad takes a @tensorfuse.kernel, got {type(forward).__name__}")
        self.forward = forward
        self.fn = forward.fn
        self.name = f"{forward.name}_backward"
        self.program: Program
        # saved_outputs: the forward's outputs at hand (autograd's): the indices of those the
        # program reads, after the gradients (a softmax's backward from its output)
        self.saved: list[int] | None = [] if saved_outputs else None
        self.program, self.outputs = gradient_program(forward.program, wrt, self.name,
                                                      saved=self.saved)
        self.wrt = list(dict.fromkeys(o.param for o in self.outputs))
        self._compiled: dict = {}

    def __repr__(self) -> str:
        return f"<tensorfuse gradient of {self.forward.name} (wrt {', '.join(self.wrt)})>\n" \
            f"{self.program!r}"

    def __call__(self, *args, target: str = "auto", **kwargs):
        """The gradients, one per ``wrt`` parameter (a tuple when there are several): partial
        gradients of one parameter (:mod:`.dsl.gradients`) are added here."""
        compiled = self._compiled.get(target)
        if compiled is None:
            from .api import compile as compile_kernel

            compiled = self._compiled[target] = compile_kernel(self, target=target)
        parts = compiled(*args, **kwargs)
        summed = sum_parts(self.outputs, parts if isinstance(parts, tuple) else (parts,))
        values = [summed[n] for n in self.wrt]
        return values[0] if len(values) == 1 else tuple(values)


def grad(kernel, wrt: Sequence[str] | str | None = None) -> GradientKernel:
    """The backward pass of ``kernel`` (with respect to the tensor parameters ``wrt``; default:
    every floating-point one) as a kernel: ``tf.compile(tf.grad(k))``, or call it directly."""
    return GradientKernel(kernel, wrt)


def sum_parts(outputs: Sequence[GradientOutput], values: Sequence) -> dict:
    """Each parameter's gradient: its parts (loads by different indices) added."""
    summed: dict = {}
    for out, value in zip(outputs, values):
        summed[out.param] = value if out.param not in summed else summed[out.param] + value
    return summed


class Differentiation:
    """PyTorch autograd for one compiled kernel's custom operator: what its forward saves and its
    backward computes (the backward kernel compiled on the forward's target on first use)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.program: Program = kernel.program
        self.params = list(self.program.params)
        self.scalar = [isinstance(p, ScalarParam) for p in self.params]
        self.float_outputs = [k for k, c in enumerate(self.program.outputs)
                              if dt.is_float(c.dtypes[0])]
        self._backward = None
        self.templates: dict = {}   # sizes -> the backward template's key, or None
        self.templates_by_shapes: dict = {}   # the arguments' shapes -> the same
        self.saving = None          # the forward program that also writes the log-sum-exp
        self._saving_kernel = None
        self._fusion = False        # not decided yet (_attention_fusion)
        # the forward the attention backward plans from (an equivalent program: _attention_fusion)
        self.attention_program: Program = self.program

    def training_op(self, qualname: str, device: str):
        """The operator autograd records calls of this kernel with, where its forward can save
        what the backward template reads — softmax attention on a GPU: the program with each
        row's log-sum-exp as a second output
        (:func:`.schedule_templates.attention_chain.with_logsumexp`; its templates write it in the
        epilogue, one float per row), so that the backward does not recompute q·kᵀ for it.
        ``None`` elsewhere (the kernel's own operator is recorded)."""
        fusion = self._attention_fusion()
        if fusion is None:
            return None
        from .schedule_templates.attention_chain import with_logsumexp
        from .torch_graph import kernel_op

        try:
            self.saving = with_logsumexp(self.attention_program, fusion.names)
        except TensorfuseError:
            return None
        op = kernel_op(qualname, self.saving,
                       lambda *args: self._saving().invoke(False, args, {}), device)
        op.register_autograd(self.backward, setup_context=self.setup_context)
        return op

    def _attention_fusion(self):
        """The forward's fusion where it is an attention chain on a CUDA target (what the
        saved log-sum-exp and the backward template need), else None; decided once. The
        forward as ``tf.compile`` reads it (:func:`~tensorfuse.attention_gradient.attention_of`)
        is :attr:`attention_program`."""
        if self._fusion is False:
            self._fusion = None
            if self.kernel.target.kind == "cuda":
                from .attention_gradient import attention_of

                found = attention_of(self.program, self.kernel.target)
                if found is not None:
                    self.attention_program, self._fusion = found
        return self._fusion

    def _saving(self):
        """The compiled forward that also writes the log-sum-exp (on first use)."""
        if self._saving_kernel is None:
            from .api import compile as compile_kernel

            # the plain forward's tuning records apply
            saving = ProgramKernel(self.saving, getattr(self.kernel, "fn", None),
                                   tuned_as=self.program)
            self._saving_kernel = compile_kernel(saving, target=self.kernel.target)
        return self._saving_kernel

    def backward_kernel(self):
        if self._backward is None:
            from .api import compile as compile_kernel

            forward = ProgramKernel(self.program, getattr(self.kernel, "fn", None))
            try:
                self.gradients = GradientKernel(forward, saved_outputs=True)
            except TensorfuseError as exc:
                raise RuntimeError(f"tensorfuse cannot differentiate {self.program.name}: "
                                   f"{exc.message}") from None
            self._backward = compile_kernel(self.gradients, target=self.kernel.target)
        return self._backward

    def setup_context(self, ctx, inputs, output) -> None:
        """Saves the tensor arguments and every output (the training operator's last output, the
        log-sum-exp, is saved too, and marked as having no gradient)."""
        outputs = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(*[x for x, s in zip(inputs, self.scalar) if not s], *outputs)
        ctx.scalars = [x for x, s in zip(inputs, self.scalar) if s]
        ctx.saved_lse = len(outputs) > len(self.program.outputs)
        if ctx.saved_lse:
            ctx.mark_non_differentiable(outputs[-1])
        # gradients of outputs the loss does not use come as None (made as zeros in backward,
        # only where a kernel reads them): autograd's materialised zeros (the log-sum-exp's
        # among them) were 0.6 ms of host time a call in a 1.1 ms backward of a sliding window
        # at S=4096 under torch.profiler (``benchmarks.attention_backward``'s shapes, the H200)
        ctx.set_materialize_grads(False)

    def backward(self, ctx, *grads):
        saved = ctx.saved_tensors
        lse = saved[-1] if ctx.saved_lse else None
        saved = saved[:-1] if ctx.saved_lse else saved
        count = len(self.program.outputs)
        tensors, outputs = iter(saved[:-count]), saved[-count:]
        grads = [g if g is not None else _zeros_like(o) for g, o in zip(grads[:count], outputs)]
        scalars = iter(ctx.scalars)
        args = [next(scalars) if s else next(tensors) for s in self.scalar]
        key = self._template(args)
        if key is not None and _asks_frozen(_TEMPLATES[key].plan, self.params,
                                            ctx.needs_input_grad):
            key = None   # a gradient of a tensor the score reads (a bias table): the program's
        if key is not None:   # attention on a GPU: FlashAttention-2's backward kernels
            plan = _TEMPLATES[key].plan
            named = {p.name: a for p, a in zip(self.params, args)}
            qkv = [named[x.param.name] for x in (plan.q, plan.k, plan.v)]
            others = [named[p.name] for p in self.program.tensor_params
                      if p.name not in {x.param.name for x in (plan.q, plan.k, plan.v)}]
            ints = [int(named[p.name]) for p in self.program.scalar_params
                    if not dt.is_float(p.dtype)]
            floats = [float(named[p.name]) for p in self.program.scalar_params
                      if dt.is_float(p.dtype)]
            direct = _runs_directly([*qkv, outputs[0], grads[0], lse, *others])
            run = _run_backward_template if direct else _template_backward_op()
            made = run(key, *qkv, outputs[0], grads[0], lse, others, ints, floats)
            found = {x.param.name: g for x, g in zip(plan.differentiated, made)}
            return tuple(found.get(p.name) for p in self.params)
        backward = self.backward_kernel()
        args += [grads[k].contiguous() for k in self.float_outputs]
        args += [outputs[k].contiguous() for k in self.gradients.saved]
        parts = backward(*args)
        parts = parts if isinstance(parts, tuple) else (parts,)
        summed = sum_parts(self.gradients.outputs, parts)
        return tuple(None if s else summed.get(p.name) for p, s in zip(self.params, self.scalar))

    def _template(self, args: list):
        """The attention backward template (:mod:`.schedule_templates.attention_backward`) for
        this call's sizes, on a CUDA target whose forward is softmax attention; else None (the
        backward program runs). Decided once per sizes."""
        fusion = self._attention_fusion()
        if fusion is None:
            return None
        # the sizes come from the tensors' shapes alone (the forward checked them): a backward of
        # shapes seen before skips binding every argument again (``tools/profile_host_paths.py``'s
        # backward case times the call's Python)
        shapes = tuple(tuple(a.shape) if hasattr(a, "shape") else None for a in args)
        if shapes in self.templates_by_shapes:
            return self.templates_by_shapes[shapes]
        from .binding import bind_call

        dims = bind_call(self.program, tuple(args), {}, "cuda").dims
        key = tuple(sorted(dims.items()))
        if key not in self.templates:
            self.templates[key] = None
            from .schedule_templates.hopper_attention_backward import backward_template

            made = backward_template(self.attention_program, fusion, dims,
                                     self.kernel.target)
            if isinstance(made, str):
                return None
            _TEMPLATES.append(made)
            self.templates[key] = len(_TEMPLATES) - 1
        self.templates_by_shapes[shapes] = self.templates[key]
        return self.templates[key]


def _asks_frozen(plan, params: list, needs: tuple) -> bool:
    """Whether autograd needs the gradient of a tensor the backward template's plan does not
    differentiate (:func:`~.schedule_templates.attention_backward.frozen_refusal`): a bias
    table the score reads that requires grad."""
    from .schedule_templates.attention_backward import frozen_refusal

    asked = [p.name for p, need in zip(params, needs) if need and not isinstance(p, ScalarParam)]
    return frozen_refusal(plan, asked) is not None


def _runs_directly(tensors: list) -> bool:
    """Whether an eager backward may run the attention backward template without going through
    ``torch.ops.tensorfuse.attention_backward``: plain tensors, nothing tracing or compiling, no
    dispatch mode or functorch transform (``vmap``'s batched tensors pass for plain ones),
    gradients not recorded (a double backward goes through the operator, which
    says it has no derivative) and no profiler (whose traces name the operator). The
    dispatcher's path to the Python implementation (its alias check among it) was the largest
    piece of a short backward's host time under cProfile on the H200 host (a sliding window at
    S=4096, ``benchmarks.attention_backward``'s shapes: host- rather than GPU-bound there)."""
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return not torch.is_grad_enabled() and not torch.compiler.is_compiling() and \
        _get_current_dispatch_mode() is None and \
        not torch._C._are_functorch_transforms_active() and \
        not torch._C._autograd._profiler_enabled() and \
        all(t is None or type(t) is torch.Tensor for t in tensors)


def _zeros_like(x):
    import torch

    return torch.zeros_like(x)


# The backward templates made so far, by index: the key the operator below takes, so that
# autograd (eager, or AOT autograd tracing a torch.compile graph with fake tensors) calls one
# operator whatever the kernel.
_TEMPLATES: list = []
_OP: list = []


def _run_backward_template(key, q, k, v, out, d_out, lse, others, ints, floats):
    """``_TEMPLATES[key]`` on its tensors (``others``: the forward's other tensor parameters in
    order, its scalar parameters split into ``ints`` and ``floats`` in order; ``lse``: the
    forward's log-sum-exp where it saved it): ``[dq, dk, dv]``, and the sink's gradient where the
    output has sinks; the operator's implementation, which an eager backward calls directly
    (:func:`_runs_directly`)."""
    template = _TEMPLATES[key]
    program = template.plan.program
    tensors = _named_tensors(template.plan, q, k, v, others)
    ints_, floats_ = iter(ints), iter(floats)
    scalars = {p.name: next(floats_) if dt.is_float(p.dtype) else next(ints_)
               for p in program.scalar_params}
    return list(template(tensors, scalars, out, d_out, lse))


def _named_tensors(plan, q, k, v, others) -> dict:
    """The forward's tensor arguments by parameter name: q, k, v, and ``others`` in order."""
    names = [x.param.name for x in (plan.q, plan.k, plan.v)]
    tensors = dict(zip(names, (q, k, v)))
    tensors.update(zip([p.name for p in plan.program.tensor_params if p.name not in names],
                       others))
    return tensors


def _template_backward_op():
    """``torch.ops.tensorfuse.attention_backward``: :func:`_run_backward_template` as an operator
    (made once); its fake implementation gives the gradients' shapes."""
    if _OP:
        return _OP[0]
    import torch

    op = torch.library.custom_op(
        "tensorfuse::attention_backward", _run_backward_template, mutates_args=(),
        schema="(int key, Tensor q, Tensor k, Tensor v, Tensor out, Tensor d_out, Tensor? lse, "
               "Tensor[] others, int[] ints, float[] floats) -> Tensor[]")

    @op.register_fake
    def _(key, q, k, v, out, d_out, lse, others, ints, floats):
        plan = _TEMPLATES[key].plan
        made = [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]
        if plan.sink is not None:
            sink = _named_tensors(plan, q, k, v, others)[plan.sink.param.name]
            made.append(torch.empty_like(sink))
        return made

    _OP.append(op)
    return op


DIFFERENTIATION.append(Differentiation)   # every kernel's custom operator gets a backward
