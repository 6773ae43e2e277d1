"""Elementwise DSL expressions as CUDA C++ (f32 arithmetic), for the epilogues of cluster kernels.

Only what the kernel has at hand may appear: constants, scalar parameters, the values of earlier
computes (``refs``: compute name → C++ variable), the indices the kernel names (``axes``), elements
of the tensors it is given (``loads``: parameter name → C++ pointer; row-major offsets from the
sizes) and math on them. Anything else is refused with the user's source location.
"""
from __future__ import annotations

import math

from ...dsl import dtypes as dt
from ...dsl.expr import (Axis, Binary, Cast, Compare, Const, DimSize, Expr, Load, Ref, Scalar,
                         Unary, Where)
from ...errors import ScheduleError

_UNARY = {"exp": "__expf({})", "exp2": "exp2f({})", "log": "__logf({})", "log2": "log2f({})",
          "sqrt": "sqrtf({})", "rsqrt": "rsqrtf({})", "abs": "fabsf({})", "erf": "erff({})",
          "sigmoid": "__fdividef(1.0f, 1.0f + __expf(-({})))",
          # the special-function unit's tanh (sm_75+; relative error ≤ 2^-10.99, below the
          # bf16 rounding that P and the outputs get anyway): one MUFU op. tanhf is ~40
          # instructions (its polynomial for small |x| is what softcap scores hit), and
          # 1 − 2/(1 + e^{2x}) two MUFU ops — which made the Hopper attention's softcap 25 %
          # slower (394 → 296 TFLOP/s on the H100: the softmax's exp2 already keeps that unit
          # busy); GELU's tanh in the Hopper GEMM's epilogue had cost ~8 % of a tile with tanhf
          "tanh": "({{ float tf_tanh_; asm(\"tanh.approx.f32 %0, %1;\" : \"=f\"(tf_tanh_) "
                  ": \"f\"((float)({}))); tf_tanh_; }})",
          "floor": "floorf({})", "ceil": "ceilf({})", "round": "rintf({})",
          "sin": "__sinf({})", "cos": "__cosf({})",
          "neg": "(-{})", "not": "(!{})"}
_BINARY = {"add": "({} + {})", "sub": "({} - {})", "mul": "({} * {})", "div": "({} / {})",
           "max": "fmaxf({}, {})", "min": "fminf({}, {})", "pow": "powf({}, {})",
           "and": "({} && {})", "or": "({} || {})"}
# A cast to a 16-bit float rounds as storing would (to nearest even) and the math goes on in f32.
# cuda_bf16.h's functions, not the bits rounded by hand or by inline PTX: either of those in a
# Hopper GEMM's epilogue made ptxas serialise its wgmma (warning C7520), these do not
_ROUNDED = {"bf16": "__bfloat162float(__float2bfloat16_rn({}))",
            "f16": "__half2float(__float2half_rn({}))"}
# integer operands keep CUDA's integer overloads: fminf/fmaxf made an index arithmetic's clamp a
# float (a bias table's bucket min(i - j, R - 1)), and nvcc then refused the int clamp of the
# table's index around it (max(float, int)). (abs stays fabsf: the neighbourhood mask's
# |i - j| ≤ r is emitted so, and its SASS moves with abs(): not measured yet)
_INTEGER = {"max": "max({}, {})", "min": "min({}, {})"}
_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


# the most elements 32-bit int offsets reach (0 … 2^31 − 1)
INT32_ELEMENTS = 2 ** 31


def wide_tensors(shapes, dims: dict) -> frozenset:
    """The names among ``shapes`` (``(name, its dims)`` pairs: ints and size names) of tensors
    with more elements at sizes ``dims`` than 32-bit offsets reach (a boolean mask
    ``[B, 1, S, S]`` of 32k tokens at B=3): what :func:`to_cuda`'s ``wide`` takes, so that their
    offsets are 64-bit — only theirs, and only at such sizes (elsewhere 32-bit arithmetic, the
    same source as before)."""
    def elements(shape) -> int:
        return math.prod(d if isinstance(d, int) else int(dims.get(d, 1)) for d in shape)
    return frozenset(name for name, shape in shapes if elements(shape) > INT32_ELEMENTS)


