"""The contraction plan: a program whose sums are products of a rows operand and a columns
operand over one axis, as tensor-core GEMM tiles (the Triton source:
:mod:`tensorfuse.targets.triton.contraction`).

The row-tile template sweeps one output row at a time and multiplies elementwise on the CUDA
cores; it is right for rows and attention chains, and wrong for a GEMM, where every row of a tile
must share each block of the other operand (a 4096³ matmul ran as rows on every GPU but the
H100's native template, and a weight gradient of SwiGLU's backward on TVM's default schedule).
:func:`plan_contraction` reads, by the roles of the axes and not their places in the tensors:

- the **contracted** axis ``k``: what every sum runs over — several axes (a weight gradient
  over a batch's tokens, ``over=(b, s)``) are swept as one index, the outermost first;
- the **rows** axis ``r`` and the **columns** axis ``c``: output axes such that each sum's
  factors split into a rows side (reading ``r`` and ``k``, never ``c``) and a columns side
  (``c`` and ``k``, never ``r``); ``c`` is the output's innermost axis that allows it, so that
  the stores run along memory;
- **batch** axes: the output's others (the grid's second dimension), read by either side.

A sum, maximum or minimum whose body is no such product but whose loads each read the rows or
the columns, never both — ``Σ_d (x[i, d] − y[j, d])²``, ``max_d |x[i, d] − y[j, d]|``, a
max-plus product ``max_k a[i, k] + b[k, j]`` — is a **pairwise** reduction
(:class:`PairwiseReduction`): the same tiles, each block of the contracted axis loaded once per
tile and the body computed on the CUDA cores for every (row, column) pair, in f32. A row kernel
would read both rows' operands again for every output element (squared distances of 4096 × 4096
points in 128 dimensions: 0.86 ms as rows, ``benchmarks.unlisted_kernels``).

Each side is any elementwise expression of loads (a stored activation's derivative, a scale), with
the tensors indexed through their own strides — ``x[i, k]`` as the rows side of ``out[k, n]`` is
read transposed, without a copy. Several sums over the same axes share the tile loop, each its own
accumulator (a gated pair's two projections); the outputs are elementwise functions of the sums
and of loads at the output's indices (a bias, a residual), computed on the accumulators.

Precision: factors that read no contracted axis (a scale, a per-row or per-column factor) leave
the sum and multiply the accumulator once; where a side is a load of a 16-bit float it enters
the tensor cores as it is stored;
8-bit integers (a quantised weight) enter as the other side's type, exactly;
a computed side, or an f32 load, multiplied with a 16-bit side is rounded to that type (as
``torch.autocast`` rounds an operand, and as PyTorch's own backward stores the activation
gradients it multiplies); two f32 sides multiply in f32 (IEEE, not TF32). Products accumulate in
f32. :meth:`ContractionPlan.describe` says which sides are rounded.

A computed side is read again by every tile along the other side's free axis: SwiGLU's
gate-weight gradient, whose columns side is computed from two f32 tensors, re-read them for
each of 32 row blocks and ran at 0.4× eager (``benchmarks.contraction``). Its plan therefore
has a **staged** form (:attr:`ContractionPlan.staging`): each computed side stored once, in the
tensor cores' type, by a kernel of its own, the GEMM then reading it as a load — as eager
autograd stores the activation gradient, and rounded exactly as the tile rounds it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import reduce

from ..algebra import inline_elementwise
from ..algebra.exprs import factors, finite_shift, has_axis, mul, nodes, substitute
from ..dsl import dtypes as dt
from ..dsl.expr import Axis, Binary, Cast, Expr, Load, Ref, Unary, Where, is_gathered
from ..dsl.printer import to_text
from ..dsl.program import Compute, Program, TensorParam
from ..errors import ScheduleError
from .scan import is_scan

WHO = "contraction template"
PAIRWISE_MONOIDS = ("sum", "max", "min")
# reductions over the columns may also keep the index of the extremum (a nearest centroid, a
# codebook entry, the best-scoring key): (value, index) states, ties to the smallest index
ARG_MONOIDS = ("argmax", "argmin")
SIXTEEN_BIT = ("bf16", "f16")


@dataclass(frozen=True)
class Product:
    """One sum of the plan: ``name = outer · Σ_k rows_side · cols_side``, each side an
    elementwise expression, ``outer`` the factors that read no contracted axis (a scale, a
    per-column factor: applied once to the accumulator, not rounded into a side), or None;
    ``dtype``: what the tensor cores multiply (``"bf16"``, ``"f16"`` or ``"f32"``);
    ``rounded``: the sides rounded to it (``"rows"``, ``"cols"``)."""

    name: str
    rows_side: Expr
    cols_side: Expr
    dtype: str
    rounded: tuple[str, ...] = ()
    outer: Expr | None = None


@dataclass(frozen=True)
class PairwiseReduction:
    """One reduction of the plan that is no product: ``name = monoid_k body``, ``monoid``
    ``"sum"``, ``"max"`` or ``"min"``, ``body`` an elementwise expression whose loads each read
    the rows axis or the columns axis (or neither), never both, computed in f32 for every pair
    of a tile's rows and columns. A reduction over the columns may be ``"argmax"`` or
    ``"argmin"`` of ``body``, the column index its second component (two states)."""

    name: str
    body: Expr
    monoid: str
    # a softmax's normaliser ``Σ_j exp(body − m)`` of the maximum ``m = max_j body`` named here
    # (as ``T.logsumexp`` is written for the templates: m guarded where it is infinite), kept
    # per lane relative to the lane's maximum (``monoid`` "normaliser")
    of: str | None = None
    # the normaliser's maximum guarded where infinite (else, as written, NaN where it is)
    guarded: bool = True

    @property
    def states(self) -> int:
        """The values a row keeps of it: the extremum and its index for an arg reduction."""
        return 2 if self.monoid in ARG_MONOIDS else 1


@dataclass(frozen=True)
class StagedSide:
    """A computed side stored before the GEMM: ``param`` the stored tensor (in its product's
    tensor-core type), indexed by ``axes`` — the batch axes the side reads, then for the rows
    side the rows axis and the contracted axes it reads, for the columns side the contracted
    axes and the columns axis (the tile's own layout, so a tile is written and read along
    memory) —, ``value`` what it holds, ``side``: ``"rows"`` or ``"cols"``."""

    param: TensorParam
    value: Expr
    side: str
    axes: tuple[Axis, ...]


@dataclass(frozen=True)
class Group:
    """The rows grouped by a gathered index: a columns-side operand read at ``index`` (an
    expression of the rows, and of batch axes, through a tensor — a token's expert,
    ``w[expert[t], n, k]``) is read at ``axis`` in the products instead, and each tile sums
    its rows one value of the index at a time (the rows holding it kept, the others' sums
    discarded), so one block of the operand serves every row of the tile that shares it."""

    index: Expr
    axis: Axis


@dataclass(frozen=True)
class ContractionPlan:
    """The sums as products of two sides, the axes by role, and the outputs; ``staged``: the
    sides this plan reads from tensors stored before it (its program has them as parameters),
    ``staging``: this plan with its computed sides staged, where it has any."""

    program: Program
    products: tuple[Product, ...]
    ks: tuple[Axis, ...]         # contracted (several: swept as one index, outermost first)
    rows: Axis                   # the tile's M
    cols: Axis                   # the tile's N
    batch: tuple[Axis, ...]      # the grid's second dimension, outermost first
    outputs: tuple[Compute, ...]
    staged: tuple[StagedSide, ...] = ()
    staging: "ContractionPlan | None" = None
    pairwise: tuple[PairwiseReduction, ...] = ()
    # reductions over the columns of the sums' values (a kernel's sum over a point set): the
    # outputs are then indexed by the rows and batch axes, and read these
    over_columns: tuple[PairwiseReduction, ...] = ()
    group: Group | None = None

    def for_knobs(self, knobs) -> "ContractionPlan":
        """The plan the tiles run with ``knobs``: the staged one where they stage sides."""
        return self.staging if getattr(knobs, "stage_sides", 0) and self.staging else self

    @property
    def k_names(self) -> str:
        return ", ".join(a.name for a in self.ks)

    @staticmethod
    def extent(axis: Axis, sizes: dict):
        """``axis``'s extent at ``sizes`` (an int, or a symbolic size)."""
        return axis.extent if isinstance(axis.extent, int) else sizes[axis.extent]

    def describe(self) -> str:
        lines = [f"contraction plan: {', '.join(c.name for c in self.outputs)} "
                 f"[{', '.join(a.name for a in self.outputs[0].axes)}] as GEMM tiles: rows "
                 f"{self.rows.name}, columns {self.cols.name}, contracted {self.k_names}"
                 + (f", batch {', '.join(a.name for a in self.batch)}" if self.batch else "")]
        for p in self.products:
            rounded = f"; {' and '.join(p.rounded)} side rounded to {p.dtype}" if p.rounded else ""
            exact = [n for n, side in (("rows", p.rows_side), ("cols", p.cols_side))
                     if _bytes(side)]
            rounded += f"; {' and '.join(exact)} side's bytes converted to {p.dtype} " \
                "(exactly)" if exact else ""
            scaled = f"{to_text(p.outer)} · " if p.outer is not None else ""
            lines.append(f"  {p.name} = {scaled}Σ_{self.k_names} ({to_text(p.rows_side)}) · "
                         f"({to_text(p.cols_side)})  [tensor cores in {p.dtype}{rounded}, "
                         "f32 accumulation]")
        lines += [f"  {p.name} = {p.monoid}_{self.k_names} {to_text(p.body)}  [every (row, column) "
                  "pair on the CUDA cores, f32]" for p in self.pairwise]
        lines += [f"  {p.name} = {p.monoid}_{self.cols.name} {to_text(p.body)}  [over each row's "
                  "columns, block by block, in the same program"
                  f"{'; the extremum and its first column' if p.states == 2 else ''}"
                  f"{f'; relative to {p.of} lane by lane' if p.of else ''}]"
                  for p in self.over_columns]
        if self.group is not None:
            lines.append(f"  rows grouped by {to_text(self.group.index)} (read as "
                         f"{self.group.axis.name}): each tile sums its rows one value of it at a "
                         "time, a block of the columns side serving every row holding it")
        lines += [f"  {s.param.name}[{', '.join(a.name for a in s.axes)}] = {to_text(s.value)}  "
                  f"[stored as {s.param.dtype} before the tiles]" for s in self.staged]
        lines.append("  outputs computed on the accumulators: " + ", ".join(
            c.name if c.is_reduction else f"{c.name} = {to_text(c.bodies[0])}"
            for c in self.outputs))
        return "\n".join(lines)


