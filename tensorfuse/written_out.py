"""A kernel whose reductions are over a few elements at some sizes only — a window whose extent
is a named size, ``T.max(x[i, j, k], over=k)`` with K=4 (maxout) — runs at those sizes as the
elementwise template's one flat pass with the reductions written out
(:func:`.schedule_templates.elementwise.elementwise_form`); at other sizes the templates after
this route in :class:`~tensorfuse.api.AutoKernel`'s order take it (a row template's sweep)."""
from __future__ import annotations

from typing import Callable

from .dsl.program import Program
from .flat_kernel import made_per_extents


class WrittenOutRoute:
    """The elementwise kernel ``make(sizes)`` of ``program`` with its reductions written out at
    sizes where they are few elements (made once per the extents of the reduced axes; ``make``
    answers ``None`` where they are not)."""

    def __init__(self, program: Program, target, make: Callable[[dict], object]):
        self.program, self.target, self._make = program, target, make
        self.reduced = tuple({a.uid: a for c in program.computes if c.is_reduction
                              for a in c.over}.values())
        self.description = (f"reductions over {', '.join(a.name for a in self.reduced)} written "
                            "out where they are a few elements (elementwise template)")
        self._kernels: dict = {}   # the reduced axes' extents -> the kernel, or None

    def __repr__(self) -> str:
        return f"<WrittenOutRoute {self.program.name} for {self.target.name}>"

    def kernel_at(self, **dims):
        """The elementwise kernel at these sizes, or ``None`` where the reductions are not
        written out there."""
        return made_per_extents(self._kernels, self.program, self.reduced, self._make, dims)

    def fits(self, scalars: dict | None = None, **dims) -> bool:
        return self.kernel_at(**dims) is not None

    def cache_info(self) -> list:
        """The builds of the kernels made so far (one kernel per extents of the reduced axes)."""
        return [b for k in self._kernels.values() if k is not None for b in k.cache_info()]
