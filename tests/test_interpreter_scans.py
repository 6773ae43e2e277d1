"""The interpreter's scans and reductions with combine functions of their own, vectorised for
the checks' speed (:mod:`tests.interpreter_scans`: trees, as a GPU runs them), give what the
interpreter's own give: a max with its first index bit for bit, a discounted sum within
rounding, along either axis of a tile, reversed, and along a tile of one row."""
import pytest


def test_vectorised_scans_and_reductions_equal_the_interpreters():
    pytest.importorskip("triton")
    from tests.helpers import run_interpreted

    verdicts = run_interpreted("tests.interpreter_scans_check")
    assert verdicts == {"8x32 axis 0": True, "8x32 axis 0 reversed": True, "8x32 axis 1": True,
                        "8x32 axis 1 reversed": True, "1x256 axis 1": True}, verdicts