def _refuse(message: str, loc=None) -> ScheduleError:
    return ScheduleError(f"{WHO}: {message}", loc)


def _side_dtype(side: Expr) -> str:
    """The dtype a side is stored in: its load's where it is one load, else f32 (computed)."""
    return side.param.dtype if isinstance(side, Load) else "f32"


def _unwidened(rows_side: Expr, cols_side: Expr) -> tuple[Expr, Expr]:
    """The sides without their widening casts where both are loads of one 16-bit type, cast
    or not (``x[t, k].astype('f32')``, written to compute in f32): their products in f32 are
    the 16-bit values' on the tensor cores, exactly, where f32 sides would multiply on the FMA
    units (IEEE: :func:`~tensorfuse.targets.triton.expr.dot_precision`). A side of another
    type keeps the casts: an f32 tensor's values would be rounded to the 16-bit type."""
    def load(side):
        widened = isinstance(side, Cast) and dt.resolve(side.dtype) in ("f32", "f64")
        return side.a if widened and isinstance(side.a, Load) else side
    loads = [load(side) for side in (rows_side, cols_side)]
    kinds = {side.param.dtype if isinstance(side, Load) else None for side in loads}
    return tuple(loads) if len(kinds) == 1 and kinds <= set(SIXTEEN_BIT) else \
        (rows_side, cols_side)


