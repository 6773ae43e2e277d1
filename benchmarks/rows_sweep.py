"""Where the row template's settings stand: its defaults against the early loads turned off
(``rowtile.PREFETCH``), the L2 eviction hints off or everywhere (``rowtile.EVICTION``) and the
warps before session 15 — for the row kernels that read more than the row
(``benchmarks/rows_operands.py``) and the library's softmax, layernorm and RMSNorm.

    python -m benchmarks.rows_sweep [--csv PATH] [--rounds 5] [--grid | --long]

Each variant is checked against float64, then all are timed alternately over ``rounds`` (median
of each), beside torch.compile. ``--grid`` also times every (rows, block, warps, hints) of a small
grid once for the norms; ``--long`` times rows wider than a block (2048 × 65536) with the
template's eviction rule and without hints instead. GB/s count the bytes each kernel must move;
read-only ceilings (a sum over 1 GiB, a sum and a row maximum over the rows' own matrix) are
printed beside the copy's.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys

import torch

from benchmarks.common import Row, bench, measure_ceilings, relative_error, write_csv
from benchmarks.rows_operands import M, N, cases

# rows per block, columns per block (below 8192: two passes over each row), warps, and the
# eviction hints (None: the template's rule; True: everywhere, the first of two passes keeping
# its rows in L2 for the second, as Inductor's looped reductions do)
GRID = dict(rows=(1,), block=(8192, 4096, 2048, 1024), warps=(4, 8, 16), hints=(None, True))
GRID_KERNELS = ("scaled_rmsnorm", "layernorm")


def library_cases(m: int, n: int, names: tuple):
    """The library's row kernels ``names`` over [m, n] bf16, in the form of
    ``rows_operands.cases``. Above 16384 columns the template sweeps each row in blocks, and the
    kernels that write rows read them twice."""
    import tensorfuse.kernels as K

    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, n, (m,), device="cuda", dtype=torch.int32)
    F = torch.nn.functional
    every = {
        "softmax": ((x,), lambda x: torch.softmax(x, -1), 4 * m * n),
        "layernorm": ((x, w, b, 1e-5),
                      lambda x, w, b, eps: F.layer_norm(x, (n,), w, b, eps), 4 * m * n),
        "rmsnorm": ((x, w, 1e-5), lambda x, w, eps: F.rms_norm(x, (n,), w, eps), 4 * m * n),
        "cross_entropy": ((x, target), lambda x, t: F.cross_entropy(x.float(), t.long(),
                                                                   reduction="none"),
                          2 * m * n + 8 * m),
    }
    for name in names:
        args, torch_fn, nbytes = every[name]
        yield name, K.ALL[name], args, torch_fn, nbytes


def made(kernel, prefetch: bool = True, eviction: bool | None = None, **knobs):
    """The row template of ``kernel`` (its automatic fusion) with ``knobs`` (rows, block,
    num_warps) where given, compiled now — with or without the early loads and L2 eviction hints
    (None: the template's rule), which code generation reads from ``rowtile``'s settings."""
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.row_reduction import row_reduction
    from tensorfuse.targets import get_target
    from tensorfuse.targets.triton import rowtile

    spec = get_target("cuda")
    _, fusion = choose(kernel.program, spec)
    f = row_reduction(kernel, fusion, spec, **knobs)

    def first_call(*args):
        saved = rowtile.PREFETCH, rowtile.EVICTION
        rowtile.PREFETCH, rowtile.EVICTION = prefetch, eviction
        try:
            return f(*args)   # generates and compiles the kernel for these sizes
        finally:
            rowtile.PREFETCH, rowtile.EVICTION = saved

    return f, first_call


def _errors(got, want) -> float:
    pairs = zip(got, want) if isinstance(got, tuple) else [(got, want)]
    return max(relative_error(g, w) for g, w in pairs)


def compare(case, shape: str, variants: dict, rounds: int, copy: float, log) -> list[Row]:
    """``case`` (``rows_operands.cases`` form) as each of ``variants`` (label → ``made``'s
    arguments) checked against float64, then timed alternately over ``rounds`` (median of each),
    beside torch.compile."""
    name, kernel, args, torch_fn, nbytes = case
    want = torch_fn(*(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point()
                      else a for a in args))
    kernels = {}
    for label, settings in variants.items():
        f, first_call = made(kernel, **settings)
        err = _errors(first_call(*args), want)
        if err > 2e-2:
            log(f"  {name}: WRONG ({label}) err {err:.1e}")
        kernels[label] = f
    times: dict = {label: [] for label in kernels}
    for _ in range(rounds):
        for label, f in kernels.items():
            times[label].append(bench(lambda: f(*args), rep_ms=100))
    compiled = torch.compile(torch_fn)
    compiled(*args)
    times["torch.compile"] = [bench(lambda: compiled(*args))]
    rows, line = [], []
    for label, ts in times.items():
        ms = statistics.median(ts)
        gbps = nbytes / ms / 1e6
        rows.append(Row(f"rows_sweep/{name}", shape, label, ms, 0.0, gbps, gbps / 1e3 / copy,
                        f"{len(ts)} rounds"))
        line.append(f"{label} {gbps:6.0f} GB/s ({gbps / 1e3 / copy:.1%})")
    log(f"{name} {shape:16s} " + " | ".join(line))
    return rows


VARIANTS = {"defaults": {}, "late loads": dict(prefetch=False),
            "no hints, 8 warps": dict(eviction=False, num_warps=8),   # the defaults before
            "hints": dict(eviction=True)}
LONG_VARIANTS = {"defaults": {}, "no hints": dict(eviction=False)}


def run_long(rounds: int, log=print) -> list[Row]:
    """Rows wider than a block: the template's eviction rule against no hints."""
    copy = measure_ceilings()["copy_tbps"]
    m, n = 2048, 65536
    rows = []
    for case in library_cases(m, n, ("softmax", "layernorm", "cross_entropy")):
        rows += compare(case, f"{m}x{n} bf16", LONG_VARIANTS, rounds, copy, log)
    return rows


def read_ceilings(copy: float, log) -> list[Row]:
    """Read-only rates: a sum over 1 GiB, and a sum and a row maximum over the rows' matrix."""
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    reads = {"1 GiB int64 sum": (torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
                                 .random_(0, 255).view(torch.int64), lambda t: t.sum()),
             f"{M}x{N} bf16 int64 sum": (x.view(torch.int64), lambda t: t.sum()),
             f"{M}x{N} bf16 row max": (x, lambda t: t.amax(-1))}
    rows = []
    for what, (t, fn) in reads.items():
        ms = bench(lambda: fn(t))
        gbps = t.numel() * t.element_size() / ms / 1e6
        rows.append(Row("rows_sweep/read_ceiling", what, "torch", ms, 0.0, gbps,
                        gbps / 1e3 / copy, "reads only"))
        log(f"read ceiling, {what}: {gbps:6.0f} GB/s ({gbps / 1e3 / copy:.1%} of copy)")
    return rows


def run(rounds: int, grid: bool = False, log=print) -> list[Row]:
    copy = measure_ceilings()["copy_tbps"]
    rows = read_ceilings(copy, log)
    log(f"copy {copy:.2f} TB/s")
    shape = f"{M}x{N} bf16"
    for case in itertools.chain(cases(), library_cases(M, N, ("softmax", "layernorm",
                                                              "rmsnorm"))):
        rows += compare(case, shape, VARIANTS, rounds, copy, log)
        if grid and case[0] in GRID_KERNELS:
            rows += knob_grid(case, shape, copy, log)
    return rows


def knob_grid(case, shape: str, copy: float, log) -> list[Row]:
    """Every (rows, block, warps, hints) of :data:`GRID` once (a knob set Triton cannot build is
    logged and skipped)."""
    name, kernel, args, torch_fn, nbytes = case
    want = torch_fn(*(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point()
                      else a for a in args))
    rows = []
    for r, b, w, hints in itertools.product(*GRID.values()):
        f, first_call = made(kernel, eviction=hints, rows=r, block=b, num_warps=w)
        try:
            wrong = " WRONG" if _errors(first_call(*args), want) > 2e-2 else ""
            ms = bench(lambda: f(*args), rep_ms=100)
        except Exception as e:  # noqa: BLE001 - a knob set Triton cannot build
            log(f"  rows {r} block {b} warps {w} hints {hints}: {type(e).__name__} {str(e)[:80]}")
            continue
        gbps = nbytes / ms / 1e6
        label = f"rows{r}_block{b}_warps{w}_hints{'' if hints is None else 'all'}"
        rows.append(Row(f"rows_sweep/{name}", shape, label, ms, 0.0, gbps, gbps / 1e3 / copy,
                        wrong.strip()))
        log(f"  rows {r} block {b:5d} warps {w:2d} hints {hints!s:5}: {gbps:6.0f} GB/s "
            f"({gbps / 1e3 / copy:.1%}){wrong}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--csv", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--long", action="store_true",
                        help="only the rows wider than a block, with and without eviction hints")
    parser.add_argument("--grid", action="store_true",
                        help=f"also time the knob grid for {', '.join(GRID_KERNELS)}")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("the row sweep needs an NVIDIA GPU", file=sys.stderr)
        return 2
    rows = run_long(args.rounds) if args.long else run(args.rounds, args.grid)
    if args.csv:
        write_csv(rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
