"""Tensors passed in another axis order than the program declares, read in their memory order.

A channels-last activation seen as ``[B, C, P]`` (``x.permute(0, 2, 1)``), a weight passed as
``w.t()``, keys passed as ``k.transpose(-1, -2)``: as data such a view is the program's tensor,
but its innermost axis is strided, so no load along it is a vector and no TMA box can hold it.
Copying it contiguous before each launch costs a read and a write of the tensor, and the plan
then still sweeps the program's innermost axis where the data had another one contiguous. The
general answer is to plan the program as the data lies:
:func:`~tensorfuse.algebra.axis_orders.with_axis_orders` writes the program with each such tensor
declared in its memory order (its axes sorted by stride) and its reads' indices permuted alike —
the same math, so the plans by the roles of axes take it as they take a program written that
way — and :class:`MemoryOrderKernel` runs that program's kernel on
the caller's views, permuted back to their memory order (``x.permute(order)``: nothing copied).
An output over the axes such a tensor is read by is laid out as that tensor is
(:func:`output_orders`: a channels-last map's log-softmax comes back channels last, as torch's
operators keep a memory format), an ``out=`` tensor in its own order; inside a custom
operator's implementation (torch.compile, autograd) outputs stay row-major, as the operator's
fake implementation says.

:class:`MemoryOrderRoutes` decides per call (a kernel's checked path; a signature seen before
keeps its fast call, which checks the strides): a torch tensor whose innermost axis is strided
while another axis is contiguous (:func:`memory_order`) routes the call to the kernel of the
program in that order, compiled once per set of orders. A view that no order makes contiguous
along one axis (``x[:, ::2]``) is copied as before
(:class:`~tensorfuse.errors.CopiedArgumentWarning`), and so is one whose reordered program a
template would not take at the call's sizes where the program as written has one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .algebra.axis_orders import with_axis_orders
from .algebra.exprs import nodes
from .binding import CallBinder, bind_call, split_scalars
from .dsl.expr import Axis, Load
from .dsl.program import Program, TensorParam
from .interop import ALIGNMENT, is_torch, torch_dtype
from .schedule_templates.lifted_kernel import LiftedFastCall, LiftedKernel, binding_device
from .torch_graph import IN_OPERATOR


def memory_order(x) -> tuple[int, ...] | None:
    """The order of torch tensor ``x``'s axes in memory (``x.permute(order)`` has its strides
    descending, its innermost axis contiguous) where ``x``'s own innermost axis is strided and
    another is contiguous; else None (already in order, or no axis contiguous: a step along
    every axis, a broadcast axis). Axes of one element keep their places."""
    if not is_torch(x) or x.dim() < 2:
        return None
    shape, strides = x.shape, x.stride()
    spread = [k for k in range(x.dim()) if shape[k] > 1]
    if len(spread) < 2 or strides[spread[-1]] == 1:
        return None
    if any(strides[k] <= 0 for k in spread):
        return None
    ranked = sorted(spread, key=lambda k: -strides[k])   # stable: equal strides keep order
    if strides[ranked[-1]] != 1:
        return None
    order = list(range(x.dim()))
    for place, axis in zip(spread, ranked):
        order[place] = axis
    return tuple(order)


def output_orders(program: Program, orders: dict) -> dict:
    """The memory order each output takes where the call passes no ``out=``: an output over the
    axes a reordered tensor is read by (a log-softmax's output over the ``[B, C, P]`` of its
    channels-last input) is laid out as that tensor is, as torch's operators keep a tensor's
    memory format; other outputs stay row-major. Name → order, for the outputs that move."""
    reads: dict = {}   # a reordered tensor -> the axes of its reads, where all read it alike
    for c in program.computes:
        for body in c.bodies:
            for n in nodes(body):
                if isinstance(n, Load) and n.param.name in orders:
                    axes = tuple(i.uid if isinstance(i, Axis) else None for i in n.indices)
                    reads.setdefault(n.param.name, set()).add(axes)
    found = {}
    for c in program.outputs:
        mine = tuple(a.uid for a in c.axes)
        for name, order in orders.items():
            (axes, *others) = reads.get(name, {()})
            if others or None in axes or sorted(axes) != sorted(mine) or len(set(mine)) < \
                    len(mine):
                continue
            moved = tuple(mine.index(axes[k]) for k in order)
            if moved != tuple(range(len(mine))):
                found[c.name] = moved
            break
    return found


@dataclass(frozen=True)
class Orders:
    """The memory orders of a call's tensors in another order: ``(name, order)`` of the
    arguments in the program's parameter order, and of the outputs."""

    orders: tuple[tuple[str, tuple[int, ...]], ...]
    outputs: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def describe(self, program: Program) -> str:
        dims = {p.name: p.dims for p in program.tensor_params}
        text = "read in memory order: " + "; ".join(
            f"{name} as [{', '.join(str(dims[name][k]) for k in order)}]"
            for name, order in self.orders)
        axes = {c.name: [str(a.extent or a.name) for a in c.axes] for c in program.outputs}
        return text + "".join(f"; {name} written as [{', '.join(axes[name][k] for k in order)}]"
                              for name, order in self.outputs)


