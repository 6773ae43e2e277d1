"""Settings of a template's knobs that cannot run on the GPU are never proposed.

The space samples each knob on its own, so some combinations need more shared memory than the GPU
has (Triton's attention with 128 × 128 tiles and 4 stages: 288 KiB against the H100's 227) or more
registers than a warpgroup gets; before this, 1–3 of every 16 trials failed that way on the H100.
:class:`FitsDevice` is a MetaSchedule postprocessor: the search drops a candidate it rejects
before the candidate is built or counted, as it drops any schedule a postprocessor refuses.
"""
from __future__ import annotations

import itertools

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.postproc import PyPostproc

from .tasks import knobs_of


@derived_object
class FitsDevice(PyPostproc):
    """Rejects candidates whose knobs the task's template says cannot run on its target."""

    def __init__(self, task):
        super().__init__()
        self.task = task

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch) -> bool:
        return self.task.unfit(knobs_of(sch.mod)) is None   # memoised by the task

    def clone(self) -> "FitsDevice":
        return FitsDevice(self.task)


def fitting_settings(task, limit: int = 4096) -> tuple[int, int] | None:
    """(settings that fit, settings in all) of a GPU task's space, or None where the space is
    not enumerable here (the CPU's, or more than ``limit`` settings)."""
    if task.template == "cpu" or task.space_size > limit:
        return None
    return len(fitting_settings_of(task)), task.space_size


def fitting_settings_of(task) -> list[dict]:
    """Every setting of ``task``'s knobs that fits its target, in the space's order."""
    choices = task.choices()
    names = list(choices)
    settings = (dict(zip(names, values))
                for values in itertools.product(*(choices[n] for n in names)))
    return [knobs for knobs in settings if task.unfit(knobs) is None]


def setting_key(knobs: dict) -> tuple:
    """A knob setting as a set member."""
    return tuple(sorted(knobs.items()))
