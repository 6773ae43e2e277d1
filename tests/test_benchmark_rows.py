"""``benchmarks.common.checked_row``: an implementation's row only where its result, into a
poisoned output, is within tolerance of float64; one that is wrong, leaves the output alone or
raises is reported and not timed."""
from __future__ import annotations

import pytest

from benchmarks import common


def test_a_row_only_for_a_checked_result(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(common, "bench", lambda call: 2.0)
    want = torch.arange(1.0, 5.0, dtype=torch.float64)
    out, lines = torch.zeros(4), []

    def error_of(got):
        return common.relative_error(got, want)

    def writes():
        out.copy_(want)
        return out

    def poison():
        out.fill_(float("nan"))

    row = common.checked_row("b/case", "4", "tensorfuse", writes, error_of, 4e9, lines.append,
                             poison)
    assert row is not None and row.ms == 2.0 and row.tflops == 2.0
    assert common.checked_row("b/case", "4", "lazy", lambda: out, error_of, 4e9, lines.append,
                              poison) is None          # left the poisoned output alone
    assert common.checked_row("b/case", "4", "off", lambda: out * 2, error_of, 4e9,
                              lines.append) is None
    assert common.checked_row("b/case", "4", "raises", lambda: 1 / 0, error_of, 4e9,
                              lines.append) is None
    assert [line.split(": ")[1].split()[0] for line in lines[1:]] == \
        ["WRONG", "WRONG", "ZeroDivisionError"], lines
