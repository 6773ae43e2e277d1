"""Reductions over the positions up to an output's own: scans (cumulative sums, running maxima,
suffix products), written as the math a user writes them.

The DSL has no scan of its own: a cumulative sum is ``T.sum(T.where(j <= i, x[b, j], 0.0),
over=j)`` — every output element ``i`` reduces the terms at or before it. As a dense reduction
each of ``N`` outputs visits ``N`` terms: ``N²`` work where a scan does ``N`` (a row of 4096:
4096× the arithmetic; the contraction template took it as a GEMM against the mask).
:func:`plan_scan` recognises the form: one reduction over one axis ``j``, its body
``where(j ⋚ i, value, identity)`` (under any further conditions, and for sums also ``value ·
where(j ⋚ i, 1, 0)``) for an axis ``i`` of the result with ``j``'s extent that neither the value
nor the other conditions read; the program's other computes elementwise, before the reduction
(inlined into its value) or after it (the outputs' epilogue, which may read ``i``: a cumulative
sum's normalised row, ``x[b, i] / cumsum``). ``j <= i`` is an inclusive prefix, ``j < i`` an
exclusive one (the value read one position back), ``j >= i`` and ``j > i`` suffixes (swept from
the end); either side may be offset by an integer (``j <= i - 2``: each position's sum up to
two before it; ``j <= i + 2``: up to two past it, the row's first two terms starting the first
part's carry). Any monoid of one component Triton can combine scans: sum, product, max, min, a
user's ``T.Monoid``; and ``T.argmax`` / ``T.argmin`` (the index of the running maximum, ties to
the first), their value and index scanned together.

The emitter (:mod:`tensorfuse.targets.triton.scan`) sweeps each row's blocks in order, scanning
a block with ``tl.associative_scan`` and carrying the combined total of the blocks before it.
Where the rows alone would not fill the GPU (one long sequence), each row is cut into
:func:`parts`: a first kernel reduces every part, the scan kernel starts each part from the
combination of the parts before it — the value is read twice, but every SM has work.
"""
from __future__ import annotations

import math
from functools import reduce
from dataclasses import dataclass
from typing import NamedTuple

from ..algebra import inline_elementwise
from ..algebra.exprs import (conjuncts, factors, has_axis, is_const, mul, nodes, simplify,
                              substitute)
from ..dsl.expr import (Axis, Binary, Cast, Compare, Const, DimSize, Expr, Load, Ref, Unary,
                        Where, binary, unary)
from ..dsl.monoid import Monoid
from ..dsl.printer import to_text
from ..dsl.program import Compute, Program
from ..errors import TargetError
from ..targets.triton.scan import MAX_SUMMED
from .attention import SMS
from .scatter import outputs_over

# j ⋚ i read as (direction, shift): the term at j = i + shift is the last one in (the first,
# from the end)
_RELATIONS = {"le": ("prefix", 0), "lt": ("prefix", -1), "ge": ("suffix", 0),
              "gt": ("suffix", 1)}
_FLIPPED = {"le": "ge", "lt": "gt", "ge": "le", "gt": "lt"}
# parts of a row at most (the scan kernel combines their totals in one tile): one long row in
# that many parts is about two programs an SM
MAX_PARTS = 256
ARGS = ("argmax", "argmin")   # monoids of a value and its index that scan as one
# programs the parts aim at: two an SM (not measured yet: ``benchmarks.scan_kernels``)
PROGRAMS = 2 * SMS
# a discounted sum scanned: (decay, sum) pairs, the later pair's decay applied to the earlier
# sum — order matters (not commutative), so the emitter folds it by scans, never by reductions
DECAYED = Monoid("decayed_sum", lambda d1, v1, d2, v2: (d1 * d2, v1 * d2 + v2), (1.0, 0.0),
                 arity=2, check=False)


class ChainStates(NamedTuple):
    """A chain of dependent reductions scanned together (:mod:`.chain_scans`): the monoid of
    their running states, each component's dtype, and ``(member, component)`` of each member
    the outputs read."""

    monoid: Monoid
    dtypes: tuple
    read: tuple


