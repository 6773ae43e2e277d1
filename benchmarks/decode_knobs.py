"""The split update's knobs on the user suite's decodes — many query heads on one cache (MQA),
GQA written without a query axis, a paged cache swept as one axis — each candidate checked
against float64 and timed from a CUDA graph beside ``tf.compile``'s default and SDPA: what the
decode defaults of :mod:`tensorfuse.schedule_templates.attention` are chosen from.

    python -m benchmarks.decode_knobs [--only mqa,mqa128,gqa,paged] [--defaults] [--out DIR]
    python -m benchmarks.decode_knobs --only grid --grid 64:32/8:4096,4:8/1:131072

``--defaults``: ``tf.compile``'s default and SDPA only (no candidates). ``grid``: shapes of
``benchmarks.decode_grid`` (``batch:query heads/kv heads:keys``, the library's GQA attention on
``[B, H, 1, D]`` queries) with the cluster decode's knobs as candidates beside the split
update's (``cluster w… s… copy``; their cubins can be built ahead on a machine without a GPU:
``tools/precompile_cubins.py decode``).
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import math
from tensorfuse.dsl.program import ProgramKernel

import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.common import Row, measure_candidates, write_csv
from benchmarks.user_kernels import (_decode_reference, _decode_sdpa, gqa_decode, mqa_decode,
                                     paged_decode)
from tensorfuse.schedule_templates.attention import SMS, attention
from tensorfuse.schedule_templates.decode_plan import COPIES
from tensorfuse.schedule_templates.fusion import Fusion
from tensorfuse.schedule_templates.flat_sweeps import flatten_sweeps
from tensorfuse.schedule_templates.rolling_update import DEFAULT_CHUNK
from tensorfuse.targets import get_target


def _cases(generator, only, grid=()):
    """(name, shape, kernel whose program the candidates take, axis, args, sizes, rows per
    batch entry, reference, SDPA calls, bytes of the cache)."""
    for B, H, HKV, N in grid if "grid" in only else ():
        D = 128
        q, k, v = grid_inputs(B, H, HKV, N, D, "cuda")
        yield (f"grid{H}_{HKV}", f"B{B} Hq{H} Hkv{HKV} N{N} D{D} bf16", K.gqa_attention, "j",
               (q, k, v), dict(B=B, H=H, HKV=HKV, M=1, N=N, D=D), H // HKV, B * HKV,
               _decode_reference(q[:, :, 0], k, v, D ** -0.5),
               _decode_sdpa(q, k, v, D ** -0.5, gqa=True), 4 * k.numel())
    for H in [h for h, name in ((64, "mqa"), (128, "mqa128")) if name in only]:
        B, N, D = 16, 16384, 128
        q = torch.randn(B, H, D, generator=generator).to("cuda", torch.bfloat16)
        k, v = (torch.randn(B, N, D, generator=generator).to("cuda", torch.bfloat16)
                for _ in range(2))
        yield ("mqa" if H == 64 else "mqa128", f"B{B} H{H}/1 N{N} D{D}", mqa_decode, "j",
               (q, k, v), dict(B=B, H=H, N=N, D=D),
               H, B, _decode_reference(q, k[:, None], v[:, None], D ** -0.5),
               _decode_sdpa(q[:, :, None], k[:, None], v[:, None], D ** -0.5, gqa=True),
               4 * k.numel())
    B, H, HKV, N, D, PAGE = 8, 32, 8, 32768, 128, 64
    q = torch.randn(B, H, D, generator=generator).to("cuda", torch.bfloat16)
    k, v = (torch.randn(B, HKV, N, D, generator=generator).to("cuda", torch.bfloat16)
            for _ in range(2))
    ref = _decode_reference(q, k, v, D ** -0.5)
    sdpa = _decode_sdpa(q[:, :, None], k, v, D ** -0.5, gqa=True)
    if "gqa" in only:
        yield ("gqa", f"B{B} H{H}/{HKV} N{N} D{D}", gqa_decode, "j", (q, k, v),
               dict(B=B, H=H, HKV=HKV, N=N, D=D), H // HKV, B * HKV, ref, sdpa, 4 * k.numel())
    if "paged" in only:
        pages = B * N // PAGE
        table = torch.randperm(pages, generator=generator).reshape(B, N // PAGE).to("cuda",
                                                                                     torch.int32)
        pool = [torch.empty(pages, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
                for _ in range(2)]
        for dst, src in zip(pool, (k, v)):   # page table[b, p] holds keys p·PAGE … of sequence b
            dst[table.long()] = src.reshape(B, HKV, N // PAGE, PAGE, D).permute(0, 2, 3, 1, 4)
        sizes = dict(B=B, H=H, HKV=HKV, D=D, PAGES=pages, PAGE=PAGE, NP=N // PAGE)
        flat = flatten_sweeps(paged_decode.program, sizes)
        yield ("paged", f"B{B} H{H}/{HKV} N{N} D{D} pages of {PAGE}",
               ProgramKernel(flat), "pt",
               (q, *pool, table), sizes, H // HKV, B * HKV, ref, sdpa, 4 * k.numel())


# the decode grid's shapes that were behind cuDNN (``benchmarks.decode_grid``), as
# ``batch:query heads/kv heads:keys``
GRID = "64:32/8:4096,64:64/8:4096,4:32/32:4096,8:32/32:4096,4:8/1:131072"


def parse_grid(text: str) -> list[tuple[int, int, int, int]]:
    """``"64:32/8:4096,…"`` as (batch, query heads, kv heads, keys) tuples."""
    out = []
    for item in filter(None, text.split(",")):
        batch, heads, keys = item.split(":")
        hq, hkv = heads.split("/")
        out.append((int(batch), int(hq), int(hkv), int(keys)))
    return out


def grid_inputs(B: int, H: int, HKV: int, N: int, D: int, device: str):
    """bf16 ``q [B, H, 1, D]``, ``k, v [B, HKV, N, D]`` of normal numbers on ``device``."""
    generator = torch.Generator(device=device).manual_seed(B * 7 + N)
    return tuple(torch.randn(B, h, n, D, generator=generator, device=device).to(torch.bfloat16)
                 for h, n in ((H, 1), (HKV, N), (HKV, N)))


def cluster_knobs(group: int):
    """Cluster-decode candidates for a group of ``group`` heads a kv-head: warps × stages ×
    copy, at the template's cluster size and splits (which the pairs decide); a team of warps
    (more than 16 heads) by TMA alone, its warps a multiple of the team's, its buffers within
    an SM's shared memory."""
    from tensorfuse.schedule_templates.decode_plan import MAX_STAGES, DecodeKnobs
    from tensorfuse.targets.cuda.cluster_decode import decode_fits, head_tiles

    for warps, stages, copy in itertools.product((2, 4, 8, 16), (2, 3, 4, 6, MAX_STAGES),
                                                 COPIES):
        knobs = DecodeKnobs(warps=warps, stages=stages, copy=copy)
        if group > 16 and copy != "tma" or warps % head_tiles(knobs, group) or \
                not decode_fits(knobs, 128, group, get_target("cuda:sm_90a").max_shared_memory):
            continue
        yield dict(warps=warps, stages=stages, copy=copy)


