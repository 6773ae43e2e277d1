"""A decode written without its query axis (and, every head on one cache, without a kv-head
axis) run on a kernel of the same program with those unit axes added
(:func:`.packed_lift.lift_to_four_axes`): the caller's sizes get the unit sizes, its tensors the
unit axes (``unsqueeze``: nothing copied). The templates that plan decodes by four roles
(batch, head, query, kv-head) then take it as they take the decode written with all four."""
from __future__ import annotations

from ..binding import CallBinder, output_shape, signature_key, split_scalars
from ..errors import CallError, ScheduleError, TargetError
from ..interop import deliver, said_copied, torch_output
from ..targets.signature_call import (SignatureCall, call_layout, fast_call_applies,
                                      try_fast_call)
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


def binding_device(target, report: bool = True) -> str:
    """The device a call's tensors are on for a kernel of ``target``: the CPU under Triton's
    interpreter; a GPU target's missing GPU reported first where ``report`` (as every kernel's
    call does), not as tensors on another device."""
    from ..targets.triton.launch import interpreting

    if interpreting():
        return "cpu"
    if report and target.is_gpu:
        target.device()
    return "cuda" if target.is_gpu else "cpu"


class LiftedKernel(GraphCallable):
    """``inner``, a kernel of the lifted program, as a kernel of ``program`` (as written):
    ``inserts`` says where each tensor's unit axis goes, ``units`` the sizes the lift added.
    Subclasses that view the tensors further (:class:`.packed_kernel.PackedRowsKernel`) change
    :meth:`inner_sizes`, :meth:`_views` and ``who``."""

    who = "lifted to four axes"
    # name -> the inner program's name of that argument, where the lift renamed it
    # (:mod:`.renamed_params`)
    renamed: dict = {}

    def __init__(self, program, inserts: dict, inner, target, units=(UNIT_Q, UNIT_KV)):
        self.program, self.inserts, self.inner, self.target = program, inserts, inner, target
        self.units = tuple(units)
        self.outputs = list(program.outputs)
        self.lift = self.who   # what was done to the program as written
        self.description = f"{self.lift}; {inner.description}"
        self._calls = None
        self._fast: dict = {}   # signature key -> its LiftedFastCall

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

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        """How the program as written became the inner kernel's, and the inner kernel's plan at
        the sizes it gets."""
        inner = self.inner_dims({**dims, **(scalars or {})})
        return f"{self.lift}\n{self.inner.describe_plan(**inner)}"

    def source(self, **dims) -> str:
        return self.inner.source(**self.inner_dims(dims))

    def assembly(self, **dims) -> str:
        return self.inner.assembly(**self.inner_dims(dims))

    def cache_info(self) -> list:
        return self.inner.cache_info()

    def _views(self, values: dict, outs: list, dims: dict) -> list:
        """The inner kernel's arguments (``values``, by name: changed in place) and outputs
        from the lifted tensors — here the lifted tensors themselves."""
        return outs

    def _output(self, compute, shape: list, given, device):
        """The tensor output ``compute`` is written to (the caller's ``out=`` where launchable):
        contiguous here."""
        return torch_output(shape, compute.dtypes[0], given, device)

    def invoke(self, key, args: tuple, kwargs: dict):
        """A call (``key``: its signature key, ``False`` when not made). A signature seen before
        runs on its :class:`LiftedFastCall`; otherwise the arguments are bound, viewed and
        passed to the inner kernel, and a fast call kept for next time."""
        import torch

        key, fast, done = try_fast_call(self._fast, key, args, kwargs)
        if done is not None:
            return done
        if self._calls is None:
            self._calls = CallBinder(self.program, binding_device(self.target, report=False))
        bound = self._calls(args, kwargs, False)
        given = list(bound.outs) if bound.outs is not None else [None] * len(self.outputs)
        device = bound.torch_device or torch.device("cpu")
        outs = [self._output(c, output_shape(c, bound.dims), g, device)
                for c, g in zip(self.outputs, given)]
        values = {**bound.scalars, **{n: with_unit_axis(torch.as_tensor(t), self.inserts, n)
                                      for n, t in bound.arrays.items()}}
        views = self._views(values, [with_unit_axis(o, self.inserts, c.name)
                                     for c, o in zip(self.outputs, outs)], bound.dims)
        inner_kwargs = {**values, "out": views[0] if len(views) == 1 else tuple(views)}
        self.inner(**inner_kwargs)
        if key is not None and (fast is None or fast.stale) and \
                fast_call_applies(bound, self._calls.target_device):
            self._keep_fast_call(key, args, bound, inner_kwargs)
        made = [deliver(o, g, bound.framework) for o, g in zip(outs, given)]
        return made[0] if len(made) == 1 else tuple(made)

    def _keep_fast_call(self, key, args: tuple, bound, inner_kwargs: dict) -> None:
        """Keep this signature's :class:`LiftedFastCall`, where the inner kernel kept one for the
        call it was given (its views of the tensors: the same signature every time)."""
        inner_fast = getattr(self.inner, "_fast", {}).get(signature_key((), inner_kwargs))
        if inner_fast is None:
            return
        outputs = [(c.name, output_shape(c, bound.dims), c.dtypes[0]) for c in self.outputs]
        params, likes, guards = call_layout(self.program, args, bound, self._calls.scalar_kinds,
                                            outputs)
        self._fast[key] = self._fast_call(params, outputs, likes, guards, bound, inner_kwargs,
                                          inner_fast)

    def _fast_call(self, params, outputs, likes, guards, bound, inner_kwargs: dict, inner_fast):
        """The fast call of a signature (:func:`call_layout`'s ``params``, ``likes``, ``guards``)
        whose first call gave the inner kernel ``inner_kwargs``."""
        copied = self._copied(inner_kwargs)
        inner = {n: inner_kwargs[self.renamed.get(n, n)] for n in bound.arrays}
        shapes = {n: tuple(inner[n].shape) for n, t in bound.arrays.items()
                  if tuple(inner[n].shape) != tuple(t.shape) and n not in copied}
        out = inner_kwargs["out"]
        out_shapes = [tuple(o.shape) for o in (out if isinstance(out, tuple) else (out,))]
        return LiftedFastCall(params, outputs, bound.torch_device, likes, guards, shapes,
                              out_shapes, inner_fast, copied, renamed=self.renamed)

    def _copied(self, inner_kwargs: dict) -> dict:
        """The tensors the inner kernel gets as new ones, not views: name → what makes it of
        the caller's (at the signature ``inner_kwargs`` gave the inner kernel); none here."""
        return {}