def _bytes(side: Expr) -> bool:
    """Whether ``side`` is a load of 8-bit integers (quantised weights, image bytes): every value
    of one is exact in bf16 and f16, so it enters the tensor cores as the other side's type."""
    return isinstance(side, Load) and side.param.dtype in dt.BYTES


def _operand_dtypes(rows_side: Expr, cols_side: Expr) -> tuple[str, tuple[str, ...]]:
    """(what the tensor cores multiply, the sides rounded to it): a 16-bit side sets it (both
    16-bit of different types: the rows side's), two f32 sides stay f32."""
    kinds = {"rows": _side_dtype(rows_side), "cols": _side_dtype(cols_side)}
    narrow = [d for d in kinds.values() if d in SIXTEEN_BIT]
    if not narrow:
        return "f32", ()
    return narrow[0], tuple(side for side, d in kinds.items()
                            if d != narrow[0] and d not in dt.BYTES)   # those are exact


def _split(body: Expr, rows: Axis, cols: Axis, ks: tuple) -> tuple | None:
    """``(rows side, cols side, outer, group)`` of a sum's body — ``outer`` the product of the
    factors that read no contracted axis, or None; ``group`` a :class:`Group` where the columns
    side reads the rows through a gathered index (:func:`_gathered_by_rows`), else None — or
    None where a factor of the sides reads both ``rows`` and ``cols`` otherwise, or a side
    would be empty."""
    left, right, outer, group = [], [], [], None
    for f in factors(body):
        on_rows, on_cols = has_axis(f, rows), has_axis(f, cols)
        if not any(has_axis(f, k) for k in ks):
            outer.append(f)
        elif on_rows and on_cols:
            found = _gathered_by_rows(f, rows, cols, ks) if group is None else None
            if found is None:
                return None
            f, group = found
            right.append(f)
        else:
            (right if on_cols else left).append(f)
    if not left or not right:
        return None
    return reduce(mul, left), reduce(mul, right), reduce(mul, outer) if outer else None, group


