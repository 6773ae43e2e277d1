"""The floor under the templates: a program no template takes whole, cut into stages that each
one can take.

A chain of reductions fuses into one template kernel when every reduction it needs in the middle
of the pass can be rolled (softmax, norms, attention). Many programs users write cannot be: a
max-pool over tokens followed by a norm over the pooled features needs the whole max before the
norm starts, and a variance of a mean taken over two nested axes reads the mean's final value.
Such a program used to run on TVM's default GPU schedule (dlight rules), which keeps the chain
in one untiled kernel: up to hundreds of times slower than the unfused torch sequence.

:func:`plan_stages` cuts the program at the reductions that cannot stay in the pass: each stage
is a program of its own — the reductions over one axis that are ready (everything they read is a
parameter or an earlier stage's result), fused where a template takes them together, and the
outputs that become computable — and the reductions later stages read are stored between them
(as the compute's own dtype, usually float32). Each stage gets a template (the row-tile kernel
for most) or, where none takes even that, TVM's default schedule of one reduction, which tiles
a single reduction well. The stages are data; :class:`tensorfuse.staged.StagedKernel` runs them.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, replace
from typing import Callable

from ..algebra.exprs import nodes, rewrite_computes, substitute
from ..dsl import dtypes as dt
from ..dsl.expr import DimSize, Expr, Load, Ref, Scalar, walk
from ..dsl.program import Compute, Program, TensorParam, size_names


@dataclass(frozen=True)
class Stage:
    """One kernel of a staged program: its ``program``; ``inputs``: the names its parameters take
    their values from, in order (the user's parameters, or earlier stages' results);
    ``produces``: the compute each of its outputs is, in order."""

    program: Program
    inputs: tuple[str, ...]
    produces: tuple[str, ...]
    reduces: tuple[str, ...] = ()   # the reductions it computes (its results stored or not)
    templated: bool = False         # whether ``fits`` took it (a template runs it)
    note: str = ""                  # how it stores what it produces, where that needs saying

    def describe(self) -> str:
        note = f" ({self.note})" if self.note else ""
        return f"{', '.join(self.produces)} from {', '.join(self.inputs)}{note}"


class NotStageable(Exception):
    """Why a program cannot be cut into stages (the floor then stays TVM's default schedule)."""


def plan_stages(program: Program, fits: Callable[[Program], bool]) -> tuple[Stage, ...]:
    """The stages of ``program``: at each step, the ready reductions sharing the axes they reduce
    over, as many as ``fits`` (whether a template takes a stage's program) accepts together, with
    the outputs they make computable; one ready reduction alone where no group fits. Raises
    :class:`NotStageable` where a template takes the program whole, where it has fewer than two
    stages, or where a reduction of several components would have to be stored between them."""
    if fits(program):
        raise NotStageable(f"a template takes {program.name} whole")
    program, hoisted = _hoisted(program)
    reductions = [c for c in program.computes if c.is_reduction]
    depends = {c.name: _reductions_read(c) for c in program.computes}
    stored: set[str] = set()
    left_outputs = list(program.outputs)
    stages: list[Stage] = []
    while any(r.name not in stored for r in reductions):
        ready = [r for r in reductions if r.name not in stored]
        # once what could not stay in the pass is stored, the rest may be a chain a template
        # fuses whole although its first ready group alone is not: cosine-similarity attention
        # (q·k / (|q| |k|)) stores its norms, then attention takes the rest — by groups, its q·k
        # products over the head dim were a stage of their own, storing every score (2 GiB at
        # B2 H16 S4096)
        stage = _fitting(program, ready, depends, stored, left_outputs, True, fits, hoisted) \
            if stored else None
        if stage is None:
            stage = _first_chain(program, ready, depends, stored, left_outputs, fits, hoisted)
        if stage is None:
            stage = next(filter(None, (
                _first_fitting(program, group, depends, stored, left_outputs, fits, hoisted)
                for group in _ready_groups(ready, depends, stored))), None)
        if stage is None:   # nothing fits: the first ready reduction alone, on any schedule
            first = next(iter(_ready_groups(ready, depends, stored)))[:1]
            stage = _asked(_stage(program, first, depends, stored, left_outputs,
                                  with_outputs=False, hoisted=hoisted), fits)
        stages.append(stage)
        stored |= set(stage.reduces) | (set(stage.produces) & hoisted)
        left_outputs = [c for c in left_outputs if c.name not in stage.produces]
    if left_outputs:
        last = _asked(_stage(program, [], depends, stored, left_outputs, with_outputs=True),
                      fits)
        apart = _by_axes(left_outputs)
        # outputs over different axes (a gradient of x[i, j] and of y[j, i]): no template writes
        # them in one pass — a stage each, each its own template's, not one on TVM's default
        stages += [last] if last.templated or len(apart) == 1 else [
            _asked(_stage(program, [], depends, stored, outs, with_outputs=True), fits)
            for outs in apart]
    if len(stages) < 2:
        raise NotStageable(f"{program.name} is one stage already")
    return tuple(stages)


def _hoisted(program: Program) -> tuple[Program, set[str]]:
    """``program`` with each function of reductions over fewer axes than the value reading it
    (``rsqrt(out_sum[i])`` in ``out[i, j]``) made an elementwise compute of its own over those
    axes, and their names: the stage of those reductions stores it (:func:`_stage`), so a later
    stage reads one value a row instead of computing it again for every element (cosine
    similarities' GEMM epilogue took two reciprocal square roots an element)."""
    made: dict[tuple, Compute] = {}
    order: list[Compute] = []

    def candidate(e: Expr, around: set[int]) -> bool:
        axes = _reductions_axes(e)
        return axes is not None and {a.uid for a in e.axes} <= axes < around

    for c in program.computes:
        around = {a.uid for a in c.axes + c.over}

        def hoist(n: Expr, around=around, c=c):
            if not candidate(n, around):
                return None
            if n.key() not in made:   # its reads point at the rebuilt computes below
                first = next(r for r in nodes(n) if isinstance(r, Ref)).compute
                made[n.key()] = Compute(f"{first.name}_{len(made)}", first.axes, (n,),
                                        (dt.resolve(n.dtype),), loc=c.loc)
                order.append(made[n.key()])
            return Ref(made[n.key()], 0, n.loc)

        order.append(replace(c, bodies=tuple(substitute(b, hoist) for b in c.bodies)))
    named = _named_row_values(program)
    if not made:
        return program, named
    rebuilt = rewrite_computes(types.SimpleNamespace(computes=order), lambda n: None)
    return (Program(program.name, list(program.params), list(rebuilt.values()),
                    [rebuilt[o.name] for o in program.outputs], list(program.axes),
                    list(program.size_constraints), program.loc),
            {c.name for c in made.values()} | named)


def _named_row_values(program: Program) -> set[str]:
    """The elementwise computes the user named that :func:`_hoisted` would have made: a function
    of reductions over the compute's own axes, read by a compute over more axes (``nq =
    sqrt(nq_sum)`` in ``s / (nq * nk)``: a stage stores the norm, not the sum of squares that
    every score would take a square root of again)."""
    readers: dict[str, set[int]] = {}
    for c in program.computes:
        for d in c.inputs():
            readers.setdefault(d.name, set()).update(a.uid for a in c.axes + c.over)
    return {c.name for c in program.computes if not c.is_reduction and c.arity == 1 and
            _reductions_axes(c.bodies[0]) == (axes := {a.uid for a in c.axes}) and
            axes < readers.get(c.name, set())}


def _reductions_axes(e: Expr) -> set[int] | None:
    """The axes (uids) of the reductions ``e`` is a function of, where it is one of reductions
    over the same axes and nothing else (no load; not a bare read of one); else None."""
    inside = nodes(e)
    refs = [n for n in inside if isinstance(n, Ref)]
    if isinstance(e, Ref) or not refs or any(isinstance(n, Load) for n in inside) or \
            any(not r.compute.is_reduction for r in refs):
        return None
    axes = {a.uid for a in refs[0].compute.axes}
    return axes if all({a.uid for a in r.compute.axes} == axes for r in refs) else None


def _reductions_read(c: Compute, stop: set[str] = frozenset()) -> set[str]:
    """The reductions ``c`` reads, directly or through elementwise computes (not through those
    named in ``stop``: values stored themselves)."""
    found: set[str] = set()
    pending = list(c.inputs())
    while pending:
        d = pending.pop()
        if d.is_reduction:
            found.add(d.name)
        elif d.name not in stop:
            pending.extend(d.inputs())
    return found


def _by_axes(outputs: list[Compute]) -> list[list[Compute]]:
    """``outputs`` in groups of those over the same axes in the same order, in order."""
    groups: dict = {}
    for c in outputs:
        groups.setdefault(tuple(a.uid for a in c.axes), []).append(c)
    return list(groups.values())


def _ready_groups(ready: list[Compute], depends: dict, stored: set[str]):
    """Groups of reductions that can run now, each sharing the axes it reduces over: a ready one
    (everything it reads stored) and those of the same axes that read only stored values and
    the group itself, largest group first."""
    groups = []
    for seed in ready:
        if not depends[seed.name] <= stored:
            continue
        over = tuple(a.uid for a in seed.over)
        group = [seed]
        grew = True
        while grew:
            grew = False
            for r in ready:
                if r in group or tuple(a.uid for a in r.over) != over:
                    continue
                if depends[r.name] <= stored | {g.name for g in group}:
                    group.append(r)
                    grew = True
        if not any({g.name for g in group} == {h.name for h in other} for other in groups):
            # the narrowest first: a stage stores the reductions it does not finish, and a
            # narrow one (a norm per row) is cheap to store where a wide one (a GEMM's product
            # per pair) is not — taken last, its stage writes the outputs instead (cosine
            # similarities of [8192, 1024] × [8192, 1024]: the GEMM stored its 268 MB of float32
            # products and ran at 0.46× torch.compile, ``benchmarks.unlisted_kernels``)
            groups.append(sorted((r for r in ready if r in group), key=lambda r: len(r.axes)))
    return sorted(groups, key=len, reverse=True)


def _first_fitting(program, group, depends, stored, left_outputs, fits,
                   hoisted: set[str]) -> Stage | None:
    """The stage of ``group`` (with the outputs it makes computable, else without) that ``fits``
    takes, trying the group's prefixes from the longest; ``None`` where none fits."""
    return next(filter(None, (
        _fitting(program, group[:size], depends, stored, left_outputs, with_outputs, fits,
                 hoisted)
        for size in range(len(group), 0, -1) for with_outputs in (True, False))), None)


def _first_chain(program, ready, depends, stored, left_outputs, fits,
                 hoisted: set[str]) -> Stage | None:
    """The longest chain of dependent reductions over different axes that a template takes as
    one stage: the reductions not yet stored, in program order (so each prefix holds whatever
    its members read), from all but the last (all, once something is stored) down to two. A
    nearest neighbour's squared distances (over the coordinates) and their minimum (over the
    candidates) are one contraction-template pass; then its mean over the points is a stage of
    its own — cut by groups of one axis, the distances were stored whole (512 MiB at B8 4096 ×
    4096)."""
    for size in range(len(ready) - (0 if stored else 1), 1, -1):
        chain = ready[:size]
        if len({tuple(a.uid for a in r.over) for r in chain}) < 2 or \
                not all(depends[r.name] <= stored | {c.name for c in chain} for r in chain):
            continue   # one axis: a group (below); or not closed under what it reads
        stage = _fitting(program, chain, depends, stored, left_outputs, True, fits, hoisted) \
            or _fitting(program, chain, depends, stored, left_outputs, False, fits, hoisted)
        if stage is not None:
            return stage
    return None


def _fitting(program, group, depends, stored, left_outputs, with_outputs: bool, fits,
             hoisted: set[str]) -> Stage | None:
    """The stage of ``group`` (:func:`_stage`) where ``fits`` takes it, else ``None``."""
    try:
        stage = _stage(program, group, depends, stored, left_outputs, with_outputs, hoisted)
    except NotStageable:
        return None
    return replace(stage, templated=True) if fits(stage.program) else None


def _asked(stage: Stage, fits) -> Stage:
    """``stage``, with whether ``fits`` takes it."""
    return replace(stage, templated=fits(stage.program))


def _stage(program, group, depends, stored, left_outputs, with_outputs: bool,
           hoisted: set[str] = frozenset()) -> Stage:
    """The stage computing ``group`` (and, ``with_outputs``, the program outputs that need only
    stored values and the group; the ``hoisted`` values of the group that later stages read),
    reading stored reductions and values as tensors."""
    names = {g.name for g in group}
    finished = [c for c in left_outputs if c.name not in names
                and depends[c.name] <= stored | names] if with_outputs else []
    # what a later stage's reductions and outputs read (through elementwise computes): a sum
    # only the outputs made here read is not stored for them
    here = names | {c.name for c in finished}
    # values computed from the group alone that later stages read (:func:`_hoisted`)
    read_later = {d.name for c in program.computes if c.name not in here | stored
                  for d in c.inputs()}
    kept = [c for c in program.computes if c.name in hoisted and c.name not in here and
            c.name in read_later and c.name not in stored and
            depends[c.name] <= names | stored and
            any(d.name in names for d in c.inputs()) and _one_row_each(c, group)]
    # the reductions later stages read other than through the values kept here
    through = stored | {c.name for c in kept}
    needed_later = {d for c in program.computes if c.name not in here | stored
                    and (c.is_reduction or c.is_output)
                    for d in _reductions_read(c, through)} | {c.name for c in program.outputs}
    outputs = [g for g in group if g.name in needed_later] + kept + finished
    if not outputs:
        raise NotStageable("a stage with nothing to store")
    sub = _sub_program(program, outputs, stored,
                       f"{program.name}_{'_'.join(c.name for c in outputs)}")
    return Stage(sub, tuple(p.name for p in sub.params), tuple(c.name for c in outputs),
                 tuple(g.name for g in group))


def _one_row_each(c: Compute, group) -> bool:
    """Whether ``c`` runs over the axes of a reduction of ``group`` (a value a row of it)."""
    return any({a.uid for a in c.axes} == {a.uid for a in g.axes} for g in group)


def _sub_program(program: Program, outputs: list[Compute], stored: set[str], name: str) -> Program:
    """A program computing ``outputs`` of ``program``, where the reductions in ``stored`` are read
    from tensor parameters of their own name (their axes as dimensions) instead of computed."""
    copies: dict[str, Compute] = {}
    made: list[Compute] = []
    stored_params: dict[str, TensorParam] = {}
    taken = {p.name for p in program.params}

    def stored_param(c: Compute) -> TensorParam:
        if c.arity != 1:
            raise NotStageable(f"{c.name} has {c.arity} components to store between stages")
        if c.name not in stored_params:
            if c.name in taken:
                raise NotStageable(f"{c.name} is also a parameter's name")
            dims = tuple(a.extent for a in c.axes)
            stored_params[c.name] = TensorParam(c.name, dims, dt.resolve(c.dtypes[0]), c.loc)
        return stored_params[c.name]

    def copy(c: Compute) -> Compute:
        if c.name in copies:
            return copies[c.name]

        def read(node: Expr):
            if not isinstance(node, Ref):
                return None
            if node.compute.name in stored:
                return Load(stored_param(node.compute), node.compute.axes, node.loc)
            return Ref(copy(node.compute), node.component, node.loc)

        bodies = tuple(substitute(b, read) for b in c.bodies)
        new = Compute(c.name, c.axes, bodies, c.dtypes, c.monoid, c.over, c.loc,
                      is_output=any(o.name == c.name for o in outputs))
        copies[c.name] = new
        made.append(new)
        return new

    for o in outputs:
        copy(o)
    order = {c.name: k for k, c in enumerate(program.computes)}
    made.sort(key=lambda c: order[c.name])
    # stored values become parameters only where read: all of them are used
    return program_of(name, program, made, [copies[o.name] for o in outputs],
                      list(stored_params.values()))


def fresh_names(program: Program, base: str):
    """Names for values a rewrite of ``program`` adds: ``base``, then ``base_1``, ``base_2``… —
    each one no compute or parameter of the program has."""
    taken = {c.name for c in program.computes} | {p.name for p in program.params}
    return (n for n in (base, *(f"{base}_{k}" for k in range(1, 100))) if n not in taken)


def program_of(name: str, source: Program, computes: list, outputs: list,
               extra_params: list = ()) -> Program:
    """A program of ``computes`` (in order) whose parameters are those of ``source`` they read
    (in its order), then ``extra_params``, then tensors of ``source`` they do not read that bind
    a size their expressions use (a grouped head's ``h // (H // HKV)`` in a stage that reads
    neither k nor v: ``k`` comes along for its shape); :class:`NotStageable` where a size they
    use is bound by no tensor."""
    used_params, used_sizes = set(), set()

    def visit(node: Expr):
        if isinstance(node, Load):
            used_params.add(node.param.name)
        elif isinstance(node, Scalar):
            used_params.add(node.name)
        elif isinstance(node, DimSize):
            used_sizes.add(node.name)

    for c in computes:
        for b in c.bodies:
            walk(b, visit)
        used_sizes |= {a.extent for a in c.axes + c.over if isinstance(a.extent, str)}
    params = [p for p in source.params if p.name in used_params] + list(extra_params)
    bound = {d for p in params if isinstance(p, TensorParam) for d in p.dims}
    for p in source.params:
        if isinstance(p, TensorParam) and p not in params and used_sizes - bound & set(p.dims):
            params.append(p)
            bound |= set(p.dims)
    # a size the program derives from bound ones (an operand stored in parts: 3·D)
    bound |= {n for n, e in source.derived_sizes().items() if set(size_names(e)) <= bound}
    if used_sizes - bound:
        raise NotStageable(f"sizes {', '.join(sorted(used_sizes - bound))} would be bound by no "
                           "tensor of the stage")
    axes = sorted({a.uid: a for c in computes for a in c.axes + c.over}.values(),
                  key=lambda a: a.uid)
    return Program(name, params, list(computes), list(outputs), axes,
                   list(source.size_constraints), source.loc)