def _inverse(order: tuple) -> tuple:
    return tuple(sorted(range(len(order)), key=order.__getitem__))


class MemoryOrderKernel(LiftedKernel):
    """``inner``, a kernel of the program with some tensors declared (and outputs laid out) in
    their memory order (:func:`~tensorfuse.algebra.axis_orders.with_axis_orders`), as a kernel of
    the program as written: a call's tensors are passed to it permuted to that order (views), and
    an output laid out so is given back as the view of the program's shape over it."""

    who = "read in memory order"

    def __init__(self, program: Program, orders: Orders, inner, target):
        super().__init__(program, {}, inner, target, ())
        self._calls = CallBinder(program, binding_device(target, report=False))
        self.orders, self.out_orders = dict(orders.orders), dict(orders.outputs)
        self.lift = orders.describe(program)
        self.description = f"{self.lift}; {inner.description}"

    def inner_sizes(self, sizes: dict) -> dict:
        return dict(sizes)   # a permutation keeps every size's name

    def _output(self, compute, shape: list, given, device):
        order = self.out_orders.get(compute.name)
        if order is None:
            return super()._output(compute, shape, given, device)
        if given is not None and is_torch(given) and memory_order(given) == order and \
                given.data_ptr() % ALIGNMENT == 0:
            return given   # the caller's own tensor in that order: written in place
        return laid_out(shape, torch_dtype(compute.dtypes[0]), device, order)

    def _views(self, values: dict, outs: list, dims: dict) -> list:
        for name, order in self.orders.items():
            values[name] = values[name].permute(order)
        return [o.permute(self.out_orders[c.name]) if c.name in self.out_orders else o
                for c, o in zip(self.outputs, outs)]

    def _fast_call(self, params, outputs, likes, guards, bound, inner_kwargs: dict, inner_fast):
        """The signature's fast call: the permuted tensors' strides checked per call (another
        layout takes the checked path, which routes it anew), each permuted on the way in; the
        outputs laid out in their orders."""
        out = inner_kwargs["out"]
        out_shapes = [tuple(o.shape) for o in (out if isinstance(out, tuple) else (out,))]
        strides = {n: tuple(bound.arrays[n].stride()) for n in self.orders}
        permute = {n: (lambda x, order=order: x.permute(order))
                   for n, order in self.orders.items()}
        return MemoryOrderFastCall(params, outputs, bound.torch_device, likes, guards, {},
                                   out_shapes, inner_fast, permute, views=strides,
                                   out_orders=[self.out_orders.get(c.name)
                                               for c in self.outputs])