def to_cuda(e: Expr, refs: dict[str, str], what: str, axes: dict | None = None,
            sizes: dict | None = None, loads: dict | None = None,
            written: dict | None = None, clamp_loads: bool = False,
            wide: frozenset = frozenset()) -> str:
    """C++ for ``e``; ``what`` names the place in errors ("the activation of h"). ``axes`` (axis
    name → C++ int expression) and ``sizes`` (size name → int) allow index arithmetic, ``loads``
    (tensor parameter name → C++ pointer) reading tensor elements. ``written``: C++ already
    chosen for some subexpressions (by ``id``), used as given. ``clamp_loads``: every index of a
    tensor read is clamped into the tensor — for kernels that evaluate an expression at padding
    positions (past the last row or key) whose results they discard, where the index arithmetic
    can leave the tensor (a bias table read at ``i - j + N - 1`` for a key ``j ≥ N``).
    ``wide``: tensors whose offsets are computed in 64 bits (:func:`wide_tensors`)."""
    axes, sizes, loads, written = axes or {}, sizes or {}, loads or {}, written or {}
    if id(e) in written:
        return written[id(e)]

    def sub(x: Expr) -> str:
        return to_cuda(x, refs, what, axes, sizes, loads, written, clamp_loads, wide)

    if isinstance(e, Load) and e.param.name in loads:
        offset = ""
        for index, dim in zip(e.indices, e.param.dims):
            extent = str(dim) if isinstance(dim, int) else \
                (str(sizes[dim]) if dim in sizes else f"TF_SIZE_{dim}")
            at = f"min(max({sub(index)}, 0), {extent} - 1)" if clamp_loads else sub(index)
            if not offset and e.param.name in wide:   # the rest of the offset follows in 64 bits
                at = f"(long long)({at})"
            offset = f"({offset}) * {extent} + {at}" if offset else at
        value = f"{loads[e.param.name]}[{offset}]"
        return f"((float){value})" if dt.is_float(e.param.dtype) else f"({value})"
    if isinstance(e, Binary) and e.op == "div" and not dt.is_float(e.a.dtype) and \
            not dt.is_float(e.b.dtype):   # true division of two integers
        return f"((float){sub(e.a)} / (float){sub(e.b)})"

    if isinstance(e, Axis) and e.name in axes:
        return f"({axes[e.name]})"
    if isinstance(e, DimSize):  # a macro the kernel source defines (see size_macros)
        return str(sizes[e.name]) if e.name in sizes else f"TF_SIZE_{e.name}"
    if isinstance(e, Compare) and e.op in ("eq", "ne") and _is_zero(e.b) and \
            isinstance(e.a, Binary) and e.a.op == "mod":   # divisible: the same in C++
        return f"(({sub(e.a.a)} % {sub(e.a.b)}) {_COMPARE[e.op]} 0)"
    if isinstance(e, Binary) and e.op in ("floordiv", "mod"):
        a, b = sub(e.a), sub(e.b)
        if _non_negative(e.a) and _positive(e.b):   # then C++'s / and % are the DSL's
            return f"({a} {'/' if e.op == 'floordiv' else '%'} {b})"
        # the DSL floors where C++ truncates towards zero: one step down (floordiv) or one
        # divisor over (mod) where the signs differ and the division is not exact
        off = f"((({a}) % ({b})) != 0 && ((({a}) < 0) != (({b}) < 0)))"
        if e.op == "floordiv":
            return f"(({a}) / ({b}) - (int){off})"
        return f"(({a}) % ({b}) + ({off} ? ({b}) : 0))"
    if isinstance(e, Const) and isinstance(e.value, int):  # bool is an int
        return str(int(e.value))
    if isinstance(e, Const):
        value = float(e.value)
        if math.isinf(value):
            return "(INFINITY)" if value > 0 else "(-INFINITY)"
        return f"{value!r}f"
    if isinstance(e, Scalar):
        return scalar_name(e.name)
    if isinstance(e, Ref):
        if e.compute.name not in refs:
            raise ScheduleError(f"{what} reads {e.compute.name}, which this kernel does not keep",
                                e.loc)
        return refs[e.compute.name]
    if isinstance(e, (Unary, Binary)) and e.op in _INTEGER and \
            not any(dt.is_float(x.dtype) for x in e.children()):
        return _INTEGER[e.op].format(*map(sub, e.children()))
    if isinstance(e, Unary) and e.op in _UNARY:
        return _UNARY[e.op].format(sub(e.a))
    if isinstance(e, Binary) and e.op in _BINARY:
        return _BINARY[e.op].format(sub(e.a), sub(e.b))
    if isinstance(e, Compare):
        return f"({sub(e.a)} {_COMPARE[e.op]} {sub(e.b)})"
    if isinstance(e, Where):
        return f"({sub(e.cond)} ? {sub(e.a)} : {sub(e.b)})"
    if isinstance(e, Cast):
        if e.dtype in _ROUNDED:
            return _ROUNDED[e.dtype].format(sub(e.a))
        if e.dtype == "bool":   # any nonzero value, not what truncating to an integer leaves
            return f"((int)({sub(e.a)} != 0))"
        return f"((float){sub(e.a)})" if dt.is_float(e.dtype) else f"((int){sub(e.a)})"
    raise ScheduleError(f"{what} must be elementwise math on the reduced values; "
                        f"{type(e).__name__.lower()} {e!s} is not supported by cluster kernels",
                        getattr(e, "loc", None))


