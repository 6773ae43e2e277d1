"""Elementary functions the CPU's vector units can run: ``exp`` on f32 as a polynomial.

TVM lowers ``exp`` to LLVM's ``llvm.exp`` intrinsic, which LLVM can only vectorise through a
vector math library it is not given — so every ``exp`` in a vectorised loop becomes 16 scalar
``expf`` calls, and a softmax over 4096² elements spends 38 of its 44 ms there (2-core CPU,
2026-11-24). :func:`fast_exp` writes an f32 ``exp`` as arithmetic LLVM vectorises (the lowering
uses it where the target asks, ``TargetSpec.vector_math``):
``2**n · e**r`` with ``n = round(x·log₂e)``, ``r = x − n·ln2`` (in two parts, Cody–Waite) and a
degree-6 polynomial for ``e**r`` on ``|r| ≤ ln2/2`` (Cephes' ``expf`` coefficients, ≤ 2 ulp), the
power of two built from its exponent bits. ``-inf`` and underflow give 0, overflow and ``+inf``
give ``+inf`` (from x > 88.38, where f32's own overflow is at 88.72), NaN stays NaN.
"""
from __future__ import annotations

from tvm import tirx

_LOG2E = 1.44269504088896341
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
         5.0000001201e-1)
# above _HIGHEST: +inf (2**n must stay a normal f32, n ≤ 127: exp is finite up to 88.72, so the
# last 0.35 overflows early); below _LOWEST: 0 (2**-126 is the least normal f32)
_HIGHEST, _LOWEST = 88.3762626647949, -87.33654


def fast_exp(x: tirx.PrimExpr, bound: bool = False) -> tirx.PrimExpr:
    """``exp(x)`` for an f32 ``x`` in arithmetic and bit operations only. With ``bound``,
    ``x``, its clamped value, ``n`` and ``r`` are bound once each (``Let``): written out, the
    polynomial repeats ``x`` about thirty times, and ``x`` is often a whole score (a mask, a
    product, a running maximum made usable) — a masked attention's TensorIR grew to statements
    of 48 KB, and TVM's simplifier passes spent 14 of its 17 s of CPU build there
    (``neighborhood_attention`` on the CPU, B2 H2 S130 D16: 17 s → 3 s, the same output bit for
    bit). Where ``x`` reads a 16-bit float it is written out all the same: TVM's bf16
    legalisation does not enter a ``Let``'s value, so a bf16 load bound there would be read as
    its integer bits. MetaSchedule's flop count does not read a ``Let`` either (a tuning task's
    workload is lowered without ``bound``)."""
    f32 = "float32"
    c = (lambda v: tirx.const(v, f32))
    written_out = not bound or _reads_narrow_floats(x)
    lets = []   # (variable, value), outermost first

    def once(name: str, value: tirx.PrimExpr) -> tirx.PrimExpr:
        if written_out:
            return value
        var = tirx.Var(name, f32)
        lets.append((var, value))
        return var

    arg = once("exp_x", x)
    clamped = once("exp_c", tirx.max(tirx.min(arg, c(_HIGHEST)), c(_LOWEST)))
    n = once("exp_n", tirx.floor(clamped * c(_LOG2E) + c(0.5)))
    r = once("exp_r", clamped - n * c(_LN2_HI) - n * c(_LN2_LO))
    poly = c(_POLY[0])
    for coefficient in _POLY[1:]:
        poly = poly * r + c(coefficient)
    e_r = poly * r * r + r + c(1.0)
    bits = tirx.shift_left(tirx.Cast("int32", n) + tirx.const(127, "int32"),
                           tirx.const(23, "int32"))
    value = e_r * tirx.reinterpret(f32, bits)
    value = tirx.Select(arg < c(_LOWEST), c(0.0), value)
    value = tirx.Select(arg > c(_HIGHEST), tirx.infinity(f32), value)
    value = tirx.Select(tirx.isnan(arg), arg, value)   # NaN in, NaN out
    for var, bound_value in reversed(lets):
        value = tirx.Let(var, bound_value, value)
    return value


_NARROW = ("bfloat16", "float16", "float8")
_LEAVES = ("Var", "SizeVar", "IntImm", "FloatImm", "StringImm", "Op", "Buffer")
_CHILDREN = ("a", "b", "value", "condition", "true_value", "false_value", "body", "indices",
             "args")


def _reads_narrow_floats(e) -> bool:
    """Whether ``e`` has a 16- or 8-bit float anywhere in it (a node of an unknown kind counts
    as one)."""
    return _any_node(e, lambda node: str(getattr(node, "ty", "")).startswith(_NARROW))


def binds_variables(e) -> bool:
    """Whether ``e`` binds a variable (a ``Let``: :func:`fast_exp` with ``bound``): such an
    expression may appear once in a tree — used twice, its variables are defined twice, which
    TVM refuses as ill-formed TensorIR."""
    return _any_node(e, lambda node: type(node).__name__ == "Let")


def _any_node(e, found) -> bool:
    """Whether ``found(node)`` holds for a node of ``e`` (a node of an unknown kind counts)."""
    seen: set[int] = set()   # nodes by their handles (a TVM object's hash): shared ones once
    todo = [e]
    while todo:
        node = todo.pop()
        if hash(node) in seen:
            continue
        seen.add(hash(node))
        if found(node):
            return True
        kind = type(node).__name__
        if kind in _LEAVES:
            continue
        children = [getattr(node, name) for name in _CHILDREN if hasattr(node, name)]
        if not children:
            return True
        for child in children:   # lists of expressions (indices, arguments) arrive as Arrays
            todo.extend(child if type(child).__name__ in ("Array", "list", "tuple") else [child])
    return False
