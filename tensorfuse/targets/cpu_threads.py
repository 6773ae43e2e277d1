"""How many threads TVM's CPU kernels run on: every core this process may use.

Unless told otherwise (``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS``), TVM's thread pool takes half
of the hardware threads, assuming two per core; on a machine without SMT that is half of the
cores (on the 2-core CPU machine: one thread, causal attention S=1024 f32 30.5 ms instead of
22.5). tensorfuse sets ``TVM_NUM_THREADS`` to the number of physical cores in this process's
affinity, once, before any kernel runs (the pool reads it when it is first used); a value the user
set is left alone.
"""
from __future__ import annotations

import glob
import os


def physical_cores() -> int:
    """Distinct cores among the CPUs this process may run on (SMT siblings counted once)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        siblings = glob.glob(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            with open(siblings[0]) as f:
                cores.add(f.read().strip())
        except (IndexError, OSError):
            cores.add(str(cpu))   # no topology: count the CPU itself
    return max(1, len(cores))


def use_all_cores() -> None:
    """Set ``TVM_NUM_THREADS`` to :func:`physical_cores` unless the user set a thread count."""
    if "TVM_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = str(physical_cores())
