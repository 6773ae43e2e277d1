"""What ``compile`` asks the tuning database: the best record for a kernel at given sizes.

Lookups read this device's default database (see :mod:`.database`) and never write it; a
missing or empty database means template defaults.
"""
from __future__ import annotations

import os

import tvm

from ..dsl.program import Program
from ..targets import TargetSpec
from .database import RECORDS, default_database_dir, open_database
from .tasks import knobs_of, tuning_target, workload

_OPEN: dict = {}  # path -> (records file mtime, database)


def _database(path: str):
    records = os.path.join(path, RECORDS)
    if not os.path.exists(records) or os.path.getsize(records) == 0:
        return None
    stamp = os.path.getmtime(records)
    cached = _OPEN.get(path)
    if cached is None or cached[0] != stamp:
        cached = (stamp, open_database(path))
        _OPEN[path] = cached
    return cached[1]


def best_record(mod: tvm.IRModule, target: TargetSpec, path: str | None = None,
                apply_to: tvm.IRModule | None = None):
    """``(scheduled module, best latency in seconds)`` for ``mod`` from the database, or None;
    the record's trace is replayed on ``apply_to`` (same loops and blocks) when given."""
    path = path or default_database_dir(target)
    db = _database(path)
    if db is None or not db.has_workload(mod):
        return None
    records = db.get_top_k(db.commit_workload(mod), 1)
    if not records:
        return None
    sch = tvm.s_tir.Schedule(apply_to if apply_to is not None else mod)
    records[0].trace.apply_to_schedule(sch, remove_postproc=False)
    secs = [float(s) for s in records[0].run_secs]
    return sch.mod, sum(secs) / len(secs)


def tuned_knobs(program: Program, fusion, template: str, target: TargetSpec,
                dims: dict) -> tuple[dict, str] | None:
    """``(knobs, where from)`` of the best record for a GPU template at ``dims``, or None."""
    found = best_record(workload(program, template, fusion, dims), target)
    if found is None:
        return None
    mod, secs = found
    return knobs_of(mod), f"{secs * 1e3:.4g} ms when tuned, from {default_database_dir(target)}"


def tuned_cpu_schedule(program: Program, target: TargetSpec, dims: dict):
    """``(scheduled module, where from)`` of the best CPU record at ``dims``, or None."""
    found = best_record(workload(program, "cpu", None, dims), target,
                        apply_to=workload(program, "cpu", None, dims, bind_scalars=False))
    if found is None:
        return None
    mod, secs = found
    return mod, f"{secs * 1e3:.4g} ms when tuned, from {default_database_dir(target)}"


__all__ = ["best_record", "tuned_knobs", "tuned_cpu_schedule", "tuning_target"]
