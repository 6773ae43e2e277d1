"""Attention with one of q, k, v holding its head dim outside another axis — declared ``[B, H,
D, S]`` (as a channels-first model's projections split into heads give it) — run on the Hopper
attention with that tensor copied into the order its TMA copies read (rows of the head dim).

The Hopper template reads q, v and the output by rows of the head dim, and k by rows of it or,
keys innermost, as the MN-major operand of q·kᵀ (:func:`.hopper_attention_plan.head_dim_orders`).
A program declaring another order goes to the Triton template, which reads any strides. On the
H100 (non-causal B2 H16 S4096 D128 bf16), with q alone ``[B, H, D, S]`` the Triton template took
567 µs, the Hopper kernel of the program declared with q's head dim innermost 451 with q copied
into that order before it (:func:`reorder_program`: 29 µs a copy, where torch's ``permute(…)
.contiguous()`` took 100); with q, k, v and the output all ``[B, H, D, S]`` the Triton template
took 586 µs, the Hopper kernel alone 468 (k read as it lies) but 615 with q and v copied in and
the output copied out — so one tensor is copied (:data:`MOST_COPIED`) and a program needing more
copies stays on the Triton template. :func:`head_dims_innermost` writes the program with that
tensor in the template's order, and :class:`ReorderedKernel` copies the caller's tensor into it
before each call (said in the plan: nothing is copied behind the caller's back). A caller whose
tensor already lies in that order in memory (a view ``t.transpose(-1, -2)`` of a contiguous
``[B, H, S, D]``) has it read in place instead (:mod:`tensorfuse.memory_order`)."""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra.axis_orders import with_axis_orders
from ..dsl.expr import Axis, Load
from ..dsl.program import Compute, Program, TensorParam
from ..errors import ScheduleError
from .attention_chain import recognise_attention
from .hopper_attention_plan import head_dim_orders
from .lifted_kernel import LiftedKernel

WHO = "reordered operands"
# tensors copied before a call at most: the copies of three cost more than the Hopper template
# gains on the Triton one (module docstring; ``python -m benchmarks.unlisted_kernels --only
# attention_channels_first``, and the same attention with q alone transposed)
MOST_COPIED = 1


@dataclass(frozen=True)
class Reordered:
    """``program`` (an attention's, rewritten) with the tensors of ``orders`` declared as
    ``x.permute(order)`` of the caller's."""

    program: Program
    orders: tuple[tuple[str, tuple[int, ...]], ...]

    def describe(self, source: Program) -> str:
        """What is copied before each call, in the source program's sizes."""
        dims = {p.name: p.dims for p in source.tensor_params}
        return "head dims innermost for the Hopper attention's copies: " + "; ".join(
            f"{name} copied as [{', '.join(str(dims[name][k]) for k in order)}]"
            for name, order in self.orders)


def head_dims_innermost(program: Program, names: tuple[str, ...], axis: str) -> Reordered | None:
    """``program`` (softmax attention fused over ``names``, sweeping ``axis``) with the one
    tensor whose layout the Hopper attention cannot read declared with its head dim innermost;
    None where every layout is one it reads, where more tensors than :data:`MOST_COPIED` or the
    output would move, where the program is no attention it recognises, or where one tensor
    plays two roles."""
    try:
        chain = recognise_attention(program, names, axis, WHO, dtypes=("bf16", "f16"),
                                    logsumexp=True, value_dims=True, sinks=True,
                                    empty_rows=True, float32_output=True)
    except ScheduleError:
        return None
    moved = head_dim_orders(chain.layouts)
    tensors = (chain.q, chain.k, chain.v)
    if not moved or 3 in moved or len(moved) > MOST_COPIED or len(set(tensors)) < 3:
        return None
    orders = {tensors[place]: order for place, order in moved.items()}
    return Reordered(with_axis_orders(program, orders), tuple(orders.items()))


def reorder_program(name: str, dims: tuple, dtype: str, order: tuple) -> Program:
    """``x.permute(order).contiguous()`` of a tensor ``name`` of ``dims`` as a program: its one
    output over ``x``'s axes in ``order``, each element read once — the elementwise template
    runs it as a tiled transpose at a copy's speed (28.6 µs for 32 MiB of bf16 ``[2, 16, 128,
    4096]`` on the H100, where torch's ``permute(…).contiguous()`` took 100.5)."""
    param = TensorParam(name, tuple(dims), dtype)
    axes = [Axis(f"a{k}", dim) for k, dim in enumerate(dims)]
    out = Compute("out", tuple(axes[k] for k in order), (Load(param, list(axes)),), (dtype,),
                  is_output=True)
    return Program(f"{name}_reordered", [param], [out], [out], axes)


class ReorderedKernel(LiftedKernel):
    """``inner``, a kernel of ``reordered.program``, as a kernel of the program as written: each
    reordered tensor copied into its order before the call by a kernel of
    :func:`reorder_program` that ``make_copy`` compiles (the elementwise template's on a GPU)."""

    who = "operands copied with their head dims innermost"

    def __init__(self, program: Program, reordered: Reordered, inner, target, make_copy):
        super().__init__(program, {}, inner, target, ())
        self.reordered = reordered
        dims = {p.name: (p.dims, p.dtype) for p in program.tensor_params}
        self.copies = {name: make_copy(reorder_program(name, *dims[name], order))
                       for name, order in reordered.orders}
        self.lift = reordered.describe(program)
        self.description = f"{self.lift}; {inner.description}"

    def inner_sizes(self, sizes: dict) -> dict:
        return dict(sizes)   # a permutation keeps every size's name

    def _views(self, values: dict, outs: list, dims: dict) -> list:
        for name, copy in self.copies.items():
            values[name] = copy(values[name])
        return outs

    def _copied(self, inner_kwargs: dict) -> dict:
        return dict(self.copies)
