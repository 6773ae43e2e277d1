"""Kernels no issue lists (``benchmarks.unlisted_kernels``): their numbers against float64 in
Triton's interpreter, as ``tf.compile`` makes them for sm_90a (the checks and cases:
:mod:`tests.schedule_templates.unlisted_check`)."""
from tests.schedule_templates.unlisted_check import CASES


def test_unlisted_kernels_match_float64_in_the_triton_interpreter():
    from tests.helpers import check_interpreted

    check_interpreted("tests.schedule_templates.unlisted_check", CASES)
