"""Whether a fused chain keeps its precision: its schemes run in float32 on data far from zero
and around it.

A derived correction is exact in exact arithmetic (:mod:`.verify` checks that), but the running
states are kept relative to references that move during the sweep, and when a reference sits far
from the data the corrections cancel catastrophically: Σ (y − w)² kept relative to a w that is
10× the data's mean loses every digit once y has an offset. This module runs a planned chain the
way the lowerings do — chunk by chunk, each member's reference estimated by
:meth:`~tensorfuse.algebra.Scheme.reference`, and as split parts merged at the end — in NumPy, in
float32, on rows whose values carry a large offset and on rows around zero (where a signed sum's
running estimate is noisiest), and compares its error with the unfused program's (both against
float64). :func:`check_conditioning` warns, or refuses under ``strict``,
naming the member whose fused value is much worse.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..dsl import dtypes as dt
from ..dsl.evaluate import evaluate_plain
from ..dsl.expr import Axis, DimSize, Expr, Load, Ref, Scalar, Symbol
from ..dsl.printer import to_text
from ..errors import FusedPrecisionWarning, RollingUpdateError
from .exprs import has_axis, substitute
from .schemes import EXACT_READERS, EXTRAPOLATION

LENGTH = 1000        # elements of the fused axis per simulated row
ROWS = 16           # each row's error counts on its own (below): a dependency that is a signed
                    # sum of zero-mean data is a random walk whose early estimate is far off in
                    # some rows and not in others, and the rows where it is show the loss
CHUNK = 24           # small (running estimates are noisiest early); does not divide LENGTH
SPLITS = 3
OFFSETS = (1e3, 0.0)  # real-valued inputs are offset + N(0, 1): far from zero, and around it
                      # (where a signed sum's running estimate is noisiest)
# where a member overflows on inputs that far from zero (an exponential of the data), it is
# measured again at an offset exponentials take: a running minimum of exp(exp(y / 2) − max x)
# moves by orders of magnitude over a sweep of data near 10, and a logsumexp kept relative to it
# lost 6500 float32 ulps fused (1e-7 unfused) — unwarned, as the model only saw 1e3 (overflow)
# and 0 (no spread) (``tests/algebra/test_generated_chains.py``' f32 property test drew it)
EXPONENTIAL_OFFSET = 10.0
FACTOR = 10.0        # fused error allowed beyond the unfused one ...
SLACK = 16 * float(np.finfo(np.float32).eps)   # ... plus a few float32 ulps (relative)

_REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum, "logsumexp": np.logaddexp}


@dataclass
class Conditioning:
    """Relative errors (against float64; the worst row's) of one member, unfused and fused."""

    member: str
    unfused: float
    rolled: float
    split: float
    offset: float = OFFSETS[0]   # of the inputs these errors were measured on

    @property
    def worst(self) -> float:
        return max(self.rolled, self.split)

    def poor(self) -> bool:
        return self.worst > FACTOR * self.unfused + SLACK

    def excess(self) -> float:
        """How far the fused error is past the allowance (≤ 1: within it)."""
        return self.worst / (FACTOR * self.unfused + SLACK)


def measure(chain, seed: int = 0) -> list[Conditioning] | None:
    """Errors of every member of ``chain`` (unfused, rolled, split) in float32, on inputs far
    from zero and around zero (and near :data:`EXPONENTIAL_OFFSET` where a member overflows far
    from zero); per member the worst. ``None`` when the chain holds
    something this model does not run: a monoid other than sum/max/min/logsumexp, a member of
    several values, an argmax-style reset, a member held to one block (exact: no reference
    moves while it is summed). (Products are left out on purpose: over a long row of
    data far from 1 they overflow, fused or not.)"""
    if any(m.arity > 1 or m.monoid.name not in _REDUCE for m in chain.members) or \
            any(s.kind in EXACT_READERS for s in chain.schemes.values()):
        return None
    worst: dict[str, Conditioning] = {}
    for offset in OFFSETS:
        overflowed = _measure_at(chain, seed, offset, worst)
        if overflowed and offset == OFFSETS[0]:   # far from zero: measured where exp takes it
            _measure_at(chain, seed, EXPONENTIAL_OFFSET, worst)
    return [worst[m.name] for m in chain.members if m.name in worst]


def _measure_at(chain, seed: int, offset: float, worst: dict) -> bool:
    """The members' errors on inputs ``offset`` + N(0, 1), each kept in ``worst`` where it is
    the member's worst so far; whether some member overflowed on every row there."""
    model = _Model(chain, np.random.default_rng(seed), offset)
    with np.errstate(all="ignore"):
        truth = model.unfused(np.float64)
        unfused = model.unfused(np.float32)
        rolled = model.fused(np.float32, 1)
        split = model.fused(np.float32, SPLITS)
    overflowed = False
    for m in chain.members:
        ref = truth[m.name]
        usable = np.isfinite(ref) & (np.abs(ref) < 1e30) & np.isfinite(unfused[m.name])
        if not usable.any():
            overflowed = True
            continue
        errs = [_relative(x[m.name][usable], ref[usable]) for x in (unfused, rolled, split)]
        found = Conditioning(m.name, *errs, offset=offset)
        if m.name not in worst or found.excess() > worst[m.name].excess():
            worst[m.name] = found
    return overflowed


def check_conditioning(chain, strict: bool = False) -> None:
    """Warn (:class:`~tensorfuse.errors.FusedPrecisionWarning`), or with ``strict`` refuse
    (:class:`~tensorfuse.errors.RollingUpdateError`), when a member's fused value loses much more
    precision than the unfused program on data with an offset (``chain.conditioning``, from
    :func:`measure`)."""
    for c in chain.conditioning or []:
        if not c.poor():
            continue
        m = next(x for x in chain.members if x.name == c.member)
        body = to_text(chain.bodies[m.name][0])
        message = (f"{m.name} = {m.monoid.name}_{chain.axis.name} {body}"
                   f": fused, it loses precision (float32, inputs "
                   f"{c.offset:g} + N(0, 1): relative error {c.worst:.1e} against {c.unfused:.1e} "
                   "unfused); its running states are kept relative to references the algebra "
                   "cannot place near the data. Check the result's precision, or leave "
                   f"{m.name} out of the fusion")
        warn_or_refuse(message, m, strict)


def warn_or_refuse(message: str, member, strict: bool) -> None:
    """A precision concern about ``member`` of a fused chain: a :class:`FusedPrecisionWarning`
    at the user's line, or with ``strict`` a :class:`RollingUpdateError`."""
    if strict:
        raise RollingUpdateError(message, member.loc)
    loc = member.loc
    warnings.warn_explicit(FusedPrecisionWarning(message), FusedPrecisionWarning,
                           loc.filename if loc else "<tensorfuse>", loc.lineno if loc else 0)


def _relative(a: np.ndarray, ref: np.ndarray) -> float:
    """The worst row's relative error: a norm over rows would hide a row whose value is small
    beside the others' (a sum of squares of 5e3 among rows of 5e6) — its error is the user's
    error all the same."""
    a = a.astype(np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    scale = np.abs(ref)
    return float(np.max(np.abs(a - ref) / np.where(scale > 0, scale, 1.0)))


class _Model:
    """The chain's members with their data replaced by random stand-ins, run in NumPy."""

    def __init__(self, chain, rng: np.random.Generator, offset: float):
        self.offset = offset
        self.chain = chain
        self.members = chain.members
        self.names = {m.name for m in chain.members}
        self.leaves: dict = {}       # key -> (Symbol, the leaf it stands for)
        self.memo: dict = {}
        self.bodies = {m.name: chain.bodies[m.name][0] for m in self.members}
        self.states = {m.name: [self._symbolic(st.body, "ref")
                                for st in chain.schemes[m.name].states] for m in self.members}
        for m in self.members:   # every leaf the schemes' steps read gets data below
            scheme = chain.schemes[m.name]
            for e in (scheme.reference(), *scheme.correct, *scheme.corrections(settled=True),
                      scheme.true_value(0, settled=True)):
                self.expr(e)
        self.data = self._draw(rng)
        self.needed = {d for s in chain.schemes.values() for d in s.deps}

    def _symbolic(self, e: Expr, deps_as: str = "val") -> Expr:
        """``e`` with references to members read as ``{name}.{deps_as}`` and every leaf (data,
        axis values, sizes, scalars) as a symbol of its own."""
        def replace(n: Expr):
            if isinstance(n, Ref) and n.compute.name in self.names:
                return Symbol(f"{n.compute.name}.{deps_as}", n.dtype)
            if isinstance(n, (Load, Ref, Axis, Scalar, DimSize)):
                key = n.key()
                if key not in self.leaves:
                    self.leaves[key] = (Symbol(f"leaf{len(self.leaves)}", n.dtype), n)
                return self.leaves[key][0]
            return None

        return substitute(e, replace)

    def _draw(self, rng: np.random.Generator) -> dict:
        """Data (offset + N(0, 1)) for what is read along the axis; the axis itself
        counts 0, 1, …; sizes are the row's length (the fused axis') or 64; scalars are near 1;
        masks keep 70 %."""
        axis, data = self.chain.axis, {}
        for sym, leaf in self.leaves.values():
            shape = (ROWS, LENGTH) if has_axis(leaf, axis) else (ROWS, 1)
            d = dt.resolve(sym.dtype)
            if isinstance(leaf, Axis) and leaf.uid == axis.uid:
                value = np.broadcast_to(np.arange(LENGTH), shape)
            elif isinstance(leaf, DimSize):
                value = np.full(shape, LENGTH if leaf.name == axis.extent else 64)
            elif d == "bool":
                value = rng.random(shape) < 0.7
            elif dt.is_int(d):
                value = rng.integers(0, 8, shape)
            elif isinstance(leaf, Scalar):
                value = 1.0 + 0.1 * rng.standard_normal(shape)
            else:
                value = self.offset + rng.standard_normal(shape)
            data[sym.name] = value
        return data

    def expr(self, e: Expr) -> Expr:
        """A scheme's expression (correction, value, reference) over the model's symbols."""
        if e.uid not in self.memo:
            self.memo[e.uid] = self._symbolic(e)
        return self.memo[e.uid]

    def _env(self, dtype, cols: slice | None) -> dict:
        """The data over columns ``cols`` (rows × columns), or with ``None`` the values that are
        constant along the axis (one per row), in ``dtype``."""
        env = {}
        for name, arr in self.data.items():
            if cols is None:
                part = arr[:, 0]
            else:
                part = arr[:, cols] if arr.shape[1] > 1 else arr
            env[name] = part.astype(dtype) if part.dtype.kind == "f" else part
        return env

    def _eval(self, e: Expr, env: dict, dtype, shape=None) -> np.ndarray:
        out = np.asarray(evaluate_plain(self.expr(e), env, precise=dtype == np.float64))
        out = out.astype(dtype) if out.dtype.kind == "f" else out
        return np.broadcast_to(out, shape) if shape is not None else out

    def unfused(self, dtype) -> dict:
        env = self._env(dtype, slice(None))
        values = {}
        for m in self.members:
            body = self._eval(self.bodies[m.name], env, dtype, (ROWS, LENGTH))
            values[m.name] = _REDUCE[m.monoid.name].reduce(body, axis=1)
            env[f"{m.name}.val"] = values[m.name][:, None]
        return values

    def fused(self, dtype, splits: int) -> dict:
        """Every member's value from a rolled sweep (``splits=1``) or a split update."""
        chunks = -(-LENGTH // CHUNK)
        per = -(-chunks // splits)
        bounds = [(s * per * CHUNK, min((s + 1) * per * CHUNK, LENGTH)) for s in range(splits)]
        parts = [self._sweep(dtype, lo, hi) for lo, hi in bounds if lo < LENGTH]
        if len(parts) == 1:
            return self._settle(dtype, [parts[0]], merge=False)
        return self._settle(dtype, parts, merge=True)

    def _identity(self, m, dtype) -> list[np.ndarray]:
        d = "f32" if dtype == np.float32 else "f64"
        return [np.full(ROWS, st.monoid.identity_value(0, d), dtype)
                for st in self.chain.schemes[m.name].states]

    def _symbols(self, m, states, old: dict, new: dict) -> dict:
        scheme = self.chain.schemes[m.name]
        out = {f"{m.name}#{k}": s for k, s in enumerate(states)}
        out.update({f"{d}.old": old[d] for d in scheme.deps if d in old})
        out.update({f"{d}.new": new[d] for d in scheme.deps})
        return out

    def _reference(self, m, states, refs, seen: int, dtype, row: dict) -> np.ndarray:
        env = {**row, **self._symbols(m, states, {}, refs)}
        env[EXTRAPOLATION.name] = np.asarray(LENGTH / max(seen, 1), dtype)
        return self._eval(self.chain.schemes[m.name].reference(), env, dtype)

    def _usable(self, m, value, dtype):
        usable = self.chain.schemes[m.name].usable(Symbol("__value", m.dtypes[0]))
        return self._eval(usable, {"__value": value}, dtype)

    def _sweep(self, dtype, lo: int, hi: int):
        """One part of the axis, rolled: running states and the references they are kept to."""
        row = self._env(dtype, None)
        states = {m.name: self._identity(m, dtype) for m in self.members}
        refs: dict = {}
        for m in self.members:
            if m.name in self.needed:
                refs[m.name] = self._reference(m, states[m.name], refs, 0, dtype, row)
        for start in range(lo, hi, CHUNK):
            stop = min(start + CHUNK, hi)
            chunk = self._env(dtype, slice(start, stop))
            new_refs: dict = {}
            for m in self.members:
                scheme = self.chain.schemes[m.name]
                symbols = {**row, **self._symbols(m, states[m.name], refs, new_refs)}
                at_refs = {**chunk, **{f"{d}.ref": new_refs[d][:, None] for d in scheme.deps}}
                updated = []
                for k, st in enumerate(scheme.states):
                    body = self._eval(self.states[m.name][k], at_refs, dtype, (ROWS, stop - start))
                    part = _REDUCE[st.monoid.name].reduce(body, axis=1)
                    corrected = self._eval(scheme.correct[k], symbols, dtype)
                    updated.append(_REDUCE[st.monoid.name](corrected, part).astype(dtype))
                states[m.name] = updated
                if m.name in self.needed:
                    new_refs[m.name] = self._reference(m, updated, new_refs, stop - lo, dtype, row)
            refs = new_refs
        return states, refs

    def _settle(self, dtype, parts, merge: bool) -> dict:
        """The final values: each part's states corrected from its references to the final ones
        and folded (``merge``), then corrected to the true values (the once-per-row steps)."""
        row = self._env(dtype, None)
        finals: dict = {}
        final_refs: dict = {}
        for m in self.members:
            scheme = self.chain.schemes[m.name]
            if merge:
                states = self._identity(m, dtype)
                for part_states, part_refs in parts:
                    env = {**row, **self._symbols(m, part_states[m.name], part_refs, final_refs)}
                    for k, st in enumerate(scheme.states):
                        item = self._eval(scheme.corrections(settled=True)[k], env, dtype)
                        states[k] = _REDUCE[st.monoid.name](states[k], item).astype(dtype)
                refs = final_refs
            else:
                states, refs = parts[0][0][m.name], parts[0][1]
            env = {**row, **self._symbols(m, states, refs, finals)}
            finals[m.name] = self._eval(scheme.true_value(0, settled=True), env, dtype)
            final_refs[m.name] = self._usable(m, finals[m.name], dtype)
        return finals
