"""tensorfuse's schedule primitives and the templates built from them.

``lower_program`` lowers a program with the fusions (rolling and split updates) a schedule has
asked for; each template lives in a module of its own.
"""
from __future__ import annotations

import tvm

from ..dsl.program import Program
from ..lower_to_tir import lower_naive


def lower_program(program: Program, fusions: tuple = (), dims: dict | None = None,
                  index_dtype: str = "int32", parallel: str | None = None,
                  accumulate: str | None = None,
                  vector_math: bool | str = False) -> tvm.IRModule:
    """TensorIR for ``program`` with ``fusions`` applied (none: the naive lowering); float sums
    narrower than ``accumulate`` accumulate in it (``TargetSpec.accumulate``); ``vector_math``:
    elementary functions the CPU vectorises (``TargetSpec.vector_math``; ``"bound"``: their
    arguments bound once each, :func:`~tensorfuse.lower_to_tir.vector_math.fast_exp`)."""
    if not fusions:
        return lower_naive(program, dims, index_dtype, parallel, accumulate, vector_math)
    from .fusion import lower_with_fusions

    return lower_with_fusions(program, fusions, dims, index_dtype, parallel, accumulate,
                              vector_math)


def tvm_schedule(mod: tvm.IRModule) -> tvm.s_tir.Schedule:
    """A traced TVM schedule of ``mod`` working on its one function."""
    sch = tvm.s_tir.Schedule(mod)
    sch.work_on(next(iter(mod.functions.keys())).name_hint)
    return sch


from .attention import attention  # noqa: E402 - the templates use the helpers above
from .hopper_attention import hopper_attention  # noqa: E402
from .hopper_gemm import hopper_gemm  # noqa: E402
from .hopper_ffn import hopper_ffn  # noqa: E402
from .row_reduction import row_reduction  # noqa: E402

TEMPLATES = {"attention": attention, "row_reduction": row_reduction,
             "hopper_attention": hopper_attention, "hopper_gemm": hopper_gemm,
             "hopper_ffn": hopper_ffn}
