"""Reductions over a band of positions around each output's own — a rolling maximum, a moving
sum, a local average: ``T.max(T.where((j <= i) & (j > i - 64), x[b, j], -T.inf), over=j)`` —
as reductions over a window axis of the band's width.

Written so, the reduction runs over every position ``j`` of the row and masks all but the band:
N terms an output where the band has W (the contraction template took a rolling maximum of 64
over rows of 65536 as every (i, j) pair: 1000× the work). :func:`band_window` finds the band —
two conditions on the reduction's one axis ``j`` against an axis ``i`` of its result of ``j``'s
extent, ``j ≤ i + hi`` and ``j ≥ i + lo`` with integer offsets (either side, ``<`` and ``>`` as
one less and more), gating the monoid's identity as a scan's condition does
(:mod:`.scan`) — and rewrites the reduction over a new axis ``k`` of ``hi − lo + 1`` elements,
``j = i + lo + k``, the positions before the row's start or past its end left out; everything
else of the program as it was (the original conditions stay: true inside the band). The
row-reduction template then sweeps ``k`` for rows ``(…, i)``, W terms an output.

Where the terms do not read ``i``, :func:`plan_band` does better: a band of W positions is two
scans of segments of W. Cut the window starts ``a = i + lo`` into segments of
W; a window ``[a, a + W − 1]`` is the end of its start's segment, ``[a, segment end]`` (a
suffix scan of the segment), followed by the start of the next segment up to ``a + W − 1``
(a prefix scan of the next segment, one position short). The two pieces are disjoint and in
order, so any monoid combines them — a maximum, a moving sum, a rolling log-sum-exp, an
arg-maximum — at a few operations an output whatever W (the Gil-Werman / van Herk algorithm,
without the overlap that limits it to maxima and minima). The emitter
(:mod:`tensorfuse.targets.triton.band_scan`) holds a tile of segments × W positions (× 32 rows
side by side where ``i`` is not the innermost axis: a band down the sequence of ``[B, S, C]``),
loads it twice (the second load one segment on, from cache) and scans both along the
segments. Terms that read ``i`` (a weight by distance) take the window axis above."""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra import inline_elementwise
from ..algebra.exprs import nodes, rewrite_computes, rewritten_program
from ..dsl.expr import Axis, Const, DimSize, Ref, compare, where
from ..dsl.printer import to_text
from ..dsl.program import Compute, Program
from ..errors import TargetError
from .scan import ScanPlan, peeled, planned, relations, terms_of
from .scatter import outputs_over

# widest band the two-scan plan takes: a tile holds one segment of the width's next power of
# two at least (wider bands take the window axis)
MAX_WIDTH = 8192


@dataclass(frozen=True)
class BandPlan(ScanPlan):
    """``total[..., i] = ⊕ values[..., j]`` over ``j`` from ``i + low`` to ``i + shift`` (the
    band's last position) where ``conditions`` hold: a :class:`~.scan.ScanPlan` with a lower
    bound, reduced as two scans of segments of the band's :attr:`width`."""

    low: int = 0

    @property
    def width(self) -> int:
        return self.shift - self.low + 1

    def describe(self) -> str:
        where_ = "".join(f" where {to_text(c)}" for c in self.conditions)
        return (f"band plan of {self.program.name}: {self.total.name}[{self.out_axis.name}] = "
                f"{self.monoid.name} of {', '.join(map(to_text, self.values))}{where_} over "
                f"{self.axis.name} from {self.out_axis.name} {self.low:+d} to "
                f"{self.out_axis.name} {self.shift:+d} ({self.width} positions: a suffix scan "
                f"and a prefix scan of segments of {self.width}, rows "
                f"{', '.join(a.name for a in self.rows) or '(one)'}); outputs: "
                + ", ".join(c.name for c, _ in self.outputs))


def plan_band(program: Program) -> BandPlan:
    """The band plan of ``program`` — one reduction (one value, or an arg reduction's value
    and index) over a band of at most :data:`MAX_WIDTH` positions of an axis of its result, its
    terms not reading that axis — or a :class:`TargetError` saying why not."""
    reductions = [c for c in program.computes if c.is_reduction]
    if len(reductions) != 1:
        raise TargetError(f"{len(reductions)} reductions; a band program has one")
    total = reductions[0]
    j, values, conditions = terms_of(total, "band")
    bounds = _band_of(total, j, conditions)
    if bounds is None:
        raise TargetError(f"{total.name} reduces no band of {j.name} (a condition on each side "
                          "of an axis of its result, integer offsets apart)")
    i, lo, hi, used = bounds
    if hi - lo + 1 > MAX_WIDTH:
        raise TargetError(f"the band is {hi - lo + 1} positions wide; the two-scan plan takes "
                          f"up to {MAX_WIDTH}")
    rest = tuple(c for n, c in enumerate(conditions) if n not in used)
    if any(i.uid in {a.uid for a in e.axes} for e in values + rest):
        raise TargetError(f"the terms of {total.name} read {i.name} beside bounding the band")
    return BandPlan(program, total, j, i, "prefix", hi, values, rest,
                    outputs_over(program, total), low=lo)


