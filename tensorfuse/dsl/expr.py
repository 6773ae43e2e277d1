"""The expression tree a traced kernel is made of.

Expressions are immutable, pure Python (no TVM), and know their element type, their free axes and the
line of user code that built them. Python operators on them build new nodes; using one where Python needs
a concrete value (``if x > 0:``) is an error, since a kernel's control flow cannot depend on tensor data.
"""
from __future__ import annotations

import functools
import itertools
import math
import operator
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from . import dtypes as dt
from ..errors import AxisError, DTypeError, SourceLocation, UnsupportedConstructError

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_USER_CODE_DIRS = (os.path.join(_PACKAGE_DIR, "kernels"),)
_uid = itertools.count()


@functools.lru_cache(maxsize=4096)
def _is_internal(filename: str) -> bool:
    """Whether code in ``filename`` is tensorfuse's own (not a user's, nor the library kernels'):
    asked for every frame of the stack whenever an expression is made, so kept per file."""
    path = os.path.abspath(filename)
    if not path.startswith(_PACKAGE_DIR + os.sep):
        return False
    return not any(path.startswith(d + os.sep) for d in _USER_CODE_DIRS)


def user_location() -> SourceLocation | None:
    """The innermost frame of the call stack that is user code (not tensorfuse itself)."""
    frame = sys._getframe(1)
    while frame is not None and (_is_internal(frame.f_code.co_filename) or (
            frame.f_code.co_filename == "<string>" and frame.f_code.co_name == "__init__")):
        frame = frame.f_back  # our own code, or a dataclass __init__ generated for it
    if frame is None:
        return None
    import linecache

    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    return SourceLocation(frame.f_code.co_filename, frame.f_lineno, code)


_NUMPY_OPERATORS = {"add": operator.add, "subtract": operator.sub, "multiply": operator.mul,
                    "true_divide": operator.truediv, "divide": operator.truediv,
                    "floor_divide": operator.floordiv, "remainder": operator.mod,
                    "power": operator.pow, "negative": operator.neg, "absolute": operator.abs,
                    "less": operator.lt, "less_equal": operator.le, "greater": operator.gt,
                    "greater_equal": operator.ge, "equal": operator.eq, "not_equal": operator.ne,
                    "bitwise_and": operator.and_, "bitwise_or": operator.or_,
                    "invert": operator.invert}


# How an expression reads as DSL text: set by :mod:`.printer` when the package imports it (the
# printer reads these classes, so this module cannot import it back)
TEXT: list = []


