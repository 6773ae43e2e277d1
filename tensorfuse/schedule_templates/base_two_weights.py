"""Attention's weights written in base two, ``T.exp2(s − m)`` with ``m = T.max(s)`` — the form
Triton's tutorials and FlashAttention's sources use, the scores scaled by ``log2(e)`` first —
as the natural exponentials the attention templates recognise: ``exp(s·ln2 − max(s·ln2))``.

The two are the same numbers: ``2^(s − m) = e^(s·ln2 − m·ln2)`` and, ``ln2`` being positive,
``m·ln2 = max(s·ln2)``. As written, the chain's weights are not ``exp(s − m)``, so the Hopper
attention (and the decode templates) refused it and the Triton template ran it; rewritten, the
scores' constant factor ``log2(e)`` meets ``ln2`` and the product is 1 (both written to double
precision), so the Hopper kernel gets the scores as a user of ``T.exp`` writes them (and folds
``log2(e)`` back into its own ``exp2``). Any other read of the maximum reads ``m'·log2(e)``, the
same value.

Only a maximum whose base-two weights feed a weighted sum over its axis that keeps an axis of
its own (attention's ``Σ_j p · v[…, j, e]``; a decode's) is rewritten: a row's softmax in base
two keeps its ``exp2``, which the row templates take as written (the rewrite would add a
multiplication per element and a rounding of the argument for nothing). A factor after the
difference, ``exp2((s − m) · c)``, is taken where ``c`` is a positive constant (``max(c·s) =
c·max(s)`` needs it): a scalar's sign is not known when the program is planned.
"""
from __future__ import annotations

import math

from ..algebra import inline_elementwise
from ..algebra.exprs import factors, rewritten_program, substitute
from ..dsl.expr import Binary, Const, Expr, Ref, Unary, Where, binary, unary, where
from ..dsl.program import Compute, Program
from .stages import fresh_names

LN2 = math.log(2.0)


def base_two_weights(program: Program) -> tuple[Program, str] | None:
    """``program`` with each maximum whose ``exp2(s − m)`` weights feed a weighted sum
    (module docstring) rewritten to natural exponentials of ``s·ln2``, and a note naming them;
    ``None`` where none is."""
    found = _weighted_maxima(program)   # name -> the constant after the difference
    if not found:
        return None
    maxima = {c.name: c for c in program.computes if c.name in found}
    made: dict = {}
    scaled: dict = {}    # a rewritten maximum's name -> (its new compute, the scaled scores)
    fresh = fresh_names(program, "max_scaled")

    def read(n: Expr):
        hit = _base_two_of(n, maxima)
        if hit is not None and hit[1] == found[hit[0]]:
            m_new, s_new = scaled[hit[0]]
            return unary("exp", binary("sub", s_new, Ref(m_new, 0, n.loc), n.loc), n.loc)
        if isinstance(n, Ref):
            name = n.compute.name
            if name in scaled:   # any other read: m = m' / (c·ln2)
                return binary("mul", Ref(scaled[name][0], 0, n.loc),
                              Const(1.0 / (LN2 * found[name]), "f32", n.loc), n.loc)
            return Ref(made[n.compute.name], n.component, n.loc)
        return None

    for c in program.computes:   # in dependency order: what a body reads is rebuilt first
        if c.name in found:
            scores = _scaled(substitute(inline_elementwise(c.bodies[0]), read),
                             LN2 * found[c.name])
            # the maximum keeps its name where nothing outside reads it (the plans name it)
            m_new = Compute(next(fresh) if c.is_output else c.name, c.axes, (scores,), c.dtypes,
                            c.monoid, c.over, c.loc)
            made[m_new.name] = m_new
            scaled[c.name] = (m_new, scores)
            if c.is_output:
                made[c.name] = Compute(c.name, c.axes, (read(Ref(c, 0, c.loc)),), c.dtypes,
                                       loc=c.loc, is_output=True)
            continue
        made[c.name] = Compute(c.name, c.axes, tuple(substitute(b, read) for b in c.bodies),
                               c.dtypes, c.monoid, c.over, c.loc, c.is_output)
    note = "base-two weights as natural exponentials (" + ", ".join(
        f"exp2 under {n} read as exp of its scores × ln 2" for n in found) + ")"
    return rewritten_program(program, list(program.params), made), note


