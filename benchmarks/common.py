"""Shared pieces of the benchmarks: timing, ceilings, correctness checks, result rows."""
from __future__ import annotations

import csv
import datetime
import math
import os
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass, fields

import torch


@dataclass
class Row:
    benchmark: str
    shape: str
    implementation: str
    ms: float
    tflops: float
    gbps: float
    fraction_of_ceiling: float
    note: str = ""


def bench(fn, rep_ms: int = 200) -> float:
    """Median milliseconds (CUDA events, warm-up, L2 flushed between runs: triton.testing)."""
    import triton

    return float(triton.testing.do_bench(fn, rep=rep_ms, return_mode="median"))


def bench_graph(fn, rep_ms: int = 200) -> float:
    """Median milliseconds of ``fn`` replayed from a CUDA graph (triton.testing): GPU time only.
    For calls whose host-side cost (argument checks, launches) is close to their GPU time — the
    FFN at M=128 — ``bench`` measures the host as much as the kernels (``benchmarks.overhead``)."""
    import triton

    return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))


def bench_replayed(fn, rep_ms: int = 200) -> float:
    """Median milliseconds of one call of ``fn`` captured in a CUDA graph and replayed under
    ``do_bench`` (L2 flushed before each replay, as ``bench``): the GPU time of an eager call
    whose host work never keeps the GPU waiting — between ``bench`` (where it may) and
    ``bench_graph`` (calls back to back: L2 warm between them)."""
    fn()   # built and compiled outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench(graph.replay, rep_ms)


def bench_queued(fn, reps: int = 50) -> float:
    """Median milliseconds of ``fn``'s GPU work alone, L2 flushed before each call: the GPU is
    held by a sleeping kernel while the host issues the call, so host work between its launches
    (a Python autograd backward's, a staged kernel's) leaves no gaps on the GPU — what a training
    step, whose host runs ahead of its GPU, pays. For calls that cannot be captured in a CUDA
    graph (``bench_replayed``): autograd backwards."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    host = time.perf_counter()
    fn()
    host = time.perf_counter() - host
    torch.cuda.synchronize()
    # the sleep outlasts the host's issuing three times over (about 2 GHz; at least 1 ms)
    cycles = int(max(1e-3, 3 * host) * 2e9)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        flush.zero_()
        torch.cuda._sleep(cycles)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def host_us(fn, calls: int = 50, warm: int = 1) -> float:
    """Host microseconds per call of ``fn``: ``calls`` calls issued back to back after ``warm``
    ones, the GPU drained before and after but not counted (what a call costs the host, where
    ``bench`` measures what the GPU waits for)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    spent = time.perf_counter() - start
    torch.cuda.synchronize()
    return spent / calls * 1e6


def alternated(calls: dict, rounds: int, timing=None, rep_ms: int = 100,
               failed=None) -> dict:
    """``calls`` (label → callable) timed by ``timing`` (default :func:`bench`) once per round,
    taking turns over ``rounds`` rounds, so that drift of the GPU's clocks over a run hits every
    label alike: label → the rounds' milliseconds. With ``failed``, a call whose timing raises
    (one ``bench_replayed`` cannot capture) is told to ``failed(label, why)`` and left out."""
    timing = timing or bench
    times: dict = {label: [] for label in calls}
    for _ in range(rounds):
        for label, fn in calls.items():
            if label not in times:
                continue
            try:
                times[label].append(timing(fn, rep_ms=rep_ms))
            except Exception as exc:  # noqa: BLE001 - reported through ``failed``
                if failed is None:
                    raise
                failed(label, f"{type(exc).__name__}: {str(exc)[:120]}")
                del times[label]
    return times


def best_alternated(calls: dict, rounds: int, timing=None, rep_ms: int = 100,
                    failed=None) -> dict:
    """label → the best of :func:`alternated`'s rounds: on a small input the GPU's state when a
    timing starts decides as much as the call."""
    return {label: min(ms) for label, ms in
            alternated(calls, rounds, timing, rep_ms, failed).items()}