class Expr:
    """A value defined over zero or more named axes (broadcast by name, like einsum)."""

    __slots__ = ("dtype", "axes", "loc", "uid")
    __array_priority__ = 1000  # NumPy scalars on the left defer to our operators

    def __init__(self, dtype: str, axes: Sequence["Axis"], loc: SourceLocation | None = None):
        self.dtype = dtype
        self.axes = order_axes(axes)
        self.loc = loc if loc is not None else user_location()
        self.uid = next(_uid)

    # -- structure -------------------------------------------------------------------------------
    def children(self) -> tuple["Expr", ...]:
        return ()

    def key(self) -> tuple:
        """A structural identity: equal keys mean the same computation."""
        raise NotImplementedError

    def rebuild(self, children: Sequence["Expr"]) -> "Expr":
        """A copy of this node with new children (same order as :meth:`children`)."""
        return self

    # -- Python operators ------------------------------------------------------------------------
    def __add__(self, o): return binary("add", self, o)
    def __radd__(self, o): return binary("add", o, self)
    def __sub__(self, o): return binary("sub", self, o)
    def __rsub__(self, o): return binary("sub", o, self)
    def __mul__(self, o): return binary("mul", self, o)
    def __rmul__(self, o): return binary("mul", o, self)
    def __truediv__(self, o): return binary("div", self, o)
    def __rtruediv__(self, o): return binary("div", o, self)
    def __floordiv__(self, o): return binary("floordiv", self, o)
    def __rfloordiv__(self, o): return binary("floordiv", o, self)
    def __mod__(self, o): return binary("mod", self, o)
    def __rmod__(self, o): return binary("mod", o, self)
    def __pow__(self, o): return binary("pow", self, o)
    def __rpow__(self, o): return binary("pow", o, self)
    def __and__(self, o): return binary("and", self, o)
    def __rand__(self, o): return binary("and", o, self)
    def __or__(self, o): return binary("or", self, o)
    def __ror__(self, o): return binary("or", o, self)
    def __neg__(self): return unary("neg", self)
    def __abs__(self): return unary("abs", self)
    def __invert__(self): return unary("not", self)
    def __lt__(self, o): return compare("lt", self, o)
    def __le__(self, o): return compare("le", self, o)
    def __gt__(self, o): return compare("gt", self, o)
    def __ge__(self, o): return compare("ge", self, o)
    def __eq__(self, o): return compare("eq", self, o)  # type: ignore[override]
    def __ne__(self, o): return compare("ne", self, o)  # type: ignore[override]
    __hash__ = object.__hash__

    def __bool__(self):
        raise UnsupportedConstructError(
            "a tensor value was used where Python needs True/False (an `if`, `while`, `and`, `or` "
            "or `not` on tensor data, or Python's max()/min() of two values); kernels cannot "
            "branch on data: use T.where(cond, a, b) (T.relu for max(x, 0)), and `&`, `|`, `~` to "
            "combine conditions", user_location())

    def __iter__(self):
        if isinstance(self, Axis):   # `j, = T.axes("j")`: one name gives the axis itself
            raise UnsupportedConstructError(
                f"cannot unpack axis {self.name}: T.axes with one name returns the axis itself; "
                f"write {self.name} = T.axes({self.name!r})", user_location())
        raise UnsupportedConstructError(
            "cannot iterate over a tensor expression; loops are written with axes and reductions "
            "(T.sum(x[i, j], over=j))", user_location())

    def __index__(self):
        raise UnsupportedConstructError(
            "a tensor expression cannot be used as a Python integer (e.g. in range() or a list "
            "index)", user_location())

    __int__ = __index__

    def __float__(self):
        raise UnsupportedConstructError(
            "a tensor expression cannot be turned into a Python number (math.exp, float(), ...); "
            "use the DSL's functions instead: T.exp, T.log, T.sqrt, T.tanh, T.where, ...",
            user_location())

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """NumPy scalars (``np.float32(0.5) * x[i, j]``) combine like Python numbers; NumPy's
        functions (``np.exp``) and arrays are refused with what to write instead."""
        import numpy as np

        if method == "__call__" and not kwargs and ufunc.__name__ in _NUMPY_OPERATORS:
            if any(isinstance(v, np.ndarray) for v in inputs):
                raise UnsupportedConstructError(
                    "a NumPy array cannot be combined with a tensor expression; pass it to the "
                    "kernel as a T.Tensor argument", user_location())
            values = [v.item() if isinstance(v, np.generic) else v for v in inputs]
            return _NUMPY_OPERATORS[ufunc.__name__](*values)
        raise UnsupportedConstructError(
            f"NumPy's {ufunc.__name__} cannot take a tensor expression; use the DSL's functions "
            "(T.exp, T.log, T.sqrt, T.abs, T.where, T.max(..., over=) for reductions, ...)",
            user_location())

    def __getitem__(self, item):
        raise UnsupportedConstructError(
            "only kernel parameters can be indexed; intermediate values are indexed implicitly by "
            "their axes", user_location())

    def astype(self, dtype: str) -> "Expr":
        """Convert to another element type (``x.astype("f32")``)."""
        return Cast(self, dt.canonical(dtype))

    def __repr__(self) -> str:
        return TEXT[0](self) if TEXT else f"<{type(self).__name__}>"


class Axis(Expr):
    """A named index variable. Its size comes from the tensor dimensions it indexes."""

    __slots__ = ("name", "extent")

    def __init__(self, name: str, extent: "int | str | None" = None, loc: SourceLocation | None = None):
        if not name.isidentifier():
            raise AxisError(f"axis name {name!r} is not a valid identifier", loc or user_location())
        self.name = name
        self.extent = extent
        Expr.__init__(self, "i32", (), loc)
        self.axes = (self,)

    def key(self) -> tuple:
        return ("axis", self.uid)


