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


def test_a_bandwidth_rows_note_sets_it_beside_a_copy_of_the_same_bytes(monkeypatch):
    """The kernel suites' rows (``kernel_suite._timed``): a bandwidth-bound case's tensorfuse row
    says what a copy moving the same bytes reaches, timed alike; a case timed in TFLOP/s and the
    alternatives' rows do not."""
    pytest.importorskip("torch")
    from benchmarks import kernel_suite

    copies = []
    monkeypatch.setattr(kernel_suite, "checked_output", lambda call, ref, label, log, pick:
                        (call(), 1e-3))
    monkeypatch.setattr(kernel_suite, "same_bytes_copy",
                        lambda moved: copies.append(moved) or 4000.0)
    monkeypatch.setattr(kernel_suite, "alternated", lambda calls, rounds, rep_ms:
                        {label: [call()] * rounds for label, call in calls.items()})
    ceilings = {"copy_tbps": 4.0, "gemm_tflops": 700.0}
    calls = {"tensorfuse": lambda: 0.05, "torch_compile": lambda: 0.1}
    rows = kernel_suite._timed(kernel_suite.Case("rows", "4", None, {}, None, None, bytes=1.6e8),
                               calls, ceilings, lambda line: None)
    assert copies == [1.6e8]
    assert rows[0].note.endswith("a copy of the same bytes: 4000 GB/s (80% of it)"), rows[0].note
    assert "copy" not in rows[1].note
    rows = kernel_suite._timed(kernel_suite.Case("gemm", "4", None, {}, None, None, flops=1e12),
                               calls, ceilings, lambda line: None)
    assert copies == [1.6e8] and "copy" not in rows[0].note


def test_a_suite_kernels_time_is_the_median_of_rounds_taken_in_turns(monkeypatch):
    """``kernel_suite._timed``: every implementation checked (and timed once) first, a wrong one
    left out, then the rest timed in turns over the further rounds; each row the median of its
    rounds, so one slow round (the GPU disturbed as a kernel's timings start) moves nothing."""
    pytest.importorskip("torch")
    from benchmarks import kernel_suite

    firsts = {"tensorfuse": 0.08, "sdpa": 0.07, "wrong": None}
    monkeypatch.setattr(kernel_suite, "checked_output", lambda call, ref, label, log, pick:
                        None if firsts[label.split()[0]] is None else
                        (firsts[label.split()[0]], 1e-3))
    turns = []

    def alternated(calls, rounds, rep_ms):
        turns.append((list(calls), rounds))
        return {"tensorfuse": [0.05, 0.051], "sdpa": [0.068, 0.069]}

    monkeypatch.setattr(kernel_suite, "alternated", alternated)
    calls = dict.fromkeys(firsts, lambda: None)
    rows = kernel_suite._timed(kernel_suite.Case("decode", "4", None, {}, None, None, flops=1e9),
                               calls, {"gemm_tflops": 700.0}, lambda line: None)
    assert turns == [(["tensorfuse", "sdpa"], kernel_suite.ROUNDS - 1)]
    assert [(r.implementation, r.ms) for r in rows] == [("tensorfuse", 0.051), ("sdpa", 0.069)]


def test_decode_sweeps_time_every_checked_implementation_in_alternated_rounds(monkeypatch):
    """``benchmarks.decode_splits``: each implementation checked first (a wrong one is not
    timed), then all timed taking turns, each reported at its best round."""
    torch = pytest.importorskip("torch")
    from benchmarks import decode_splits

    monkeypatch.setattr(decode_splits, "_copy_tbps", lambda: 4.0)
    order, checks = [], []
    turns = iter([5.0, 9.0, 3.0, 8.0, 4.0, 7.0])   # a, b, a, b, a, b
    want = torch.ones(3, dtype=torch.float64)

    def implementation(label, result):
        def call():
            checks.append(label)
            return result
        call.label = label
        return call

    def timing(fn, rep_ms):
        order.append((fn.label, len(checks)))   # every check made before any timing
        return next(turns)
    monkeypatch.setattr(common, "bench", timing)
    impls = {label: implementation(label, result)
             for label, result in (("a", want), ("b", want), ("wrong", 2 * want))}
    rows, lines = [], []
    timed = decode_splits._measure("decode_splits/mqa", "B1", impls, want, 4_000_000, rows,
                                   lines.append)
    assert order == [("a", 3), ("b", 3)] * decode_splits.ROUNDS
    assert timed == {"a": 3.0, "b": 7.0}
    assert [(r.implementation, r.ms) for r in rows] == [("a", 3.0), ("b", 7.0)]
    assert "WRONG" in lines[0]


def test_best_alternated_takes_turns_and_leaves_out_a_call_that_cannot_be_timed():
    turns, told = [], []

    def timing(fn, rep_ms):
        turns.append(fn())
        if turns[-1] == "uncapturable" and len(turns) > 3:
            raise RuntimeError("operation not permitted when stream is capturing")
        return {"a": [4.0, 2.0, 3.0], "uncapturable": [1.0]}[turns[-1]][turns.count(turns[-1]) - 1]
    best = common.best_alternated({"a": lambda: "a", "uncapturable": lambda: "uncapturable"}, 3,
                                  timing, 10, lambda label, why: told.append((label, why)))
    assert best == {"a": 2.0}
    assert turns == ["a", "uncapturable", "a", "uncapturable", "a"]
    assert told == [("uncapturable", "RuntimeError: operation not permitted when stream is "
                                     "capturing")]
