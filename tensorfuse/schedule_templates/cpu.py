"""The CPU template: any lowered program (plain or fused) on the ``llvm`` target.

Every top-level loop nest runs its outermost loop on all cores; that is the default schedule.
Tuning adds two knobs, declared here as MetaSchedule decisions so the search and the XGBoost
cost model see them: the vector width of each block's innermost loop when that loop is
data-parallel (``sample_perfect_tile``: the loop is split and its inner part vectorised), and an
unroll depth for the whole function (``sample_categorical``).
"""
from __future__ import annotations

import tvm

UNROLL_DEPTHS = (0, 16, 64, 512)
MAX_VECTOR = 16  # fp32 lanes of two AVX-512 registers: wider gains nothing on current CPUs
_DATA_PARALLEL = 0  # IterVar.DataPar
UNROLL_KEY = "meta_schedule.unroll_explicit"  # read by MetaSchedule's unroll mutator and postproc


def parallelize_outer_loops(sch: tvm.s_tir.Schedule) -> None:
    """Mark the outermost loop of each top-level nest parallel where TVM agrees it is safe."""
    seen: list = []
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(block)
        if not loops:
            continue
        outer = sch.get(loops[0])
        if any(outer.same_as(s) for s in seen):
            continue
        seen.append(outer)
        try:
            sch.parallel(loops[0])
        except tvm.s_tir.ScheduleError:
            continue  # a reduction or a loop-carried dependence: leave it serial


def cpu_search_space(sch: tvm.s_tir.Schedule, defaults: bool = False) -> None:
    """The tunable CPU schedule: the default (outer loops parallel) plus sampled vector widths and
    unroll depth. Used as a MetaSchedule ``ScheduleFn``; ``defaults=True`` takes the decisions
    that leave the default schedule (no vectorising split, no unrolling)."""
    parallelize_outer_loops(sch)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if not _is_data_parallel(sch, block):
            continue
        loops = sch.get_loops(block)
        if len(loops) < 2:
            continue  # the only loop is the parallel one
        extent = sch.get(loops[-1]).extent
        if not isinstance(extent, tvm.tirx.IntImm) or extent.value < 4:
            continue
        outer_inner = sch.sample_perfect_tile(loops[-1], n=2, max_innermost_factor=MAX_VECTOR,
                                              decision=[extent.value, 1] if defaults else None)
        _, inner = sch.split(loops[-1], factors=outer_inner)
        try:
            sch.vectorize(inner)
        except tvm.s_tir.ScheduleError:
            continue
    depth = sch.sample_categorical(list(UNROLL_DEPTHS), [1.0 / len(UNROLL_DEPTHS)] * len(UNROLL_DEPTHS),
                                   decision=0 if defaults else None)
    sch.annotate(sch.get_sblock("root"), UNROLL_KEY, depth)


def _is_data_parallel(sch: tvm.s_tir.Schedule, block) -> bool:
    return all(int(iv.iter_type) == _DATA_PARALLEL for iv in sch.get(block).iter_vars)