def _non_negative(e: Expr) -> bool:
    """Whether integer ``e`` cannot be negative: indices, sizes, constants ≥ 0, integer scalars
    (taken as ≥ 0: :func:`_positive`), and sums, products, extremes, quotients and remainders of
    them."""
    if isinstance(e, (Axis, DimSize)) or _positive(e):
        return True
    if isinstance(e, Const):
        return not isinstance(e.value, bool) and e.value >= 0
    if isinstance(e, Binary) and e.op in ("add", "mul", "min", "max"):
        return _non_negative(e.a) and _non_negative(e.b)
    if isinstance(e, Binary) and e.op in ("floordiv", "mod"):
        return _non_negative(e.a) and _positive(e.b)
    return False


def _positive(e: Expr) -> bool:
    """Whether integer ``e`` is taken as above 0 where it divides: a constant above 0, a size,
    an integer scalar (a width, a stride, a dilation: the CUDA C++ templates take integer
    scalars in index arithmetic as non-negative, and a divisor as positive — docs/dsl.md), and
    sums and products of them."""
    if isinstance(e, Const):
        return not isinstance(e.value, bool) and e.value > 0
    if isinstance(e, Binary) and e.op in ("add", "mul"):
        return _positive(e.a) and _positive(e.b)
    return isinstance(e, DimSize) or (isinstance(e, Scalar) and not dt.is_float(e.dtype))


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and not isinstance(e.value, bool) and e.value == 0


def size_macros(sizes: dict) -> str:
    """``#define TF_SIZE_<name> <value>`` for every size, for expressions that use ``T.size``."""
    return "".join(f"#define TF_SIZE_{name} {int(value)}\n" for name, value in sizes.items())


# C++ element types of DSL dtypes, for the tensors a generated kernel reads.
C_TYPES = {"bf16": "__nv_bfloat16", "f16": "__half", "f32": "float", "f64": "double",
           "i32": "int", "i64": "long long", "i8": "signed char", "u8": "unsigned char",
           "bool": "bool"}


def stored_value(e: Expr, dtype: str) -> Expr:
    """``e`` without a cast to ``dtype`` around it, where a kernel stores the value as
    ``dtype``: the store rounds, and rounding in the expression too only costs registers (it made
    ptxas spill 52 bytes in a Hopper GEMM's bias + GELU epilogue; none without)."""
    return e.a if isinstance(e, Cast) and e.dtype == dtype else e


def tensor_arguments(tensors) -> list[tuple[str, str, str]]:
    """(C++ name ``t_<name>``, TVM argument type, C++ type) of the tensors an expression reads
    (``(name, dtype)`` pairs): the names :func:`to_cuda` gets as ``loads``."""
    return [(f"t_{name}", "handle", f"const {C_TYPES[dtype]}* __restrict__")
            for name, dtype in tensors]


def scalar_name(name: str) -> str:
    """The C++ name of the scalar parameter ``name``: ``s_<name>``, so that a user's scalar never
    takes the name of a kernel's own variable (a scale named ``t`` multiplied the Hopper GEMM's
    output by its thread index ``t``)."""
    return f"s_{name}"


def scalar_arguments(scalars) -> list[tuple[str, str, str]]:
    """The same for scalar parameters (``(name, dtype)`` pairs): float or int by value, named
    by :func:`scalar_name`."""
    return [(scalar_name(name), "float32", "float") if dtype.startswith(("f", "bf")) else
            (scalar_name(name), "int32", "int") for name, dtype in scalars]


