"""Integer ``//`` and ``%`` in the CUDA C++ the templates write from the DSL floor as the DSL does
(C++ truncates towards zero), and an integer ``minimum``/``maximum`` (a distance clamped to a
table's last bucket) stays an integer (``fminf`` made it a float, and nvcc then refused the
clamp of the table's index around it, ``max(float, int)``): the emitted expressions are compiled
as host C++ here and evaluated over negative and positive operands, against Python's own."""
from __future__ import annotations

import pytest

from tensorfuse import dsl as T
from tensorfuse.dsl.expr import Scalar
from tensorfuse.targets.cuda.expr import scalar_name, to_cuda

from tests.helpers import host_compiler, run_host_program

COMPILER = host_compiler()


def _expressions():
    """(name, the DSL expression over axes i, j and the integer scalar w, the same in Python)."""
    i, j = T.axes("i j")
    w = Scalar("w", "i32")
    return [
        ("difference // 3", (i - j) // 3, lambda i, j, w: (i - j) // 3),
        ("difference % 3", (i - j) % 3, lambda i, j, w: (i - j) % 3),
        ("difference // w", (j - i) // w, lambda i, j, w: (j - i) // w),
        ("difference % w", (j - i) % w, lambda i, j, w: (j - i) % w),
        ("divisible", (i - j) % 4 == 0, lambda i, j, w: (i - j) % 4 == 0),
        ("index // w", i // w, lambda i, j, w: i // w),
        ("index % w", i % w, lambda i, j, w: i % w),
        ("negated // 5", (-i) // 5, lambda i, j, w: (-i) // 5),
        ("distance clamped", T.minimum(i - j, w + 2), lambda i, j, w: min(i - j, w + 2)),
        ("distance from 0", T.maximum(T.minimum(i - j, 7), 0) % 5,
         lambda i, j, w: max(min(i - j, 7), 0) % 5),
    ]


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler on this machine")
def test_integer_division_floors_as_the_dsl_does(tmp_path):
    cases = _expressions()
    points = [(i, j, w) for i in range(0, 13) for j in range(0, 13) for w in (1, 3, 4)]
    body = "\n".join(
        f'  for (int n = 0; n < {len(points)}; ++n) {{ const int i = P[n][0], j = P[n][1], '
        f'{scalar_name("w")} = P[n][2]; printf("%d ", '
        f'(int)({to_cuda(e, {}, name, axes={"i": "i", "j": "j"})})); '
        f'}}\n  printf("\\n");' for name, e, _ in cases)
    table = ", ".join(f"{{{i}, {j}, {w}}}" for i, j, w in points)
    lines = run_host_program(f"#include <cstdio>\n#include <algorithm>\nusing std::max;\n"
                             f"using std::min;\nstatic const int P[][3] = {{{table}}};\n"
                             f"int main() {{\n{body}\n  return 0;\n}}\n", tmp_path)
    for (name, _, python), line in zip(cases, lines):
        got = [int(x) for x in line.split()]
        want = [int(python(i, j, w)) for i, j, w in points]
        assert got == want, name
