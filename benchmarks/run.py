"""Run the whole suite on the local GPU in one process; write the CSV, the plot and a summary.

    python -m benchmarks.run [--out DIR] [--sizes 1024,4096,16384] [--only attention,decode,rows,...]

Writes DIR/<date>-<gpu>-suite.csv and its plot and prints a table; ``python -m benchmarks.report``
then writes ``benchmarks/RESULTS.md`` from the newest CSVs.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--sizes", default="1024,4096,16384")
    parser.add_argument("--only", default="attention,decode,rows,cluster,gemm",
                        help="comma-separated parts: attention, decode, rows, cluster, gemm "
                             "(GEMMs and the FFN blocks on the Hopper GEMM), model (a Llama 3 "
                             "8B-shaped transformers model, prefill and decode: minutes; not in "
                             "the default set)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks need an NVIDIA GPU", file=sys.stderr)
        return 2
    from benchmarks import attention, rows
    from benchmarks.common import measure_ceilings, write_csv

    gpu = torch.cuda.get_device_name().replace(" ", "_")
    stamp = datetime.date.today().isoformat()
    started = time.time()
    log = lambda text: print(text, flush=True)  # noqa: E731
    ceilings = measure_ceilings()
    log(f"{gpu}: copy {ceilings['copy_tbps']:.2f} TB/s, bf16 GEMM {ceilings['gemm_tflops']:.0f} "
        "TFLOP/s")
    from benchmarks.common import Row

    results = [Row("ceiling/copy", "1 GiB", "torch", 0, 0, ceilings["copy_tbps"] * 1e3, 1.0),
               Row("ceiling/gemm", "8192^3 bf16", "cublas", 0, ceilings["gemm_tflops"], 0, 1.0)]
    parts = args.only.split(",")
    if "rows" in parts:
        results += rows.run(ceilings, log)
    if "decode" in parts:
        results += attention.run_decode(ceilings, log)
    if "attention" in parts:
        sizes = tuple(int(s) for s in args.sizes.split(","))
        results += attention.run(sizes, ceilings, log=log)
    if "cluster" in parts:
        from benchmarks import cluster

        results += cluster.run_decode(log=log) + cluster.run_ffn(log=log)
    if "gemm" in parts:
        from benchmarks import gemm

        results += gemm.timed(gemm.SHAPES + gemm.PROBES, sweep=(), log=log) + gemm.ffn(log=log)
    if "model" in parts:
        from benchmarks import model

        results += model.run(log)
    path = os.path.join(args.out, f"{stamp}-{gpu}-suite.csv")
    write_csv(results, path)
    try:
        from benchmarks.report import plot, plot_cluster, plot_gemm

        plot(path, path.replace(".csv", ".png"))
        plot_cluster(path, path.replace(".csv", "-cluster.png"))
        if "gemm" in parts:
            plot_gemm(path, path.replace(".csv", "-gemm.png"))
    except Exception as exc:  # noqa: BLE001 - the CSV is the result; the plot is a view of it
        log(f"plot failed: {exc}")
    log(f"wrote {path} in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
