"""What a repeated call of one signature needs, shared by the backends' fast calls.

A kernel's first call with a signature (:func:`~tensorfuse.binding.signature_key`: the arguments'
kinds, shapes, dtypes, devices) goes through the checked path — binding, checks, the launches
made. The signature fixes everything but the arguments' addresses and scalar values, so later calls
can skip all of it: read each parameter from its place among the call's arguments, check what the
key does not cover (a tensor's alignment and contiguity), allocate the outputs, launch. Each
backend's fast call (Triton's :class:`~tensorfuse.targets.triton.launcher.FastCall`, the generated
CUDA kernels' :class:`~tensorfuse.targets.cuda.kernel.ClusterFastCall`) builds on
:class:`SignatureCall` and only adds how it launches.
"""
from __future__ import annotations

from ..binding import index_scalars_of, signature_key
from ..interop import ALIGNMENT, launchable, is_torch, tma_servable, torch_dtype

# the kind of a tensor parameter the kernel reads by its own strides (:func:`tma_servable`); a
# view a Triton kernel was written for has its strides (a tuple) as its kind
STRIDED = "strided"


def _given(kwargs: dict) -> list:
    """The call's ``out=`` tensors as a list."""
    given = kwargs["out"]
    return list(given) if isinstance(given, (tuple, list)) else [given]


def try_fast_call(calls: dict, key, args: tuple, kwargs: dict) -> tuple:
    """``(key, fast call, its result)`` of a kernel's call: the signature key (made here where the
    caller passed ``False``), the fast call kept for it in ``calls`` (or None) and what that
    returned (None where there is none, or it left this call to the checked path)."""
    if key is False:
        key = signature_key(args, kwargs)
    fast = calls.get(key) if key is not None else None
    return key, fast, (fast(args, kwargs) if fast is not None else None)


def fast_call_applies(bound, target_device: str) -> bool:
    """Whether calls of this bound call's signature may take a fast path: torch tensors on the GPU
    in (NumPy arrays are copied per call), new outputs or the caller's torch tensors out (written
    in place where launchable: :meth:`SignatureCall.outputs_for`)."""
    return target_device == "cuda" and bound.framework == "torch" and \
        all(is_torch(x) for x in bound.arrays.values()) and \
        (bound.outs is None or all(is_torch(o) for o in bound.outs))


def call_layout(program, args: tuple, bound, scalar_kinds: dict, outputs: list,
                guarded: tuple = ()) -> tuple[list, list, list]:
    """``(params, likes, guards)`` of a fast call for this signature, read off its first call
    (``args``: that call's positional arguments; ``outputs``: ``(name, shape, DSL dtype)``):

    - params: ``(name, place, kind)`` per parameter in the program's order — ``place`` its
      position among the positional arguments or its keyword, ``kind`` True for a tensor or the
      scalar's Python type;
    - likes: per output, the position among the tensor parameters of one of its shape and dtype
      (``torch.empty_like`` of it costs the host less than ``torch.empty``), or None;
    - guards: ``(place, value)`` of the scalars in ``guarded`` (those the launches were made for:
      tuning records kept per window, a map's width) and of those index arithmetic reads
      (``x[b, j + shift]``: checked per value), whose other values take the checked path.
    """
    params = []
    for k, p in enumerate(program.params):
        place = k if k < len(args) else p.name
        kind = True if p.name in bound.arrays else scalar_kinds[p.name]
        params.append((p.name, place, kind))
    tensors = [bound.arrays[name] for name, _, kind in params if kind is True]
    likes = [next((k for k, x in enumerate(tensors) if tuple(x.shape) == tuple(shape)
                   and x.dtype == torch_dtype(dtype)), None) for _, shape, dtype in outputs]
    places = {name: place for name, place, _ in params}
    # scalars read by index arithmetic too: another value is checked against the dimensions
    guarded = dict.fromkeys((*guarded, *index_scalars_of(program)))
    guards = [(places[n], bound.scalars[n]) for n in guarded]
    return params, likes, guards