class MergedHeadsKernel(LiftedKernel):
    """``inner``, a kernel of ``merged.program`` (:mod:`.merged_heads`: the query heads' two axes
    as one), as a kernel of the program as written: a call's q and outputs are viewed with those
    axes merged — where q's strides do not merge (its memory holds the axes apart or in the
    other order), a copy of it, said once (:class:`~tensorfuse.errors.CopiedArgumentWarning`);
    the outputs are the kernel's own contiguous ones (or the caller's, copied into)."""

    who = "query heads merged"

    def __init__(self, program, merged, inner, target):
        super().__init__(program, {}, inner, target, ())
        self.merged = merged
        self.lift = merged.describe()
        self.description = f"{self.lift}; {inner.description}"

    def inner_sizes(self, sizes: dict) -> dict:
        m, names = self.merged, set(self.merged.program.dim_names())
        return {**{n: v for n, v in sizes.items() if n in names},
                m.merged: sizes[m.group] * sizes[m.heads]}

    def _views(self, values: dict, outs: list, dims: dict) -> list:
        at = self.merged.at
        for name in at.keys() & values.keys():
            values[name] = _merged_view(values[name], at[name], name, self.merged,
                                        self.program.name)
        return [_merged_view(o, at[c.name], c.name, self.merged)
                for c, o in zip(self.outputs, outs)]


def _merged_view(tensor, at: int, name: str, merged, copied_for: str | None = None):
    """``tensor`` with its axes ``at`` and ``at + 1`` as one: a view where its strides allow,
    else — for an argument of kernel ``copied_for`` — a copy, said once; an output must merge
    (it is a buffer the call made contiguous)."""
    outer, inner = tensor.shape[at], tensor.shape[at + 1]
    if outer > 1 and inner > 1 and tensor.stride(at) != tensor.stride(at + 1) * inner:
        why = (f"its {merged.group} and {merged.heads} axes are read as one head axis "
               f"({merged.describe()}), which needs the {merged.group} axis's stride to be "
               f"{merged.heads} × the {merged.heads} axis's, {inner * tensor.stride(at + 1)}; "
               f"it is {tensor.stride(at)}")
        if copied_for is None:
            raise CallError(f"{name}: {why}")
        said_copied(copied_for, name, tensor, why)
        return tensor.contiguous().flatten(at, at + 1)
    return tensor.flatten(at, at + 1)


class LiftedFastCall(SignatureCall):
    """A repeated call of a lifted (or packed) kernel with one signature: the caller's tensors
    viewed at the shapes the signature's first call gave the inner kernel, straight to the inner
    kernel's own fast call — none of the binding, the unit axes' and the views' checks (the
    arguments' contiguity, which the views need, is checked per call: :meth:`arguments`).
    ``None`` where a call needs the checked path (the inner fast call's too)."""

    def __init__(self, params: list, outputs: list, device, likes: list, guards: list,
                 shapes: dict, out_shapes: list, inner_fast, copied: dict | None = None,
                 views: dict | None = None, renamed: dict | None = None):
        # ``views``: name -> the strides a tensor passed as a view must have (checked per call)
        super().__init__(params, outputs, device, likes, guards, views=views)
        self.shapes, self.out_shapes, self.inner_fast = shapes, out_shapes, inner_fast
        # name -> what makes the inner kernel's tensor of the caller's where a view of its
        # shape does not (a copy; a permutation: :mod:`tensorfuse.memory_order`)
        self.copied = dict(copied or {})
        # name -> the inner kernel's name of that argument, where it has another
        # (:mod:`.renamed_params`)
        self.renamed = dict(renamed or {})

    def out_views(self, outs: list) -> list:
        """The outputs as the inner kernel's fast call takes them."""
        return [o.view(shape) for o, shape in zip(outs, self.out_shapes)]

    def __call__(self, args: tuple, kwargs: dict):
        made = self.values_and_outputs(args, kwargs)
        if made is None:
            return None
        values, outs = made
        inner = {n: v.view(self.shapes[n]) if n in self.shapes else v
                 for n, v in zip(self.names, values)}
        for name, copy in self.copied.items():
            inner[name] = copy(inner[name])
        for name, other in self.renamed.items():
            inner[other] = inner.pop(name)
        views = self.out_views(outs)
        inner["out"] = views[0] if self.single else tuple(views)
        if self.inner_fast((), inner) is None:   # a stale inner fast call: this one is too
            self.stale = self.stale or getattr(self.inner_fast, "stale", False)
            return None
        return outs[0] if self.single else tuple(outs)