def _gathered_by_rows(f: Expr, rows: Axis, cols: Axis, ks: tuple) -> tuple | None:
    """``(f read at a group axis, its Group)`` where ``f`` reads the rows only through one
    gathered index of its loads, which reads neither the columns nor the contracted axes (a
    token's expert: ``w[expert[t], n, k]``, cast or scaled), else None."""
    for load in (n for n in nodes(f) if isinstance(n, Load)):
        for at, index in enumerate(load.indices):
            if not (is_gathered(index) and has_axis(index, rows)) or has_axis(index, cols) or \
                    any(has_axis(index, k) for k in ks):
                continue
            axis, key = Axis("group", load.param.dims[at]), index.key()
            grouped = substitute(f, lambda n: axis if n.key() == key else None)
            if not has_axis(grouped, rows):
                return grouped, Group(index, axis)
    return None


def plan_contraction(program: Program) -> ContractionPlan:
    """The contraction plan of ``program`` (module docstring), or a :class:`ScheduleError`
    saying what does not fit."""
    sums = [c for c in program.computes if c.is_reduction]
    if not sums:
        raise _refuse(f"{program.name} has no sums")
    for c in sums:
        if (c.monoid.name not in PAIRWISE_MONOIDS or c.arity != 1) and \
                c.monoid.name not in ARG_MONOIDS:
            raise _refuse(f"{c.name} is not a sum, maximum or minimum (it takes sums of products "
                          "and reductions of pairs)", c.loc)
    for c in sums:
        if is_scan(c):   # N terms on the scan template (a stage of its own), not N²
            raise _refuse(f"{c.name} reduces over the positions up to each of its own: a scan, "
                          "not a contraction", c.loc)
    sums, columns = _over_columns(sums)
    by_name = {c.name: c for c in columns}
    normalisers = {c.name: found for c in columns
                   if (found := normaliser_of(c, by_name)) is not None}
    for c in sums:
        if c.monoid.name in ARG_MONOIDS:
            raise _refuse(f"{c.name} is an arg reduction over the contracted axis: it takes them "
                          "over the columns of the sums' values only", c.loc)
    for c in columns:
        if c.monoid.name in ARG_MONOIDS and not (isinstance(c.bodies[1], Axis) and
                                                c.bodies[1].uid == c.over[0].uid):
            raise _refuse(f"{c.name}'s index is not the column it reduces over", c.loc)
    ks = tuple(sums[0].over)
    axes = [a.uid for a in sums[0].axes]
    for c in sums[1:]:
        if [a.uid for a in c.over] != [a.uid for a in ks] or \
                sorted(a.uid for a in c.axes) != sorted(axes):
            raise _refuse(f"{c.name} and {sums[0].name} sum over other axes or into others (one "
                          "kernel's tiles share the contracted axis and the output's)", c.loc)
    outputs = tuple(c for c in program.computes if c.is_output)
    kept = columns or sums   # what the outputs are indexed like and read
    for c in outputs:
        if c.arity != 1 or sorted(a.uid for a in c.axes) != sorted(a.uid for a in kept[0].axes):
            raise _refuse(f"the output {c.name} is not indexed like the sums {kept[0].name} "
                          f"[{', '.join(a.name for a in kept[0].axes)}]", c.loc)
        for n in () if c in kept else nodes(inline_elementwise(c.bodies[0])):
            if isinstance(n, Ref) and n.compute not in kept:
                raise _refuse(f"the output {c.name} reads {n.compute.name}, not a "
                              f"{'reduction over the columns' if columns else 'sum'} of this "
                              "kernel", c.loc)
    for c in columns:   # each a row's state: the sums' axes less the columns, no other
        if sorted(axes) != sorted([a.uid for a in c.axes] + [c.over[0].uid]):
            raise _refuse(f"{c.name} reduces {sums[0].name} into other axes than its own less "
                          "the columns", c.loc)
    bodies = [inline_elementwise(c.bodies[0]) for c in sums]
    if any(isinstance(n, Ref) for b in bodies for n in nodes(b)):
        raise _refuse("a sum reads another reduction: one contraction at a time (the stages "
                      "of the floor store the first)")
    out_axes = list(sums[0].axes) if columns or not outputs else list(outputs[0].axes)
    found = _roles(bodies, [c.monoid.name for c in sums], out_axes, ks,
                   cols=columns[0].over[0] if columns else None)
    if found is None:
        raise _refuse("no rows and columns axes: each sum must be a product of a factor reading "
                      "one output axis and the contracted one, and a factor reading another "
                      "output axis and the contracted one, or each reduction's loads read one "
                      "of two output axes, never both "
                      f"({', '.join(to_text(b) for b in bodies)})", sums[0].loc)
    rows, cols, sides = found
    products, pairwise, group = [], [], None
    for c, body, split in zip(sums, bodies, sides):
        if split is None:
            if not dt.is_float(dt.resolve(c.dtypes[0])):
                raise _refuse(f"{c.name} reduces integers: its pairs are computed in f32, "
                              "which would round large integers", c.loc)
            pairwise.append(PairwiseReduction(c.name, body, c.monoid.name))
            continue
        rows_side, cols_side, outer, found = split
        rows_side, cols_side = _unwidened(rows_side, cols_side)
        group = group or found
        floats = [dt.is_float(dt.resolve(side.dtype)) for side in (rows_side, cols_side)]
        # a side of bytes multiplies a float side: both floats on the tensor cores, exactly
        if not any(floats) or not all(f or _bytes(side) for f, side in
                                      zip(floats, (rows_side, cols_side))) or \
                not dt.is_float(dt.resolve(c.dtypes[0])):
            raise _refuse(f"{c.name} sums integers: the tensor cores multiply floats, which "
                          "would round large integers", c.loc)
        dtype, rounded = _operand_dtypes(rows_side, cols_side)
        products.append(Product(c.name, rows_side, cols_side, dtype, rounded, outer))
    if group is not None:
        _check_grouped(sides, pairwise, columns, group, sums)
    batch = tuple(a for a in out_axes if a.uid not in (rows.uid, cols.uid))
    over = []
    for c in columns:
        found = normalisers.get(c.name)
        over.append(PairwiseReduction(c.name, inline_elementwise(by_name[found[0]].bodies[0]),
                                      "normaliser", *found) if found else
                    PairwiseReduction(c.name, inline_elementwise(c.bodies[0]), c.monoid.name))
    plan = ContractionPlan(program, tuple(products), ks, rows, cols, batch, outputs,
                           pairwise=tuple(pairwise), over_columns=tuple(over), group=group)
    # a staged side is stored by the tiles' own axes, which a grouped side is not indexed by
    return replace(plan, staging=None if group is not None else _staged(plan))


