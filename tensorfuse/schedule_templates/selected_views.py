"""Tensors read at constant indices, as the tensors those indices select: attention over one packed
``qkv[B, S, 3, H, D]`` (``qkv[b, i, 0, h, d]`` the queries, ``qkv[b, j, 1, h, d]`` the keys,
``qkv[b, j, 2, h, d]`` the values — a fused projection's output as users keep it) is, as data,
attention over three ``[B, S, H, D]`` tensors. :func:`select_constant_indices` writes the program
that way; :class:`SelectedKernel` runs a kernel of it on the caller's tensor's slices
(``qkv.select(2, c)``: views, nothing copied — the Hopper attention reads such views through
tensor maps of their own strides). The templates that plan attention by roles refuse a constant
index on a tensor (it has no role); after the rewrite they plan it as any strided layout."""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra.exprs import nodes, rewrite_computes
from ..dsl import dtypes as dt
from ..dsl.expr import Const, Load
from ..dsl.program import Program, TensorParam
from ..errors import CallError
from .lifted_kernel import LiftedFastCall, LiftedKernel


@dataclass(frozen=True)
class Selection:
    """Tensor ``param`` read at the constants ``values`` on its axes ``axes`` (ascending): the
    selected program's parameter ``name``."""

    param: str
    axes: tuple[int, ...]
    values: tuple[int, ...]
    name: str
    rank: int   # the tensor's

    def describe(self) -> str:
        return f"{self.name} = {self.param}[{self.index_text()}]"

    def index_text(self) -> str:
        at = dict(zip(self.axes, self.values))
        return ", ".join(str(at[k]) if k in at else ":" for k in range(self.rank))

    def view(self, tensor):
        """The slice of the caller's ``tensor`` this parameter is (a view)."""
        for axis, value in sorted(zip(self.axes, self.values), reverse=True):
            tensor = tensor.select(axis, value)
        return tensor


@dataclass(frozen=True)
class SelectedViews:
    """``program`` with each tensor read only at constants on some axes replaced by one
    parameter per set of constants (``selections``); ``sizes``: the sizes only those axes had."""

    program: Program
    selections: tuple[Selection, ...]
    sizes: tuple[str, ...]

    def describe(self) -> str:
        return "constant indices as views: " + "; ".join(s.describe() for s in self.selections)


def select_constant_indices(program: Program) -> SelectedViews | None:
    """The program with every tensor that each load reads at non-negative integer constants on
    the same axes (and plain indices elsewhere) replaced by its slices, or None where no tensor
    is read so."""
    loads: dict[str, list[Load]] = {}
    for c in program.computes:
        for body in c.bodies:
            for n in nodes(body):
                if isinstance(n, Load):
                    loads.setdefault(n.param.name, []).append(n)
    taken = {p.name for p in program.params} | {c.name for c in program.computes}
    made: dict[tuple, Selection] = {}   # (param, constants) -> its selection
    for param in program.tensor_params:
        axes = {_constant_axes(load) for load in loads.get(param.name, [])}
        if len(axes) != 1 or not next(iter(axes)):
            continue
        (at,) = axes
        for load in loads[param.name]:
            values = tuple(load.indices[k].value for k in at)
            if (param.name, values) not in made:
                name = "_".join([param.name, *map(str, values)])
                while name in taken:
                    name += "_"
                taken.add(name)
                made[param.name, values] = Selection(param.name, at, values, name, param.rank)
    if not made:
        return None
    by_param = {p.name: p for p in program.tensor_params}
    new_params = {s.name: TensorParam(s.name, tuple(d for k, d in enumerate(
        by_param[s.param].dims) if k not in s.axes), by_param[s.param].dtype,
        by_param[s.param].loc) for s in made.values()}

    def rewrite(node):
        if isinstance(node, Load) and node.param.name in {s.param for s in made.values()}:
            s = made[node.param.name, tuple(node.indices[k].value for k in _constant_axes(node))]
            return Load(new_params[s.name], tuple(x for k, x in enumerate(node.indices)
                                                   if k not in s.axes), node.loc)
        return None

    params = []
    for p in program.params:
        mine = sorted((s for s in made.values() if s.param == p.name), key=lambda s: s.values)
        params += [new_params[s.name] for s in mine] if mine else [p]
    computes = rewrite_computes(program, rewrite)
    selected = Program(program.name, params, list(computes.values()),
                       [computes[c.name] for c in program.outputs], list(program.axes),
                       list(program.size_constraints), program.loc)
    kept = set(selected.dim_names())
    bound = {d for p in selected.tensor_params for d in p.dims}
    if any(isinstance(d, str) and d in kept and d not in bound
           for s in made.values() for k, d in enumerate(by_param[s.param].dims) if k in s.axes):
        return None   # a size only the selected axes bound is still read (T.size of it)
    gone = tuple(n for n in program.dim_names() if n not in kept)
    order = {p.name: k for k, p in enumerate(program.params)}
    return SelectedViews(selected, tuple(sorted(made.values(), key=lambda s: (
        order[s.param], s.values))), gone)


