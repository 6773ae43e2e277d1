"""Block lists for a masked chain, like FlexAttention's block masks, computed from the DSL mask.

For each batch position and block of rows, the blocks of the fused axis are sorted into *partial*
(the mask holds for some elements: evaluate it) and *full* (it holds everywhere: skip it); blocks
where it never holds are left out, so fully masked tiles cost nothing. The mask expression is
evaluated with torch on the tensors' device; lists that depend only on sizes and scalars are
cached, data-dependent ones (document ids) are recomputed when the data change.
"""
from __future__ import annotations

import math

from ..dsl.expr import (Axis, Binary, Cast, Compare, Const, DimSize, Expr, Load, Scalar, Unary,
                         Where)
from ..errors import TargetError

_BIN = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
        "and": lambda a, b: a & b, "or": lambda a, b: a | b}
_CMP = {"lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne"}


class _Evaluator:
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


def block_lists(cond: Expr, batch: list, row: Axis, col: Axis, sizes: dict, tensors: dict,
                scalars: dict, block_m: int, block_n: int, device):
    """``(partial_num, partial_idx, full_num, full_idx)`` as int32 tensors on ``device``: per
    (batch position, row block), how many blocks of each kind and which (row-major lists)."""
    import torch

    extent = lambda a: a.extent if isinstance(a.extent, int) else sizes[a.extent]  # noqa: E731
    rows, cols = extent(row), extent(col)
    n_rb, n_cb = math.ceil(rows / block_m), math.ceil(cols / block_n)
    batch_extents = [extent(a) for a in batch]
    used = {a.uid for a in cond.axes}
    dep_batch = [a for a in batch if a.uid in used]
    shape_b = [extent(a) for a in dep_batch]
    nb = math.prod(shape_b) if shape_b else 1
    any_blocks = torch.zeros((nb, n_rb, n_cb), dtype=torch.bool, device=device)
    all_blocks = torch.zeros((nb, n_rb, n_cb), dtype=torch.bool, device=device)
    cols_pad = n_cb * block_n
    col_idx = torch.arange(cols_pad, device=device)
    slab = max(1, (1 << 24) // max(1, cols_pad * nb) // block_m) * block_m
    for r0 in range(0, n_rb * block_m, slab):
        r1 = min(r0 + slab, n_rb * block_m)
        row_idx = torch.arange(r0, r1, device=device)
        grids = {}
        nd = len(dep_batch) + 2
        for k, a in enumerate(dep_batch):
            shape = [1] * nd
            shape[k] = extent(a)
            grids[a.uid] = torch.arange(extent(a), device=device).view(shape)
        grids[row.uid] = row_idx.view([1] * len(dep_batch) + [-1, 1])
        grids[col.uid] = col_idx.view([1] * len(dep_batch) + [1, -1])
        inside = (grids[row.uid] < rows) & (grids[col.uid] < cols)
        safe = {**grids, row.uid: grids[row.uid].clamp(max=rows - 1),
                col.uid: grids[col.uid].clamp(max=cols - 1)}
        value = _Evaluator(safe, tensors, scalars, sizes)(cond)
        value = torch.as_tensor(value, device=device)
        full_shape = shape_b + [r1 - r0, cols_pad]
        value = torch.broadcast_to(value, full_shape).reshape(nb, (r1 - r0) // block_m, block_m,
                                                               n_cb, block_n)
        inside = torch.broadcast_to(inside, full_shape).reshape(nb, (r1 - r0) // block_m, block_m,
                                                                n_cb, block_n)
        hit = value & inside
        rb0 = r0 // block_m
        any_blocks[:, rb0:rb0 + (r1 - r0) // block_m] = hit.any(dim=4).any(dim=2)
        all_blocks[:, rb0:rb0 + (r1 - r0) // block_m] = (value | ~inside).all(dim=4).all(dim=2)
    partial = any_blocks & ~all_blocks
    full = any_blocks & all_blocks
    # expand to every batch position of the grid (row-major over `batch`)
    total = math.prod(batch_extents) if batch_extents else 1
    if dep_batch and len(dep_batch) < len(batch) or (not dep_batch and total > 1):
        index = torch.zeros(batch_extents or [1], dtype=torch.long, device=device)
        stride = 1
        for a in reversed(dep_batch):
            pos = [b.uid for b in batch].index(a.uid)
            shape = [1] * len(batch)
            shape[pos] = extent(a)
            index = index + torch.arange(extent(a), device=device).view(shape) * stride
            stride *= extent(a)
        index = index.reshape(-1)
        partial, full = partial[index], full[index]

    def lists(kind):
        counts = kind.sum(dim=2).to(torch.int32).reshape(-1)
        order = torch.argsort((~kind).to(torch.int8), dim=2, stable=True).to(torch.int32)
        return counts.contiguous(), order.reshape(-1, n_cb).contiguous()

    pn, pi = lists(partial)
    fn, fi = lists(full)
    return pn, pi, fn, fi
