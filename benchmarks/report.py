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


def plot(path: str, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in load(path) if r["benchmark"].startswith("attention/")]
    impls = sorted({r["implementation"] for r in rows})
    groups = sorted({(r["benchmark"].split("/")[1], r["shape"]) for r in rows},
                    key=lambda g: (int(g[1].split("S")[1].split()[0]), g[0]))
    fig, ax = plt.subplots(figsize=(max(8, len(groups) * 0.9), 5))
    width = 0.8 / max(1, len(impls))
    for k, impl in enumerate(impls):
        values = []
        for name, shape in groups:
            hit = [float(r["tflops"]) for r in rows if r["implementation"] == impl and
                   r["benchmark"].endswith("/" + name) and r["shape"] == shape]
            values.append(hit[0] if hit else 0.0)
        ax.bar([g + k * width for g in range(len(groups))], values, width, label=impl)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"{n}\nS={s.split('S')[1].split()[0]}" for n, s in groups], fontsize=7)
    ax.set_ylabel("TFLOP/s (unmasked FLOPs)")
    ax.legend(fontsize=8)
    ax.set_title(path.rsplit("/", 1)[-1].replace(".csv", ""))
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_cluster(path: str, out: str) -> None:
    """Cluster kernels: each implementation's speed relative to torch eager (FFN) or to the
    split-update template (decode), per shape; 1.0 is parity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in load(path) if r["benchmark"].startswith(("ffn/", "decode/gqa_cluster"))]
    if not rows:
        return
    groups = sorted({(r["benchmark"], r["shape"]) for r in rows})
    baseline = {"ffn": "torch_eager", "decode": "tensorfuse_split_update"}
    impls = sorted({r["implementation"] for r in rows})
    fig, ax = plt.subplots(figsize=(max(8, len(groups) * 1.1), 4.5))
    width = 0.8 / max(1, len(impls))
    for k, impl in enumerate(impls):
        values = []
        for bench, shape in groups:
            base = [float(r["ms"]) for r in rows if r["benchmark"] == bench and r["shape"] == shape
                    and r["implementation"] == baseline[bench.split("/")[0]]]
            hit = [float(r["ms"]) for r in rows if r["benchmark"] == bench and r["shape"] == shape
                   and r["implementation"] == impl]
            values.append(base[0] / hit[0] if base and hit else 0.0)
        ax.bar([g + k * width for g in range(len(groups))], values, width, label=impl)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"{b}\n{s.split()[0]}" for b, s in groups], fontsize=7)
    ax.set_ylabel("speed vs torch eager (FFN) / split update (decode)")
    ax.legend(fontsize=8)
    ax.set_title(path.rsplit("/", 1)[-1].replace(".csv", ""))
    fig.tight_layout()
    fig.savefig(out, dpi=110)


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
