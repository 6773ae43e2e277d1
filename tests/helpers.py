"""Helpers shared by the tests."""
import inspect


def line_of(func, marker: str) -> int:
    """The line number in ``func``'s file of the first source line containing ``marker``."""
    lines, start = inspect.getsourcelines(func)
    for offset, text in enumerate(lines):
        if marker in text:
            return start + offset
    raise AssertionError(f"marker {marker!r} not found")


def nvcc_found() -> bool:
    """Whether nvcc (the CUDA toolkit, 13.0 checked) is on PATH. Locally its absence skips the
    sm_90a compile tests; in CI (``CI`` set: ``.ci/run``), whose machine has the toolkit, it is a
    failure, so those tests never skip there unnoticed."""
    import os
    import shutil

    found = shutil.which("nvcc") is not None
    if not found and os.environ.get("CI"):
        raise RuntimeError("CI runs the sm_90a code-generation tests: put the CUDA toolkit's nvcc "
                           "(13.0) on PATH")
    return found


def _needs_nvcc():
    import pytest

    return pytest.mark.skipif(not nvcc_found(), reason="needs nvcc (the CUDA toolkit) on PATH")


needs_nvcc = _needs_nvcc()
