"""Tensors read where they lie: a torch view's own strides written into a Triton kernel.

A call may pass a view whose elements are not row-major: the values of a latent cache as the
first features of its pages (``pages[..., :DV]``), a slice of a packed projection
(``qkv[:, :, 0]``), a tensor cut along an outer axis. The Triton emitters address every tensor
through :func:`~.expr.strides`; a kernel built for a call with such a view gets the view's
strides there (:func:`reading_views` while it is written), so it reads the view where it lies
instead of a contiguous copy made before every launch — the copy of a paged latent cache's value
view took 84 µs of a 190 µs decode on the H100 (its own ``elementwise_kernel`` in the profile of
``benchmarks.unlisted_kernels --only paged_latent_decode``; the kernels themselves 100 µs).

Which views (:func:`readable_view`): a start on a 16-byte boundary (the compiled kernels are
specialised on it, as for every tensor) and a contiguous innermost dimension (stride 1, or one
element), so the loads along a row stay vectors; other views — a transpose — are still copied.
The strides are part of a build's key (:func:`call_views`): a view of other strides, or the
same tensor contiguous, gets a build of its own; the numbers in the source are the view's, so
Triton's alignment analysis sees them as it sees a contiguous tensor's.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

from ...interop import ALIGNMENT, is_torch, launchable

# name -> strides of the views the kernel being written reads (:func:`reading_views`)
_VIEWS: ContextVar[dict] = ContextVar("tensorfuse_triton_views", default={})


def readable_view(x) -> bool:
    """Whether a Triton kernel reads torch tensor ``x`` by its own strides: a 16-byte-aligned
    start and a contiguous innermost dimension (the dimensions of one element not counted)."""
    if x.data_ptr() % ALIGNMENT:
        return False
    axes = [(n, s) for n, s in zip(x.shape, x.stride()) if n > 1]
    return not axes or axes[-1][1] == 1


def call_views(program, arrays: dict) -> tuple:
    """``(name, strides)`` of each tensor parameter of ``program`` that a call passes as a view
    the kernel reads where it lies (not contiguous, :func:`readable_view`), in the program's
    order: part of the key of the build and launches serving the call (``()``: none)."""
    views = []
    for p in program.tensor_params:
        x = arrays.get(p.name)
        if x is not None and is_torch(x) and not launchable(x) and readable_view(x):
            views.append((p.name, tuple(x.stride())))
    return tuple(views)


@contextmanager
def reading_views(views: tuple):
    """While a kernel is written: the tensors of ``views`` (:func:`call_views`) addressed by
    those strides."""
    token = _VIEWS.set(dict(views))
    try:
        yield
    finally:
        _VIEWS.reset(token)


def view_strides(name: str) -> tuple | None:
    """The strides of tensor parameter ``name`` where the kernel being written reads it as a
    view (:func:`reading_views`), else None (row-major)."""
    return _VIEWS.get().get(name)


def view_elements(name: str, dims: list):
    """How many elements from its start a view of ``dims`` (ints, or sizes written as
    arguments) spans — its largest offset plus one —, where ``name`` is read as a view; else
    None."""
    strides = view_strides(name)
    if strides is None:
        return None
    total = 1
    for n, s in zip(dims, strides):
        total = total + (n - 1) * s
    return total
