"""The kernel language: write a kernel as a plain Python function over typed tensors.

>>> from tensorfuse import dsl as T
>>> def softmax(x: T.Tensor["M", "N", "f32"]):
...     i, j = T.axes("i j")
...     m = T.max(x[i, j], over=j)
...     e = T.exp(x[i, j] - m)
...     return e / T.sum(e, over=j)

Axes are index variables; expressions broadcast by axis name; ``over=`` names the axes a reduction
folds. :func:`trace` turns such a function into a :class:`Program`.
"""
from .types import Tensor, TensorType, ScalarType, f16, bf16, f32, f64, i32, i64, boolean
from .monoid import Monoid, SUM, PROD, MAX, MIN, LOGSUMEXP, ARGMAX, ARGMIN
from .ops import (axes, axis, size, exp, exp2, log, log2, tanh, sqrt, rsqrt, sigmoid, erf, floor, ceil,
                  round, sin, cos, abs, where, cast, gelu, relu, silu, reduce, sum, prod, max, min,
                  logsumexp, argmax, argmin, max_argmax, maximum, minimum, clamp, inf, mean)
from .expr import Expr, Axis
from . import printer  # noqa: F401  (gives every Expr its DSL text as repr)
from .program import Program, Compute, TensorParam, ScalarParam
from .trace import trace

__all__ = [
    "Tensor", "TensorType", "ScalarType", "f16", "bf16", "f32", "f64", "i32", "i64", "boolean",
    "Monoid", "SUM", "PROD", "MAX", "MIN", "LOGSUMEXP", "ARGMAX", "ARGMIN",
    "axes", "axis", "size", "exp", "exp2", "log", "log2", "tanh", "sqrt", "rsqrt", "sigmoid", "erf",
    "floor", "ceil", "round", "sin", "cos", "abs", "where", "cast", "gelu", "relu", "silu", "reduce",
    "sum", "prod",
    "max", "min", "logsumexp", "argmax", "argmin", "max_argmax", "maximum", "minimum", "clamp",
    "inf", "mean",
    "Expr", "Axis", "Program", "Compute", "TensorParam", "ScalarParam", "trace",
]
