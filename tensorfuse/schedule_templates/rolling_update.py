"""The rolling update: a chain of dependent reductions over one axis, fused into one pass.

``rolling_update(attention, "m", "l", "o", axis="j")`` computes the running maximum, the running sum
of ``exp(s − m)`` and the running weighted sum together, chunk by chunk, correcting the sums each
time the maximum moves (online softmax), with corrections derived by :mod:`tensorfuse.algebra` and
checked numerically. A chain whose dependence does not distribute over a later reduction is refused
with a :class:`~tensorfuse.errors.RollingUpdateError` naming the expression.
"""
from __future__ import annotations

import tvm

from ..algebra import Chain, plan_chain
from ..dsl.program import Program
from .fusion import Fusion, lower_with_fusions

DEFAULT_CHUNK = 32
# on the CPU a chunk is a loop LLVM vectorises (16 f32 lanes, interleaved): 32 positions left it
# mostly in the remainder loop; causal attention S=1024 on 2 cores took 54.6 / 40.1 / 33.1 /
# 37.5 ms at chunks of 32 / 64 / 128 / 256 (``benchmarks.cpu``)
CPU_CHUNK = 128


def default_chunk(is_gpu: bool) -> int:
    """The chunk a rolling or split update gets unless one is given."""
    return DEFAULT_CHUNK if is_gpu else CPU_CHUNK


def _program(kernel_or_program) -> Program:
    return kernel_or_program if isinstance(kernel_or_program, Program) else kernel_or_program.program


def rolling_update(kernel, *names: str, axis: str, chunk: int = DEFAULT_CHUNK,
                   dims: dict | None = None) -> tvm.IRModule:
    """TensorIR of ``kernel`` with the reductions ``names`` fused into one pass over ``axis``,
    ``chunk`` elements at a time."""
    fusion = Fusion(tuple(names), axis, chunk, 1)
    return lower_with_fusions(_program(kernel), (fusion,), dims)


def explain(kernel, *names: str, axis: str) -> Chain:
    """The plan of a fusion without lowering it: ``explain(k, "m", "l", axis="j").describe()``
    prints each member's running states and corrections."""
    return plan_chain(_program(kernel), names, axis)
