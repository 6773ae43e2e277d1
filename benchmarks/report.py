"""The results as current tables: ``benchmarks/RESULTS.md`` and the README's results table and
its cases furthest behind, written from the newest CSV of each benchmark on each device in
``benchmarks/results/`` (in the sections and order of :mod:`benchmarks.report_sections`); and
the plots the benchmarks draw of their CSVs.

    python -m benchmarks.report            # write RESULTS.md and the README's tables
    python -m benchmarks.report --check    # exit 1 where either differs from what it would write

A CSV is named ``<date>-<device>-<benchmark>.csv`` (``common.write_csv``); the output depends on
the CSVs alone (no time of generation), so the committed files reproduce byte for byte.
"""
from __future__ import annotations

import csv
import os
import sys

from benchmarks.report_sections import HEADLINES, SECTIONS


def load(path: str) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _bar_chart(path: str, out: str, groups: list, impls: list, value, labels: list[str],
               ylabel: str, parity: bool = False, inches_per_group: float = 1.0,
               lines: tuple = ()) -> None:
    """Grouped bars: ``value(impl, group)`` for every implementation in every group; ``lines``:
    further horizontal lines (a bar to meet)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, len(groups) * inches_per_group), 5))
    width = 0.8 / max(1, len(impls))
    for k, impl in enumerate(impls):
        ax.bar([g + k * width for g in range(len(groups))], [value(impl, g) for g in groups],
               width, label=impl)
    for at in ((1.0,) if parity else ()) + tuple(lines):
        ax.axhline(at, color="black", linewidth=0.8, linestyle="-" if at == 1.0 else "--")
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars
    ax.set_title(path.rsplit("/", 1)[-1].replace(".csv", ""))
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def _ms(rows: list, impl: str, bench: str, shape: str, field: str = "ms") -> float | None:
    hit = [float(r[field]) for r in rows if r["implementation"] == impl
           and r["benchmark"] == bench and r["shape"] == shape]
    return hit[0] if hit else None


def plot(path: str, out: str, prefix: str = "attention/",
         ylabel: str = "TFLOP/s (unmasked FLOPs)") -> None:
    """Attention TFLOP/s per variant and size (``prefix``: ``attention_bwd/`` for the backward
    passes, whose rows count the mask's FLOPs only)."""
    rows = [r for r in load(path) if r["benchmark"].startswith(prefix)]
    if not rows:
        return
    groups = sorted({(r["benchmark"], r["shape"]) for r in rows},
                    key=lambda g: (int(g[1].split("S")[1].split()[0]), g[0]))
    _bar_chart(path, out, groups, sorted({r["implementation"] for r in rows}),
               lambda impl, g: _ms(rows, impl, *g, field="tflops") or 0.0,
               [f"{b.split('/')[1]}\nS={s.split('S')[1].split()[0]}" for b, s in groups],
               ylabel)


def plot_neighborhood(paths: list[str], out: str, bar: float = 2.5) -> None:
    """Neighbourhood attention (``benchmarks.neighborhood`` CSVs, eager and ``_graph`` rows):
    each implementation's speed-up over FlexAttention timed the same way, per case, with the
    issue's bar."""
    rows = [r for path in paths for r in load(path)
            if r["benchmark"].startswith("attention/neighborhood")]
    groups = list(dict.fromkeys(r["benchmark"] for r in rows))

    def flex(bench: str, graph: bool) -> float | None:
        hit = [float(r["ms"]) for r in rows if r["benchmark"] == bench and r["implementation"]
               == "flex_attention" + ("_graph" if graph else "")]
        return hit[0] if hit else None

    impls = [i for i in dict.fromkeys(r["implementation"] for r in rows)
             if not i.startswith("flex") and "flat" not in i]

    def speedup(impl: str, bench: str) -> float:
        ms = [float(r["ms"]) for r in rows if r["benchmark"] == bench and
              r["implementation"] == impl]
        base = flex(bench, impl.endswith("_graph"))
        return base / ms[0] if ms and base else 0.0

    _bar_chart(paths[0], out, groups, impls, speedup,
               [g.split("/", 2)[2].replace("/", "\n") for g in groups],
               "× FlexAttention (same timing)", parity=True, lines=(bar,),
               inches_per_group=1.1)


def plot_rows_sweep(path: str, out: str,
                    impls: tuple = ("keep", "reload", "torch.compile")) -> None:
    """``benchmarks.rows_sweep`` rows: the fraction of the copy ceiling per kernel and shape for
    each implementation (``--reload``: the row kept in registers, read again, torch.compile)."""
    rows = [r for r in load(path) if r["implementation"] in impls]   # not the read ceilings
    groups = sorted({(r["benchmark"], r["shape"]) for r in rows})
    _bar_chart(path, out, groups, list(impls),
               lambda impl, g: float(next((r["fraction_of_ceiling"] for r in rows
                                           if r["implementation"] == impl
                                           and (r["benchmark"], r["shape"]) == g), 0.0)),
               [f"{b.split('/')[1]}\n{s.split()[0]}" for b, s in groups],
               "fraction of the copy ceiling", inches_per_group=0.9)


def plot_gemm(path: str, out: str, impls: tuple = ("cublas", "torch.compile")) -> None:
    """GEMM TFLOP/s per shape and weight layout for cuBLAS, torch.compile and the tensorfuse
    rows (every implementation whose name starts with ``tensorfuse`` unless ``impls`` names
    them)."""
    rows = [r for r in load(path) if r["benchmark"] == "gemm"]
    if not rows:   # the FFN blocks: one group per (block, M)
        rows = [dict(r, shape=f"{r['benchmark']} {r['shape']}", benchmark="gemm")
                for r in load(path) if r["benchmark"].startswith("ffn")]
    groups = list(dict.fromkeys(r["shape"] for r in rows))
    names = list(dict.fromkeys(r["implementation"] for r in rows))
    shown = [i for i in names if i in impls or (i.startswith("tensorfuse") and
                                                  not any(x.startswith("tensorfuse") for x in impls))]
    _bar_chart(path, out, groups, shown,
               lambda impl, g: _ms(rows, impl, "gemm", g, field="tflops") or 0.0,
               [g.replace("/", "\n").replace(" ", "\n") for g in groups], "TFLOP/s")


def plot_cpu(path: str, out: str, prefix: str = "cpu/") -> None:
    """The CPU benchmark (``cpu/<kernel>``; ``cpu_tuned/<kernel>`` for benchmarks/cpu_tuning.py):
    each implementation's speed relative to torch (its ``torch``/``torch sdpa`` row) per kernel
    and shape; 1.0 is parity, 1/3 the attention bar."""
    rows = [r for r in load(path) if r["benchmark"].startswith(prefix)]
    base = {(r["benchmark"], r["shape"]): float(r["ms"]) for r in rows
            if r["implementation"].startswith("torch")}
    groups = list(dict.fromkeys((r["benchmark"], r["shape"]) for r in rows
                                if (r["benchmark"], r["shape"]) in base))   # with a torch row
    impls = list(dict.fromkeys(r["implementation"] for r in rows
                               if not r["implementation"].startswith("torch")))

    def speed(impl, group):
        ms = _ms(rows, impl, *group)
        return base[group] / ms if ms else 0.0

    short = lambda s: s.replace("B1 H8 ", "").replace(" D64", "").replace(" ", "\n")  # noqa: E731
    _bar_chart(path, out, groups, impls, speed,
               [f"{b.split('/')[1]}\n{short(s)}" for b, s in groups],
               "speed relative to torch (2 threads)", parity=True, inches_per_group=1.5)


def plot_model(paths: list[str], out: str) -> None:
    """The model benchmark (``model/<phase>``): tokens/s of each implementation relative to the
    SDPA model, per phase and shape, from one or more CSVs (first row of each shape wins)."""
    rows, seen = [], set()
    for path in paths:
        for r in load(path):
            key = (r["benchmark"], r["shape"], r["implementation"])
            if r["benchmark"].startswith("model/") and key not in seen:
                seen.add(key)
                rows.append(r)
    groups = list(dict.fromkeys((r["benchmark"], r["shape"]) for r in rows))

    def speed(impl, group):
        base, ms = _ms(rows, "sdpa", *group), _ms(rows, impl, *group)
        return base / ms if base and ms else 0.0

    _bar_chart(paths[0], out, groups, list(dict.fromkeys(r["implementation"] for r in rows)),
               speed, [f"{b.split('/')[1]}\n{s}" for b, s in groups],
               "tokens/s relative to attn_implementation='sdpa'", parity=True)


def plot_cluster(path: str, out: str) -> None:
    """Cluster kernels: each implementation's speed relative to torch eager (FFN) or to the
    split-update template (decode), per shape; 1.0 is parity."""
    rows = [r for r in load(path) if r["benchmark"].startswith(("ffn/", "decode/gqa_cluster"))]
    if not rows:
        return
    def order(group):   # by benchmark, then by the leading size of the shape (M128 < M1024)
        bench, shape = group
        digits = "".join(ch for ch in shape.split()[0] if ch.isdigit())
        return bench, int(digits or 0), shape

    groups = sorted({(r["benchmark"], r["shape"]) for r in rows}, key=order)
    baseline = {"ffn": "torch_eager", "decode": "tensorfuse_split_update"}

    def speed(impl, group):
        base = _ms(rows, baseline[group[0].split("/")[0]], *group)
        ms = _ms(rows, impl, *group)
        return base / ms if base and ms else 0.0

    _bar_chart(path, out, groups, sorted({r["implementation"] for r in rows}), speed,
               [f"{b.split('/')[-1]}\n{s.split()[0]}" for b, s in groups],
               "speed vs torch eager (FFN) / split update (decode)", parity=True)


def plot_neptune(path: str, out: str) -> None:
    """The Neptune suite: tensorfuse's speed over each alternative per operator (GPU time for
    prefill, wall clock per call for decode — the rows' ``ms``)."""
    rows = load(path)
    groups = list(dict.fromkeys(r["benchmark"] for r in rows))
    impls = sorted({r["implementation"] for r in rows} - {"tensorfuse"})

    def speed(impl, bench):
        ours = _ms(rows, "tensorfuse", bench, _shape_of(rows, bench))
        theirs = _ms(rows, impl, bench, _shape_of(rows, bench))
        return theirs / ours if ours and theirs else 0.0

    _bar_chart(path, out, groups, impls, speed, [g.split("/")[1] for g in groups],
               "tensorfuse's speed over it (×)", parity=True)


def plot_tuning_gpus(paths: list[str], out: str) -> None:
    """``--gpus-compare`` runs: a job's wall clock on one GPU and on all, per CSV (a run)."""
    runs = {p.rsplit("/", 1)[-1].replace(".csv", "").split("tuning-gpus-")[-1]: load(p)
            for p in paths}
    groups = list(runs)

    def seconds(impl, run):
        return next((float(r["job_s"]) for r in runs[run] if r["gpus"] == impl), 0.0)

    impls = sorted({r["gpus"] for rows in runs.values() for r in rows})
    _bar_chart(paths[0], out, groups, impls, seconds, groups, "job wall clock (s), per GPU count")


def _shape_of(rows: list, bench: str) -> str:
    return next(r["shape"] for r in rows if r["benchmark"] == bench)


HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(HERE, "results")
RESULTS_MD = os.path.join(HERE, "RESULTS.md")
README = os.path.join(os.path.dirname(HERE), "README.md")
README_BEGIN, README_END = "<!-- results table: benchmarks/report.py -->", "<!-- end of results -->"
BEHIND_BEGIN, BEHIND_END = "<!-- behind table: benchmarks/report.py -->", "<!-- end of behind -->"

def _results(folder: str = RESULTS_DIR) -> dict:
    """benchmark → {device: the newest CSV's path} (``<date>-<device>-<benchmark>.csv``) of
    those with rows: a run whose every implementation failed its check writes the header alone
    (``common.write_csv``), and the run before it stays the current one."""
    found: dict = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".csv") or len(name) < 12 or not _has_rows(os.path.join(folder,
                                                                                      name)):
            continue
        benchmark = name[11:-4].partition("-")[2]
        if benchmark:   # sorted by name: the newest date last
            found.setdefault(benchmark, {})[_device_of(name)] = os.path.join(folder, name)
    return found


