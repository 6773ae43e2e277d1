"""The mask of a chain: the one condition whose masked elements contribute nothing.

A chain such as attention's writes its elements as ``where(cond, s, -inf)``: where ``cond`` fails
the element adds the identity to every running state (``max`` sees ``-inf``, the sums see
``exp(-inf - m) = 0``). Such elements can be skipped — by the GPU templates' block schedule
(whole blocks never loaded) and by the CPU template's key loops (each row stops at the mask's
edges). Whether skipping is exact is checked here, numerically on random values, per state.
"""
from __future__ import annotations

import numpy as np

from ..dsl import dtypes as dt
from ..dsl.evaluate import evaluate_plain
from ..dsl.expr import Axis, Const, Expr, Load, Ref, Symbol, Where
from .chain import Chain
from .exprs import nodes, substitute

TRIALS = 16   # random points per state at which a masked element must give the identity


def identity_mask(chain: Chain) -> Expr | None:
    """The condition masking the chain's elements, when there is exactly one (made of indices,
    sizes and integer data such as document ids, not float values or other members) and a masked
    element contributes the identity to every state of every member; else None. Found once per
    chain: the numeric check took 20 ms of every new size's plan of causal attention."""
    if "identity_mask" not in chain.memo:
        chain.memo["identity_mask"] = _identity_mask(chain)
    return chain.memo["identity_mask"]


def _identity_mask(chain: Chain) -> Expr | None:
    conds = {}
    for m in chain.members:
        for b in chain.bodies[m.name]:
            for n in nodes(b):
                if isinstance(n, Where) and not any(isinstance(x, Ref) for x in nodes(n.cond)) \
                        and not any(isinstance(x, Load) and dt.is_float(x.param.dtype)
                                    for x in nodes(n.cond)):
                    conds[n.cond.key()] = n.cond
    if len(conds) != 1:
        return None
    cond = next(iter(conds.values()))
    rng = np.random.default_rng(0)
    for m in chain.members:
        for st in chain.schemes[m.name].states:
            if not _masked_is_identity(st, cond, rng):
                return None
    return cond


def _masked_is_identity(state, cond: Expr, rng) -> bool:
    masked = substitute(state.body, lambda n: Const(False, "bool") if n.key() == cond.key()
                        else None)
    identity = state.monoid.identity_value(0, "f64")
    for _ in range(TRIALS):
        leaves: dict = {}

        def leaf(n):
            if isinstance(n, (Load, Ref, Axis, Symbol)) or n.__class__.__name__ in (
                    "Scalar", "DimSize"):
                name = f"l{len(leaves)}"
                leaves[name] = rng.normal() * 3 if dt.is_float(n.dtype) else \
                    int(rng.integers(0, 5))
                return Symbol(name, n.dtype)
            return None

        value = float(evaluate_plain(substitute(masked, leaf), leaves))
        if not (value == identity or (state.monoid.name == "max" and value <= identity) or
                (state.monoid.name == "min" and value >= identity)):
            return False
    return True