def _weighted_maxima(program: Program) -> dict:
    """The maxima ``m`` (by name) whose weights ``exp2((s − m)·c)`` a sum over ``m``'s axes
    keeping another axis multiplies by something (a weighted sum), with ``c`` (1 where no
    factor is written)."""
    maxima = {c.name: c for c in program.computes
              if c.is_reduction and c.monoid.name == "max" and c.arity == 1}
    found: dict = {}
    for c in program.computes:
        if not (c.is_reduction and c.monoid.name == "sum" and c.arity == 1):
            continue
        terms = factors(inline_elementwise(c.bodies[0]))
        if len(terms) < 2:
            continue
        for t in terms:
            hit = _base_two_of(t, maxima)
            if hit is None or found.get(hit[0], hit[1]) != hit[1]:
                continue
            m = maxima[hit[0]]
            if {a.uid for a in c.over} == {a.uid for a in m.over} and \
                    {a.uid for a in c.axes} > {a.uid for a in m.axes}:
                found[hit[0]] = hit[1]
    return found


def _base_two_of(e: Expr, maxima: dict) -> tuple[str, float] | None:
    """``(m, c)`` where ``e`` is the base-two weight ``exp2((s − m)·c)`` of the maximum named
    ``m`` in ``maxima`` (``s`` what it maximises, ``c`` a positive constant, 1 where none is
    written), else None."""
    if not (isinstance(e, Unary) and e.op == "exp2"):
        return None
    arg, c = e.a, 1.0
    while isinstance(arg, Ref) and not arg.compute.is_reduction and arg.compute.arity == 1:
        arg = arg.compute.bodies[0]
    if isinstance(arg, Binary) and arg.op == "mul":
        consts = [x for x in (arg.a, arg.b) if isinstance(x, Const)]
        if len(consts) != 1 or not isinstance(consts[0].value, (int, float)) or \
                not consts[0].value > 0:
            return None
        c = float(consts[0].value)
        arg = arg.b if arg.a is consts[0] else arg.a
    if not (isinstance(arg, Binary) and arg.op == "sub" and isinstance(arg.b, Ref)):
        return None
    m = maxima.get(arg.b.compute.name)
    if m is None or inline_elementwise(arg.a).key() != inline_elementwise(m.bodies[0]).key():
        return None
    return m.name, c


def _scaled(e: Expr, k: float) -> Expr:
    """``e · k`` with ``k`` pushed into a masked choice's branches (``where(c, x, −∞)`` stays a
    mask of the scaled scores) and merged with a constant factor of ``e`` (``s · log2(e)`` ·
    ``ln2`` is ``s``: a product within rounding of 1 is dropped)."""
    if abs(k - 1.0) < 1e-12:
        return e
    if isinstance(e, Where):
        return where(e.cond, _scaled(e.a, k), _scaled(e.b, k), loc=e.loc)
    if isinstance(e, Const) and isinstance(e.value, (int, float)):
        return Const(e.value * k, e.dtype, e.loc)
    terms = factors(e)
    at = next((n for n, x in enumerate(terms)
               if isinstance(x, Const) and isinstance(x.value, (int, float))), None)
    if len(terms) > 1 and at is not None:
        merged = terms[at].value * k
        rest = terms[:at] + terms[at + 1:]
        if abs(merged - 1.0) >= 1e-12:
            rest.append(Const(merged, terms[at].dtype, terms[at].loc))
        product = rest[0]
        for x in rest[1:]:
            product = binary("mul", product, x, e.loc)
        return product
    return binary("mul", e, Const(k, "f32", e.loc), e.loc)
