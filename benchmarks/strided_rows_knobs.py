"""The row template's knobs where a chain reduces across a strided axis (the tile's neighbouring
rows, not its columns, are neighbours in memory): the user suite's layer norm over the channels
of ``[B, D, S]``, log-softmax over the channels of ``[B, C, P]``, the max over tokens of
``[B, S, D]`` (max-pool's first stage), a group norm's two reduced axes swept as one flat row
(and a channels-last group norm's statistics, its rows 32 bytes apart: tiles of 1-32 rows), and
RMSNorm's weight gradient (a sum down 8192 rows, its sweep also split into parts), batch-norm
statistics of ``[100352, 256]`` (a sweep of 100352 rows over 256 channels, in up to 264 parts)
a log-sum-exp down the 512 tokens of ``[64, 512, 4096]`` (two states down the strided axis),
the columns of ``[8192, 4096]`` L2-normalised (the outputs along the strided sweep), a masked
mean over the 2048 tokens of ``[32, 2048, 1024]`` (rows (b, d), its count recomputed per row), a
mean down the 65536 rows of ``[65536, 1024]``, tokens summed with weights over ``[64, 4096,
1024]``, a matrix-vector product over the strided axis of ``[8192, 8192]`` (``a.T @ x``) and
the means of 2048 segments of 1 to 128 rows of 1024 columns and of 32 sequences' first 512 to
2048 tokens (sweeps bounded per program);
each candidate checked against float64 and timed from a CUDA graph beside ``tf.compile``'s default
and torch.compile: what ``row_reduction.CONTIGUOUS_ROWS``, its block and the stages of a swept row
are chosen from.

    python -m benchmarks.strided_rows_knobs [--only layernorm,log_softmax,max_pool,logsumexp_pool,
                                                    group_norm,group_stats_channels_last,
                                                    weight_gradient,channel_stats,
                                                    column_norm,masked_mean,column_mean,
                                                    weighted_pool,strided_matvec,segment_mean,
                                                    lengths_mean]
                                            [--tiles | --family NAME] [--out DIR]

``--tiles``: instead, the whole row in one block with each program sweeping several row tiles,
the next ones' loads issued while one is reduced (``Knobs.row_tiles``); ``--family``: every case
over one family of candidates (``_knobs``: ``strided``, ``flat_row``, ``split``, ``parts``,
``weighed``, ``ragged``, ...).
"""
from __future__ import annotations

import argparse
import datetime
import itertools
from tensorfuse.dsl.program import ProgramKernel

import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.common import (Row, bench_replayed, measure_candidates, relative_error,
                               write_csv)
from benchmarks.layout_kernels import group_norm_channels_last
from benchmarks.pipeline_kernels import logsumexp_pool
from benchmarks.unlisted_kernels import (column_mean, l2_normalize_columns, lengths_mean_pool,
                                         masked_mean_pool, strided_matvec, weighted_token_pool)
from tensorfuse.schedule_templates.widened_rows import widened
from benchmarks.user_kernels import (channel_stats, group_norm, layernorm_channels,
                                     log_softmax_channels, max_pool_l2, segment_mean)
from tensorfuse.schedule_templates.auto import choose, takes_stage
from tensorfuse.schedule_templates.flat_sweeps import flatten_sweeps
from tensorfuse.schedule_templates.row_reduction import row_reduction
from tensorfuse.schedule_templates.stages import plan_stages
from tensorfuse.targets import get_target

SPEC = get_target("cuda:sm_90a")
CASES = ("layernorm", "log_softmax", "max_pool", "logsumexp_pool", "group_norm",
         "group_stats_channels_last", "weight_gradient",
         "channel_stats", "column_norm", "masked_mean", "column_mean", "weighted_pool",
         "strided_matvec", "segment_mean", "lengths_mean")


