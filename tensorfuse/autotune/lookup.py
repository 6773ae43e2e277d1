"""What ``compile`` asks the tuning database: the best record for a kernel at given sizes.

Lookups read this device's default database (see :mod:`.database`) and never write it, so they
are safe while a job appends to it; a missing or empty database means template defaults, and is
noticed before anything is lowered (this runs once per new shape of every compiled kernel).
"""
from __future__ import annotations

import os

import numpy as np
import tvm

from ..dsl.program import Program
from ..targets import TargetSpec
from .database import RECORDS, default_database_dir, open_database
from .tasks import workload

_OPEN: dict = {}  # path -> (records file mtime, database)


def _database(path: str):
    records = os.path.join(path, RECORDS)
    if not os.path.exists(records) or os.path.getsize(records) == 0:
        return None
    stamp = os.path.getmtime(records)
    cached = _OPEN.get(path)
    if cached is None or cached[0] != stamp:
        cached = (stamp, open_database(path, read_only=True))
        _OPEN[path] = cached
    return cached[1]


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


def tuned(program: Program, template: str, fusion, target: TargetSpec,
          dims: dict) -> tuple[tvm.IRModule, str] | None:
    """``(scheduled workload, where from)`` of the best record for ``program`` at ``dims`` with
    ``template`` ("cpu", "attention", "row_reduction") in this device's database, or None. The
    CPU schedule is replayed on the function with its scalar parameters unbound."""
    path = default_database_dir(target)
    db = _database(path)
    if db is None:
        return None
    found = best_record(db, workload(program, template, fusion, dims))
    if found is None:
        return None
    record, secs = found
    base = workload(program, template, fusion, dims, bind_scalars=template != "cpu")
    return replay(record, base), f"{secs * 1e3:.4g} ms when tuned, from {path}"
