"""Row kernels that read more than the row: a per-row tensor beside it, a per-column and a
per-row one together, an integer per-row index, two outputs — `tf.compile` defaults against
torch eager and torch.compile, [16384, 8192] bf16. GB/s counts the bytes each kernel must move
(inputs read once, outputs written once).

    python -m benchmarks.rows_operands [--csv PATH]
    python -m benchmarks.rows_operands --tune 64 --only scaled_rmsnorm --rounds 7

``--tune N``: each kernel is also tuned (N trials, a private database: ``TENSORFUSE_CACHE`` set to
a temporary folder) and its defaults, its tuned record and torch.compile are timed in alternated
rounds, by events and from CUDA graphs (the median of each).
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.common import (Row, alternated, bench, bench_graph, measure_ceilings,
                               relative_error, write_csv)

M, N = 16384, 8192


@tf.kernel
def temperature_softmax(x: T.Tensor["M", "N", "bf16"], t: T.Tensor["M", "f32"]):
    i, j = T.axes("i j")
    s = x[i, j] / t[i]
    e = T.exp(s - T.max(s, over=j))
    return T.cast(e / T.sum(e, over=j), "bf16")


@tf.kernel
def scaled_rmsnorm(x: T.Tensor["M", "N", "bf16"], w: T.Tensor["N", "bf16"],
                   s: T.Tensor["M", "f32"]):
    i, j = T.axes("i j")
    ms = T.sum(x[i, j] * x[i, j], over=j) / T.size("N")
    return T.cast(x[i, j] * T.rsqrt(ms + 1e-5) * w[j] * s[i], "bf16")


@tf.kernel
def softmax_and_lse(x: T.Tensor["M", "N", "bf16"]):
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    e = T.exp(x[i, j] - m)
    l = T.sum(e, over=j)  # noqa: E741
    return T.cast(e / l, "bf16"), m + T.log(l)


def cases():
    """name → (tensorfuse kernel, arguments, torch function, bytes moved)."""
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    t = torch.rand(M, device="cuda") + 0.5
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    s = torch.rand(M, device="cuda") + 0.5
    target = torch.randint(0, N, (M,), device="cuda", dtype=torch.int32)
    matrix = M * N * 2
    yield ("temperature_softmax", temperature_softmax, (x, t),
           lambda x, t: torch.softmax(x.float() / t[:, None], -1).to(torch.bfloat16),
           2 * matrix + 4 * M)
    yield ("scaled_rmsnorm", scaled_rmsnorm, (x, w, s),
           lambda x, w, s: (F.rms_norm(x.float(), (N,), w.float(), 1e-5) * s[:, None]).to(
               torch.bfloat16), 2 * matrix + 2 * N + 4 * M)
    from tensorfuse.kernels import cross_entropy
    yield ("cross_entropy", cross_entropy, (x, target),
           lambda x, target: F.cross_entropy(x.float(), target.long(), reduction="none"),
           matrix + 8 * M)
    yield ("softmax_and_lse", softmax_and_lse, (x,),
           lambda x: (torch.softmax(x.float(), -1).to(torch.bfloat16),
                      torch.logsumexp(x.float(), -1)), 2 * matrix + 4 * M)


def reference(torch_fn, args):
    """``torch_fn`` in float64 (integer arguments as they are)."""
    return torch_fn(*(a.double() if a.is_floating_point() else a for a in args))


def error(got, want) -> float:
    """The largest relative error over a kernel's outputs (one, or a tuple)."""
    pairs = zip(got, want) if isinstance(got, tuple) else [(got, want)]
    return max(relative_error(g, w) for g, w in pairs)


