"""The rolling update of a row tile's states, block by block (a mixin of the row-tile emitter,
:class:`.rowtile._RowTileSource`): each member's running states corrected to its dependencies'
new references and combined with the block's values, and its own new reference where others
read it — set once, in the first block, where its sums are kept per lane
(:func:`.row_states.referenced_lanes`)."""
from __future__ import annotations

from ...algebra.schemes import EXTRAPOLATION
from ...dsl.expr import Symbol
from .expr import TileContext, to_triton
from .reductions import combine_function, reduced, reduced_together


class RowUpdates:
    """A block's update of the states; the emitter provides ``w``, ``plan``, ``N``, ``lanes``,
    ``referenced``, ``fixed``, ``needed``, ``sizes``, ``ctx_r()``, ``state_chunks()`` and
    ``products``/``dot_type``."""

    def update_states(self, m, chunk_vars, resets: dict, symbols: dict, exact: set) -> None:
        """The block's rolling update of member ``m``'s running states: each corrected to the
        new references (``resets``: a reset's dependencies' values) and combined with the
        block's ``c_`` values; its new reference into ``symbols`` where others read it, its
        running value before the block kept where a reset reads it (``exact``)."""
        w, scheme = self.w, self.plan.chain.schemes[m.name]
        if m.arity > 1:   # an independent member: its states combined as the monoid does
            chunk = [f"c_{m.name}_{sp.k}" for sp in chunk_vars]
            running = [f"st_{m.name}_{sp.k}" for sp in chunk_vars]
            if (m.name, 0) not in self.lanes:
                w(f"{', '.join(chunk)} = {reduced_together(m.monoid, chunk, 1)}")
            w(f"{', '.join(running)} = "
              f"{combine_function(m.monoid)}({', '.join(running + chunk)})")
            return
        # correct and combine
        sym = {f"{m.name}#{sp.k}": f"st_{m.name}_{sp.k}" for sp in chunk_vars}
        for d in scheme.deps:
            sym[f"{d}.old"] = f"ref_{d}"
            sym[f"{d}.new"] = f"newref_{d}"
        sym.update(resets)
        new_values = []
        for sp in chunk_vars:
            for _, sfx in self.state_chunks(sp):   # each chunk corrected as the whole would be
                state = f"{m.name}_{sp.k}{sfx}"
                corr = self.ctx_r().child(symbols={**sym, f"{m.name}#{sp.k}": f"st_{state}"})
                # references fixed after the first block, whose states start empty: nothing to
                # correct (row_states.referenced_lanes)
                corrected = f"st_{state}" if m.name in self.fixed else \
                    to_triton(scheme.correct[sp.k], corr)
                if sp.contraction is not None:  # accumulate on the tensor cores: acc = p·v + acc
                    text = (f"tl.dot(p_{m.name}_{sp.k}, v_{state}, {corrected}"
                            f"{self.products(self.dot_type(sp.contraction))})")
                else:
                    combined = sp.monoid.combine_exprs([Symbol("__a", sp.dtype)],
                                                       [Symbol("__b", sp.dtype)])[0]
                    text = to_triton(combined, TileContext(axes={}, symbols={
                        "__a": f"({corrected})", "__b": f"c_{state}"}, sizes=self.sizes))
                new_values.append((state, text))
        for state, text in new_values:
            w(f"nst_{state} = {text}")
        if m.name in exact:
            w(f"old_{m.name} = st_{m.name}_0")
        for state, _ in new_values:
            w(f"st_{state} = nst_{state}")
        if m.name in self.needed:  # its reference: the value at the references, extrapolated
            at_refs = {**sym, **{f"{d}.new": f"newref_{d}" for d in scheme.deps},
                       EXTRAPOLATION.name: f"({self.N} / tl.maximum(seen_next, 1))"}
            if (m.name, 0) in self.referenced:   # kept per lane: set once, from the first block
                at_refs.update({f"{m.name}#{sp.k}": reduced(sp.monoid, f"st_{m.name}_{sp.k}", 1,
                                                            True) for sp in chunk_vars})
                w(f"newref_{m.name} = ref_{m.name}")
                w("if seen == 0:")
                w.indent += 1
            w(f"newref_{m.name} = "
              f"{to_triton(scheme.reference(), self.ctx_r().child(symbols=at_refs))}")
            if (m.name, 0) in self.referenced:
                w.indent -= 1
            symbols[f"{m.name}.ref"] = f"newref_{m.name}"
