"""The straightforward lowering: one loop nest and one ``sblock`` per compute, every intermediate in
its own global buffer. Correct for any program, fast for none; schedules start from here."""
from __future__ import annotations

import tvm

from ..dsl.program import Program
from .builder import FunctionBuilder, emit_compute


def lower_naive(program: Program, dims: dict[str, int] | None = None,
                index_dtype: str = "int32", parallel: str | None = None,
                accumulate: str | None = None, vector_math: bool = False) -> tvm.IRModule:
    """``program`` as an IRModule holding one PrimFunc named after the kernel; sizes named in
    ``dims`` are fixed, the others stay symbolic; ``parallel``, ``accumulate`` and
    ``vector_math`` as for ``FunctionBuilder``."""
    fb = FunctionBuilder(program, dims, index_dtype, parallel=parallel, accumulate=accumulate,
                         vector_math=vector_math)
    with fb:
        for c in program.computes:
            if not c.is_output:
                fb.alloc_compute(c)
        for c in program.computes:
            emit_compute(fb, c)
    return fb.finish()
