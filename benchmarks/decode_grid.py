"""Dense decode (one query token per sequence) over a grid of batch sizes, head layouts and cache
lengths: ``tf.compile``'s default beside every SDPA backend that runs the shape and FlexAttention,
in the same process on the same GPU.

    python -m benchmarks.decode_grid [--dtypes bf16,fp16] [--batches 1,4,8,64]
                                     [--lengths 1024,4096,16384,32768,131072] [--routes]
                                     [--replayed] [--part NAME] [--out DIR]

Rows ``decode/<heads>`` (``mha`` 32/32, ``gqa`` 32/8 and 64/8, ``mqa`` 8/1 query/KV heads), one
per (shape, implementation): milliseconds (``bench``: L2 flushed between calls, so a small cache
is read from memory as a large one is; the best of three rounds, the implementations taking
turns), GB/s of the cache, query and output moved, and the fraction of the copy bandwidth
measured in the same run; with ``--routes`` also the cluster decode
kernel and the split update forced (bf16), what ``tf.compile``'s choice between them is made from.
Each output is checked against a float64
reference (per sequence, so that the reference fits in memory); a wrong one is reported and not
timed. Caches over ``--max-gb`` are left out; a run stopped early (Ctrl-C, ``timeout``) writes the
rows it has.
``--replayed``: each call's GPU time, captured in a CUDA graph and replayed with L2 flushed
(``bench_replayed``) — on small caches ``do_bench`` times the host path of every implementation
as much as its kernel. CSV ``benchmarks/results/<date>-<device>-decode-grid.csv``
(``…-decode-grid-replayed.csv``).
"""
from __future__ import annotations

import argparse
import functools
import gc
import itertools
import math
import warnings

import torch

from benchmarks.common import (FLEX, SDPA_CUDNN, SDPA_FLASH, TENSORFUSE, Row, bench,
                               bench_replayed, best_alternated, measure_ceilings, relative_error,
                               run_and_write)

HEADS = {"gqa": [(32, 8), (64, 8)], "mha": [(32, 32)], "mqa": [(8, 1)]}
SDPA_EFFICIENT = "sdpa efficient"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3}