def measure_ceilings() -> dict:
    """The device's copy bandwidth (bytes read + written) and bf16 GEMM rate, measured now."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    copy = 2 * n / ms / 1e9  # TB/s
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench(lambda: a @ b)
    gemm = 2 * 8192**3 / ms / 1e9  # TFLOP/s
    return {"copy_tbps": copy, "gemm_tflops": gemm}


def same_bytes_copy(moved: float, timing=bench) -> float:
    """GB/s of a device copy that reads and writes ``moved`` bytes in all, timed by ``timing`` as
    the kernel it is set beside: what streaming this many bytes reaches — the ceiling's 2 GiB
    copy spreads the fixed costs of a launch, of the stream's start and end, over far more bytes
    than a kernel of 50–150 MB moves (``benchmarks.packed_decode``: 86 % of it at 134 MB)."""
    src = torch.empty(int(moved) // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return moved / timing(lambda: dst.copy_(src)) / 1e6


def measure_f32_gemm() -> float:
    """The CUDA cores' rate in TFLOP/s, measured now: cuBLAS's f32 GEMM at 8192³ with TF32 off
    (its FMAs counted as 2 operations each) — the ceiling of work that cannot use the tensor
    cores."""
    a = torch.randn(8192, 8192, device="cuda")
    b = torch.randn(8192, 8192, device="cuda")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ms = bench(lambda: a @ b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return 2 * 8192**3 / ms / 1e9


def relative_error(out, ref) -> float:
    out, ref = out.float(), ref.float()
    finite = torch.isfinite(ref)
    if not torch.isfinite(out[finite]).all():
        return math.inf
    return float((out[finite] - ref[finite]).abs().max() / ref[finite].abs().max().clamp_min(1e-30))


# The implementation labels every benchmark writes (``Row.implementation``): tensorfuse as
# ``tf.compile`` runs it, and the alternatives in the same process on the same GPU. A variant of
# tensorfuse (a template picked by hand, tuned records, a CUDA graph) is ``tensorfuse <what>``.
TENSORFUSE = "tensorfuse"
SDPA, SDPA_CUDNN, SDPA_FLASH = "sdpa", "sdpa cudnn", "sdpa flash"
FLEX = "flex_attention"
TORCH_COMPILE, TORCH_EAGER = "torch_compile", "torch_eager"
CUBLAS = "cublas"
LABELS = (TENSORFUSE, SDPA, SDPA_CUDNN, SDPA_FLASH, FLEX, TORCH_COMPILE, TORCH_EAGER, CUBLAS)
# what older runs wrote for them
_SPELLINGS = {"sdpa_cudnn": SDPA_CUDNN, "sdpa_flash": SDPA_FLASH, "sdpa_default": SDPA,
              "torch sdpa": SDPA, "torch.compile": TORCH_COMPILE, "torch": TORCH_EAGER,
              "tensorfuse (tf.compile)": TENSORFUSE, "tensorfuse (tf.compile defaults)": TENSORFUSE,
              "tensorfuse (autograd)": TENSORFUSE}


def sdpa_backends(*args, **kwargs) -> dict:
    """``{SDPA_CUDNN: call, SDPA_FLASH: call}``: SDPA on ``args`` and ``kwargs`` with each of
    those backends forced — the alternatives of an attention a user writes."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def forced(backend):
        def call():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(*args, **kwargs)
        return call
    return {SDPA_CUDNN: forced(SDPBackend.CUDNN_ATTENTION),
            SDPA_FLASH: forced(SDPBackend.FLASH_ATTENTION)}


def canonical_label(label: str) -> str:
    """``label`` in the agreed spelling (:data:`LABELS`; ``tensorfuse <variant>`` for tensorfuse's
    variants, words apart by spaces), whatever spelling a benchmark or an older run used."""
    label = label.strip()
    if label in _SPELLINGS:
        return _SPELLINGS[label]
    if label.startswith(TENSORFUSE):
        rest = label[len(TENSORFUSE):].replace("_", " ").replace("-", " ").replace("(", "")
        rest = " ".join(rest.replace(")", "").split())
        return f"{TENSORFUSE} {rest}" if rest else TENSORFUSE
    return label


def is_alternative(label: str) -> bool:
    """Whether a row times something other than tensorfuse (a baseline to compare with)."""
    return not canonical_label(label).startswith(TENSORFUSE)


def write_csv(rows: list[Row], path: str) -> None:
    """The rows as CSV (labels in the agreed spelling). Name it
    ``benchmarks/results/<date>-<device>-<benchmark>[-<what>].csv`` for ``benchmarks.report``
    (the device with ``_`` for spaces: ``NVIDIA_H200``, ``cpu_2core``). No rows (every
    implementation of a run's first kernel failed its check): the header alone, so that a run
    goes on to its next kernel and the file says nothing was measured."""
    names = [f.name for f in fields(Row)]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        for r in rows:
            writer.writerow({**asdict(r), "implementation": canonical_label(r.implementation)})


