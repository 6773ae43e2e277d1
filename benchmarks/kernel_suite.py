"""The harness of the suites of kernels as users write them (:mod:`benchmarks.user_kernels`,
:mod:`benchmarks.unlisted_kernels`): a :class:`Case` per kernel (tensorfuse's call, the torch
alternatives', a float64 reference), each implementation checked against it before it is
timed, rows written after each kernel; ``--tune`` tunes each kernel at its call's sizes and
times it again."""
import argparse
import datetime
import statistics
from dataclasses import dataclass, field

import torch

import tensorfuse as tf
from tensorfuse.binding import bind_call
from benchmarks.attention import checked_output
from benchmarks.common import (TENSORFUSE, TORCH_COMPILE, TORCH_EAGER, Row, alternated,
                               measure_ceilings, measure_f32_gemm, same_bytes_copy, write_csv)


class Recorded:
    """``tf.compile(kernel)`` as the suite calls it, remembering the kernel and its first call's
    arguments: ``--tune`` tunes the kernel at that call's sizes and scalars."""

    def __init__(self, kernel):
        self.kernel, self.compiled, self.call = kernel, tf.compile(kernel), None
        RECORDED.append(self)

    def __call__(self, *args, **kwargs):
        if self.call is None:
            self.call = (args, kwargs)
        return self.compiled(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.compiled, name)


RECORDED: list[Recorded] = []   # every suite kernel compiled, in order


@dataclass
class Case:
    """One suite kernel at one size: tensorfuse's call, the alternatives' (label → call), the
    float64 reference of the checked rows, how to pick them from an output, the work done."""

    name: str
    shape: str
    ours: object
    alternatives: dict
    reference: torch.Tensor
    pick: object
    flops: float = 0.0
    bytes: float = 0.0
    notes: dict = field(default_factory=dict)
    # what the fraction of the ceiling is of: the bf16 GEMM's rate where ``flops`` is set, the
    # copy's bandwidth otherwise, or "f32_gemm_tflops": the CUDA cores' (measure_f32_gemm)
    ceiling: str = ""


def rows_case(name: str, kernel, eager, x, extra: dict, shape: str,
              pick=lambda out: out) -> Case:
    """A row kernel on ``x`` against ``eager`` (its torch function) and it under torch.compile;
    checked on all of it (``pick``: what of an output is compared with the float64 reference),
    GB/s of the bytes it must move (its inputs read once, its output written once)."""
    f = Recorded(kernel)
    compiled = torch.compile(eager)
    tensors = [a for a in extra.values() if isinstance(a, torch.Tensor)]
    scalars = {n: a for n, a in extra.items() if not isinstance(a, torch.Tensor)}
    ref = eager(x.double(), *(t.double() for t in tensors), **scalars)
    moved = (x.numel() + ref.numel()) * x.element_size() + \
        sum(t.numel() * t.element_size() for t in tensors)
    return Case(name, shape, lambda: f(x, **extra),
                {TORCH_COMPILE: lambda: compiled(x, *tensors, **scalars),
                 TORCH_EAGER: lambda: eager(x, *tensors, **scalars)},
                ref, pick, bytes=moved,
                notes={TENSORFUSE: f.schedule_origin(**bind_call(
                    kernel.program, (x,), extra, "cuda").dims)})


def run(suite: dict, only: list[str] | None = None, log=print, tune: int = 0,
        csv_path: str | None = None) -> list[Row]:
    """Each kernel of ``suite`` (name → ``make(generator)`` → :class:`Case`; ``only``: those
    named) and its
    alternatives, checked and timed; with ``tune``, then a ``tf.tune`` job of that many trials at
    the call's sizes and scalars and the kernel compiled again (``tensorfuse tuned``: it reads
    the records). ``csv_path``: the rows so far written after each kernel (a run cut short keeps
    what it measured)."""
    ceilings = measure_ceilings()
    generator = torch.Generator().manual_seed(0)
    rows: list[Row] = []
    for name, make in suite.items():
        if only and name not in only:
            continue
        case = make(generator)
        calls = {TENSORFUSE: case.ours, **case.alternatives}
        rows += _timed(case, calls, ceilings, log)
        if tune:
            rows += _tuned_rows(case, RECORDED[-1], tune, ceilings, log)
        if csv_path:
            write_csv(rows, csv_path)
    return rows


TUNED = f"{TENSORFUSE} tuned"


