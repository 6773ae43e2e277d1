"""Attention whose q·k operands are computed where the scores are made — rotary embeddings
applied to q and k (``q[b, h, i, d] · cos[i, d] + sign · q[b, h, i, (d + D/2) % D] · sin[i, d]``),
a weight on the head dim folded into q — as stages: each computed operand stored in the type
the tensor cores take it in (the row-tile template's rule for its products' operands,
``tile_plan.storage_of``: the loads' 16-bit type where they share one, else float32), then the
attention over the stored operands, which the Hopper template takes where it refuses the
computed ones (its producer copies tensors, it computes nothing on the way). The Triton template
that took the whole otherwise recomputes each key block's operand for every query block (and
holds the tables' tiles beside the keys'); the stages read and write each operand once more."""
from __future__ import annotations

from dataclasses import replace

from ..algebra import inline_elementwise
from ..algebra.exprs import factors, nodes, rewrite_computes, substitute
from ..dsl.expr import Axis, Cast, DimSize, Load, Ref, Unary, binary, compare, where
from ..dsl.program import Compute, Program, TensorParam
from ..errors import ScheduleError
from .attention_chain import softmax_states
from .attention_epilogue import computes_read_by
from .stages import Stage, fresh_names, program_of
from .tile_plan import split_product, storage_of

OPERAND = "operand"   # the stored operands' names (numbered where the program uses the name)


def computed_operand_stages(program: Program, names: tuple[str, ...],
                            axis: str) -> tuple[Stage, ...]:
    """The stages of ``program`` (softmax attention fused over ``names``, sweeping ``axis``)
    whose scores are ``Σ_d A · B`` with ``A`` free of the keys and ``B`` of the query rows and
    at least one of them not a plain load: a stage per computed operand (stored over its own
    axes, the head dim last), then the attention reading them; ``()`` for any other program.
    Float32 products (a float32 table times a 16-bit q) are stored as bf16 parts
    (:func:`split_terms`)."""
    try:
        m, _, o, _, _ = softmax_states(program, names)
    except ScheduleError:
        return ()
    dots = [r.compute for r in nodes(inline_elementwise(m.bodies[0]))
            if isinstance(r, Ref) and r.compute.is_reduction and r.compute.monoid.name == "sum"
            and len(r.compute.over) == 1]
    if len({d.name for d in dots}) != 1:
        return ()
    dot = dots[0]
    body = inline_elementwise(dot.bodies[0])
    # the operands as the fused kernel splits the product: the factors free of the keys (the
    # query side: a weight or a scale on the head dim goes with it), and those reading them
    every = {a.uid for a in dot.axes + dot.over}
    keys = {a.uid for a in dot.axes if a.name == axis}
    sides = split_product(body, every - keys, every, set())
    if sides is None or not all(any(isinstance(n, Load) for n in nodes(f)) for f in sides):
        return ()
    computed = [f for f in sides if not _plain(f)]
    dtype = storage_of(body)
    # float32 products (a float32 table, float32 q and k) before 16-bit values: the weights go
    # to p·v as 16-bit numbers, so bf16 parts of the operands lose nothing p·v keeps
    split = dtype == "f32" and _values_bf16(o) and not any(
        isinstance(n, Load) and n.param.dtype == "f64" for n in nodes(body))
    if not (computed or split) or not all(_no_larger(f, dot.over[0]) for f in computed):
        return ()
    if split:
        return _split_stages(program, names, dot, sides)
    free = fresh_names(program, OPERAND)
    stages, loads = [], {}
    reduced = dot.over[0]
    for side in computed:
        axes = _operand_axes(dot, side) + (reduced,)
        name = next(free)
        made = Compute(name, axes, (Cast(side, dtype, side.loc),), (dtype,), loc=dot.loc,
                       is_output=True)
        stages.append(_operand_stage(program, made))
        param = TensorParam(name, tuple(a.extent for a in axes), dtype, dot.loc)
        loads[side.uid] = Load(param, list(axes), side.loc)
    new_body = binary("mul", *(loads.get(f.uid, f) for f in sides), body.loc)
    return (*stages, _attention_stage(program, names, dot, new_body, [loads[f.uid].param
                                                                    for f in computed]))


