"""Programs without reductions — activations, broadcasts, and the gradients of means and sums
(``d_x[b, s, d] = d_out[b, d] / S``) — as one flat pass over their outputs' elements.

No reduction chain means no row-tile template; such a program ran on TVM's default GPU schedule.
The emitter (:mod:`tensorfuse.targets.triton.elementwise`) walks a flat index over the outputs'
axes, the innermost innermost (contiguous stores, and contiguous loads of tensors laid out like
the output), and writes every output at each element. :func:`plan_elementwise` takes a program
whose computes are all elementwise and whose outputs share one list of axes; the elementwise
computes that are not outputs are inlined into the outputs' expressions.

A reduction over a few elements — a 2×2 pooling window, a sum of 3 — is not a sweep: the row
template's tile of rows × a swept block of 16 would be mostly padding, and its rows only the
innermost kept axis (a 2×2 max pool of [32, 128, 112, 112] made 917504 programs of 64 rows and
ran at 5 % of the copy bandwidth on the H200, ``benchmarks.unlisted_kernels``). :func:`unrolled`
writes such reductions out as the fold of their terms (``max(max(x₀₀, x₀₁), max(x₁₀, x₁₁))``),
which leaves an elementwise program for this template.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

from ..algebra import inline_elementwise
from ..algebra.exprs import nodes, substitute
from ..dsl.expr import Axis, Const, Expr, Ref, binary
from ..dsl.printer import to_text
from ..dsl.program import Compute, Program
from ..errors import ScheduleError, TargetError


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


def _pairwise(program: Program) -> bool:
    """Whether the contraction template plans ``program`` as pairwise reductions."""
    from .contraction_plan import plan_contraction

    try:
        return bool(plan_contraction(program).pairwise)
    except ScheduleError:
        return False


# The most terms a reduction is written out into (the product of its reduced axes' extents):
# pooling windows (2×2, 3×3) and short sums; a longer reduction is a sweep for the row template
UNROLL_TERMS = 16
_FOLDS = {"sum": "add", "max": "max", "min": "min", "prod": "mul"}


def unrolled(program: Program, sizes: dict | None = None) -> tuple[Program, str] | None:
    """``program`` with every reduction written out as the fold of its terms, and a note saying
    so, where each is a sum, product, maximum or minimum of one value over axes of at most
    :data:`UNROLL_TERMS` elements in all (their extents literals or in ``sizes``) whose terms
    read no other reduction; else ``None`` — and for pairwise reductions, which the contraction
    template tiles however few their terms (written out, each output element reads its two
    operands' rows again: squared distances of 16384² pairs over 16 dimensions took 3.09 ms so,
    0.55 ms tiled, ``python -m benchmarks.contraction --pairs``)."""
    if not foldable(program):
        return None
    sizes = sizes or {}
    reductions = [c for c in program.computes if c.is_reduction]
    spans = [[a.extent if isinstance(a.extent, int) else sizes.get(a.extent) for a in c.over]
             for c in reductions]
    if any(any(not isinstance(e, int) for e in extents) or math.prod(extents) > UNROLL_TERMS
           for extents in spans) or _pairwise(program):   # planned last: only where it decides
        return None
    folds: dict[str, Expr] = {}
    notes = []
    for c, extents in zip(reductions, spans):
        body = inline_elementwise(c.bodies[0])
        terms = []
        for values in itertools.product(*(range(e) for e in extents)):
            at = {a.uid: Const(v, "i32", c.loc) for a, v in zip(c.over, values)}
            terms.append(substitute(body, lambda n, at=at: at.get(n.uid)
                                    if isinstance(n, Axis) else None))
        op = _FOLDS[c.monoid.name]
        folds[c.name] = functools.reduce(lambda x, y: binary(op, x, y, c.loc), terms)
        notes.append(f"{c.name} over {', '.join(a.name for a in c.over)} written out "
                     f"({len(terms)} terms)")

    def fold(n: Expr):
        return folds[n.compute.name] if isinstance(n, Ref) and n.compute.is_reduction else None

    outputs = [Compute(c.name, c.axes, (folds[c.name] if c.is_reduction else
                                        substitute(inline_elementwise(c.bodies[0]), fold),),
                       c.dtypes, None, (), c.loc, True) for c in program.outputs]
    reduced = {a.uid for c in reductions for a in c.over}
    return Program(program.name, list(program.params), outputs, outputs,
                   [a for a in program.axes if a.uid not in reduced],
                   list(program.size_constraints), program.loc), "; ".join(notes)


def _foldable(c: Compute) -> bool:
    """Whether reduction ``c`` can be written out as a fold of its terms (at small extents): a
    sum, product, maximum or minimum of one value whose terms read no other reduction."""
    return c.arity == 1 and c.monoid.name in _FOLDS and \
        not any(isinstance(n, Ref) for n in nodes(inline_elementwise(c.bodies[0])))


def foldable(program: Program) -> bool:
    """Whether :func:`unrolled` may write ``program``'s reductions out (at sizes where they are
    few elements): it has some, and each is foldable."""
    reductions = [c for c in program.computes if c.is_reduction]
    return bool(reductions) and all(_foldable(c) for c in reductions)


def elementwise_form(program: Program, sizes: dict | None = None) -> \
        tuple[ElementwisePlan, str] | None:
    """The elementwise plan ``tf.compile`` runs ``program`` by, and a note of the reductions
    written out for it (empty where it has none; :func:`unrolled`, with ``sizes`` for extents
    that are not literals); ``None`` where it has no such plan."""
    written = unrolled(program, sizes) if any(c.is_reduction for c in program.computes) \
        else (program, "")
    if written is None:
        return None
    try:
        return plan_elementwise(written[0]), written[1]
    except TargetError:
        return None
