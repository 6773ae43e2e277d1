"""Turn a results CSV into a plot and the tables of benchmarks/RESULTS.md.

    python -m benchmarks.report results/<date>-<gpu>.csv     # prints the markdown tables
"""
from __future__ import annotations

import csv
import sys
from collections import defaultdict


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


def tables(path: str) -> str:
    rows = load(path)
    by = defaultdict(dict)
    for r in rows:
        by[(r["benchmark"], r["shape"])][r["implementation"]] = r
    impls = sorted({r["implementation"] for r in rows if not r["benchmark"].startswith("ceiling")})
    lines = ["| benchmark | shape | " + " | ".join(impls) + " |",
             "| --- | --- | " + " | ".join("---" for _ in impls) + " |"]
    for (bench, shape), entries in sorted(by.items()):
        if bench.startswith("ceiling"):
            continue
        cells = []
        for impl in impls:
            r = entries.get(impl)
            if r is None:
                cells.append("")
            elif float(r["tflops"]) > 0:
                cells.append(f"{float(r['tflops']):.0f} TF/s ({float(r['ms']):.3f} ms)")
            else:
                cells.append(f"{float(r['gbps']):.0f} GB/s ({float(r['fraction_of_ceiling']):.0%})")
        lines.append(f"| {bench} | {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(tables(sys.argv[1]))
