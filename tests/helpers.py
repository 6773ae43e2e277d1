"""Helpers shared by the tests."""
import inspect


def line_of(func, marker: str) -> int:
    """The line number in ``func``'s file of the first source line containing ``marker``."""
    lines, start = inspect.getsourcelines(func)
    for offset, text in enumerate(lines):
        if marker in text:
            return start + offset
    raise AssertionError(f"marker {marker!r} not found")
