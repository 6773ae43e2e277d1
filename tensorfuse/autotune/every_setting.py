"""Measuring every knob setting that fits, in one batch per kernel, when the job's budget covers
them.

MetaSchedule's evolutionary search proposes a batch, waits for it to be measured and recorded,
trains the cost model, then searches again: a kernel's next batch never starts before its last
one is measured. On two H100s that loop, not measuring, bounded a job (a second GPU gave 1.0–1.1×;
``benchmarks.tuning``), and near the end of a small space each round found one or
two new settings. Where the trials asked cover every setting of a kernel's space that fits the
GPU (the spaces have 100–200), :class:`EverySetting` hands them all to the task scheduler at once —
a MetaSchedule search strategy, so the records, builder, runner, callbacks and database are the
usual ones — and the runner spreads them over the GPUs as they compile.
"""
from __future__ import annotations

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate, PySearchStrategy

from .tasks import knob_space


@derived_object
class EverySetting(PySearchStrategy):
    """Proposes ``settings`` (knob settings of ``task``) once, up to the task's trial budget;
    then nothing, which ends the task."""

    def __init__(self, task, settings: list[dict]):
        super().__init__()
        self.task, self.settings = task, list(settings)
        self.budget, self.done = 0, False

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None,
                   cost_model=None) -> None:
        self.budget, self.done = int(max_trials), False

    def post_tuning(self) -> None:
        pass

    def generate_measure_candidates(self) -> list[MeasureCandidate] | None:
        if self.done:
            return None
        self.done = True
        args_info = ArgInfo.from_prim_func(self.task.mod["main"])
        candidates = []
        for knobs in self.settings[:self.budget]:
            sch = tvm.s_tir.Schedule(self.task.mod)
            knob_space(self.task.choices(), fixed=knobs)(sch)   # the sampled schedule's trace
            candidates.append(MeasureCandidate(sch, args_info))
        return candidates or None

    def notify_runner_results(self, measure_candidates, results) -> None:
        pass

    def clone(self) -> "EverySetting":
        return EverySetting(self.task, self.settings)
