"""The cluster decode's cluster size and clusters per (batch, kv-head) pair, swept on short and
long caches: every (cluster, splits) that fits about one wave, each checked against float64 and
timed beside ``tf.compile``'s default and SDPA (cuDNN and flash) — what the defaults of
:func:`tensorfuse.schedule_templates.cluster.decode_knobs` and the threshold of
:func:`tensorfuse.schedule_templates.decode_plan.splits_for` are chosen from.

    python -m benchmarks.decode_splits [--lengths 1024,4096,16384,131072] [--build-only]
                                       [--out DIR]

Rows ``decode_splits/<heads>`` (``mqa`` 8/1, ``gqa`` 32/8 and 64/8, ``mha`` 32/32), one per
(shape, implementation); ``tensorfuse cluster=C splits=S`` for a candidate (``S``: the splits
the launch takes at this key count), ``tensorfuse`` for the default. Milliseconds with L2
flushed between calls (``bench``, as ``benchmarks.decode_grid``), GB/s and the fraction of the
copy bandwidth. ``--build-only`` compiles every candidate's kernel into the build cache (no GPU
needed: nvcc), so that a GPU run spends its time measuring.
CSV ``benchmarks/results/<date>-<device>-decode-splits.csv``.
"""
from __future__ import annotations

import argparse
import functools

SHAPES = [(1, 8, 1), (4, 8, 1), (8, 8, 1), (1, 32, 8), (1, 64, 8), (4, 32, 8), (4, 32, 32)]
CLUSTERS = (16, 8, 4, 2, 1)
SPLITS = (1, 2, 4, 8, 16, 32)
MOST_CTAS = 160   # candidates up to about one wave of one CTA per SM (132 on the H200)
WARPS = 4         # the default at head dim 128


def _variant(hq: int, hkv: int) -> str:
    return "mqa" if hkv == 1 else "mha" if hq == hkv else "gqa"


def candidates(pairs: int, keys: int) -> list[tuple[int, int]]:
    """(cluster, splits) pairs of about one wave, deduplicated by the splits a launch over
    ``keys`` keys takes."""
    from tensorfuse.schedule_templates.decode_plan import DecodeKnobs, splits_for

    seen = []
    for c in CLUSTERS:
        for s in SPLITS:
            if c * s * pairs > MOST_CTAS:
                continue
            taken = splits_for(DecodeKnobs(cluster=c, warps=WARPS, splits=s), keys)
            if (c, taken) not in seen:
                seen.append((c, taken))
    return seen


@functools.lru_cache(maxsize=None)
def _kernel(cluster: int, splits: int):
    import tensorfuse as tf
    import tensorfuse.kernels as K

    sch = tf.schedule(K.gqa_attention, target="cuda:sm_90a")
    sch.rolling_update("m", "l", "o", axis="j")
    sch.cluster_distribute("j", cluster=cluster, splits=splits, warps=WARPS)
    return sch.compile()


def build_only(lengths) -> None:
    from tensorfuse.targets.cuda.module import cubin_for

    for B, hq, hkv in SHAPES:
        for c in {c for n in lengths for c, _ in candidates(B * hkv, n)}:
            made = _kernel(c, 1)
            cubin_for(made.source(B=B, H=hq, HKV=hkv, M=1, N=max(lengths), D=128), made.target)


def run(lengths, rows: list, log=print) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tensorfuse as tf
    import tensorfuse.kernels as K
    from benchmarks.common import (SDPA_CUDNN, SDPA_FLASH, TENSORFUSE, Row, bench,
                                   measure_ceilings, relative_error)
    from benchmarks.decode_grid import reference

    D = 128
    scale = D ** -0.5
    copy = measure_ceilings()["copy_tbps"]
    default = tf.compile(K.gqa_attention, "cuda")

    def sdpa(backend):
        def call(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
        return call

    for (B, hq, hkv), N in ((s, n) for s in SHAPES for n in lengths):
        q = torch.randn(B, hq, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, hkv, N, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, hkv, N, D, device="cuda", dtype=torch.bfloat16)
        want = reference(q, k, v, scale)
        moved = 2 * k.numel() * 2 + 2 * q.numel() * 2
        shape = f"B{B} Hq{hq} Hkv{hkv} N{N} D{D} bf16"
        knobs = default.for_sizes(B=B, H=hq, HKV=hkv, M=1, N=N, D=D).launches(
            B=B, H=hq, HKV=hkv, M=1, N=N, D=D).knobs
        impls = {TENSORFUSE: lambda: default(q, k, v, scale=scale),
                 SDPA_CUDNN: functools.partial(sdpa(SDPBackend.CUDNN_ATTENTION), q, k, v),
                 SDPA_FLASH: functools.partial(sdpa(SDPBackend.FLASH_ATTENTION), q, k, v)}
        for c, s in candidates(B * hkv, N):
            impls[f"{TENSORFUSE} cluster={c} splits={s}"] = functools.partial(
                _kernel(c, s), q, k, v, scale=scale)
        timed = {}
        for label, fn in impls.items():
            try:
                err = relative_error(fn(), want)
            except Exception as exc:  # noqa: BLE001 - a backend that does not take the shape
                log(f"  {shape} {label}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            if not err <= 2e-2:
                log(f"  {shape} {label}: WRONG (error {err:.1e})")
                continue
            ms = bench(fn, rep_ms=25)
            timed[label] = ms
            note = f"err {err:.1e}" + (f"; default {knobs}" if label == TENSORFUSE else "")
            gbps = moved / ms / 1e6
            rows.append(Row(f"decode_splits/{_variant(hq, hkv)}", shape, label, ms, 0.0, gbps,
                            gbps / 1e3 / copy, note))
        ours = {label: ms for label, ms in timed.items() if label.startswith(TENSORFUSE + " ")}
        best = min(ours.items(), key=lambda x: x[1]) if ours else ("-", float("nan"))
        sdpa_best = min(ms for label, ms in timed.items() if label.startswith("sdpa"))
        log(f"{shape}: default ({knobs.cluster}, {knobs.splits}) "
            f"{timed.get(TENSORFUSE, float('nan')) * 1e3:6.1f} us; best {best[0][11:]} "
            f"{best[1] * 1e3:6.1f} us; sdpa {sdpa_best * 1e3:6.1f} us")


def main() -> None:
    import warnings

    from benchmarks.common import run_and_write

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,4096,16384,131072")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.build_only:
        build_only(lengths)
        return
    warnings.filterwarnings("ignore", message=".*(kernel not used|runtime disabled|same num_heads)")
    run_and_write(lambda rows: run(lengths, rows), args.out, "decode-splits")


if __name__ == "__main__":
    main()
