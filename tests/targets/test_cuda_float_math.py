"""The float math the templates write in CUDA C++ (``targets/cuda/expr.py``: epilogues, score
modifications, decode bounds) computes what the DSL means: every unary and binary operation,
comparison, selection and cast, emitted for two float scalars, compiled as host C++ with the
device intrinsics spelled as their host functions (``__expf`` as ``expf``: the mapping checked,
not the intrinsics' precision) and compared with Python's float64 math on values of both signs,
tiny and large. ``tanh`` is inline PTX (its own test reads the instruction); 16-bit casts need
cuda_bf16.h (``test_cuda_casts``)."""
from __future__ import annotations

import math

import pytest

from tensorfuse.dsl.expr import Cast, Scalar, binary, compare, unary, where
from tensorfuse.targets.cuda.expr import scalar_name, to_cuda
from tests.helpers import host_compiler, run_host_program

COMPILER = host_compiler()
HOST = ("#include <cmath>\n#include <cstdio>\n#define __expf expf\n#define __logf logf\n"
        "#define __sinf sinf\n#define __cosf cosf\n#define __fdividef(a, b) ((a) / (b))\n"
        "#define rsqrtf(a) (1.0f / sqrtf(a))\n")
PAIRS = [(x, y) for x in (-7.5, -1.0, -0.3, 0.25, 1.0, 2.5, 40.0)
         for y in (-2.0, -0.5, 0.75, 3.0)]


def _sigmoid(a: float) -> float:
    return 1.0 / (1.0 + math.exp(-a))


def _expressions():
    """(name, the DSL expression of x and y, the same in Python, whether x must be positive)."""
    x, y = Scalar("x", "f32"), Scalar("y", "f32")
    return [
        ("exp", unary("exp", x), lambda a, b: math.exp(a), False),
        ("exp2", unary("exp2", x), lambda a, b: 2.0 ** a, False),
        ("log", unary("log", x), lambda a, b: math.log(a), True),
        ("log2", unary("log2", x), lambda a, b: math.log2(a), True),
        ("sqrt", unary("sqrt", x), lambda a, b: math.sqrt(a), True),
        ("rsqrt", unary("rsqrt", x), lambda a, b: 1 / math.sqrt(a), True),
        ("abs", unary("abs", x), lambda a, b: abs(a), False),
        ("erf", unary("erf", x), lambda a, b: math.erf(a), False),
        ("sigmoid", unary("sigmoid", x), lambda a, b: _sigmoid(a), False),
        ("floor", unary("floor", x), lambda a, b: math.floor(a), False),
        ("ceil", unary("ceil", x), lambda a, b: math.ceil(a), False),
        ("round", unary("round", x), lambda a, b: float(round(a)), False),   # halves to even
        ("sin", unary("sin", x), lambda a, b: math.sin(a), False),
        ("cos", unary("cos", x), lambda a, b: math.cos(a), False),
        ("neg", -x, lambda a, b: -a, False),
        ("add", x + y, lambda a, b: a + b, False),
        ("sub", x - y, lambda a, b: a - b, False),
        ("rsub", 1.5 - x, lambda a, b: 1.5 - a, False),
        ("mul", x * y, lambda a, b: a * b, False),
        ("div", x / y, lambda a, b: a / b, False),
        ("rdiv", 2.0 / y, lambda a, b: 2.0 / b, False),
        ("max", binary("max", x, y), lambda a, b: max(a, b), False),
        ("min", binary("min", x, y), lambda a, b: min(a, b), False),
        ("pow", binary("pow", x, y), lambda a, b: a ** b, True),
        ("lt", compare("lt", x, y), lambda a, b: float(a < b), False),
        ("ge", compare("ge", x, y), lambda a, b: float(a >= b), False),
        ("eq", compare("eq", x, x), lambda a, b: 1.0, False),
        ("ne", compare("ne", x, y), lambda a, b: float(a != b), False),
        ("where", where(compare("gt", x, y), x * 2.0, y - 1.0),
         lambda a, b: a * 2 if a > b else b - 1, False),
        ("and", compare("gt", x, 0.0) & compare("lt", y, 0.0),
         lambda a, b: float(a > 0 and b < 0), False),
        ("cast f32", Cast(x * y, "f32"), lambda a, b: a * b, False),
        ("cast i32", Cast(x * y, "i32"), lambda a, b: float(int(a * b)), False),
        ("cast bool", Cast(x * 0.1, "bool"), lambda a, b: float(a * 0.1 != 0), False),
    ]


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler on this machine")
def test_float_math_computes_what_the_dsl_means(tmp_path):
    cases = _expressions()
    x, y = scalar_name("x"), scalar_name("y")
    body = "\n".join(   # x of both signs, or its magnitude where the operation wants one
        f"  for (int n = 0; n < {len(PAIRS)}; ++n) {{ const float {x} = "
        f"{'fabsf(P[n][0])' if positive else 'P[n][0]'}, {y} = P[n][1]; "
        f'printf("%.9g ", (double)({to_cuda(e, {}, name)})); }}\n  printf("\\n");'
        for name, e, _, positive in cases)
    table = ", ".join(f"{{{a!r}f, {b!r}f}}" for a, b in PAIRS)
    lines = run_host_program(f"{HOST}static const float P[][2] = {{{table}}};\n"
                             f"int main() {{\n{body}\n  return 0;\n}}\n", tmp_path)
    assert len(lines) == len(cases)
    for (name, _, python, positive), line in zip(cases, lines):
        for (a, b), text in zip(PAIRS, line.split()):
            a = abs(a) if positive else a
            want, got = python(a, b), float(text)
            assert math.isclose(got, want, rel_tol=2e-6, abs_tol=1e-6), (name, a, b, got, want)