def copy_at(nbytes: int) -> float:
    """TB/s of a device copy that moves ``nbytes`` (half read, half written): the copy ceiling
    at a kernel's own traffic, where fixed costs (launch, ramp-up, the last wave) weigh as they
    do for the kernel (a 268 MB read-only kernel cannot reach the rate of a 2 GiB copy)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    return nbytes / bench(lambda: dst.copy_(src)) / 1e9


def run(ceilings=None, log=print) -> list[Row]:
    copy = (ceilings or {}).get("copy_tbps", 3.0)
    rows = []
    for name, kernel, args, torch_fn, nbytes in cases():
        same = copy_at(nbytes)
        f = tf.compile(kernel, "cuda")
        want = reference(torch_fn, args)
        err = error(f(*args), want)
        impls = {"tensorfuse": (bench(lambda: f(*args)), f"err {err:.1e}; {f.description[:60]}")}
        impls["torch_eager"] = (bench(lambda: torch_fn(*args)), "")
        compiled = torch.compile(torch_fn)
        compiled(*args)
        impls["torch_compile"] = (bench(lambda: compiled(*args)), "")
        for impl, (ms, note) in impls.items():
            gbps = nbytes / ms / 1e6
            note = f"{note}; {gbps / 1e3 / same:.1%} of a copy of the same bytes " \
                   f"({same:.2f} TB/s)".lstrip("; ")
            rows.append(Row(f"rows/{name}", f"{M}x{N} bf16", impl, ms, 0.0, gbps,
                            gbps / 1e3 / copy, note))
        log(f"{name:20s} " + "  ".join(f"{i}={nbytes / ms / 1e6:7.1f}GB/s"
                                       for i, (ms, _) in impls.items())
            + f"  (err {err:.1e}; copy of the same bytes {same:.2f} TB/s)")
    return rows


def tuned(trials: int, rounds: int, only: set, log=print) -> list[Row]:
    """Defaults, a tuned record and torch.compile, alternated (see the module docstring)."""
    import os
    import statistics
    import tempfile

    os.environ["TENSORFUSE_CACHE"] = tempfile.mkdtemp(prefix="tensorfuse-rows-tuned-")
    rows = []
    for name, kernel, args, torch_fn, nbytes in cases():
        if only and name not in only:
            continue
        same = copy_at(nbytes)
        untuned = tf.compile(kernel, "cuda")
        untuned(*args)   # built before the job writes records
        summary = tf.tune(kernel, "cuda", trials=trials, progress=False, M=M, N=N)
        log(str(summary))
        made = tf.compile(kernel, "cuda")
        want = reference(torch_fn, args)
        compiled = torch.compile(torch_fn)
        compiled(*args)
        calls = {"tensorfuse": lambda: untuned(*args), "tensorfuse (tuned)": lambda: made(*args),
                 "torch_compile": lambda: compiled(*args)}
        errors = {label: error(calls[label](), want)
                  for label in ("tensorfuse", "tensorfuse (tuned)")}
        for timing, how in ((bench, "events"), (bench_graph, "graph")):
            times = alternated(calls, rounds, timing)
            ms = {label: statistics.median(t) for label, t in times.items()}
            for label, value in ms.items():
                gbps = nbytes / value / 1e6
                note = (f"{how}; {gbps / 1e3 / same:.1%} of a copy of the same bytes; "
                        f"{ms['torch_compile'] / value:.3f}x torch.compile")
                if label in errors:
                    note += f"; err {errors[label]:.1e}; " + (
                        made.schedule_origin(M=M, N=N) if label.endswith("(tuned)")
                        else "defaults")[:120]
                rows.append(Row(f"rows/{name}", f"{M}x{N} bf16", f"{label} [{how}]", value,
                                0.0, gbps, ms["torch_compile"] / value, note))
            log(f"{name} {how}: " + "  ".join(
                f"{label} {nbytes / v / 1e6:.0f} GB/s ({ms['torch_compile'] / v:.3f}x)"
                for label, v in ms.items()))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--csv", default=None)
    parser.add_argument("--tune", type=int, default=0, help="also tune each kernel: trials")
    parser.add_argument("--only", default="", help="kernel names, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    ceilings = measure_ceilings()
    print(f"copy {ceilings['copy_tbps']:.2f} TB/s")
    only = {n for n in args.only.split(",") if n}
    rows = tuned(args.tune, args.rounds, only) if args.tune else run(ceilings)
    if args.csv:
        write_csv(rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