def laid_out(shape, dtype, device, order: tuple):
    """A new tensor of ``shape`` whose axes lie in memory in ``order`` (``t.permute(order)`` is
    contiguous)."""
    import torch

    made = torch.empty([shape[k] for k in order], dtype=dtype, device=device)
    return made.permute(_inverse(order))


class MemoryOrderFastCall(LiftedFastCall):
    """:class:`LiftedFastCall` whose new outputs are laid out in their memory orders
    (``out_orders``: per output, an order or None) and passed to the inner kernel permuted to
    them."""

    def __init__(self, *args, out_orders: list, **kwargs):
        super().__init__(*args, **kwargs)
        self.out_orders = list(out_orders)

    def __call__(self, args: tuple, kwargs: dict):
        if IN_OPERATOR.get() and any(order is not None for order in self.out_orders):
            return None   # an operator's outputs are row-major: the checked path routes it
        return super().__call__(args, kwargs)

    def new_outputs(self, tensors: list) -> list:
        return [laid_out(shape, dtype, self.device, order) if order is not None else
                self.empty(shape, dtype=dtype, device=self.device) if like is None else
                self.empty_like(tensors[like])
                for (shape, dtype, like), order in zip(self.outputs, self.out_orders)]

    def out_views(self, outs: list) -> list:
        return [o.view(shape) if order is None else o.permute(order)
                for o, shape, order in zip(outs, self.out_shapes, self.out_orders)]


# what runs a call, best first: a route that would run on a lesser one than the program as
# written keeps the copy. The Triton contraction's GEMM tiles rank with the native templates:
# within a few per cent of the Hopper GEMM (a rows operand passed as x.t(), 8192 × 4096 × 4096
# on the H100: 397 µs on the view against 393 for the Hopper GEMM's transposed A, where a copy
# of x alone would add some 40). A route to a native template that copies the routed tensor
# into another order itself (queries with a strided head dim: the Hopper attention reads q by
# rows of its head dim, :mod:`.schedule_templates.reordered_operands`) is taken: its copy is
# the elementwise template's transpose, where the copy it saves was torch's (29 µs against 100
# for 32 MiB on the H100).
# Stages that store little between them (a group norm's statistics: a value per group, where
# the stages read the activations) rank with the Triton template: what they add is a second read
# of the inputs, no more than the copy a declined route makes (read and written).
_RANKS = ("a native CUDA template", "a Triton template", "stages", "TVM's default schedule")
LITTLE_STORED = 1 / 16   # of the bytes the program reads: stages that store at most this


def _rank(kernel, dims: dict) -> int:
    """Where what runs ``kernel`` at ``dims`` stands in :data:`_RANKS`: an
    :class:`~tensorfuse.api.AutoKernel`'s pick, a wrapper's inner kernel's (a sweep over
    several axes: its flat kernel's)."""
    from .compiled import CompiledKernel
    from .flat_kernel import FlatSweepKernel
    from .staged import StagedKernel
    from .targets.triton.contraction_kernel import ContractionKernel

    if isinstance(kernel, FlatSweepKernel):
        return _rank(kernel.for_sizes(**dims), dims)
    picks = getattr(kernel, "for_sizes", None)
    chosen = picks(**dims) if picks is not None else kernel
    if chosen is getattr(kernel, "fallback", None) or isinstance(chosen, CompiledKernel):
        return 3
    if isinstance(chosen, StagedKernel):
        sizes = split_scalars(chosen.program, dims)[0]
        return 1 if chosen.stored_fraction(**sizes) <= LITTLE_STORED else 2
    inner = getattr(chosen, "inner", None)
    if inner is not None:   # a lifted or rewritten program's kernel
        sizes = chosen.inner_sizes(dims) if hasattr(chosen, "inner_sizes") else dims
        return _rank(inner, sizes)
    native = type(chosen).__module__.startswith("tensorfuse.targets.cuda")
    return 0 if native or isinstance(chosen, ContractionKernel) else 1


