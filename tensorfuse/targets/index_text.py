"""Source text of integer index arithmetic, for emitters that write a token tiling's formulas
(``schedule_templates.token_tiling``) into kernels: the tiling's Python code runs on
:class:`IndexText` values and returns the expression as text, in Triton's spelling or C++'s.

Positions and coordinates are never negative, so truncating division and remainder (C++, Triton)
are the floor ones the tiling's arithmetic means.
"""
from __future__ import annotations


class IndexText:
    """Source text of an integer index (a scalar or a tensor), with the operators a token
    tiling's arithmetic uses; ``FLOORDIV`` is the target language's spelling of ``//``."""

    FLOORDIV = "//"

    def __init__(self, text: str):
        self.text = text

    @staticmethod
    def of(x) -> str:
        """The text of ``x`` (an :class:`IndexText` or a number)."""
        return x.text if isinstance(x, IndexText) else str(x)

    def _op(self, op: str, other, swap: bool = False) -> "IndexText":
        a, b = (self.of(other), self.text) if swap else (self.text, self.of(other))
        return type(self)(f"({a} {op} {b})")

    def __floordiv__(self, o): return self._op(self.FLOORDIV, o)
    def __mod__(self, o): return self._op("%", o)
    def __mul__(self, o): return self._op("*", o)
    def __rmul__(self, o): return self._op("*", o, True)
    def __add__(self, o): return self._op("+", o)
    def __radd__(self, o): return self._op("+", o, True)
    def __lt__(self, o): return self._op("<", o)
    def __and__(self, o): return self._op("&", o)


class CudaIndexText(IndexText):
    """:class:`IndexText` in C++ (``/`` divides integers)."""

    FLOORDIV = "/"
