"""The split update: a fused chain computed as independent parts of its axis, merged at the end.

Flash-decoding's scheme, derived for any chain the rolling update accepts: each of ``splits``
contiguous parts of ``axis`` runs the rolling update on its own (in parallel on a GPU), keeping its
running states and the values its dependencies had; ``{m}_merge`` blocks then fold the parts, each
corrected from its own dependency values to the final ones with the same algebra.
"""
from __future__ import annotations

import tvm

from .fusion import Fusion, lower_with_fusions
from .rolling_update import DEFAULT_CHUNK, _program


def split_update(kernel, *names: str, axis: str, splits: int, chunk: int = DEFAULT_CHUNK,
                 dims: dict | None = None) -> tvm.IRModule:
    """TensorIR of ``kernel`` with ``names`` fused over ``axis`` in ``splits`` parallel parts."""
    fusion = Fusion(tuple(names), axis, chunk, splits)
    return lower_with_fusions(_program(kernel), (fusion,), dims)
