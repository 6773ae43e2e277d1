"""The tensorfuse command, end to end."""
import os
import subprocess
import sys
import textwrap

import pytest


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tensorfuse.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


@pytest.mark.slow
def test_demo_checks_and_times(tmp_path):
    proc = run("demo", "--save", str(tmp_path / "demo"), "--repeat", "3")
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout and "time per call" in proc.stdout
    assert "0.00 TFLOP/s" not in proc.stdout  # a rate that says something on the CPU too
    written = list((tmp_path / "demo").iterdir())
    assert written and "T.sblock" in written[0].read_text()


@pytest.mark.slow
def test_demo_writes_nothing_into_the_current_folder_unless_asked(tmp_path):
    proc = run("demo", "--repeat", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == []
    written = proc.stdout.split("TensorIR (TVMScript) written to ")[1].split()[0]
    assert "T.sblock" in open(written).read()


def test_show_prints_tensorir_and_cuda(tmp_path):
    path = tmp_path / "mykernels.py"
    path.write_text(textwrap.dedent('''
        import tensorfuse as tf
        from tensorfuse import dsl as T

        @tf.kernel
        def double(x: T.Tensor["N", "f32"]):
            i = T.axes("i")
            return x[i] * 2.0
    '''))
    proc = run("show", f"{path}:double")
    assert proc.returncode == 0, proc.stderr
    assert 'T.sblock("out")' in proc.stdout
    proc = run("show", f"{path}:double", "--cuda", "--size", "N=1024")
    assert proc.returncode == 0, proc.stderr
    assert "__global__" in proc.stdout
    proc = run("show", f"{path}:triple")
    assert proc.returncode == 2 and "no @tensorfuse.kernel named 'triple'" in proc.stderr
    assert "double" in proc.stderr
    proc = run("show", f"{path}:double", "--size", "Q=3")   # a size the kernel does not have
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "tensorfuse: error: double has no size named Q (its sizes: N)"   # no launcher line


def test_show_reports_kernel_errors_with_the_line(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(textwrap.dedent('''
        import tensorfuse as tf
        from tensorfuse import dsl as T

        @tf.kernel
        def broken(x: T.Tensor["N", "f32"]):
            i, j = T.axes("i j")
            return T.sum(x[i], over=j)
    '''))
    proc = run("show", f"{path}:broken")
    assert proc.returncode != 0
    assert f"{path}:8" in proc.stderr and "cannot reduce over axis j" in proc.stderr