def _constant_axes(load: Load) -> tuple[int, ...]:
    """The axes ``load`` reads at a non-negative integer constant."""
    return tuple(k for k, x in enumerate(load.indices) if isinstance(x, Const)
                 and dt.is_int(x.dtype) and x.value >= 0)


class SelectedKernel(LiftedKernel):
    """``inner``, a kernel of ``selected.program``, as a kernel of the program as written: each
    tensor read at constants is passed as its slices (views; an index past the tensor's axis is
    a :class:`CallError`)."""

    who = "constant indices as views"

    def __init__(self, program, selected: SelectedViews, inner, target):
        super().__init__(program, {}, inner, target, ())
        self.selected = selected
        self.lift = selected.describe()
        self.description = f"{self.lift}; {inner.description}"

    def inner_sizes(self, sizes: dict) -> dict:
        return {n: v for n, v in sizes.items() if n not in self.selected.sizes}

    def _views(self, values: dict, outs: list, dims: dict) -> list:
        for s in self.selected.selections:
            tensor = values[s.param]
            for axis, value in zip(s.axes, s.values):
                if value >= tensor.shape[axis]:
                    raise CallError(f"{s.param} is read at {value} on its axis {axis}, which "
                                    f"has {tensor.shape[axis]} elements ({s.describe()})")
            values[s.name] = s.view(tensor)
        for name in {s.param for s in self.selected.selections}:
            del values[name]
        return outs

    def _fast_call(self, params, outputs, likes, guards, bound, inner_kwargs: dict, inner_fast):
        return SelectedFastCall(params, outputs, bound.torch_device, likes, guards,
                                self.selected.selections, inner_fast)


class SelectedFastCall(LiftedFastCall):
    """A repeated call of a :class:`SelectedKernel` with one signature: the caller's tensors'
    slices (the signature fixed their shapes, so the constants are in range) straight to the
    inner kernel's fast call."""

    def __init__(self, params: list, outputs: list, device, likes: list, guards: list,
                 selections: tuple[Selection, ...], inner_fast):
        super().__init__(params, outputs, device, likes, guards, {}, [], inner_fast)
        self.selections = selections
        self.selected = {s.param for s in selections}

    def __call__(self, args: tuple, kwargs: dict):
        made = self.values_and_outputs(args, kwargs)
        if made is None:
            return None
        values, outs = made
        named = dict(zip(self.names, values))
        inner = {n: v for n, v in named.items() if n not in self.selected}
        for s in self.selections:
            inner[s.name] = s.view(named[s.param])
        inner["out"] = outs[0] if self.single else tuple(outs)
        if self.inner_fast((), inner) is None:
            self.stale = self.stale or getattr(self.inner_fast, "stale", False)
            return None
        return outs[0] if self.single else tuple(outs)
