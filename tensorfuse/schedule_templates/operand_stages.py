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

from ..algebra import inline_elementwise
from ..algebra.exprs import nodes, rewrite_computes
from ..dsl.expr import Axis, Cast, Load, Ref, binary
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
    axes, the head dim last), then the attention reading them; ``()`` for any other program."""
    try:
        m = softmax_states(program, names)[0]
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
    if not computed or not all(_no_larger(f, dot.over[0]) for f in computed):
        return ()
    dtype = storage_of(body)
    free = fresh_names(program, OPERAND)
    stages, loads = [], {}
    reduced = dot.over[0]
    for side in computed:
        axes = tuple(a for a in dot.axes if a.uid in {x.uid for x in side.axes}) + (reduced,)
        name = next(free)
        made = Compute(name, axes, (Cast(side, dtype, side.loc),), (dtype,), loc=dot.loc,
                       is_output=True)
        stage = program_of(f"{program.name}_{name}", program, [made], [made])
        stages.append(Stage(stage, tuple(p.name for p in stage.params), (name,)))
        param = TensorParam(name, tuple(a.extent for a in axes), dtype, dot.loc)
        loads[side.uid] = Load(param, list(axes), side.loc)
    new_body = binary("mul", *(loads.get(f.uid, f) for f in sides), body.loc)

    def replace(node):
        return new_body if node is dot.bodies[0] else None
    rebuilt = rewrite_computes(program, replace)
    outputs = [rebuilt[c.name] for c in program.outputs]
    needed = computes_read_by(outputs)
    computes = [c for c in rebuilt.values() if c.name in needed]
    params = [loads[f.uid].param for f in computed]
    attention = program_of(f"{program.name}_attention", program, computes, outputs, params)
    return (*stages, Stage(attention, tuple(p.name for p in attention.params),
                           tuple(c.name for c in outputs), names))


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

