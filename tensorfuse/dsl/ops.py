"""The functions a kernel is written with: axes, elementwise math, reductions."""
from __future__ import annotations

import functools
import math

from . import dtypes as dt
from . import monoid as monoids
from .expr import (Axis, DimSize, Expr, Reduce, ReduceSpec, as_expr, binary, compare, unary,
                   user_location, where as _where, Cast)
from .monoid import Monoid
from ..errors import AxisError, DSLError, DTypeError

inf = math.inf


def axes(names: str) -> tuple[Axis, ...] | Axis:
    """Declare index variables: ``i, j, d = T.axes("i j d")``. Their sizes come from the tensor
    dimensions they index; their order is the order of an output's dimensions."""
    loc = user_location()
    parts = names.replace(",", " ").split()
    if not parts:
        raise AxisError("T.axes needs at least one name", loc)
    dupes = sorted({p for p in parts if parts.count(p) > 1})
    if dupes:
        raise AxisError(f"axis {dupes[0]} is declared twice", loc)
    made = tuple(Axis(p, None, loc) for p in parts)
    return made if len(made) > 1 else made[0]


def axis(name: str, extent: "int | str | Expr") -> Axis:
    """Declare one index variable with an explicit size, for axes that never index a tensor
    dimension directly: an integer, a dimension name, or an integer expression of named sizes
    — a size the kernel derives, named as the axis upper-cased: ``T.axis("o", (T.size("L") - 3)
    // 2 + 1)`` is a pooled length ``O`` (a window of 3, stride 2), computed at each call from
    the tensors' sizes (a tensor dimension named ``O`` must then have that size). Where that
    name is one the expression reads — an upsampled ``T.axis("h", T.size("H") * 2)`` — the size
    is ``H_`` (a size is no function of itself)."""
    loc = user_location()
    if isinstance(extent, Expr) and not isinstance(extent, Axis):
        from .program import derive_size, size_names

        if not name.isidentifier():
            raise AxisError(f"axis {name!r}: a derived size is named after its axis, which must "
                            "be an identifier", loc)
        derived, read = name.upper(), set(size_names(extent))
        while derived in read:
            derived += "_"
        return Axis(name, derive_size(derived, extent, loc), loc)
    if isinstance(extent, bool) or not isinstance(extent, (int, str)) or (
            isinstance(extent, int) and extent <= 0):
        raise AxisError(f"axis {name}: size must be a positive integer, a dimension name or an "
                        f"integer expression of T.size(...), got {extent!r}", loc)
    return Axis(name, extent, loc)


def size(dim: str) -> Expr:
    """The size of a named dimension as an integer value, e.g. ``T.size("H") // T.size("HKV")``."""
    if not isinstance(dim, str) or not dim.isidentifier():
        raise DSLError(f"T.size takes a dimension name, got {dim!r}", user_location())
    return DimSize(dim)


# -- elementwise ---------------------------------------------------------------------------------

def exp(x) -> Expr: return unary("exp", x)
def exp2(x) -> Expr: return unary("exp2", x)
def log(x) -> Expr: return unary("log", x)
def log2(x) -> Expr: return unary("log2", x)
def tanh(x) -> Expr: return unary("tanh", x)
def sqrt(x) -> Expr: return unary("sqrt", x)
def rsqrt(x) -> Expr: return unary("rsqrt", x)
def sigmoid(x) -> Expr: return unary("sigmoid", x)
def erf(x) -> Expr: return unary("erf", x)
def floor(x) -> Expr: return unary("floor", x)
def ceil(x) -> Expr: return unary("ceil", x)
def round(x) -> Expr:   # noqa: A001 - T.round, as torch.round: to the nearest, halves to even
    return unary("round", x)
def sin(x) -> Expr: return unary("sin", x)
def cos(x) -> Expr: return unary("cos", x)


def abs(x) -> Expr:  # noqa: A001 - the DSL mirrors the math name
    return unary("abs", x)


def where(cond, a, b) -> Expr:
    """``a`` where ``cond`` holds, else ``b`` (elementwise, broadcast by axes)."""
    return _where(cond, a, b)


def cast(x, dtype: str) -> Expr:
    """Convert ``x`` to ``dtype`` (e.g. to store an output in f32)."""
    return Cast(as_expr(x), dt.canonical(dtype))


