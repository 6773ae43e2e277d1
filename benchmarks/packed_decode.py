"""Decode with a group's query heads as the rows of the Hopper attention kernel: the plan for
heads that share one cache (issue "Generality at template speed", item 4), measured before it is
built into ``tf.compile``.

A decode's ``q[B, H, 1, D]`` over ``k, v[B, HKV, N, D]`` is, as data, attention of ``B·HKV``
heads of ``G = H / HKV`` query rows each over their own keys: ``q.view(B, HKV, G, D)``
(``schedule_templates/packed_rows.py``). The Hopper attention kernel then computes a group's
scores with one ``wgmma`` tile (heads as M), reading the cache once per group; its few tiles (one
per (batch, kv-head)) are cut along the keys over every CTA (``schedule="split"``). This times
that against ``tf.compile``'s decode (whichever route it takes: packed, the cluster kernel, the
Triton split update; also for the decode written without the kv-head axis, ``k[b, j, d]``) and
SDPA, each tensorfuse result checked against float64 first.

    python -m benchmarks.packed_decode [--build-only] [--only B/H/HKV/N,...] [--out DIR]
"""
from __future__ import annotations

import argparse
import functools

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.common import (SDPA_CUDNN, SDPA_FLASH, TENSORFUSE, Row, bench_replayed,
                               measure_ceilings, relative_error, run_and_write,
                               same_bytes_copy)
from benchmarks.user_kernels import mqa_decode
from tensorfuse.schedule_templates.fusion import Fusion
from tensorfuse.schedule_templates.packed_kernel import packed_attention
from tensorfuse.targets import get_target

CHAIN = ("m", "l", "o")
# (B, H, HKV, N): large groups on one cache (where the cluster kernel's teams are compute-bound
# on mma.sync), MQA at few pairs (a tile or two cut over every SM), and a GQA group of 4 for
# comparison
CASES = ((16, 64, 1, 16384), (16, 128, 1, 16384), (1, 64, 1, 131072), (8, 32, 1, 32768),
         (1, 128, 1, 131072), (4, 128, 1, 32768), (1, 128, 1, 8192), (2, 64, 1, 65536),
         (1, 64, 1, 8192), (2, 32, 1, 65536), (1, 32, 1, 32768), (1, 8, 1, 131072),
         (4, 8, 1, 131072), (8, 32, 8, 32768), (64, 32, 8, 1024))
D = 128
TOLERANCE = 1e-2   # bf16 outputs


def packed(**knobs):
    """The library's GQA decode with each kv-head's heads as rows (``packed_attention``: the
    Hopper attention kernel, split over the CTAs), with these knobs."""
    return packed_attention(K.gqa_attention, Fusion(CHAIN, "j", 32), get_target("cuda:sm_90a"),
                            **knobs)


