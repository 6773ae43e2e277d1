"""Where the row template's defaults stand among its knobs, and what issuing the outputs' operand
loads first (``rowtile.PREFETCH``) does — for the row kernels that read more than the row
(``benchmarks/rows_operands.py``) and the library's softmax, layernorm and RMSNorm.

    python -m benchmarks.rows_sweep [--csv PATH] [--rounds 5]

For each kernel: the defaults, without the early loads, without eviction hints on 8 warps (the
defaults before session 15) and with eviction hints everywhere, timed
alternately over ``rounds`` (median of each), and with ``--grid`` every (rows, block, warps) of a
small grid once. GB/s count the bytes each kernel must move; read-only ceilings (a sum over
1 GiB, and a sum and a row maximum over the rows' own matrix) are printed beside the copy's.
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


def library_cases():
    """The library's row kernels at the same size, in the form of ``rows_operands.cases``."""
    from tensorfuse.kernels import layernorm, rmsnorm, softmax

    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    matrix = M * N * 2
    yield "softmax", softmax, (x,), lambda x: torch.softmax(x, -1), 2 * matrix
    yield ("layernorm", layernorm, (x, w, b, 1e-5),
           lambda x, w, b, eps: torch.nn.functional.layer_norm(x, (N,), w, b, eps), 2 * matrix)
    yield ("rmsnorm", rmsnorm, (x, w, 1e-5),
           lambda x, w, eps: torch.nn.functional.rms_norm(x, (N,), w, eps), 2 * matrix)


def long_cases():
    """Rows wider than one block (the template sweeps them in 16384-column blocks; the norm and
    the softmax read each row twice), in the form of ``rows_operands.cases``."""
    from tensorfuse.kernels import cross_entropy, layernorm, softmax

    m, n = 2048, 65536
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, n, (m,), device="cuda", dtype=torch.int32)
    yield f"softmax {m}x{n}", softmax, (x,), lambda x: torch.softmax(x, -1), 4 * m * n
    yield (f"layernorm {m}x{n}", layernorm, (x, w, b, 1e-5),
           lambda x, w, b, eps: torch.nn.functional.layer_norm(x, (n,), w, b, eps), 4 * m * n)
    yield (f"cross_entropy {m}x{n}", cross_entropy, (x, target),
           lambda x, t: torch.nn.functional.cross_entropy(x.float(), t.long(), reduction="none"),
           2 * m * n + 8 * m)


def made(kernel, prefetch: bool, eviction: bool | None = None, **knobs):
    """The row template of ``kernel`` (its automatic fusion), compiled with or without the early
    loads and L2 eviction hints (None: the template's rule), and with ``knobs`` (rows, block, num_warps) where given (the
    settings are read when the returned kernel is first called)."""
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.row_reduction import row_reduction
    from tensorfuse.targets import get_target
    from tensorfuse.targets.triton import rowtile

    spec = get_target("cuda")
    _, fusion = choose(kernel.program, spec)
    rowtile.PREFETCH, rowtile.EVICTION = prefetch, eviction
    return row_reduction(kernel, fusion, spec, **knobs), rowtile


def run_long(rounds: int, log=print) -> list[Row]:
    """The long rows with the template's eviction rule against no hints, alternately."""
    copy = measure_ceilings()["copy_tbps"]
    rows = []
    for name, kernel, args, torch_fn, nbytes in long_cases():
        want = torch_fn(*(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point()
                          else a for a in args))
        variants = {}
        for variant, eviction in (("defaults", None), ("no hints", False)):
            f, rowtile = made(kernel, True, eviction)
            err = relative_error(f(*args), want)
            rowtile.EVICTION = None
            variants[variant] = f
            if err > 2e-2:
                log(f"  {name}: WRONG ({variant}) err {err:.1e}")
        times = {v: [] for v in variants}
        for _ in range(rounds):
            for v, f in variants.items():
                times[v].append(bench(lambda: f(*args), rep_ms=100))
        compiled = torch.compile(torch_fn)
        compiled(*args)
        times["torch.compile"] = [bench(lambda: compiled(*args))]
        line = []
        for v, ts in times.items():
            ms = statistics.median(ts)
            gbps = nbytes / ms / 1e6
            rows.append(Row(f"rows_sweep/{name.split()[0]}", name.split()[1] + " bf16", v, ms,
                            0.0, gbps, gbps / 1e3 / copy, f"{len(ts)} rounds"))
            line.append(f"{v} {gbps:6.0f} GB/s ({gbps / 1e3 / copy:.1%})")
        log(f"{name:24s} " + " | ".join(line))
    return rows


