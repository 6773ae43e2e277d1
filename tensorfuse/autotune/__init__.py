"""Autotuning: MetaSchedule with TVM's XGBoost cost model over the templates' knobs, one database
per device, resumable jobs (``tensorfuse.tune``, ``tensorfuse tune`` on the command line)."""
from .database import default_database_dir, open_database, repair_database
from .job import TaskResult, TuningSummary, tune

__all__ = ["tune", "TuningSummary", "TaskResult", "default_database_dir", "open_database",
           "repair_database"]
