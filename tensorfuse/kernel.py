"""The ``@tensorfuse.kernel`` decorator: a Python function traced once into a :class:`Program`."""
from __future__ import annotations

import functools
import sys
from typing import Callable

from .dsl.program import Program
from .dsl.trace import trace
from .torch_graph import compiling


class Kernel:
    """A traced kernel. Call it directly to compile (default schedule, local target) and run it, or
    pass it to :func:`tensorfuse.schedule`, :func:`tensorfuse.compile` and :func:`tensorfuse.tune`."""

    def __init__(self, fn: Callable, name: str | None = None, scope: dict | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        self.program: Program = trace(fn, self.name, scope)
        self._compiled: dict[str, object] = {}
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        request = kwargs.pop("target", "auto")
        compiled = self._compiled.get(request)
        if compiled is None:
            if compiling():
                raise RuntimeError(f"{self.name} has not been compiled for target={request!r} yet, "
                                "and torch.compile cannot trace tensorfuse's compiler: call it "
                                "once outside torch.compile first, or call "
                                "tensorfuse.compile(...)'s result there")
            compiled = self._compile_for(request)
        return compiled(*args, **kwargs)

    def _compile_for(self, request):
        from .api import compile as compile_kernel
        from .targets import get_target

        target = get_target(request)
        if target.name not in self._compiled:
            self._compiled[target.name] = compile_kernel(self, target=target)
        self._compiled[request] = self._compiled[target.name]
        return self._compiled[request]

    def __repr__(self) -> str:
        return f"<tensorfuse kernel {self.name}>\n{self.program!r}"


def kernel(fn: Callable | None = None, *, name: str | None = None):
    """Turn a DSL function into a :class:`Kernel` (usable as ``@kernel`` or ``@kernel(name=...)``).
    Mistakes in the function are reported here, with the line that made them."""
    # the local names of the scope the function is defined in, for annotations that are strings
    # (``from __future__ import annotations``) naming a local import or alias
    if fn is None:
        return lambda f: Kernel(f, name, dict(sys._getframe(1).f_locals))
    return Kernel(fn, name, dict(sys._getframe(1).f_locals))
