"""Kernels no issue lists (``benchmarks.unlisted_kernels``): their numbers against float64 in
Triton's interpreter, as ``tf.compile`` makes them for sm_90a (the checks and cases:
:mod:`tests.schedule_templates.unlisted_check`)."""
from tests.schedule_templates.unlisted_check import CASES


def test_unlisted_kernels_match_float64_in_the_triton_interpreter():
    from tests.helpers import check_interpreted

    check_interpreted("tests.schedule_templates.unlisted_check", CASES)


def test_a_mean_over_a_compiled_in_size_compiles_for_sm90a():
    """``T.mean``'s count is a size the Triton kernel has compiled in (a Python int): its cast to
    float32 is a scalar of that type, not ``int.to`` (which Triton cannot compile)."""
    import pytest

    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    import tensorfuse as tf
    from tests.schedule_templates.unlisted_check import layernorm_with_mean

    kernel = tf.compile(layernorm_with_mean, target="cuda:sm_90a").for_sizes(R=333, D=300)
    assert "tl.full((), 300, tl.float32)" in kernel.source(R=333, D=300)
    assert "ld.global" in kernel.ptx(R=333, D=300)