def _check_grouped(sides: list, pairwise: list, columns: list, group: Group, sums: list):
    """Refuse a grouped plan whose other reductions the group's loop would not sum once: a sum
    read without the gather (or through another), a pairwise reduction, reductions over the
    columns."""
    for c, split in zip(sums, sides):
        if split is None or split[3] is None or split[3].index.key() != group.index.key():
            raise _refuse(f"{c.name} does not read the columns side through "
                          f"{to_text(group.index)} as the other sums do: one grouping a kernel",
                          c.loc)
    if pairwise or columns:
        raise _refuse(f"rows grouped by {to_text(group.index)} take sums of products only",
                      sums[0].loc)


def normaliser_of(c: Compute, columns: dict) -> tuple[str, bool] | None:
    """``(the maximum's name among columns, guarded)`` where ``c`` is the softmax normaliser
    ``Σ_j exp(u − m)`` of ``m = max_j u`` — as users write it, or ``guarded`` with ``m`` read as
    :func:`~tensorfuse.algebra.exprs.finite_shift` of it, as ``T.logsumexp`` is written for the
    templates —, else None."""
    body = inline_elementwise(c.bodies[0])
    if c.monoid.name != "sum" or not (isinstance(body, Unary) and body.op == "exp" and
                                      isinstance(body.a, Binary) and body.a.op == "sub"):
        return None
    shift = body.a.b
    guarded = isinstance(shift, Where) and isinstance(shift.a, Ref) and \
        shift.key() == finite_shift(shift.a, shift.a.dtype).key()
    ref = shift.a if guarded else shift
    top = columns.get(ref.compute.name) if isinstance(ref, Ref) else None
    if top is None or top.monoid.name != "max" or \
            body.a.a.key() != inline_elementwise(top.bodies[0]).key():
        return None
    return top.name, guarded


