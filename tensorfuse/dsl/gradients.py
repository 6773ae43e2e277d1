"""Reverse-mode differentiation of a traced program: the backward pass as another program.

:func:`gradient_program` turns a :class:`Program` into one that takes the same parameters plus one
gradient per floating-point output (``d_<output>``) and returns the gradient of every
differentiable tensor parameter (``d_<param>``). It is an ordinary program — it goes through the
same compiler (``tf.compile``, its templates, tuning) as any kernel, on every target — and it is
built from the program's own computes: the forward values the gradients read are recomputed from
the inputs in the backward program (nothing is saved but the inputs), then every compute's
adjoint is accumulated in reverse order:

- elementwise computes and sums pass their adjoint to each value their body reads, times the
  body's partial derivative (the chain rule over the expression tree, :func:`backprop`);
- a maximum or minimum passes it to the elements equal to it, shared equally between ties (as
  ``torch.amax`` does) — unless it only stabilises the program (softmax's row maximum: the
  outputs do not change when it moves, :mod:`.stabilisers`), whose adjoint is exactly zero and
  is not sent on; ``logsumexp`` as ``softmax``;
- a value read at fewer axes than the reader's (``m[i]`` in ``exp(x[i, j] - m)``) gets the
  reader's contributions summed over the others.

A tensor parameter's gradient lives on the axes its loads index it by. A position indexed by
anything but a plain axis — ``k[b, h // G, j, d]`` (grouped heads), ``logits[i, target[i]]`` (a
gather), ``bias[h, i - j + N - 1]`` (a table) — gets a fresh axis over the parameter's dimension,
and the contribution is kept where the index equals it (an equality mask: exact, but it costs the
dimension's size once more, e.g. the number of key/value heads for grouped attention). Loads of
one parameter by different index expressions give separate partial gradients, which
:class:`GradientKernel`'s callers add (``parts``).

- a product passes each term the product of the others (where terms are 0 as well, as
  ``torch.prod``'s backward: through the count of zeros and the product of the nonzero terms).

Refused, with the value and the reason: gradients of integer and boolean parameters, of an
argmax/argmin (its index is not differentiable; its value is, through ``T.max``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from . import dtypes as dt
from . import ops
from .expr import (Axis, Binary, Cast, Const, DimSize, Expr, Load, Reduce, Ref, Scalar, Unary,
                   Where, as_expr, binary, compare, unary, where, walk)
from .program import Compute, Program, TensorParam, fresh_name
from .stabilisers import stabilising_maxima
from ..errors import DSLError


class GradientError(DSLError):
    """A gradient was asked of something that has none (an integer input, an argmax's index)."""


@dataclass(frozen=True)
class GradientOutput:
    """One output of a gradient program: (part of) the gradient of ``param``."""

    param: str
    compute: str


def gradient_program(program: Program, wrt: Sequence[str] | None = None,
                     name: str | None = None, saved: list | None = None
                     ) -> tuple[Program, list[GradientOutput]]:
    """The backward program of ``program`` and what each of its outputs is the gradient of.

    ``wrt``: the tensor parameters to differentiate with respect to (default: every
    floating-point tensor parameter). Its parameters: ``program``'s, then ``d_<output>`` for each
    floating-point output (the incoming gradient, shaped like the output).

    ``saved``: a list, where the caller has the forward's outputs (autograd saved them): an
    output that normalises exponentials over an axis — softmax ``p / Σ_j p`` and log-softmax
    ``u − log Σ_j exp(u)``, ``p = exp(u)`` — then passes its adjoint to ``u`` from the saved
    value ``y`` (``y · (dy − Σ_j dy · y)``; ``dy − exp(y) · Σ_j dy``), as PyTorch's own backward
    does, instead of recomputing the row's statistics and ``exp`` from the inputs (twice an
    element: 0.88× ``torch.compile``'s backward, ``benchmarks.rows_backward``). Each such
    output's value becomes a parameter after the gradients', and its index in
    ``program.outputs`` is appended to ``saved``."""
    params = {p.name: p for p in program.tensor_params}
    targets = _targets(program, params, wrt)
    taken = {p.name for p in program.params} | {c.name for c in program.computes}
    grads: list[TensorParam] = []
    adjoints: dict[str, list[Expr]] = {}
    for out in program.outputs:
        if not dt.is_float(out.dtypes[0]):
            continue
        p = TensorParam(fresh_name(f"d_{out.name}", taken), tuple(a.extent for a in out.axes),
                        out.dtypes[0], out.loc)
        grads.append(p)
        adjoints.setdefault(out.name, []).append(p[tuple(out.axes)] if out.axes else p[()])
    if not grads:
        raise GradientError(f"{program.name} has no floating-point output to differentiate")

    names: dict[int, str] = {}
    loads: dict[str, dict[tuple, list[tuple[Load, Expr]]]] = {n: {} for n in targets}
    # the outputs do not depend on these maxima: their adjoints sum to zero, up to rounding
    stabilisers = stabilising_maxima(program)
    for c in reversed(program.computes):
        if c.name not in adjoints or not dt.is_float(c.dtypes[0]):
            continue
        if c.name in stabilisers:
            adjoints.pop(c.name)
            continue
        total = _sum(adjoints.pop(c.name))
        if not isinstance(total, Load):
            names[total.uid] = fresh_name(f"d_{c.name}", taken)
        seeds = _from_saved(program, c, total, names, taken, grads) if saved is not None \
            and c.is_output else None
        if seeds is not None:
            saved.append(program.outputs.index(c))
        for body, seed in seeds or _seeds(c, total, names, taken):
            for leaf, contribution in backprop(body, seed):
                if isinstance(leaf, Ref):
                    _check_differentiable(leaf.compute)
                    adjoints.setdefault(leaf.compute.name, []).append(
                        _summed(contribution, leaf.compute.axes))
                elif leaf.param.name in loads:
                    key = tuple(ix.key() for ix in leaf.indices)
                    loads[leaf.param.name].setdefault(key, []).append((leaf, contribution))

    results, owners = [], []
    for pname in targets:
        groups = list(loads[pname].values())
        if not groups:   # the outputs do not depend on it: a zero gradient, shaped like it
            groups = [[(None, None)]]
        parts = _merged([_parameter_gradient(params[pname], group, taken) for group in groups])
        for part, (expr, axes, _) in enumerate(parts):
            expr = Cast(expr, params[pname].dtype)
            names[expr.uid] = f"d_{pname}" if part == 0 else f"d_{pname}_{part + 1}"
            results.append((expr, axes))
            owners.append(pname)
    backward = _without_repeats(_assemble(program, grads, results, names, name))
    return backward, [GradientOutput(p, c.name) for p, c in zip(owners, backward.outputs)]


def _targets(program: Program, params: dict, wrt) -> list[str]:
    if wrt is None:
        found = [p.name for p in program.tensor_params if dt.is_float(p.dtype)]
        if not found:
            raise GradientError(f"{program.name} has no floating-point tensor parameter to "
                                "differentiate with respect to")
        return found
    wrt = [wrt] if isinstance(wrt, str) else list(wrt)
    for n in wrt:
        if n not in params:
            scalars = {p.name for p in program.scalar_params}
            why = (f"{n} is a scalar parameter; gradients are taken with respect to tensors"
                   if n in scalars else f"{program.name} has no tensor parameter {n!r} (its "
                   f"tensors: {', '.join(params)})")
            raise GradientError(why)
        if not dt.is_float(params[n].dtype):
            raise GradientError(f"{n} is a {params[n].dtype} tensor: integer and boolean inputs "
                                "(indices, masks, ids) have no gradient", params[n].loc)
    return wrt


def _sum(values: list[Expr]) -> Expr:
    total = values[0]
    for v in values[1:]:
        total = binary("add", total, v)
    return total


def _check_differentiable(c: Compute) -> None:
    if c.is_reduction and c.monoid.arity > 1:
        raise GradientError(f"{c.name} is a {c.monoid.name} (a value and its index): an index has "
                            f"no gradient; for a differentiable maximum use T.max", c.loc)
    if c.is_reduction and c.monoid.name not in ("sum", "max", "min", "logsumexp", "prod"):
        raise GradientError(f"{c.name}: gradients of a {c.monoid.name} reduction are not "
                            "supported", c.loc)


def _seeds(c: Compute, adjoint: Expr, names: dict, taken: set):
    """``(body, seed)``: each body of ``c`` and the adjoint its value gets."""
    if not c.is_reduction:
        return [(c.bodies[0], adjoint)]
    _check_differentiable(c)
    body, value = c.bodies[0], c.ref()
    if c.monoid.name == "sum":
        return [(body, adjoint)]
    if c.monoid.name == "logsumexp":
        return [(body, adjoint * unary("exp", body - value))]
    if c.monoid.name == "prod":
        return [(body, adjoint * _product_of_others(c, names, taken))]
    hit = compare("eq", body, value)
    one = Const(1.0, dt.resolve(value.dtype))
    ties = ops.sum(where(hit, one, Const(0.0, one.dtype)), over=c.over)
    names[ties.uid] = fresh_name(f"ties_{c.name}", taken)
    return [(body, where(hit, adjoint / ties, 0.0))]


def _product_of_others(c: Compute, names: dict, taken: set) -> Expr:
    """∂(Π x) / ∂x_j, the product of the other terms, exact where terms are 0 (as torch.prod's
    backward): the product over the terms divided by x_j where none is 0; where exactly one is,
    the product of the nonzero terms at it and 0 elsewhere; where two or more are, 0."""
    body = c.bodies[0]
    zero, one = Const(0.0, dt.resolve(body.dtype)), Const(1.0, dt.resolve(body.dtype))
    is_zero = compare("eq", body, zero)
    zeros = ops.sum(where(is_zero, one, zero), over=c.over)
    others = ops.prod(where(is_zero, one, body), over=c.over)
    names[zeros.uid] = fresh_name(f"zeros_{c.name}", taken)
    names[others.uid] = fresh_name(f"nonzero_{c.name}", taken)
    lone_zero = binary("and", is_zero, compare("eq", zeros, one))
    return where(compare("eq", zeros, zero), others / body, where(lone_zero, others, zero))


def _elementwise(e: Expr) -> Expr:
    """``e`` with its reads of elementwise computes replaced by their bodies."""
    if isinstance(e, Ref) and not e.compute.is_reduction and e.compute.arity == 1:
        return _elementwise(e.compute.bodies[0])
    if isinstance(e, Unary):
        return unary(e.op, _elementwise(e.a))
    if isinstance(e, Binary):
        return binary(e.op, _elementwise(e.a), _elementwise(e.b))
    return e


def _normaliser(e: Expr, numerator: Expr) -> Compute | None:
    """The compute ``e`` reads where it is a sum of ``numerator`` (by value) over axes, else
    None."""
    if not isinstance(e, Ref) or not e.compute.is_reduction or e.compute.arity != 1 or \
            e.compute.monoid.name != "sum":
        return None
    c = e.compute
    return c if _elementwise(c.bodies[0]).key() == numerator.key() else None


def _from_saved(program: Program, c: Compute, adjoint: Expr, names: dict, taken: set,
                params: list) -> list | None:
    """``[(u, its adjoint)]`` of an output ``c`` that normalises ``exp(u)`` over axes (softmax
    or log-softmax: :func:`gradient_program`'s ``saved``), its saved value a new parameter
    appended to ``params``; None for any other compute."""
    body = c.bodies[0]
    if not isinstance(body, Binary):
        return None
    if body.op == "div":   # softmax: exp(u) / Σ exp(u)
        numerator = _elementwise(body.a)
        total = _normaliser(body.b, numerator)
        if total is None or not (isinstance(numerator, Unary) and numerator.op == "exp"):
            return None
        argument = numerator.a
    elif body.op == "sub" and isinstance(body.b, Unary) and body.b.op == "log":
        argument = _elementwise(body.a)   # log-softmax: u − log Σ exp(u)
        total = _normaliser(body.b.a, unary("exp", argument))
        if total is None:
            return None
    else:
        return None
    if {a.uid for a in c.axes} != {a.uid for a in total.axes + total.over}:
        return None
    param = TensorParam(fresh_name(f"{c.name}_saved", taken), tuple(a.extent for a in c.axes),
                        c.dtypes[0], c.loc)
    params.append(param)
    y = param[tuple(c.axes)]
    if body.op == "div":
        dot = ops.sum(adjoint * y, over=total.over)
        names[dot.uid] = fresh_name(f"d_{c.name}_dot_saved", taken)
        return [(argument, y * (adjoint - dot))]
    summed = ops.sum(adjoint, over=total.over)
    names[summed.uid] = fresh_name(f"d_{c.name}_sum", taken)
    return [(argument, adjoint - unary("exp", y) * summed)]


def _summed(contribution: Expr, axes: Sequence[Axis]) -> Expr:
    """``contribution`` summed over its axes that are not in ``axes``."""
    keep = {a.uid for a in axes}
    extra = [a for a in contribution.axes if a.uid not in keep]
    return ops.sum(contribution, over=tuple(extra)) if extra else contribution


_LN2 = math.log(2.0)


def backprop(expr: Expr, seed: Expr) -> list[tuple[Expr, Expr]]:
    """``(leaf, contribution)`` for each read of a computed value (:class:`Ref`) or of a
    floating-point tensor element (:class:`Load`) in ``expr``, given the adjoint ``seed`` of
    ``expr``: the chain rule over the expression tree. Integer and boolean parts (indices, masks)
    carry no gradient."""
    found: list[tuple[Expr, Expr]] = []
    stack = [(expr, seed)]
    while stack:
        e, s = stack.pop()
        if not dt.is_float(e.dtype):
            continue
        if isinstance(e, (Ref, Load)):
            found.append((e, s))
        elif isinstance(e, (Const, Scalar, DimSize, Axis)):
            continue
        elif isinstance(e, Unary):
            d = _unary_derivative(e)
            if d is not None:
                stack.append((e.a, d(s)))
        elif isinstance(e, Binary):
            stack.extend(_binary_parts(e, s))
        elif isinstance(e, Where):
            stack.append((e.a, where(e.cond, s, 0.0)))
            stack.append((e.b, where(e.cond, 0.0, s)))
        elif isinstance(e, Cast):
            stack.append((e.a, s if not dt.is_float(e.a.dtype) else
                          Cast(as_expr(s), dt.compute_dtype(dt.resolve(e.a.dtype)))))
        else:   # pragma: no cover - every node kind is listed above
            raise GradientError(f"no derivative for {type(e).__name__}", e.loc)
    return found


def _unary_derivative(e: Unary):
    a = e.a
    rules = {
        "neg": lambda s: -s,
        "exp": lambda s: s * e,
        "exp2": lambda s: s * e * _LN2,
        "log": lambda s: s / a,
        "log2": lambda s: s / (a * _LN2),
        "tanh": lambda s: s * (1.0 - e * e),
        "sqrt": lambda s: s * 0.5 / e,
        "rsqrt": lambda s: s * -0.5 * e * e * e,
        "sigmoid": lambda s: s * e * (1.0 - e),
        "abs": lambda s: where(a > 0.0, s, where(a < 0.0, -s, 0.0)),
        "erf": lambda s: s * (2.0 / math.sqrt(math.pi)) * unary("exp", -(a * a)),
        "sin": lambda s: s * unary("cos", a),
        "cos": lambda s: -s * unary("sin", a),
    }
    return rules.get(e.op)   # floor, ceil, round: zero almost everywhere


def _binary_parts(e: Binary, s: Expr) -> list[tuple[Expr, Expr]]:
    a, b = e.a, e.b
    if e.op == "add":
        return [(a, s), (b, s)]
    if e.op == "sub":
        return [(a, s), (b, -s)]
    if e.op == "mul":
        return [(a, s * b), (b, s * a)]
    if e.op == "div":
        return [(a, s / b), (b, -s * e / b)]
    if e.op == "pow":
        parts = [(a, s * b * binary("pow", a, b - 1.0))]
        if dt.is_float(b.dtype) and not isinstance(b, Const):
            parts.append((b, s * e * unary("log", a)))
        return parts
    if e.op in ("max", "min"):   # ties share the adjoint, as torch.maximum does
        first = compare("gt" if e.op == "max" else "lt", a, b)
        second = compare("lt" if e.op == "max" else "gt", a, b)
        return [(a, where(first, s, where(second, 0.0, s * 0.5))),
                (b, where(second, s, where(first, 0.0, s * 0.5)))]
    return []   # floordiv, mod, and, or: integer or boolean


def _parameter_gradient(param: TensorParam, group, taken: set) -> tuple[Expr, list[Axis], set]:
    """The gradient of ``param`` from loads sharing one index expression (in the compute dtype),
    its axes in the parameter's dimension order — plain-axis positions keep the load's axis,
    other positions get a fresh axis and an equality mask — and the fresh axes' uids."""
    load = group[0][0]
    if load is None:   # not read on any differentiable path
        axes = [Axis(fresh_name(f"{param.name}_{k}", taken), dim)
                for k, dim in enumerate(param.dims)]
        return (_broadcast(Const(0.0, dt.compute_dtype(param.dtype)), axes), axes,
                {a.uid for a in axes})
    axes, conditions, seen = [], [], set()
    for k, ix in enumerate(load.indices):
        if isinstance(ix, Axis) and ix.uid not in seen:
            axes.append(ix)
            seen.add(ix.uid)
        else:
            fresh = Axis(fresh_name(f"{param.name}_{k}", taken), param.dims[k])
            axes.append(fresh)
            conditions.append(compare("eq", ix, fresh))
    mask = None
    for cond in conditions:
        mask = cond if mask is None else binary("and", mask, cond)
    parts = []
    for _, contribution in group:
        value = contribution if mask is None else where(mask, contribution, 0.0)
        parts.append(_summed(value, axes))
    fresh = {a.uid for a, ix in zip(axes, load.indices) if a is not ix}
    return _broadcast(_sum(parts), axes), axes, fresh


def _merged(parts: list) -> list:
    """The partial gradients of one parameter, each added into an earlier one where its fresh
    axes can take that one's axes (``logits[i, target[i]]``'s part, over a fresh axis of the
    vocabulary, added to ``logits[i, j]``'s over ``j``): one output instead of two full-size
    ones added afterwards, and one that a row template can write in its sweep."""
    merged: list = []
    for expr, axes, fresh in parts:
        for k, (base, base_axes, base_fresh) in enumerate(merged):
            moved = _onto_axes(expr, axes, fresh, base_axes)
            if moved is not None:
                merged[k] = (binary("add", base, moved), base_axes, base_fresh)
                break
            moved = _onto_axes(base, base_axes, base_fresh, axes)   # or the earlier onto this
            if moved is not None:
                merged[k] = (binary("add", moved, expr), axes, fresh)
                break
        else:
            merged.append((expr, axes, fresh))
    return merged


def _onto_axes(expr: Expr, axes: list, fresh: set, onto: list) -> Expr | None:
    """``expr`` (over ``axes``) with each fresh axis replaced by the axis of ``onto`` at its
    position, or None where a position differs otherwise, the extents differ, an axis of
    ``onto`` already occurs in ``expr``, or a fresh axis is inside a reduction or a computed
    value (which would have to be rebuilt)."""
    mapping = {}
    for a, b in zip(axes, onto):
        if a.uid == b.uid:
            continue
        if a.uid not in fresh or a.extent != b.extent:
            return None
        mapping[a.uid] = b
    used: set = set()

    def visit(n):
        if isinstance(n, Axis):
            used.add(n.uid)
        elif isinstance(n, (Reduce, Ref)):
            used.update(a.uid for a in n.axes)
            if isinstance(n, Reduce):
                used.update(a.uid for a in n.spec.over)
    walk(expr, visit)
    if used & {b.uid for b in mapping.values()}:
        return None

    def swap(e: Expr) -> Expr | None:
        if isinstance(e, Axis):
            return mapping.get(e.uid, e)
        if not {a.uid for a in e.axes} & set(mapping):
            return e
        if isinstance(e, (Reduce, Ref)):
            return None
        kids = [swap(k) for k in e.children()]
        return None if any(k is None for k in kids) else e.rebuild(kids)
    return swap(expr)


def _broadcast(e: Expr, axes: Sequence[Axis]) -> Expr:
    """``e`` defined over every axis of ``axes`` (an output must cover its parameter's shape)."""
    have = {a.uid for a in e.axes}
    missing = [a for a in axes if a.uid not in have]
    if not missing:
        return e
    cond = None
    for a in missing:
        c = compare("ge", a, 0)
        cond = c if cond is None else binary("and", cond, c)
    return where(cond, e, Const(0.0, e.dtype if dt.is_float(e.dtype) else dt.WEAK_FLOAT))


def _assemble(program: Program, grads, results, names: dict, name: str | None) -> Program:
    """The backward program: the forward computes the gradients read (recomputed, none of them
    an output), then the gradient computes, its outputs in the order of ``results``."""
    from .trace import _ProgramBuilder

    builder = _ProgramBuilder(list(program.params) + grads, [], program.loc)
    builder.names = dict(names)
    builder.taken |= {c.name for c in program.computes}
    built = builder.build(name or f"{program.name}_backward", tuple(e for e, _ in results),
                          list(program.size_constraints))
    # outputs laid out like their parameters (compute axes follow declaration order otherwise)
    order = {c.name: axes for c, (_, axes) in zip(built.outputs, results)}
    outputs = [replace(c, axes=tuple(order[c.name])) if tuple(a.uid for a in c.axes) !=
               tuple(a.uid for a in order[c.name]) else c for c in built.outputs]
    swapped = {id(old): new for old, new in zip(built.outputs, outputs)}
    computes = [swapped.get(id(c), c) for c in built.computes]
    forward = _forward_needed(program, computes)
    everything = forward + computes
    axes = sorted({a.uid: a for c in everything for a in c.axes + c.over}.values(),
                  key=lambda a: a.uid)
    return Program(built.name, built.params, everything, outputs, axes,
                   built.size_constraints, program.loc)


def _without_repeats(program: Program) -> Program:
    """``program`` with each compute that repeats an earlier one exactly (the same axes, the
    same sums, the same body) dropped and its reads pointing at the earlier one: the product
    rule's two halves of ``(x - mean) * (x - mean)`` give a group norm's backward two equal sums,
    each a state of the row kernel's pass."""
    copies: dict[str, Compute] = {}
    first: dict[tuple, Compute] = {}
    kept = []
    for c in program.computes:
        bodies = tuple(_retarget(b, copies) for b in c.bodies)
        made = c if all(a is b for a, b in zip(bodies, c.bodies)) else replace(c, bodies=bodies)
        key = (tuple(a.uid for a in c.axes), tuple(a.uid for a in c.over),
               getattr(c.monoid, "name", None), tuple(c.dtypes), tuple(b.key() for b in bodies))
        if not c.is_output and key in first:
            copies[c.name] = first[key]
            continue
        first.setdefault(key, made)
        if made is not c:
            copies[c.name] = made
        kept.append(made)
    if len(kept) == len(program.computes):
        return program
    by_name = {c.name: c for c in kept}
    return Program(program.name, program.params, kept,
                   [by_name[c.name] for c in program.outputs], program.axes,
                   program.size_constraints, program.loc)


def _forward_needed(program: Program, computes: list[Compute]) -> list[Compute]:
    """The forward computes ``computes`` read, directly or not, in forward order, none of them an
    output (copies, with the reads among them pointing at the copies)."""
    needed: set[str] = set()
    pending = list(computes)
    forward = {c.name: c for c in program.computes}
    while pending:
        c = pending.pop()
        for body in c.bodies:
            def visit(n):
                if isinstance(n, Ref) and n.compute.name in forward and \
                        n.compute.name not in needed:
                    needed.add(n.compute.name)
                    pending.append(forward[n.compute.name])
            walk(body, visit)
    kept = [c for c in program.computes if c.name in needed]
    outputs = {c.name for c in kept if c.is_output}
    if not outputs:
        return kept
    copies: dict[str, Compute] = {}
    for c in kept:
        copies[c.name] = replace(c, is_output=False,
                                 bodies=tuple(_retarget(b, copies) for b in c.bodies))
    for c in computes:   # gradient computes reading a forward output read its copy
        c.bodies = tuple(_retarget(b, copies) for b in c.bodies)
    return [copies[c.name] for c in kept]


def _retarget(expr: Expr, copies: dict[str, Compute], done: dict | None = None) -> Expr:
    """``expr`` with its reads of computes in ``copies`` reading the copies."""
    done = {} if done is None else done
    if expr.uid in done:
        return done[expr.uid]
    if isinstance(expr, Ref):
        copy = copies.get(expr.compute.name)
        out = expr if copy is None or copy is expr.compute else Ref(copy, expr.component, expr.loc)
    else:
        kids = expr.children()
        new = [_retarget(k, copies, done) for k in kids]
        out = expr if all(a is b for a, b in zip(kids, new)) else expr.rebuild(new)
    done[expr.uid] = out
    return out

