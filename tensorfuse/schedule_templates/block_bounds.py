"""The block maps of a mask over positions alone, found on the host from each compare's extremes.

A mask that reads only the row and key positions, sizes and integer scalars (causal, bottom-right
causal, sliding windows, prefix-LM, neighbourhoods along one axis) sorts a block of rows × keys
without looking at its elements: a compare linear in the two positions takes its extremes at the
block's corners, so it holds everywhere, nowhere or somewhere in it from four numbers. Conditions
combine those answers (``&``, ``|``, ``~``); where two compares both cut through one block, ``&``
and ``|`` cannot tell from the corners whether their parts meet, and only those blocks are
evaluated element by element (on the host, as :func:`.block_schedule.block_lists` evaluates them
on the device).

This is what a first call at a new sequence length pays for its block lists: a few hundred
numbers on the host instead of the mask over every (row, key) pair on the device and a
synchronisation to read the counts back (``benchmarks/dynamic.py``'s ``prefill_lengths`` measure
the first calls). Masks it cannot sort (tensors, batch axes, ``//``, ``%``, ``where``, floats)
answer None and take the device path.
"""
from __future__ import annotations

import math

import numpy as np

from ..dsl.expr import Axis, Binary, Cast, Compare, Const, DimSize, Expr, Load, Scalar, Unary
from ..interop import kept_empty
from .mask_values import MaskEvaluator

# elements evaluated one by one for blocks whose corners do not decide them; past it the device
# evaluates the whole mask instead
ELEMENT_BUDGET = 1 << 21


class _Unsorted(Exception):
    """The mask has a part whose extremes over a block the corners do not give."""


class _Truth:
    """Per block (row block × key block arrays): whether the condition holds for ``some`` element,
    for ``every`` element, and where either answer is ``unsure``."""

    __slots__ = ("some", "every", "unsure")

    def __init__(self, some, every, unsure):
        self.some, self.every, self.unsure = some, every, unsure

    def mixed(self):
        return self.some & ~self.every


def position_block_maps(cond: Expr, row: Axis, col: Axis, sizes: dict, scalars: dict,
                        block_m: int, block_n: int):
    """``(partial, full)`` boolean NumPy arrays over (row block, key block) for ``cond`` over
    ``row`` × ``col`` — as :func:`.block_schedule.block_lists` sorts them, blocks cut at the axes'
    extents — or None where ``cond`` reads anything but the two positions, sizes and scalars."""
    if {a.uid for a in cond.axes} - {row.uid, col.uid} or _reads_tensors(cond):
        return None
    extent = lambda a: a.extent if isinstance(a.extent, int) else sizes[a.extent]  # noqa: E731
    rows, cols = extent(row), extent(col)
    if rows <= 0 or cols <= 0:
        return None
    n_rb, n_cb = math.ceil(rows / block_m), math.ceil(cols / block_n)
    first_row = np.arange(n_rb, dtype=np.int64).reshape(-1, 1) * block_m
    first_col = np.arange(n_cb, dtype=np.int64).reshape(1, -1) * block_n
    box = {row.uid: (first_row, np.minimum(first_row + block_m, rows) - 1),
           col.uid: (first_col, np.minimum(first_col + block_n, cols) - 1)}
    try:
        truth = _Sorter(box, sizes, scalars)(cond)
    except _Unsorted:
        return None
    shape = (n_rb, n_cb)
    some, every = np.broadcast_to(truth.some, shape).copy(), np.broadcast_to(truth.every, shape).copy()
    unsure = np.argwhere(np.broadcast_to(truth.unsure, shape))
    if len(unsure):
        if len(unsure) * block_m * block_n > ELEMENT_BUDGET:
            return None
        some[tuple(unsure.T)], every[tuple(unsure.T)] = _elementwise(
            cond, row, col, rows, cols, sizes, scalars, block_m, block_n, unsure)
    return some & ~every, every


