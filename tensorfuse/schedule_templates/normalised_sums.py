"""A sum whose terms are divided (or multiplied) by a finished reduction over the sum's own axes —
attention written as "softmax, then the weighted sum", ``T.sum(p / l * v[b, h, j, e], over=j)``
with ``l = T.sum(p, over=j)`` — as the sum of the rest, divided afterwards:
``Σ_j (p_j / l) · v_j = (Σ_j p_j · v_j) / l``, since ``l`` is one number along ``j``.

As written, each term reads the whole of ``l``, a reduction over the axis the sum sweeps: a
chain the rolling update can still fuse (the Triton template corrects the partial sums as ``l``
grows), but not the form the Hopper attention recognises (its weighted sum and its normaliser
read the same weights ``p``, the division after): on the H100, non-causal B2 H16 S4096 D128
bf16, the Triton template took 576 µs on the program as written and the Hopper template 428 on
the rewritten one (cuDNN 440: ``python -m benchmarks.unlisted_kernels --only
attention_softmax_then_sum``). Moving the factor out removes the dependency — every
template then sees the canonical chain — and changes the arithmetic only by where the division
rounds (once per output instead of once per term). Only a softmax's normaliser moves (a sum of
exponentials over the sum's axis), and only out of a sum that keeps an axis besides its own (the
values' feature axis: a softmax's backward, ``Σ_j dy_j · y_j`` a row, keeps its chain, which the
row templates fuse by their own precision rules); factors that read it along the sum's axes
(``log(p_j / l)``) stay inside, and the rewrite is made only where no read of it is left
inside the sum.

Weights written through the scores' log-sum-exp, ``T.exp(s − lse) * v``, are the same sum: once
the log-sum-exp is its maximum and sum (``lse = log L + g``: :mod:`.monoid_rewrites`),
``exp(s − log L − g) = exp(s − g) / L`` and ``L`` moves out (:func:`_log_divided`).

Likewise a scalar written inside a product of tensors — ``T.sum(q[…, d] * scale * k[…, d],
over=d)``, a scale applied to the queries inside the score's dot product — moves outside: the
operands are then the tensors as they lie, which the Hopper template copies (it stored the
scaled queries first, an operand stage of 32 MiB at B2 H16 S4096 D128). Scalars inside other
sums stay where they are written."""
from __future__ import annotations

from ..algebra.exprs import nodes, rewritten_program, substitute
from ..dsl import dtypes as dt
from ..dsl.expr import Axis, Binary, Cast, Expr, Load, Ref, Unary, binary, unary
from ..dsl.printer import to_text
from ..dsl.program import Compute, Program
from .stages import fresh_names


def normalised_sums(program: Program) -> tuple[Program, str] | None:
    """``program`` with each sum's factors that are finished reductions over its own axes (and
    read none of those axes), and the scalars of a product of tensors, moved outside it (module
    docstring), and a note naming them; ``None`` where no sum has one."""
    made: dict = {}
    divided: dict = {}   # a moved sum's name -> its value (read inline by what read the sum)
    moved: list[str] = []
    fresh = fresh_names(program, "terms")
    for c in program.computes:   # in dependency order: what a body reads is rebuilt first
        body = _reading(c.bodies[0], made, divided) if len(c.bodies) == 1 else None
        split = _outside(c, body) if body is not None else None
        if split is None:
            made[c.name] = _rebuilt(c, made, divided)
            continue
        inside, times, over = split
        terms = Compute(next(fresh), c.axes, (inside,), c.dtypes, c.monoid, c.over, c.loc)
        made[terms.name] = terms
        value = Ref(terms, 0, c.loc)
        for factor in times:
            value = binary("mul", value, factor, c.loc)
        for factor in over:
            value = binary("div", value, factor, c.loc)
        divided[c.name] = value
        if c.is_output:
            made[c.name] = Compute(c.name, c.axes, (value,), c.dtypes, loc=c.loc, is_output=True)
        moved.append(f"{c.name}: " + ", ".join(
            [f"× {to_text(f)}" for f in times] + [f"/ {to_text(f)}" for f in over]))
    if not moved:
        return None
    note = ("factors constant along a sum moved outside it (" + "; ".join(moved) + ")")
    return rewritten_program(program, list(program.params), made), note


def _reading(e: Expr, made: dict, divided: dict) -> Expr:
    """``e`` reading the rebuilt computes, and a moved sum as its value."""
    def read(n):
        if not isinstance(n, Ref):
            return None
        if n.compute.name in divided:
            return divided[n.compute.name]
        return Ref(made[n.compute.name], n.component, n.loc)
    return substitute(e, read)


def _rebuilt(c: Compute, made: dict, divided: dict) -> Compute:
    """``c`` reading the rebuilt computes (:func:`_reading`)."""
    return Compute(c.name, c.axes, tuple(_reading(b, made, divided) for b in c.bodies),
                   c.dtypes, c.monoid, c.over, c.loc, c.is_output)


