"""A kernel compiled as an equivalent program planned by other roles of its axes
(:mod:`.schedule_templates.widened_rows`: a chain's narrower members recomputed along the rows
of its widest): calls, sources and builds are that program's kernel's; what ``schedule_origin()``
says starts with the rewrite."""
from __future__ import annotations

from .dsl.program import Program
from .torch_graph import GraphCallable


class RewrittenKernel(GraphCallable):
    """``program`` (the user's: its parameters are the rewritten program's) run by ``inner``,
    the compiled kernel of the rewritten program; ``note`` says what was rewritten."""

    def __init__(self, program: Program, inner, note: str):
        self.program, self.inner, self.note = program, inner, note
        self.target = inner.target
        self.description = f"{note}: {inner.description}"

    def __repr__(self) -> str:
        return f"<RewrittenKernel {self.program.name} for {self.target.name}: {self.description}>"

    def invoke(self, key, args: tuple, kwargs: dict):
        return self.inner.invoke(key, args, kwargs)

    def for_sizes(self, *args, **dims):
        return self.inner.for_sizes(*args, **dims)

    def schedule_origin(self, **dims) -> str:
        return f"{self.note}: {self.inner.schedule_origin(**dims)}"

    def source(self, **dims) -> str:
        return self.inner.source(**dims)

    def ptx(self, **dims) -> str:
        return self.inner.ptx(**dims)

    def benchmark(self, *args, **kwargs) -> float:
        return self.inner.benchmark(*args, **kwargs)

    def cache_info(self) -> list:
        return self.inner.cache_info()
