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


def fast_exp(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """``exp(x)`` for an f32 ``x`` in arithmetic and bit operations only."""
    f32 = "float32"
    c = (lambda v: tirx.const(v, f32))
    clamped = tirx.max(tirx.min(x, c(_HIGHEST)), c(_LOWEST))
    n = tirx.floor(clamped * c(_LOG2E) + c(0.5))
    r = clamped - n * c(_LN2_HI) - n * c(_LN2_LO)
    poly = c(_POLY[0])
    for coefficient in _POLY[1:]:
        poly = poly * r + c(coefficient)
    e_r = poly * r * r + r + c(1.0)
    bits = tirx.shift_left(tirx.Cast("int32", n) + tirx.const(127, "int32"),
                           tirx.const(23, "int32"))
    value = e_r * tirx.reinterpret(f32, bits)
    value = tirx.Select(x < c(_LOWEST), c(0.0), value)
    value = tirx.Select(x > c(_HIGHEST), tirx.infinity(f32), value)
    return tirx.Select(tirx.isnan(x), x, value)   # NaN in, NaN out