class MemoryOrderRoutes:
    """The routes of a kernel's calls whose tensors lie in another axis order
    (:func:`memory_order`): one :class:`MemoryOrderKernel` per set of orders, its inner kernel
    ``make(program)`` of the program in that order (``tf.compile``'s choice for it)."""

    def __init__(self, kernel, make: Callable[[Program], object]):
        self.kernel, self.make = kernel, make
        self.program: Program = kernel.program
        self._tensors = [(k, p.name) for k, p in enumerate(self.program.params)
                         if isinstance(p, TensorParam)]
        self._kernels: dict = {}    # Orders -> MemoryOrderKernel
        self._taken: dict = {}      # (Orders, sizes) -> whether the route is taken
        self._outputs: dict = {}    # the arguments' orders -> the outputs' (output_orders)
        self._by_key: dict = {}     # (signature key, Orders) -> the route's kernel, or None

    def orders(self, args: tuple, kwargs: dict) -> Orders | None:
        """The memory orders of the call's tensors that lie in another order, or None; the
        outputs' those of the caller's ``out=`` tensors, or, without it, those the reordered
        tensors give them (:func:`output_orders`)."""
        found = []
        for place, name in self._tensors:
            x = args[place] if place < len(args) else kwargs.get(name)
            order = memory_order(x) if x is not None else None
            if order is not None:
                found.append((name, order))
        if not found:
            return None
        found = tuple(found)
        given = kwargs.get("out")
        if given is None and IN_OPERATOR.get():   # row-major, as the operator's fake says
            outputs = ()
        elif given is None:
            outputs = self._outputs.get(found)
            if outputs is None:
                outputs = self._outputs[found] = tuple(output_orders(self.program,
                                                                     dict(found)).items())
        else:
            given = list(given) if isinstance(given, (tuple, list)) else [given]
            outputs = tuple((c.name, memory_order(o)) for c, o in zip(self.program.outputs, given)
                            if memory_order(o) is not None)
        return Orders(found, outputs)

    def kernel_for(self, orders: Orders) -> MemoryOrderKernel:
        """The kernel of the program with ``orders`` (made on first use)."""
        made = self._kernels.get(orders)
        if made is None:
            inner = self.make(with_axis_orders(self.program, dict(orders.orders),
                                              dict(orders.outputs)))
            made = self._kernels[orders] = MemoryOrderKernel(self.program, orders, inner,
                                                             self.kernel.target)
        return made

    def route(self, args: tuple, kwargs: dict, key=None) -> MemoryOrderKernel | None:
        """The kernel that runs this call on its tensors where they lie, or None (no tensor in
        another order, or :meth:`taken` says no: the tensor is then copied, as it was).
        ``key``: the call's signature key, where made (it fixes the sizes: a signature seen
        with these orders before is answered without binding the call again — a kernel without
        fast calls, the scan template's, asks on every call)."""
        orders = self.orders(args, kwargs)
        if orders is None:
            return None
        at = (key, orders) if key else None
        if at in self._by_key:
            return self._by_key[at]
        device = binding_device(self.kernel.target)
        dims = bind_call(self.program, args, {n: v for n, v in kwargs.items() if n != "out"},
                         device).dims
        made = self._kernels[orders] if self.taken(orders, dims) else None
        if at is not None:
            self._by_key[at] = made
        return made

    def taken(self, orders: Orders, dims: dict) -> bool:
        """Whether calls at sizes ``dims`` with tensors in ``orders`` run on the program in that
        order: unless what would run it ranks below what runs the program as written
        (:data:`_RANKS`)."""
        at = (orders, tuple(sorted(dims.items())))
        if at not in self._taken:
            self._taken[at] = _rank(self.kernel_for(orders).inner, dims) <= \
                _rank(self.kernel, dims)
        return self._taken[at]

    def cache_info(self) -> list:
        return [b for k in self._kernels.values() for b in k.cache_info()]
