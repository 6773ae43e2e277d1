"""The forms of an attention score the Hopper kernel writes apart from the dot product: a factor
the same everywhere (folded into exp2), a bias linear in the key index (ALiBi's: an FFMA an
element), and a quotient by factors of the query and of the key (cosine similarity's
``q·k / (|q_i| |k_j|)``), written as products by their reciprocals, so that a kernel computes
each row's and each column's factor once instead of dividing every element."""
from __future__ import annotations

from ..algebra.exprs import (add, const, has_axis, is_const, linear_in, neg, nodes, refs_to,
                             sub)
from ..dsl import dtypes as dt
from ..dsl.expr import Axis, Binary, Const, Expr, Load, Ref, Unary, binary


def separated_score(score: Expr, dot: str, roles: dict) -> Expr | None:
    """``score`` as ``dot · C · R`` where it is the dot product times and divided by factors
    that each read the key axis or the query axis but not both: a divisor becomes the product
    by its reciprocal, the key axis's factors ``C`` and the rest ``R`` (scalars, the query's).
    Each fragment's column factors and row factors are then the same expressions, computed
    once; a full-precision division an element had held the cosine-similarity attention of
    ``benchmarks.pipeline_kernels`` to 272 TFLOP/s on the H200. ``roles``: axis name → its role
    (``0`` the query axis, ``j`` the key axis). None where nothing divides, or the score is not
    such a product."""
    above, below = [], []

    def split(e: Expr, numerator: bool) -> None:
        if isinstance(e, Binary) and e.op in ("mul", "div") and dt.is_float(e.dtype):
            split(e.a, numerator)
            split(e.b, numerator == (e.op == "mul"))
        else:
            (above if numerator else below).append(e)

    split(score, True)
    dots = [f for f in above if isinstance(f, Ref) and f.compute.name == dot]
    rest = [f for f in above if not any(f is d for d in dots)]
    if not below or len(dots) != 1 or any(refs_to(f, {dot}) for f in rest + below):
        return None

    def reads(f: Expr) -> set:
        return {roles.get(n.name) for n in nodes(f) if isinstance(n, Axis)}

    if any({"0", "j"} <= reads(f) for f in rest + below):
        return None
    columns, others = None, None
    for f, up in [(f, True) for f in rest] + [(f, False) for f in below]:
        f = f if up else binary("div", Const(1.0, "f32"), f, f.loc)
        if "j" in reads(f):
            columns = f if columns is None else binary("mul", columns, f, f.loc)
        else:
            others = f if others is None else binary("mul", others, f, f.loc)
    made = dots[0]
    for f in (columns, others):
        made = made if f is None else binary("mul", made, f, f.loc)
    return made


def reads_dot(e: Expr, dot: str) -> bool:
    return any(isinstance(n, Ref) and n.compute.name == dot for n in nodes(e))


def dot_factor(term: Expr, dot: str) -> Expr | None:
    """``scale`` where ``term`` is ``dot · scale`` with ``scale`` the same for every element (no
    axes, tensors or other computes), 1 where it is the dot product alone; None otherwise."""
    if isinstance(term, Ref) and term.compute.name == dot:
        return const(1.0)
    if isinstance(term, Binary) and term.op == "mul":
        for dot_side, other in ((term.a, term.b), (term.b, term.a)):
            if isinstance(dot_side, Ref) and dot_side.compute.name == dot and \
                    not other.axes and not any(isinstance(n, (Load, Ref)) for n in nodes(other)):
                return other
    return None


def signed_terms(e: Expr, sign: int = 1) -> list[tuple[int, Expr]]:
    """The terms of a sum, with their signs."""
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        return signed_terms(e.a, sign) + signed_terms(e.b, sign if e.op == "add" else -sign)
    if isinstance(e, Unary) and e.op == "neg":
        return signed_terms(e.a, -sign)
    return [(sign, e)]


def key_linear_score(score: Expr, chain) -> tuple[Expr | None, Expr | None]:
    """``(scale, key_bias)`` where the score is ``dot · scale + key_bias · j + rest`` — one term
    reading the dot product, ``scale`` the same everywhere, ``key_bias`` free of the query index
    and of tensors but those read by batch and head alone (ALiBi's slopes ``[H]``: the
    coefficient is computed once a tile), ``rest`` free of the key index, dropped: it shifts
    each row's scores by one amount, which the softmax does not see (nor a mask: it is applied
    apart). Not
    where the chain writes the log-sum-exp (the shift would have to come back into it) or the
    score has any other form: ``(None, None)``."""
    if chain.lse:
        return None, None
    terms = signed_terms(score)
    dots = [(sign, t) for sign, t in terms if reads_dot(t, chain.dot)]
    if len(dots) != 1:
        return None, None
    sign, term = dots[0]
    scale = dot_factor(term, chain.dot)
    if scale is None:
        return None, None
    bias = None
    for s, t in terms:
        if t is not term:
            bias = (t if s > 0 else neg(t)) if bias is None else (add if s > 0 else sub)(bias, t)
    split = linear_in(bias, chain.axes[3]) if bias is not None else None
    if split is None:
        return None, None
    key_bias, rest = split
    per_tile = {a.uid for a in chain.axes[:2] if a is not None}   # batch and head

    def constant_in_a_tile(n) -> bool:   # a tensor read by batch and head only (ALiBi's slopes)
        return isinstance(n, Load) and all(
            isinstance(x, Const) or isinstance(x, Axis) and x.uid in per_tile for x in n.indices)

    if is_const(key_bias, 0) or has_axis(key_bias, chain.axes[2]) or any(
            isinstance(n, Ref) or isinstance(n, Load) and not constant_in_a_tile(n)
            for e in split for n in nodes(e)):
        return None, None
    return (scale if sign > 0 else neg(scale)), key_bias
