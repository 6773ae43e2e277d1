"""Gathered indices checked before a kernel reads through them.

A tensor indexed through another tensor's values — ``k[b, pages[b, j // 64] * 64 + j % 64, d]``, a
token index, a lookup table — is a *gather*: the index is data, so no compile-time bound holds
it, and a value outside the indexed dimension reads outside the tensor (on the CPU a page table
holding 10⁶ killed the process; one holding −5 returned garbage). Policy:

- the CPU target checks every call: each gathered index expression is evaluated over the axes it
  reads (from the call's tensors, innermost gathers first) and a value outside ``[0, size)``
  raises :class:`~tensorfuse.errors.CallError` (an ``IndexError``) naming the tensor, the
  dimension, the value and where it was found — before the kernel runs, so nothing is read or
  written;
- GPU targets check where asked (``TENSORFUSE_CHECK_INDICES=1``): the check reads the index
  tensors back to the host, which a serving loop should not pay on every call.

A gather under a ``T.where`` (``T.where(r < length, x[start + r, d], 0.0)``: a ragged segment's
rows past its end) is checked only where its condition selects it. The emitters (TVM's lowering
and the Triton template) clamp every gathered index (:func:`~tensorfuse.dsl.expr.is_gathered`)
into its dimension, so a lane whose value the condition discards — or an unchecked GPU call with
a bad index — reads an element of the tensor, never memory outside it.

Index expressions that read computed values are not checked here: an argmax's position is
bounded by its axis (:mod:`tensorfuse.dsl.index_bounds`), other values are clamped by the emitters
(:func:`~tensorfuse.dsl.expr.reads_data`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .algebra.exprs import nodes
from .dsl.evaluate import Interpreter, axis_sizes_for
from .dsl.expr import (Axis, Const, Expr, Load, Ref, Where, binary, is_gathered, unary,
                       where)
from .dsl.program import Program
from .errors import CallError

# the most index values one check evaluates (beyond it the expression is left unchecked)
MAX_CHECKED = 1 << 24


class IndexOutOfRange(CallError, IndexError):
    """An index outside the dimension it indexes: a gathered one (here), or arithmetic on axes
    (:mod:`tensorfuse.dsl.index_bounds`)."""


@dataclass(frozen=True)
class Gather:
    """``load``'s index ``position`` is ``index``, an expression that reads tensors."""

    load: Load
    position: int
    index: Expr
    guard: Expr | None = None   # the T.where conditions under which the load's value is used

    @cached_property   # built once: every checked call reads it twice
    def checked(self) -> Expr:
        """The index where the guard holds, 0 (inside every dimension) where it does not."""
        return self.index if self.guard is None else \
            where(self.guard, self.index, Const(0, self.index.dtype))

    @property
    def depth(self) -> int:
        """How many tensor reads deep the index is (checked innermost first)."""
        return _depth(self.index)


    @property
    def reads(self) -> set[str]:
        """The tensors the index expression and its guard read."""
        return {n.param.name for n in nodes(self.checked) if isinstance(n, Load)}


def _depth(e: Expr) -> int:
    return max((1 + max((_depth(i) for i in n.indices), default=0)
                for n in nodes(e) if isinstance(n, Load)), default=0)


def gathers(program: Program) -> list[Gather]:
    """Every gathered index of ``program`` whose expression reads only tensors, axes and
    constants (innermost first)."""
    found: dict[tuple, Gather] = {}

    def visit(e: Expr, guard: Expr | None) -> None:
        if isinstance(e, Where):
            visit(e.cond, guard)
            if _reads_computed(e.cond):   # a condition on computed values: not evaluated here
                visit(e.a, guard)
                visit(e.b, guard)
                return
            visit(e.a, _both(guard, e.cond))
            visit(e.b, _both(guard, unary("not", e.cond, e.cond.loc)))
            return
        if isinstance(e, Load):
            for k, index in enumerate(e.indices):
                if is_gathered(index) and not _reads_computed(index):
                    key = (e.param.name, k, index.key(), None if guard is None else guard.key())
                    found.setdefault(key, Gather(e, k, index, guard))
        for child in e.children():
            visit(child, guard)

    for c in program.computes:
        for body in c.bodies:
            visit(body, None)
    return sorted(found.values(), key=lambda g: g.depth)


def _reads_computed(e: Expr) -> bool:
    return any(isinstance(x, Ref) for x in nodes(e))


def _both(guard: Expr | None, cond: Expr) -> Expr:
    return cond if guard is None else binary("and", guard, cond)


def checks_indices(device_kind: str) -> bool:
    """Whether calls on this device are checked: always on the CPU, on a GPU where
    ``TENSORFUSE_CHECK_INDICES`` is set to 1."""
    return device_kind == "cpu" or os.environ.get("TENSORFUSE_CHECK_INDICES") == "1"


def check_gathers(program: Program, found: list[Gather], arrays: dict, dims: dict,
                  scalars: dict) -> None:
    """Raise :class:`IndexOutOfRange` where a gathered index of this call falls outside the
    dimension it indexes."""
    if not found:
        return
    read = set().union(*(g.reads for g in found))   # the index tensors only, not the data
    tensors = {name: _host(arrays[name]) for name in read}
    interp = Interpreter(tensors, scalars, dims, axis_sizes_for(program, dims))
    for g in found:
        checked = g.checked
        axes = {a.uid: a for a in nodes(checked) if isinstance(a, Axis)}
        if np.prod([interp.axis_sizes[u] for u in axes], dtype=np.float64) > MAX_CHECKED:
            continue
        try:
            values = np.asarray(interp.eval(checked))
        except IndexError as exc:   # the index tensor itself read outside (offsets[g + 1])
            raise IndexOutOfRange(
                f"{program.name}: the index {_text(g.index)} of {g.load.param.name}'s dimension "
                f"{g.position} reads outside a tensor it is made from ({exc}); nothing was "
                "run") from None
        dim = g.load.param.dims[g.position]
        size = dim if isinstance(dim, int) else dims[dim]
        bad = (values < 0) | (values >= size)
        if bad.any():
            at = np.argwhere(bad)[0] if values.ndim else ()
            count = int(bad.sum())
            where = ", ".join(f"{a.name}={int(k)}" for a, k in zip(checked.axes, at))
            raise IndexOutOfRange(
                f"{program.name}: {g.load.param.name}'s dimension {g.position} "
                f"({dim}={size}) is indexed by {_text(g.index)}, which is "
                f"{int(values[tuple(at)])} at {where or 'every point'} — outside 0…{size - 1} "
                f"({count} value{'s' * (count != 1)} out of range); nothing was run")


def _text(e: Expr) -> str:
    from .dsl.printer import to_text

    return to_text(e)


def _host(x):
    """A NumPy view of an index tensor (a torch tensor read back to the host)."""
    return x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()
