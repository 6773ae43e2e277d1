"""Progress of a tuning job: a line per measured batch with trials done, failures and the best
latency so far (a MetaSchedule measure callback, run after each batch is recorded)."""
from __future__ import annotations

from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.ir.utils import derived_object


@derived_object
class Progress(PyMeasureCallback):
    """Counts each task's trials and failures and reports after every batch."""

    def __init__(self, tasks, results, say, stop=None):
        super().__init__()
        self.tasks, self.results, self.say, self.stop = tasks, results, say, stop
        self.best: dict[int, float] = {}

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        result = self.results[task_id]
        for built, ran in zip(builder_results, runner_results):
            result.trials_this_job += 1
            error = built.error_msg or ran.error_msg
            if error:
                result.failures_this_job += 1
                if len(result.errors) < 5:
                    result.errors.append(error.strip().splitlines()[-1][:300])
                continue
            secs = sum(float(s) for s in ran.run_secs) / len(ran.run_secs)
            self.best[task_id] = min(self.best.get(task_id, secs), secs)
        best = self.best.get(task_id)
        done = result.trials + result.trials_this_job
        self.say(f"  {result.name}: {done} trials ({result.trials_this_job} this job, "
                 f"{result.failures_this_job} failed), best this job "
                 + ("-" if best is None else f"{best * 1e3:.4g} ms"))
        if self.stop is not None and self.stop.is_set():
            raise StopTuning("stopped on request")  # the batch is recorded: a clean place to stop


class StopTuning(Exception):
    """Raised after a recorded batch to end a job early (Ctrl-C)."""