def lists_from_maps(partial, full, total: int, device, keep: bool = False) -> tuple:
    """``((partial_num, partial_idx, full_num, full_idx), visited)``: the block lists of
    :func:`.block_schedule.block_lists` from one row of maps repeated for ``total`` batch
    positions, written on the host and copied to ``device`` in one asynchronous copy — into kept
    memory (:func:`~tensorfuse.interop.kept_empty`) where ``keep``, for a cache; ``visited``: the
    blocks each (batch position, row block) visits, on the host. Not while a stream captures (the
    copy would replay whatever the host memory holds then)."""
    import torch

    rows, cols = partial.shape
    shapes = [(total * rows,), (total * rows, cols)] * 2
    cuda = torch.device(device).type == "cuda"
    # written once, in place, into the (pinned) memory the copy reads: at 16k tokens and 16
    # heads the lists are 2 MB, and each pass over them costs the first call a few 100 µs
    host = torch.empty(sum(math.prod(s) for s in shapes), dtype=torch.int32, pin_memory=cuda)
    flat, at, visited = host.numpy(), 0, 0
    for kind in (partial, full):
        counts = kind.sum(axis=1)
        visited = visited + counts
        order = np.argsort(~kind, axis=1, kind="stable")   # its blocks first
        for per_row in (counts, order):
            size = total * per_row.size
            flat[at:at + size].reshape(total, *per_row.shape)[:] = per_row
            at += size
    if cuda:
        host = (kept_empty(host.shape, torch.int32, device) if keep else
                torch.empty_like(host, device=device)).copy_(host, non_blocking=True)
    else:
        host = host.to(device)
    lists, at = [], 0
    for shape in shapes:
        lists.append(host[at:at + math.prod(shape)].view(shape))
        at += math.prod(shape)
    return tuple(lists), np.tile(visited.astype(np.int32), total)


def _reads_tensors(e: Expr) -> bool:
    return isinstance(e, Load) or any(_reads_tensors(c) for c in e.children())


