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

Index expressions that read computed values (an argmax, say) are not checked here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .algebra.exprs import nodes
from .dsl.evaluate import Interpreter, axis_sizes_for
from .dsl.expr import Axis, Expr, Load, Ref
from .dsl.program import Program
from .errors import CallError

# the most index values one check evaluates (beyond it the expression is left unchecked)
MAX_CHECKED = 1 << 24


class IndexOutOfRange(CallError, IndexError):
    """A gathered index outside the dimension it indexes."""


@dataclass(frozen=True)
class Gather:
    """``load``'s index ``position`` is ``index``, an expression that reads tensors."""

    load: Load
    position: int
    index: Expr

    @property
    def depth(self) -> int:
        """How many tensor reads deep the index is (checked innermost first)."""
        return _depth(self.index)


    @property
    def reads(self) -> set[str]:
        """The tensors the index expression reads."""
        return {n.param.name for n in nodes(self.index) if isinstance(n, Load)}


def _depth(e: Expr) -> int:
    return max((1 + max((_depth(i) for i in n.indices), default=0)
                for n in nodes(e) if isinstance(n, Load)), default=0)


def _reads_tensor(e: Expr) -> bool:
    return any(isinstance(n, Load) for n in nodes(e))


def gathers(program: Program) -> list[Gather]:
    """Every gathered index of ``program`` whose expression reads only tensors, axes and
    constants (innermost first)."""
    found: dict[tuple, Gather] = {}
    for c in program.computes:
        for body in c.bodies:
            for n in nodes(body):
                if not isinstance(n, Load):
                    continue
                for k, index in enumerate(n.indices):
                    if _reads_tensor(index) and not any(isinstance(x, Ref)
                                                        for x in nodes(index)):
                        found.setdefault((n.param.name, k, index.key()), Gather(n, k, index))
    return sorted(found.values(), key=lambda g: g.depth)


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
        axes = {a.uid: a for a in nodes(g.index) if isinstance(a, Axis)}
        if np.prod([interp.axis_sizes[u] for u in axes], dtype=np.float64) > MAX_CHECKED:
            continue
        values = np.asarray(interp.eval(g.index))
        dim = g.load.param.dims[g.position]
        size = dim if isinstance(dim, int) else dims[dim]
        bad = (values < 0) | (values >= size)
        if bad.any():
            at = np.argwhere(bad)[0] if values.ndim else ()
            count = int(bad.sum())
            where = ", ".join(f"{a.name}={int(k)}" for a, k in zip(g.index.axes, at))
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
