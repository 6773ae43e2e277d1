"""The outputs of a row-tile kernel: each stored from the chain's finals at the tile's indices —
per row, along the swept axis (swept again, backwards, where the row was read in blocks; a
store per block and part of a realigned row), or along a feature axis a chunk at a time (a mixin
of the row-tile emitter, :class:`.rowtile._RowTileSource`)."""
from __future__ import annotations

from contextlib import contextmanager

from .expr import TL_DTYPES, to_triton
from .row_realign import emit_stores
from .tile_text import store_offsets


class RowOutputs:
    """The stores of a row kernel's outputs; the emitter provides ``w``, ``plan``, ``outs``,
    ``single``, ``chunk_memo``, ``realign``, ``N``, ``stages``, ``chunked``, ``ragged_cols``,
    ``ctx_base``, ``only_chunk`` (a merge program's one feature chunk, or None), the tile
    contexts (``ctx_r()``, ``ctx_rc()``, ``ctx_rf()``) and ``feature_chunks()``."""

    def emit_outputs(self, finals: dict) -> None:
        w = self.w
        for (c, expr, kind), out in zip(self.plan.outputs, self.outs):
            if kind == "colsum":   # written by the kernel that adds up the sums (column_sums)
                continue
            if kind != "feature" and self.only_chunk not in (None, 0):
                continue   # a merge program of another chunk than the first (merge_kernel_lines)
            if kind == "row":
                ctx = self.ctx_r().child(refs=finals, emit=w if self.single else None,
                                         memo=self.chunk_memo)
            elif kind == "feature":   # a chunk at a time, of the output and of the sums it reads
                common = {x.uid for x in self.plan.chain.common_axes}
                feat = next(a for a in c.axes if a.uid not in common)
                for chunk, sfx in self.feature_chunks(feat):
                    chunked = {n: v + sfx if n in self.chunked else v for n, v in finals.items()}
                    w(self.store_text(c, expr, out, self.ctx_rf(feat, chunk).child(refs=chunked)))
                continue
            else:
                ctx = self.ctx_rc().child(refs=finals, emit=w if self.single else None,
                                          memo=self.chunk_memo)
            if kind == "col" and self.realign is not None:   # a store per block and part
                def store(positions: str, tail: bool, inside: bool, mask: str | None, c=c,
                          expr=expr, out=out):
                    with self.inside_rows(inside):
                        w(f"offs_n = {positions}")
                        for line in self.realign.block(self.N, tail, inside):
                            w(line)
                        if mask is not None:
                            w(f"col_ok = {mask}")
                        w(self.store_text(c, expr, out, self.ctx_rc().child(refs=finals)))
                emit_stores(w, self.realign, self.N, self.stages, store)
                continue
            store = self.store_text(c, expr, out, ctx)
            if kind == "col" and not self.single:
                # backwards: the blocks the statistics pass read last are read again first,
                # while L2 still holds them (read forwards, the first blocks are the oldest, and
                # each block read again from memory may evict one the pass needs next): a
                # softmax over a 128k-word vocabulary 6-7 % faster on the H200
                # (``benchmarks.rows_vocab``); over 32k-64k columns no change
                w.sweep("back_n", "0", str(self.N), "BLOCK_N", self.stages)
                with w.block():
                    w(f"start_n = (({self.N}) + BLOCK_N - 1) // BLOCK_N * BLOCK_N - BLOCK_N - "
                      "back_n")
                    w("offs_n = start_n + tl.arange(0, BLOCK_N)")
                    w(store)
            else:
                w(store)

    def store_text(self, c, expr, out: str, ctx) -> str:
        """The store of output ``c`` at the tile's indices (a realigned row's output of the
        rows' shape at its aligned window positions)."""
        sample = self.realign.sample if self.realign is not None else None
        # the same axes in the same order over the same sizes: the output's offsets are the
        # realigned reads' (a square output over its axes transposed is not)
        same = sample is not None and [a.uid for a in c.axes] == \
            [i.uid for i in sample.indices] and \
            tuple(a.extent for a in c.axes) == tuple(sample.param.dims)
        offsets = "flat_n" if same else store_offsets(c.axes, ctx, self.sizes)
        valid_ = sorted({ctx.valid[a.uid] for a in c.axes if a.uid in ctx.valid})
        return (f"tl.store({out} + ({offsets}), ({to_triton(expr, ctx)})"
                f".to({TL_DTYPES[c.dtypes[0]]}), mask={' & '.join(valid_) or 'None'})")

    @contextmanager
    def inside_rows(self, inside: bool):
        """Emit a realigned block that lies inside every row (``inside``): no column tests, no
        load masks but the rows'."""
        if not inside:
            yield
            return
        kept = self.ragged_cols, dict(self.ctx_base.realigned)
        self.ragged_cols = False
        self.ctx_base.realigned = {n: (uid, at, None) for n, (uid, at, _) in kept[1].items()}
        try:
            yield
        finally:
            self.ragged_cols, self.ctx_base.realigned = kept
