"""A traced kernel: parameters, the computes that define intermediate and output values, and the axes.

A ``Program`` is the data flow graph the rest of tensorfuse works on. Each ``Compute`` defines one named
value over its axes, either elementwise or as a reduction with a monoid, and remembers the line of the
user's code it came from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from . import dtypes as dt
from .expr import Axis, DimSize, Expr, Load, Ref, as_expr, binary, user_location, walk
from ..errors import AxisError, DTypeError, ShapeError, SourceLocation


@dataclass(eq=False)
class TensorParam:
    """A tensor argument of a kernel. Indexing it with axes (``x[i, j]``) reads one element."""

    name: str
    dims: tuple
    dtype: str
    loc: SourceLocation | None = None

    @property
    def rank(self) -> int:
        return len(self.dims)

    def __getitem__(self, index) -> Load:
        loc = user_location()
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != self.rank:
            raise ShapeError(f"{self.name} has {self.rank} dimensions ({_dims_text(self.dims)}) but "
                             f"is indexed with {len(index)}", loc)
        exprs = [as_expr(ix, loc) for ix in index]
        seen: dict[int, int] = {}
        for position, ix in enumerate(exprs):
            if not dt.is_int(ix.dtype):
                raise DTypeError(f"index {position} of {self.name} is a {dt.resolve(ix.dtype)} value; "
                                 "indices must be integers (axes, axis arithmetic or integer lookups)",
                                 loc)
            if isinstance(ix, Axis):
                if ix.uid in seen:
                    raise AxisError(f"axis {ix.name} is used twice in one access to {self.name} "
                                    f"(positions {seen[ix.uid]} and {position}); declare a second "
                                    "axis for the second dimension", loc)
                seen[ix.uid] = position
                if _bind_extent(ix, self.dims[position], f"dimension {position} of {self.name}",
                                loc):
                    # an axis declared over part of the dimension reads its first part: index
                    # arithmetic, checked against the dimension at each call's sizes
                    # (``index_bounds``), never taken by the templates for the whole dimension
                    exprs[position] = binary("add", ix, 0)
        return Load(self, exprs, loc)

    def __repr__(self) -> str:
        return f"{self.name}: T.Tensor[{_dims_text(self.dims)}, {self.dtype!r}]"


@dataclass(eq=False)
class ScalarParam:
    name: str
    dtype: str
    loc: SourceLocation | None = None


def _dims_text(dims) -> str:
    return ", ".join(repr(d) for d in dims)


def _bind_extent(axis: Axis, dim, where: str, loc) -> bool:
    """Give ``axis`` the size of ``dim``, or complain when it already has a different one that
    an earlier dimension gave it. True where the axis was declared with a size of its own
    (``T.axis("j", T.size("N") // 2)``) that is not the dimension's: it reads part of it."""
    if axis.extent is None:
        axis.extent = dim
        axis_binding_sites[axis.uid] = (where, loc)
        return False
    if axis.extent == dim:
        return False
    declared = axis.uid not in axis_binding_sites
    if declared and type(axis.extent) is type(dim):
        return True
    first_where, first_loc = axis_binding_sites.get(axis.uid, ("its declaration", axis.loc))
    if isinstance(axis.extent, int) and isinstance(dim, int) or (
            isinstance(axis.extent, str) and isinstance(dim, str)):
        raise ShapeError(f"axis {axis.name} indexes {where} (size {dim!r}) here, but {first_where} "
                         f"(size {axis.extent!r}) at {first_loc}; these sizes differ. If they are "
                         "really the same size, give the dimensions the same name", loc)
    # one named, one fixed: the name must take that value at call time
    axis_size_constraints.append((axis.extent, dim, loc))
    return False


# Bookkeeping of the trace in progress (reset by the tracer for each kernel).
axis_binding_sites: dict[int, tuple[str, SourceLocation | None]] = {}
axis_size_constraints: list[tuple] = []

# the integer operations a derived size may use, as Python computes them on the sizes' values
SIZE_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
            "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
            "max": max, "min": min}


def derive_size(name: str, expr: Expr, loc) -> str:
    """Record that size ``name`` is ``expr``, an integer expression of other sizes and integer
    constants (a pooled length ``(L − 3) // 2 + 1``): the call computes it from the sizes its
    tensors bind, and where a tensor has a dimension of that name too, its size must equal it
    (``Program.fixed_size_conflicts``). Returns ``name``."""
    from .expr import Binary, Const

    def check(e):
        if isinstance(e, DimSize) or (isinstance(e, Const) and isinstance(e.value, int)
                                      and not isinstance(e.value, bool)):
            return
        if isinstance(e, Binary) and e.op in SIZE_OPS:
            check(e.a)
            check(e.b)
            return
        raise AxisError(f"the size of axis {name.lower()} must be an integer expression of "
                        f"T.size(...) and integers (+, -, *, //, %, T.maximum, T.minimum); "
                        f"{type(e).__name__} is not one", loc)
    check(expr)
    if not size_names(expr):
        raise AxisError(f"the size of axis {name.lower()} reads no T.size(...): give the number "
                        "itself", loc)
    axis_size_constraints.append((name, expr, loc))
    return name


def size_names(expr: Expr) -> list[str]:
    """The named sizes ``expr`` reads (``T.size(...)``), each once, in order."""
    names: dict[str, None] = {}
    walk(expr, lambda n: names.setdefault(n.name) if isinstance(n, DimSize) else None)
    return list(names)


def torch_symbolic(value) -> str | None:
    """``"SymInt"``, ``"SymFloat"`` or ``"SymBool"`` where ``value`` is one of torch's symbolic
    numbers (what ``torch.compile(dynamic=True)`` hands a fake implementation as a size or a
    scalar), else None — without importing torch here."""
    kind = type(value)
    return kind.__name__ if kind.__module__.startswith("torch") and \
        kind.__name__ in ("SymInt", "SymFloat", "SymBool") else None


def size_value(expr: Expr, dims: dict) -> int | None:
    """``expr`` (a derived size's expression) computed from ``dims``; None where it reads a
    size ``dims`` lacks."""
    from .expr import Binary, Const

    if isinstance(expr, DimSize):
        value = dims.get(expr.name)
        integral = isinstance(value, int) or torch_symbolic(value) == "SymInt"
        return value if integral and not isinstance(value, bool) else None
    if isinstance(expr, Const):
        return int(expr.value)
    if isinstance(expr, Binary):
        a, b = size_value(expr.a, dims), size_value(expr.b, dims)
        if a is None or b is None:
            return None
        if expr.op in ("floordiv", "mod") and b == 0:
            return None
        return SIZE_OPS[expr.op](a, b)
    return None


@dataclass(eq=False)
class Compute:
    """One named value: ``bodies[0]`` elementwise, or a reduction of ``bodies`` with ``monoid``."""

    name: str
    axes: tuple[Axis, ...]
    bodies: tuple[Expr, ...]
    dtypes: tuple[str, ...]
    monoid: object = None
    over: tuple[Axis, ...] = ()
    loc: SourceLocation | None = None
    is_output: bool = False

    @property
    def is_reduction(self) -> bool:
        return self.monoid is not None

    @property
    def arity(self) -> int:
        return len(self.dtypes)

    def buffer_names(self) -> list[str]:
        """Names of the buffers holding each component."""
        if self.arity == 1:
            return [self.name]
        return [f"{self.name}_{i}" for i in range(self.arity)]

    def ref(self, component: int = 0) -> Ref:
        return Ref(self, component, self.loc)

    def inputs(self) -> list["Compute"]:
        """Computes this one reads, in first-use order."""
        found: dict[str, Compute] = {}

        def visit(node):
            if isinstance(node, Ref):
                found.setdefault(node.compute.name, node.compute)

        for b in self.bodies:
            walk(b, visit)
        return list(found.values())


@dataclass(eq=False)
class Program:
    """A whole kernel: parameters in call order, computes in dependency order, and outputs."""

    name: str
    params: list
    computes: list[Compute]
    outputs: list[Compute]
    axes: list[Axis]
    size_constraints: list = field(default_factory=list)
    loc: SourceLocation | None = None

    @property
    def tensor_params(self) -> list[TensorParam]:
        return [p for p in self.params if isinstance(p, TensorParam)]

    @property
    def scalar_params(self) -> list[ScalarParam]:
        return [p for p in self.params if isinstance(p, ScalarParam)]

    def dim_names(self) -> list[str]:
        """Every named dimension, in order of first appearance (found once per set of parameters
        and bodies: every call at a new size asks, and the walk over the bodies took a fifth of a
        Hopper attention's planning at a new prompt length)."""
        named = (tuple(self.params), tuple((c, tuple(c.bodies)) for c in self.computes))
        key = (tuple(map(id, named[0])), tuple((id(c), tuple(map(id, b))) for c, b in named[1]))
        found = self.__dict__.get("_dim_names")
        if found is None or found[0] != key:
            # the objects are kept with their ids: a freed body's id could be a new body's
            found = self.__dict__["_dim_names"] = (key, tuple(self._find_dim_names()), named)
        return list(found[1])

    def _find_dim_names(self) -> list[str]:
        names: dict[str, None] = {}
        for p in self.tensor_params:
            for d in p.dims:
                if isinstance(d, str):
                    names.setdefault(d)
        for c in self.computes:
            for b in c.bodies:
                walk(b, lambda n: names.setdefault(n.name) if isinstance(n, DimSize) else None)
        for name in self.derived_sizes():   # after the sizes they are computed from
            names.setdefault(name)
        return list(names)

    def derived_sizes(self) -> dict[str, Expr]:
        """Sizes the kernel computes from others (``T.axis("o", (T.size("L") - 3) // 2 + 1)``):
        name → its expression, in the order they were declared."""
        return {name: expr for name, expr, _ in self.size_constraints if isinstance(expr, Expr)}

    def with_derived_sizes(self, dims: dict) -> dict:
        """``dims`` and every derived size it lacks whose inputs it has, computed."""
        derived = self.derived_sizes()
        if not derived:
            return dims
        dims = dict(dims)
        for name, expr in derived.items():
            if name not in dims:
                value = size_value(expr, dims)
                if value is not None:
                    dims[name] = value
        return dims

    def fixed_size_conflicts(self, dims: dict) -> list[str]:
        """Sizes in ``dims`` that differ from a size the kernel fixes by how it uses them, or
        from a size it derives from the others (or a derived size that is not positive)."""
        from .printer import to_text

        conflicts = []
        for name, fixed, where_ in self.size_constraints:
            if isinstance(fixed, Expr):   # derived: from the other sizes
                value = size_value(fixed, dims)
                if value is None:
                    continue
                text = f"{to_text(fixed)} = {value}"
                if value < 1:
                    conflicts.append(f"size {name} = {text} at " + ", ".join(
                        f"{n}={dims[n]}" for n in size_names(fixed) if n in dims)
                        + f": it must be positive (declared at {where_})")
                elif name in dims and dims[name] != value:
                    conflicts.append(f"size {name} is {dims[name]} here, but the kernel derives "
                                     f"it as {text} (at {where_})")
                continue
            if isinstance(name, int):
                name, fixed = fixed, name
            if name in dims and dims[name] != fixed:
                conflicts.append(f"size {name} is {dims[name]} here, but the kernel uses it as "
                                 f"size {fixed} (at {where_})")
        return conflicts

    def size_problems(self, dims: dict, complete: bool) -> str | None:
        """What is wrong with sizes given by name, where no arrays give them (schedules, tuning
        jobs, generated code for inspection), or ``None``: names this kernel does not have (a
        typo would otherwise be ignored), missing names when ``complete``, values that are not
        positive integers, and values the kernel fixes otherwise."""
        names = self.dim_names()
        given = set(dims)
        dims = self.with_derived_sizes(dims)   # derived ones need not be given
        problems = []
        unknown = [d for d in dims if d not in names]
        if unknown:
            problems.append(f"{self.name} has no size named {', '.join(unknown)}")
        missing = [d for d in names if d not in dims] if complete else []
        if missing:
            plural = "s" if len(missing) > 1 else ""
            problems.append(f"size{plural} {', '.join(missing)} not given")
        bad = [f"{d}={v!r}" for d, v in dims.items() if d in given and (
            isinstance(v, bool) or not isinstance(v, int) or v < 1)]
        if bad:
            problems.append(f"sizes must be positive integers, got {', '.join(bad)}")
        problems += self.fixed_size_conflicts(dims)
        if not problems:
            return None
        return "; ".join(problems) + f" (its sizes: {', '.join(names)})"

    def compute(self, name: str) -> Compute:
        for c in self.computes:
            if c.name == name:
                return c
        raise KeyError(name)

    def consumers(self, compute: Compute) -> list[Compute]:
        return [c for c in self.computes if any(i is compute for i in c.inputs())]

    def __repr__(self) -> str:
        from .printer import program_text

        return program_text(self)


class TracedKernel(Protocol):
    """What the compiler's entry points need of a ``@tensorfuse.kernel``: its name, function and
    traced program (the decorator's class, ``tensorfuse.Kernel``, is one)."""

    name: str
    fn: Callable
    program: Program


def fresh_name(hint: str, taken: set) -> str:
    """``hint``, or ``hint_2``, ``hint_3``, … — the first not in ``taken`` (which it joins): a
    name for a compute or parameter a rewrite adds to a program."""
    name, k = hint, 1
    while name in taken:
        k += 1
        name = f"{hint}_{k}"
    taken.add(name)
    return name


def is_kernel(obj) -> bool:
    """Whether ``obj`` is a traced kernel (``@tensorfuse.kernel``): anything that carries its
    :class:`Program`. The compiler's entry points check this instead of importing the decorator's
    class, which itself calls them (``kernel(...)`` compiles on first use)."""
    return isinstance(getattr(obj, "program", None), Program) and hasattr(obj, "fn")


class ProgramKernel:
    """A program standing for its kernel where no function was traced — a stage of the floor, a
    flat sweep's program, a program derived from another (autograd's forward with its
    log-sum-exp): what ``tf.compile``, tuning and autograd read of a kernel (:func:`is_kernel`).
    ``tuned_as``: the program whose tuning records it uses, where it is derived from another."""

    def __init__(self, program: Program, fn=None, tuned_as: "Program | None" = None):
        self.program, self.fn, self.name = program, fn, program.name
        self.tuned_as = tuned_as
