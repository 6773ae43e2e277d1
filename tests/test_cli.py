"""The tensorfuse command, end to end."""
import contextlib
import io
import os
import subprocess
import sys
import textwrap

import pytest


def run(*args, cwd=None):
    """The command as a shell runs it: its own process (the demos, which also check where
    they write)."""
    return subprocess.run([sys.executable, "-m", "tensorfuse.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def show(*args):
    """``tensorfuse show …`` through the command's ``main`` in this process — its exit status
    and what it printed, as :func:`run` gives them — without the ~8 s a new process spends
    importing TVM and torch again."""
    from tensorfuse import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(["show", *args])
        except SystemExit as done:   # argparse's errors, and the command's own exits
            status = done.code if isinstance(done.code, int) else int(done.code is not None)
    return subprocess.CompletedProcess(["tensorfuse", "show", *args], status, out.getvalue(),
                                       err.getvalue())


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
    proc = show(f"{path}:double")
    assert proc.returncode == 0, proc.stderr
    assert 'T.sblock("out")' in proc.stdout
    proc = show(f"{path}:double", "--cuda", "--size", "N=1024")
    assert proc.returncode == 0, proc.stderr   # the GPU code that runs: the elementwise template's
    assert "elementwise template" in proc.stdout and "@triton.jit" in proc.stdout
    proc = show(f"{path}:triple")
    assert proc.returncode == 2 and "no @tensorfuse.kernel named 'triple'" in proc.stderr
    assert "double" in proc.stderr
    # a size the kernel does not have: in its own process, where no caller's line may show
    proc = run("show", f"{path}:double", "--size", "Q=3")
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
    proc = show(f"{path}:broken")
    assert proc.returncode != 0
    assert f"{path}:8" in proc.stderr and "cannot reduce over axis j" in proc.stderr


def test_show_prints_what_compile_runs_on_hopper_and_its_parts():
    """On sm_90a (no GPU needed) ``--cuda`` prints the Hopper template's plan and CUDA C++ (TMA,
    wgmma), as ``tf.compile`` runs it at the sizes given; ``--parts`` one line per part, by
    role; a Triton kernel says it is not assembled from parts; missing sizes are named."""
    sizes = ["--size", "B=2", "--size", "H=16", "--size", "M=4096", "--size", "N=4096",
             "--size", "D=128"]
    spec = "tensorfuse.kernels:causal_attention"
    proc = show(spec, "--target", "cuda:sm_90a", "--cuda", *sizes)
    assert proc.returncode == 0, proc.stderr
    assert "hopper_attention" in proc.stdout.splitlines()[0]
    assert "// hopper attention plan:" in proc.stdout
    for instruction in ("cp.async.bulk.tensor", "wgmma.mma_async", "setmaxnreg"):
        assert instruction in proc.stdout
    proc = show(spec, "--target", "cuda:sm_90a", "--parts", *sizes)
    assert proc.returncode == 0, proc.stderr
    roles = [line.split()[0] for line in proc.stdout.splitlines() if not line.startswith("//")]
    assert roles == ["scheduler", "load", "pipeline", "mainloop", "row_state", "epilogue"]
    assert "tma_boxes" in proc.stdout and "reads" in proc.stdout
    proc = show("tensorfuse.kernels:softmax", "--target", "cuda:sm_90a", "--parts",
               "--size", "M=64", "--size", "N=1000")
    assert proc.returncode == 0 and "not assembled from parts" in proc.stdout, proc.stderr
    proc = show(spec, "--target", "cuda:sm_90a", "--cuda", "--size", "B=2")
    assert proc.returncode == 2 and "add --size for H, M, D, N" in proc.stderr, proc.stderr


def test_show_prints_a_chain_reduced_over_two_axes(tmp_path):
    """A chain over two reduced axes runs as a flat sweep (no template choice per size of its
    own): ``show --cuda`` describes it and prints its source instead of failing."""
    path = tmp_path / "norms.py"
    path.write_text(textwrap.dedent("""
        import tensorfuse as tf
        from tensorfuse import dsl as T

        @tf.kernel
        def frobenius(x: T.Tensor["B", "M", "N", "bf16"]):
            b, i, j = T.axes("b i j")
            return T.sqrt(T.sum(x[b, i, j] * x[b, i, j], over=(i, j)))
    """))
    proc = show(f"{path}:frobenius", "--target", "cuda:sm_90a", "--cuda", "--size", "B=4",
                "--size", "M=64", "--size", "N=32")
    assert proc.returncode == 0, proc.stderr
    assert "swept as one axis" in proc.stdout.splitlines()[1]
    assert "@triton.jit" in proc.stdout


def test_ctrl_c_outside_a_tuning_batch_exits_130_without_a_traceback(monkeypatch, capsys):
    """A Ctrl-C that lands after the batches (the job timing its defaults and best records, where
    the job's own handler is no longer installed) ends the command as a shell expects."""
    from tensorfuse import autotune, cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(autotune, "tune", interrupted)
    status = cli.main(["tune", "tensorfuse.kernels:softmax", "--target", "llvm", "--trials", "4",
                       "--size", "M=64", "--size", "N=256"])
    assert status == 130
    assert "interrupted" in capsys.readouterr().err
