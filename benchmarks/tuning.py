"""How well and how fast a tuning job finds the best knobs, on the local GPU.

    python -m benchmarks.tuning [--out DIR] [--trials 24] [--seq 4096] [--window 256]
    python -m benchmarks.tuning --gpus-compare [--together] [--cases softmax,decode]  (2+ GPUs)

For each kernel: a ``tensorfuse.tune`` job with ``--trials`` at the scalar values it is called
with (timed, wall clock, cold caches), then every point of the template's space that fits the GPU
timed the same way (the true best), the tuned record's latency as a fraction of that best, and
``tf.compile`` at those values: whether it uses the record, and its time. ``--gpus-compare``: the
same job on one GPU and on all of this machine's GPUs (fresh database and compile caches each),
per kernel or, with ``--together``, as one job of all the kernels: wall clock, trials and best
record of each. Writes DIR/<date>-<gpu>-tuning-*.csv and prints a table.
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
        if task.unfit(knobs) is not None:
            continue
        try:
            out.append((knobs, task.candidate(knobs).benchmark(*args)))
        except Exception:  # noqa: BLE001 - a point that does not compile or fit
            out.append((knobs, float("inf")))
    return out


def _fresh_caches(label: str) -> None:
    """A new tensorfuse cache (database, cubins) and Triton cache: cold compiles, as on a fresh
    machine."""
    os.environ["TENSORFUSE_CACHE"] = tempfile.mkdtemp(prefix=f"tensorfuse-tuning-{label}-")
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"triton-tuning-{label}-")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--trials", type=int, default=None,
                        help="per job (default 24; with --gpus-compare every fitting setting)")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--window", type=int, default=256,
                        help="the sliding window the kernel is called (and tuned) with")
    parser.add_argument("--cases", default="causal,sliding,decode,softmax",
                        help="which of causal, sliding, decode, softmax")
    parser.add_argument("--gpus-compare", action="store_true",
                        help="one GPU against all of this machine's GPUs on the same job")
    parser.add_argument("--together", action="store_true",
                        help="with --gpus-compare: all the cases in one job")
    parser.add_argument("--run-gpus", default=None, help=argparse.SUPPRESS)   # one run, inside
    args = parser.parse_args(argv)
    if args.trials is None and not args.gpus_compare:
        args.trials = 24
    import torch

    if not torch.cuda.is_available():
        print("this benchmark needs an NVIDIA GPU", file=sys.stderr)
        return 2
    import tensorfuse as tf
    from tensorfuse import kernels as K

    target = tf.get_target("cuda")
    s = args.seq
    cases = [
        ("causal_attention", K.causal_attention, dict(B=2, H=16, M=s, N=s, D=128), {}),
        ("sliding_window_attention", K.sliding_window_attention,
         dict(B=2, H=16, M=s, N=s, D=128), {"window": args.window}),
        ("gqa_attention decode", K.gqa_attention, dict(B=8, H=32, HKV=8, M=1, N=32768, D=128),
         {}),
        ("softmax", K.softmax, dict(M=16384, N=8192), {}),
    ]
    wanted = args.cases.split(",")
    cases = [c for c in cases if any(c[0].startswith(w) or w in c[0] for w in wanted)]
    if args.run_gpus is not None:
        _one_gpus_run(tf, target, cases, args)
        return 0
    rows = (_compare_gpus if args.gpus_compare else _tune_and_sweep)(tf, target, cases, args)
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    kind = ("gpus-together" if args.together else "gpus") if args.gpus_compare else "-".join(
        wanted)
    path = os.path.join(args.out, f"{datetime.date.today().isoformat()}-{gpu}-tuning-{kind}.csv")
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print()
    for r in rows:
        print("  ".join(f"{k}={v}" for k, v in r.items() if "knobs" not in k))
    print(f"wrote {path}")
    return 0


def _tune_and_sweep(tf, target, cases, args) -> list[dict]:
    from tensorfuse.autotune import open_database
    from tensorfuse.autotune.lookup import best_record, replay
    from tensorfuse.autotune.runner import TritonRunner
    from tensorfuse.autotune.tasks import knobs_of, make_task

    _fresh_caches("sweep")
    rows = []
    for label, kernel, sizes, scalars in cases:
        started = time.time()
        summary = tf.tune(kernel, target, trials=args.trials, progress=False, scalars=scalars,
                          **sizes)
        job_s = time.time() - started
        task = make_task(kernel, sizes, target, scalars)
        record = best_record(open_database(summary.database, read_only=True), task.mod)[0]
        tuned_knobs = knobs_of(replay(record, task.mod))
        started = time.time()
        points = sweep(task)
        sweep_s = time.time() - started
        best_knobs, best_ms = min(points, key=lambda p: p[1])
        tuned_ms = dict((tuple(sorted(k.items())), ms) for k, ms in points)[
            tuple(sorted(tuned_knobs.items()))]
        default_ms = summary.tasks[0].default_secs * 1e3
        compiled = tf.compile(kernel, target)
        origin = compiled.schedule_origin(**sizes, **scalars)
        call_args, _, _ = TritonRunner({task.name: task}).inputs(task.name)
        compiled_ms = compiled.benchmark(*call_args)
        row = dict(kernel=label, template=task.template,
                   sizes=" ".join(f"{k}={v}" for k, v in sizes.items()),
                   scalars=" ".join(f"{k}={v}" for k, v in scalars.items()),
                   trials=args.trials, job_s=round(job_s, 1),
                   failed=summary.tasks[0].failures_this_job,
                   space=len(points), sweep_s=round(sweep_s, 1), default_ms=round(default_ms, 4),
                   tuned_ms=round(tuned_ms, 4), best_ms=round(best_ms, 4),
                   tuned_over_best=round(tuned_ms / best_ms, 3),
                   compile_uses_record="tuned record" in origin,
                   compiled_ms=round(compiled_ms, 4), tuned_knobs=tuned_knobs,
                   best_knobs=best_knobs)
        rows.append(row)
        print(row, flush=True)
    return rows


def _ms(secs):
    return None if secs is None else round(secs * 1e3, 4)


def _compare_gpus(tf, target, cases, args) -> list[dict]:
    """The same job on one GPU (``gpus=[0]``: measured in the job's own process) and on every GPU
    of this machine (``gpus="all"``: the job's GPU plus a worker per other GPU): per kernel, or
    (``--together``) all the kernels in one job. Each run is a fresh Python with fresh database
    and compile caches (a second job in one process would find the first's compiled kernels in
    memory: measured 2.6x faster on one H200 for that alone). ``--trials`` (default: every
    setting that fits) is the same for both runs, so they measure the same candidates."""
    import json
    import subprocess

    import torch

    from tensorfuse.autotune.pruning import fitting_settings
    from tensorfuse.autotune.tasks import make_task

    count = torch.cuda.device_count()
    fitting = {label: fitting_settings(make_task(kernel, sizes, target, scalars))[0]
               for label, kernel, sizes, scalars in cases}
    jobs = [([label], args.trials or fitting[label]) for label, _, _, _ in cases]
    if args.together:
        jobs = [([c[0] for c in cases], args.trials or sum(fitting.values()))]
    rows = []
    for labels, trials in jobs:
        runs = []
        for gpus in ["0"] + (["all"] if count > 1 else []):
            command = [sys.executable, "-m", "benchmarks.tuning", "--gpus-compare", "--together",
                       "--run-gpus", gpus, "--out", args.out, "--trials", str(trials), "--cases", ",".join(labels),
                       "--seq", str(args.seq), "--window", str(args.window)]
            done = subprocess.run(command, capture_output=True, text=True)
            found = [json.loads(line[4:]) for line in done.stdout.splitlines()
                     if line.startswith("ROW ")]
            if not found:
                print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"the run on --gpus {gpus} failed (rc {done.returncode})")
            if done.returncode:   # the job reported its rows, then its process ended badly
                print(f"--gpus {gpus}: exit status {done.returncode} after the job:",
                      done.stderr[-1500:], file=sys.stderr)
            for row in found:
                row.update(gpus=count if gpus == "all" else 1, exit_rc=done.returncode)
                print(row, flush=True)
            rows += found
            runs.append(found[0]["job_s"])
        if len(runs) > 1:
            print(f"{' + '.join(labels)}: {trials} trials, one GPU {runs[0]:.1f} s, {count} GPUs "
                  f"{runs[1]:.1f} s ({runs[0] / max(runs[1], 1e-9):.2f}x)", flush=True)
    return rows


class _StackSampler:
    """Where the job's threads spend their time: every 5 ms, each thread's Python stack (a
    thread in C++ shows the Python frame that called it), counted per thread and stack."""

    def __init__(self, period: float = 0.005):
        import collections
        import threading

        self.counts: collections.Counter = collections.Counter()
        self.period, self.running = period, True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import threading
        import traceback

        me = threading.get_ident()
        while self.running:
            time.sleep(self.period)
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                stack = [f"{os.path.basename(s.filename)}:{s.name}"
                         for s in traceback.extract_stack(frame)][-7:]
                self.counts[(names.get(ident, "?"), " > ".join(stack))] += 1

    def stop(self) -> None:
        self.running = False
        self.thread.join()

    def report(self, top: int = 60) -> str:
        return "\n".join(f"{n * self.period:7.2f} s  {thread}: {stack}"
                         for (thread, stack), n in self.counts.most_common(top))


def _one_gpus_run(tf, target, cases, args) -> None:
    """One job of ``--gpus-compare`` (in its own process): all ``cases`` on ``--run-gpus``;
    prints a ``ROW {json}`` line per kernel."""
    import json

    _fresh_caches(f"gpus-{args.run_gpus}")
    gpus = "all" if args.run_gpus == "all" else [int(g) for g in args.run_gpus.split(",")]
    from tensorfuse.autotune import remote

    remote.TIMELINE = []
    sampler = _StackSampler()
    started = time.time()
    summary = tf.tune([(kernel, {**sizes, **scalars}) for _, kernel, sizes, scalars in cases],
                      target, trials=args.trials, gpus=gpus,
                      progress=lambda line: remote.mark("say", line))
    job_s = time.time() - started
    sampler.stop()
    with open(os.path.join(args.out, f"timeline-gpus-{args.run_gpus}.json"), "w") as f:
        json.dump([(round(t - started, 3), *rest) for t, *rest in remote.TIMELINE], f)
    with open(os.path.join(args.out, f"stacks-gpus-{args.run_gpus}.txt"), "w") as f:
        f.write(sampler.report())
    for task in summary.tasks:
        print("ROW " + json.dumps(dict(
            job=" + ".join(c[0] for c in cases), kernel=task.name, asked=args.trials,
            trials=task.trials, failed=task.failures_this_job, job_s=round(job_s, 1),
            workers_ready_s=round(summary.workers_ready_s or 0, 1), best_ms=_ms(task.best_secs),
            default_ms=_ms(task.default_secs), exhausted=summary.exhausted,
            workers="; ".join(summary.workers))), flush=True)


if __name__ == "__main__":
    sys.exit(main())