class _Sorter:
    """Evaluates a condition on blocks (:class:`_Truth`); its arithmetic parts as linear forms in
    the positions, whose extremes over each block decide the compares."""

    def __init__(self, box: dict, sizes: dict, scalars: dict):
        self.box, self.sizes, self.scalars = box, sizes, scalars

    def __call__(self, e: Expr) -> _Truth:
        if isinstance(e, Const) and isinstance(e.value, (bool, np.bool_)):
            value = np.array(bool(e.value))
            return _Truth(value, value, np.array(False))
        if isinstance(e, Unary) and e.op == "not":
            a = self(e.a)
            return _Truth(~a.every, ~a.some, a.unsure)
        if isinstance(e, Binary) and e.op in ("and", "or"):
            a, b = self(e.a), self(e.b)
            both_cut = a.mixed() & b.mixed()   # parts that may or may not meet within the block
            if e.op == "and":
                return _Truth(a.some & b.some, a.every & b.every, a.unsure | b.unsure | both_cut)
            return _Truth(a.some | b.some, a.every | b.every, a.unsure | b.unsure | both_cut)
        if isinstance(e, Compare):
            return self._compare(e.op, e.a, e.b)
        raise _Unsorted

    def _compare(self, op: str, a: Expr, b: Expr) -> _Truth:
        if isinstance(b, Unary) and b.op == "abs":   # y >= |x| as |x| <= y
            op, a, b = _FLIPPED.get(op, op), b, a
        if isinstance(a, Unary) and a.op == "abs":
            if op in ("eq", "ne"):
                raise _Unsorted
            # |x| <= y holds where x <= y and -x <= y; |x| >= y where x >= y or -x >= y
            x, y = self._form(a.a), self._form(b)
            plus, minus = self._order(op, x, y), self._order(op, _negated(x), y)
            both_cut = plus.mixed() & minus.mixed()
            if op in ("le", "lt"):
                return _Truth(plus.some & minus.some, plus.every & minus.every, both_cut)
            return _Truth(plus.some | minus.some, plus.every | minus.every, both_cut)
        if a.dtype == "bool" or b.dtype == "bool":
            raise _Unsorted
        return self._order(op, self._form(a), self._form(b))

    def _order(self, op: str, a: dict, b: dict) -> _Truth:
        """``a op b`` over each block for linear forms ``a`` and ``b``: the sign of ``a - b`` at
        its extremes."""
        low, high = self._extremes({k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)})
        exact = True
        if op in ("eq", "ne"):
            exact = _steps_by_one({k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)})
        some, every = {
            "lt": (low < 0, high < 0), "le": (low <= 0, high <= 0),
            "gt": (high > 0, low > 0), "ge": (high >= 0, low >= 0),
            "eq": ((low <= 0) & (high >= 0), (low == 0) & (high == 0)),
            "ne": ((low != 0) | (high != 0), (low > 0) | (high < 0)),
        }[op]
        some, every = np.asarray(some), np.asarray(every)
        cut = some & ~every
        return _Truth(some, every, cut if not exact else np.zeros_like(cut))

    def _extremes(self, form: dict):
        """The least and greatest value of the linear ``form`` ({axis uid or 1: coefficient})
        over each block: each position at the end of its range its coefficient's sign picks."""
        low = high = np.asarray(form.get(1, 0))
        for uid, c in form.items():
            if uid == 1 or c == 0:
                continue
            first, last = self.box[uid]
            low = low + np.minimum(c * first, c * last)
            high = high + np.maximum(c * first, c * last)
        return low, high

    def _form(self, e: Expr) -> dict:
        """The linear form of ``e``: {axis uid, or 1 for the constant: coefficient}."""
        if isinstance(e, Axis):
            if e.uid not in self.box:
                raise _Unsorted
            return {e.uid: 1}
        # integers only: the device evaluates a float in a mask in float32 (torch's default),
        # which rounds where this would not; such masks keep the device path
        if isinstance(e, Const) and _is_integer(e.value):
            return {1: int(e.value)}
        if isinstance(e, DimSize):
            return {1: self.sizes[e.name]}
        if isinstance(e, Scalar):
            value = self.scalars[e.name]
            if not _is_integer(value):
                raise _Unsorted
            return {1: int(value)}
        if isinstance(e, Cast) and e.dtype != "bool":
            return self._form(e.a)
        if isinstance(e, Unary) and e.op == "neg":
            return _negated(self._form(e.a))
        if isinstance(e, Binary) and e.op in ("add", "sub"):
            a, b = self._form(e.a), self._form(e.b)
            sign = 1 if e.op == "add" else -1
            return {k: a.get(k, 0) + sign * b.get(k, 0) for k in set(a) | set(b)}
        if isinstance(e, Binary) and e.op == "mul":
            a, b = self._form(e.a), self._form(e.b)
            if set(a) <= {1}:
                a, b = b, a
            if not set(b) <= {1}:
                raise _Unsorted   # a product of positions is not linear
            factor = b.get(1, 0)
            return {k: c * factor for k, c in a.items()}
        raise _Unsorted


_FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _is_integer(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _negated(form: dict) -> dict:
    return {k: -c for k, c in form.items()}


def _steps_by_one(form: dict) -> bool:
    """Whether an integer linear form takes every integer between its extremes over a block: each
    position's coefficient is -1, 0 or 1."""
    return all(k == 1 or abs(c) <= 1 for k, c in form.items())


def _elementwise(cond, row, col, rows, cols, sizes, scalars, block_m, block_n, blocks):
    """``(some, every)`` of the ``blocks`` ((row block, key block) pairs) element by element."""
    import torch

    picked = torch.from_numpy(blocks)
    row_pos = picked[:, :1] * block_m + torch.arange(block_m).view(1, -1)
    col_pos = picked[:, 1:] * block_n + torch.arange(block_n).view(1, -1)
    grids = {row.uid: row_pos.clamp(max=rows - 1).view(-1, block_m, 1),
             col.uid: col_pos.clamp(max=cols - 1).view(-1, 1, block_n)}
    inside = (row_pos < rows).view(-1, block_m, 1) & (col_pos < cols).view(-1, 1, block_n)
    value = torch.as_tensor(MaskEvaluator(grids, {}, scalars, sizes)(cond))
    value = torch.broadcast_to(value, inside.shape)
    some = (value & inside).flatten(1).any(dim=1)
    every = (value | ~inside).flatten(1).all(dim=1)
    return some.numpy(), every.numpy()
