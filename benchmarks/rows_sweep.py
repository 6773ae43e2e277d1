"""Where the row template's settings stand: its defaults against the early loads turned off
(``rowtile.PREFETCH``), the L2 eviction hints off or everywhere (``rowtile.EVICTION``) and fewer
warps — for the row kernels that read more than the row
(``benchmarks/rows_operands.py``) and the library's softmax, layernorm and RMSNorm.

    python -m benchmarks.rows_sweep [--csv PATH] [--rounds 5] [--grid | --long | --stages |
                                    --reload | --swept | --variants JSON [--only NAMES]]

Each variant is checked against float64, then all are timed alternately over ``rounds`` (median
of each), beside torch.compile. ``--grid`` also times every (rows, block, warps, hints) of a small
grid once for the norms; ``--long`` times rows wider than a block (2048 × 65536) with the
template's eviction rule and without hints instead; ``--stages`` times rows swept in blocks with
and without Triton's software pipeline over the blocks; ``--reload`` rows held in one block with
their outputs computed from registers or from the row read again (``Knobs.reload``);
``--swept`` rows of sums swept in blocks with their sums per lane (the default)
against one block read again and against per-block sums;
``--variants '{"label": {"block": 4096, "num_warps": 8}}'`` the defaults against the knob sets
given (``made``'s arguments) for the kernels of ``rows_operands`` and the library's softmax,
layernorm and RMSNorm (``--only`` some of them). GB/s count the bytes each kernel must move;
read-only ceilings (a sum over 1 GiB, a sum and a row maximum over the rows' own matrix) are
printed beside the copy's.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys

import torch

from benchmarks.common import Row, alternated, bench, measure_ceilings, relative_error, write_csv
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
        "log_softmax": ((x,), lambda x: torch.log_softmax(x, -1), 4 * m * n),
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


def made(kernel, prefetch: bool = True, eviction: bool | None = None, lanewise: bool = True,
         **knobs):
    """The row template of ``kernel`` (its automatic fusion) with ``knobs`` (rows, block,
    num_warps, num_stages, reload) where given, compiled now — with or without the early loads,
    L2 eviction hints (None: the template's rule) and per-lane sums in swept rows, which code
    generation reads from ``rowtile``'s settings."""
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.row_reduction import row_reduction
    from tensorfuse.targets import get_target
    from tensorfuse.targets.triton import rowtile

    spec = get_target("cuda")
    _, fusion = choose(kernel.program, spec)
    f = row_reduction(kernel, fusion, spec, **knobs)

    def first_call(*args):
        saved = rowtile.PREFETCH, rowtile.EVICTION, rowtile.LANEWISE
        rowtile.PREFETCH, rowtile.EVICTION, rowtile.LANEWISE = prefetch, eviction, lanewise
        try:
            return f(*args)   # generates and compiles the kernel for these sizes
        finally:
            rowtile.PREFETCH, rowtile.EVICTION, rowtile.LANEWISE = saved

    return f, first_call


def _errors(got, want) -> float:
    pairs = zip(got, want) if isinstance(got, tuple) else [(got, want)]
    return max(relative_error(g, w) for g, w in pairs)


def compare(case, shape: str, variants: dict, rounds: int, copy: float, log) -> list[Row]:
    """``case`` (``rows_operands.cases`` form) as each of ``variants`` (label → ``made``'s
    arguments) checked against float64, then timed alternately with torch.compile over
    ``rounds`` (median of each)."""
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
    compiled = torch.compile(torch_fn)
    compiled(*args)
    kernels["torch.compile"] = compiled
    times = alternated({label: (lambda f=f: f(*args)) for label, f in kernels.items()}, rounds)
    rows, line = [], []
    for label, ts in times.items():
        ms = statistics.median(ts)
        gbps = nbytes / ms / 1e6
        rows.append(Row(f"rows_sweep/{name}", shape, label, ms, 0.0, gbps, gbps / 1e3 / copy,
                        f"{len(ts)} rounds"))
        vs = statistics.median(times["torch.compile"]) / ms
        line.append(f"{label} {gbps:6.0f} GB/s ({gbps / 1e3 / copy:.1%}, {vs:.4f}x compile)")
    log(f"{name} {shape:16s} " + " | ".join(line))
    return rows


VARIANTS = {"defaults": {}, "late loads": dict(prefetch=False),
            "no hints, 8 warps": dict(eviction=False, num_warps=8),   # the defaults before
            "hints": dict(eviction=True)}
LONG_VARIANTS = {"defaults": {}, "no hints": dict(eviction=False)}
# rows swept in blocks: Triton's software pipeline over the blocks (2 stages) against none (the
# default: ``row_reduction.ROW_MAJOR_STAGES``), with and without the eviction hints
STAGE_VARIANTS = {"defaults": {},
                  "4096 x 16w, 1 stage, hints": dict(block=4096, num_warps=16, num_stages=1,
                                                     eviction=True),
                  "4096 x 16w, 1 stage": dict(block=4096, num_warps=16, num_stages=1),
                  "4096 x 16w, 2 stages, hints": dict(block=4096, num_warps=16, num_stages=2,
                                                      eviction=True)}
LONG_STAGE_VARIANTS = {"defaults": {}, "2 stages": dict(num_stages=2),
                       "2 stages, no hints": dict(num_stages=2, eviction=False)}


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


RELOAD_VARIANTS = {"defaults": {}, "reload": dict(reload=True), "keep": dict(reload=False)}
RELOAD_SHAPES = ((32768, 4096), (8192, 16384))


def run_reload(rounds: int, log=print) -> list[Row]:
    """Rows held in one block, their outputs computed from the registers (``keep``) or from the
    row read again (``reload``): the kernels of ``rows_operands`` (but cross-entropy, whose
    outputs are per row) at [16384, 8192], the library's row kernels there and at two more
    shapes."""
    copy = measure_ceilings()["copy_tbps"]
    log(f"copy {copy:.2f} TB/s")
    rows = []
    library = ("softmax", "log_softmax", "layernorm", "rmsnorm")
    for case in itertools.chain((c for c in cases() if c[0] != "cross_entropy"),
                                library_cases(M, N, library)):
        rows += compare(case, f"{M}x{N} bf16", RELOAD_VARIANTS, rounds, copy, log)
    for m, n in RELOAD_SHAPES:
        for case in library_cases(m, n, library):
            rows += compare(case, f"{m}x{n} bf16", RELOAD_VARIANTS, rounds, copy, log)
    return rows


def run_stages(rounds: int, log=print) -> list[Row]:
    """Rows swept in blocks with and without Triton's software pipeline: the kernels of
    ``rows_operands`` and the library's norms and softmax at [16384, 8192] in two blocks of 4096,
    and rows wider than a block (2048 × 65536) at their default blocks."""
    copy = measure_ceilings()["copy_tbps"]
    log(f"copy {copy:.2f} TB/s")
    rows = []
    for case in itertools.chain(cases(), library_cases(M, N, ("softmax", "layernorm",
                                                              "rmsnorm"))):
        rows += compare(case, f"{M}x{N} bf16", STAGE_VARIANTS, rounds, copy, log)
    m, n = 2048, 65536
    for case in library_cases(m, n, ("softmax", "layernorm", "cross_entropy")):
        rows += compare(case, f"{m}x{n} bf16", LONG_STAGE_VARIANTS, rounds, copy, log)
    return rows


SWEPT = dict(block=4096, num_warps=16, num_stages=1, eviction=True)   # Inductor's shape


def swept_variants(n: int) -> dict:
    """The defaults, the row held in one block and read again (what the template did for rows up to
    16384 columns before the sweep), and the row swept in blocks of 4096 with L2 hints with
    its sums per lane and reduced per block."""
    return {"defaults": {}, "one block, reload": dict(block=n, num_warps=16, num_stages=1,
                                                      reload=True),
            "swept": SWEPT, "swept, per-block sums": dict(SWEPT, lanewise=False)}


def run_swept(rounds: int, log=print) -> list[Row]:
    """Rows of uncorrected sums (RMSNorm, the scaled RMSNorm) swept in blocks of 4096 with their
    sums per lane — the default for 4097-8192 columns — against one block read
    again (:func:`swept_variants`, also over 16384 columns, where the sweep measured slower); and
    rows wider than a block (2048 × 65536) with per-lane against per-block sums
    (cross-entropy's gathered logit is one)."""
    copy = measure_ceilings()["copy_tbps"]
    log(f"copy {copy:.2f} TB/s")
    rows = []
    for m, n in ((M, N), (8192, 16384)):
        chosen = (c for c in cases() if c[0] == "scaled_rmsnorm") if (m, n) == (M, N) else ()
        for case in itertools.chain(chosen, library_cases(m, n, ("rmsnorm",))):
            rows += compare(case, f"{m}x{n} bf16", swept_variants(n), rounds, copy, log)
    m, n = 2048, 65536
    for case in library_cases(m, n, ("rmsnorm", "cross_entropy")):
        rows += compare(case, f"{m}x{n} bf16", {"defaults": {}, "per-block sums":
                                                dict(lanewise=False)}, rounds, copy, log)
    return rows


def run(rounds: int, grid: bool = False, log=print, variants: dict | None = None,
        only: set | None = None) -> list[Row]:
    """Every kernel as :data:`VARIANTS` (or ``variants``, beside the defaults), ``only`` those
    named where given."""
    copy = measure_ceilings()["copy_tbps"]
    rows = read_ceilings(copy, log)
    log(f"copy {copy:.2f} TB/s")
    shape = f"{M}x{N} bf16"
    for case in itertools.chain(cases(), library_cases(M, N, ("softmax", "layernorm",
                                                              "rmsnorm"))):
        if only and case[0] not in only:
            continue
        rows += compare(case, shape, {"defaults": {}, **variants} if variants else VARIANTS,
                        rounds, copy, log)
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
    parser.add_argument("--reload", action="store_true",
                        help="rows in one block: outputs from registers or the row read again")
    parser.add_argument("--stages", action="store_true",
                        help="rows swept in blocks with and without the software pipeline")
    parser.add_argument("--swept", action="store_true",
                        help="rows of sums swept in blocks with per-lane sums, against one "
                             "block and against per-block sums")
    parser.add_argument("--variants", default=None, metavar="JSON",
                        help="label -> knobs (rows, block, num_warps, num_stages, reload, "
                             "eviction, prefetch) to time against the defaults")
    parser.add_argument("--only", default="", help="kernel names, comma-separated")
    parser.add_argument("--grid", action="store_true",
                        help=f"also time the knob grid for {', '.join(GRID_KERNELS)}")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("the row sweep needs an NVIDIA GPU", file=sys.stderr)
        return 2
    rows = run_long(args.rounds) if args.long else run_stages(args.rounds) if args.stages \
        else run_swept(args.rounds) if args.swept \
        else run_reload(args.rounds) if args.reload else \
        run(args.rounds, args.grid, variants=json.loads(args.variants) if args.variants else None,
            only={n for n in args.only.split(",") if n})
    if args.csv:
        write_csv(rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