def measure(rows: list, log=print, cases=CASES) -> None:
    copy = measure_ceilings()["copy_tbps"] * 1e3   # GB/s
    made = variants(torch.cuda.get_device_properties(0).multi_processor_count)
    for B, H, HKV, N in cases:
        G = H // HKV
        q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16) * 3
        scale = D ** -0.5
        kd, vd = (t.double().repeat_interleave(G, 1) for t in (k, v))
        want = torch.softmax(q.double() @ kd.transpose(-1, -2) * scale, -1) @ vd
        moved = 2 * B * HKV * N * D * 2   # the cache, read once
        name, shape = f"packed_decode/{H}_{HKV}", f"B{B} H{H}/{HKV} N{N} D{D}"
        calls = {}
        for label, kernel in made.items():
            if G > 64 and "c1" in label:
                continue   # 64 rows a consumer warpgroup
            out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
            error = relative_error(kernel(q, k, v, scale, out=out), want)
            if error > TOLERANCE:
                log(f"{shape} {label}: WRONG (error {error:.1e}); not timed")
                continue
            calls[f"{TENSORFUSE} {label}"] = (lambda f=kernel: f(q, k, v, scale))
        default = tf.compile(K.gqa_attention)
        if relative_error(default(q, k, v, scale), want) <= TOLERANCE:
            calls[TENSORFUSE] = lambda: default(q, k, v, scale)
        if HKV == 1:   # the cache written without a kv-head axis: tf.compile's, and packed
            args = (q.view(B, H, D), k.view(B, N, D), v.view(B, N, D), scale)
            for label, three in ((f"{TENSORFUSE} 3-D", tf.compile(mqa_decode)),
                                 (f"{TENSORFUSE} packed c{1 + (G > 64)} 3-D",
                                  packed_attention(mqa_decode, Fusion(CHAIN, "j", 32),
                                                   get_target("cuda:sm_90a"),
                                                   consumers=1 + (G > 64)))):
                if relative_error(three(*args).view(B, H, 1, D), want) <= TOLERANCE:
                    calls[label] = (lambda f=three: f(*args))
                else:
                    log(f"{shape} {label}: WRONG; not timed")
        for label, backend in ((SDPA_CUDNN, SDPBackend.CUDNN_ATTENTION),
                               (SDPA_FLASH, SDPBackend.FLASH_ATTENTION)):
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, scale=scale, enable_gqa=True)
            calls[label] = sdpa
        same = same_bytes_copy(moved, bench_replayed)
        for label, call in calls.items():
            try:
                ms = bench_replayed(call)
            except RuntimeError as exc:   # a backend that does not take the shape
                log(f"{shape} {label}: {str(exc)[:120]}")
                continue
            gbps = moved / ms / 1e6
            note = f"a copy moving the same bytes: {same:.0f} GB/s ({gbps / same:.0%} of it)"
            rows.append(Row(name, shape, label, ms, 0.0, gbps, gbps / copy, note))
            log(f"{shape} {label}: {ms * 1e3:.1f} µs, {gbps:.0f} GB/s ({gbps / copy:.0%}; "
                f"{gbps / same:.0%} of a copy of the same bytes)")


def variants(sms: int = 132) -> dict:
    """The packed kernels timed: one consumer warpgroup (64 rows: groups up to 64 heads), two
    CTAs an SM of it (64-key blocks fit twice), two consumers (128 rows); and one consumer with
    the keys cut into pieces for two and three waves of CTAs on ``sms`` SMs, claimed as CTAs
    free up — Nsight Compute showed the one-wave split's SMs busy 77 % of its time (B16, 64
    heads on one cache, 16k keys; SDPA flash's split-KV 89 %)."""
    return {"packed c1": packed(consumers=1),
            "packed c1 2/SM": packed(consumers=1, ctas_per_sm=2, block_n=64),
            "packed c2": packed(consumers=2),
            "packed c1 2 waves": packed(consumers=1, ctas=2 * sms),
            "packed c1 3 waves": packed(consumers=1, ctas=3 * sms)}


def build_only(cases=CASES) -> None:
    """Every packed kernel's cubin into the build cache (``$TENSORFUSE_CACHE``; no GPU needed),
    so that a GPU run spends its time measuring."""
    from tensorfuse.targets.cuda.module import cubin_for

    for label, kernel in variants().items():
        for B, H, HKV, N in cases:
            if H // HKV > 64 and "c1" in label:
                continue
            cubin_for(kernel.source(B=B, H=H, HKV=HKV, M=1, N=N, D=D), kernel.target)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--build-only", action="store_true",
                        help="compile the packed kernels into the build cache and stop")
    parser.add_argument("--only", default="",
                        help="cases as B/H/HKV/N, comma-separated (default: every case)")
    args = parser.parse_args(argv)
    cases = CASES
    if args.only:
        cases = tuple(tuple(int(x) for x in case.split("/")) for case in args.only.split(","))
        if any(len(case) != 4 for case in cases):
            parser.error("--only takes cases as B/H/HKV/N, e.g. 1/64/1/131072")
    if args.build_only:
        build_only(cases)
        return 0
    # a run of some cases is a part of the benchmark: the report keeps the other cases' rows
    part = "packed-decode" + "".join(f"-{B}-{H}-{HKV}-{N}" for B, H, HKV, N in cases) \
        if args.only else "packed-decode"
    run_and_write(functools.partial(measure, cases=cases), args.out, part)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