class SignatureCall:
    """A fast call's reading of the arguments and making of the outputs.

    ``params``, ``likes``, ``guards``: as :func:`call_layout` gives them; ``outputs``: ``(name,
    shape, DSL dtype)`` per output; ``device``: the torch device the outputs go on. ``calls`` and
    ``declined`` count the calls it ran and those it left to the checked path; ``stale`` says a
    guard declined one (the caller makes a fast call for the new value)."""

    def __init__(self, params: list, outputs: list, device, likes: list | None = None,
                 guards: list | None = None, strided=(), views: dict | None = None):
        import torch

        self.names = [name for name, _, _ in params]
        # ``strided``: the tensors the kernel reads by their own strides (any TMA can read);
        # ``views``: name -> the strides of a view the kernel was written for (a Triton
        # kernel's, :mod:`~tensorfuse.targets.triton.view_strides`), checked per call
        views = views or {}
        self.sources = [(place, STRIDED if kind is True and name in strided else
                         views[name] if kind is True and name in views else kind)
                        for name, place, kind in params]
        tensors = [name for name, _, kind in params if kind is True]
        # an output is made like a contiguous tensor only (empty_like keeps a dense view's order)
        likes = [like if like is None or tensors[like] not in strided and
                 tensors[like] not in views else None
                 for like in likes or [None] * len(outputs)]
        self.outputs = [(shape, torch_dtype(dtype), like)
                        for (_, shape, dtype), like in zip(outputs, likes)]
        self.empty, self.empty_like = torch.empty, torch.empty_like
        self.device = device
        self.guards = list(guards or [])
        self.calls = self.declined = 0
        self.stale = False
        self.single = len(outputs) == 1

    def arguments(self, args: tuple, kwargs: dict, addresses: bool = True):
        """``(values, tensors)``: each parameter's value in order — a tensor's address (or, not
        ``addresses``, the tensor), a scalar as its kind — and the tensors; None where this call
        needs the checked path (a guarded scalar's other value, a tensor — an argument or a
        given ``out=`` — that is not contiguous or not 16-byte aligned, as the compiled kernels
        assume, or a view of other strides than its kernel's: that path writes a buffer and
        copies it into such an ``out``)."""
        for place, value in self.guards:
            if (args[place] if type(place) is int else kwargs[place]) != value:
                self.declined += 1
                self.stale = True
                return None
        values, tensors = [], []
        for place, kind in self.sources:
            x = args[place] if type(place) is int else kwargs[place]
            if kind is True:
                ptr = x.data_ptr()
                if ptr % ALIGNMENT or not x.is_contiguous():
                    self.declined += 1
                    return None
                values.append(ptr if addresses else x)
                tensors.append(x)
            elif kind is STRIDED:
                if not tma_servable(x):
                    self.declined += 1
                    return None
                values.append(x.data_ptr() if addresses else x)
                tensors.append(x)
            elif type(kind) is tuple:   # a view: the strides its kernel was written for
                if x.data_ptr() % ALIGNMENT or x.stride() != kind:
                    self.declined += 1
                    return None
                values.append(x.data_ptr() if addresses else x)
                tensors.append(x)
            else:
                values.append(kind(x))
        if kwargs and "out" in kwargs and not all(launchable(o) for o in _given(kwargs)):
            self.declined += 1
            return None
        self.calls += 1
        return values, tensors

    def values_and_outputs(self, args: tuple, kwargs: dict) -> tuple[list, list] | None:
        """``(values, outputs)``: each parameter's value (tensors as given, scalars as their
        kind) and the call's outputs (:meth:`outputs_for`); None where the call needs the
        checked path (:meth:`arguments`)."""
        read = self.arguments(args, kwargs, addresses=False)
        if read is None:
            return None
        values, tensors = read
        return values, self.outputs_for(tensors, kwargs)

    def outputs_for(self, tensors: list, kwargs: dict) -> list:
        """The call's outputs: the caller's ``out=`` tensors where the signature has them (its
        key holds their shapes, dtypes and device; :meth:`arguments` checked they are
        launchable), else new ones (:meth:`new_outputs`)."""
        return _given(kwargs) if kwargs and "out" in kwargs else self.new_outputs(tensors)

    def new_outputs(self, tensors: list) -> list:
        """The call's outputs, new (``empty_like`` of a tensor argument of the same shape and
        dtype where there is one)."""
        return [self.empty(shape, dtype=dtype, device=self.device) if like is None else
                self.empty_like(tensors[like]) for shape, dtype, like in self.outputs]
