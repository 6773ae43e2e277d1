"""Parameter annotations: ``T.Tensor["M", "N", "bf16"]`` for tensors and ``T.f32`` for scalars.

A tensor annotation lists its dimensions, then its element type. A dimension is a name (a size bound
when the kernel is called; the same name in two places means the same size) or an integer.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import dtypes as dt
from ..errors import DSLError


@dataclass(frozen=True)
class TensorType:
    dims: tuple  # of str | int
    dtype: str

    def __repr__(self) -> str:
        return "T.Tensor[" + ", ".join(repr(d) for d in self.dims) + f", {self.dtype!r}]"


class Tensor:
    """``Tensor["B", "N", 128, "bf16"]``: a tensor parameter's dimensions and element type."""

    def __class_getitem__(cls, spec) -> TensorType:
        spec = spec if isinstance(spec, tuple) else (spec,)
        if not spec or not isinstance(spec[-1], str):
            raise DSLError("T.Tensor[...] lists the dimensions, then the element type last, e.g. "
                           'T.Tensor["M", "N", "f32"]')
        try:
            dtype = dt.canonical(spec[-1])
        except DSLError:
            raise DSLError(f"T.Tensor[...]: the last entry must be an element type, got "
                           f"{spec[-1]!r} (one of {', '.join(dt.CANONICAL)})") from None
        dims = spec[:-1]
        for d in dims:
            if isinstance(d, bool) or not isinstance(d, (str, int)):
                raise DSLError(f"T.Tensor[...]: dimension {d!r} must be a name or an integer")
            if isinstance(d, str) and not d.isidentifier():
                raise DSLError(f"T.Tensor[...]: dimension name {d!r} is not an identifier")
            if isinstance(d, int) and d <= 0:
                raise DSLError(f"T.Tensor[...]: dimension {d} must be positive")
        return TensorType(tuple(dims), dtype)


@dataclass(frozen=True)
class ScalarType:
    dtype: str

    def __repr__(self) -> str:
        return f"T.{self.dtype}"


f16 = ScalarType("f16")
bf16 = ScalarType("bf16")
f32 = ScalarType("f32")
f64 = ScalarType("f64")
i32 = ScalarType("i32")
i64 = ScalarType("i64")
boolean = ScalarType("bool")
