"""Index arithmetic checked against the dimensions it indexes, once per call sizes.

A tensor read at an index computed from axes — ``x[i, j + T.size("N") // 2]`` (the second half
of a row), ``x[b, 2 * o + k]`` (a pooling window), ``x[b, t - 1]`` — is in bounds only if the
axes' extents keep it there, and an axis takes its extent from the first dimension it indexes
*directly*. Written as ``a = x[i, j]; b = x[i, j + half]`` with ``j`` running over the whole row,
the second read runs past the row: on the CPU target it read the next row's values, on a GPU
memory past the tensor — a wrong result with no error.

So every read index that is neither an axis alone (bound to its dimension when traced) nor a
gather (data: :mod:`tensorfuse.index_checks`) has its range computed from the call's sizes and
refused when it leaves ``[0, size)``. The range is computed by interval arithmetic, exact where
every axis occurs once in the index (each extreme is reached by some point of the axes). A
scalar parameter in an index (``x[b, j + shift]``) takes the call's value, so such reads are
checked on every call, not once per sizes (:func:`index_scalars`). A computed value in an
index has the range of what computes it (an elementwise value's body; an argmax's position, one
of its axis's); other computed values are data, clamped by the emitters. An index that reads an
axis twice is left unchecked, as is a read under a ``T.where`` branch (its condition is the
user's guard: ``T.where(t >= k, x[b, t - k], …)``, a padded convolution's taps).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .expr import (Axis, Binary, Cast, Compare, Const, DimSize, Expr, Load, Ref, Scalar, Unary,
                   Where, is_gathered)


@dataclass(frozen=True)
class AffineRead:
    """``load``'s index ``position``: arithmetic on axes, sizes and constants."""

    load: Load
    position: int


def affine_reads(program) -> list[AffineRead]:
    """The reads of ``program`` (outside any ``T.where`` branch) whose index at some position
    is neither an axis alone nor a gather and reads each axis once: those :func:`overruns`
    bounds at a call's sizes (where :func:`index_range` does — arithmetic on axes, sizes and
    constants)."""
    found: dict[tuple, AffineRead] = {}

    def visit(e: Expr) -> None:
        if isinstance(e, Where):   # its branches are guarded by the condition
            visit(e.cond)
            return
        if isinstance(e, Load):
            for k, index in enumerate(e.indices):
                if not isinstance(index, Axis) and not is_gathered(index) and _bounded(index):
                    found.setdefault((e.param.name, k, index.key()), AffineRead(e, k))
        for child in e.children():
            visit(child)

    for c in program.computes:
        for body in c.bodies:
            visit(body)
    return list(found.values())


def index_scalars(reads: list[AffineRead]) -> tuple[str, ...]:
    """The scalar parameters ``reads``' indices read (``shift`` in ``x[b, j + shift]``): their
    ranges change with each call's values, not only with the sizes."""
    return tuple(dict.fromkeys(n.name for r in reads for n in _nodes(r.load.indices[r.position])
                               if isinstance(n, Scalar)))


def _bounded(index: Expr) -> bool:
    """Whether each axis occurs once in ``index`` (where :func:`index_range` bounds it, its
    extremes are then reached)."""
    return all(n == 1 for n in _axis_uses(index).values())


def _axis_uses(e: Expr) -> Counter:
    """How often ``index_range``'s arithmetic meets each axis in ``e``: through the computed
    values whose ranges it takes from what computes them (``x[i - d]`` with ``d = i - 1``
    reads ``i`` twice: interval arithmetic would widen it); an argmax's guarded position
    (:func:`_guarded_position`) reads its position once."""
    if isinstance(e, Axis):
        return Counter({e.uid: 1})
    if isinstance(e, Ref):
        found = _position(e)
        return Counter() if found is None else _axis_uses(found)
    guarded = _guarded_position(e)
    if guarded is not None:
        return _axis_uses(guarded)
    uses: Counter = Counter()
    for child in e.children():
        uses += _axis_uses(child)
    return uses


def _mul(a, b):
    corners = [x * y for x in a for y in b]
    return min(corners), max(corners)


def _floordiv(a, b):
    if b[0] != b[1] or b[0] <= 0:
        return None
    return a[0] // b[0], a[1] // b[0]


def _mod(a, b):
    if b[0] != b[1] or b[0] <= 0:
        return None
    m = b[0]
    if a[0] >= 0 and a[1] < m:
        return a
    # the range wraps or spans a whole period: both 0 and m - 1 are reached
    return (a[0] % m, a[1] % m) if a[0] // m == a[1] // m else (0, m - 1)


_OPS = {"add": lambda a, b: (a[0] + b[0], a[1] + b[1]),
        "sub": lambda a, b: (a[0] - b[1], a[1] - b[0]),
        "mul": _mul, "floordiv": _floordiv, "mod": _mod,
        "max": lambda a, b: (max(a[0], b[0]), max(a[1], b[1])),
        "min": lambda a, b: (min(a[0], b[0]), min(a[1], b[1]))}


