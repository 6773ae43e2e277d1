"""Triton's interpreter runs ``tl.associative_scan`` and ``tl.reduce`` with a combine function of
the kernel's own one element at a time in Python (``ScanOps.generic_scan``,
``ReduceOps.generic_reduce``): the checks of the scan and band templates spent minutes there (a
banded max over 20 000 elements: half a minute; a cumulative sum in parts of 32768: 16 s).
:func:`vectorise` runs both as trees of calls on whole arrays, as a GPU does (Triton asks for an
associative combine function, and the GPU's order is a tree, not the interpreter's left to
right). Exact combines (a max with its first index) give the interpreter's numbers bit for bit,
others the same within rounding (``tests/interpreter_scans_check.py`` compares them)."""
from __future__ import annotations

import numpy as np


def _fit(value, like: np.ndarray) -> np.ndarray:
    """A combine function's result (a tensor's data, or a Python number) as an array of
    ``like``'s shape and dtype (the interpreter stores each result into the output's dtype)."""
    value = np.asarray(value)
    if value.shape != like.shape:
        value = value.reshape(like.shape) if value.size == like.size else \
            np.broadcast_to(value, like.shape)
    return value.astype(like.dtype, copy=False)


def _combined(ops, earlier: list, later: list, input) -> list:
    """``combine_fn(*earlier, *later)`` on whole arrays, as arrays like ``earlier``'s."""
    import triton.language as tl

    def tensors(arrays):
        return [ops.to_tensor(a, arg.dtype) for a, arg in zip(arrays, input)]
    got = ops.combine_fn.fn(*tensors(earlier), *tensors(later))
    got = got if isinstance(got, tuple) else (got,)
    return [_fit(g.handle.data if isinstance(g, tl.core.tensor) else g, a)
            for g, a in zip(got, earlier)]


def _along(array: np.ndarray, axis: int, part: slice) -> np.ndarray:
    """A contiguous copy of ``array``'s ``part`` along ``axis``."""
    return np.ascontiguousarray(array[(slice(None),) * axis + (part,)])


def _scan(self, input):
    """``ScanOps.generic_scan`` as a tree (Hillis and Steele's): in round ``r`` every position
    past the first ``2^r`` combines the value ``2^r`` places before it, the earlier on the left
    — ``log2(n)`` calls on whole tiles instead of one an element."""
    outs = [arg.handle.data.copy() for arg in input]
    n, axis, step = outs[0].shape[self.axis], self.axis, 1
    while step < n:
        # whole tiles (Triton's blocks are powers of 2): the first ``step`` places combine
        # themselves with themselves, and are not kept
        earlier = [np.concatenate([_along(o, axis, slice(0, step)),
                                   _along(o, axis, slice(0, n - step))], axis) for o in outs]
        made = _combined(self, earlier, [o.copy() for o in outs], input)
        tail = (slice(None),) * axis + (slice(step, n),)
        for o, m in zip(outs, made):
            o[tail] = m[tail]
        step *= 2
    return [self.to_tensor(o, arg.dtype) for o, arg in zip(outs, input)]


def _reduce(self, input):
    """``ReduceOps.generic_reduce`` as a tree: neighbours combined in pairs, in order, until one
    is left."""
    original_axis = self.axis
    input, axis = self.unravel(input, self.axis)
    acc = [arg.handle.data for arg in input]
    rank = acc[0].ndim
    while acc[0].shape[axis] > 1:
        n = acc[0].shape[axis]
        made = _combined(self, [_along(a, axis, slice(0, n - 1, 2)) for a in acc],
                         [_along(a, axis, slice(1, n, 2)) for a in acc], input)
        if n % 2:   # the last one waits for the next round, still last
            made = [np.concatenate([m, _along(a, axis, slice(n - 1, n))], axis)
                    for m, a in zip(made, acc)]
        acc = made
    ret = []
    for data, arg in zip(acc, input):
        if not self.keep_dims:
            data = np.squeeze(data, axis)
            if original_axis is None:
                data = data.item()
        elif original_axis is None:
            data = data.reshape((1,) * rank)
        ret.append(self.to_tensor(data, arg.dtype))
    return ret


def vectorise(on: bool = True) -> None:
    """Replace the interpreter's element-at-a-time scan and reduction (``on``), or put its own
    back (the interpreter's are kept aside the first time)."""
    from triton.runtime import interpreter

    scans, reductions = interpreter.ScanOps, interpreter.ReduceOps
    if not hasattr(scans, "own_generic_scan"):
        scans.own_generic_scan = scans.generic_scan
        reductions.own_generic_reduce = reductions.generic_reduce
    scans.generic_scan = _scan if on else scans.own_generic_scan
    reductions.generic_reduce = _reduce if on else reductions.own_generic_reduce
