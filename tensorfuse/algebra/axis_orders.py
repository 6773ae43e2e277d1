"""A program's tensors declared, and its outputs laid out, in another order of their axes."""
from __future__ import annotations

from .exprs import rewrite_computes
from ..dsl.expr import Load
from ..dsl.program import Program, TensorParam


def with_axis_orders(program: Program, orders: dict, outputs: dict | None = None) -> Program:
    """``program`` with each tensor parameter named in ``orders`` (name → the order of its
    axes: the parameter is declared as ``x.permute(order)`` of the one written) declared in that
    order and every read of it indexed alike, and each output named in ``outputs`` (name →
    order) laid out in that order: the same values, computed from and into tensors laid out
    another way — as the caller's lie in memory (:mod:`tensorfuse.memory_order`), or as a
    template's copies need them (:mod:`tensorfuse.schedule_templates.reordered_operands`)."""
    outputs = outputs or {}
    params = [TensorParam(p.name, tuple(p.dims[k] for k in orders[p.name]), p.dtype, p.loc)
              if isinstance(p, TensorParam) and p.name in orders else p for p in program.params]
    by_name = {p.name: p for p in params}

    def rewrite(node):
        if isinstance(node, Load) and node.param.name in orders:
            order = orders[node.param.name]
            return Load(by_name[node.param.name], tuple(node.indices[k] for k in order),
                        node.loc)
        return None

    def axes(c):
        order = outputs.get(c.name) if c.is_output else None
        return c.axes if order is None else tuple(c.axes[k] for k in order)

    computes = rewrite_computes(program, rewrite, axes=axes)
    return Program(program.name, params, list(computes.values()),
                   [computes[c.name] for c in program.outputs], list(program.axes),
                   list(program.size_constraints), program.loc)
