"""How a Triton tile is reduced along an axis with a monoid: ``tl.sum``/``tl.max``/``tl.min`` for
the monoids Triton has, else ``tl.reduce`` with a combine function written from the monoid's own
combine expression (a product, a user's ``T.Monoid``) — so any monoid whose combine Triton can
write is a state of the row template, not only the three Triton names; one of several components
is reduced as a tuple (:func:`reduced_together`).

The combine functions are named after the monoid and a digest of their text (two user monoids
of one name stay apart) and kept here by name; :func:`combine_helpers` gives a source the ones
it calls.
"""
from __future__ import annotations

import hashlib
import re

from ...dsl.expr import Symbol
from ...errors import TargetError
from .expr import TileContext, to_triton

BUILTIN = {"sum": "tl.sum", "max": "tl.max", "min": "tl.min"}
_COMBINES: dict[str, str] = {}   # function name -> its source
_CALLED = re.compile(r"\b(_tf_combine_\w+)\b")


def reducible(monoid) -> bool:
    """Whether a tile can be reduced with ``monoid``: one of Triton's, or one whose combine
    expressions (one per component) Triton can write."""
    if monoid.name in BUILTIN:
        return True
    try:
        combine_function(monoid)
    except TargetError:   # an operation the Triton writer has no text for
        return False
    return True


def reduced(monoid, body: str, axis: int, keep_dims: bool = False) -> str:
    """Triton text reducing the tile ``body`` along ``axis`` with ``monoid``."""
    keep = ", keep_dims=True" if keep_dims else ""
    if monoid.name in BUILTIN:
        return f"{BUILTIN[monoid.name]}({body}, axis={axis}{keep})"
    return f"tl.reduce({body}, {axis}, {combine_function(monoid)}{keep})"


def reduced_together(monoid, bodies: list[str], axis: int) -> str:
    """Triton text reducing the tiles ``bodies`` (one per component of ``monoid``) along
    ``axis`` together: a tuple of reduced tiles, dimensions kept."""
    return f"tl.reduce(({', '.join(bodies)},), {axis}, {combine_function(monoid)}, keep_dims=True)"


def combine_function(monoid) -> str:
    """The name of the ``@triton.jit`` function combining two values with ``monoid`` (kept for
    :func:`combine_helpers`): ``(a, b)`` for one component; ``(a0, a1, …, b0, b1, …)``, returning
    a tuple, for several — what ``tl.reduce`` of a tuple calls, and what combines running states
    with a block's."""
    k = monoid.arity
    names = ["a", "b"] if k == 1 else [f"a{c}" for c in range(k)] + [f"b{c}" for c in range(k)]
    a = [Symbol(f"__a{c}", "f32") for c in range(k)]
    b = [Symbol(f"__b{c}", "f32") for c in range(k)]
    symbols = dict(zip([x.name for x in a + b], names))
    texts = [to_triton(e, TileContext(axes={}, symbols=symbols))
             for e in monoid.combine_exprs(a, b)]
    text = texts[0] if k == 1 else f"({', '.join(texts)})"
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    name = f"_tf_combine_{re.sub(r'[^0-9A-Za-z_]', '_', monoid.name)}_{digest}"
    _COMBINES[name] = f"\n@triton.jit\ndef {name}({', '.join(names)}):\n    return {text}\n"
    return name


def combine_helpers(lines) -> list[str]:
    """The combine functions the source ``lines`` call, each once, in the order first called."""
    called = dict.fromkeys(m for line in lines for m in _CALLED.findall(line))
    return [_COMBINES[name] for name in called]