def run(rounds: int, grid: bool = False, log=print) -> list[Row]:
    ceilings = measure_ceilings()
    copy = ceilings["copy_tbps"]
    rows = []
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    reads = {"1 GiB int64 sum": (torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
                                 .random_(0, 255).view(torch.int64), lambda t: t.sum()),
             f"{M}x{N} bf16 int64 sum": (x.view(torch.int64), lambda t: t.sum()),
             f"{M}x{N} bf16 row max": (x, lambda t: t.amax(-1))}
    for what, (t, fn) in reads.items():   # read-only ceilings, at the rows' own size too
        ms = bench(lambda: fn(t))
        gbps = t.numel() * t.element_size() / ms / 1e6
        rows.append(Row("rows_sweep/read_ceiling", what, "torch", ms, 0.0, gbps,
                        gbps / 1e3 / copy, "reads only"))
        log(f"read ceiling, {what}: {gbps:6.0f} GB/s ({gbps / 1e3 / copy:.1%} of copy)")
    log(f"copy {copy:.2f} TB/s")
    for name, kernel, args, torch_fn, nbytes in itertools.chain(cases(), library_cases()):
        want = torch_fn(*(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point()
                          else a for a in args))
        variants = {}
        for variant, prefetch, eviction, knobs in (
                ("defaults", True, None, {}), ("late loads", False, None, {}),
                ("no hints, 8 warps", True, False, dict(num_warps=8)),
                ("hints", True, True, {})):
            f, rowtile = made(kernel, prefetch, eviction, **knobs)
            got = f(*args)   # compiled now, with this setting
            rowtile.PREFETCH, rowtile.EVICTION = True, None
            variants[variant] = f
            pairs = zip(got, want) if isinstance(got, tuple) else [(got, want)]
            err = max(relative_error(g, w) for g, w in pairs)
            if err > 2e-2:
                log(f"  {name}: WRONG (prefetch={prefetch}) err {err:.1e}")
        times = {v: [] for v in variants}
        for _ in range(rounds):
            for v, f in variants.items():
                times[v].append(bench(lambda: f(*args), rep_ms=100))
        compiled = torch.compile(torch_fn)
        compiled(*args)
        times["torch.compile"] = [bench(lambda: compiled(*args))]
        line = []
        for v, ts in times.items():
            ms = statistics.median(ts)
            gbps = nbytes / ms / 1e6
            rows.append(Row(f"rows_sweep/{name}", f"{M}x{N} bf16", v, ms, 0.0, gbps,
                            gbps / 1e3 / copy, f"{len(ts)} rounds"))
            line.append(f"{v} {gbps:6.0f} GB/s ({gbps / 1e3 / copy:.1%})")
        log(f"{name:20s} " + " | ".join(line))
        if not grid or name not in GRID_KERNELS:
            continue
        for r, b, w, hints in itertools.product(*GRID.values()):
            if r * b > 16384:
                continue
            f, rowtile = made(kernel, True, hints, rows=r, block=b, num_warps=w)
            try:
                got = f(*args)
                rowtile.EVICTION = None
                ms = bench(lambda: f(*args), rep_ms=100)
            except Exception as e:  # noqa: BLE001 - a knob set Triton cannot build
                log(f"  rows {r} block {b} warps {w} hints {hints}: {type(e).__name__} "
                f"{str(e)[:80]}")
                continue
            gbps = nbytes / ms / 1e6
            pairs = zip(got, want) if isinstance(got, tuple) else [(got, want)]
            wrong = "" if max(relative_error(g, x) for g, x in pairs) <= 2e-2 else " WRONG"
            label = f"rows{r}_block{b}_warps{w}_hints{'' if hints is None else 'all'}"
            rows.append(Row(f"rows_sweep/{name}", f"{M}x{N} bf16", label, ms, 0.0, gbps,
                            gbps / 1e3 / copy, wrong.strip()))
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