def run_and_write(measure, out: str, part: str) -> None:
    """``measure(rows)`` appends rows; they are written to
    ``<out>/<date>-<device>-<part>.csv`` when it returns, and also when it is stopped early
    (Ctrl-C, an exception, ``timeout``'s SIGTERM) with the rows it has."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows: list[Row] = []
    try:
        measure(rows)
    finally:
        if rows:
            device = torch.cuda.get_device_name().replace(" ", "_")
            write_csv(rows, f"{out}/{datetime.date.today()}-{device}-{part}.csv")


def checked_row(benchmark: str, shape: str, label: str, call, error_of, flops: float,
                log=print, poison=None) -> Row | None:
    """One implementation's row of ``benchmark``: ``call`` run once — after ``poison()``, which
    fills the output it writes with NaN, so that a kernel that leaves it alone fails — and its
    result checked (``error_of(result)``: the relative error against float64; over 2e-2 it is
    reported WRONG and not timed, and one that raises is reported), then timed (:func:`bench`),
    TFLOP/s of ``flops``; None where it was not timed."""
    try:
        if poison is not None:
            poison()
        error = error_of(call())
    except Exception as exc:   # noqa: BLE001 - a kernel or backend that does not take the case
        log(f"{shape} {benchmark} {label}: {type(exc).__name__}: {str(exc)[:120]}")
        return None
    if error > 2e-2:
        log(f"{shape} {benchmark} {label}: WRONG (error {error:.1e}); not timed")
        return None
    ms = bench(call)
    log(f"{shape} {benchmark} {label}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s")
    return Row(benchmark, shape, label, ms, flops / ms / 1e9, 0.0, 0.0, f"err {error:.1e}")


def writing_main(measure, part: str, doc: str, argv=None) -> int:
    """The command line of a benchmark whose ``measure(rows)`` is all it runs: ``--out DIR``
    (:func:`run_and_write`'s ``<out>/<date>-<device>-<part>.csv``)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    run_and_write(measure, parser.parse_args(argv).out, part)
    return 0


def measure_candidates(bench_name: str, name: str, shape: str, calls: dict, candidates: dict,
                       warm, run, ref, alternatives: dict, moved: float, pool,
                       log=print, error=None, timing=None) -> list[Row]:
    """Rows of ``bench_name/name``: ``calls`` (label → callable, the alternatives among them run
    as they are, the others through ``run``) and ``candidates`` (label → a kernel, compiled ahead
    on all the CPUs through ``warm``), each checked against float64 ``ref`` (or by
    ``error(result)``, for results of several tensors; a wrong or failing one reported, not
    timed), timed from a CUDA graph (by ``timing``: ``bench_graph``, calls back to back, unless
    given — ``bench_replayed`` flushes L2 before each); the fastest eight printed beside the
    default and the alternatives."""
    from tensorfuse.targets.triton.compile_pool import compiled_as_ready

    calls = dict(calls)
    for label, _ in compiled_as_ready(pool, list(candidates), lambda k: warm(candidates[k])):
        calls[label] = candidates[label]   # in the order their compiles finish
    timed, out = [], []
    for label, f in calls.items():
        call = f if label in alternatives else (lambda f=f: run(f))
        try:
            got = call()
            err = error(got) if error is not None else \
                float((got.double() - ref).abs().max() / ref.abs().max())
            ms = (timing or bench_graph)(call, 100)
        except Exception as exc:  # noqa: BLE001 - a candidate that fails is reported
            log(f"{name} {label}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        if err > 2e-2:
            log(f"{name} {label}: WRONG, error {err:.1e}")
            continue
        timed.append((ms, label))
        out.append(Row(f"{bench_name}/{name}", shape, label, ms, 0.0, moved / ms / 1e6, 0.0,
                       f"err {err:.1e}"))
    timed.sort()
    for ms, label in timed[:8] + [t for t in timed if t[1] == "default" or t[1] in alternatives]:
        log(f"{name:<10} {label:<34} {ms:8.4f} ms {moved / ms / 1e6:7.0f} GB/s")
    return out