def _over_columns(reductions: list) -> tuple[list, list]:
    """``(the contractions, the reductions over the columns of their values)``: the second
    those whose bodies read another reduction (``Σ_j exp(−d2[i, j]) · b[j]`` over the pairs'
    distances ``d2``), all over one axis, each reading the contractions only — a reduction of
    the columns read by another (softmax's maximum, read by its sum) would need its running
    corrections, which the attention templates' rolling update makes."""
    def reads(c):
        return {n.compute.name for n in nodes(inline_elementwise(c.bodies[0]))
                if isinstance(n, Ref)}
    columns = [c for c in reductions if reads(c)]
    inner = [c for c in reductions if not reads(c)]
    if not columns:
        return reductions, []
    if not inner:
        raise _refuse("every reduction reads another: nothing to contract")
    names = {c.name for c in inner}
    for c in columns:
        if len(c.over) != 1 or c.over[0].uid != columns[0].over[0].uid:
            raise _refuse(f"{c.name} and {columns[0].name}: the reductions of the contractions' "
                          "values run over one axis, the same one (the columns)", c.loc)
        of = normaliser_of(c, {t.name: t for t in columns})
        if not reads(c) <= names | ({of[0]} if of else set()):
            raise _refuse(f"{c.name} reads {', '.join(sorted(reads(c) - names))}, a reduction "
                          "over the columns: one pass over them cannot correct it as it grows "
                          "(the attention templates' rolling update does)", c.loc)
    return inner, columns