def index_range(index: Expr, axis_sizes: dict, dims: dict,
                scalars: dict | None = None) -> tuple[int, int] | None:
    """The smallest and largest value of ``index`` over its axes (``axis_sizes``: extent by
    axis uid) at the call's ``scalars`` (name → value), or None where this module does not
    bound it (a scalar not given: code made for sizes alone)."""
    if isinstance(index, Axis):
        return 0, axis_sizes[index.uid] - 1
    if isinstance(index, Const):
        return int(index.value), int(index.value)
    if isinstance(index, DimSize):
        return dims[index.name], dims[index.name]
    if isinstance(index, Scalar):
        value = (scalars or {}).get(index.name)
        return None if not isinstance(value, int) else (value, value)
    if isinstance(index, Ref):
        found = _position(index)
        return None if found is None else index_range(found, axis_sizes, dims, scalars)
    if isinstance(index, Where) and _guarded_position(index) is not None:
        a = index_range(index.a, axis_sizes, dims, scalars)   # a constant, or the position
        b = index_range(index.b, axis_sizes, dims, scalars)
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    if isinstance(index, Cast):
        return index_range(index.a, axis_sizes, dims, scalars)
    if isinstance(index, Unary) and index.op == "neg":
        inner = index_range(index.a, axis_sizes, dims, scalars)
        return None if inner is None else (-inner[1], -inner[0])
    if isinstance(index, Binary) and index.op in _OPS:
        a = index_range(index.a, axis_sizes, dims, scalars)
        b = index_range(index.b, axis_sizes, dims, scalars)
        return None if a is None or b is None else _OPS[index.op](a, b)
    return None


def _position(ref: Ref) -> Expr | None:
    """The expression a computed value's range is that of: an elementwise value's body, or the
    positions an argmax's or argmin's index component is one of (``T.argmax(x[b, c], over=c)``
    is one of the ``c`` it reduced over; a row where nothing beat the identity is given the
    first, inside them too); else None (another computed value: data, which the emitters clamp
    into the dimension)."""
    c = ref.compute
    if c.monoid is None:
        return c.bodies[ref.component]
    if ref.component == 1 and c.monoid.name in ("argmax", "argmin"):
        return c.bodies[1]
    return None


def _guarded_position(e: Expr) -> Ref | None:
    """The argmax's or argmin's position ``r`` where ``e`` is ``T.argmax``'s guard on it,
    ``where(r == identity, constant, r)`` (a row where nothing beat the identity gets the
    constant): its value is the constant or one of the positions — a select, not arithmetic
    on ``r`` twice. Else None."""
    if not isinstance(e, Where) or not isinstance(e.cond, Compare) or e.cond.op != "eq":
        return None
    r = e.cond.a
    if not (isinstance(r, Ref) and _position(r) is not None and isinstance(e.cond.b, Const)
            and isinstance(e.a, Const) and isinstance(e.b, Ref) and e.b.key() == r.key()):
        return None
    return r


def overruns(program, reads: list[AffineRead], axis_sizes: dict, dims: dict,
             scalars: dict | None = None) -> list[str]:
    """What each of ``reads`` reaches outside its dimension at these sizes and ``scalars``, said
    for the user (the read, the range, the axes' extents and scalars' values, and the two ways
    to write it)."""
    from .printer import to_text

    problems = []
    for r in reads:
        index = r.load.indices[r.position]
        found = index_range(index, axis_sizes, dims, scalars)
        dim = r.load.param.dims[r.position]
        size = dim if isinstance(dim, int) else dims[dim]
        if found is None or (found[0] >= 0 and found[1] < size):
            continue
        axes = sorted({a.uid: a for a in _axes(index)}.values(), key=lambda a: a.name)
        read = f"{r.load.param.name}[{', '.join(to_text(i) for i in r.load.indices)}]"
        where = f"{read} reads dimension {r.position} of {r.load.param.name} ({dim}={size})"
        names = index_scalars([r])
        given = [f"{n} = {scalars[n]}" for n in names]
        computed = sorted({n.compute.name for n in _nodes(index) if isinstance(n, Ref)})
        if computed:   # the positions an argmax found, arithmetic on them
            values = ", ".join([f"{n}: computed in the kernel" for n in computed] + given)
            problems.append(
                f"{program.name}: {where} at {to_text(index)}, which can be {found[0]}…"
                f"{found[1]} ({values}), outside 0…{size - 1}. Keep the index inside the "
                "dimension (T.minimum, T.maximum) or read it under T.where(condition, ..., "
                "fill) where it is inside")
            continue
        if not axes:   # a constant index (a slice of a packed tensor: qkv[..., 2, ...])
            at = f" ({', '.join(given)})" if given else ""
            problems.append(f"{program.name}: {where} at {found[0]}{at}, outside 0…{size - 1}")
            continue
        extents = ", ".join([f"{a.name} over 0…{axis_sizes[a.uid] - 1}" for a in axes] + given)
        advice = f"Call it with {' and '.join(names)} keeping the index inside, declare" \
            if names else "Declare"
        problems.append(
            f"{program.name}: {where} at {to_text(index)} = {found[0]}…{found[1]}, outside "
            f"0…{size - 1} ({extents}: an axis takes the size of the first dimension it indexes "
            f"alone). {advice} the axis with the extent it runs over (T.axis(name, size "
            "expression)), or read it under T.where(condition, ..., fill) where the index is "
            "inside")
    return problems


def _nodes(e: Expr):
    """Every node of ``e`` (not following a computed value into its compute)."""
    yield e
    for child in e.children():
        yield from _nodes(child)


def _axes(e: Expr):
    """Every axis ``e`` reads, as often as it reads it."""
    return (n for n in _nodes(e) if isinstance(n, Axis))
