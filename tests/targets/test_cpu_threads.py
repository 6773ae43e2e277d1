"""TVM's CPU kernels run on every core (its pool alone takes half the hardware threads, one
thread on a 2-core machine without SMT); a thread count the user set is kept."""
import os
import subprocess
import sys

from tensorfuse.targets.cpu_threads import physical_cores

SHOW = "import tensorfuse, os; print(os.environ['TVM_NUM_THREADS'])"


def threads_after_import(**env) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS",
                                                               "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", SHOW], env={**clean, **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_import_sets_the_thread_count_to_the_physical_cores():
    cores = physical_cores()
    assert 1 <= cores <= len(os.sched_getaffinity(0))
    assert threads_after_import() == str(cores)


def test_a_thread_count_the_user_set_is_kept():
    assert threads_after_import(TVM_NUM_THREADS="3") == "3"
    omp = subprocess.run([sys.executable, "-c", "import tensorfuse, os; "
                          "print(os.environ.get('TVM_NUM_THREADS', 'unset'))"],
                         env={**{k: v for k, v in os.environ.items()
                                 if k != "TVM_NUM_THREADS"}, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, check=True)
    assert omp.stdout.strip() == "unset"     # TVM reads OMP_NUM_THREADS itself
