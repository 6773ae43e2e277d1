"""Reductions over every axis (a loss's mean over the batch, the largest magnitude of a tensor
for an fp8 scale, a norm) as one row: the templates plan rows, and a value over no axis has none.

:func:`with_unit_row` gives each such value an axis of one element, read by nothing, so that the
row template sweeps what it reduces as one row — split over many programs where it is long (the
split update: parts in parallel, the last one merges them) — and a value over some axes that it
reads (a per-row logsumexp summed over the rows) keeps its own plan, one stage before it. The
kernel of the rewritten program writes such an output with shape ``[1]``;
:class:`tensorfuse.widened_kernel.RewrittenKernel` gives the user's shape ``[]`` back. The CPU's
TVM lowering takes values over no axis as they are.
"""
from __future__ import annotations

from ..algebra.exprs import rewrite_computes
from ..dsl.expr import Axis
from ..dsl.program import Program

UNIT = "one"   # the added axis's name (a suffix where the program has an axis of that name)


def over_nothing(program: Program) -> set[str]:
    """The names of ``program``'s values over no axis."""
    return {c.name for c in program.computes if not c.axes}


def with_unit_row(program: Program) -> tuple[Program, str] | None:
    """``program`` with an axis of one element on each value over no axis, and a note saying
    so; ``None`` where it has none, or where a value over axes reads one (``x / Σ x``: it would
    read it along axes the unit axis is not one of — the floor's stages take that program, the
    value over no axis a stage of its own, rewritten here)."""
    empty = over_nothing(program)
    if not empty:
        return None
    for c in program.computes:
        if c.axes and {d.name for d in c.inputs()} & empty:
            return None
    taken = {a.name for a in program.axes}
    name = UNIT
    while name in taken:
        name += "_"
    one = Axis(name, 1, program.loc)
    rebuilt = rewrite_computes(program, lambda n: None,
                               axes=lambda c: (one,) if c.name in empty else c.axes)
    note = (f"{', '.join(sorted(empty))} (over every axis) as one row of an axis of one element, "
            f"{name}")
    return Program(program.name, list(program.params), list(rebuilt.values()),
                   [rebuilt[c.name] for c in program.outputs], [*program.axes, one],
                   list(program.size_constraints), program.loc), note
