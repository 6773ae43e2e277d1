"""What a compile entry point reads from the tuning database, handed down to the templates.

``tensorfuse.compile`` and ``Schedule.compile`` are the only places that read tuning records
(DESIGN §2): they give a template a lookup made here, and the template's kernel asks it once per
shape for the knobs of the best record at those sizes. Nothing below the entry points imports
:mod:`tensorfuse.autotune`.
"""
from __future__ import annotations

from typing import Callable

import tvm

from .autotune.lookup import nearest_in_bucket, records_stamp, tuned
from .autotune.scalars import plan_scalars
from .autotune.tasks import knobs_of
from .dsl.program import Program
from .targets import TargetSpec


def template_records(program: Program, template: str, fusion, target: TargetSpec,
                     nearest: bool = False
                     ) -> Callable[[dict], "tuple[dict, str, dict | None] | None"]:
    """``lookup(dims, scalars) -> (knob values, where from, tuned at)`` of the best record for
    ``program`` fused by ``fusion`` under ``template`` at ``dims`` (and the call's values of the
    scalars named by ``lookup.scalar_names``, which records are kept per) on this device, or None
    (template defaults); ``tuned at`` is None for a record of ``dims`` themselves. ``nearest``:
    where ``dims`` have no record, the record at the nearest sizes in their power-of-two bucket
    (:func:`~tensorfuse.autotune.lookup.nearest_in_bucket`), ``tuned at`` those sizes (the
    template falls back to its defaults where those knobs do not run at ``dims``)."""
    neighbours: dict = {}   # (records' stamp, sizes, scalars) -> a neighbour's record's knobs

    def lookup(dims: dict, scalars: dict | None = None):
        found = tuned(program, template, fusion, target, dims, scalars)
        if found is not None:
            return knobs_of(found[0]), found[1], None
        sizes = nearest_in_bucket(program, template, target, dims) if nearest else None
        if not sizes:
            return None
        # a neighbour's record is replayed on its own workload once (lowering it costs 100+
        # ms), not at every new size of the bucket that takes it
        key = (records_stamp(target), tuple(sorted(sizes.items())),
               tuple(sorted((scalars or {}).items())))
        if key not in neighbours:
            found = tuned(program, template, fusion, target, sizes, scalars)
            neighbours[key] = None if found is None else (knobs_of(found[0]), found[1])
        if neighbours[key] is None:
            return None
        knobs, origin = neighbours[key]
        at = ", ".join(f"{n}={v}" for n, v in sorted(sizes.items()))
        return (dict(knobs),
                f"{origin}; tuned at {at}, the nearest sizes in this one's power-of-two bucket",
                sizes)

    lookup.scalar_names = plan_scalars(program)  # records are kept per value of these
    return lookup


def cpu_record(program: Program, target: TargetSpec,
               dims: dict) -> "tuple[tvm.IRModule, str] | None":
    """The CPU schedule of the best record for ``program`` at ``dims`` and where it is from."""
    return tuned(program, "cpu", None, target, dims)
