"""Attention whose output is a function of the normalised weighted sum — gated by the query's own
values (``o / l · sigmoid(gate[b, h, i, e])``, Qwen3-Next's gated attention), added to a residual —
as two stages: the attention with ``o / l`` as its output (float32: the value the program goes
on computing with), then the function of it, elementwise. The Hopper attention template takes
the first, which it refuses with the function in it (its epilogue writes ``o / l``); the Triton
template that took the whole otherwise runs the attention well below it (its causal 0.70–0.77×
the Hopper kernel's rate: ``benchmarks.user_kernels``), and the second stage moves the output
once more (two reads and a write of it: a few percent of the attention's time at long
sequences). Several softmax chains over the same keys whose outputs the function combines —
differential attention's ``o₁ / l₁ − λ · o₂ / l₂`` — are a stage each, then the function: on the
H200 (B2 H16 S4096 D64/E128 causal) 0.495 ms where the Triton template's one kernel of both took
0.722 (``benchmarks.variant_kernels``)."""
from __future__ import annotations

from dataclasses import replace

from ..algebra import inline_elementwise
from ..algebra.exprs import nodes, substitute
from ..dsl.expr import Binary, Cast, Load, Ref
from ..dsl.program import Compute, Program, TensorParam
from ..errors import ScheduleError
from .attention_chain import softmax_states
from .stages import Stage, fresh_names, program_of

RATIO = "attention"   # the first stage's output (a name the program does not use is taken)


def attention_epilogue_stages(program: Program, names: tuple[str, ...]) -> tuple[Stage, ...]:
    """The stages of ``program`` (softmax attention fused over ``names``: one chain, or several
    over the same keys — differential attention's two — one output that reads each chain only
    through its ``o / l`` and is not one ``o / l`` itself, cast or not): each chain's attention
    with its ``o / l`` as the output, then the function of them; ``()`` for any other program."""
    chains = _chains(program, names)
    states = []
    for chain in chains:
        try:
            _, plain, weighted, _, _ = softmax_states(program, chain)
        except ScheduleError:   # not softmax attention: nothing to split
            return ()
        states.append((chain, plain, weighted))
    if not states or len(program.outputs) != 1 or program.outputs[0].is_reduction:
        return ()
    out = program.outputs[0]
    body = inline_elementwise(out.bodies[0])
    bare = body.a if isinstance(body, Cast) else body
    ratios = [[n for n in nodes(body) if _is_ratio(n, weighted, plain)]
              for _, plain, weighted in states]
    alone = states[0] if len(states) == 1 else None
    if not all(ratios) or alone and _is_ratio(bare, alone[2], alone[1]) or \
            any([a.uid for a in weighted.axes] != [a.uid for a in out.axes]
                for _, _, weighted in states):
        return ()   # nothing after o / l, or o's axes are not the output's
    free = fresh_names(program, RATIO)
    stored = [TensorParam(next(free), tuple(a.extent for a in out.axes), "f32", out.loc)
              for _ in states]

    def read_stored(n):
        return next((Load(param, list(out.axes)) for param, (_, plain, weighted)
                     in zip(stored, states) if _is_ratio(n, weighted, plain)), None)
    epilogue = replace(out, bodies=(substitute(body, read_stored),))
    if any(isinstance(n, Ref) for n in nodes(epilogue.bodies[0])):
        return ()   # the output reads a state of a chain besides o / l
    stages = []
    for param, found, (chain, plain, weighted) in zip(stored, ratios, states):
        ratio = Compute(param.name, out.axes, (found[0],), ("f32",), loc=out.loc, is_output=True)
        needed = computes_read_by([weighted, plain])
        computes = [c for c in program.computes if c.name in needed] + [ratio]
        first = program_of(f"{program.name}_{param.name}" if len(states) > 1 else
                           f"{program.name}_attention", program, computes, [ratio])
        stages.append(Stage(first, tuple(p.name for p in first.params), (param.name,), chain))
    second = program_of(f"{program.name}_epilogue", program, [epilogue], [epilogue], stored)
    return (*stages, Stage(second, tuple(p.name for p in second.params), (out.name,)))


def _chains(program: Program, names: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The fused reductions ``names`` as chains: each maximum with the sums whose bodies read it
    (in ``names``' order); one chain where there is no maximum or a sum reads none or several."""
    by_name = {c.name: c for c in program.computes}
    maxes = [n for n in names if by_name[n].monoid.name == "max"]
    owner = {}
    for n in names:
        if n not in maxes:
            read = {r.compute.name for r in nodes(inline_elementwise(by_name[n].bodies[0]))
                    if isinstance(r, Ref)} & set(maxes)
            if len(read) != 1:
                return [names]
            owner[n] = read.pop()
    if len(maxes) < 2:
        return [names]
    return [tuple(n for n in names if n == m or owner.get(n) == m) for m in maxes]


def _is_ratio(e, weighted: Compute, plain: Compute) -> bool:
    return isinstance(e, Binary) and e.op == "div" and isinstance(e.a, Ref) and \
        e.a.compute is weighted and isinstance(e.b, Ref) and e.b.compute is plain


def computes_read_by(computes: list) -> set:
    """``computes`` and every compute they read, directly or through others (the scores, the
    maximum, the q·k products)."""
    found, todo = {c.name for c in computes}, list(computes)
    while todo:
        c = todo.pop()
        for n in (n for b in c.bodies for n in nodes(b) if isinstance(n, Ref)):
            if n.compute.name not in found:
                found.add(n.compute.name)
                todo.append(n.compute)
    return found
