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


def test_large_outputs_are_prefaulted_only_where_torch_has_more_threads(monkeypatch):
    """A fresh CPU output is zeroed before the kernel only where torch's fill runs on more
    threads than TVM's pool (which then takes the page faults more slowly in the kernel)."""
    import torch
    import tvm

    import tensorfuse.interop as interop

    made = []
    real_zeros = torch.zeros

    def zeros(*args, **kwargs):
        made.append("zeros")
        return real_zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", zeros)
    shape = (1024, 1024)   # 4 MiB of f32: above the prefault size
    for tvm_threads, torch_threads, expected in ((1, 2, ["zeros"]), (2, 2, []), (4, 2, [])):
        made.clear()
        monkeypatch.setattr(interop, "tvm_cpu_threads", lambda n=tvm_threads: n)
        monkeypatch.setattr(torch, "get_num_threads", lambda n=torch_threads: n)
        out, view = interop.empty(shape, "f32", tvm.cpu(0), "torch")
        assert made == expected and tuple(out.shape) == shape
    made.clear()
    monkeypatch.setattr(interop, "tvm_cpu_threads", lambda: 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    interop.empty((8, 8), "f32", tvm.cpu(0), "torch")   # small: never
    assert made == []
