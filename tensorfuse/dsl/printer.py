"""Readable text for expressions and programs, used in error messages, ``repr`` and tutorials."""
from __future__ import annotations

from . import dtypes as dt
from . import expr as expr_module
from .expr import (Axis, Binary, Cast, Compare, Const, DimSize, Expr, Load, Reduce, Ref, Scalar,
                   Symbol, Unary, Where)

# Binding strengths follow Python: comparisons < | < & < + - < * / // % < unary < **.
_INFIX = {"add": ("+", 3), "sub": ("-", 3), "mul": ("*", 4), "div": ("/", 4), "floordiv": ("//", 4),
          "mod": ("%", 4), "pow": ("**", 6), "and": ("&", 2), "or": ("|", 1)}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_PREFIX = {"neg": "-", "not": "~"}


def to_text(e: Expr) -> str:
    text, _ = _fmt(e)
    return text


def _fmt(e: Expr) -> tuple[str, int]:
    """Text and binding strength (higher binds tighter) of ``e``."""
    if isinstance(e, (Axis, Scalar, Symbol)):
        return e.name, 9
    if isinstance(e, Const):
        v = e.value
        return (repr(v) if not isinstance(v, float) or v == v else "nan"), 9
    if isinstance(e, DimSize):
        return f"T.size({e.name!r})", 9
    if isinstance(e, Load):
        return f"{e.param.name}[{', '.join(to_text(i) for i in e.indices)}]", 9
    if isinstance(e, Ref):
        names = e.compute.buffer_names()
        return names[e.component], 9
    if isinstance(e, Unary):
        inner, strength = _fmt(e.a)
        if e.op in _PREFIX:
            bare = strength >= 5 and not inner.startswith(_PREFIX[e.op])   # -(-x), not --x
            return _PREFIX[e.op] + (inner if bare else f"({inner})"), 5
        return f"{e.op}({inner})", 9
    if isinstance(e, Binary):
        if e.op in ("max", "min"):
            return f"{e.op}({to_text(e.a)}, {to_text(e.b)})", 9
        sym, strength = _INFIX[e.op]
        left, ls = _fmt(e.a)
        right, rs = _fmt(e.b)
        left = left if ls >= strength else f"({left})"
        right = right if rs > strength or (rs == strength and e.op in ("add", "mul")) else f"({right})"
        return f"{left} {sym} {right}", strength
    if isinstance(e, Compare):
        return f"{_wrap(e.a, 0)} {_CMP[e.op]} {_wrap(e.b, 0)}", 0
    if isinstance(e, Where):
        return f"where({to_text(e.cond)}, {to_text(e.a)}, {to_text(e.b)})", 9
    if isinstance(e, Cast):
        return f"{_wrap(e.a, 8)}.astype({dt.resolve(e.dtype)!r})", 9
    if isinstance(e, Reduce):
        spec = e.spec
        over = ", ".join(a.name for a in spec.over)
        bodies = ", ".join(to_text(b) for b in spec.bodies)
        suffix = f"[{e.index}]" if spec.monoid.arity > 1 else ""
        return f"{spec.monoid.name}({bodies}, over={over}){suffix}", 9
    return type(e).__name__, 9


def _wrap(e: Expr, strength: int) -> str:
    text, s = _fmt(e)
    return text if s > strength else f"({text})"


def program_text(p) -> str:
    """A short listing of a program: one line per compute."""
    lines = [f"program {p.name}(" + ", ".join(_param_text(x) for x in p.params) + ")"]
    for c in p.computes:
        axes = ", ".join(a.name for a in c.axes)
        if c.is_reduction:
            over = ", ".join(a.name for a in c.over)
            body = ", ".join(to_text(b) for b in c.bodies)
            rhs = f"{c.monoid.name}({body}, over={over})"
        else:
            rhs = to_text(c.bodies[0])
        tag = "  # output" if c.is_output else ""
        lines.append(f"  {c.name}[{axes}]: {'/'.join(c.dtypes)} = {rhs}{tag}")
    return "\n".join(lines)


def _param_text(x) -> str:
    dims = getattr(x, "dims", None)
    if dims is None:
        return f"{x.name}: {x.dtype}"
    return f"{x.name}[{', '.join(str(d) for d in dims)}]: {x.dtype}"


expr_module.TEXT[:] = [to_text]   # every Expr's repr