def order_axes(axes: Sequence[Axis]) -> tuple[Axis, ...]:
    """Axes without repeats, in the order they were declared."""
    unique = {a.uid: a for a in axes}
    return tuple(unique[k] for k in sorted(unique))


class Const(Expr):
    __slots__ = ("value",)

    def __init__(self, value, dtype: str, loc=None):
        self.value = value
        Expr.__init__(self, dtype, (), loc)

    def key(self) -> tuple:
        v = self.value
        return ("const", "nan" if isinstance(v, float) and math.isnan(v) else v, self.dtype)


class Scalar(Expr):
    """A scalar kernel parameter, given when the kernel is called."""

    __slots__ = ("name",)

    def __init__(self, name: str, dtype: str, loc=None):
        self.name = name
        Expr.__init__(self, dtype, (), loc)

    def key(self) -> tuple:
        return ("scalar", self.name)


class DimSize(Expr):
    """The size of a named dimension (``T.size("H")``), an integer known at call time."""

    __slots__ = ("name",)

    def __init__(self, name: str, loc=None):
        self.name = name
        Expr.__init__(self, "i32", (), loc)

    def key(self) -> tuple:
        return ("dim", self.name)


class Load(Expr):
    """An element of a tensor parameter, ``x[i, j]``."""

    __slots__ = ("param", "indices")

    def __init__(self, param, indices: Sequence[Expr], loc=None):
        self.param = param
        self.indices = tuple(indices)
        axes = [a for ix in self.indices for a in ix.axes]
        Expr.__init__(self, dt.compute_dtype(param.dtype), axes, loc)

    def children(self):
        return self.indices

    def key(self) -> tuple:
        return ("load", self.param.name, tuple(i.key() for i in self.indices))

    def rebuild(self, children):
        return Load(self.param, children, self.loc)


class Ref(Expr):
    """The value of a computed intermediate (a ``Compute`` of the program) at its own axes."""

    __slots__ = ("compute", "component")

    def __init__(self, compute, component: int = 0, loc=None):
        self.compute = compute
        self.component = component
        Expr.__init__(self, compute.dtypes[component], compute.axes, loc)

    def key(self) -> tuple:
        return ("ref", self.compute.name, self.component)


UNARY_OPS = ("neg", "exp", "exp2", "log", "log2", "tanh", "sqrt", "rsqrt", "sigmoid", "abs", "erf",
             "floor", "ceil", "round", "not", "sin", "cos")
FLOAT_ONLY_UNARY = ("exp", "exp2", "log", "log2", "tanh", "sqrt", "rsqrt", "sigmoid", "erf", "floor",
                    "ceil", "round", "sin", "cos")


class Unary(Expr):
    __slots__ = ("op", "a")

    def __init__(self, op: str, a: Expr, dtype: str, loc=None):
        self.op, self.a = op, a
        Expr.__init__(self, dtype, a.axes, loc)

    def children(self):
        return (self.a,)

    def key(self) -> tuple:
        return ("unary", self.op, self.a.key())

    def rebuild(self, children):
        return unary(self.op, children[0], self.loc)


BINARY_OPS = ("add", "sub", "mul", "div", "floordiv", "mod", "pow", "max", "min", "and", "or")


class Binary(Expr):
    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr, dtype: str, loc=None):
        self.op, self.a, self.b = op, a, b
        Expr.__init__(self, dtype, a.axes + b.axes, loc)

    def children(self):
        return (self.a, self.b)

    def key(self) -> tuple:
        return ("binary", self.op, self.a.key(), self.b.key())

    def rebuild(self, children):
        return binary(self.op, children[0], children[1], self.loc)


COMPARE_OPS = ("lt", "le", "gt", "ge", "eq", "ne")


class Compare(Expr):
    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr, loc=None):
        self.op, self.a, self.b = op, a, b
        Expr.__init__(self, "bool", a.axes + b.axes, loc)

    def children(self):
        return (self.a, self.b)

    def key(self) -> tuple:
        return ("compare", self.op, self.a.key(), self.b.key())

    def rebuild(self, children):
        return compare(self.op, children[0], children[1], self.loc)


