"""Numerical check of every derived correction, in float64, on random values.

Whatever rule produced a scheme (built in or a user's), it is only used if, for random data and
random old/new dependency values, correcting an element's state from the old values gives the state
computed directly at the new values, and the scheme's value formula gives the reduced value. The
data are modelled by independent random values for every leaf (tensor element, axis value, other
intermediate), which checks the identity for all data, not only for one program's inputs.
"""
from __future__ import annotations

import numpy as np

from ..dsl import dtypes as dt
from ..dsl.evaluate import evaluate_plain
from ..dsl.expr import Axis, DimSize, Expr, Load, Ref, Scalar, Symbol
from .exprs import nodes, substitute
from .schemes import Scheme
from .transfer import Context, NoCorrection

SAMPLES = 96


def _growth_checks(scheme: Scheme, corrections) -> list:
    """For linear and affine (max/min) schemes, the states whose basis holds an exponential:
    correcting a unit state (that state 1, the others 0) gives its own factor, which should not
    exceed 1 (earlier elements rounded to zero, or a running maximum of exponentials that
    overflowed, cannot be recovered)."""
    if scheme.kind not in ("linear", "affine"):
        return []
    checks = []
    for k, st in enumerate(scheme.states):
        if any(getattr(n, "op", None) in ("exp", "exp2") for n in nodes(st.body)):
            unit = {f"{scheme.name}#{i}": np.asarray(1.0 if i == k else 0.0)
                    for i in range(len(scheme.states))}
            zero = {f"{scheme.name}#{i}": np.asarray(0.0) for i in range(len(scheme.states))}
            checks.append((k, unit, zero))
    return checks