def _staged(plan: ContractionPlan) -> ContractionPlan | None:
    """``plan`` with each computed side read from a tensor stored before it (module
    docstring), or None where every side is a load."""
    taken = {p.name for p in plan.program.params} | {c.name for c in plan.program.computes}
    staged, products = [], []
    for p in plan.products:
        sides = {}
        for side, value, free in (("rows", p.rows_side, plan.rows), ("cols", p.cols_side,
                                                                      plan.cols)):
            if isinstance(value, Load):
                sides[side] = value
                continue
            read = {a.uid for a in value.axes}
            ordered = [*plan.batch, free, *plan.ks] if side == "rows" else \
                [*plan.batch, *plan.ks, free]
            axes = [a for a in ordered if a.uid in read]
            name = f"staged_{p.name}_{side}"
            while name in taken:
                name = f"_{name}"
            taken.add(name)
            param = TensorParam(name, tuple(a.extent for a in axes), p.dtype)
            sides[side] = Load(param, axes)
            staged.append(StagedSide(param, value, side, tuple(axes)))
        dtype, rounded = _operand_dtypes(sides["rows"], sides["cols"])
        products.append(replace(p, rows_side=sides["rows"], cols_side=sides["cols"],
                                dtype=dtype, rounded=rounded))
    if not staged:
        return None
    program = replace(plan.program, params=list(plan.program.params) +
                      [s.param for s in staged])
    return replace(plan, program=program, products=tuple(products), staged=tuple(staged))


def _roles(bodies: list[Expr], monoids: list[str], out_axes: list[Axis], ks: tuple,
           pairs: bool = True, cols: Axis | None = None):
    """``(rows, cols, [(rows side, cols side, outer), or None for a pairwise reduction, per
    reduction])``: the columns are the innermost output axis with which every sum splits as a
    product or every reduction reads its operands in pairs (:func:`_pairwise`), the rows the
    innermost other one (a tile's stores then run along memory); None where no pair of axes
    takes them all. ``pairs``: whether pairwise reductions count (else products only);
    ``cols``: the columns axis where it is given (the axis reduced over the columns after)."""
    for cols in reversed(out_axes) if cols is None else (cols,):
        for rows in reversed(out_axes):
            if rows.uid == cols.uid:
                continue
            sides = [_split(b, rows, cols, ks) if m == "sum" else None
                     for b, m in zip(bodies, monoids)]
            if all(s is not None or (pairs and _pairwise(b, rows, cols))
                   for b, s in zip(bodies, sides)):
                return rows, cols, sides
    return None


def _pairwise(body: Expr, rows: Axis, cols: Axis) -> bool:
    """Whether ``body`` reads both axes, but no load of it reads both (each then loaded once
    per tile and paired on the CUDA cores)."""
    loads = [n for n in nodes(body) if isinstance(n, Load)]
    return has_axis(body, rows) and has_axis(body, cols) and \
        not any(has_axis(n, rows) and has_axis(n, cols) for n in loads)


def gemm_shaped(program: Program) -> bool:
    """Whether some sum of ``program`` is a product of a rows side and a columns side over its
    axis (a GEMM, whatever else the program does): the row-tile template runs those a row at a
    time on the CUDA cores, so the floor keeps them to stages the contraction template takes."""
    return any(is_gemm(c) for c in program.computes)


def is_gemm(c: Compute) -> bool:
    """Whether ``c`` is a sum of products of a rows side and a columns side over its axis."""
    if not (c.is_reduction and c.monoid.name == "sum" and c.arity == 1):
        return False
    body = inline_elementwise(c.bodies[0])
    return _roles([body], ["sum"], list(c.axes), tuple(c.over), pairs=False) is not None