def gelu(x) -> Expr:
    """GELU with the tanh approximation (as in GPT-2 and ``torch.nn.GELU(approximate="tanh")``)."""
    x = as_expr(x)
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def relu(x) -> Expr:
    """ReLU: ``x`` where it is positive, else 0 (written as a ``where``, so every target that
    lowers ``where`` lowers it)."""
    x = as_expr(x)
    return _where(x > 0.0, x, 0.0)


def silu(x) -> Expr:
    """SiLU (swish): ``x * sigmoid(x)``."""
    return x * sigmoid(x)


# -- reductions ----------------------------------------------------------------------------------

def _axes_given_as_over(fn):
    """A reduction takes the axes it folds as ``over=``: NumPy's ``axis=`` and torch's ``dim=``
    get that said, at the user's line, rather than Python's bare "unexpected keyword"."""
    @functools.wraps(fn)
    def reduction(*args, **kwargs):
        for alias in ("axis", "axes", "dim", "dims"):
            if alias in kwargs:
                raise DSLError(f"T.{fn.__name__} takes the axes it reduces as over= (e.g. "
                               f"T.{fn.__name__}(x, over=(h, w))), not {alias}=",
                               user_location())
        return fn(*args, **kwargs)
    return reduction


def _over_axes(over, loc) -> tuple[Axis, ...]:
    over = over if isinstance(over, (tuple, list)) else (over,)
    if not over:
        raise AxisError("a reduction needs at least one axis in over=", loc)
    for a in over:
        if not isinstance(a, Axis):
            raise AxisError(f"over= takes axes declared with T.axes, got {a!r}", loc)
    names = [a.name for a in over]
    if len(set(a.uid for a in over)) != len(over):
        raise AxisError(f"over= names an axis twice: {names}", loc)
    return tuple(over)


@_axes_given_as_over
def reduce(values, over, monoid: Monoid) -> Expr | tuple[Expr, ...]:
    """Fold ``values`` over the axes ``over`` with ``monoid``. A monoid of several components takes a
    tuple of values and returns a tuple of results."""
    loc = user_location()
    if not isinstance(monoid, Monoid):
        raise DSLError(f"monoid= must be a T.Monoid, got {monoid!r}", loc)
    values = values if isinstance(values, (tuple, list)) else (values,)
    if len(values) != monoid.arity:
        raise DSLError(f"monoid {monoid.name!r} reduces {monoid.arity} values at once, got "
                       f"{len(values)}", loc)
    bodies = tuple(as_expr(v, loc) for v in values)
    over_axes = _over_axes(over, loc)
    body_axes = {a.uid for b in bodies for a in b.axes}
    for a in over_axes:
        if a.uid not in body_axes:
            present = ", ".join(x.name for b in bodies for x in b.axes) or "none"
            raise AxisError(f"cannot reduce over axis {a.name}: the value being reduced does not "
                            f"depend on it (its axes: {present})", loc)
    for b in bodies:
        if b.dtype == "bool" and monoid.name not in ("max", "min"):
            raise DTypeError(f"{monoid.name} of a condition; convert it first, e.g. "
                             "T.where(cond, 1.0, 0.0)", loc)
    resolved = [dt.resolve(b.dtype) for b in bodies]
    spec = ReduceSpec(monoid, bodies, over_axes, loc)
    out_dtypes = monoid.dtypes_for(resolved)
    results = tuple(Reduce(spec, k, out_dtypes[k]) for k in range(monoid.arity))
    return results if monoid.arity > 1 else results[0]


@_axes_given_as_over
def sum(x, over) -> Expr:  # noqa: A001
    """Sum of ``x`` over the axes ``over``."""
    return reduce(x, over, monoids.SUM)


@_axes_given_as_over
def mean(x, over) -> Expr:
    """Mean of ``x`` over the axes ``over``: their sum divided by how many elements they span
    (a size known at call time where an axis's is), in float32 for integer ``x``."""
    loc = user_location()
    over_axes = _over_axes(over, loc)
    total = sum(x, over_axes)
    count = None
    for a in over_axes:
        if a.extent is None:   # read as a value, never an index: nothing gives its size
            raise AxisError(f"T.mean over axis {a.name}, whose size is not known: index a "
                            f"tensor with it or give it one (T.axis({a.name!r}, 16))", loc)
        n = a.extent if isinstance(a.extent, int) else DimSize(a.extent, loc)
        count = n if count is None else binary("mul", count, n)
    if not dt.is_float(total.dtype):
        total = Cast(total, "f32")
    return binary("div", total, Cast(as_expr(count, loc), "f32"))


