"""The sweep of a row kernel whose mask only bounds the swept axis (:mod:`...schedule_templates.
sweep_bounds`): each program reads its bounds and visits the blocks between them alone."""
from __future__ import annotations

from .expr import to_triton
from .source_writer import host_int


def bounded_sweep(emitter) -> None:
    """Write the row kernel ``emitter``'s loop over the blocks between each program's bounds
    (``lo_n`` rounded down to a block, ``hi_n`` capped at the axis' end), each block's body
    evaluating the mask (a block wholly inside the bounds would not need it: one compare a
    column, and its loads masked on the rows they skip). Bounds that read the rows are taken
    over the tile's rows: its lowest lower bound, its highest upper one."""
    w, bounds, ctx, cols = emitter.w, emitter.bounds, emitter.ctx_rc(), emitter.N
    row_uid = emitter.plan.row.uid

    def side(exprs, over_rows: str, combined: str) -> str:
        """Several bounds combined (the strictest), each over the tile's rows where it reads
        them (the loosest row's): never tighter than any row's own bounds."""
        def one(e):
            text = to_triton(e, ctx)
            reads_rows = row_uid in {a.uid for a in e.axes}
            return f"{over_rows}({text}, axis=None)" if reads_rows else text
        text = one(exprs[0])
        for e in exprs[1:]:
            text = f"{combined}({text}, {one(e)})"
        return text
    w(f"lo_n = tl.maximum({side(bounds.lo, 'tl.min', 'tl.maximum')}, 0) // BLOCK_N * BLOCK_N"
      if bounds.lo else "lo_n = 0")
    w(f"hi_n = tl.minimum({side(bounds.hi, 'tl.max', 'tl.minimum')}, {cols})"
      if bounds.hi else f"hi_n = {cols}")
    if emitter.interpreter:   # its loops take no bound loaded from a tensor
        w(f"for start_n in range(0, {host_int(str(cols))}, BLOCK_N):")
        w.indent += 1
        w("if (start_n >= lo_n) & (start_n < hi_n):")
    else:
        w.sweep("start_n", "lo_n", "hi_n", "BLOCK_N", emitter.stages)
    with w.block():
        emitter.chunk_body(True)
    if emitter.interpreter:
        w.indent -= 1
