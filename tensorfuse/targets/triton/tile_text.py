"""Text the Triton emitters share: a module of ``@triton.jit`` functions, a ``tl.dot`` operand, a
contiguous tensor's offsets at a tile's indices, and whether a kernel's offsets need 64 bits."""
from __future__ import annotations

import math

from ...dsl.expr import Expr, Load
from .expr import HELPERS, TL_DTYPES, TileContext, to_triton, with_called_helpers
from .reductions import combine_helpers
from .source_writer import INTERPRETER_HELPERS
from .view_strides import view_elements


def assemble_source(functions) -> str:
    parts = ["import triton", "import triton.language as tl",
             "from triton.language.extra import libdevice", HELPERS]
    if any("_host_int(" in line for _, _, body in functions for line in body):
        parts.append(INTERPRETER_HELPERS)
    parts += combine_helpers(line for _, _, body in functions for line in body)
    for fname, fargs, body in functions:
        parts += ["", "@triton.jit",
                  f"def {fname}(" + ", ".join(fargs) + ", BLOCK_M: tl.constexpr, "
                  "BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):"] + body
    return with_called_helpers("\n".join(parts) + "\n")


def dot_operand(e: Expr, ctx: TileContext, dot_dtype: str) -> str:
    """A tl.dot operand: a single load keeps its storage type; anything else is computed in f32
    and converted."""
    if isinstance(e, Load) and e.param.dtype == dot_dtype:
        return to_triton(e, ctx.child(keep_dtype=True))
    return f"({to_triton(e, ctx)}).to({TL_DTYPES[dot_dtype]})"


def store_offsets(axes, ctx: TileContext, sizes: dict) -> str:
    """The offset of a contiguous tensor over ``axes`` (outermost first) at the tile's indices."""
    dims = [a.extent if isinstance(a.extent, int) else sizes[a.extent] for a in axes]
    strides, acc = [], 1
    for n in reversed(dims):
        strides.append(acc)
        acc *= n
    strides.reverse()
    return " + ".join(f"{ctx.axes[a.uid]} * {s}" if s != 1 else ctx.axes[a.uid]
                      for a, s in zip(axes, strides))


def needs_wide_offsets(prog, sizes: dict) -> bool:
    """Whether some tensor the kernel reads or writes has 2³¹ elements or more (its offsets then
    need 64 bits). Each tensor is asked on its own: a size as an argument is then guarded by
    each staying below, not by which of them is the largest."""
    counts = []
    for p in prog.tensor_params:
        dims = [d if isinstance(d, int) else sizes[d] for d in p.dims]
        spanned = view_elements(p.name, dims)   # a view reads as far as its strides reach
        counts.append(math.prod(dims) if spanned is None else spanned)
    counts += [math.prod(a.extent if isinstance(a.extent, int) else sizes[a.extent]
                         for a in c.axes) for c in prog.outputs]
    return any(count >= 2**31 for count in counts)
