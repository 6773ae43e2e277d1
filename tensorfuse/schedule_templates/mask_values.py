"""The values of a mask's integer and boolean index expressions on broadcast torch grids: what
block lists, visiting orders and their checks evaluate a DSL mask with (on any device)."""
from __future__ import annotations

from ..dsl.expr import Axis, Binary, Cast, Compare, Const, DimSize, Expr, Load, Scalar, Unary, Where
from ..errors import TargetError

_BIN = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
        "and": lambda a, b: a & b, "or": lambda a, b: a | b}
_CMP = {"lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne"}


class MaskEvaluator:
    """Evaluates an integer/boolean index expression on broadcast torch grids."""

    def __init__(self, grids: dict, tensors: dict, scalars: dict, sizes: dict):
        self.grids, self.tensors, self.scalars, self.sizes = grids, tensors, scalars, sizes

    def __call__(self, e: Expr):
        import torch

        if isinstance(e, Axis):
            return self.grids[e.uid]
        if isinstance(e, Const):
            return e.value
        if isinstance(e, DimSize):
            return self.sizes[e.name]
        if isinstance(e, Scalar):
            return self.scalars[e.name]
        if isinstance(e, Load):
            t = self.tensors[e.param.name]
            idx = [self(i) for i in e.indices]
            idx = torch.broadcast_tensors(*[x if torch.is_tensor(x) else torch.tensor(x, device=t.device)
                                            for x in idx])
            return t[tuple(i.long() for i in idx)]
        if isinstance(e, Binary) and e.op in _BIN:
            return _BIN[e.op](self(e.a), self(e.b))
        if isinstance(e, Compare):
            a, b = self(e.a), self(e.b)
            return getattr(torch, _CMP[e.op])(a if torch.is_tensor(a) else torch.tensor(a), b)
        if isinstance(e, Unary) and e.op in ("abs", "neg", "not"):
            a = self(e.a)
            return {"abs": torch.abs, "neg": torch.neg, "not": torch.logical_not}[e.op](a)
        if isinstance(e, Where):
            return torch.where(self(e.cond), self(e.a), self(e.b))
        if isinstance(e, Cast):
            return self(e.a)
        raise TargetError(f"the mask uses {type(e).__name__}, which block lists cannot evaluate")