@_axes_given_as_over
def prod(x, over) -> Expr:
    """Product of ``x`` over the axes ``over``."""
    return reduce(x, over, monoids.PROD)


@_axes_given_as_over
def logsumexp(x, over) -> Expr:
    """``log(sum(exp(x)))`` over the axes ``over``, computed stably as one monoid."""
    return reduce(x, over, monoids.LOGSUMEXP)


@_axes_given_as_over
def max(x, y=None, *, over=None) -> Expr:  # noqa: A001
    """``T.max(x, over=j)``: maximum over axes; ``T.max(a, b)``: elementwise maximum."""
    return _extremum("max", monoids.MAX, x, y, over)


@_axes_given_as_over
def min(x, y=None, *, over=None) -> Expr:  # noqa: A001
    """``T.min(x, over=j)``: minimum over axes; ``T.min(a, b)``: elementwise minimum."""
    return _extremum("min", monoids.MIN, x, y, over)


def _extremum(op, monoid, x, y, over):
    if over is not None and y is not None:
        raise DSLError(f"T.{op} takes either two values (elementwise) or one value and over=",
                       user_location())
    if over is not None:
        return reduce(x, over, monoid)
    if y is None:
        raise DSLError(f"T.{op}(x) needs over=axis, or a second value for the elementwise {op}",
                       user_location())
    return binary(op, x, y)


def maximum(a, b) -> Expr:
    """Elementwise maximum, ``T.max(a, b)`` (spelled as torch and NumPy spell it)."""
    return _extremum("max", monoids.MAX, a, b, None)


def minimum(a, b) -> Expr:
    """Elementwise minimum, ``T.min(a, b)`` (spelled as torch and NumPy spell it)."""
    return _extremum("min", monoids.MIN, a, b, None)


def clamp(x, low=None, high=None) -> Expr:
    """``x`` kept between ``low`` and ``high`` (either may be None: no bound on that side), as
    ``torch.clamp``: ``min(max(x, low), high)`` — ``high`` wins where ``low > high``."""
    if low is None and high is None:
        raise DSLError("T.clamp needs low=, high= or both", user_location())
    x = x if low is None else maximum(x, low)
    return x if high is None else minimum(x, high)


@_axes_given_as_over
def argmax(x, over) -> Expr:
    """Index along ``over`` of the largest value; ties go to the smallest index. Over several
    axes, the index of the element in the block they span read row-major (the first axis
    outermost): ``torch.argmax`` of the block flattened, e.g. a heatmap's peak ``h · W + w``."""
    return _arg(x, over, monoids.ARGMAX)[1]


@_axes_given_as_over
def argmin(x, over) -> Expr:
    """Index along ``over`` of the smallest value; ties go to the smallest index (several axes:
    as :func:`argmax`)."""
    return _arg(x, over, monoids.ARGMIN)[1]


@_axes_given_as_over
def max_argmax(x, over) -> tuple[Expr, Expr]:
    """Largest value and its index along ``over`` (several axes: as :func:`argmax`), found in
    one pass."""
    return _arg(x, over, monoids.ARGMAX)


def _arg(x, over, monoid):
    loc = user_location()
    over_axes = _over_axes(over, loc)
    index = over_axes[0]
    for a in over_axes[1:]:   # row-major: each later axis varies faster
        if a.extent is None:
            raise AxisError(f"{monoid.name} over several axes numbers the elements row-major, "
                            f"so axis {a.name}'s size must be known: index a tensor with it "
                            f"before reducing", loc)
        index = index * (size(a.extent) if isinstance(a.extent, str) else a.extent) + a
    value, found = reduce((x, index), over_axes, monoid)
    # no element beat the pair's identity (every value −∞ or NaN: the identity's value is the
    # lowest finite one): the first index, as torch.argmax gives — never the identity's index,
    # out of the range, which a gather with it would read past
    none = monoid.identity_value(1, found.dtype)
    return value, _where(compare("eq", found, none, loc), 0, found, loc)