def reference(q, k, v, scale: float) -> torch.Tensor:
    """Softmax attention of one query token in float64, a sequence at a time."""
    B, hq, _, D = q.shape
    hkv = k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for b in range(B):
        grouped = q[b].double().view(hkv, hq // hkv, D)   # the query heads of each KV head
        s = grouped @ k[b].double().transpose(-1, -2) * scale
        out[b] = (torch.softmax(s, -1) @ v[b].double()).view(hq, 1, D)
    return out


def fp16_attention():
    """The library's GQA attention written for fp16 tensors, as a user would (the library's
    kernels are declared bf16)."""
    import tensorfuse as tf
    from tensorfuse import dsl as T
    from tensorfuse.kernels.attention import scores, softmax_attend

    @tf.kernel
    def gqa_attention_f16(q: T.Tensor["B", "H", "M", "D", "f16"],
                          k: T.Tensor["B", "HKV", "N", "D", "f16"],
                          v: T.Tensor["B", "HKV", "N", "D", "f16"], scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        hk = h // (T.size("H") // T.size("HKV"))
        return softmax_attend(scores(q, k, b, h, hk, i, j, d, scale), v[b, hk, j, e], j)
    return gqa_attention_f16


def forced_routes(scale: float) -> dict:
    """The library's GQA attention (bf16) on the cluster decode kernel and on the split update
    (the Triton decode kernel), each forced: which ``tf.compile`` should take where
    (``decode_plan.cluster_decode_pays``)."""
    from benchmarks.cluster import cluster_decode, split_update_decode

    made = {f"{TENSORFUSE} cluster": cluster_decode(),
            f"{TENSORFUSE} split update": split_update_decode()}

    return {label: lambda q, k, v, f=kernel: f(q, k, v, scale=scale)
            for label, kernel in made.items()}


def implementations(scale: float) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import flex_attention

    import tensorfuse as tf
    import tensorfuse.kernels as K

    made = {torch.bfloat16: tf.compile(K.gqa_attention, "cuda"),
            torch.float16: tf.compile(fp16_attention(), "cuda")}
    # one compile per batch size and 32-bit indexing class: the grid's shapes would pass the
    # default limit of 8 recompiles and run the rest uncompiled
    torch._dynamo.config.recompile_limit = 64
    flex = torch.compile(flex_attention, dynamic=True)

    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
        return run

    return {TENSORFUSE: lambda q, k, v: made[q.dtype](q, k, v, scale=scale),
            SDPA_CUDNN: sdpa(SDPBackend.CUDNN_ATTENTION),
            SDPA_FLASH: sdpa(SDPBackend.FLASH_ATTENTION),
            SDPA_EFFICIENT: sdpa(SDPBackend.EFFICIENT_ATTENTION),
            FLEX: lambda q, k, v: flex(q, k, v, scale=scale, enable_gqa=True)}, made


def run(dtypes, batches, lengths, max_gb: float, rows: list, log=print,
        routes: bool = False, replayed: bool = False) -> None:
    """Appends the grid's rows to ``rows`` (kept by the caller if a shape fails); ``routes``:
    with the cluster kernel and the split update forced beside ``tf.compile``'s choice;
    ``replayed``: GPU time of each call captured in a CUDA graph (``bench_replayed``, L2 flushed
    before each replay), where ``bench`` times small caches' host paths as much as their
    kernels."""
    D = 128
    scale = D ** -0.5
    copy = measure_ceilings()["copy_tbps"]
    impls, made = implementations(scale)
    forced = forced_routes(scale) if routes else {}
    impls_of = {dtype: {**impls, **(forced if dtype == torch.bfloat16 else {})}   # routes: bf16
                for dtype in dtypes.values()}
    grid = sorted(((name, dtype, variant, hq, hkv, B, N) for (name, dtype), (variant, heads), B, N
                   in itertools.product(dtypes.items(), HEADS.items(), batches, lengths)
                   for hq, hkv in heads), key=lambda c: c[5] * c[4] * c[6])   # smallest first
    _warm_up(impls_of, grid, min(lengths), D)
    timer = bench_replayed if replayed else bench
    for name, dtype, variant, hq, hkv, B, N in grid:
        cache = 2 * B * hkv * N * D * dtype.itemsize
        if cache > max_gb * 1e9:
            continue
        q = torch.randn(B, hq, 1, D, device="cuda", dtype=dtype)
        k = torch.randn(B, hkv, N, D, device="cuda", dtype=dtype)
        v = torch.randn(B, hkv, N, D, device="cuda", dtype=dtype)
        want = reference(q, k, v, scale)
        moved = cache + 2 * q.numel() * dtype.itemsize
        shape = f"B{B} Hq{hq} Hkv{hkv} N{N} D{D} {name}"
        checked = {}
        for label, fn in impls_of[dtype].items():
            try:
                err = relative_error(fn(q, k, v), want)
            except Exception as exc:  # noqa: BLE001 - a backend that does not take it
                log(f"  {shape} {label}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            if not err <= TOLERANCE[dtype]:
                log(f"  {shape} {label}: WRONG (error {err:.1e})")
                rows.append(Row(f"decode/{variant}", shape, label, math.nan, 0.0, 0.0, 0.0,
                                f"wrong: error {err:.1e}"))
                continue
            checked[label] = err
        timed, before = {}, torch.cuda.memory_allocated()
        for label, ms in best_alternated(
                {label: functools.partial(impls_of[dtype][label], q, k, v) for label in checked},
                ROUNDS, timer, 60, lambda label, why: log(f"  {shape} {label}: not timed: {why}")
                ).items():
            timed[label] = ms
            note = f"err {checked[label]:.1e}; best of {ROUNDS} alternated rounds"
            if label == TENSORFUSE:
                chosen = made[dtype].for_sizes(B=B, H=hq, HKV=hkv, M=1, N=N, D=D)
                note += f"; {chosen.description}"
            gbps = moved / ms / 1e6
            rows.append(Row(f"decode/{variant}", shape, label, ms, 0.0, gbps,
                            gbps / 1e3 / copy, note))
        gc.collect()
        kept = torch.cuda.memory_allocated() - before
        if kept > 1e8:   # memory the implementations hold on to after their calls
            log(f"  {shape}: {kept / 1e9:.2f} GB more allocated after the timed calls")
        others = [ms for label, ms in timed.items() if not label.startswith(TENSORFUSE)]
        if TENSORFUSE in timed and others:
            best = min((ms, label) for label, ms in timed.items()
                       if not label.startswith(TENSORFUSE))
            log(f"{shape}: tensorfuse {timed[TENSORFUSE] * 1e3:7.1f} us, "
                f"{best[0] / timed[TENSORFUSE]:.2f}x {best[1]} (best of {len(others)}), "
                f"{moved / timed[TENSORFUSE] / 1e9 / copy:.0%} of copy")
        del q, k, v, want
        gc.collect()
        torch.cuda.empty_cache()
        held = torch.cuda.memory_allocated() / 1e9
        if held > 1:
            log(f"  {held:.1f} GB still allocated after {shape}")


# rounds each implementation is timed in, taking turns (as benchmarks.decode_splits): single
# timings of small caches depend on the GPU's state when each starts as much as on the kernel
ROUNDS = 3


def _warm_up(impls_of: dict, grid: list, keys: int, D: int) -> None:
    """Every implementation (``impls_of[dtype]``) called once at each (dtype, heads, batch) of
    the grid before any is timed. The first shapes of a run — the smallest, whose calls are
    bound by the host — had SDPA rows 1.5–6× slower than other runs had; FlexAttention (dynamic
    shapes) compiling again for each new batch size is the likely cause, and its compiles now
    come first. What fails here is reported where the grid checks it."""
    for dtype, hq, hkv, B in {(c[1], c[3], c[4], c[5]) for c in grid}:
        q = torch.randn(B, hq, 1, D, device="cuda", dtype=dtype)
        k, v = (torch.randn(B, hkv, keys, D, device="cuda", dtype=dtype) for _ in range(2))
        for fn in impls_of[dtype].values():
            try:
                fn(q, k, v)
            except Exception:  # noqa: BLE001, S110 - reported where the grid times it
                pass
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--batches", default="1,4,8,64")
    parser.add_argument("--lengths", default="1024,4096,16384,32768,131072")
    parser.add_argument("--max-gb", type=float, default=40.0)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--routes", action="store_true",
                        help="time the cluster kernel and the split update forced too (on the "
                             "bf16 shapes)")
    parser.add_argument("--replayed", action="store_true",
                        help="GPU time of captured calls (bench_replayed), not do_bench's")
    parser.add_argument("--part", default="",
                        help="a run of part of the grid: its CSV is decode-grid-PART, and the "
                             "report keeps the whole grid's other cases")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*(kernel not used|runtime disabled|same num_heads)")
    dtypes = {n: DTYPES[n] for n in args.dtypes.split(",")}
    run_and_write(lambda rows: run(dtypes, [int(b) for b in args.batches.split(",")],
                                   [int(n) for n in args.lengths.split(",")], args.max_gb, rows,
                                   routes=args.routes, replayed=args.replayed),
                  args.out, "decode-grid" + ("-replayed" if args.replayed else "")
                  + (f"-{args.part}" if args.part else ""))


if __name__ == "__main__":
    main()
