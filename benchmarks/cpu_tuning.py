"""What tuning adds on the CPU: each kernel as ``tf.compile`` gives it untuned (template defaults)
and after a tuning job at the same sizes, against torch with the same thread count, one process.

    python -m benchmarks.cpu_tuning --csv results/DATE-cpu-tuning.csv

The job writes to a private database (``TENSORFUSE_CACHE`` set to a temporary folder), so your
own records are neither read nor written. Rows ``cpu_tuned/<kernel>/<shape>``: the untuned
kernel is built before the job, the tuned one after it (``schedule_origin`` in the note); both
are checked against float64 at the timed sizes' shape family (a ragged size) first, then timed
alternately — wall clock, median of ``benchmarks.cpu.REPEAT`` calls, a new output per call.
Attention (causal, ``cpu_fused``: the chunk and the block of rows) tunes every setting of its
space; row kernels (the CPU template: vector width, rows per task, unroll) get ``--trials``.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch

from benchmarks.common import Row, write_csv

ATTENTION = (("f32", 1024), ("bf16", 1024), ("f32", 2048), ("bf16", 2048), ("f32", 4096),
             ("bf16", 4096))
ROWS = ("softmax", "log_softmax", "layernorm")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--csv", default=None)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--trials", type=int, default=32, help="per row kernel")
    parser.add_argument("--attention", default=",".join(f"{d}:{s}" for d, s in ATTENTION),
                        help="dtype:length pairs ('' for none)")
    parser.add_argument("--rows", default=",".join(ROWS), help="row kernels ('' for none)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    os.environ["TENSORFUSE_CACHE"] = tempfile.mkdtemp(prefix="tensorfuse-cpu-tuning-")
    log = (lambda text: print(text, flush=True))
    out: list[Row] = []
    for pair in [p for p in args.attention.split(",") if p]:
        dtype, length = pair.split(":")
        out += attention(dtype, int(length), log)
    for name in [n for n in args.rows.split(",") if n]:
        out += row_kernel(name, args.trials, log)
    if args.csv:
        write_csv(out, args.csv)


def attention(dtype: str, s: int, log, heads: int = 8, d: int = 64) -> list[Row]:
    from benchmarks.cpu import DTYPES
    from tensorfuse.kernels.layers import attention_kernel

    kernel = attention_kernel(dtype, True, False, False)
    sizes = dict(B=1, H=heads, HKV=heads, M=s, N=s, D=d)
    q, k, v = (torch.randn(1, heads, s, d).to(DTYPES[dtype]) for _ in range(3))
    call = dict(scale=d ** -0.5)
    flops = 4 * heads * s * s * d / 2
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q, k, v, is_causal=True, scale=call["scale"])
    return compare("cpu_tuned/causal_attention", f"B1 H{heads} S{s} D{d} {dtype}", kernel,
                   sizes, lambda f: f(q, k, v, **call), sdpa, "torch sdpa", None, flops, 0.0,
                   dict(B=1, H=2, HKV=2, M=45, N=45, D=16), dtype, log)


def row_kernel(name: str, trials: int, log, m: int = 4096, n: int = 4096) -> list[Row]:
    import tensorfuse.kernels as K
    from benchmarks.cpu import torch_row

    x = torch.randn(m, n).bfloat16()
    w, b = torch.randn(n).bfloat16(), torch.randn(n).bfloat16()
    given = {"softmax": (x,), "log_softmax": (x,), "layernorm": (x, w, b, 1e-5)}[name]
    return compare(f"cpu_tuned/{name}", f"{m}x{n} bf16", K.ALL[name], dict(M=m, N=n),
                   lambda f: f(*given), torch_row(name, x, w, b, None), "torch", trials, 0.0,
                   2 * m * n * 2, dict(M=37, N=333), "bf16", log)


def compare(bench: str, shape: str, kernel, sizes: dict, run, torch_call, torch_label: str,
            trials, flops: float, nbytes: float, small: dict, dtype: str, log) -> list[Row]:
    """Untuned and tuned ``kernel`` at ``sizes`` (``trials`` None: every setting of the space),
    checked at ``small`` then timed alternately with torch."""
    import tensorfuse as tf
    from benchmarks.cpu import checked, wall_ms
    from tensorfuse.autotune.tasks import make_task
    from tensorfuse.kernels.reference import TOLERANCE

    rng = np.random.default_rng()
    untuned = tf.compile(kernel, target="llvm")
    run(untuned)   # built now, before the job writes records
    if trials is None:
        trials = make_task(kernel, sizes, tf.get_target("llvm")).space_size
    summary = tf.tune(kernel, target="llvm", trials=trials, progress=False, **sizes)
    (result,) = summary.tasks
    log(f"{bench} {shape}: tuned {result.trials} trials in {summary.seconds:.0f} s "
        f"({result.template}), job's timings {result.default_secs * 1e3:.2f} -> "
        f"{result.best_secs * 1e3:.2f} ms")
    tuned = tf.compile(kernel, target="llvm")
    made = {"tensorfuse (tf.compile defaults)": untuned, "tensorfuse (tuned)": tuned}
    times: dict = {label: [] for label in [*made, torch_label]}
    errors = {label: checked(kernel, f, small, rng) for label, f in made.items()}
    for _ in range(3):   # alternated rounds: this machine's speed drifts
        for label, f in made.items():
            times[label].append(wall_ms(lambda: run(f), 3))
        times[torch_label].append(wall_ms(torch_call, 3))
    ms = {label: float(np.median(t)) for label, t in times.items()}
    rows = []
    for label, value in ms.items():
        f = made.get(label)
        note = "" if f is None else (
            f"error {errors[label]:.1e}{'' if errors[label] <= TOLERANCE[dtype] else ' WRONG'}; "
            f"{f.schedule_origin(**sizes)}")
        rows.append(Row(bench, shape, label, value, flops / value / 1e9 if flops else 0.0,
                        nbytes / value / 1e6 if nbytes else 0.0, ms[torch_label] / value, note))
        log(f"  {label:34} {value:9.2f} ms  {ms[torch_label] / value:5.2f}x {torch_label}"
            + (f"   {note}" if note else ""))
    return rows


if __name__ == "__main__":
    main()
