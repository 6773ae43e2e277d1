"""``T.logsumexp`` on the GPU templates: written as its maximum and a sum of exponentials
(:mod:`tensorfuse.schedule_templates.stable_logsumexp`), a chain the row template fuses; before,
a program reducing with it ran on TVM's default GPU schedule. The rewrite's math on the CPU
target (unfused, rolled and split, rows of −∞ and +∞ included), ``tf.compile``'s route, and the
Triton kernels in the interpreter against float64 (:mod:`.logsumexp_check`)."""
import numpy as np
import pytest
import torch
import tvm

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.schedule_templates import lower_program
from tensorfuse.schedule_templates.fusion import Fusion
from tensorfuse.schedule_templates.stable_logsumexp import written_stably
from tensorfuse.widened_kernel import RewrittenKernel
from tests.helpers import check_interpreted
from tests.schedule_templates.logsumexp_check import CASES, lse_and_sum, lse_rows


def test_each_logsumexp_becomes_a_maximum_a_sum_and_their_value():
    program, note = written_stably(lse_and_sum.program)
    kinds = [(c.name, c.monoid.name if c.monoid else None) for c in program.computes]
    assert kinds == [("out0_max", "max"), ("out0_sum_exp", "sum"), ("out0", None),
                     ("out1", "sum")]
    assert [c.name for c in program.outputs] == ["out0", "out1"] and "out0 written as" in note
    assert written_stably(tf.kernel(_no_logsumexp).program) is None

    @tf.kernel
    def taken_names(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        out_max = T.max(x[i, j], over=j)
        return T.logsumexp(x[i, j] - out_max, over=j)

    names = [c.name for c in written_stably(taken_names.program)[0].computes]
    assert len(set(names)) == len(names) and "out_max_1" in names   # no name taken twice


def _no_logsumexp(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    return T.sum(x[i, j], over=j)


@pytest.mark.parametrize("fused", [None, (8, 1), (8, 3)])
def test_the_rewrite_is_the_logsumexp_unfused_rolled_and_split(fused):
    """On the CPU target, as written and fused: rows of −∞ give −∞ (an empty sum's log), a row
    holding +∞ gives +∞ — never NaN — and finite rows their logsumexp to float32 rounding."""
    program, _ = written_stably(lse_rows.program)
    names = tuple(c.name for c in program.computes if c.is_reduction)
    fusion = () if fused is None else (Fusion(names, "j", *fused),)
    fn = tvm.compile(lower_program(program, fusion, None, "int32"),
                     target=tvm.target.Target({"kind": "llvm"}))[program.name]
    x = (np.random.default_rng(5).standard_normal((6, 77)) * 50).astype(np.float32)
    x[2], x[4, 5] = -np.inf, np.inf
    out = tvm.runtime.tensor(np.full(6, np.nan, np.float32))
    fn(tvm.runtime.tensor(x), out)
    got, want = out.numpy(), torch.logsumexp(torch.tensor(x, dtype=torch.float64), -1).numpy()
    assert got[2] == -np.inf and got[4] == np.inf
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)


def test_tf_compile_fuses_it_on_gpus_and_leaves_the_cpu_its_own():
    made = tf.compile(lse_rows, target="cuda:sm_90a")
    assert isinstance(made, RewrittenKernel)
    assert made.schedule_origin(M=4096, N=8192).startswith("out written as max + log Σ exp")
    assert "row-reduction template (rolling_update(out_max, out_sum_exp" in made.description
    assert "row-reduction template" in tf.compile(lse_rows, target="cuda:sm_80").description
    assert not isinstance(tf.compile(lse_rows, target="llvm"), RewrittenKernel)


def test_the_triton_kernels_match_float64_in_the_interpreter():
    check_interpreted("tests.schedule_templates.logsumexp_check", CASES)
