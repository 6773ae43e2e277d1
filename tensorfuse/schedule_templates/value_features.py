"""The feature axes of a chain's column operands that its common axes hide: sigmoid attention
``Σ_j sigmoid(s[i, j]) · v[j, e]`` has one member, so every axis of it, ``e`` too, is common to
the chain (:class:`~tensorfuse.algebra.Chain`), and the row-tile plan took ``e`` for the row axis
— a program per query row and ``e`` block, ``p·v`` on the CUDA cores (B2 H16 S4096 D128 on the
H200: 38.9 ms against torch.compile's 1.14, ``benchmarks.pipeline_kernels``). By its role ``e``
is a feature of the values, as softmax attention's ``o`` has it beside ``m`` and ``l``: the axis
a column operand reads beside the swept axis, next to a score contracted per (row, column) pair
that does not read it. :func:`with_value_features` moves such axes out of the common ones, so the
plan is attention's: query rows in tiles, ``e`` held whole, ``p·v`` a tensor-core product."""
from __future__ import annotations

from dataclasses import replace

from ..algebra import Chain, inline_elementwise
from ..algebra.exprs import nodes
from ..dsl.expr import Load


def with_value_features(chain: Chain) -> Chain:
    """``chain`` with its values' feature axes out of its common axes (itself where it has
    none, or no score contracted per pair: a plain sum down the rows keeps its plan); made once
    per chain."""
    found = chain.memo.get("value_features")
    if found is None:
        moved = _value_features(chain)
        found = chain if not moved else replace(
            chain, common_axes=tuple(a for a in chain.common_axes if a.uid not in moved))
        chain.memo["value_features"] = found
    return found


def _value_features(chain: Chain) -> set:
    """The uids of the common axes that a load reads beside the swept axis and nothing else of
    the chain reads: not its scores (local reductions), not a load without the swept axis."""
    if not chain.local_reductions or chain.axis is None:
        return set()
    col = chain.axis.uid
    common = {a.uid for a in chain.common_axes}
    beside_col, elsewhere = set(), set()
    for x in chain.local_reductions:
        elsewhere |= {a.uid for n in nodes(inline_elementwise(x.bodies[0]))
                      if isinstance(n, Load) for a in n.axes}
    for m in chain.members:
        for body in chain.bodies[m.name]:
            for n in nodes(body):
                if isinstance(n, Load):
                    axes = {a.uid for a in n.axes}
                    (beside_col if col in axes else elsewhere).update(axes & common)
    moved = beside_col - elsewhere
    return moved if moved and common - moved else set()
