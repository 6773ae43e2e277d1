"""Random inputs for any kernel, and the tolerances its results are checked with.

Used wherever a kernel must be run without the user's data — tuning jobs (every candidate is
checked against the defaults before it is timed), the demo, the tests — so it knows nothing about
particular kernels: real-valued tensors are standard normal (never zeros); an integer tensor that
the program uses as an index gets values inside the dimension it indexes (``x[i, target[i]]``:
``target`` in ``[0, V)``), one an axis is compared with a length (``j < lengths[b]``: in
``[1, N]``, every row keeps a key), any other integer tensor increasing runs of small ids along
its last dimension (segment or document ids); scalars get the values :func:`default_scalars` names.

Tolerances (max |out − ref| / max |ref|), per output dtype: outputs rounded to bf16 carry a
relative error of up to 2^-8 ≈ 3.9e-3 per element, f16 2^-11, f32 about 1e-6 after accumulation.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .dsl import dtypes as dt
from .dsl.expr import Axis, Compare, Load, walk

TOLERANCE = {"bf16": 8e-3, "f16": 1e-3, "f32": 2e-5, "f64": 1e-10}


def random_inputs(kernel, sizes: dict[str, int], rng: np.random.Generator,
                  scalars: dict | None = None,
                  real_tensor: "Callable[[tuple, str], object] | None" = None
                  ) -> tuple[dict, dict]:
    """Fresh random tensors for ``kernel`` (a kernel or its program) at ``sizes`` and its scalar
    arguments (``scalars`` taking precedence over the defaults). ``real_tensor(shape, dtype)``
    makes the real-valued tensors, standard normal (default: NumPy arrays; a GPU caller makes
    them where they are used — NumPy took 10–14 s for a decode cache's 2 × 67M values)."""
    program = getattr(kernel, "program", kernel)
    bounds, lengths = index_bounds(program, sizes), length_bounds(program, sizes)
    tensors = {}
    for p in program.tensor_params:
        shape = tuple(d if isinstance(d, int) else sizes[d] for d in p.dims)
        if dt.is_int(p.dtype) and p.name in lengths and p.name not in bounds:
            tensors[p.name] = rng.integers(1, lengths[p.name] + 1, size=shape).astype(np.int32)
        elif dt.is_int(p.dtype):
            tensors[p.name] = _integer_tensor(shape, bounds.get(p.name), rng)
        elif real_tensor is not None:
            tensors[p.name] = real_tensor(shape, p.dtype)
        else:
            tensors[p.name] = rng.standard_normal(shape).astype(dt.to_numpy(p.dtype))
    return tensors, default_scalars(program, sizes, scalars)


def index_bounds(program, sizes: dict[str, int]) -> dict[str, int]:
    """For each integer tensor the program reads inside another tensor's index, the size of the
    smallest dimension it indexes (its values must lie below it)."""
    def bounds(n):
        if isinstance(n, Load):
            for position, index in enumerate(n.indices):
                if isinstance(index, Load) and dt.is_int(index.param.dtype):
                    yield index.param.name, _size(n.param.dims[position], sizes)

    return _smallest(program, bounds)


def length_bounds(program, sizes: dict[str, int]) -> dict[str, int]:
    """For each integer tensor an axis is compared with (``j < lengths[b]``), the axis's size:
    a length along it (the smallest where several axes are)."""
    def bounds(n):
        if isinstance(n, Compare):
            for one, other in ((n.a, n.b), (n.b, n.a)):
                if isinstance(one, Load) and dt.is_int(one.param.dtype) and \
                        isinstance(other, Axis) and other.extent is not None:
                    yield one.param.name, _size(other.extent, sizes)

    return _smallest(program, bounds)


def _size(extent: "int | str", sizes: dict[str, int]) -> int:
    return extent if isinstance(extent, int) else sizes[extent]


def _smallest(program, bounds) -> dict[str, int]:
    """The smallest of the ``(tensor name, bound)`` pairs ``bounds(node)`` yields over every
    node of the program's bodies, per tensor."""
    found: dict[str, int] = {}

    def visit(n):
        for name, size in bounds(n):
            found[name] = min(size, found.get(name, size))

    for c in program.computes:
        for b in c.bodies:
            walk(b, visit)
    return found


def _integer_tensor(shape, bound: int | None, rng) -> np.ndarray:
    if bound is not None:
        return rng.integers(0, bound, size=shape).astype(np.int32)
    out = np.zeros(shape, np.int32)  # up to 4 runs of increasing ids per row
    for row in out.reshape(-1, shape[-1]):
        cuts = np.sort(rng.choice(np.arange(1, shape[-1]), size=min(3, shape[-1] - 1),
                                  replace=False))
        row[:] = np.searchsorted(cuts, np.arange(shape[-1]), side="right")
    return out


def default_scalars(program, sizes: dict[str, int], given: dict | None = None) -> dict:
    """Values for a program's scalar parameters by their usual names — ``scale`` 1/√D, ``cap``
    50, ``eps`` 1e-5, ``window`` and ``prefix`` N/4, ``radius`` N/8; for a map of tokens
    (``width``, ``height``) sides of about √N (∛N with a height), ``radius`` a quarter of a side,
    ``dilation`` 2, ``causal`` 1 — and 0.5 for a name it does not know, with ``given`` taking
    precedence."""
    n = sizes.get("N", 2)
    names = {p.name for p in program.scalar_params}
    side = max(1, round(n ** (1 / 3 if "height" in names else 1 / 2)))   # a map of ~n tokens
    defaults = {"scale": 1.0 / math.sqrt(sizes.get("D", 1)), "cap": 50.0, "eps": 1e-5,
                "window": max(1, n // 4), "prefix": max(1, n // 4),
                "radius": max(1, side // 4) if "width" in names else max(1, n // 8),
                "width": side, "height": side, "dilation": 2, "causal": 1}
    defaults.update(given or {})
    return {p.name: defaults.get(p.name, 0.5) for p in program.scalar_params}


def relative_error(out, ref) -> float:
    """max |out − ref| / max |ref| over finite reference values; NaN where out is NaN but ref is
    not counts as infinitely wrong."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise ValueError(f"shape {out.shape} != reference shape {ref.shape}")
    finite = np.isfinite(ref)
    if np.any(~np.isfinite(out[finite])):
        return math.inf
    if np.any(np.isnan(ref) != np.isnan(out)):
        return math.inf
    scale = np.max(np.abs(ref[finite])) if finite.any() else 1.0
    return float(np.max(np.abs(out[finite] - ref[finite])) / max(scale, 1e-30))