class _Leaves:
    """Names random stand-ins for the data an expression reads."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.by_key: dict = {}
        self.carried = {name: self.symbolic(sc.correct[0], "new")
                        for name, sc in ctx.schemes.items() if _rescaled_sum(name, sc, ctx)}

    def symbolic(self, e: Expr, deps_as: str) -> Expr:
        def replace(n: Expr):
            if isinstance(n, Ref) and n.compute.name in self.ctx.deps:
                return Symbol(f"{n.compute.name}.{deps_as}", n.dtype)
            if isinstance(n, (Load, Ref, Axis, Scalar, DimSize)):
                key = n.key()
                if key not in self.by_key:
                    self.by_key[key] = Symbol(f"leaf{len(self.by_key)}", n.dtype)
                return self.by_key[key]
            return None

        return substitute(e, replace)

    def draw(self, rng: np.random.Generator) -> dict:
        env = {}
        for sym in self.by_key.values():
            d = dt.resolve(sym.dtype)
            if d == "bool":
                env[sym.name] = np.asarray(rng.random() < 0.5)
            elif dt.is_int(d):
                env[sym.name] = np.asarray(int(rng.integers(0, 8)), np.int64)
            else:
                env[sym.name] = np.asarray(rng.normal() * 1.5)
        for name, dep in self.ctx.deps.items():
            positive = name in self.ctx.positive
            old = rng.uniform(0.3, 4.0) if positive else rng.normal() * 2.0
            step = 0.0 if rng.random() < 0.2 else abs(rng.normal())
            kind = dep.monoid.name if dep.monoid is not None else ""
            # running values of a max or a log-sum-exp, or of a sum of non-negative terms, only
            # rise (a min only falls) — unless they depend on other members, which can move
            # them either way
            monotone = name in self.ctx.independent
            grows = monotone and (kind in ("max", "logsumexp") or (kind == "sum" and positive))
            new = old + step if grows else old + rng.normal() * 2.0
            if monotone and kind == "min":
                new = old - step
            if name in self.carried:   # what the old terms come to at the new references, and more
                state = {f"{name}#0": np.asarray(old)}
                new = float(evaluate_plain(self.carried[name], {**env, **state})) + step
            env[f"{name}.old"], env[f"{name}.new"] = np.asarray(old), np.asarray(new)
        return env


def _rescaled_sum(name: str, scheme: Scheme, ctx: Context) -> bool:
    """Whether ``name`` is a sum of non-negative terms kept relative to other members (``Σ
    exp(x − m)``: a softmax's normaliser): its one state is its value, so the terms seen so far,
    read at new references, come to its own correction of the old value — and the terms seen
    since add to that. Drawn so (:meth:`_Leaves.draw`), ``log l + m`` only rises, as it does on
    any data, and a correction through it is not taken for one that can grow."""
    return (scheme.kind == "linear" and bool(scheme.deps) and len(scheme.states) == 1
            and scheme.compute.monoid.name == "sum" and name in ctx.positive
            and len(scheme.value) == 1 and isinstance(scheme.value[0], Symbol)
            and scheme.value[0].name == f"{name}#0")


def _close(a, b) -> bool | None:
    """True/False when both are finite; None when the sample is outside the functions' domain."""
    a, b = float(a), float(b)
    if not (np.isfinite(a) and np.isfinite(b)):
        return None
    return abs(a - b) <= 1e-7 * max(1.0, abs(a), abs(b))


SHORT = 160   # characters of a correction a warning quotes


def _short(expr) -> str:
    """``expr`` as text, cut at :data:`SHORT` characters: a correction of a member that reads
    logsumexps runs to kilobytes once they are written out in maxima and sums."""
    text = repr(expr)
    return text if len(text) <= SHORT else text[:SHORT] + " …"


def verify_scheme(scheme: Scheme, body: Expr, ctx: Context, seed: int = 0) -> None:
    """Raise :class:`NoCorrection` if the scheme's corrections or value are numerically wrong."""
    if not scheme.deps or scheme.kind == "reset":
        return
    leaves = _Leaves(ctx)
    at_new = [leaves.symbolic(st.body, "new") for st in scheme.states]
    at_old = [leaves.symbolic(st.body, "old") for st in scheme.states]
    f_new = leaves.symbolic(body, "new")
    corrections = [leaves.symbolic(c, "new") for c in scheme.correct]
    value = leaves.symbolic(scheme.value[0], "new")
    rng = np.random.default_rng(seed)
    checked = 0
    growth = _growth_checks(scheme, corrections)
    grows: set[int] = set()
    for _ in range(SAMPLES):
        env = leaves.draw(rng)
        state_old = {f"{scheme.name}#{k}": evaluate_plain(e, env) for k, e in enumerate(at_old)}
        state_new = {f"{scheme.name}#{k}": evaluate_plain(e, env) for k, e in enumerate(at_new)}
        if scheme.kind == "power":  # one element seen: count 1
            state_old[f"{scheme.name}#1"] = state_new[f"{scheme.name}#1"] = np.asarray(1.0)
        verdicts = []
        for k, corr in enumerate(corrections):
            got = evaluate_plain(corr, {**env, **state_old})
            verdicts.append((_close(got, state_new[f"{scheme.name}#{k}"]), f"state {k}", corr))
        got = evaluate_plain(value, {**env, **state_new})
        verdicts.append((_close(got, evaluate_plain(f_new, env)), "value", scheme.value[0]))
        if any(v is None for v, _, _ in verdicts):
            continue
        for ok, what, expr in verdicts:
            if not ok:
                raise NoCorrection(body, f"the derived correction for {what} of {scheme.name} "
                                         f"fails a numerical check (a rule is wrong): {expr!r}")
        checked += 1
        for k, unit, zero in growth:  # the factor on the state (a shift δ is no growth)
            factor = float(evaluate_plain(corrections[k], {**env, **unit})) - \
                float(evaluate_plain(corrections[k], {**env, **zero}))
            if factor > 1.0 + 1e-9:
                grows.add(k)
    if grows:
        import warnings

        from ..errors import RollingUpdateWarning

        from ..dsl.expr import user_location

        deps = ", ".join(scheme.deps)
        where_ = user_location()
        warning = RollingUpdateWarning(
            f"{scheme.name}: the correction {_short(scheme.correct[min(grows)])} can exceed 1 "
            f"when {deps} move the way they can here (e.g. a sum of signed values that "
            "decreases); elements reduced earlier may have been rounded to zero and cannot be "
            "recovered. The fused result is exact in exact arithmetic; check its precision, or "
            "fuse against a running maximum instead")
        warning.member = scheme.name   # one warning a member of a program (chain.plan_chain)
        warnings.warn_explicit(warning, RollingUpdateWarning,
                               where_.filename if where_ else "<tensorfuse>",
                               where_.lineno if where_ else 0)
    if checked < 8:
        raise NoCorrection(body, "the derived correction could not be checked numerically: its "
                                 "functions are undefined on almost every random sample")
