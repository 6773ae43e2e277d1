"""The row-tile template plan: a fused chain laid out as tiles of rows swept over the fused axis.

This is the planning behind the attention and row-reduction templates (the Triton emitter in
:mod:`tensorfuse.targets.triton.rowtile` turns a plan and its knobs into code). The roles of the
axes come from the planned chain:

- the chain's common axes: the ``row`` axis, tiled by ``block_m``, is the one the column operands
  (the tiles of the swept axis that carry a feature axis: attention's k and v) do not read — the
  query axis wherever it sits in the tensors (:func:`row_roles`); the others run over the grid's
  second dimension (``batch``). Without column operands (softmax, norms) the last common axis is
  the row axis;
- the fused axis ``j`` is swept in blocks of ``block_n`` (the rolling update's chunks);
- the ``feature`` axes (the head dimensions) are held whole, in one block as wide as the widest
  (q·k and p·v may differ: 192 and 128), each masked at its own size — past 256, in chunks of
  one width (:mod:`.feature_chunks`: 576 and 512 in chunks of 64): reductions over one that
  multiply a row tile by a column tile are tensor-core products (q·kᵀ), and members that sum a
  row×column tile times a column×feature tile are too (p·v).

When the chain's elements are masked by one condition (``where(cond, s, -inf)``), the plan keeps
it: :mod:`.block_schedule` sorts the blocks of each call into skipped, partial and full ones.
A plan is data: it holds no code text.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

from ..algebra import Chain, inline_elementwise
from ..algebra.exprs import factors, nodes, substitute
from ..algebra.masking import identity_mask
from ..algebra.schemes import dependency_symbols, inexact_reset
from ..dsl import dtypes as dt
from ..dsl.expr import (Axis, Binary, Compare, Const, DimSize, Expr, Load, Ref, Scalar, Where,
                        binary, compare, where)
from ..dsl.printer import to_text
from ..dsl.program import Compute, Program
from ..errors import ScheduleError, TargetError
from ..targets.triton.reductions import reducible
from .block_schedule import block_lists, window_lists
from .column_sums import column_sum, output_reads
from .feature_chunks import feature_chunk
from .sweep_bounds import SweepBounds, sweep_bounds
from .token_tiling import choose_tiling, map_scalars, mask_reads_map, mask_reads_tensors
from .row_fold import grouped, row_fold
from .value_features import with_value_features


@dataclass
class Contraction:
    """``Σ_k left(row, k) · right(col, k)`` (or with ``col`` the output feature axis)."""

    left: Expr
    right: Expr
    dot_dtype: str


@dataclass
class StatePlan:
    member: Compute
    k: int
    body: Expr                   # per-element value (row×col tile), deps as '{d}.ref' symbols
    monoid: object
    dtype: str
    contraction: Contraction | None = None   # for states over the feature axis


@dataclass
class RowTilePlan:
    program: Program
    chain: Chain
    sizes: dict
    batch: list[Axis]
    row: Axis
    col: Axis
    feature: Axis | None
    feature_extent: int
    locals: dict = field(default_factory=dict)        # compute name -> Contraction
    feature_extents: dict = field(default_factory=dict)   # feature axis uid -> its size
    states: list[StatePlan] = field(default_factory=list)
    mask: Expr | None = None
    outputs: list = field(default_factory=list)       # (compute, expr, kind)
    fold: tuple | None = None   # (batch axis h, group size G): G values of h share a row tile
    # the rows visited in patches of a map, the keys in windows (token_tiling), and the choice
    row_tiling: object = None
    key_windows: object = None
    tiling: object = None
    written_mask: Expr | None = None   # the mask as written, where the emitted one is rewritten
    column_sums: list = field(default_factory=list)   # .column_sums.ColumnSum, the outputs' sums
    feature_chunk: int | None = None   # features past one block's width, in chunks this wide

    @property
    def map_mask(self) -> Expr | None:
        """The mask as the program writes it: what a map is recognised from (the rewritten
        ``a % d == b % d`` reads like another level of the map)."""
        return self.written_mask if self.written_mask is not None else self.mask

    @property
    def bounds(self) -> SweepBounds | None:
        """The mask's bounds on the swept axis where it is only that (:mod:`.sweep_bounds`):
        each program sweeps the blocks between them, no block lists; None with a visiting
        order of the plan's own (its lists say which keys a window holds), or with products on
        the tensor cores (attention: its lists spare the blocks wholly inside the bounds the
        mask's compare and select, which its scores pay for and a row of loads does not)."""
        if self.key_windows is not None or self.row_tiling is not None or self.locals or \
                any(sp.contraction is not None for sp in self.states):
            return None
        return sweep_bounds(self.mask, self.col, [*self.batch, self.row])

    @property
    def block_listed(self) -> bool:
        """Whether the kernel walks block lists made per call: a mask that is not only bounds
        (:attr:`bounds`)."""
        return self.mask is not None and self.bounds is None

    @property
    def rows(self) -> int:
        rows = self.sizes_of(self.row)
        return rows * self.fold[1] if self.fold else rows

    @property
    def grid_batch(self) -> list[tuple[str, int]]:
        """(name, extent) of the axes over the grid's second dimension (a folded axis by group)."""
        out = []
        for a in self.batch:
            if self.fold and a.uid == self.fold[0].uid:
                out.append((f"{a.name}g", self.sizes_of(a) // self.fold[1]))
            else:
                out.append((a.name, self.sizes_of(a)))
        return out

    @property
    def cols(self) -> int:
        return self.sizes_of(self.col)

    @property
    def outputs_per_row(self) -> bool:
        """Whether every output is one value a row (none over the swept or a feature axis)."""
        return all(kind == "row" for _, _, kind in self.outputs)

    @property
    def column_sides(self) -> list[Expr]:
        """The column-side operands of the tensor-core products (attention's k and v reads)."""
        return [c.right for c in self.locals.values()] + \
            [sp.contraction.right for sp in self.states if sp.contraction is not None]

    @property
    def grid_batch_size(self) -> int:
        """Programs on the grid's batch dimension: the product of :attr:`grid_batch`."""
        return math.prod(extent for _, extent in self.grid_batch)

    def describe(self, knobs: "Knobs | None" = None) -> str:
        """The plan in readable form (``Schedule.plan``): the axes' roles, the tensor-core
        products, the running states, the mask and the knobs."""
        lines = [f"row-tile plan of {self.program.name} at "
                 + ", ".join(f"{k}={v}" for k, v in self.sizes.items()),
                 f"  grid: {', '.join(f'{n}={e}' for n, e in self.grid_batch) or '-'} × rows "
                 f"{self.row.name} ({self.rows}"
                 + (f": {self.fold[1]} values of {self.fold[0].name} share a tile" if self.fold
                    else "") + ")",
                 f"  swept: {self.col.name} ({self.cols}), feature "
                 + (f"in chunks of {self.feature_chunk}: " if self.feature_chunk else
                    "held whole: ")
                 + (" and ".join(f"{n} {e}" for n, e in self._feature_sizes())
                    if self.two_feature_sizes else f"{self.feature_extent}")]
        for name, con in self.locals.items():
            lines.append(f"  {name} = {to_text(con.left)} · {to_text(con.right)} on tensor "
                         f"cores ({con.dot_dtype})")
        for sp in self.states:
            how = (f" as {to_text(sp.contraction.left)} · {to_text(sp.contraction.right)} on "
                   f"tensor cores" if sp.contraction is not None else "")
            lines.append(f"  state {sp.member.name}#{sp.k} = {sp.monoid.name} of "
                         f"{to_text(sp.body)}{how}")
        if self.bounds is not None:
            lines.append(f"  mask: {to_text(self.mask)} (each program sweeps only the blocks of "
                         f"{self.bounds.describe(to_text, self.col.name)}: no block lists)")
        elif self.mask is not None:
            lines.append(f"  mask: {to_text(self.mask)} (blocks sorted per call into skipped, "
                         "partial and full)")
        if self.tiling is not None:
            lines.append(f"  visiting order: {self.tiling.describe()}")
        for cs in self.column_sums:
            lines.append(f"  summed down the rows in the same pass: {cs.name} = {cs.monoid.name} "
                         f"of {to_text(cs.body)} (a partial row per program, added up by a "
                         "second kernel)")
        lines.append("  outputs: " + ", ".join(f"{c.name} ({kind})" for c, _, kind in
                                               self.outputs))
        if knobs is not None:
            lines.append(f"  knobs: block_m={knobs.block_m}, block_n={knobs.block_n}, "
                         f"num_warps={knobs.num_warps}, num_stages={knobs.num_stages}, "
                         f"splits={knobs.splits}"
                         + (f", row_tiles={knobs.row_tiles}" if self.column_sums or
                            knobs.row_tiles > 1 else "")
                         + (", lanes=1" if knobs.lanes else ""))
        return "\n".join(lines)

    def _feature_sizes(self) -> list[tuple[str, int]]:
        axes = {a.uid: a for c in self.program.computes for a in c.axes + c.over}
        return [(axes[u].name, e) for u, e in self.feature_extents.items()]

    @property
    def two_feature_sizes(self) -> bool:
        """Whether q·k and p·v run over head dims of different sizes."""
        return len(set(self.feature_extents.values())) > 1

    def feature_size(self, axis: Axis) -> int:
        """The size of a feature axis (its own, where q·k and p·v differ)."""
        return self.feature_extents.get(axis.uid, self.feature_extent)

    @property
    def feature_block(self) -> int:
        """The width of a feature tile: the widest axis to a power of two (16 at least), or a
        chunk's (:mod:`.feature_chunks`)."""
        if self.feature_chunk is not None:
            return self.feature_chunk
        return max(16, 1 << max(0, (self.feature_extent - 1).bit_length()))

    def feature_chunks(self, axis: Axis) -> int:
        """How many feature tiles hold ``axis``: one, or its chunks."""
        return math.ceil(self.feature_size(axis) / self.feature_block)

    def state_feature(self, sp: "StatePlan") -> Axis:
        """The feature axis of a weighted sum's state (p·v's)."""
        common = {a.uid for a in self.chain.common_axes}
        return next(a for a in sp.member.axes if a.uid not in common)

    @property
    def feature_width(self) -> int:
        """The widest feature axis as its tiles hold it (padded to the block or the chunks)."""
        return max([self.feature_block] + [math.ceil(e / self.feature_block) * self.feature_block
                                           for e in self.feature_extents.values()])

    def sizes_of(self, axis: Axis) -> int:
        return axis.extent if isinstance(axis.extent, int) else self.sizes[axis.extent]


def _product(factors: list[Expr]) -> Expr:
    out = factors[0]
    for f in factors[1:]:
        out = Binary("mul", out, f, dt.promote(out.dtype, f.dtype), out.loc)
    return out


def split_product(e: Expr, left_axes: set, right_axes: set, shared: set) -> tuple | None:
    """Split a product into a left part (axes ⊆ left_axes) and a right part (⊆ right_axes). A
    product under a condition of the left's axes, ``where(j <= i, s · v, 0)`` (causal linear
    attention), splits as ``where(j <= i, s, 0) · v``: the masked left is the tile of weights."""
    if isinstance(e, Where) and isinstance(e.b, Const) and e.b.value == 0 and \
            {a.uid for a in e.cond.axes} <= left_axes:
        parts = split_product(e.a, left_axes, right_axes, shared)
        return parts and (where(e.cond, parts[0], Const(0.0, parts[0].dtype), e.loc), parts[1])
    left, right = [], []
    for f in factors(e):
        axes = {a.uid for a in f.axes}
        if axes <= shared:
            left.append(f)
        elif axes <= left_axes:
            left.append(f)
        elif axes <= right_axes:
            right.append(f)
        else:
            return None
    if not left or not right:
        return None
    return _product(left), _product(right)


def storage_of(e: Expr) -> str:
    """The type a contraction's operands go to the tensor cores in: their storage type where
    they share a 16-bit one, else float32 (products as written: f32 tensors rounded to bf16 put
    a tiny Llama's f32 attention gradients 3e-3 from SDPA's)."""
    loads = [n for n in nodes(e) if isinstance(n, Load) and dt.is_float(n.param.dtype)]
    kinds = {n.param.dtype for n in loads}
    return kinds.pop() if len(kinds) == 1 and kinds <= {"bf16", "f16"} else \
        "bf16" if not kinds else "f32"


def row_roles(chain: Chain) -> tuple[list[Axis], Axis]:
    """``(batch axes, row axis)`` of a chain's common axes, from their roles rather than their
    positions: the row axis is the last common axis that no column operand reads (a load that
    runs over the swept axis and a feature axis — attention's ``k[b, j, h, d]`` and
    ``v[b, j, h, e]`` read ``b`` and ``h``, not the queries ``i``), so ``[B, H, S, D]``,
    ``[B, S, H, D]`` and ``[S, B, H, D]`` tensors give one plan; without column operands, the
    last common axis."""
    common = list(chain.common_axes)
    uids = {a.uid for a in common}
    col = chain.axis.uid
    read: set = set()
    bodies = [b for m in chain.members for b in chain.bodies[m.name]]
    bodies += [inline_elementwise(x.bodies[0]) for x in chain.local_reductions]
    for body in bodies:
        for n in nodes(body):
            if isinstance(n, Load):
                axes = {a.uid for a in n.axes}
                if col in axes and axes - uids - {col}:
                    read |= axes
    free = [a for a in common if a.uid not in read]
    if not free and read:
        # every common axis is read by the keys (a decode written without a query axis: q[b, h,
        # d] over k[b, j, h // G, d]): one query row per program, and the heads that share a
        # kv-head folded into its tile (:func:`.row_fold.row_fold`)
        return common, Axis(UNIT_ROW, 1)
    row = free[-1] if free else common[-1]
    return [a for a in common if a.uid != row.uid], row


# the name of the row axis of a chain without one (a query row of one element)
UNIT_ROW = "query"


def plan_rowtile(program: Program, chain: Chain, sizes: dict) -> RowTilePlan:
    """Check that the chain fits the template and assign the axes their roles."""
    if chain.axis is None or len(chain.common_axes) < 1:
        raise TargetError("the row-tile template needs at least one axis shared by the chain")
    chain = with_value_features(chain)
    batch, row = row_roles(chain)
    col = chain.axis
    common = {a.uid for a in chain.common_axes}
    members = {m.name for m in chain.members}
    features: dict[int, Axis] = {}
    for m in chain.members:
        for a in m.axes:
            if a.uid not in common:
                features[a.uid] = a
    for x in chain.local_reductions:
        for a in x.over:
            features[a.uid] = a
    # each feature axis at its own size (q·k over 192, p·v over 128): one block holds the widest
    extents = {a.uid: a.extent if isinstance(a.extent, int) else sizes[a.extent]
               for a in features.values()}
    feature_extent = max(extents.values(), default=1)
    plan = RowTilePlan(program, chain, sizes, list(batch), row, col, None, feature_extent,
                       feature_extents=extents, feature_chunk=feature_chunk(extents))
    batch_ids = {a.uid for a in batch}
    for x in chain.local_reductions:
        if x.monoid.name != "sum" or len(x.over) != 1 or any(a.uid not in common | {col.uid}
                                                            for a in x.axes):
            raise TargetError(f"{x.name}: only sums over the feature axis of a row value times a "
                              "column value become tensor-core products")
        k = x.over[0]
        body = inline_elementwise(x.bodies[0])
        parts = split_product(body, common | {k.uid}, batch_ids | {col.uid, k.uid}, batch_ids)
        if parts is None:
            raise TargetError(f"{x.name} is not a product of a row value and a column value")
        plan.locals[x.name] = Contraction(parts[0], parts[1], storage_of(body))
    for m in chain.members:
        scheme = chain.schemes[m.name]
        extra = [a for a in m.axes if a.uid not in common]
        if scheme.kind not in ("independent", "linear", "affine", "reset", "held") or \
                m.arity != 1 and scheme.kind != "independent":
            raise TargetError(f"{m.name}: {scheme.kind} schemes are not in the row-tile template")
        if m.arity != 1 and (any(m.name in s.deps for s in chain.schemes.values()) or
                             any(a.uid not in common for a in m.axes)):
            raise TargetError(f"{m.name}: a monoid of {m.arity} components is a state of the "
                              "row-tile template where no other member depends on it and it has "
                              "no feature axis")
        if why := inexact_reset(chain.schemes, m.name):
            raise TargetError(why)
        for k, st in enumerate(scheme.states):
            body = dependency_symbols(st.body, members, scheme)
            if not extra:
                if not reducible(st.monoid):
                    raise TargetError(f"{m.name}: {st.monoid.name} is not in the row-tile template")
                plan.states.append(StatePlan(m, k, body, st.monoid, st.dtype))
                continue
            if st.monoid.name != "sum" or len(extra) != 1:
                raise TargetError(f"{m.name}: a state over {extra[0].name} must be a sum")
            e = extra[0]
            parts = split_product(body, common | {col.uid}, batch_ids | {col.uid, e.uid}, batch_ids)
            if parts is None:
                raise TargetError(f"{m.name}: not a product of a row×{col.name} value and a "
                                  f"{col.name}×{e.name} value")
            plan.states.append(StatePlan(m, k, body, st.monoid, st.dtype,
                                         Contraction(parts[0], parts[1], storage_of(parts[1]))))
    plan.fold = row_fold(plan)
    if plan.fold is not None:
        plan.locals = {k: Contraction(c.left, grouped(c.right, plan.fold), c.dot_dtype)
                       for k, c in plan.locals.items()}
        for sp in plan.states:
            if sp.contraction is not None:
                sp.contraction = Contraction(sp.contraction.left,
                                             grouped(sp.contraction.right, plan.fold),
                                             sp.contraction.dot_dtype)
    plan.mask = None if plan.fold else identity_mask(chain)
    if plan.mask is not None:
        _separate_congruences(plan)
    plan.outputs = _outputs(program, plan, common, set(features))
    return plan


def _separate_congruences(plan: RowTilePlan) -> None:
    """Rewrite the mask's ``(a - b) % d == 0`` (``!= 0``), with ``a`` read along the rows and
    ``b`` along the keys, as ``a % d == b % d``: two remainders of index vectors and one compare
    per element instead of a floor modulo of every element of the tile (a dilated neighbourhood's
    ``dy % dilation == 0``; on the H100 that modulo made the flat order 0.5× FlexAttention and
    the tile spill registers). The same condition replaces the old one in the states."""
    row_side = {a.uid for a in plan.batch} | {plan.row.uid}
    col_side = {a.uid for a in plan.batch} | {plan.col.uid}

    def split(n):
        if not (isinstance(n, Compare) and n.op in ("eq", "ne") and isinstance(n.b, Const)
                and n.b.value == 0 and isinstance(n.a, Binary) and n.a.op == "mod"
                and isinstance(n.a.a, Binary) and n.a.a.op == "sub" and not n.a.b.axes):
            return None
        a, b, d = n.a.a.a, n.a.a.b, n.a.b
        sides = ({x.uid for x in a.axes}, {x.uid for x in b.axes})
        if not (sides[0] <= row_side and sides[1] <= col_side or
                sides[0] <= col_side and sides[1] <= row_side):
            return None
        return compare(n.op, binary("mod", a, d, n.loc), binary("mod", b, d, n.loc), n.loc)

    old = plan.mask
    new = substitute(old, split)
    if new.key() != old.key():
        _replace_mask(plan, new)
        plan.written_mask = old


def _replace_mask(plan: RowTilePlan, new: Expr) -> None:
    """``new`` for the plan's mask, in the mask and wherever the states and outputs use it."""
    old = plan.mask
    swap = lambda e: substitute(e, lambda n: new if n.key() == old.key() else None)  # noqa: E731
    plan.mask = new
    for sp in plan.states:
        sp.body = swap(sp.body)
        if sp.contraction is not None:
            sp.contraction = Contraction(swap(sp.contraction.left), swap(sp.contraction.right),
                                         sp.contraction.dot_dtype)
    plan.outputs = [(c, swap(e), kind) for c, e, kind in plan.outputs]


def _with_scalars_compiled_in(plan: RowTilePlan, values: dict) -> RowTilePlan:
    """A copy of ``plan`` whose mask reads these scalars as constants: kernels are built per
    their values anyway (``TilePlanner.layout_scalars``), and Triton then divides by a constant
    map width (a multiply and a shift) instead of a runtime one, folds ``radius * dilation`` and
    drops a ``causal == 0`` switch."""
    import copy

    out = replace(plan, states=[copy.copy(sp) for sp in plan.states],
                  outputs=list(plan.outputs))
    const = lambda n: Const(int(values[n.name]), n.dtype) if isinstance(n, Scalar) and \
        n.name in values else None  # noqa: E731
    _replace_mask(out, substitute(out.mask, const))
    return out


def _outputs(program: Program, plan: RowTilePlan, common: set, features: set) -> list:
    """Each output with its expression and kind: over the rows, also over the swept axis (``col``)
    or a feature axis, or over the swept axis from sums down the rows (``colsum``, recorded in
    ``plan.column_sums``). Refused: an output over another axis (a norm over ``c`` written over
    ``c`` and ``p``), or over the swept and a feature axis at once (``d_x[b, t, e]``): untiled."""
    chain, col = plan.chain, plan.col
    members = {m.name for m in chain.members}
    sums = {cs.name: cs for cs in plan.column_sums}
    out = []
    for c in program.outputs:
        body = c.bodies[0] if not c.is_reduction else None
        if c.name in members:
            expr: Expr = Ref(c, 0, c.loc)
        elif body is not None:
            expr = inline_elementwise(body)
        else:   # a sum down the rows, itself an output
            expr = Ref(c, 0, c.loc)
        inside, outside = output_reads(expr, members)
        axes = {a.uid for a in c.axes}
        if outside:
            for name, x in outside.items():   # each a sum down the rows, or why not
                sums.setdefault(name, column_sum(x, plan))
            if inside or axes != {col.uid}:
                raise TargetError(f"output {c.name} reads {', '.join(sorted(outside))}, outside "
                                  "the chain" + (f", and {', '.join(sorted(inside))}" if inside
                                                 else f", and is not over {col.name} alone"))
            out.append((c, expr, "colsum"))
            continue
        if not axes <= common | {col.uid} | features:
            other = [a.name for a in c.axes if a.uid not in common | {col.uid} | features]
            raise TargetError(f"output {c.name} is over {', '.join(other)}, which is neither a "
                              f"row axis, the swept axis {col.name} nor a feature axis")
        if col.uid in axes and axes & features:   # stored along the sweep or across features
            raise TargetError(f"output {c.name} is over the swept axis and a feature axis at once")
        kind = "row" if axes <= common else ("col" if axes <= common | {col.uid} else "feature")
        out.append((c, expr, kind))
    plan.column_sums = list(sums.values())
    return out


@dataclass
class Knobs:
    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2
    splits: int = 1  # >1: the split update (parts of the axis in parallel, the last merges)
    # 1: a row held in one block is read again for the outputs (from L2: the first read keeps it
    # there) instead of kept in registers across the reductions (row template only)
    reload: int = 0
    # row tiles of whole rows a program sweeps, one after another, the next one's loads issued
    # while one is reduced (row template only; a plan with sums down the rows: each program
    # adds its tiles' contributions up and stores one partial row of each sum)
    row_tiles: int = 1
    # 1: states kept relative to moving sums (a variance's, to its mean) are kept per lane, the
    # sums' references fixed after a sweep's first block (row template only:
    # ``targets.triton.row_states.referenced_lanes``); 0: reduced across the warps every block
    lanes: int = 0


class TilePlanner:
    """The row-tile plan of one fused chain, made per shape; and the block schedule of a masked
    plan, made per call (the emitter's launcher asks for both, it decides neither)."""

    def __init__(self, program: Program, chain: Chain):
        self.program, self.chain = program, with_value_features(chain)
        self._plans: dict = {}   # the sizes planning reads -> the plan made at them

    def plan(self, dims: dict) -> RowTilePlan:
        """The plan at ``dims``, made once per the sizes planning reads (:func:`plan_rowtile`
        reads the feature, row and batch extents and group divisors, not the swept extent) and
        given the call's sizes: a decode's first call at a new cache length (1.2–1.6 ms over the
        steady call on the H200, ``tools/profile_new_sizes.py``) spent about half its Python
        planning its chain again (cProfile, the GPU's parts stubbed out)."""
        if not all(type(v) is int for v in dims.values()):   # symbolic sizes: a comparison
            return plan_rowtile(self.program, self.chain, dims)  # would record a guard
        key = tuple(sorted((n, v) for n, v in dims.items() if n not in self._swept_only))
        found = self._plans.get(key)
        if found is None:
            found = plan_rowtile(self.program, self.chain, dims)
            if len(self._plans) > 256:
                self._plans.clear()
            self._plans[key] = found
            return found
        return replace(found, sizes=dims)

    @cached_property
    def _swept_only(self) -> frozenset:
        """The swept axis' size name where no other axis has it and no divisor reads it."""
        col = self.chain.axis
        name = col.extent if col is not None and isinstance(col.extent, str) else None
        shared = name is None or any(a.extent == name for a in self.program.axes
                                     if a.uid != col.uid)
        divides = any(isinstance(n, Binary) and n.op == "floordiv" and
                      any(isinstance(d, DimSize) and d.name == name for d in nodes(n.b))
                      for c in self.program.computes for body in c.bodies for n in nodes(body))
        return frozenset() if shared or divides else frozenset({name})

    @cached_property
    def reads_map(self) -> bool:
        """Whether the chain's mask reads the rows or the keys as a map (``i // W``, ``i % W``):
        a visiting order in patches may then beat the flat one."""
        return mask_reads_map(identity_mask(self.chain),
                              (row_roles(self.chain)[1], self.chain.axis))

    @cached_property
    def layout_scalars(self) -> tuple[str, ...]:
        """The scalars a visiting order may depend on: those of a mask that reads the rows or
        keys as a map (a width, a radius, a dilation). Kernels are built per their values.
        Computed once: every call's launch key reads it."""
        return map_scalars(identity_mask(self.chain), (row_roles(self.chain)[1], self.chain.axis))

    def tile(self, plan: RowTilePlan, knobs: Knobs, scalars: dict | None,
             request: "dict | None | bool" = True) -> RowTilePlan:
        """``plan`` with the visiting order of its rows and keys chosen for its mask
        (:func:`.token_tiling.choose_tiling`), where it has one that reads the axes as a map and
        the kernel sweeps its keys once per row block. ``request``: ``True`` to choose, ``False``
        for the flat order, or ``Schedule.tile_as``'s patch/key_patch/dilation."""
        names = self.layout_scalars
        asked = isinstance(request, dict)
        if request is False or not asked and not mask_reads_map(plan.map_mask, (plan.row,
                                                                                plan.col)):
            return plan
        why = None
        if knobs.splits > 1 or plan.fold is not None or plan.rows <= 64:
            why = "the keys are split over programs (decode)"
        elif any(kind == "col" for _, _, kind in plan.outputs):
            why = "an output runs along the keys"
        elif any(n not in (scalars or {}) for n in names):
            why = f"the values of {', '.join(names)} are needed to choose"
        elif mask_reads_tensors(plan.map_mask):   # a block-sparse layout, document ids
            why = "the mask reads tensors (their values come with each call)"
        if plan.mask is None:
            why = "the chain has no mask to follow"
        if why is not None:
            if asked:
                raise ScheduleError(f"tile_as: {why}")
            return plan
        choice = choose_tiling(plan.map_mask, plan.batch, plan.row, plan.col, plan.sizes,
                               dict(scalars or {}), knobs.block_m, knobs.block_n,
                               request if isinstance(request, dict) else None)
        if names:
            plan = _with_scalars_compiled_in(plan, {n: scalars[n] for n in names})
        return replace(plan, row_tiling=choice.rows, key_windows=choice.cols, tiling=choice)

    def block_lists(self, plan: RowTilePlan, knobs: Knobs, sizes: dict, tensors: dict,
                    scalars: dict, device):
        """The partial and full blocks of each row block (:func:`.block_schedule.block_lists`;
        key-window origins with :func:`.block_schedule.window_lists`)."""
        if plan.key_windows is not None:
            return window_lists(plan.mask, plan.batch, plan.row, plan.col, sizes, scalars,
                                knobs.block_m, device, plan.row_tiling, plan.key_windows)
        return block_lists(plan.mask, plan.batch, plan.row, plan.col, sizes, tensors, scalars,
                           knobs.block_m, knobs.block_n, device, plan.row_tiling)
