"""How well and how fast a tuning job finds the best knobs, on the local GPU.

    python -m benchmarks.tuning [--out DIR] [--trials 24] [--seq 4096]

For each kernel: a ``tensorfuse.tune`` job with ``--trials`` (timed, wall clock), then every
point of the template's space timed the same way (the true best), and the tuned record's
latency as a fraction of that best. Writes DIR/<date>-<gpu>-tuning.csv and prints a table.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import os
import sys
import tempfile
import time


def sweep(task) -> list[tuple[dict, float]]:
    """(knobs, ms) for every point of the task's space (failures as inf)."""
    from tensorfuse.autotune.runner import TritonRunner

    args, _, _ = TritonRunner({task.name: task}).inputs(task.name)
    choices = task.choices()
    names = list(choices)
    out = []
    for values in itertools.product(*(choices[n] for n in names)):
        knobs = dict(zip(names, values))
        try:
            out.append((knobs, task.candidate(knobs).benchmark(*args)))
        except Exception:  # noqa: BLE001 - a point that does not compile or fit
            out.append((knobs, float("inf")))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--cases", default="causal,sliding,decode,softmax",
                        help="which of causal, sliding, decode, softmax")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("this benchmark needs an NVIDIA GPU", file=sys.stderr)
        return 2
    import tensorfuse as tf
    from tensorfuse import kernels as K
    from tensorfuse.autotune import open_database
    from tensorfuse.autotune.lookup import best_record, replay
    from tensorfuse.autotune.tasks import knobs_of, make_task

    os.environ["TENSORFUSE_CACHE"] = tempfile.mkdtemp(prefix="tensorfuse-tuning-bench-")
    target = tf.get_target("cuda")
    s = args.seq
    cases = [
        ("causal_attention", K.causal_attention, dict(B=2, H=16, M=s, N=s, D=128)),
        ("sliding_window_attention", K.sliding_window_attention, dict(B=2, H=16, M=s, N=s, D=128)),
        ("gqa_attention decode", K.gqa_attention, dict(B=8, H=32, HKV=8, M=1, N=32768, D=128)),
        ("softmax", K.softmax, dict(M=16384, N=8192)),
    ]
    wanted = args.cases.split(",")
    cases = [c for c in cases if any(c[0].startswith(w) or w in c[0] for w in wanted)]
    rows = []
    for label, kernel, sizes in cases:
        started = time.time()
        summary = tf.tune(kernel, target, trials=args.trials, progress=False, **sizes)
        job_s = time.time() - started
        task = make_task(kernel, sizes, target)
        record = best_record(open_database(summary.database, read_only=True), task.mod)[0]
        tuned_knobs = knobs_of(replay(record, task.mod))
        started = time.time()
        points = sweep(task)
        sweep_s = time.time() - started
        best_knobs, best_ms = min(points, key=lambda p: p[1])
        tuned_ms = dict((tuple(sorted(k.items())), ms) for k, ms in points)[
            tuple(sorted(tuned_knobs.items()))]
        default_ms = summary.tasks[0].default_secs * 1e3
        row = dict(kernel=label, sizes=" ".join(f"{k}={v}" for k, v in sizes.items()),
                   trials=args.trials, job_s=round(job_s, 1), failed=summary.tasks[0].failures_this_job,
                   space=len(points), sweep_s=round(sweep_s, 1), default_ms=round(default_ms, 4),
                   tuned_ms=round(tuned_ms, 4), best_ms=round(best_ms, 4),
                   tuned_over_best=round(tuned_ms / best_ms, 3), tuned_knobs=tuned_knobs,
                   best_knobs=best_knobs)
        rows.append(row)
        print(row, flush=True)
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    path = os.path.join(args.out, f"{datetime.date.today().isoformat()}-{gpu}-tuning-"
                                  f"{'-'.join(wanted)}.csv")
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"\n{'kernel':28} {'job s':>6} {'failed':>6} {'default':>8} {'tuned':>8} {'best':>8} "
          f"{'tuned/best':>10}")
    for r in rows:
        print(f"{r['kernel']:28} {r['job_s']:6.0f} {r['failed']:6d} {r['default_ms']:8.4f} "
              f"{r['tuned_ms']:8.4f} {r['best_ms']:8.4f} {r['tuned_over_best']:10.3f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
