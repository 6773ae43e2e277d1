"""``T.logsumexp`` as the GPU templates take it: its maximum, then ``log Σ exp(· − max) + max``.

The DSL's ``logsumexp`` is one monoid (``log(eᵃ + eᵇ)`` folded element by element), which the CPU
lowering computes as written but the row-tile template does not keep as a running state: a
program reducing with it ran on TVM's default GPU schedule, untiled. Written as its maximum and
a sum of exponentials relative to it — what softmax, cross-entropy and the attention kernels
write themselves — it is a chain the templates fuse into one pass (the maximum's corrections
derived as for those), at the same value: ``log Σ exp(xᵢ) = m + log Σ exp(xᵢ − m)`` for any
finite ``m``, and the template's references keep a row of −∞ at −∞ (an empty sum's log).
"""
from __future__ import annotations

import math

from ..algebra.exprs import substitute
from ..dsl import dtypes as dt
from ..dsl.expr import Const, Ref, binary, compare, unary, where
from ..dsl.monoid import MAX, SUM
from ..dsl.program import Compute, Program


def written_stably(program: Program) -> tuple[Program, str] | None:
    """``program`` with each logsumexp reduction written as a maximum, a sum of exponentials
    and ``log(sum) + max`` (under the reduction's own name), and a note naming them; ``None``
    where it has none."""
    rewritten = [c.name for c in program.computes
                 if c.is_reduction and c.monoid.name == "logsumexp" and c.arity == 1]
    if not rewritten:
        return None
    taken = {c.name for c in program.computes} | {p.name for p in program.params}
    made: dict[str, Compute] = {}
    computes: list[Compute] = []

    def fresh(name: str) -> str:
        k, found = 0, name
        while found in taken:
            k += 1
            found = f"{name}_{k}"
        taken.add(found)
        return found

    def rebuilt(e):
        return substitute(e, lambda n: Ref(made[n.compute.name], n.component, n.loc)
                          if isinstance(n, Ref) else None)

    for c in program.computes:
        bodies = tuple(rebuilt(b) for b in c.bodies)
        if c.name not in rewritten:
            made[c.name] = Compute(c.name, c.axes, bodies, c.dtypes, c.monoid, c.over, c.loc,
                                   c.is_output)
            computes.append(made[c.name])
            continue
        body = bodies[0]
        acc = "f64" if "f64" in (dt.resolve(body.dtype), c.dtypes[0]) else "f32"
        top = Compute(fresh(f"{c.name}_max"), c.axes, (body,), (acc,), MAX, c.over, c.loc)
        # relative to 0 where the maximum is ±∞ (nothing but −∞, or an overflow): the empty sum's
        # log is −∞, an infinite term's +∞, as logsumexp gives them (x − m would be NaN there)
        shift = where(compare("lt", unary("abs", Ref(top, 0, c.loc)), Const(math.inf, acc)),
                      Ref(top, 0, c.loc), Const(0.0, acc))
        sum_exp = Compute(fresh(f"{c.name}_sum_exp"), c.axes,
                          (unary("exp", binary("sub", body, shift)),), (acc,), SUM, c.over,
                          c.loc)
        value = binary("add", unary("log", Ref(sum_exp, 0, c.loc)), shift)
        made[c.name] = Compute(c.name, c.axes, (value,), c.dtypes, None, (), c.loc, c.is_output)
        computes += [top, sum_exp, made[c.name]]
    note = (f"{', '.join(rewritten)} written as max + log Σ exp(· − max) (the logsumexp monoid "
            "is no running state of the GPU templates)")
    return Program(program.name, list(program.params), computes,
                   [made[c.name] for c in program.outputs], list(program.axes),
                   list(program.size_constraints), program.loc), note