class SummedRows(NamedTuple):
    """The outputs read ``name``, the sum over the row axis ``axis`` of the scan's ``summand``
    (:func:`_summed_over_rows`: a selective scan's state read by C, ``Σ_n C[b, i, n] · h[b, i,
    d, n]``), added up within the tile."""

    axis: Axis
    summand: Expr
    name: str


@dataclass(frozen=True)
class ScanPlan:
    """``total[..., i] = ⊕ values[..., j]`` over ``j`` up to ``i`` (``direction`` ``prefix``:
    ``j ≤ i + shift``; ``suffix``: ``j ≥ i + shift``) where ``conditions`` hold; then
    ``outputs`` (compute, expression over ``total``'s axes reading it as a :class:`Ref`)."""

    program: Program
    total: Compute
    axis: Axis          # j, the axis reduced
    out_axis: Axis      # i, the result's axis the reduction runs up to
    direction: str
    shift: int
    values: tuple       # one expression a component of the monoid (an arg's value, index)
    conditions: tuple
    outputs: tuple
    # a discounted sum's factor a step (c in Σ c^(i−j)·x[j]): scanned as (decay, sum) pairs
    decay: "Expr | None" = None
    chain: "ChainStates | None" = None
    summed: "SummedRows | None" = None

    @property
    def monoid(self):
        if self.chain is not None:
            return self.chain.monoid
        return DECAYED if self.decay is not None else self.total.monoid

    @property
    def dtypes(self) -> tuple:
        """The scanned components' dtypes: the result's, a decay's and the sum's, or a
        chain's states'."""
        if self.chain is not None:
            return self.chain.dtypes
        return ("f32", self.total.dtypes[0]) if self.decay is not None else self.total.dtypes

    @property
    def members(self) -> tuple:
        """``(member name, component)`` of each reduction of a chain the outputs read; ``()``
        for a scan of one reduction."""
        return self.chain.read if self.chain is not None else ()

    @property
    def is_arg(self) -> bool:
        """Whether the plan scans an arg reduction's (value, index) pairs."""
        return self.monoid.name in ARGS

    @property
    def result_component(self) -> "int | None":
        """Which component the result is where it is one of several scanned (the sum beside a
        decay); None where the result has them all (an arg reduction's value and index)."""
        if self.chain is not None:
            return None
        return 1 if self.decay is not None else (0 if len(self.dtypes) == 1 else None)

    @property
    def scanned_axes(self) -> tuple[Axis, ...]:
        """The axes of what is scanned: the first output's (the innermost last), or the
        scanned reduction's where the outputs sum over a row axis of it."""
        return self.total.axes if self.summed else self.outputs[0][0].axes

    @property
    def rows(self) -> tuple[Axis, ...]:
        """The scanned result's other axes (the innermost last)."""
        return tuple(a for a in self.scanned_axes if a.uid != self.out_axis.uid)

    @property
    def along_rows(self) -> bool:
        """Whether the output's innermost axis is ``i`` (a tile then reads along the scan)."""
        return self.scanned_axes[-1].uid == self.out_axis.uid

    max_parts = MAX_PARTS
    programs = PROGRAMS   # the programs a call's rows should make, or its parts

    def parts(self, rows: int, length: int, block_m: int, block_n: int) -> int:
        """The parts each of ``rows`` rows of ``length`` positions is cut into, in tiles of
        ``block_m`` rows × ``block_n`` positions: one where the rows' programs already make
        :data:`PROGRAMS`, else enough to, each at least four blocks long and at most
        :data:`MAX_PARTS`."""
        programs = math.ceil(rows / block_m)
        blocks = math.ceil(length / block_n)
        if programs >= self.programs:
            return 1
        return max(1, min(MAX_PARTS, math.ceil(self.programs / programs), blocks // 4))

    def describe(self) -> str:
        where = "".join(f" where {to_text(c)}" for c in self.conditions)
        relation = "<=" if self.direction == "prefix" else ">="
        offset = f" {'+' if self.shift > 0 else '-'} {abs(self.shift)}" if self.shift else ""
        what = f"{self.total.name}[{self.out_axis.name}] = {self.total.monoid.name}"
        if self.chain is not None:
            what = (f"{', '.join(n for n, _ in self.members)}[{self.out_axis.name}] = "
                    f"{self.monoid.name} (running states scanned together, corrected as they "
                    "combine)")
        return (f"scan plan of {self.program.name}: {what} of "
                f"{', '.join(map(to_text, self.values))}{where}"
                + (f" discounted by {to_text(self.decay)} a step" if self.decay is not None
                   else "") +
                f" over {self.axis.name} {relation} {self.out_axis.name}{offset} "
                f"({self.direction} scan, "
                f"rows {', '.join(a.name for a in self.rows) or '(one)'}); outputs: "
                + ", ".join(c.name for c, _ in self.outputs)
                + (f" (of {to_text(self.summed.summand)} summed over "
                   f"{self.summed.axis.name} in each tile)" if self.summed else ""))


def plan_scan(program: Program) -> ScanPlan:
    """The scan plan of ``program``, or a :class:`TargetError` that says why it has none."""
    reductions = [c for c in program.computes if c.is_reduction]
    summed = None
    if len(reductions) == 2 and is_scan(reductions[0]):
        summed, outputs = _summed_over_rows(program, *reductions)
    elif len(reductions) != 1:
        raise TargetError(f"{len(reductions)} reductions; a scan program has one")
    total = reductions[0]
    i, direction, shift, values, rest, decay, scale = _scanned(total)
    if summed is None:
        outputs = outputs_over(program, total)
    if scale is not None:   # the scanned sum is relative to the position's own decay
        key = ("ref", total.name, 0)
        scaled = lambda e: substitute(e, lambda n: binary("mul", n, scale)  # noqa: E731
                                      if n.key() == key else None)
        if summed is None:
            outputs = tuple((c, scaled(e)) for c, e in outputs)
        else:
            summed = summed._replace(summand=scaled(summed.summand))
    return ScanPlan(program, total, total.over[0], i, direction, shift, values, rest,
                    outputs, decay, summed=summed)


def _summed_over_rows(program: Program, total: Compute, summed: Compute) -> tuple:
    """``((n, summand, summed's name), ((output, expression), ))`` where the program's one
    output is elementwise over ``summed``, ``Σ_n`` of an elementwise expression (the summand)
    of the scan ``total`` and of loads (a selective scan's state read by ``C``: ``Σ_n C[b, i,
    n] · h[b, i, d, n]``), ``n`` the innermost of ``total``'s axes, of an extent up to
    :data:`MAX_SUMMED` (a tile's rows hold every ``n`` of theirs, padded to a power of two; a
    size given at the call is checked when its kernel is built). Else :class:`TargetError`."""
    if summed.monoid.name != "sum" or summed.arity != 1 or len(summed.over) != 1:
        raise TargetError(f"{summed.name} is not a sum over one axis of {total.name}")
    n = summed.over[0]
    if total.axes[-1].uid != n.uid or any(a.uid == n.uid for a in summed.axes) or \
            {a.uid for a in summed.axes} | {n.uid} != {a.uid for a in total.axes}:
        raise TargetError(f"{summed.name} does not sum {total.name} over its innermost axis")
    if isinstance(n.extent, int) and n.extent > MAX_SUMMED:
        raise TargetError(f"{summed.name} sums over {n.extent} values of {n.name}; a tile adds "
                          f"up to {MAX_SUMMED}")
    term = inline_elementwise(summed.bodies[0])
    if {x.compute.name for x in nodes(term) if isinstance(x, Ref)} != {total.name}:
        raise TargetError(f"{summed.name} reads other values than {total.name}")
    outputs = []
    for c in program.outputs:
        expr = inline_elementwise(c.bodies[0]) if c is not summed else Ref(c, 0, c.loc)
        if {x.compute.name for x in nodes(expr) if isinstance(x, Ref)} != {summed.name} or \
                {a.uid for a in c.axes} != {a.uid for a in summed.axes} or \
                any(isinstance(x, Load) and has_axis(x, n) for x in nodes(expr)):
            raise TargetError(f"output {c.name} is not elementwise over {summed.name}")
        outputs.append((c, expr))
    if len(outputs) != 1:
        raise TargetError("a scan whose outputs sum over a row axis writes one output")
    return SummedRows(n, term, summed.name), tuple(outputs)


def planned(planner, program: Program) -> bool:
    """Whether ``planner`` plans ``program`` (raises no :class:`TargetError`)."""
    try:
        planner(program)
    except TargetError:
        return False
    return True


def scans(program: Program) -> bool:
    """Whether ``program`` is a scan (:func:`plan_scan` plans it)."""
    return planned(plan_scan, program)


def near_miss(program: Program) -> str | None:
    """Why the scan template does not take ``program`` where its one reduction compares its
    axis with one of its result's as a scan does (a sum to the end weighted by the distance:
    terms that read the position too) — what ``describe_plan`` says of the template; None
    where it does not compare them, or the template takes it."""
    reductions = [c for c in program.computes if c.is_reduction]
    if len(reductions) != 1 or len(reductions[0].over) != 1:
        return None   # (several: a chain — causal attention compares j with i too)
    c = reductions[0]
    j = c.over[0]
    conditions = peeled(inline_elementwise(c.bodies[0]), c)[1]
    found = relations(conditions, j, c)
    if not found:
        return None
    kept = {a.uid for a in c.axes}
    parsed = {k for k, _, _ in found}
    both = [e for n, e in enumerate(conditions) if isinstance(e, Compare) and n not in parsed
            and j.uid in {a.uid for a in e.axes} and kept & {a.uid for a in e.axes}]
    if any(e.op in ("eq", "ne") for e in both):
        return (f"{c.name} keeps the terms where {', '.join(to_text(e) for e in both)}: a "
                f"condition tying {j.name} to the output's own position that bounds no range "
                f"of {j.name} (equal keys need not be neighbours), so every {j.name} of the row "
                "is reduced")
    if both:
        return (f"{c.name} reduces over a band of positions whose width is no integer constant "
                f"({', '.join(to_text(e) for e in both)}): every {j.name} of the row is "
                f"reduced; a window axis of the band's width reduces only the band")
    try:
        plan_scan(program)
    except TargetError as exc:
        return exc.message
    return None


def is_scan(total: Compute) -> bool:
    """Whether the reduction ``total`` runs over the positions up to each of its own (the form
    :func:`plan_scan` takes, whatever else its program computes)."""
    try:
        _scanned(total)
    except TargetError:
        return False
    return True


def _scanned(total: Compute) -> tuple:
    """``(i, direction, shift, values, other conditions, decay, scale)`` of a reduction in the
    scan form (one value, or an arg reduction's value and index: the conditions are its
    value's; a discounted sum's value without its factor c^(i − j) or exp(A(i) − B(j)), the
    decay a step, and what the scanned sum is multiplied by at the output's position, or
    None); else :class:`TargetError` saying why not."""
    j, values, conditions = terms_of(total, "scan")
    found = _relation(conditions, j, total)
    if found is None:
        raise TargetError(f"{total.name} has no condition comparing {j.name} with an axis of "
                          "its result of the same extent")
    k, i, (direction, shift) = found
    rest = tuple(c for n, c in enumerate(conditions) if n != k)
    decay = scale = None
    if total.monoid.name == "sum" and _reads(values[0], i):
        decay, value, scale = _discounted(values[0], i, j, direction)
        if decay is not None and shift:
            raise TargetError(f"{total.name} is a discounted sum over {j.name} up to "
                              f"{i.name} {shift:+d}: the scan template discounts from the "
                              "output's own position only")
        values = (value,) if decay is not None or scale is not None else values
    if any(_reads(e, i) for e in values + rest):
        raise TargetError(f"the terms of {total.name} read {i.name} beside comparing it" +
                          (" (beyond a factor c^(i − j) or exp(A(i) − B(j)) of a discounted "
                           "sum)" if total.monoid.name == "sum" else ""))
    return i, direction, shift, values, rest, decay, scale


def _reads(e: Expr, axis: Axis) -> bool:
    return axis.uid in {a.uid for a in e.axes}


def _discounted(value: Expr, i: Axis, j: Axis, direction: str) -> tuple:
    """``(d, rest, scale)`` where ``value`` is ``rest`` times one factor that reads ``i`` as a
    power of the distance — ``c ** (i − j)``, ``exp(λ·(i − j))`` (either sign, casts around the
    distance), ``c`` and ``λ`` reading neither axis — with ``d`` the factor a step in the scan's
    direction (``c`` or ``1/c``) and ``scale`` None; or as ``exp(A(i) − B(j))`` (a decay that
    varies along the sequence: a gated linear recurrence ``h_i = a_i·h_{i−1} + u_i`` written
    with ``c`` the running sum of ``log a``, ``exp(c[i] − c[j])``) with ``d`` the step of
    ``B``, ``exp(B(j) − B(j ∓ 1))``, and ``scale`` ``exp(A(i) − B(i))`` (1 where ``A`` and
    ``B`` are one expression). Factors of ``i`` alone (a gradient's ``d_out[i]``) join the
    scale, with or without a decay. Else ``(None, value, None)``."""
    negated = isinstance(value, Unary) and value.op == "neg"
    terms = factors(value.a if negated else value)
    # factors of the output's position alone (a gradient's d_out[i]) scale the output
    own = [f for f in terms if _reads(f, i) and not _reads(f, j)]
    reading = [f for f in terms if _reads(f, i) and _reads(f, j)]
    if len(reading) > 1:
        return None, value, None
    step, scaling = None, list(own)
    if reading:
        found = _power_of_distance(reading[0], i, j)
        if found is not None:
            base, sign = found
            # a prefix discounts by c^(i − j), a suffix by c^(j − i): a step's factor either way
            step = base if sign == (1 if direction == "prefix" else -1) else \
                binary("div", 1.0, base)
        else:
            found = _exp_difference(reading[0], i, j)
            if found is None:
                return None, value, None
            step, varying = _varying_steps(*found, i, j, direction)
            scaling.append(varying)
    scale = reduce(mul, scaling, Const(1.0, value.dtype))
    rest = reduce(mul, [f for f in terms if not _reads(f, i)], Const(1.0, value.dtype))
    return step, unary("neg", rest) if negated else rest, None if is_const(scale, 1) else scale


def _exp_difference(f: Expr, i: Axis, j: Axis) -> "tuple | None":
    """``(A, B)`` with ``f = exp(A − B)``, ``A`` reading ``i`` and not ``j``, ``B`` reading
    ``j`` and not ``i`` (the exponent's terms, added or subtracted, sorted by the axis they
    read; those reading neither go to ``A``); else None."""
    if not (isinstance(f, Unary) and f.op == "exp"):
        return None
    terms: list = []

    def split(e: Expr, sign: int) -> None:
        if isinstance(e, Binary) and e.op in ("add", "sub"):
            split(e.a, sign)
            split(e.b, sign if e.op == "add" else -sign)
        elif isinstance(e, Unary) and e.op == "neg":
            split(e.a, -sign)
        else:
            terms.append((e, sign))
    split(f.a, 1)
    if any(_reads(e, i) and _reads(e, j) for e, _ in terms) or \
            not any(_reads(e, j) for e, _ in terms):
        return None
    a = [(e, s) for e, s in terms if not _reads(e, j)]
    b = [(e, -s) for e, s in terms if _reads(e, j)]
    return _summed(a), _summed(b)


def _summed(terms: list) -> Expr:
    out = None
    for e, sign in terms:
        out = (e if sign > 0 else unary("neg", e)) if out is None else \
            binary("add" if sign > 0 else "sub", out, e)
    return out if out is not None else Const(0.0, "f32")


def _varying_steps(a: Expr, b: Expr, i: Axis, j: Axis, direction: str) -> tuple:
    """``(the decay a step, the scale at the output)`` of ``Σ exp(A(i) − B(j))·u_j``: a prefix
    scan's step into ``j`` is ``exp(B(j) − B(j − 1))`` (a suffix's, ``exp(B(j) − B(j + 1))``),
    the neighbour's index clamped into the row (the row's edge decays by exp(0): nothing lies
    beyond it, and nothing is read outside the tensor), so the scan holds ``Σ exp(B(i) −
    B(j))·u_j``; the output multiplies it by ``exp(A(i) − B(i))``."""
    last = Binary("sub", _extent_of(j), Const(1, "i32"), "i32") if direction == "suffix" \
        else None
    near = binary("max", binary("sub", j, 1), 0) if direction == "prefix" else \
        binary("min", binary("add", j, 1), last)
    at = lambda axis, to: (lambda n: to if isinstance(n, Axis) and n.uid == axis.uid  # noqa
                           else None)
    step = unary("exp", binary("sub", b, substitute(b, at(j, near))))
    return step, simplify(unary("exp", binary("sub", a, substitute(b, at(j, i)))))


def _extent_of(axis: Axis) -> Expr:
    return Const(axis.extent, "i32") if isinstance(axis.extent, int) else \
        DimSize(axis.extent)


def _distance(e: Expr, i: Axis, j: Axis) -> "int | None":
    """+1 for ``i − j``, −1 for ``j − i`` (casts and negations around it seen through)."""
    while isinstance(e, Cast):
        e = e.a
    if isinstance(e, Unary) and e.op == "neg":
        inner = _distance(e.a, i, j)
        return -inner if inner else None
    if isinstance(e, Binary) and e.op == "sub" and isinstance(e.a, Axis) and \
            isinstance(e.b, Axis):
        pair = (e.a.uid, e.b.uid)
        return 1 if pair == (i.uid, j.uid) else -1 if pair == (j.uid, i.uid) else None
    return None


def _power_of_distance(f: Expr, i: Axis, j: Axis) -> "tuple | None":
    """``(c, sign)`` with ``f = c ** (sign·(i − j))`` and ``c`` reading neither axis."""
    free = lambda e: not (_reads(e, i) or _reads(e, j))   # noqa: E731
    if isinstance(f, Binary) and f.op == "pow" and free(f.a):
        sign = _distance(f.b, i, j)
        return (f.a, sign) if sign else None
    if not (isinstance(f, Unary) and f.op == "exp"):
        return None
    e = f.a
    sign = _distance(e, i, j)
    if sign:
        return unary("exp", Const(1.0, "f32")), sign
    if isinstance(e, Binary) and e.op == "mul":
        for rate, d in ((e.a, e.b), (e.b, e.a)):
            sign = _distance(d, i, j)
            if sign and free(rate):
                return unary("exp", rate), sign
    if isinstance(e, Binary) and e.op == "div" and free(e.b):
        sign = _distance(e.a, i, j)
        if sign:
            return unary("exp", binary("div", 1.0, e.b)), sign
    return None


def terms_of(total: Compute, what: str) -> tuple:
    """``(j, values, conditions)`` of a reduction over one axis ``j`` of one value (or an arg
    reduction's value and index): its values without the conditions around them
    (:func:`peeled`); else :class:`TargetError` naming ``what`` takes only those."""
    if len(total.over) != 1 or total.arity != 1 and total.monoid.name not in ARGS:
        raise TargetError(f"{total.name} reduces {len(total.over)} axes into {total.arity} "
                          f"values; a {what} reduces one axis into one value, or a value and "
                          "its index")
    body, conditions = peeled(inline_elementwise(total.bodies[0]), total)
    values = (body,) + tuple(inline_elementwise(b) for b in total.bodies[1:])
    return total.over[0], values, conditions


def peeled(body: Expr, total: Compute) -> tuple[Expr, list]:
    """``body`` without the conditions around it — ``where(c, v, identity)``, and for sums
    ``v · where(c, u, 0)`` (``u · v`` under ``c``) — and those conditions, conjunctions split."""
    conditions = []
    negated = False
    while True:
        if total.monoid.name == "sum" and isinstance(body, Unary) and body.op == "neg":
            negated = not negated   # −where(c, u, 0): where(c, −u, 0)
            body = body.a
            continue
        if isinstance(body, Where) and _absorbed(body.b, total):
            conditions.append(body.cond)
            body = body.a
            continue
        if total.monoid.name == "sum" and isinstance(body, Binary) and body.op == "mul":
            # v · where(c, 1, 0), and where(c, u, 0) · v (a gradient's form): where(c, u · v, 0)
            # — the masked factor anywhere in the product (where(c, g, 0) · u · exp(…))
            found = factors(body)
            at = next((k for k, m in enumerate(found) if isinstance(m, Where) and
                       _is(m.b, 0)), None)
            if at is not None:
                mask = found[at]
                conditions.append(mask.cond)
                rest = found[:at] + ([] if _is(mask.a, 1) else [mask.a]) + found[at + 1:]
                body = reduce(mul, rest, Const(1.0, body.dtype))
                continue
        break
    return unary("neg", body) if negated else body, \
        [term for c in conditions for term in conjuncts(c)]


def _is(e: Expr, value: float) -> bool:
    return isinstance(e, Const) and e.value == value


def _absorbed(e: Expr, total: Compute) -> bool:
    """Whether a term ``e`` leaves every value as it is under ``total``'s monoid: its identity
    (−∞ for a max, +∞ for a min as well)."""
    if not isinstance(e, Const):
        return False
    name = total.monoid.name
    return e.value == total.monoid.identity_value(0, total.dtypes[0]) or \
        name in ("max", "argmax") and e.value == -math.inf or \
        name in ("min", "argmin") and e.value == math.inf


def _relation(conditions: list, j: Axis, total: Compute):
    """``(index of the condition, i, (direction, shift))`` of the first condition comparing
    ``j`` with an axis ``i`` of ``total``'s result of ``j``'s extent, either side offset by an
    integer (``j <= i``, ``i > j``, ``j <= i - 1``, ``j + 2 > i``); else None."""
    found = relations(conditions, j, total)
    return found[0] if found else None


def relations(conditions: list, j: Axis, total: Compute) -> list:
    """Every such condition's ``(index, i, (direction, shift))`` (:func:`_relation`), in order."""
    kept = {a.uid: a for a in total.axes}
    found = []
    for k, c in enumerate(conditions):
        if not isinstance(c, Compare) or c.op not in _FLIPPED:
            continue
        for a, b, op in ((c.a, c.b, c.op), (c.b, c.a, _FLIPPED[c.op])):
            left, right = _offset_axis(a), _offset_axis(b)
            if left is None or right is None or left[0].uid != j.uid:
                continue
            i = kept.get(right[0].uid)
            if i is not None and i.extent == j.extent:
                direction, shift = _RELATIONS[op]   # j ⋚ i + (right's offset − left's)
                found.append((k, i, (direction, shift + right[1] - left[1])))
                break
    return found


def _offset_axis(e: Expr):
    """``(axis, offset)`` of ``axis``, ``axis + n``, ``n + axis`` or ``axis − n`` (``n`` an
    integer constant); else None."""
    if isinstance(e, Axis):
        return e, 0
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        for axis, n, sign in ((e.a, e.b, 1 if e.op == "add" else -1),
                              (e.b, e.a, 1 if e.op == "add" else 0)):
            if sign and isinstance(axis, Axis) and isinstance(n, Const) and \
                    float(n.value).is_integer():
                return axis, sign * int(n.value)
    return None
