"""Programs without reductions — activations, broadcasts, and the gradients of means and sums
(``d_x[b, s, d] = d_out[b, d] / S``) — as one flat pass over their outputs' elements.

No reduction chain means no row-tile template; such a program ran on TVM's default GPU schedule.
The emitter (:mod:`tensorfuse.targets.triton.elementwise`) walks a flat index over the outputs'
axes, the innermost innermost (contiguous stores, and contiguous loads of tensors laid out like
the output), and writes every output at each element. :func:`plan_elementwise` takes a program
whose computes are all elementwise and whose outputs share one list of axes; the elementwise
computes that are not outputs are inlined into the outputs' expressions.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra import inline_elementwise
from ..dsl.expr import Axis, Expr
from ..dsl.printer import to_text
from ..dsl.program import Compute, Program
from ..errors import TargetError


@dataclass(frozen=True)
class ElementwisePlan:
    """Each output (a compute and its expression, intermediates inlined) at every element of
    ``axes``, which all outputs share (outermost first)."""

    program: Program
    axes: tuple[Axis, ...]
    outputs: tuple[tuple[Compute, Expr], ...]

    def describe(self) -> str:
        return (f"elementwise plan of {self.program.name}: over "
                f"{', '.join(a.name for a in self.axes) or 'one element'}, "
                + "; ".join(f"{c.name} = {to_text(e)}" for c, e in self.outputs))


def plan_elementwise(program: Program) -> ElementwisePlan:
    """The elementwise plan of ``program``, or a :class:`TargetError` that says why it has none."""
    reductions = [c.name for c in program.computes if c.is_reduction]
    if reductions:
        raise TargetError(f"{', '.join(reductions)} reduce: not an elementwise program")
    if any(c.arity != 1 for c in program.outputs):
        raise TargetError("the elementwise template writes outputs of one component")
    axes = tuple(program.outputs[0].axes)
    if not axes:
        raise TargetError("the outputs are single values (no axes to run over)")
    for c in program.outputs[1:]:
        if [a.uid for a in c.axes] != [a.uid for a in axes]:
            raise TargetError(f"the outputs run over different axes ({c.name}: "
                              f"{', '.join(a.name for a in c.axes)}; {program.outputs[0].name}: "
                              f"{', '.join(a.name for a in axes)})")
    return ElementwisePlan(program, axes,
                           tuple((c, inline_elementwise(c.bodies[0])) for c in program.outputs))
