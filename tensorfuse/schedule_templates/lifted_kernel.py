"""A decode written without its query axis (and, every head on one cache, without a kv-head
axis) run on a kernel of the same program with those unit axes added
(:func:`.packed_lift.lift_to_four_axes`): the caller's sizes get the unit sizes, its tensors the
unit axes (``unsqueeze``: nothing copied). The templates that plan decodes by four roles
(batch, head, query, kv-head) then take it as they take the decode written with all four."""
from __future__ import annotations

from ..binding import CallBinder, output_shape, split_scalars
from ..errors import ScheduleError, TargetError
from ..interop import deliver, torch_output
from ..torch_graph import GraphCallable
from .packed_lift import UNIT_KV, UNIT_Q


def with_unit_sizes(dims: dict, units=(UNIT_Q, UNIT_KV)) -> dict:
    """A call's sizes with those of the axes a lift added (``units``: 1 at every call)."""
    return {**dims, **{n: 1 for n in units}}


def with_unit_axis(tensor, inserts: dict, name: str):
    """``tensor`` (argument or output ``name``) with the unit axis a lift added to it, where it
    added one (``inserts``: name → position)."""
    at = inserts.get(name)
    return tensor if at is None else tensor.unsqueeze(at)


class LiftedKernel(GraphCallable):
    """``inner``, a kernel of the lifted program, as a kernel of ``program`` (as written):
    ``inserts`` says where each tensor's unit axis goes, ``units`` the sizes the lift added.
    Subclasses that view the tensors further (:class:`.packed_kernel.PackedRowsKernel`) change
    :meth:`inner_sizes`, :meth:`_views` and ``who``."""

    who = "lifted to four axes"

    def __init__(self, program, inserts: dict, inner, target, units=(UNIT_Q, UNIT_KV)):
        self.program, self.inserts, self.inner, self.target = program, inserts, inner, target
        self.units = tuple(units)
        self.outputs = list(program.outputs)
        self.description = f"{self.who}; {inner.description}"
        self._calls = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.program.name} for {self.target.name}>"

    def inner_sizes(self, sizes: dict) -> dict:
        """The inner program's sizes at the caller's ``sizes`` (a :class:`TargetError` where it
        cannot take them)."""
        return with_unit_sizes(sizes, self.units)

    def inner_dims(self, dims: dict) -> dict:
        """The inner program's sizes, and the scalars given by name among ``dims``."""
        sizes, scalars = split_scalars(self.program, dims)
        return {**self.inner_sizes(sizes), **(scalars or {})}

    def fits(self, scalars: dict | None = None, **dims) -> bool:
        try:
            return self.inner.fits(scalars, **self.inner_sizes(dims))
        except (ScheduleError, TargetError):
            return False

    def schedule_origin(self, **dims) -> str:
        return f"{self.who}; {self.inner.schedule_origin(**self.inner_dims(dims))}"

    def source(self, **dims) -> str:
        return self.inner.source(**self.inner_dims(dims))

    def ptx(self, **dims) -> str:
        return self.inner.ptx(**self.inner_dims(dims))

    def cache_info(self) -> list:
        return self.inner.cache_info()

    def _views(self, values: dict, outs: list, dims: dict) -> list:
        """The inner kernel's arguments (``values``, by name: changed in place) and outputs
        from the lifted tensors — here the lifted tensors themselves."""
        return outs

    def invoke(self, key, args: tuple, kwargs: dict):
        import torch

        if self._calls is None:
            self._calls = CallBinder(self.program, "cuda" if self.target.is_gpu else "cpu")
        bound = self._calls(args, kwargs, False)
        given = list(bound.outs) if bound.outs is not None else [None] * len(self.outputs)
        device = bound.torch_device or torch.device("cpu")
        outs = [torch_output(output_shape(c, bound.dims), c.dtypes[0], g, device)
                for c, g in zip(self.outputs, given)]
        values = {**bound.scalars, **{n: with_unit_axis(torch.as_tensor(t), self.inserts, n)
                                      for n, t in bound.arrays.items()}}
        views = self._views(values, [with_unit_axis(o, self.inserts, c.name)
                                     for c, o in zip(self.outputs, outs)], bound.dims)
        self.inner(**values, out=views[0] if len(views) == 1 else tuple(views))
        made = [deliver(o, g, bound.framework) for o, g in zip(outs, given)]
        return made[0] if len(made) == 1 else tuple(made)
