"""Kernels no issue lists (``benchmarks.unlisted_kernels``): their numbers against float64 in
Triton's interpreter, as ``tf.compile`` makes them for sm_90a (the checks and cases:
:mod:`tests.schedule_templates.unlisted_check`)."""
from tests.schedule_templates.unlisted_check import CASES


def test_unlisted_kernels_match_float64_in_the_triton_interpreter():
    from tests.helpers import check_interpreted

    check_interpreted("tests.schedule_templates.unlisted_check", CASES)


def test_a_mean_over_compiled_in_sizes_compiles_for_sm90a():
    """``T.mean``'s count is sizes the Triton kernel has compiled in (Python ints): folded to one
    literal (16 · 45) and cast to float32 as a scalar of that type, not ``int.to`` (which Triton
    cannot compile)."""
    import pytest

    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    import tensorfuse as tf
    from tests.schedule_templates.unlisted_check import layernorm_with_mean, mean_over_two_axes

    kernel = tf.compile(layernorm_with_mean, target="cuda:sm_90a").for_sizes(R=333, D=300)
    assert "tl.full((), 300, tl.float32)" in kernel.source(R=333, D=300)
    assert "ld.global" in kernel.ptx(R=333, D=300)
    kernel = tf.compile(mean_over_two_axes, target="cuda:sm_90a").for_sizes(B=5, P=45)
    assert "tl.full((), 720, tl.float32)" in kernel.source(B=5, P=45)
    assert "ld.global" in kernel.ptx(B=5, P=45)
