"""Partial states folded in a row kernel: the split update's merge — each part of a row tile's
sweep stores its states and references, and the part that arrives last folds them, each
corrected from its part's references to the final ones, then writes the outputs — and the fold
of the states a swept row keeps per lane (a mixin of the row-tile emitter,
:class:`.rowtile._RowTileSource`)."""
from __future__ import annotations

from ...dsl.expr import Symbol
from .expr import TileContext, to_triton
from .reductions import combine_function, reduced, reduced_together
from .row_states import exact_symbols, exactly_read, loaded_state, state_identity, state_type
from .row_grid import grid

# the merge's loads of the parts' states go to L2 (``.cg``): never a line an SM's L1 kept
FROM_L2 = ", cache_modifier='.cg'"


class SplitMerge:
    """What a row kernel's parts write and its last part merges, and its lanes' fold; the
    emitter provides ``w``, ``plan``, ``knobs``, ``splits``, ``rows_pad``, ``members``,
    ``needed``, ``sizes``, ``lanes``, ``fixed``, ``ctx_base``, ``ctx_r()``, ``state_chunks()`` and
    ``emit_outputs()``."""

    def part_at(self, sp_or_ref, split: str, chunk: int = 0) -> str:
        """Address of this program's rows of a split's saved state in its buffer (of a weighted
        sum's ``chunk``, where its features are taken in chunks)."""
        wide_state = not isinstance(sp_or_ref, str) and sp_or_ref.contraction is not None
        base = f"((pid_b * {self.splits} + {split}) * {self.rows_pad} + offs_m[:, None])"
        name_ = sp_or_ref if isinstance(sp_or_ref, str) else \
            f"part_{sp_or_ref.member.name}_{sp_or_ref.k}"
        if wide_state and self.plan.feature_chunk is not None:
            chunks = self.plan.feature_chunks(self.plan.state_feature(sp_or_ref))
            return f"{name_} + ({base} * {chunks} + {chunk}) * BLOCK_K + offs_k[None, :]"
        return f"{name_} + {base} * BLOCK_K + offs_k[None, :]" if wide_state else \
            f"{name_} + {base}"

    def emit_merge(self) -> None:
        """Fold the splits' saved states, each corrected from its split's references to the final
        ones (the split update's merge, in registers), then write the outputs."""
        w = self.w
        finals = {}
        for m in self.members:
            scheme = self.plan.chain.schemes[m.name]
            mine = [sp for sp in self.plan.states if sp.member is m]
            chunks = self.state_chunks(mine[0])   # a weighted sum's chunks, each merged alike
            for sp in mine:
                shape = "[BLOCK_M, BLOCK_K]" if sp.contraction is not None else "[BLOCK_M, 1]"
                for _, sfx in chunks:
                    w(f"acc_{m.name}_{sp.k}{sfx} = tl.full({shape}, {state_identity(sp)}, "
                      f"{state_type(sp)})")
            # up to 64 parts unrolled; more in a loop (a long sweep of very few row tiles)
            w(f"for _sp in tl.static_range({self.splits}):" if self.splits <= 64 else
              f"for _sp in range(0, {self.splits}):")
            with w.block():
                sym = {}
                for sp in mine:
                    for c, sfx in chunks:
                        at = self.part_at(sp, '_sp', c)
                        w(f"sv_{m.name}_{sp.k}{sfx} = "
                          f"{loaded_state(sp, f'tl.load({at}{FROM_L2})')}")
                    sym[f"{m.name}#{sp.k}"] = f"sv_{m.name}_{sp.k}"
                for d in scheme.deps if scheme.kind != "reset" else ():
                    w(f"sref_{d} = tl.load({self.part_at(f'part_ref_{d}', '_sp')}{FROM_L2})")
                    sym[f"{d}.old"], sym[f"{d}.new"] = f"sref_{d}", f"finref_{d}"
                if scheme.kind == "reset":   # the part's exact running values, and the final
                    for d in scheme.deps:
                        state = next(sp for sp in self.plan.states if sp.member.name == d)
                        at = self.part_at(state, "_sp")
                        w(f"sval_{d} = {loaded_state(state, f'tl.load({at}{FROM_L2})')}")
                    sym.update(exact_symbols(scheme, "sval_{}", "fin_{}"))
                if m.arity > 1:   # independent: the parts' states combined as the monoid does
                    accs = [f"acc_{m.name}_{sp.k}" for sp in mine]
                    parts = [f"sv_{m.name}_{sp.k}" for sp in mine]
                    w(f"{', '.join(accs)} = "
                      f"{combine_function(m.monoid)}({', '.join(accs + parts)})")
                for sp in mine if m.arity == 1 else ():
                    for _, sfx in chunks:
                        part = {**sym, f"{m.name}#{sp.k}": f"sv_{m.name}_{sp.k}{sfx}"}
                        corrected = to_triton(scheme.corrections(settled=True)[sp.k],
                                              self.ctx_r().child(symbols=part))
                        combined = sp.monoid.combine_exprs([Symbol("__a", sp.dtype)],
                                                           [Symbol("__b", sp.dtype)])[0]
                        acc = f"acc_{m.name}_{sp.k}{sfx}"
                        w(f"{acc} = " + to_triton(combined, TileContext(
                            axes={}, symbols={"__a": acc, "__b": f"({corrected})"},
                            sizes=self.sizes)))
            if m.arity > 1:
                for sp in mine:
                    w(f"fin_{m.name}_{sp.k} = acc_{m.name}_{sp.k}")
                    finals[f"{m.name}#{sp.k}"] = f"fin_{m.name}_{sp.k}"
                continue
            final = scheme.value[0] if scheme.kind == "reset" else \
                scheme.true_value(0, settled=True)   # a reset: merged at the exact values
            for _, sfx in chunks:
                acc = {f"{m.name}#{sp.k}": f"acc_{m.name}_{sp.k}{sfx}" for sp in mine}
                acc.update({f"{d}.old": f"finref_{d}" for d in scheme.deps})
                acc.update({f"{d}.new": f"fin_{d}" for d in scheme.deps})
                value = to_triton(final, self.ctx_r().child(symbols=acc))
                w(f"fin_{m.name}{sfx} = {value}")
            finals[m.name] = f"fin_{m.name}"
            if m.name in self.needed:
                usable = scheme.usable(Symbol("__fin", m.dtypes[0]))
                w(f"finref_{m.name} = "
                  f"{to_triton(usable, self.ctx_r().child(symbols={'__fin': f'fin_{m.name}'}))}")
        self.emit_outputs(finals)

    def fold_lanes(self) -> None:
        """After a sweep: the states kept per lane folded across the row (the lanes as parts of
        the row, each folded with its correction like a split's part), and the output pass's
        loads marked as the row's last reads."""
        exact = exactly_read(self.plan)
        for sp in self.plan.states:   # in the chain's order: a dependency before its readers
            if (sp.member.name, sp.k) not in self.lanes:
                continue
            state, scheme = f"st_{sp.member.name}_{sp.k}", self.plan.chain.schemes[sp.member.name]
            if sp.member.arity > 1:   # its components folded together, once, at the first
                if sp.k == 0:
                    states = [f"st_{sp.member.name}_{k}" for k in range(sp.member.arity)]
                    self.w(f"{', '.join(states)} = "
                           f"{reduced_together(sp.member.monoid, states, 1)}")
                continue
            if sp.member.name in exact:   # its lanes' values, which resetting states compare with
                self.w(f"lane_{sp.member.name} = {state}")
            lanes = state
            # a reset: each lane's state corrected from its lane's values (lanes of fixed
            # references are all relative to the row's one: summed as they are)
            if scheme.deps and sp.member.name not in self.fixed:
                symbols = {f"{sp.member.name}#{sp.k}": state,
                           **exact_symbols(scheme, "lane_{}", "st_{}_0")}
                lanes = to_triton(scheme.correct[sp.k], self.ctx_r().child(symbols=symbols))
            self.w(f"{state} = {reduced(sp.monoid, lanes, 1, True)}")
        if self.ctx_base.streaming:   # the output pass reads each row a last time
            self.ctx_base.streaming = self.ctx_base.streaming[:2] + ("evict_first",)

    def last_part_merges(self) -> None:
        """After a part stored its states: a CTA barrier, then one thread's acquire-release
        increment of the row tile's counter (the other parts' stores are visible to whoever sees
        their increments); the tile's last part to arrive sets the counter back to zero for the
        next call and merges — one launch, not a merge kernel after the parts (MQA decode on the
        H200: 0.062 -> 0.054 ms, ``benchmarks.user_kernels``)."""
        w = self.w
        count = f"part_count + pid_b * {grid(self.plan, self.knobs)[0]} + pid_m"
        w("tl.debug_barrier()")
        w(f"arrived = tl.atomic_add({count}, 1, sem='acq_rel', scope='gpu')")
        w(f"if arrived == {self.splits - 1}:")
        with w.block():
            w(f"tl.store({count}, 0)")
            self.emit_merge()
