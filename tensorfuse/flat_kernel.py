"""A kernel whose chain reduces over several axes together, run as the same chain over one axis
(:mod:`tensorfuse.schedule_templates.flat_sweeps`): the one axis's extent is the product of the
call's sizes, so the flat program is made, and compiled with its template, once per those
sizes; every other size is left to that kernel, as for any other."""
from __future__ import annotations

from typing import Callable

from .binding import bind_call, output_shape, signature_key, split_scalars
from .composed import call_device, filled
from .interop import is_torch
from .dsl.expr import Axis
from .dsl.program import Program
from .targets import TargetSpec
from .torch_graph import GraphCallable


def made_per_extents(kernels: dict, program: Program, axes, make: Callable[[dict], object],
                     dims: dict):
    """``make(sizes)`` at the sizes of ``dims`` (scalars among them set aside), made once per
    the extents of ``axes`` there and kept in ``kernels``: a kernel that depends on those
    extents alone serves every other size itself."""
    sizes, _ = split_scalars(program, dims)
    at = tuple(a.extent if isinstance(a.extent, int) else sizes.get(a.extent) for a in axes)
    if at not in kernels:
        kernels[at] = make(sizes)
    return kernels[at]


def _shaped(made, shapes: list):
    """The flat kernel's results ``made`` with the outputs at ``shapes`` (index, shape) given
    their shapes back; None (a fast call that left the call to the checked path) stays None."""
    if made is None or not shapes:
        return made
    made = list(made) if isinstance(made, tuple) else [made]
    for k, shape in shapes:
        made[k] = made[k].reshape(shape)
    return made[0] if len(made) == 1 else tuple(made)


class FlatSweepKernel(GraphCallable):
    """``program`` run by ``make(sizes)``: the kernel of its flat program at the sizes of the
    axes ``group`` reduces over together (made once per their values)."""

    def __init__(self, program: Program, target: TargetSpec, group: tuple[Axis, ...],
                 make: Callable[[dict], object]):
        self.program, self.target, self.group, self._make = program, target, tuple(group), make
        self.description = (f"{', '.join(a.name for a in self.group)} swept as one axis of "
                            f"{' × '.join(str(a.extent) for a in self.group)} elements")
        self._kernels: dict = {}   # the group's extents -> the flat program's kernel
        self._by_key: dict = {}    # a call's signature key -> (that kernel, output shapes)
        # a signature key -> the flat kernel's fast call, its outputs given their shapes back
        # (``tf.compile``'s kernel keeps it: a repeated call skips this wrapper)
        self._fast: dict = {}
        ids = {a.uid for a in self.group}
        # outputs over the group's axes: written over the one axis, given their shape back
        self._reshaped = [k for k, c in enumerate(program.outputs)
                          if any(a.uid in ids for a in c.axes)]

    def __repr__(self) -> str:
        return f"<FlatSweepKernel {self.program.name} for {self.target.name}: {self.description}>"

    def for_sizes(self, **dims):
        """The flat program's kernel at these sizes (made on first use of their group extents)."""
        return made_per_extents(self._kernels, self.program, self.group, self._make, dims)

    def invoke(self, key, args: tuple, kwargs: dict):
        if "out" in kwargs:   # checked against the user's shapes, filled from the flat results
            return self._into(args, kwargs)
        if key is False:
            key = signature_key(args, kwargs)
        routed, out = self._route_call(key, args, kwargs)   # tensors in another axis order
        if routed:
            return out
        found = self._by_key.get(key) if key is not None else None
        if found is None:
            bound = bind_call(self.program, args, kwargs, call_device(self.target))
            found = self.for_sizes(**bound.dims), self._shapes(bound.dims)
            if key is not None:
                self._by_key[key] = found
        chosen, shapes = found
        made = chosen.invoke(key, args, kwargs)
        inner = getattr(chosen, "_fast", {}).get(key) if key is not None else None
        if inner is not None and key not in self._fast:
            self._fast[key] = inner if not shapes else \
                lambda args, kwargs: _shaped(inner(args, kwargs), shapes)
        return _shaped(made, shapes)

    def _shapes(self, dims: dict) -> list[tuple[int, tuple[int, ...]]]:
        """(output index, its shape at ``dims``) of the outputs written over the one axis."""
        return [(k, tuple(a.extent if isinstance(a.extent, int) else dims[a.extent]
                          for a in self.program.outputs[k].axes)) for k in self._reshaped]

    def _into(self, args: tuple, kwargs: dict):
        """A call with ``out=`` arrays (checked against the program's shapes): the flat kernel
        writes them itself through views of their memory over the one axis, where every array
        has one and no route takes the call; else they are filled from its results."""
        bound = bind_call(self.program, args, kwargs, call_device(self.target))
        rest = {n: v for n, v in kwargs.items() if n != "out"}
        if self.routes is None or self.routes.orders(args, rest) is None:
            chosen = self.for_sizes(**bound.dims)
            views = [self._flat_view(chosen, k, out, bound.dims)
                     for k, out in enumerate(bound.outs)]
            if all(v is not None for v in views):
                chosen.invoke(False, args, {**rest, "out": views[0] if len(views) == 1
                                            else tuple(views)})
                return bound.outs[0] if len(bound.outs) == 1 else tuple(bound.outs)
        return filled(bound.outs, self.invoke(False, args, rest))

    def _flat_view(self, chosen, k: int, out, dims: dict):
        """The ``k``-th ``out=`` array seen with the flat program's shape at ``dims`` (the axes
        swept as one merged), sharing its memory; None where it is no torch tensor or its
        strides give no such view (it is filled then)."""
        if k not in self._reshaped:
            return out
        if not is_torch(out):
            return None
        try:
            return out.view(output_shape(chosen.program.outputs[k], dims))
        except RuntimeError:   # the merged axes' strides are not one stride
            return None

    def cache_info(self) -> list:
        """The builds of the flat kernels: one flat program per extents of the axes swept
        together (their product is a size of its program), each with its own builds."""
        return [b for k in self._kernels.values() for b in k.cache_info()]

    def schedule_origin(self, **dims) -> str:
        """How the axes are swept, and the flat kernel's schedule at these sizes (or, where they
        are a few elements written out, that kernel's alone)."""
        from .targets.triton.elementwise import ElementwiseKernel

        chosen = self.for_sizes(**dims)
        if isinstance(chosen, ElementwiseKernel):
            return chosen.schedule_origin(**dims)
        return f"{self.description}: {chosen.schedule_origin(**dims)}"

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        """How the axes are swept, then the flat kernel's plan at these sizes."""
        return f"{self.description}\n{self.for_sizes(**dims).describe_plan(scalars, **dims)}"

    def source(self, **dims) -> str:
        return self.for_sizes(**dims).source(**dims)

    def assembly(self, **dims) -> str:
        return self.for_sizes(**dims).assembly(**dims)