def cluster_candidates(group: int) -> dict:
    """Label → the library's GQA attention on the cluster decode at each of
    :func:`cluster_knobs`."""
    from benchmarks.cluster import cluster_decode

    return {f"cluster w{c['warps']} s{c['stages']} {c['copy']}": cluster_decode(**c)
            for c in cluster_knobs(group)}


def _knobs(rows: int, batch: int, keys: int):
    """Candidate (tile_m, tile_n, warps, stages, splits): row tiles up to the rows sharing the
    cache, parts of the keys for about 1, 2 and 4 programs per SM."""
    tiles_m = [16] + [m for m in (32, 64, 128) if m <= max(16, rows)]
    for tile_m, tile_n, warps, stages in itertools.product(tiles_m, (64, 128), (4, 8), (2, 3, 4)):
        programs = batch * math.ceil(rows / tile_m)
        blocks = math.ceil(keys / tile_n)
        splits = sorted({max(1, min(blocks // 2, round(k * SMS / programs))) for k in (1, 2, 4)})
        for s in splits:
            yield tile_m, tile_n, warps, stages, s


def run(only, log=print, defaults: bool = False, grid=()) -> list[Row]:
    from tensorfuse.targets.triton.compile_pool import CompilePool

    spec = get_target("cuda:sm_90a")
    generator = torch.Generator().manual_seed(0)
    out: list[Row] = []
    pool = CompilePool()
    try:
        for name, shape, kernel, axis, args, sizes, rows, batch, ref, sdpa, moved in \
                _cases(generator, only, grid):
            scale = sizes["D"] ** -0.5
            fusion = Fusion(("m", "o", "l"), axis, DEFAULT_CHUNK)
            keys = math.prod(v for k, v in sizes.items() if k in ("N", "NP", "PAGE"))
            knobs = [] if defaults else list(_knobs(rows, batch, keys))
            made = {f"m{k[0]} n{k[1]} w{k[2]} s{k[3]} splits{k[4]}":
                    attention(kernel, fusion, spec, tile_m=k[0], tile_n=k[1], num_warps=k[2],
                              num_stages=k[3], splits=k[4]) for k in knobs}
            calls = {"default": tf.compile(paged_decode if name == "paged" else kernel), **sdpa}
            squeeze = name.startswith("grid")   # [B, H, 1, D] queries: compared as [B, H, D]
            if squeeze and not defaults:
                calls.update(cluster_candidates(rows))

            def call(f, args=args, scale=scale, squeeze=squeeze):
                got = f(*args, scale=scale)
                return got[:, :, 0] if squeeze else got
            out += measure_candidates("decode_knobs", name, shape, calls, made,
                                      lambda cand: cand.warm(*args, scale=scale), call, ref,
                                      sdpa, moved, pool, log)
    finally:
        pool.close()
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="mqa,gqa,paged")
    parser.add_argument("--defaults", action="store_true", help="no candidates")
    parser.add_argument("--grid", default=GRID, help="the shapes of --only grid")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    rows = run(args.only.split(","), defaults=args.defaults, grid=parse_grid(args.grid))
    device = torch.cuda.get_device_name().replace(" ", "_")
    name = "decode-knobs-grid" if args.only == "grid" else "decode-knobs"
    write_csv(rows, f"{args.out}/{datetime.date.today()}-{device}-{name}.csv")


if __name__ == "__main__":
    main()
