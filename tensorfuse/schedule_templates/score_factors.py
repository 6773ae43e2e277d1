"""A score that divides the dot product by factors of the query and of the key (cosine
similarity's ``q·k / (|q_i| |k_j|)``), written as products by their reciprocals, so that a
kernel computes each row's and each column's factor once instead of dividing every element."""
from __future__ import annotations

from ..algebra.exprs import nodes, refs_to
from ..dsl import dtypes as dt
from ..dsl.expr import Axis, Binary, Const, Expr, Ref, binary


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
