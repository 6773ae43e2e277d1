"""Attention whose tensors hold their head dim outside another axis — q, k or v declared
``[B, H, D, S]`` (a channels-first model's projections split into heads: ``x[B, C, H·W]`` as
``[B, heads, D, H·W]``), an output written so — run on the Hopper attention with those tensors
copied into the order its TMA copies read (rows of the head dim), and such an output written in
that order and copied into the one declared.

The Hopper template reads q, v and the output by rows of the head dim, and k by rows of it or,
keys innermost, as the MN-major operand of q·kᵀ (:func:`.hopper_attention_plan.head_dim_orders`).
A program declaring another order went whole to the Triton template, which reads any strides
but ran at 0.55–0.65× the Hopper template's speed on the same attention (head dims 80 and 96:
``benchmarks.user_kernels``, ``tensorfuse triton`` rows). A copy reads and writes its tensor once
— for ``q`` of B2 H16 S4096 D128 bf16 32 MiB, some 10 µs beside the attention's 250 —, so the
program with those tensors declared in the template's order (:func:`head_dims_innermost`) runs on
the Hopper template, and :class:`ReorderedKernel` copies the caller's tensors into that order
before each call (said in the plan: nothing is copied behind the caller's back). A caller whose
tensor already lies in that order in memory (a view ``t.transpose(-1, -2)`` of a contiguous
``[B, H, S, D]``) has it read in place instead (:mod:`tensorfuse.memory_order`)."""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra.axis_orders import with_axis_orders
from ..dsl.program import Program
from ..errors import ScheduleError
from .attention_chain import recognise_attention
from .hopper_attention_plan import head_dim_orders
from .lifted_kernel import LiftedFastCall, LiftedKernel

WHO = "reordered operands"
ROLES = ("q", "k", "v", "out")   # the chain's tensors by their place in its layouts


@dataclass(frozen=True)
class Reordered:
    """``program`` (an attention's, rewritten) with the tensors of ``orders`` declared as
    ``x.permute(order)`` of the caller's, and the outputs of ``outputs`` laid out so."""

    program: Program
    orders: tuple[tuple[str, tuple[int, ...]], ...]
    outputs: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def describe(self, source: Program) -> str:
        """What is copied before and after each call, in the source program's sizes."""
        dims = {p.name: p.dims for p in source.tensor_params}
        axes = {c.name: [a.extent or a.name for a in c.axes] for c in source.outputs}

        def shape(names, order) -> str:
            return "[" + ", ".join(str(names[k]) for k in order) + "]"
        text = "head dims innermost for the Hopper attention's copies: " + "; ".join(
            f"{name} copied as {shape(dims[name], order)}" for name, order in self.orders)
        return text + "".join(f"; {name} written as {shape(axes[name], order)}, then copied as "
                              f"declared" for name, order in self.outputs)


def head_dims_innermost(program: Program, names: tuple[str, ...], axis: str) -> Reordered | None:
    """``program`` (softmax attention fused over ``names``, sweeping ``axis``) with each of its
    tensors whose layout the Hopper attention cannot read declared with its head dim innermost,
    and the output likewise; None where every layout is one it reads, where the program is no
    attention it recognises, or where one tensor plays two roles in different orders."""
    try:
        chain = recognise_attention(program, names, axis, WHO, dtypes=("bf16", "f16"),
                                    logsumexp=True, value_dims=True, sinks=True,
                                    empty_rows=True, float32_output=True)
    except ScheduleError:
        return None
    moved = head_dim_orders(chain.layouts)
    if not moved:
        return None
    tensors = dict(zip(ROLES, (chain.q, chain.k, chain.v, chain.out)))
    orders: dict = {}
    for place, order in moved.items():
        if place == 3:
            continue
        name = tensors[ROLES[place]]
        if orders.setdefault(name, order) != order:
            return None
    if any(orders.get(tensors[role]) not in (None, moved.get(place))
           for place, role in enumerate(ROLES[:3])):
        return None   # one tensor in two roles: moved for one, read as written for the other
    outputs = {chain.out: moved[3]} if 3 in moved else {}
    return Reordered(with_axis_orders(program, orders, outputs), tuple(orders.items()),
                     tuple(outputs.items()))


def _inverse(order: tuple) -> tuple:
    return tuple(sorted(range(len(order)), key=order.__getitem__))


def _copy(order: tuple):
    """The caller's tensor in the order the kernel reads: a contiguous copy."""
    return lambda x: x.permute(order).contiguous()


class ReorderedKernel(LiftedKernel):
    """``inner``, a kernel of ``reordered.program``, as a kernel of the program as written: each
    reordered tensor copied into its order before the call, each reordered output written by the
    inner kernel into a buffer of its order and copied into the caller's (or a new contiguous)
    output after it."""

    who = "operands copied with their head dims innermost"

    def __init__(self, program: Program, reordered: Reordered, inner, target):
        super().__init__(program, {}, inner, target, ())
        self.reordered = reordered
        self.orders, self.out_orders = dict(reordered.orders), dict(reordered.outputs)
        self.lift = reordered.describe(program)
        self.description = f"{self.lift}; {inner.description}"

    def inner_sizes(self, sizes: dict) -> dict:
        return dict(sizes)   # a permutation keeps every size's name

    def _views(self, values: dict, outs: list, dims: dict) -> list:
        for name, order in self.orders.items():
            values[name] = _copy(order)(values[name])
        return _buffers(outs, [self.out_orders.get(c.name) for c in self.outputs])

    def _finish(self, views: list, outs: list) -> None:
        _copy_back(views, outs, [self.out_orders.get(c.name) for c in self.outputs])

    def _copied(self, inner_kwargs: dict) -> dict:
        return {name: _copy(order) for name, order in self.orders.items()}

    def _made_fast_call(self, *args) -> "ReorderedFastCall":
        return ReorderedFastCall(*args, out_orders=[self.out_orders.get(c.name)
                                                    for c in self.outputs])


def _buffers(outs: list, orders: list) -> list:
    """What the inner kernel writes: each output, or for one with an order a new contiguous
    buffer of that order's shape."""
    import torch

    return [o if order is None else
            torch.empty([o.shape[k] for k in order], dtype=o.dtype, device=o.device)
            for o, order in zip(outs, orders)]


def _copy_back(views: list, outs: list, orders: list) -> None:
    """Each output written in another order copied from its buffer into the output."""
    for view, out, order in zip(views, outs, orders):
        if order is not None:
            out.copy_(view.permute(_inverse(order)))


class ReorderedFastCall(LiftedFastCall):
    """:class:`LiftedFastCall` whose reordered outputs (``out_orders``: per output, an order or
    None) the inner kernel writes into new buffers of their order, copied into the outputs
    after it."""

    def __init__(self, *args, out_orders: list, **kwargs):
        super().__init__(*args, **kwargs)
        self.out_orders = list(out_orders)

    def out_views(self, outs: list) -> list:
        return [o.view(shape) for o, shape in zip(_buffers(outs, self.out_orders),
                                                   self.out_shapes)]

    def finish(self, views: list, outs: list) -> None:
        _copy_back(views, outs, self.out_orders)