def _outside(c: Compute, body: Expr) -> tuple[Expr, list, list] | None:
    """For a sum ``c`` over ``c.over``: ``(the terms left inside, the factors it is multiplied
    by after, those it is divided by after)`` where some factors of ``body`` are finished
    reductions over ``c.over`` free of those axes and nothing left inside reads those
    reductions; else None."""
    if not c.is_reduction or c.monoid.name != "sum" or c.arity != 1:
        return None
    over = {a.uid for a in c.over}
    numerators, denominators = [], []
    _split(body, numerators, denominators)
    kept_axes = {a.uid for a in c.axes}
    numerators = [_log_divided(f, over, kept_axes, denominators) for f in numerators]
    # scalars move out of a product of tensors alone (a dot product's scale: its operands are
    # then tensors as they lie); elsewhere they stay where written
    loads = all(isinstance(f, Load) or _pure(f) for f in numerators + denominators)

    def moves(f) -> bool:
        return _finished_along(f, over, kept_axes) or loads and _pure(f)
    times = [f for f in numerators if moves(f)]
    divided = [f for f in denominators if moves(f)]
    if not (times or divided):
        return None
    kept_num = [f for f in numerators if not any(f is g for g in times)]
    kept_den = [f for f in denominators if not any(f is g for g in divided)]
    moved = set().union(*(_reductions_over(f, over) for f in times + divided))
    if not kept_num or any(set(_reductions_over(f, over)) & moved for f in kept_num + kept_den):
        return None
    inside = kept_num[0]
    for f in kept_num[1:]:
        inside = binary("mul", inside, f, c.loc)
    for f in kept_den:
        inside = binary("div", inside, f, c.loc)
    return inside, times, divided


def _split(e: Expr, numerators: list, denominators: list) -> None:
    """The factors of a product of quotients: ``a · b / c`` → numerators ``a, b``, denominators
    ``c`` (a denominator kept whole), through the elementwise values that are such products
    (``w = p / l`` read as ``w · v``) and through a rounding to a float dtype of one (the
    weights cast to the values' dtype, as torch's ``softmax(s).to(v.dtype)``:
    ``cast(p / l)`` → ``cast(p)`` over ``l``, the rounding then before the division)."""
    if isinstance(e, Ref) and not e.compute.is_reduction and e.compute.arity == 1 and \
            _product(e.compute.bodies[0]):
        e = e.compute.bodies[0]
    if isinstance(e, Cast) and dt.is_float(e.dtype) and _product(e.a):
        inner: list = []
        _split(e.a, inner, denominators)
        rounded = inner[0]
        for f in inner[1:]:
            rounded = binary("mul", rounded, f, e.loc)
        numerators.append(Cast(rounded, e.dtype, e.loc))
    elif isinstance(e, Binary) and e.op == "mul":
        _split(e.a, numerators, denominators)
        _split(e.b, numerators, denominators)
    elif isinstance(e, Binary) and e.op == "div":
        _split(e.a, numerators, denominators)
        denominators.append(e.b)
    else:
        numerators.append(e)


def _product(e: Expr) -> bool:
    """Whether ``e`` is a product or quotient (through a float rounding of one)."""
    if isinstance(e, Cast) and dt.is_float(e.dtype):
        return _product(e.a)
    return isinstance(e, Binary) and e.op in ("mul", "div")


def _log_divided(f: Expr, over: set, axes: set, denominators: list) -> Expr:
    """``exp(a − b)`` with ``b = log(l) + y`` (a log-sum-exp: attention's weights written
    ``exp(s − lse)``) and ``l`` a softmax's normaliser: ``exp(a − y)``, ``l`` added to
    ``denominators`` (``exp(a − log l − y) = exp(a − y) / l``); any other factor as it is."""
    if not (isinstance(f, Unary) and f.op == "exp" and isinstance(f.a, Binary) and
            f.a.op == "sub"):
        return f
    b = f.a.b
    while isinstance(b, Ref) and not b.compute.is_reduction and b.compute.arity == 1:
        b = b.compute.bodies[0]
    if not (isinstance(b, Binary) and b.op == "add"):
        return f
    for log, rest in ((b.a, b.b), (b.b, b.a)):
        if isinstance(log, Unary) and log.op == "log" and _finished_along(log.a, over, axes):
            denominators.append(log.a)
            return unary("exp", binary("sub", f.a.a, rest, f.loc), f.loc)
    return f


def _reductions_over(e: Expr, over: set) -> dict:
    """The reductions over the axes ``over`` that ``e`` reads (directly or through the
    elementwise values it reads), by name."""
    found = {}
    for n in nodes(e):
        if isinstance(n, Ref):
            c = n.compute
            if c.is_reduction and {a.uid for a in c.over} == over:
                found[c.name] = c
            elif not c.is_reduction:
                for b in c.bodies:
                    found.update(_reductions_over(b, over))
    return found


def _finished_along(e: Expr, over: set, axes: set) -> bool:
    """Whether ``e`` is a softmax's normaliser for a sum over ``over`` kept over ``axes``: one
    value along ``over``, reading sums of exponentials over them only, over fewer axes than the
    sum keeps (the weighted sum of values of attention has their feature axis besides; a
    softmax's backward, a row's ``Σ_j dy_j · y_j``, has none — its chain stays as written, which
    the row templates fuse with their own precision rules)."""
    found = _reductions_over(e, over)
    return not ({a.uid for a in e.axes} & over) and bool(found) and \
        {a.uid for a in e.axes} < axes and all(_sums_exponentials(r) for r in found.values())


def _sums_exponentials(found) -> bool:
    """Whether the reduction ``found`` (a compute) is a sum of ``exp(…)`` values."""
    if found.monoid.name != "sum":
        return False
    body = found.bodies[0]
    while isinstance(body, Ref) and not body.compute.is_reduction:
        body = body.compute.bodies[0]
    return isinstance(body, Unary) and body.op == "exp"


def _pure(e: Expr) -> bool:
    """Whether ``e`` reads no tensor and no computed value (scalars, sizes, constants): the
    same for every term of any sum — a scale written inside a dot product."""
    return not any(isinstance(n, (Load, Ref)) for n in nodes(e)) and not \
        any(isinstance(n, Axis) for n in nodes(e))