# rounds of timings per implementation: the first with its check, the rest taken in turns
# over the implementations; the median reported (a disturbance of the GPU's clocks at one
# kernel's start slowed its first three implementations by 15-30 µs in one H200 run of
# benchmarks.user_kernels — the decode over one shared cache — and not its last)
ROUNDS = 3


def _timed(case: Case, calls: dict, ceilings: dict, log) -> list[Row]:
    """A row per implementation in ``calls`` (label → call) whose output matches float64, its
    time the median of :data:`ROUNDS` rounds."""
    rows = []
    # a bandwidth-bound kernel's rate beside what a copy of the same bytes reaches
    same = same_bytes_copy(case.bytes) if case.bytes and not case.flops else None
    right = {}
    for label, call in calls.items():
        made = checked_output(call, case.reference, f"{label} {case.name}", log, pick=case.pick)
        if made is not None:
            right[label] = made
    more = alternated({label: calls[label] for label in right}, ROUNDS - 1, rep_ms=200)
    for label, (first, err) in right.items():
        ms = statistics.median([first, *more[label]])
        tflops = case.flops / ms / 1e9
        gbps = case.bytes / ms / 1e6
        if case.ceiling and case.ceiling not in ceilings:
            ceilings[case.ceiling] = measure_f32_gemm()
        fraction = tflops / ceilings[case.ceiling or "gemm_tflops"] if case.flops else \
            gbps / 1e3 / ceilings["copy_tbps"]
        note = f"err {err:.1e}" + (f"; {case.notes[label]}" if label in case.notes else "")
        if same and label == TENSORFUSE:
            note += f"; a copy of the same bytes: {same:.0f} GB/s ({gbps / same:.0%} of it)"
        rows.append(Row(f"user/{case.name}", case.shape, label, ms, tflops, gbps, fraction, note))
        log(f"{case.name:<18} {case.shape:<32} {label:<16} {ms:8.3f} ms {tflops:7.1f} TFLOP/s "
            f"{fraction:6.1%}")
    return rows


def _tuned_rows(case: Case, recorded: Recorded, trials: int, ceilings: dict, log) -> list[Row]:
    """A tuning job at the suite kernel's call (its sizes and scalars), then the kernel compiled
    anew — it reads the records — timed on the same inputs; no row where there is nothing to
    tune (said why)."""
    from tensorfuse.errors import TuningError

    args, kwargs = recorded.call
    bound = bind_call(recorded.kernel.program, args, kwargs, "cuda")
    try:
        summary = tf.tune(recorded.kernel, "cuda", trials=trials, progress=False,
                          scalars=bound.scalars, **bound.dims)
    except TuningError as exc:
        log(f"  not tuned: {exc}")
        return []
    ms = lambda secs: "?" if secs is None else f"{secs * 1e3:.4f}"   # noqa: E731
    found = "; ".join(f"{t.name}: {t.trials} trials, {ms(t.default_secs)} -> "
                      f"{ms(t.best_secs)} ms" + (", defaults kept" if t.kept_defaults else "")
                      for t in summary.tasks)
    log(f"  tuned in {summary.seconds:.0f} s: {found}")
    fresh = tf.compile(recorded.kernel)
    case.notes[TUNED] = f"tf.tune {trials} trials ({found}); " + fresh.schedule_origin(
        **bound.dims, **bound.scalars)
    return _timed(case, {TUNED: lambda: fresh(*args, **kwargs)}, ceilings, log)


def main(suite: dict, name: str, description: str, argv=None) -> None:
    """The command line of :func:`run` over ``suite``, its CSV named ``<date>-<device>-<name>``
    (``…-<name>-<kernels>`` for the kernels of ``--only``)."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated suite names")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tune", type=int, default=0, metavar="TRIALS",
                        help="after each kernel's defaults, tune it (records in this device's "
                        "database, which tf.compile reads) and time it again")
    args = parser.parse_args(argv)
    device = torch.cuda.get_device_name().replace(" ", "_")
    tuned = "-tuned" if args.tune else ""
    only = [n for n in args.only.split(",") if n]
    # a run of some kernels is named for them: it must not stand for the whole suite's newest
    cases = "".join(f"-{n.replace('_', '-')}" for n in sorted(only))
    run(suite, only or None, tune=args.tune,
        csv_path=f"{args.out}/{datetime.date.today()}-{device}-{name}{cases}{tuned}.csv")

