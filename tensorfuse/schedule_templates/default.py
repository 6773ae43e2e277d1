"""The schedule a kernel gets when no template is chosen.

GPU targets use TVM's dlight rules (matmul, GEMV, reductions, and a fallback that binds every block
to threads), so any program runs on a GPU. The CPU target gets the CPU template's defaults (row
programs one vectorised row per core at a time, others the outermost data-parallel loop of each
loop nest on all cores: ``cpu.py``).
"""
from __future__ import annotations

import tvm
from tvm.s_tir import dlight as dl

from ..targets import TargetSpec


def apply_default_schedule(mod: tvm.IRModule, target: TargetSpec) -> tvm.IRModule:
    """``mod`` scheduled for ``target`` unless a template already scheduled it."""
    func = next(iter(mod.functions.values()))
    attrs = func.attrs if func.attrs is not None else {}
    if attrs.get("tirx.is_scheduled", False):
        return mod
    if target.is_gpu:
        with target.tvm_target:
            try:
                return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                               dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)
            except Exception:  # noqa: BLE001 - a dlight rule that matched but cannot apply
                return dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)
    return cpu_defaults(mod)


def cpu_defaults(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the CPU template's defaults (:func:`.cpu.cpu_default`)."""
    from . import tvm_schedule
    from .cpu import cpu_default

    sch = tvm_schedule(mod)
    cpu_default(sch)
    return sch.mod


def cpu_fused(program, fusions: tuple, dims: dict, index_dtype: str,
              target: TargetSpec) -> tvm.IRModule:
    """``program`` with its rolling or split updates ``fusions`` lowered for the CPU (rows on
    every core, :mod:`.fusion_cpu`'s chunk layout) and the CPU template's schedule of them
    (:func:`.cpu.rolled_schedule`), each ``exp``'s argument bound once
    (:func:`~tensorfuse.lower_to_tir.vector_math.fast_exp`: a fused chain's scores and
    corrections would otherwise be written out dozens of times). A tuning task's workload keeps
    them written out (:func:`~tensorfuse.autotune.tasks.workload`: MetaSchedule's flop count
    does not read a ``Let``); its candidates are these."""
    from . import lower_program, tvm_schedule
    from .cpu import rolled_schedule

    sch = tvm_schedule(lower_program(program, fusions, dims, index_dtype, "cpu",
                                     accumulate=target.accumulate,
                                     vector_math="bound" if target.vector_math else False))
    rolled_schedule(sch)
    return sch.mod