def size_aliases(pairs) -> str:
    """``#define TF_SIZE_<size name> <kernel variable>`` for ``(size name, variable)`` pairs,
    the first variable of a size that several roles share (k and v share q's heads), for
    expressions that use the sizes while the kernel takes them as arguments."""
    first: dict = {}
    for name, var in pairs:
        first.setdefault(name, var)
    return "".join(f"#define TF_SIZE_{name} {var}\n" for name, var in first.items())


def forwarded(args) -> tuple[str, str]:
    """``(", T a, U b", ", a, b")``: parameters and arguments that pass ``args`` (name, TVM type,
    C++ type) on to a device function."""
    return ("".join(f", {c} {n}" for n, _, c in args), "".join(f", {n}" for n, _, _ in args))


class KernelArguments:
    """What an emitter context (a kernel's parts read it) makes of its kernel's ``arguments``
    (name, TVM type, C++ type): the kernel's parameter list, and the parameters and arguments
    that pass ``forwarded_arguments`` — what the program's expressions may read: tensors, sizes,
    scalars — on to device functions (``extra_params``, ``extra_args``)."""

    arguments: list
    forwarded_arguments: list

    @property
    def params(self) -> str:
        return ",\n    ".join(f"{c} {n}" for n, _, c in self.arguments)

    @property
    def extra_params(self) -> str:
        return forwarded(self.forwarded_arguments)[0]

    @property
    def extra_args(self) -> str:
        return forwarded(self.forwarded_arguments)[1]


def _linear(e: Expr) -> dict[str, int] | None:
    """The constant coefficient of each index in integer ``e`` when it is a sum of indices,
    sizes, integer scalars and constants with constant multiples — its change between two index
    points is then a constant the compiler folds —, else None."""
    if isinstance(e, (Axis, DimSize, Scalar)) or (isinstance(e, Const) and
                                                   isinstance(e.value, int)):
        return None if dt.is_float(e.dtype) else ({e.name: 1} if isinstance(e, Axis) else {})
    if isinstance(e, Unary) and e.op == "neg":
        inner = _linear(e.a)
        return None if inner is None else {n: -c for n, c in inner.items()}
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = _linear(e.a), _linear(e.b)
        if a is None or b is None:
            return None
        sign = 1 if e.op == "add" else -1
        out = dict(a)   # in order of appearance: the generated source must not vary by run
        for n, c in b.items():
            out[n] = out.get(n, 0) + sign * c
        return out
    if isinstance(e, Binary) and e.op == "mul":
        for factor, rest in ((e.a, e.b), (e.b, e.a)):
            inner = _linear(rest)
            if isinstance(factor, Const) and isinstance(factor.value, int) and inner is not None:
                return {n: int(factor.value) * c for n, c in inner.items()}
    return None


def converted_indices(e: Expr, offsets: dict[str, str], at_base: dict, sizes: dict,
                      loads: dict) -> dict:
    """C++ for the integer subexpressions of ``e`` that vary with the indices of ``offsets``
    (index name → C++ of its offset from the base point, a constant per unrolled fragment
    register), are affine in them and are used as floats (an ALiBi bias ``slope · (j − i)``):
    ``(float)(base) + (float)(Σ coefficient · offset)``, with ``base`` the value at the indices
    ``at_base`` (the fragment's first row and column) — loop-invariant, converted once — and the
    sum a constant the compiler folds. An int-to-float conversion per score element runs at the
    special-function unit's rate, which the softmax's exp2 already fills. Exact while the values
    stay below 2^24. Keyed by ``id`` for :func:`to_cuda`'s ``written``."""
    found: dict = {}

    def visit(x: Expr, float_parent: bool) -> None:
        coefficients = _linear(x) if float_parent and x.dtype != "bool" else None
        steps = {n: c for n, c in (coefficients or {}).items() if n in offsets and c}
        if steps:
            base = to_cuda(x, {}, "an index", at_base, sizes, loads)
            step = " + ".join(f"{c} * ({offsets[n]})" for n, c in steps.items())
            found[id(x)] = f"((float)({base}) + (float)({step}))"
            return
        parent_float = dt.is_float(x.dtype) and not isinstance(x, Load)   # indices stay int
        for child in x.children():
            visit(child, parent_float)

    visit(e, False)
    return found

