"""Element types of the DSL and the promotion rules between them.

Storage types are what tensors hold (``bf16``, ``f16``, ``f32``, ``f64``, ``i8``, ``u8``,
``i32``, ``i64``, ``bool``). Arithmetic on half-precision values happens in ``f32`` (mixed
precision: bf16 in, f32 accumulate), so the *compute* type of a half-precision load is ``f32``;
likewise on 8-bit integers (quantised weights, image bytes) in ``i32``, as C promotes them.
"""
from __future__ import annotations

import numpy as np

from ..errors import DTypeError

CANONICAL = ("bool", "i8", "u8", "i32", "i64", "f16", "bf16", "f32", "f64")
_ALIASES = {
    "float16": "f16", "half": "f16", "fp16": "f16",
    "bfloat16": "bf16",
    "float32": "f32", "float": "f32", "fp32": "f32",
    "float64": "f64", "double": "f64", "fp64": "f64",
    "int8": "i8", "uint8": "u8",
    "int32": "i32", "int": "i32",
    "int64": "i64",
    "bool": "bool",
}
_TVM = {"bool": "bool", "i8": "int8", "u8": "uint8", "i32": "int32", "i64": "int64",
        "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}
BYTES = ("i8", "u8")   # 8-bit integers: every value exact in bf16 and f16
_RANK = {"bool": 0, "i8": 1, "u8": 1, "i32": 2, "i64": 3, "f16": 4, "bf16": 4, "f32": 5, "f64": 6}

def wider(a: str, b: str) -> bool:
    """Whether values of dtype ``a`` hold more than those of ``b`` (f64 > f32 > f16, bf16)."""
    return _RANK[resolve(a)] > _RANK[resolve(b)]


# Literal types: a Python number takes the type of the expression it meets.
WEAK_INT = "weak_int"
WEAK_FLOAT = "weak_float"


def canonical(name: str) -> str:
    """Return the short DSL name of a dtype given in any common spelling (``"float32"`` → ``"f32"``)."""
    if name in CANONICAL or name in (WEAK_INT, WEAK_FLOAT):
        return name
    key = str(name).lower()
    if key in _ALIASES:
        return _ALIASES[key]
    raise DTypeError(f"unknown dtype {name!r}; use one of {', '.join(CANONICAL)}")


def is_float(d: str) -> bool:
    return d in ("f16", "bf16", "f32", "f64", WEAK_FLOAT)


def is_int(d: str) -> bool:
    return d in (*BYTES, "i32", "i64", WEAK_INT)


def is_half(d: str) -> bool:
    return d in ("f16", "bf16")


def compute_dtype(d: str) -> str:
    """The type arithmetic on a value of storage type ``d`` happens in."""
    return "f32" if is_half(d) else "i32" if d in BYTES else d


def promote(a: str, b: str) -> str:
    """Result type of arithmetic between values of compute types ``a`` and ``b``."""
    if a == b:
        return a
    if a in (WEAK_INT, WEAK_FLOAT) and b in (WEAK_INT, WEAK_FLOAT):
        return WEAK_FLOAT if WEAK_FLOAT in (a, b) else WEAK_INT
    if a in (WEAK_INT, WEAK_FLOAT):
        a, b = b, a
    if b == WEAK_INT:
        return "i32" if a == "bool" else a
    if b == WEAK_FLOAT:
        return a if is_float(a) else "f32"
    winner = a if _RANK[a] >= _RANK[b] else b
    return compute_dtype(winner)


def resolve(d: str) -> str:
    """Give a concrete type to an expression that is only made of literals."""
    return {WEAK_INT: "i32", WEAK_FLOAT: "f32"}.get(d, d)


def widest_storage(dtypes) -> str | None:
    """The widest floating storage type among ``dtypes`` (``None`` if none is floating)."""
    floats = [d for d in dtypes if is_float(d) and d != WEAK_FLOAT]
    if not floats:
        return None
    best = max(floats, key=lambda d: _RANK[d])
    if is_half(best) and len({d for d in floats if is_half(d)}) > 1:
        return "f32"
    return best


def to_tvm(d: str) -> str:
    return _TVM[resolve(d)]


def to_numpy(d: str) -> np.dtype:
    """NumPy dtype for a DSL dtype (bf16 through ``ml_dtypes``, which TVM depends on)."""
    d = resolve(d)
    if d == "bf16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_TVM[d])


def from_any(dtype) -> str:
    """DSL dtype of a NumPy dtype, torch dtype or TVM dtype string."""
    text = str(dtype).replace("torch.", "")
    if text in ("bfloat16",):
        return "bf16"
    try:
        return canonical(text)
    except DTypeError:
        raise DTypeError(f"unsupported tensor element type {dtype}") from None