def _has_rows(path: str) -> bool:
    with open(path, newline="") as f:
        return sum(1 for _ in zip(range(2), csv.reader(f))) > 1


def _device_of(path: str) -> str:
    return os.path.basename(path)[11:].partition("-")[0]   # after the date


def _number(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return 0.0


def _rate(row: dict) -> str:
    """TFLOP/s or GB/s, whichever the row has (3 significant digits: CPU rates are small)."""
    for field, unit in (("tflops", "TFLOP/s"), ("gbps", "GB/s")):
        value = _number(row.get(field))
        if value > 0:
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"
    return ""


def _groups(rows: list) -> dict:
    """(case, shape) → its rows, in the CSV's order (the ceilings measured apart)."""
    from benchmarks.common import canonical_label

    groups: dict = {}
    for r in rows:
        r = {**r, "implementation": canonical_label(r["implementation"])}
        groups.setdefault((r["benchmark"], r["shape"]), []).append(r)
    return groups


def _best_alternative(entries: list) -> dict | None:
    from benchmarks.common import is_alternative

    timed = [r for r in entries if is_alternative(r["implementation"]) and _number(r["ms"]) > 0]
    return min(timed, key=lambda r: _number(r["ms"])) if timed else None


def standard_table(rows: list) -> str:
    """One line per (case, shape, implementation): ms, rate, tensorfuse's speed against the
    fastest alternative of its case, the fraction of the measured ceiling."""
    from benchmarks.common import is_alternative

    lines = ["| case | shape | implementation | ms | rate | × best alternative | of ceiling |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    groups = _groups(rows)
    for (case, shape), entries in groups.items():
        if case.startswith("ceiling"):
            continue
        best = _best_alternative(entries)
        for r in entries:
            ratio = ""
            ours = not is_alternative(r["implementation"]) and _number(r["ms"]) > 0
            if best is not None and ours:
                ratio = f"{_number(best['ms']) / _number(r['ms']):.2f}× {best['implementation']}"
            ceiling = _number(r.get("fraction_of_ceiling"))
            lines.append(f"| {case} | {shape} | {r['implementation']} | {_number(r['ms']):.4f} | "
                         f"{_rate(r)} | {ratio} | {f'{ceiling:.0%}' if ceiling > 0 else ''} |")
    ceilings = [f"{c}: {_rate(r) or r['ms'] + ' ms'}" for (c, _), es in groups.items()
                if c.startswith("ceiling") for r in es[:1]]
    if ceilings:
        lines += ["", "Ceilings measured in the same run: " + "; ".join(ceilings) + "."]
    summary = geomean_line(groups)
    if summary:
        lines += ["", summary]
    return "\n".join(lines)


def geomean_line(groups: dict) -> str:
    """The geometric mean (to three places: the user suite's bar is 1.2×) of ``tensorfuse``
    (``tf.compile``'s choice) — and of each
    ``tensorfuse <variant>`` (tuned, a template by hand) — against the best alternative over the
    cases that have both, and the slowest case; a label in fewer than three cases is left out."""
    import math

    from benchmarks.common import TENSORFUSE

    labels = sorted({r["implementation"] for entries in groups.values() for r in entries
                     if r["implementation"].startswith(TENSORFUSE)},
                    key=lambda label: (label != TENSORFUSE, label))
    lines = []
    for label in labels:
        ratios = []
        for (case, shape), entries in groups.items():
            best = _best_alternative(entries)
            ours = [r for r in entries if r["implementation"] == label and _number(r["ms"]) > 0]
            if best is not None and ours:
                ratios.append((_number(best["ms"]) / _number(ours[0]["ms"]), case))
        if len(ratios) < 3:
            continue
        mean = math.exp(sum(math.log(r) for r, _ in ratios) / len(ratios))
        low, case = min(ratios)
        lines.append(f"Geometric mean of `{label}` against the best alternative over "
                     f"{len(ratios)} cases: {mean:.3f}× (lowest: {case}, {low:.2f}×).")
    return "\n".join(lines)


def plain_table(rows: list) -> str:
    """Every column as it is (CSVs of their own schema: tuning jobs)."""
    columns = list(rows[0])
    return "\n".join(["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)] +
                     ["| " + " | ".join(r[c] for c in columns) + " |" for r in rows])


def _table(path: str, superseded: set = frozenset()) -> str:
    """The CSV's table, without the cases in ``superseded`` (run again since, on their own)."""
    every = load(path)
    rows = [r for r in every if r.get("benchmark") not in superseded]
    if not rows:
        return "(every case was run again since, on its own: the sections below)" if every \
            else "(no rows)"
    return standard_table(rows) if "implementation" in rows[0] else plain_table(rows)


def _superseded(found: dict, benchmark: str, device: str) -> tuple[set, list]:
    """The cases of ``benchmark``'s newest CSV on ``device`` that a newer CSV of one of its parts
    (``<benchmark>-<part>``: the same benchmark with ``--only``) has run again, and those parts."""
    path = found[benchmark][device]
    cases, parts = set(), []
    for other, devices in found.items():
        newer = devices.get(device)
        if other.startswith(benchmark + "-") and newer and \
                os.path.basename(newer)[:10] > os.path.basename(path)[:10]:
            # (plain tables — a tuning job's — have no benchmark column: nothing to supersede)
            again = ({r.get("benchmark") for r in load(newer)} &
                     {r.get("benchmark") for r in load(path)}) - {None}
            if again:
                cases |= again
                parts.append(other)
    return cases, parts


def results_markdown(found: dict) -> str:
    """RESULTS.md: per benchmark, per device, the newest run's table and plot."""
    known = [s[0] for s in SECTIONS]
    sections = list(SECTIONS) + [(b, b, "", f"(the CSV {b})") for b in sorted(found)
                                 if b not in known]
    lines = ["# Results", "",
             "The newest run of each benchmark on each device, as `python -m benchmarks.report` "
             "writes it from `benchmarks/results/` (do not edit by hand). Every benchmark checks "
             "each kernel against a float64 reference before it times it, and times the "
             "alternatives in the same process on the same GPU (medians; L2 flushed between "
             "runs). `× best alternative`: the fastest alternative's time over tensorfuse's "
             "(above 1: tensorfuse is faster). Earlier runs are in git's history.", ""]
    late = behind(found)
    if late:
        lines += ["## Where tensorfuse is behind", "",
                  f"Every case of the newest runs on each device where `tf.compile`'s "
                  f"defaults reach less than {BEHIND:.2f}× the fastest alternative's speed (a "
                  f"case in several runs: its newest), the furthest behind first; each run's "
                  f"section below has its plans and ceilings.", "",
                  behind_table(late), ""]
    for benchmark, title, what, command in sections:
        if benchmark not in found:
            continue
        lines += [f"## {title}", "", f"{what}. `{command}`" if what else f"`{command}`", ""]
        for device, path in sorted(found[benchmark].items()):
            name = os.path.basename(path)
            superseded, parts = _superseded(found, benchmark, device)
            lines += [f"### {device.replace('_', ' ')}, {name[:10]}", "",
                      f"`results/{name}`" + (f" ({', '.join(sorted(superseded))}: newer in "
                                              f"{', '.join(parts)})" if parts else ""),
                      "", _table(path, superseded), ""]
            plot_png = path[:-4] + ".png"
            if os.path.exists(plot_png):
                lines += [f"![{benchmark} on {device}](results/{os.path.basename(plot_png)})", ""]
    return "\n".join(lines).rstrip() + "\n"


def readme_table(found: dict) -> str:
    """A few lines of each benchmark's run on the device measured last (the device of the newest
    CSV; another device's newest run where it has none): tensorfuse (``tf.compile``) against the
    fastest alternative in the same run."""
    lines = ["| kernel | shape | device | tensorfuse | fastest alternative | × |",
             "| --- | --- | --- | ---: | --- | ---: |"]
    paths = [p for runs in found.values() for p in runs.values()]
    current = _device_of(max(paths, key=os.path.basename)) if paths else None
    newest = {b: runs.get(current) or max(runs.values(), key=os.path.basename)
              for b, runs in found.items()}
    grouped = {b: _groups(load(path)) for b, path in newest.items()
               if b in {h[0] for h in HEADLINES}}
    for benchmark, case, shape, label in HEADLINES:
        if benchmark not in grouped:
            continue
        device = _device_of(newest[benchmark])
        for (c, s), entries in grouped[benchmark].items():
            mine = [r for r in entries if r["implementation"] == label]
            best = _best_alternative(entries)
            if not (c.startswith(case) and shape in s and mine and best and
                    _number(mine[0]["ms"]) > 0) or c.startswith("ceiling"):
                continue
            ours, theirs = (_rate(r) or f"{_number(r['ms']):.3f} ms" for r in (mine[0], best))
            lines.append(f"| {c} | {s} | {device.replace('_', ' ')} | {ours} | "
                         f"{best['implementation']} ({theirs}) | "
                         f"{_number(best['ms']) / _number(mine[0]['ms']):.2f}× |")
    return "\n".join(lines)


# a case is "behind" below this fraction of the fastest alternative's speed: closer than 3 % is
# within the spread of repeated runs of the same kernel (the suites' reruns of unchanged cases)
BEHIND = 0.97
README_BEHIND_ROWS = 15   # the README lists the furthest behind; RESULTS.md every one


def behind(found: dict) -> list:
    """Every case of the newest runs, on every device, where ``tensorfuse`` (``tf.compile``'s
    defaults) is below :data:`BEHIND` of the fastest alternative's speed: ``(ratio, case, shape,
    device, ours, theirs, alternative, date, benchmark)``, the furthest behind first; a case and
    shape on one device in several benchmarks (a knob sweep's defaults, a suite's row) as its
    newest run says, cases run again on their own since as that run says
    (:func:`_superseded`)."""
    newest: dict = {}
    for benchmark, runs in found.items():
        for device, path in runs.items():
            superseded, _ = _superseded(found, benchmark, device)
            rows = [r for r in load(path) if r.get("benchmark") not in superseded]
            if not rows or "implementation" not in rows[0]:
                continue   # a plain table (a tuning job's) compares nothing
            date = os.path.basename(path)[:10]
            for (case, shape), entries in _groups(rows).items():
                mine = [r for r in entries if r["implementation"] == "tensorfuse"
                        and _number(r["ms"]) > 0]
                best = _best_alternative(entries)
                if case.startswith("ceiling") or not (mine and best):
                    continue
                known = newest.get((device, case, shape))
                if known is None or known[7] <= date:
                    newest[(device, case, shape)] = (
                        _number(best["ms"]) / _number(mine[0]["ms"]), case, shape,
                        device.replace("_", " "),
                        _rate(mine[0]) or f"{_number(mine[0]['ms']):.3f} ms",
                        _rate(best) or f"{_number(best['ms']):.3f} ms",
                        best["implementation"], date, benchmark)
    return sorted(e for e in newest.values() if e[0] < BEHIND)


def behind_table(entries: list) -> str:
    """:func:`behind`'s entries as a table (the run: its date and CSV's benchmark name)."""
    lines = ["| kernel | shape | device | tensorfuse | fastest alternative | × | run |",
             "| --- | --- | --- | ---: | --- | ---: | --- |"]
    lines += [f"| {case} | {shape} | {device} | {ours} | {label} ({theirs}) | {ratio:.2f}× | "
              f"{date} {benchmark} |"
              for ratio, case, shape, device, ours, theirs, label, date, benchmark in entries]
    return "\n".join(lines)


def _with_readme_table(readme: str, table: str, markers=(README_BEGIN, README_END)) -> str:
    """``readme`` with ``table`` between the ``markers`` (begin, end)."""
    begin, end = readme.index(markers[0]) + len(markers[0]), readme.index(markers[1])
    return readme[:begin] + "\n" + table + "\n" + readme[end:]


def main(argv: list[str]) -> int:
    found = _results()
    want = {RESULTS_MD: results_markdown(found)}
    with open(README) as f:
        readme = f.read()
    if README_BEGIN in readme:
        readme = _with_readme_table(readme, readme_table(found))
    if BEHIND_BEGIN in readme:
        readme = _with_readme_table(readme, behind_table(behind(found)[:README_BEHIND_ROWS]),
                                    (BEHIND_BEGIN, BEHIND_END))
    want[README] = readme
    stale = []
    for path, text in want.items():
        with open(path) as f:
            if f.read() == text:
                continue
        stale.append(os.path.relpath(path, os.path.dirname(HERE)))
        if "--check" not in argv:
            with open(path, "w") as f:
                f.write(text)
    if "--check" in argv and stale:
        print(f"not current: {', '.join(stale)} (run python -m benchmarks.report)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