class Where(Expr):
    __slots__ = ("cond", "a", "b")

    def __init__(self, cond: Expr, a: Expr, b: Expr, dtype: str, loc=None):
        self.cond, self.a, self.b = cond, a, b
        Expr.__init__(self, dtype, cond.axes + a.axes + b.axes, loc)

    def children(self):
        return (self.cond, self.a, self.b)

    def key(self) -> tuple:
        return ("where", self.cond.key(), self.a.key(), self.b.key())

    def rebuild(self, children):
        return where(*children, loc=self.loc)


class Cast(Expr):
    __slots__ = ("a",)

    def __init__(self, a: Expr, dtype: str, loc=None):
        self.a = a
        Expr.__init__(self, dtype, a.axes, loc)

    def children(self):
        return (self.a,)

    def key(self) -> tuple:
        return ("cast", self.dtype, self.a.key())

    def rebuild(self, children):
        return Cast(children[0], self.dtype, self.loc)


@dataclass(eq=False)
class ReduceSpec:
    """One reduction: a monoid folded over ``over`` axes of one body per monoid component."""

    monoid: Any
    bodies: tuple[Expr, ...]
    over: tuple[Axis, ...]
    loc: SourceLocation | None
    uid: int = -1

    def __post_init__(self):
        self.uid = next(_uid)


class Reduce(Expr):
    """Component ``index`` of the result of a reduction (most monoids have a single component)."""

    __slots__ = ("spec", "index")

    def __init__(self, spec: ReduceSpec, index: int, dtype: str):
        self.spec, self.index = spec, index
        kept = [a for b in spec.bodies for a in b.axes if all(a is not o for o in spec.over)]
        Expr.__init__(self, dtype, kept, spec.loc)

    def children(self):
        return self.spec.bodies

    def key(self) -> tuple:
        return ("reduce", self.spec.monoid.name, tuple(a.uid for a in self.spec.over),
                tuple(b.key() for b in self.spec.bodies), self.index)


# -- construction helpers with type checks ------------------------------------------------------

