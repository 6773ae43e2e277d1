"""Attention whose output is a function of the normalised weighted sum — gated by the query's own
values (``o / l · sigmoid(gate[b, h, i, e])``, Qwen3-Next's gated attention), added to a residual —
as two stages: the attention with ``o / l`` as its output (float32: the value the program goes
on computing with), then the function of it, elementwise. The Hopper attention template takes
the first, which it refuses with the function in it (its epilogue writes ``o / l``); the Triton
template that took the whole otherwise runs the attention well below it (its causal 0.70–0.77×
the Hopper kernel's rate: ``benchmarks.user_kernels``), and the second stage moves the output
once more (two reads and a write of it: a few percent of the attention's time at long
sequences)."""
from __future__ import annotations

from dataclasses import replace

from ..algebra import inline_elementwise
from ..algebra.exprs import nodes, substitute
from ..dsl.expr import Binary, Cast, Load, Ref
from ..dsl.program import Compute, Program, TensorParam
from ..errors import ScheduleError
from .attention_chain import softmax_states
from .stages import Stage, program_of

RATIO = "attention"   # the first stage's output (a name the program does not use is taken)


def attention_epilogue_stages(program: Program, names: tuple[str, ...]) -> tuple[Stage, ...]:
    """The two stages of ``program`` (softmax attention fused over ``names``, one output that
    reads the chain only through ``o / l`` and is not ``o / l`` itself, cast or not); ``()`` for
    any other program."""
    try:
        _, plain, weighted, _, _ = softmax_states(program, names)
    except ScheduleError:   # not softmax attention: nothing to split
        return ()
    if len(program.outputs) != 1 or program.outputs[0].is_reduction:
        return ()
    out = program.outputs[0]
    body = inline_elementwise(out.bodies[0])
    ratios = [n for n in nodes(body) if _is_ratio(n, weighted, plain)]
    bare = body.a if isinstance(body, Cast) else body
    if not ratios or _is_ratio(bare, weighted, plain) or \
            tuple(weighted.axes) != tuple(out.axes):
        return ()   # nothing after o / l, or o's axes are not the output's
    taken = {c.name for c in program.computes} | {p.name for p in program.params}
    name = next(n for n in (RATIO, *(f"{RATIO}_{k}" for k in range(1, 100))) if n not in taken)
    stored = TensorParam(name, tuple(a.extent for a in out.axes), "f32", out.loc)
    epilogue = replace(out, bodies=(substitute(body, lambda n: Load(stored, list(out.axes))
                                               if _is_ratio(n, weighted, plain) else None),))
    if any(isinstance(n, Ref) for n in nodes(epilogue.bodies[0])):
        return ()   # the output reads a state of the chain besides o / l
    ratio = Compute(name, out.axes, (ratios[0],), ("f32",), loc=out.loc, is_output=True)
    computes = [c for c in program.computes if c.is_reduction or c.name in _read_by(
        [weighted, plain], program)] + [ratio]
    first = program_of(f"{program.name}_attention", program, computes, [ratio])
    second = program_of(f"{program.name}_epilogue", program, [epilogue], [epilogue],
                        [stored])
    return (Stage(first, tuple(p.name for p in first.params), (name,), names),
            Stage(second, tuple(p.name for p in second.params), (out.name,)))


def _is_ratio(e, weighted: Compute, plain: Compute) -> bool:
    return isinstance(e, Binary) and e.op == "div" and isinstance(e.a, Ref) and \
        e.a.compute is weighted and isinstance(e.b, Ref) and e.b.compute is plain


def _read_by(computes: list, program: Program) -> set:
    """The elementwise computes ``computes`` read, directly or through others (the scores)."""
    found, todo = set(), list(computes)
    while todo:
        c = todo.pop()
        for n in (n for b in c.bodies for n in nodes(b) if isinstance(n, Ref)):
            if n.compute.name not in found:
                found.add(n.compute.name)
                todo.append(n.compute)
    return {n for n in found if not next(c for c in program.computes if c.name == n).is_reduction}
