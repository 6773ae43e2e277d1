"""Chains of reductions over the positions up to each output's own, scanned together
(``schedule_templates/chain_scans.py``): their numbers under Triton's interpreter (the cases:
:mod:`.chain_scans_check`), what ``tf.compile`` plans for them, the chains it leaves to the
other templates, the sm_90a code, and on the GPU."""
import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import TargetError
from tensorfuse.schedule_templates.chain_scans import plan_chain_scan
from tests.helpers import check_interpreted, gpu_case, poisoned_call
from tests.schedule_templates.chain_scans_check import (CASES, causal_log_normaliser,
                                                        error, normaliser_down_middle,
                                                        running_std)


def test_chain_scans_match_float64_in_the_triton_interpreter():
    check_interpreted("tests.schedule_templates.chain_scans_check", CASES)


def test_a_log_normaliser_written_out_is_a_scan_of_its_states_not_a_sweep_of_every_prefix():
    """``max`` and ``Σ exp(x − m)`` up to each position: the row template swept every prefix
    (N²/2 terms a row); the chain's states scan together, the sum's term relative to its own
    position's maximum (1), corrected as parts combine."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    made = tf.compile(causal_log_normaliser, target="cuda:sm_90a")
    plan = made.describe_plan(B=64, N=16384)
    assert plan.startswith("scan plan of causal_log_normaliser: m, s[i] = chain_m_s (running "
                           "states scanned together, corrected as they combine) of x[b, j], "
                           "1.0 over j <= i (prefix scan, rows b)"), plan
    long_row = made.describe_plan(B=1, N=1 << 22)
    assert "each row cut into" in long_row and "parts" in long_row, long_row


def test_a_weighted_average_scans_its_weights_states_along_each_feature():
    """``Σ p · v[b, j, e] / Σ p`` up to each position: the rows are the weighted sum's (b, e),
    the maximum and the normaliser scanned along each; the attention template had taken it
    (N²/2 products a row on the tensor cores)."""
    from tests.schedule_templates.chain_scans_check import causal_attention_pool

    plan = plan_chain_scan(causal_attention_pool.program)
    assert [a.name for a in plan.rows] == ["b", "e"] and plan.monoid.arity == 3, plan.describe()


def test_independent_sums_up_to_each_position_scan_in_one_pass():
    plan = plan_chain_scan(running_std.program)
    assert sorted(n for n, _ in plan.members) == ["s1", "s2"] and plan.dtypes == ("f32", "f32")
    assert plan.monoid.arity == 2 and plan.decay is None


@tf.kernel
def _two_ranges(x: T.Tensor["B", "N", "f32"]):
    """A maximum up to each position and a sum of exponentials up to the one before: two
    ranges."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    m = T.max(T.where(j <= i, x[b, j], -T.inf), over=j)
    return T.sum(T.where(j < i, T.exp(x[b, j] - m), 0.0), over=j)


@tf.kernel
def _position_weighted(x: T.Tensor["B", "N", "f32"]):
    """Terms weighted by the distance to the output's position, beside its running maximum."""
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    m = T.max(T.where(j <= i, x[b, j], -T.inf), over=j)
    return T.sum(T.where(j <= i, T.exp(x[b, j] - m) * T.cast(i - j, "f32"), 0.0), over=j)


@pytest.mark.parametrize("kernel, why", [
    (_two_ranges, "different conditions"),
    (_position_weighted, "the terms read i beside comparing it")])
def test_chains_a_scan_cannot_take_are_refused_with_the_reason(kernel, why):
    with pytest.raises(TargetError, match=why):
        plan_chain_scan(kernel.program)


@pytest.mark.parametrize("kernel, dims", [(causal_log_normaliser, dict(B=64, N=16384)),
                                          (causal_log_normaliser, dict(B=1, N=1 << 22)),
                                          (normaliser_down_middle, dict(B=16, N=4096, C=1024))])
def test_chain_scans_compile_for_sm90a_and_gfx942(kernel, dims):
    """The tuple of states scanned with ``tl.associative_scan`` and its combine (``ex2`` for
    the corrections) compiles, for a row in parts and for a scan down the middle axis; and the
    code for gfx942."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    made = tf.compile(kernel, target="cuda:sm_90a")
    for which in made._kernels(dims):
        ptx = made.ptx(which, **dims)
        assert ".visible .entry" in ptx and "ex2.approx" in ptx, which
    amd = tf.compile(kernel, target="rocm:gfx942")
    assert "amdgcn" in amd.compiled(amd._kernels(dims)[-1], **dims).asm


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_chain_scans_match_float64_on_the_gpu(name):
    """Outputs poisoned; f32 to 1e-5 (the f32 states' rounding over a few thousand terms),
    bf16 to 2e-2."""
    kernel, case = CASES[name]
    args, want, seed = gpu_case(case)
    got = poisoned_call(tf.compile(kernel), kernel.program, args, want)[0]
    assert error(got, want) < (2e-2 if got.dtype == torch.bfloat16 else 1e-5), (name, seed)