def bands(program: Program) -> bool:
    """Whether ``program`` is a band the band template takes (:func:`plan_band` plans it)."""
    return planned(plan_band, program)


def _band_of(total, j: Axis, conditions: list):
    """``(i, lo, hi, indices of the conditions)`` of the tightest band of ``j`` among
    ``total``'s ``conditions`` (two of :func:`~.scan.relations` on one axis ``i``, one each
    side); else None."""
    found = relations(conditions, j, total)
    for i in {r[1].uid: r[1] for r in found}.values():
        upper = [(shift, k) for k, axis, (direction, shift) in found
                 if axis.uid == i.uid and direction == "prefix"]
        lower = [(shift, k) for k, axis, (direction, shift) in found
                 if axis.uid == i.uid and direction == "suffix"]
        if upper and lower and min(upper)[0] >= max(lower)[0]:
            return i, max(lower)[0], min(upper)[0], {k for _, k in upper + lower}
    return None


def band_window(program: Program) -> tuple[Program, str] | None:
    """``program`` with each of its reductions over a band of positions rewritten over a
    window axis of the band's width, and a note saying so; else ``None``: where a reduction is
    over no band, reads another compute's values along its band (:func:`_reads_computed`), or
    two reductions over one axis have different bands. Several reductions
    over one band — a rolling mean and the rolling variance about it — share the window axis,
    and the row template fuses them over it as any chain."""
    reductions = [c for c in program.computes if c.is_reduction]
    bands, by_axis = [], {}
    for total in reductions:
        if total.arity != 1 or len(total.over) != 1:
            return None
        j = total.over[0]
        found = _band_of(total, j, peeled(inline_elementwise(total.bodies[0]), total)[1])
        if found is None or _reads_computed(total, j):
            return None
        i, lo, hi = found[:3]
        if by_axis.setdefault(j.uid, (i.uid, lo, hi)) != (i.uid, lo, hi):
            return None
        bands.append((total, j, i, lo, hi))
    return _windowed(program, bands) if bands else None


def _reads_computed(total: Compute, j) -> bool:
    """Whether ``total``'s terms read another compute's values along ``j`` (a nested
    reduction's inner stage): such a read takes its indices from the compute's own axes, which
    no window axis can stand in for — the floor's stages read it as a tensor instead."""
    return any(isinstance(n, Ref) and j.uid in {a.uid for a in n.compute.axes}
               for n in nodes(inline_elementwise(total.bodies[0])))


def _windowed(program: Program, bands: list):
    """The rewrite of each ``(total, j, i, lo, hi)``: ``j = i + lo + k`` over ``k`` of
    ``hi − lo + 1`` elements (one ``k`` a reduced axis), out-of-row positions the monoid's
    identity."""
    windows, notes = {}, []
    for total, j, i, lo, hi in bands:
        if j.uid not in windows:
            width = hi - lo + 1
            k = Axis(f"{j.name}_window", width, j.loc)
            at = (i + lo if lo > 0 else i - (-lo) if lo else i) + k
            extent = Const(j.extent, "i32") if isinstance(j.extent, int) else DimSize(j.extent)
            inside = compare("ge", at, Const(0, "i32")) & compare("lt", at, extent)
            windows[j.uid] = (k, at, inside)
            offset = f" {'+' if lo > 0 else '-'} {abs(lo)}" if lo else ""
            notes.append((j, i, offset, k, width))
    band_of = {total.name: windows[j.uid] for total, j, *_ in bands}

    def body(c, b):
        if c.name not in band_of:
            return b
        identity = Const(c.monoid.identity_value(0, c.dtypes[0]), c.dtypes[0])
        return (where(band_of[c.name][2], b[0], identity),)

    made = rewrite_computes(
        program, lambda n: windows[n.uid][1] if isinstance(n, Axis) and n.uid in windows
        else None,
        over=lambda c: (band_of[c.name][0],) if c.name in band_of else c.over, bodies=body)
    note = "; ".join(
        f"{', '.join(t.name for t, jj, *_ in bands if jj.uid == j.uid)} over the band {j.name} "
        f"= {i.name}{offset} + {k.name} as a window axis {k.name} of {width} (not every "
        f"{j.name} of the row)" for j, i, offset, k, width in notes)
    return rewritten_program(program, list(program.params), made), note
