"""Reductions of reductions of one monoid, written nested — ``T.sum(T.sum(f, over=w), over=h)``,
``T.max(T.max(x, over=w), over=h)``, a mean of means — merged into one reduction over both
axes (``over=(h, w)``), as a user who knew ``over=`` takes several axes would write it.

Nested, each inner reduction is a compute of its own: the outer one, or a chain that reads
it (a spatial softmax's sum reading its maximum), cannot be fused with it in one pass, so the
floor cut such a program into a stage a level (a soft-argmax over an image's pixels, written
nested: four kernels, its intermediates stored between them). Merged, the reduction sweeps the
two axes together (as one where their strides allow: :mod:`.flat_sweeps`) in one kernel.

It is the same reduction for a monoid of one commutative value (a sum, product, maximum or
minimum): the terms are the same, only the order of their combination changes. A sum's outer
body may also scale the inner sum by factors constant over the outer's axes (``Σ_h Σ_w f / W``,
a mean of means), since they distribute over the inner terms; a maximum, minimum or product is
merged only where the outer body is the inner reduction itself. An inner sum that is a GEMM
(``Σ_d q[i, d] · k[j, d]``), or an outer factor that reads the outer's axes (``Σ_j s[i, j] ·
v[j, e]``: attention's weighted sum, a bilinear form), stays nested: merged, the products would
leave the tensor cores for a sweep of every term. The inner reduction is kept where something
else reads it."""
from __future__ import annotations

from ..algebra import inline_elementwise
from ..algebra.exprs import has_axis, nodes, rewrite_computes, rewritten_program, substitute
from ..dsl.expr import Binary, Expr, Ref, Unary
from ..dsl.program import Compute, Program
from .contraction_plan import is_gemm

# monoids of one commutative value: nested or merged, the same reduction
MERGEABLE = ("sum", "prod", "max", "min")


def merged_reductions(program: Program) -> tuple[Program, str] | None:
    """``program`` with each reduction of a reduction of its monoid merged into one over both
    axes (module docstring), and a note naming them; ``None`` where it has none."""
    merged: list[str] = []
    # each merged reduction's axes, from its rebuilt inner one's (nested three deep, the middle
    # one has taken the innermost's): the rebuild asks a compute's bodies before its axes
    axes: dict = {}

    def bodies(c: Compute, rebuilt: tuple) -> tuple:
        body = inline_elementwise(rebuilt[0])
        inner = _inner(c, body)
        if inner is None:
            return rebuilt
        merged.append(f"{c.name} over {_names(c.over)} of {inner.name} over {_names(inner.over)}")
        axes[c.name] = c.over + inner.over
        key = ("ref", inner.name, 0)
        return (substitute(body, lambda n: inner.bodies[0] if n.key() == key else None),)

    made = rewrite_computes(program, lambda n: None, bodies=bodies,
                            over=lambda c: axes.get(c.name, c.over))
    if not merged:
        return None
    note = f"{'; '.join(merged)} merged into one reduction over both (nested, each a kernel)"
    return rewritten_program(program, list(program.params), _read(program, made)), note


def _names(axes) -> str:
    return ", ".join(a.name for a in axes)


def _inner(c: Compute, body: Expr) -> Compute | None:
    """The reduction ``c``'s body (elementwise values inlined) reduces again with ``c``'s
    monoid, where the two merge (module docstring): read as the whole body, or for a sum as a
    factor of it; else None."""
    if not c.is_reduction or c.arity != 1 or c.monoid.name not in MERGEABLE:
        return None
    refs = [n for n in nodes(body) if isinstance(n, Ref)]
    if len(refs) != 1 or refs[0].component != 0:
        return None
    inner = refs[0].compute
    if not inner.is_reduction or inner.arity != 1 or inner.monoid.name != c.monoid.name or \
            inner.dtypes != c.dtypes or is_gemm(inner):
        return None
    whole = isinstance(body, Ref)
    return inner if whole or (c.monoid.name == "sum" and _scales(body, c.over)) else None


def _scales(e: Expr, over: tuple) -> bool:
    """Whether ``e`` is its one reference times factors (a product, a quotient by something not
    reading it, a negation) that read none of the axes ``over``: a sum of it over them is the
    factors times the sum of the terms."""
    if isinstance(e, Ref):
        return True
    if isinstance(e, Unary) and e.op == "neg":
        return _scales(e.a, over)
    if isinstance(e, Binary) and e.op in ("mul", "div"):
        holds_a, holds_b = _reads_a_compute(e.a), _reads_a_compute(e.b)
        if holds_b and (e.op == "div" or holds_a):
            return False
        factor = e.b if holds_a else e.a
        return not any(has_axis(factor, a) for a in over) and \
            _scales(e.a if holds_a else e.b, over)
    return False


def _reads_a_compute(e: Expr) -> bool:
    return any(isinstance(n, Ref) for n in nodes(e))


def _read(program: Program, made: dict) -> dict:
    """``made`` less the computes neither an output nor another kept compute reads (an inner
    reduction merged into its only reader)."""
    needed = {c.name for c in program.outputs}
    for c in reversed(list(made.values())):
        if c.name in needed:
            needed |= {r.name for r in c.inputs()}
    return {name: c for name, c in made.items() if name in needed}