def _cases(generator, only):
    """(name, shape, kernel, args, float64 reference, torch.compile's call, bytes moved)."""
    if "layernorm" in only:
        B, D, S = 8, 1024, 4096
        x = (torch.randn(B, D, S, generator=generator) * 2 + 3).to("cuda", torch.bfloat16)
        w = (torch.rand(D, generator=generator) + 0.5).to("cuda", torch.bfloat16)
        bias = torch.randn(D, generator=generator).to("cuda", torch.bfloat16)

        def norm(t, weight, shift):
            return torch.nn.functional.layer_norm(t.transpose(1, 2), (t.shape[1],), weight,
                                                  shift, 1e-5).transpose(1, 2)
        yield ("layernorm", f"B{B} D{D} S{S} (over D)", layernorm_channels,
               dict(x=x, w=w, bias=bias, eps=1e-5), norm(x.double(), w.double(), bias.double()),
               torch.compile(norm), (x, w, bias), 2 * x.numel() * 2)
    if "log_softmax" in only:
        B, C, P = 8, 150, 65536
        x = (torch.randn(B, C, P, generator=generator) * 4).to("cuda", torch.bfloat16)

        def log_softmax(t):
            return torch.log_softmax(t.float(), 1).to(t.dtype)
        yield ("log_softmax", f"B{B} C{C} P{P} (over C)", log_softmax_channels, dict(x=x),
               torch.log_softmax(x.double(), 1), torch.compile(log_softmax), (x,),
               2 * x.numel() * 2)
    if "group_norm" in only:   # over two axes, swept as one flat row of C/G·P
        B, G, C, P = 16, 32, 16, 4096
        x = (torch.randn(B, G, C, P, generator=generator) * 2 + 1).to("cuda", torch.bfloat16)
        w = (torch.rand(G, C, generator=generator) + 0.5).to("cuda", torch.bfloat16)
        bias = torch.randn(G, C, generator=generator).to("cuda", torch.bfloat16)

        def group(t, weight, shift):   # [B, G, C/G·P]: the flat kernel's output
            flat = t.reshape(t.shape[0], -1, t.shape[-1])
            return torch.nn.functional.group_norm(flat, t.shape[1], weight.reshape(-1),
                                                  shift.reshape(-1), 1e-5).reshape(
                                                      t.shape[0], t.shape[1], -1)
        flat = flatten_sweeps(group_norm.program, dict(B=B, G=G, C=C, P=P))
        stage = ProgramKernel(flat)
        yield ("group_norm", f"B{B} G{G} C/G{C} P{P} (over C/G and P)", stage,
               dict(x=x, w=w, bias=bias, eps=1e-5),
               group(x.double(), w.double(), bias.double()),
               torch.compile(group), (x, w, bias), 2 * x.numel() * 2)
    if "group_stats_channels_last" in only:   # a channels-last group norm's statistics: rows
        B, P, G, C = 16, 4096, 32, 16             # g 32 bytes apart, (p, c) swept as one row
        x = (torch.randn(B, P, G, C, generator=generator) * 2 + 1).to("cuda", torch.bfloat16)
        first = plan_stages(group_norm_channels_last.program, lambda p: takes_stage(p, SPEC))[0]
        stage = ProgramKernel(flatten_sweeps(first.program, dict(B=B, P=P, G=G, C=C)))

        def stats(t):
            var, mean = torch.var_mean(t.float() if t.dtype != torch.float64 else t, (1, 3),
                                       correction=0)
            return mean, var
        yield ("group_stats_channels_last", f"B{B} P{P} G{G} C{C} (over P and C)", stage,
               dict(x=x), stats(x.double()), torch.compile(stats), (x,),
               x.numel() * 2 + 2 * B * G * 4)
    if "weight_gradient" in only:   # RMSNorm's backward, second stage: a sum down the rows
        M, N = 8192, 4096
        backward = tf.grad(K.rmsnorm).program
        second = plan_stages(backward, lambda p: takes_stage(p, SPEC))[1]
        stage = ProgramKernel(second.program)
        x = (torch.randn(M, N, generator=generator) * 2).to("cuda", torch.bfloat16)
        d_out = torch.randn(M, N, generator=generator).to("cuda", torch.bfloat16)
        ms_sum = (x.float() ** 2).sum(1)

        def d_weight(x, d_out, ms_sum):
            scale = torch.rsqrt(ms_sum / N + 1e-5)
            return (d_out.float() * x.float() * scale[:, None]).sum(0).to(torch.bfloat16)
        yield ("weight_gradient", f"M{M} N{N} (RMSNorm's d_weight, over M)", stage,
               dict(x=x, d_out=d_out, ms_sum=ms_sum, eps=1e-5),
               d_weight(x.double(), d_out.double(), ms_sum.double()), torch.compile(d_weight),
               (x, d_out, ms_sum), 2 * x.numel() * 2)
    if "channel_stats" in only:   # batch-norm statistics: a long sweep of 256 channels
        N, C = 32 * 56 * 56, 256
        x = (torch.randn(N, C, generator=generator) * 2 + 1).to("cuda", torch.bfloat16)

        def stats(t):
            var, mean = torch.var_mean(t.float(), 0, correction=0)
            return mean, var
        yield ("channel_stats", f"N{N} C{C} (over N)", channel_stats, dict(x=x),
               stats(x.double()), torch.compile(stats), (x,), x.numel() * 2 + 2 * C * 4)
    if "column_norm" in only:   # columns L2-normalised: the outputs along the strided sweep
        N, D = 8192, 4096
        x = torch.randn(N, D, generator=generator).to("cuda", torch.bfloat16)

        def normalised(t):
            t32 = t.float() if t.dtype != torch.float64 else t
            return (t32 * torch.rsqrt((t32 * t32).sum(0, keepdim=True) + 1e-12)).to(t.dtype)
        yield ("column_norm", f"N{N} D{D} (over N)", l2_normalize_columns, dict(x=x),
               normalised(x.double()), torch.compile(normalised), (x,), 2 * x.numel() * 2)
    if "masked_mean" in only:   # a sweep of 2048 tokens for rows (b, d): the widened program
        B, S, D = 32, 2048, 1024
        x = torch.randn(B, S, D, generator=generator).to("cuda", torch.bfloat16)
        lengths = torch.randint(S // 4, S + 1, (B,), generator=generator)
        mask = (torch.arange(S)[None, :] < lengths[:, None]).to("cuda", torch.bfloat16)
        rows = widened(masked_mean_pool.program)[0]
        stage = ProgramKernel(rows)

        def mean(t, m):
            t32 = t.float() if t.dtype != torch.float64 else t
            return ((t32 * m.to(t32.dtype)[..., None]).sum(1) / m.to(t32.dtype).sum(1, True))
        yield ("masked_mean", f"B{B} S{S} D{D} (over S)", stage, dict(x=x, mask=mask),
               mean(x.double(), mask.double()), torch.compile(mean), (x, mask),
               x.numel() * 2 + B * D * 2)
    if "lengths_mean" in only:   # the masked mean's tokens, the sweep bounded by the lengths
        B, S, D = 32, 2048, 1024
        x = torch.randn(B, S, D, generator=generator).to("cuda", torch.bfloat16)
        lengths = torch.randint(S // 4, S + 1, (B,), generator=generator).to("cuda", torch.int32)

        def first_mean(t, n):
            t32 = t.float() if t.dtype != torch.float64 else t
            kept = (torch.arange(S, device=t.device)[None, :] < n[:, None]).to(t32.dtype)
            return (t32 * kept[..., None]).sum(1) / n[:, None].to(t32.dtype)
        yield ("lengths_mean", f"B{B} S{S} D{D} (over each sequence's first lengths[b])",
               lengths_mean_pool, dict(x=x, lengths=lengths), first_mean(x.double(), lengths),
               torch.compile(first_mean), (x, lengths), (int(lengths.sum()) + B) * D * 2)
    if "column_mean" in only:   # a mean down 65536 rows of 1024 columns
        B, D = 65536, 1024
        x = (torch.randn(B, D, generator=generator) + 0.5).to("cuda", torch.bfloat16)

        def mean0(t):
            return (t.float() if t.dtype != torch.float64 else t).mean(0)
        yield ("column_mean", f"B{B} D{D} (over B)", column_mean, dict(x=x),
               mean0(x.double()), torch.compile(mean0), (x,), x.numel() * 2 + D * 2)
    if "weighted_pool" in only:   # tokens summed with weights: 4096 tokens strided by 1024
        B, S, D = 64, 4096, 1024
        w = torch.rand(B, S, generator=generator).to("cuda", torch.bfloat16)
        x = torch.randn(B, S, D, generator=generator).to("cuda", torch.bfloat16)

        def pool(a, t):
            return torch.einsum("bs,bsd->bd", a, t)
        yield ("weighted_pool", f"B{B} S{S} D{D} (over S)", weighted_token_pool, dict(w=w, x=x),
               pool(w.double(), x.double()), torch.compile(pool), (w, x),
               x.numel() * 2 + w.numel() * 2 + B * D * 2)
    if "strided_matvec" in only:   # a.T @ x: one tensor down 8192 rows weighed by a vector
        K_, M = 8192, 8192
        a = torch.randn(K_, M, generator=generator).to("cuda", torch.bfloat16)
        x = torch.randn(K_, generator=generator).to("cuda", torch.bfloat16)

        def matvec(m, v):
            return m.t() @ v
        yield ("strided_matvec", f"K{K_} M{M} (a.T @ x)", strided_matvec, dict(a=a, x=x),
               matvec(a.double(), x.double()), torch.compile(matvec), (a, x),
               a.numel() * 2 + K_ * 2 + M * 2)
    if "max_pool" in only:   # the pool stage: the max over S, the tokens strided by D
        B, S, D = 64, 512, 4096
        x = (torch.randn(B, S, D, generator=generator) * 3).to("cuda", torch.bfloat16)
        first = plan_stages(max_pool_l2.program, lambda p: takes_stage(p, SPEC))[0]
        stage = ProgramKernel(first.program)

        def pooled(t):
            return t.float().amax(1)
        yield ("max_pool", f"B{B} S{S} D{D} (max over S)", stage, dict(x=x),
               x.double().amax(1), torch.compile(pooled), (x,), x.numel() * 2 + B * D * 4)
    if "segment_mean" in only:   # ragged segments of 1-128 rows: the sweep bounded per program
        G, D, longest = 2048, 1024, 128
        lengths = torch.randint(1, longest + 1, (G,), generator=generator)
        starts = lengths.cumsum(0) - lengths
        x = torch.randn(int(lengths.sum()), D, generator=generator).to("cuda", torch.bfloat16)
        ids = torch.repeat_interleave(torch.arange(G), lengths).cuda()
        lengths, starts = lengths.to("cuda", torch.int32), starts.to("cuda", torch.int32)

        def means(t, at):
            acc = torch.float64 if t.dtype == torch.float64 else torch.float32
            total = torch.zeros(G, D, device=t.device, dtype=acc).index_add_(0, at, t.to(acc))
            return (total / lengths[:, None]).to(t.dtype)
        yield ("segment_mean", f"R{x.shape[0]} D{D} G{G} (1..{longest} rows each)",
               segment_mean, dict(x=x, starts=starts, lengths=lengths), means(x.double(), ids),
               torch.compile(means), (x, ids), (x.numel() + G * D) * 2)
    if "logsumexp_pool" in only:   # two states (max, sum of exp) down the same strided axis
        B, S, D = 64, 512, 4096
        x = (torch.randn(B, S, D, generator=generator) * 4).to("cuda", torch.bfloat16)

        def lse(t):
            return t.float().logsumexp(1).to(t.dtype)
        yield ("logsumexp_pool", f"B{B} S{S} D{D} (over S)", logsumexp_pool, dict(x=x),
               x.double().logsumexp(1), torch.compile(lse), (x,), x.numel() * 2 + B * D * 2)


# the candidates each case is swept over (:func:`_knobs`); the others: "strided"
FAMILY = {"group_norm": "flat_row", "group_stats_channels_last": "row_tiles",
          "weight_gradient": "split", "channel_stats": "parts",
          "segment_mean": "ragged", "lengths_mean": "ragged",
          "column_mean": "split", "weighted_pool": "split", "strided_matvec": "weighed"}


def _knobs(cols: int, family: str):
    """Candidate (rows, block, warps, stages, reload, splits, row tiles) of a ``family``:
    ``strided``: tiles of 2k to 32k elements, the block up to the whole row, rows swept in
    blocks with their loads 1-4 blocks ahead (Triton's pipeline), reload only where the row is
    one block; ``flat_row``: a flat row (a group norm's), a few rows of blocks of 2k-16k;
    ``split``: a long sweep of few row tiles (2 stages), also swept in 1-8 parts in parallel;
    ``tiles``: the whole row in one block, each program sweeping 2 or 4 row tiles with the next
    ones' loads 2-3 tiles ahead; ``swept_tiles``: a row swept in blocks of 4k-16k, each program
    taking 1-4 row tiles in turn (fewer rows held between their two passes, for L2); ``parts``:
    a very long sweep of very few tiles, split in 8-264 parts; ``pipelined_tiles``:
    ``swept_tiles`` with the sweep's loads 2-3 blocks ahead in 8-16 warps, 2-8 row tiles a
    program; ``wide_tiles``: the whole row in 8-16 warps (at most 128 floats a thread), 1-4 row
    tiles; ``wide_parts``: ``parts`` in 8 warps (33 or 66 parts); ``weighed``: tiles of 64-256 rows
    by 64 or 128, 4-16 parts (a matrix-vector product over the strided axis); ``ragged``: tiles
    of 32-1024 rows by blocks of 16-256 (segments of 1-128 rows, sequences' first tokens), loads
    1 or 3 blocks ahead;
    ``few_warps``: ``parts`` on 1-2 warps, tiles of 64-256 rows by blocks of 8-64, 66-264 parts;
    ``whole_row``: one row in one block of 16-32 warps, its outputs from registers or read again;
    ``lanes``: a variance's sums kept per lane (``Knobs.lanes``) against reduced every block,
    in strided tiles of 32-64 rows by 64-128 split in 66 or 132 parts; ``flat_lanes``: the same
    over flat rows in blocks of 4k-8k on 8-16 warps (a group norm's). A candidate's eighth entry is
    its lanes."""
    whole = 1 << max(4, (cols - 1).bit_length())
    if family == "lanes":   # a long strided sweep of few tiles, in parts
        for (rows, block, warps), splits, lanes in itertools.product(
                ((32, 64, 4), (32, 128, 4), (64, 64, 4), (64, 128, 8)), (66, 132), (0, 1)):
            yield rows, block, warps, 3, 0, splits, None, lanes
        yield 32, 512, 4, 2, 0, 33, None, 0   # reduced every block, in the blocks it needs
        return
    if family == "flat_lanes":   # flat rows swept in blocks
        for block, warps, lanes in itertools.product((4096, 8192), (8, 16), (0, 1)):
            if block < cols:
                yield 1, block, warps, 1, 0, None, None, lanes
        return
    if family == "row_tiles":   # a flat row whose rows lie a few elements apart: tiles of 4-32
        for rows, block, warps, stages, splits in itertools.product(   # rows, split in parts
                (4, 8, 16, 32), (512, 1024, 2048, 4096), (4, 8), (1, 2), (None, 8)):
            if 4096 <= rows * block <= 32768 and block < cols and (splits is None or rows >= 16):
                yield rows, block, warps, stages, 0, splits, None
        return
    if family == "tiles":   # the row held (read again, it needed more shared memory than an SM has)
        for rows, warps, stages, row_tiles in itertools.product(
                (16, 32, 64), (4, 8), (3, 4), (2, 4)):
            if 2048 <= rows * whole <= 32768:
                yield rows, whole, warps, stages, 0, None, row_tiles
        return
    if family == "swept_tiles":   # rows swept in blocks, several row tiles a program in turn
        for block, warps, row_tiles in itertools.product((4096, 8192, 16384), (4, 8, 16),
                                                         (1, 2, 4)):
            if block < cols:
                yield 1, block, warps, 1, 0, None, row_tiles
        return
    if family == "pipelined_tiles":   # swept_tiles with the sweep's loads pipelined, 8-16 warps
        for block, warps, stages, row_tiles in itertools.product((4096, 8192), (8, 16), (2, 3),
                                                                 (2, 4, 8)):
            if block < cols:
                yield 1, block, warps, stages, 0, None, row_tiles
        return
    if family == "wide_tiles":   # the row held in 8-16 warps: fewer registers a thread
        for rows, warps, stages, row_tiles in itertools.product((32, 64), (8, 16), (2, 3),
                                                                (1, 2, 4)):
            if rows * whole <= 65536 and rows * whole // (32 * warps) <= 128:
                yield rows, whole, warps, stages, 0, None, row_tiles
        return
    if family == "wide_parts":   # a long sweep in parts, 8 warps a part
        for rows, block, stages, splits in itertools.product((32, 64), (256, 512), (2, 3),
                                                             (33, 66)):
            yield rows, block, 8, stages, 0, splits, None
        return
    if family == "split":
        for rows, block, warps, stages, splits in itertools.product(
                (32, 64, 128), (64, 128, 256, 512), (4, 8), (2,), (1, 2, 4, 8)):
            if 4096 <= rows * block <= 32768:
                yield rows, block, warps, stages, 0, splits, None
        return
    if family == "ragged":   # a sweep of 1-128 rows a program: blocks near the short ones' size
        for rows, block, warps, stages in itertools.product((32, 64, 128, 256, 512, 1024),
                                                            (16, 32, 64, 128, 256), (4, 8),
                                                            (1, 3)):
            if 4096 <= rows * block <= 16384 and (stages == 1 or block < cols):
                yield rows, block, warps, stages, 0, None, None
        return
    if family == "whole_row":   # a flat row of up to 65536 in one block of 16-32 warps
        for warps, reload in itertools.product((16, 32), (0, 1)):
            if whole <= 65536:
                yield 1, whole, warps, 1, reload, None, None
        return
    if family == "few_warps":   # a long sweep in parts, 1-2 warps a part: each block's sum
        #                            down the strided axis inside each thread, not across warps
        for rows, block, warps, stages, splits in itertools.product(
                (64, 128, 256), (8, 16, 32, 64), (1, 2), (2, 3), (66, 132, 264)):
            if 512 <= rows * block and rows * block // (32 * warps) <= 64:
                yield rows, block, warps, stages, 0, splits, None
        return
    if family == "weighed":   # a few tiles weighed along a long sweep: wider tiles, more parts
        for rows, block, warps, stages, splits in itertools.product(
                (64, 128, 256), (64, 128), (4, 8), (2, 3), (4, 8, 16)):
            yield rows, block, warps, stages, 0, splits, None
        return
    if family == "parts":
        for rows, block, splits in itertools.product((32, 64, 128, 256), (32, 64, 128, 512),
                                                     (8, 16, 33, 66, 132, 264)):
            if 2048 <= rows * block <= 16384:
                yield rows, block, 4, 2, 0, splits, None
        return
    rows_major = family == "flat_row"
    shapes = itertools.product((1, 2, 4), (2048, 4096, 8192, 16384)) if rows_major else \
        itertools.product((16, 32, 64, 128), (128, 256, 512, 1024))
    for rows, block in shapes:
        if not 2048 <= rows * block <= 32768 or block > whole:
            continue
        for warps in ((4, 8, 16, 32) if rows_major else (4, 8)):
            for stages in ((1,) if block >= cols else (1, 2, 3, 4)):
                yield rows, block, warps, stages, 0, None, None
                if block >= cols:
                    yield rows, block, warps, stages, 1, None, None


def run(only, log=print, tiles: bool = False, family: str | None = None,
        cold: bool = False) -> list[Row]:
    from tensorfuse.targets.triton.compile_pool import CompilePool

    generator = torch.Generator().manual_seed(0)
    out: list[Row] = []
    pool = CompilePool()
    try:
        for name, shape, kernel, args, ref, compiled, eager_args, moved in \
                _cases(generator, only):
            _, fusion = choose(kernel.program, SPEC)
            made = row_reduction(kernel, fusion, SPEC)
            plan = made.planner.plan({n: int(v) for n, v in _dims(kernel, args).items()})
            made = {f"r{k[0]} b{k[1]} w{k[2]} s{k[3]}" + (" reload" if k[4] else "") +
                    (f" splits{k[5]}" if k[5] else "") + (f" t{k[6]}" if k[6] else "") +
                    (" lanes" if k[7:] and k[7] else ""):
                    row_reduction(kernel, fusion, SPEC, rows=k[0], block=k[1], num_warps=k[2],
                                  num_stages=k[3], reload=bool(k[4]), splits=k[5],
                                  row_tiles=k[6], lanes=bool(k[7]) if k[7:] else None)
                    for k in _knobs(plan.cols, "tiles" if tiles else
                                    family or FAMILY.get(name, "strided"))}
            alternatives = {"torch_compile": lambda c=compiled, a=eager_args: c(*a)}
            calls = {"default": tf.compile(kernel), **alternatives}
            error = None if not isinstance(ref, tuple) else \
                lambda got, ref=ref: max(relative_error(g, r) for g, r in zip(got, ref))
            out += measure_candidates("strided_rows_knobs_cold" if cold else "strided_rows_knobs",
                                      name, shape, calls, made,
                                      lambda cand: cand.warm(**args), lambda f: f(**args), ref,
                                      alternatives, moved, pool, log, error,
                                      bench_replayed if cold else None)
    finally:
        pool.close()
    return out


def _dims(kernel, args: dict) -> dict:
    from tensorfuse.binding import bind_call

    return bind_call(kernel.program, (), args, "cuda").dims


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(CASES))
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--tiles", action="store_true",
                        help="whole rows, several row tiles a program (Knobs.row_tiles)")
    parser.add_argument("--family", choices=("strided", "flat_row", "row_tiles", "split", "parts",
                                             "swept_tiles", "pipelined_tiles", "wide_tiles",
                                             "wide_parts", "weighed", "ragged",
                                             "few_warps", "whole_row", "lanes",
                                             "flat_lanes"),
                        help="sweep every case over this family of candidates (_knobs)")
    parser.add_argument("--cold", action="store_true",
                        help="time each call with L2 flushed before it (bench_replayed), not "
                        "back to back from a graph (L2 warm with what the last call read)")
    args = parser.parse_args(argv)
    only = args.only.split(",")
    rows = run(only, tiles=args.tiles, family=args.family, cold=args.cold)
    device = torch.cuda.get_device_name().replace(" ", "_")
    # a run of some cases is a part of its own (``benchmarks.report`` shows it beside the whole)
    part = "" if set(only) == set(CASES) else "-" + "-".join(n.replace("_", "-") for n in only)
    part += "-row-tiles" if args.tiles else f"-{args.family.replace('_', '-')}" \
        if args.family else ""
    part += "-cold" if args.cold else ""
    write_csv(rows, f"{args.out}/{datetime.date.today()}-{device}-strided-rows-knobs{part}.csv")


if __name__ == "__main__":
    main()