def as_expr(value, loc=None) -> Expr:
    """Wrap a Python number as a literal; pass expressions through."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Const(value, "bool", loc)
    if isinstance(value, int):
        return Const(value, dt.WEAK_INT, loc)
    if isinstance(value, float):
        return Const(value, dt.WEAK_FLOAT, loc)
    if hasattr(value, "dtype") and getattr(value, "shape", None) == ():  # NumPy scalar
        return as_expr(value.item(), loc)
    raise UnsupportedConstructError(
        f"cannot use a value of type {type(value).__name__} in a kernel expression; only tensor "
        "parameters, scalars, axes and Python numbers can be combined", loc or user_location())


_ARITH = ("add", "sub", "mul", "div", "pow", "max", "min")


def binary(op: str, a, b, loc=None) -> Expr:
    loc = loc or user_location()
    a, b = as_expr(a, loc), as_expr(b, loc)
    if op in ("and", "or"):
        if a.dtype != "bool" or b.dtype != "bool":
            raise DTypeError(f"`{'&' if op == 'and' else '|'}` combines conditions; got {a.dtype} "
                             f"and {b.dtype} (compare first, e.g. (i >= j) & (j > 0))", loc)
        return Binary(op, a, b, "bool", loc)
    if "bool" in (a.dtype, b.dtype):
        raise DTypeError(f"arithmetic `{op}` on a boolean value; convert it first with "
                         "T.where(cond, 1.0, 0.0) or .astype('f32')", loc)
    if op in ("div", "floordiv", "mod") and isinstance(b, Const) and b.value == 0:
        symbol = {"div": "/", "floordiv": "//", "mod": "%"}[op]
        raise DTypeError(f"division by the constant 0 (`{symbol} 0`)", loc)
    if op in ("floordiv", "mod"):
        if not (dt.is_int(a.dtype) and dt.is_int(b.dtype)):
            raise DTypeError(f"`{'//' if op == 'floordiv' else '%'}` is for integers (axis "
                             f"arithmetic); got {dt.resolve(a.dtype)} and {dt.resolve(b.dtype)}", loc)
        return Binary(op, a, b, dt.promote(a.dtype, b.dtype), loc)
    dtype = dt.promote(a.dtype, b.dtype)
    if op == "div" and dt.is_int(dtype):
        dtype = "f32" if dtype != dt.WEAK_INT else dt.WEAK_FLOAT
    if op == "pow" and dt.is_int(dtype):
        dtype = "f32"
    return Binary(op, a, b, dtype, loc)


def unary(op: str, a, loc=None) -> Expr:
    loc = loc or user_location()
    a = as_expr(a, loc)
    if op == "not":
        if a.dtype != "bool":
            raise DTypeError(f"`~` negates a condition; got a {dt.resolve(a.dtype)} value", loc)
        return Unary(op, a, "bool", loc)
    if a.dtype == "bool":
        raise DTypeError(f"{op} of a boolean value", loc)
    dtype = a.dtype
    if op in FLOAT_ONLY_UNARY and not dt.is_float(dtype):
        dtype = "f32" if dtype != dt.WEAK_INT else dt.WEAK_FLOAT
    return Unary(op, a, dtype, loc)


def compare(op: str, a, b, loc=None) -> Expr:
    loc = loc or user_location()
    a, b = as_expr(a, loc), as_expr(b, loc)
    if (a.dtype == "bool") != (b.dtype == "bool") and op not in ("eq", "ne"):
        raise DTypeError(f"cannot order a boolean against a {dt.resolve(b.dtype if a.dtype == 'bool' else a.dtype)}", loc)
    return Compare(op, a, b, loc)


def where(cond, a, b, loc=None) -> Expr:
    loc = loc or user_location()
    cond, a, b = as_expr(cond, loc), as_expr(a, loc), as_expr(b, loc)
    if cond.dtype != "bool":
        raise DTypeError(f"T.where needs a condition (a comparison), got a {dt.resolve(cond.dtype)} "
                         "value", loc)
    if (a.dtype == "bool") != (b.dtype == "bool"):
        raise DTypeError("T.where branches must both be conditions or both be numbers", loc)
    return Where(cond, a, b, dt.promote(a.dtype, b.dtype), loc)


def fresh_uid() -> int:
    return next(_uid)


def advance_uids(program) -> None:
    """Make the uids handed out from now on larger than any in ``program`` — one unpickled in
    another process (a tuning worker), whose nodes carry the uids of the process that made them;
    new nodes must not share one (walks and caches key nodes by uid)."""
    global _uid
    largest = [0]

    def visit(node):
        largest[0] = max(largest[0], node.uid)

    for compute in program.computes:
        for axis in compute.axes + compute.over:
            visit(axis)
        for body in compute.bodies:
            walk(body, visit)
    for axis in program.axes:
        visit(axis)
    start = next(_uid)
    _uid = itertools.count(max(start, largest[0] + 1))


def walk(expr: Expr, visit: Callable[[Expr], None]) -> None:
    """Call ``visit`` on every node once (post-order), following reductions into their bodies."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        node, done = stack.pop()
        if done:
            visit(node)
            continue
        if node.uid in seen:
            continue
        seen.add(node.uid)
        stack.append((node, True))
        for c in node.children():
            stack.append((c, False))


class Symbol(Expr):
    """A named placeholder value: the arguments of a monoid's combine function, or the old and new
    values of a reduction inside a derived correction."""

    __slots__ = ("name",)

    def __init__(self, name: str, dtype: str, axes: Sequence[Axis] = (), loc=None):
        self.name = name
        Expr.__init__(self, dtype, axes, loc)

    def key(self) -> tuple:
        return ("symbol", self.name)


def reads_data(index: Expr) -> bool:
    """Whether an index expression's value is data: it reads a tensor (a gather) or a value the
    kernel computes (``labels[T.argmax(…)]``, a bucket from a sum). No bound on the axes holds
    it, so the emitters clamp it into its dimension — a lane a ``T.where`` discards, or a value
    no check could see, reads inside the tensor, never past it."""
    return _reads(index, (Load, Ref))


def is_gathered(index: Expr) -> bool:
    """Whether an index expression reads a tensor: a gather, whose value is data that no bound on
    the axes holds (the emitters clamp it into its dimension; ``tensorfuse.index_checks`` checks
    it)."""
    return _reads(index, Load)


def _reads(index: Expr, kinds) -> bool:
    found = []
    walk(index, lambda n: found.append(n) if isinstance(n, kinds) else None)
    return bool(found)
