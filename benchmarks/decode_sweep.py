"""Decode (one query token) at the shapes of the call-path issue, every way tensorfuse can run it:
``tf.compile``'s default, the split-update template over a grid of splits and key tiles, and
cluster decode (sm_90a), beside SDPA; GPU time by CUDA-graph replay and wall clock per call.

    python -m benchmarks.decode_sweep [--csv PATH] [--quick | --pipeline]
"""
from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.nn.functional as F

from benchmarks.common import Row, bench_graph, relative_error, write_csv
from benchmarks.overhead import wall_ms

SHAPES = [(1, 32, 8, 4096), (4, 64, 8, 4096), (4, 32, 32, 4096), (1, 32, 8, 32768),
          (8, 32, 8, 32768)]
SPLITS = (4, 8, 16, 32, 64)
TILES = (64, 128)


PIPELINE = dict(splits=(2, 4, 8), tile_n=(64, 128), warps=(4, 8), stages=(2, 3, 4))


def candidates(kernel, hq: int, hkv: int, quick: bool = False, pipeline: bool = False):
    import tensorfuse as tf

    yield "default", tf.compile(kernel, "cuda")
    if pipeline:   # the split update's warps and software-pipeline depth too
        for splits, tile_n, warps, stages in itertools.product(*PIPELINE.values()):
            sch = tf.schedule(kernel, "cuda")
            sch.rolling_update("m", "l", "o", axis="j")
            sch.apply_template("attention", tile_m=16, tile_n=tile_n, splits=splits,
                               num_warps=warps, num_stages=stages)
            yield f"split{splits}_n{tile_n}_w{warps}_s{stages}", sch.compile()
        return
    for tile_n in () if quick else TILES:
        for splits in SPLITS:
            sch = tf.schedule(kernel, "cuda")
            sch.rolling_update("m", "l", "o", axis="j")
            sch.apply_template("attention", tile_m=16, tile_n=tile_n, splits=splits)
            yield f"split{splits}_n{tile_n}", sch.compile()
    if torch.cuda.get_device_capability() >= (9, 0):
        sch = tf.schedule(kernel, "cuda:sm_90a")
        sch.rolling_update("m", "l", "o", axis="j")
        sch.cluster_distribute("j")
        yield "cluster", sch.compile()


def run(log=print, quick: bool = False, pipeline: bool = False) -> list[Row]:
    import tensorfuse.kernels as K

    rows = []
    for b, hq, hkv, n in SHAPES:
        if pipeline and (b, n) != (4, 4096):   # the B=4 shapes short of SDPA
            continue
        shape = f"B{b} H{hq}/{hkv} N{n}"
        q = torch.randn(b, hq, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, n, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        scale = 128 ** -0.5
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale,
                                             enable_gqa=hq != hkv)
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, scale=scale,  # noqa: E731
                                                      enable_gqa=hq != hkv)
        bytes_moved = 2 * k.numel() * 2 + 2 * q.numel() * 2
        results = [("sdpa", sdpa, "")]
        kernel = K.gqa_attention if hq != hkv else K.attention
        for name, f in candidates(kernel, hq, hkv, quick, pipeline):
            call = lambda f=f: f(q, k, v, scale=scale)  # noqa: E731
            try:
                err = relative_error(call(), ref)
            except Exception as exc:  # noqa: BLE001 - a candidate that does not build is data
                log(f"{shape:22s} {name:14s} {type(exc).__name__}: {str(exc)[:120]}")
                continue
            note = f"err {err:.1e}" + (" WRONG" if err > 2e-2 else "")
            results.append((name, call, note))
        for name, call, note in results:
            gpu = bench_graph(call, rep_ms=100)
            wall = wall_ms(call, 500)
            rows.append(Row("decode_sweep", shape, name, gpu, 0.0, bytes_moved / gpu / 1e6, 0.0,
                            f"wall {wall * 1e3:.1f} us; {note}"))
            log(f"{shape:22s} {name:14s} GPU {gpu * 1e3:8.1f} us  wall {wall * 1e3:8.1f} us  "
                f"{bytes_moved / gpu / 1e6:7.0f} GB/s  {note}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--csv", default=None)
    parser.add_argument("--quick", action="store_true", help="the default, cluster and SDPA only")
    parser.add_argument("--pipeline", action="store_true",
                        help="B=4 only: splits × key tile × warps × pipeline stages")
    args = parser.parse_args(argv)
    rows = run(quick=args.quick, pipeline=args.pipeline)
    if args.csv:
        write_csv(rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
