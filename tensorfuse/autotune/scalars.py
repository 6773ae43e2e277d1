"""Which scalar arguments a tuning record is keyed by, and which record a call with other values gets.

A scalar that reaches a condition (a mask: ``j > i - window``) or an index decides which blocks of
work exist — the block schedule, and so the best tile sizes — so records are kept per value of
those ("plan scalars"). A scalar used only in arithmetic on values (a softcap, a scale, ``eps``)
changes no plan: records do not split by it, and its value in a workload is the canonical default.
A call whose plan scalars have no record of their own gets the nearest record of the same kernel at
the same sizes, when every plan scalar is within :data:`NEAREST_RATIO` of it, else the template
defaults; ``schedule_origin`` says which.
"""
from __future__ import annotations

import json
import math

import tvm

from ..dsl import dtypes as dt
from ..dsl.expr import Compare, Load, Scalar, Unary, Where, walk
from ..dsl.program import Program
from ..errors import TuningError
from ..inputs import default_scalars

SCALARS_ATTR = "tensorfuse.scalars"   # the plan scalars' values, JSON, on a workload
NEAREST_RATIO = 2.0


def plan_scalars(program: Program) -> tuple[str, ...]:
    """Names of the scalar parameters that reach a condition or an index, in parameter order."""
    found: set[str] = set()

    def scalars_in(expr) -> None:
        walk(expr, lambda n: found.add(n.name) if isinstance(n, Scalar) else None)

    def visit(node) -> None:
        if isinstance(node, Where):
            scalars_in(node.cond)
        elif isinstance(node, Compare) or (isinstance(node, Unary) and node.op == "not"):
            scalars_in(node)
        elif isinstance(node, Load):
            for index in node.indices:
                scalars_in(index)

    for compute in program.computes:
        for body in compute.bodies:
            walk(body, visit)
    return tuple(p.name for p in program.scalar_params if p.name in found)


def check_scalars(program: Program, given: dict | None) -> dict:
    """``given`` checked against the kernel's scalar parameters (a clear error for a name it does
    not have or a value that is not a number), ints kept for integer parameters."""
    given = dict(given or {})
    params = {p.name: p for p in program.scalar_params}
    unknown = sorted(set(given) - set(params))
    if unknown:
        have = ", ".join(params) or "none"
        raise TuningError(f"{program.name} has no scalar parameter named {', '.join(unknown)} "
                          f"(its scalars: {have})")
    checked = {}
    for name, value in given.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value):
            raise TuningError(f"scalar {name}={value!r}: a finite number is needed")
        checked[name] = int(value) if dt.is_int(params[name].dtype) else float(value)
    return checked


def keyed_scalars(program: Program, dims: dict, given: dict | None) -> dict:
    """The values a workload binds: the plan scalars' as called (or their defaults), every other
    scalar at its canonical default, so that those never split records."""
    values = default_scalars(program, dims)
    chosen = {n: v for n, v in (given or {}).items() if n in plan_scalars(program)}
    return {**values, **chosen}


def plan_values(program: Program, template: str, dims: dict, scalars: dict | None) -> dict:
    """The plan scalars' values a workload is keyed by (none for the CPU template, which computes
    every element whatever the mask)."""
    if template == "cpu":
        return {}
    names = plan_scalars(program)
    return {n: v for n, v in keyed_scalars(program, dims, scalars).items() if n in names}


def scalars_label(values: dict) -> str:
    """``window=2048, prefix=16`` (what ``schedule_origin`` prints)."""
    return ", ".join(f"{n}={_number(v)}" for n, v in values.items())


def scalars_json(values: dict) -> str:
    return json.dumps({n: values[n] for n in sorted(values)})


def nearest(wanted: dict, recorded: list[dict]) -> dict | None:
    """The recorded plan-scalar values closest to ``wanted`` (log distance summed over scalars),
    among those with every scalar within :data:`NEAREST_RATIO` of the wanted value; None if none."""
    best, best_distance = None, math.inf
    for values in recorded:
        if set(values) != set(wanted):
            continue
        distance = 0.0
        for name, want in wanted.items():
            have = values[name]
            if want == have:
                continue
            if want <= 0 or have <= 0 or max(want / have, have / want) > NEAREST_RATIO:
                distance = math.inf
                break
            distance += abs(math.log(want / have))
        if distance < best_distance:
            best, best_distance = values, distance
    return best


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def bind_scalars_of(func, program: Program, dims: dict, scalars: dict | None):
    """``func`` with the program's scalar parameters bound as a workload binds them
    (:func:`workload`): to ``scalars``' values where given, else their defaults."""
    if not program.scalar_params:
        return func
    values = keyed_scalars(program, dims, scalars)
    by_name = {p.name: p for p in func.params}
    return func.specialize({by_name[name]: tvm.tirx.const(value, str(by_name[name].ty))
                            for name, value in values.items()})
