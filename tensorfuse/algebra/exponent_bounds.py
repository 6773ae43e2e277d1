"""Whether the exponentials a fused chain takes against a running maximum stay bounded.

A member such as ``l = Σ exp(s − m)`` with ``m = max(s)`` is safe to fuse because every term it
adds was seen by ``m``'s running value, so ``s − m_running ≤ 0`` and no term overflows — whichever
chunk comes first. When the member keeps elements that the maximum's mask leaves out (``m`` over
even columns, ``l`` over every third), that bound is gone: an early running maximum can lie far
below a later element's value, so ``exp(τ·(x − m_running))`` overflows in the fused pass while
the unfused program, which subtracts the final maximum, stays finite. Such chains are warned
about (or refused under ``strict``) when the fusion is planned.
"""
from __future__ import annotations

from ..dsl.expr import Const, Expr, Ref, Where
from ..dsl.printer import to_text
from .conditioning import warn_or_refuse
from .exprs import nodes


def _masks(body: Expr, identity_only: bool) -> set:
    """Keys of the conditions that gate ``body``'s elements (``where(c, x, ±inf)`` when
    ``identity_only``, any ``where(c, x, constant)`` otherwise)."""
    found = set()
    for n in nodes(body):
        if isinstance(n, Where) and isinstance(n.b, Const):
            value = n.b.value
            if not identity_only or value in (float("inf"), float("-inf")):
                found.add(n.cond.key())
    return found


def unbounded_exponentials(chain) -> list[tuple[str, str]]:
    """``(member, maximum)`` pairs where the member exponentiates against the running maximum
    (or minimum) over elements that the maximum's mask does not keep."""
    extremes = {m.name: m for m in chain.members if m.monoid.name in ("max", "min")}
    found = []
    for m in chain.members:
        body = chain.bodies[m.name][0]
        for e in nodes(body):
            if getattr(e, "op", None) not in ("exp", "exp2"):
                continue
            for ref in (n for n in nodes(e) if isinstance(n, Ref) and n.compute.name in extremes):
                kept_by_max = _masks(chain.bodies[ref.compute.name][0], identity_only=True)
                if kept_by_max - _masks(body, identity_only=False):
                    found.append((m.name, ref.compute.name))
    return sorted(set(found))


def check_exponent_bounds(chain, strict: bool = False) -> None:
    """Warn (:class:`FusedPrecisionWarning`) — or with ``strict`` refuse — for every pair
    :func:`unbounded_exponentials` finds."""
    for member, extreme in unbounded_exponentials(chain):
        m = next(x for x in chain.members if x.name == member)
        message = (f"{member} = {m.monoid.name}_{chain.axis.name} "
                   f"{to_text(chain.bodies[member][0])}: it exponentiates against the running "
                   f"{extreme} over elements that {extreme}'s mask leaves out, so a term can exceed "
                   f"the running value by any amount and overflow in the fused pass (the unfused "
                   f"program subtracts the final {extreme}). Mask {member} like {extreme}, or "
                   f"leave it out of the fusion")
        warn_or_refuse(message, m, strict)
