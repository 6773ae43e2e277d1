"""What ``compile`` asks the tuning database: the best record for a kernel at given sizes.

Lookups read this device's default database (see :mod:`.database`) and never write it, so they
are safe while a job appends to it; a missing or empty database means template defaults, and is
noticed before anything is lowered (this runs once per new shape of every compiled kernel).
"""
from __future__ import annotations

import itertools
import json
import math
import os

import numpy as np
import tvm

from ..dsl.program import Program
from ..errors import TuningError
from ..targets import TargetSpec
from ..schedule_templates.annotations import TEMPLATE_ATTR
from .database import RECORDS, default_database_dir, open_database
from .scalars import SCALARS_ATTR, nearest, scalars_label
from .scalars import plan_values
from .tasks import TASK_ATTR, task_name, workload

_OPEN: dict = {}  # path -> (records file mtime, database, its index: _recorded)


def _database(path: str):
    """``(database, index)`` of the records at ``path`` (reopened when the records file
    changes), or None where there are none."""
    records = os.path.join(path, RECORDS)
    if not os.path.exists(records) or os.path.getsize(records) == 0:
        return None
    stamp = os.path.getmtime(records)
    cached = _OPEN.get(path)
    if cached is None or cached[0] != stamp:
        db = open_database(path, read_only=True)
        cached = (stamp, db, _recorded(db))
        _OPEN[path] = cached
    return cached[1:]


def _recorded(db) -> dict[tuple[str, str], list[dict]]:
    """The plan-scalar values the database holds records for, per (task — a kernel at sizes —,
    template), read once per opening: a lookup at sizes with no record then returns before the
    workload is lowered (every new shape of a compiled kernel asks: a decode cache that grows by
    a key a step asks at every step, 18 ms a step where lowering, 0.4 ms without)."""
    found: dict = {}
    for record in db.get_all_tuning_records():
        attrs = record.workload.mod["main"].attrs   # every workload carries them (tasks.workload)
        if attrs is None or TASK_ATTR not in attrs:
            continue
        values = found.setdefault((str(attrs[TASK_ATTR]), str(attrs[TEMPLATE_ATTR])), [])
        scalars = json.loads(str(attrs[SCALARS_ATTR]))
        if scalars not in values:
            values.append(scalars)
    return found


def best_record(db, mod: tvm.IRModule):
    """``(best tuning record, its mean seconds)`` for the workload ``mod``, or None."""
    if not db.has_workload(mod):
        return None
    records = db.get_top_k(db.commit_workload(mod), 1)
    if not records:
        return None
    return records[0], float(np.mean([float(s) for s in records[0].run_secs]))


def replay(record, mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` scheduled by a record's trace (``mod`` may differ from the record's workload in
    bound scalars only: the loops and blocks are the same)."""
    sch = tvm.s_tir.Schedule(mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def size_bucket(dims: dict) -> tuple:
    """The power-of-two bucket of each size, by the nearest power of two (a kernel tuned at 4096
    is in the bucket of 3000 and of 5000, not of 2048 or 6000)."""
    return tuple(sorted((n, round(math.log2(v)) if v > 0 else -1) for n, v in dims.items()))


def records_stamp(target: TargetSpec) -> float | None:
    """When this device's records file last changed (None: no records), for caches of what
    lookups found: a job that adds records changes it."""
    records = os.path.join(default_database_dir(target), RECORDS)
    return os.path.getmtime(records) if os.path.exists(records) else None


def bucket_sizes(sizes: dict) -> list[dict]:
    """The sizes to tune at so that every bucket (:func:`size_bucket`) that ``sizes`` span has a
    record: a size given as ``(low, high)`` at each power of two whose bucket meets the range
    (the range's end where the power lies outside it: still in that bucket), a size given as
    another size's name at that size's value, an integer as it is. One dict per combination."""
    ranges, fixed, tied = {}, {}, {}
    for name, value in sizes.items():
        if isinstance(value, str):
            tied[name] = value
        elif isinstance(value, tuple):
            low, high = value
            if not (isinstance(low, int) and isinstance(high, int)) or not 1 <= low <= high:
                raise TuningError(f"size {name}: a range is LOW..HIGH with 1 <= LOW <= HIGH, got "
                                  f"{low}..{high}")
            ranges[name] = sorted({min(max(2 ** k, low), high) for k in
                                   range(round(math.log2(low)), round(math.log2(high)) + 1)})
        else:
            fixed[name] = value
    for name, other in tied.items():
        if other not in fixed and other not in ranges:
            raise TuningError(f"size {name}={other}: {other} is not given a number or a range "
                              f"(sizes given: {', '.join(sorted(set(fixed) | set(ranges)))})")
    made = []
    for values in itertools.product(*ranges.values()):
        chosen = {**fixed, **dict(zip(ranges, values))}
        made.append({**chosen, **{name: chosen[other] for name, other in tied.items()}})
    return made


def nearest_in_bucket(program: Program, template: str, target: TargetSpec,
                      dims: dict) -> dict | None:
    """The sizes of the record of ``program`` under ``template`` on this device nearest to
    ``dims`` among those in their bucket (:func:`size_bucket`), or None."""
    opened = _database(default_database_dir(target))
    if opened is None:
        return None
    prefix, bucket, best = f"{program.name}[", size_bucket(dims), None
    for task, recorded_template in opened[1]:
        if recorded_template != template or not task.startswith(prefix) or \
                not task.endswith("]"):
            continue
        try:
            sizes = {n: int(v) for n, v in (item.split("=") for item in
                                            task[len(prefix):-1].split(",") if item)}
        except ValueError:
            continue
        if set(sizes) != set(dims) or size_bucket(sizes) != bucket:
            continue
        distance = sum(abs(math.log2(sizes[n] / dims[n])) for n in dims if dims[n] > 0)
        if best is None or distance < best[0]:
            best = (distance, sizes)
    return None if best is None else best[1]


def tuned(program: Program, template: str, fusion, target: TargetSpec, dims: dict,
          scalars: dict | None = None) -> tuple[tvm.IRModule, str] | None:
    """``(scheduled workload, where from)`` of the best record for ``program`` at ``dims`` with
    ``template`` ("cpu", "attention", ...) in this device's database, or None. ``scalars``: the
    call's scalar values; a call whose plan scalars (masks, indices) have no record of their own
    gets the nearest recorded values' (:func:`.scalars.nearest`), and the origin says so. The
    schedule is replayed on the function with its scalar parameters unbound for the CPU."""
    path = default_database_dir(target)
    opened = _database(path)
    recorded = opened[1].get((task_name(program.name, dims), template)) if opened else None
    if not recorded:   # no record of this kernel at these sizes with this template
        return None
    db = opened[0]
    wanted = plan_values(program, template, dims, scalars)
    found = best_record(db, workload(program, template, fusion, dims, scalars))
    at = ""
    if found is None and wanted:
        values = nearest(wanted, recorded)
        if values is not None:
            found = best_record(db, workload(program, template, fusion, dims, values))
            at = (f" at {scalars_label(values)}, the nearest tuned values to "
                  f"{scalars_label(wanted)}")
    if found is None:
        return None
    record, secs = found
    base = workload(program, template, fusion, dims, scalars, bind_scalars=template != "cpu")
    return replay(record, base), f"{secs * 1e3:.4g} ms when tuned{at}, from {path}"