def split_terms(left_exact: bool, right_exact: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The parts each side of a float32 product is stored as, term by term along the stored
    head dim: a side that is not a bf16 tensor as written is its bf16 rounding ``hi`` and the
    bf16 rounding of the rest ``lo`` (``x − hi``); the product is the sum of the terms' products
    but ``lo · lo`` — ``[hi, hi, lo] · [hi, lo, hi]``, a head dim three times as long; with one
    side exact ``[hi, lo] · [x, x]``. Each part holds 8 significant bits, the two 16 bits: a
    term dropped or rounded is under 2⁻¹⁵ of its product (``|x − hi − lo| ≤ 2⁻¹⁶·|x|``,
    ``|lo| ≤ 2⁻⁸·|x|``), where bf16 operands (transformers' rotary embedding casts its tables so)
    carry 2⁻⁸ — and the scores' probabilities go to p·v as 16-bit numbers (2⁻⁸) either way."""
    if left_exact and right_exact:
        raise ValueError("two bf16 sides make no float32 product")
    if left_exact or right_exact:
        split, whole = ("hi", "lo"), ("hi", "hi")
        return (whole, split) if left_exact else (split, whole)
    return ("hi", "hi", "lo"), ("hi", "lo", "hi")


def _split_stages(program: Program, names: tuple[str, ...], dot: Compute,
                  sides: tuple) -> tuple[Stage, ...]:
    """The stages of a float32 product's operands stored in bf16 parts (:func:`split_terms`)
    over a head dim as many times as long as the terms, then the attention over them."""
    exact = [_plain(f) and f.param.dtype == "bf16" for f in sides]
    terms = split_terms(*exact)
    reduced = dot.over[0]
    count = len(terms[0])
    if isinstance(reduced.extent, int):
        extent, constraints = count * reduced.extent, list(program.size_constraints)
    else:
        taken = set(program.dim_names())
        extent = next(n for n in (f"{reduced.extent}_PARTS{k or ''}" for k in range(100))
                      if n not in taken)
        constraints = [*program.size_constraints,
                       (extent, binary("mul", DimSize(reduced.extent), count, dot.loc), dot.loc)]
    source = replace(program, size_constraints=constraints)
    parted = Axis(f"{reduced.name}_parts", extent, dot.loc)
    width = DimSize(reduced.extent) if isinstance(reduced.extent, str) else reduced.extent
    term = binary("floordiv", parted, width, dot.loc)
    within = binary("mod", parted, width, dot.loc)
    free = fresh_names(program, OPERAND)
    stages, params, loads = [], [], []
    for side, parts in zip(sides, terms):
        axes = _operand_axes(dot, side) + (parted,)
        value = substitute(side, lambda n: within if isinstance(n, Axis) and n.uid == reduced.uid
                           else None)
        value = value if value.dtype == "f32" else Cast(value, "f32", dot.loc)
        hi = Cast(value, "bf16", dot.loc)
        stored = hi
        if "lo" in parts:   # one term reads the rest
            lo = Cast(binary("sub", value, Cast(hi, "f32", dot.loc), dot.loc), "bf16", dot.loc)
            stored = where(compare("eq", term, parts.index("lo"), dot.loc), lo, hi, dot.loc)
        name = next(free)
        made = Compute(name, axes, (stored,), ("bf16",), loc=dot.loc, is_output=True)
        stages.append(_operand_stage(source, made, "bf16 parts " + ", ".join(parts)))
        param = TensorParam(name, tuple(a.extent for a in axes), "bf16", dot.loc)
        params.append(param)
        loads.append(Load(param, list(axes), side.loc))
    new_body = binary("mul", *loads, dot.loc)
    return (*stages, _attention_stage(source, names, dot, new_body, params, parted))


def _values_bf16(o: Compute) -> bool:
    """Whether the values ``o`` weighs (its factors but the weights, ``exp(s − m)``) are read
    from bf16 tensors alone."""
    values = [f for f in factors(inline_elementwise(o.bodies[0]))
              if not any(isinstance(n, Unary) and n.op == "exp" for n in nodes(f))]
    loads = [n for f in values for n in nodes(f) if isinstance(n, Load)]
    return bool(loads) and all(n.param.dtype == "bf16" for n in loads)


def _operand_axes(dot: Compute, side) -> tuple:
    """The axes of ``dot`` a side of its product runs over, in ``dot``'s order."""
    return tuple(a for a in dot.axes if a.uid in {x.uid for x in side.axes})


def _operand_stage(program: Program, made: Compute, note: str = "") -> Stage:
    stage = program_of(f"{program.name}_{made.name}", program, [made], [made])
    return Stage(stage, tuple(p.name for p in stage.params), (made.name,), note=note)


def _attention_stage(program: Program, names, dot: Compute, new_body, params: list,
                     over: Axis | None = None) -> Stage:
    """The attention of ``program`` with ``dot``'s product ``new_body`` (over ``over`` where the
    stored operands run over another head dim), reading the stored operands ``params``."""
    def body(node):
        return new_body if node is dot.bodies[0] else None
    rebuilt = rewrite_computes(program, body, over=(lambda c: (over,) if c.name == dot.name
                                                    else c.over) if over is not None else None)
    outputs = [rebuilt[c.name] for c in program.outputs]
    needed = computes_read_by(outputs)
    computes = [c for c in rebuilt.values() if c.name in needed]
    attention = program_of(f"{program.name}_attention", program, computes, outputs, params)
    return Stage(attention, tuple(p.name for p in attention.params),
                 tuple(c.name for c in outputs), names)


def _no_larger(side, reduced: Axis) -> bool:
    """Whether ``side`` runs over the head dim and the axes of one of the tensors it reads, no
    more: stored, it is as large as that tensor (a bias read by query and key in the key side
    would store a value per query, key and head dim)."""
    axes = {a.uid for a in side.axes}
    return reduced.uid in axes and any({a.uid for a in n.axes} == axes for n in nodes(side)
                                       if isinstance(n, Load))


def _plain(e) -> bool:
    """Whether ``e`` is a load at plain axes (what a tensor map copies)."""
    return isinstance(e, Load) and all(isinstance(x, Axis) for x in e.indices)

