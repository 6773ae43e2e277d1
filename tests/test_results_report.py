"""The results as current tables: ``benchmarks/RESULTS.md`` and the README's results table are
what ``python -m benchmarks.report`` writes from the committed CSVs, byte for byte; the report
takes the newest run of each benchmark on each device and compares tensorfuse with the fastest
alternative of the same case."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from benchmarks.common import Row, canonical_label, is_alternative, write_csv
from benchmarks.report import _results, readme_table, results_markdown

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ["benchmark", "shape", "implementation", "ms", "tflops", "gbps", "fraction_of_ceiling",
          "note"]


def test_results_and_readme_are_what_the_report_writes():
    done = subprocess.run([sys.executable, "-m", "benchmarks.report", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_session_history_in_the_results():
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    assert "session" not in text.lower()
    assert not [p.name for p in (ROOT / "benchmarks" / "results").iterdir()
                if "session" in p.name.lower()]


def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for r in rows:
            writer.writerow({**dict.fromkeys(FIELDS, "0"), "note": "", **r})


def test_the_newest_run_of_each_benchmark_and_device_is_reported(tmp_path):
    old = [{"benchmark": "attention/full", "shape": "S4096", "implementation": "tensorfuse",
            "ms": "2.0", "tflops": "300"}]
    new = [{"benchmark": "attention/full", "shape": "S4096", "implementation": "tensorfuse",
            "ms": "1.0", "tflops": "600", "fraction_of_ceiling": "0.9"},
           {"benchmark": "attention/full", "shape": "S4096", "implementation": "sdpa_cudnn",
            "ms": "1.25", "tflops": "480"},
           {"benchmark": "attention/full", "shape": "S4096", "implementation": "flex_attention",
            "ms": "1.5", "tflops": "400"}]
    _write(tmp_path / "2026-01-01-GPU_A-hopper-attention.csv", old)
    _write(tmp_path / "2026-02-01-GPU_A-hopper-attention.csv", new)
    _write(tmp_path / "2026-01-15-GPU_B-hopper-attention.csv", old)
    found = _results(str(tmp_path))
    assert sorted(found["hopper-attention"]) == ["GPU_A", "GPU_B"]
    assert found["hopper-attention"]["GPU_A"].endswith("2026-02-01-GPU_A-hopper-attention.csv")
    text = results_markdown(found)
    want = "| attention/full | S4096 | tensorfuse | 1.0000 | 600 TFLOP/s | 1.25× sdpa cudnn | 90% |"
    assert want in text
    assert text == results_markdown(_results(str(tmp_path)))   # nothing but the CSVs in it
    table = readme_table(found)
    assert "| attention/full | S4096 | GPU A | 600 TFLOP/s | sdpa cudnn (480 TFLOP/s) | 1.25× |" \
        in table
    assert "GPU B" not in table   # its run timed no alternative: nothing to compare


def test_a_run_that_measured_nothing_leaves_the_run_before_it_current(tmp_path):
    rows = [Row("attention/full", "S4096", "tensorfuse", 1.0, 600.0, 0.0, 0.9)]
    write_csv(rows, str(tmp_path / "2026-01-01-GPU_A-hopper-attention.csv"))
    write_csv([], str(tmp_path / "2026-02-01-GPU_A-hopper-attention.csv"))
    assert (tmp_path / "2026-02-01-GPU_A-hopper-attention.csv").read_text().strip() == \
        ",".join(FIELDS)   # the header alone: the run says it measured nothing
    found = _results(str(tmp_path))
    assert found["hopper-attention"]["GPU_A"].endswith("2026-01-01-GPU_A-hopper-attention.csv")


def test_labels_have_one_spelling():
    assert canonical_label("sdpa_cudnn") == canonical_label("sdpa cudnn") == "sdpa cudnn"
    assert canonical_label("torch.compile") == "torch_compile"
    assert canonical_label("tensorfuse (tf.compile)") == "tensorfuse"
    assert canonical_label("tensorfuse_hopper_64_graph") == "tensorfuse hopper 64 graph"
    assert is_alternative("flex_attention") and not is_alternative("tensorfuse_triton")


def test_a_table_of_three_cases_or_more_gives_the_geometric_mean_and_the_slowest():
    from benchmarks.report import _groups, geomean_line

    rows = [{"benchmark": f"user/{case}", "shape": "s", "implementation": label, "ms": ms}
            for case, ours, theirs in (("a", "1.0", "2.0"), ("b", "2.0", "1.0"),
                                       ("c", "1.0", "4.0"))
            for label, ms in (("tensorfuse", ours), ("torch_compile", theirs))]
    assert geomean_line(_groups(rows)) == ("Geometric mean of `tensorfuse` against the best "
                                           "alternative over 3 cases: 1.587× (lowest: user/b, "
                                           "0.50×).")
    assert geomean_line(_groups(rows[:4])) == ""   # two cases: no mean
    tuned = rows + [{"benchmark": f"user/{case}", "shape": "s", "implementation":
                     "tensorfuse tuned", "ms": "1.0"} for case in "abc"]
    assert geomean_line(_groups(tuned)).splitlines()[1] == (
        "Geometric mean of `tensorfuse tuned` against the best alternative over 3 cases: 2.000× "
        "(lowest: user/b, 1.00×).")


def test_a_newer_plain_table_part_leaves_an_older_plain_table_whole(tmp_path):
    """A tuning job's tables have their own columns (no ``benchmark``): a newer CSV whose name
    extends an older one's (``…-tuning-gpus-together`` beside ``…-tuning-gpus``) supersedes
    none of its rows, and the report still writes both."""
    for name, job in (("2026-01-01-GPU_A-tuning-gpus.csv", "softmax"),
                      ("2026-02-01-GPU_A-tuning-gpus-together.csv", "decode + softmax")):
        with open(tmp_path / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["job", "job_s", "gpus"])
            writer.writeheader()
            writer.writerow({"job": job, "job_s": "20.0", "gpus": "2"})
    text = results_markdown(_results(str(tmp_path)))
    assert "| softmax | 20.0 | 2 |" in text and "| decode + softmax | 20.0 | 2 |" in text


def test_the_cases_behind_are_listed_from_the_newest_runs_furthest_behind_first(tmp_path):
    """A case slower than 0.97× its fastest alternative is listed, one at 0.98× is not; a case
    and shape in two benchmarks counts as the newer run says (here: no longer behind); a case an
    older run has but a newer part run again (``<benchmark>-<part>``) as the part says; another
    device's runs on their own."""
    from benchmarks.report import behind, behind_table

    def case(name, ours, theirs, shape="s"):
        return [{"benchmark": name, "shape": shape, "implementation": "tensorfuse", "ms": ours,
                 "gbps": "100"},
                {"benchmark": name, "shape": shape, "implementation": "torch_compile",
                 "ms": theirs, "gbps": "200"}]

    _write(tmp_path / "2026-01-01-GPU_A-suite.csv",
           case("user/far", "2.0", "1.0") + case("user/near", "1.02", "1.0") +
           case("user/rerun", "2.0", "1.0") + case("user/shared", "4.0", "1.0"))
    _write(tmp_path / "2026-01-02-GPU_A-suite-rerun.csv", case("user/rerun", "1.0", "1.0"))
    _write(tmp_path / "2026-01-03-GPU_A-sweep.csv", case("user/shared", "1.0", "1.0") +
           case("user/mid", "1.25", "1.0"))
    _write(tmp_path / "2025-12-01-GPU_B-suite.csv", case("user/other", "9.0", "1.0"))
    found = _results(str(tmp_path))
    listed = behind(found)
    assert [(e[1], e[3], round(e[0], 2), e[7]) for e in listed] == [
        ("user/other", "GPU B", 0.11, "2025-12-01"), ("user/far", "GPU A", 0.5, "2026-01-01"),
        ("user/mid", "GPU A", 0.8, "2026-01-03")]
    table = behind_table(listed)
    assert ("| user/far | s | GPU A | 100 GB/s | torch_compile (200 GB/s) | 0.50× | "
            "2026-01-01 suite |") in table.splitlines()
    assert "Where tensorfuse is behind" in results_markdown(found)
