"""A kernel compiled as an equivalent program planned by other roles of its axes
(:mod:`.schedule_templates.widened_rows`: a chain's narrower members recomputed along the rows
of its widest): calls, sources and builds are that program's kernel's; what ``schedule_origin()``
says starts with the rewrite."""
from __future__ import annotations

from .dsl.program import Program
from .torch_graph import GraphCallable


class RewrittenKernel(GraphCallable):
    """``program`` (the user's: its parameters are the rewritten program's) run by ``inner``,
    the compiled kernel of the rewritten program; ``note`` says what was rewritten. Outputs of
    the user's program over no axis, which the rewritten one writes over an axis of one element
    (:mod:`.schedule_templates.unit_rows`), are given back with no axis."""

    def __init__(self, program: Program, inner, note: str):
        self.program, self.inner, self.note = program, inner, note
        self.target = inner.target
        self.description = f"{note}: {inner.description}"
        self._scalars = [k for k, c in enumerate(program.outputs) if not c.axes]

    def __repr__(self) -> str:
        return f"<RewrittenKernel {self.program.name} for {self.target.name}: {self.description}>"

    def invoke(self, key, args: tuple, kwargs: dict):
        if not self._scalars:
            return self.inner.invoke(key, args, kwargs)
        if "out" in kwargs:   # the user's arrays over no axis, as views over one element
            many = isinstance(kwargs["out"], (tuple, list))
            outs = list(kwargs["out"]) if many else [kwargs["out"]]
            views = [o.reshape(1) if k in self._scalars else o for k, o in enumerate(outs)]
            self.inner.invoke(key, args, {**kwargs, "out": tuple(views) if many else views[0]})
            return tuple(outs) if many else outs[0]
        made = self.inner.invoke(key, args, kwargs)
        many = isinstance(made, tuple)
        made = [m.reshape(()) if k in self._scalars else m
                for k, m in enumerate(made if many else (made,))]
        return tuple(made) if many else made[0]

    def for_sizes(self, *args, **dims):
        return self.inner.for_sizes(*args, **dims)

    def schedule_origin(self, **dims) -> str:
        return f"{self.note}: {self.inner.schedule_origin(**dims)}"

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        """The rewrite, then the rewritten program's kernel and plan at these sizes."""
        return f"{self.note}\n{self.inner.describe_plan(scalars, **dims)}"

    def source(self, **dims) -> str:
        return self.inner.source(**dims)

    def assembly(self, **dims) -> str:
        return self.inner.assembly(**dims)

    def benchmark(self, *args, **kwargs) -> float:
        return self.inner.benchmark(*args, **kwargs)

    def cache_info(self) -> list:
        return self.inner.cache_info()


def quiet_if_staged(make, staged_by_design: bool):
    """``make()`` — the compiled kernel of a rewritten program — with the floor's
    :class:`~tensorfuse.errors.NoTemplateWarning` left out where the rewrite cuts the program
    into stages by design (nested scans: one a reduced axis) and a template takes every one:
    the rewrite's note says so, and "no template takes it whole" would read like a failure.
    Every other warning ``make()`` gives is passed on where it was raised."""
    import warnings

    from .errors import NoTemplateWarning
    from .staged import StagedKernel

    if not staged_by_design:
        return make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        made = make()
    planned = isinstance(made, StagedKernel) and all(s.templated for s in made.stages)
    for w in caught:
        if not (planned and issubclass(w.category, NoTemplateWarning)):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return made
