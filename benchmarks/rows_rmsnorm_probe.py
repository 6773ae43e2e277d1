"""Probe: where the scaled RMSNorm row kernel (``x·rsqrt(mean x²)·w[j]·s[i]``, [16384, 8192]
bf16) can still gain against torch.compile, which it ties (0.993–0.999×, ``benchmarks.rows_sweep``).

Hand-written Triton variants of the kernel ``tf.compile`` generates, each checked against
float64, timed with ``tf.compile`` and torch.compile in alternating rounds (L2 flushed, median;
and from CUDA graphs):

- ``generated``: what ``tf.compile`` runs (its own call path);
- ``hoisted``: the same kernel with the column operand ``w`` (and the row operand ``s``) loaded
  before the row's reduction, so their L2 latency overlaps the row's loads;
- ``rows2``: two rows per program, ``w`` loaded once for both;
- ``warps8`` / ``warps32``: ``hoisted`` at 8 and 32 warps (16 is the default);
- ``streaming``: ``hoisted`` storing with the ``.cs`` (evict-first) cache modifier;
- ``two_pass_<block>_<warps>w_<stages>s`` (``--two-pass K``): Inductor's shape of the kernel — a
  looped first pass for the sum (``evict_last``), a second reading the row again from L2;
- ``--template``: the row template's kernels in two blocks of 4096 (``template_4096``: its
  eviction rule, ``template_4096_hints``: hints everywhere) beside ``two_pass_4096_16w_1s``;
- ``--tma K``: persistent kernels that move each row (16 KB) with one TMA box each way (Triton
  tensor descriptors, rows pipelined over ``stages``), their grid screened once and the K
  fastest timed in rounds — and first a TMA copy of the same bytes against torch's copy: whether
  bulk copies move bytes faster than the copy ceiling both kernels sit at.

    python -m benchmarks.rows_rmsnorm_probe [--rounds 7] [--csv PATH] [--template] [--tma K]
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import tensorfuse as tf
from benchmarks.common import Row, alternated, bench, bench_graph, relative_error, write_csv
from benchmarks.rows_operands import M, N, copy_at, scaled_rmsnorm


@triton.jit
def _rms_rows(x, w, s, out, N: tl.constexpr, ROWS: tl.constexpr, HOIST: tl.constexpr,
              STREAM: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, N)
    if HOIST:
        wv = tl.load(w + cols[None, :]).to(tl.float32)
        sv = tl.load(s + rows[:, None])
    xv = tl.load(x + rows[:, None] * N + cols[None, :]).to(tl.float32)
    ms = tl.sum(xv * xv, axis=1, keep_dims=True) * (1.0 / N)
    if not HOIST:
        sv = tl.load(s + rows[:, None])
        wv = tl.load(w + cols[None, :]).to(tl.float32)
    y = (xv * tl.rsqrt(ms + 1e-5) * wv * sv).to(tl.bfloat16)
    if STREAM:
        tl.store(out + rows[:, None] * N + cols[None, :], y, cache_modifier=".cs")
    else:
        tl.store(out + rows[:, None] * N + cols[None, :], y)


@triton.jit
def _rms_two_pass(x, w, s, out, N: tl.constexpr, RB: tl.constexpr, STAGES: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, RB)
    acc = tl.zeros([RB], tl.float32)
    for start in tl.range(0, N, RB, num_stages=STAGES):
        xv = tl.load(x + row * N + start + cols, eviction_policy="evict_last").to(tl.float32)
        acc += xv * xv
    r = tl.rsqrt(tl.sum(acc, axis=0) * (1.0 / N) + 1e-5) * tl.load(s + row)
    for start in tl.range(0, N, RB, num_stages=STAGES):
        xv = tl.load(x + row * N + start + cols, eviction_policy="evict_first").to(tl.float32)
        wv = tl.load(w + start + cols, eviction_policy="evict_last").to(tl.float32)
        tl.store(out + row * N + start + cols, (xv * r * wv).to(tl.bfloat16))


@triton.jit
def _rms_tma(x_desc, o_desc, w, s, M, N: tl.constexpr, CH: tl.constexpr, STAGES: tl.constexpr):
    # x and out viewed as [M·N/CH, CH]: a row is N/CH consecutive rows of the view, one box
    R: tl.constexpr = N // CH
    wv = tl.load(w + tl.arange(0, R)[:, None] * CH + tl.arange(0, CH)[None, :]).to(tl.float32)
    for row in tl.range(tl.program_id(0), M, tl.num_programs(0), num_stages=STAGES):
        xv = x_desc.load([row * R, 0]).to(tl.float32)
        r = tl.rsqrt(tl.sum(xv * xv) * (1.0 / N) + 1e-5) * tl.load(s + row)
        o_desc.store([row * R, 0], (xv * r * wv).to(tl.bfloat16))


@triton.jit
def _copy_tma(x_desc, o_desc, M, R: tl.constexpr, STAGES: tl.constexpr):
    for row in tl.range(tl.program_id(0), M, tl.num_programs(0), num_stages=STAGES):
        o_desc.store([row * R, 0], x_desc.load([row * R, 0]))


CHUNK = 256   # a TMA box is at most 256 elements along each dimension


def _descriptors(x, out):
    from triton.tools.tensor_descriptor import TensorDescriptor

    view = (x.numel() // CHUNK, CHUNK)
    block = [N // CHUNK, CHUNK]
    return (TensorDescriptor.from_tensor(x.view(view), block),
            TensorDescriptor.from_tensor(out.view(view), block))


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def _tma(warps: int, stages: int, per_sm: int):
    def run(x, w, s):
        out = torch.empty_like(x)
        xd, od = _descriptors(x, out)
        _rms_tma[(_sms() * per_sm,)](xd, od, w, s, M, N=N, CH=CHUNK, STAGES=stages,
                                     num_warps=warps)
        return out
    return run


def tma_grid():
    """name → callable for the TMA kernel's warps × stages × programs per SM."""
    return {f"tma_{warps}w_{stages}s_{per_sm}p": _tma(warps, stages, per_sm)
            for warps in (8, 16) for stages in (2, 3, 4) for per_sm in (1, 2)
            if per_sm * (stages + 1) * 16 <= 200}


def copy_probe(rounds: int) -> None:
    """A TMA copy (a 16 KB box each way per row, persistent) against torch's copy of the same
    tensor, both checked, timed in alternated rounds (events and CUDA graph)."""
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    outs = {}

    def tma_copy(stages: int, per_sm: int):
        out = outs.setdefault((stages, per_sm), torch.empty_like(x))
        xd, od = _descriptors(x, out)
        return lambda: _copy_tma[(_sms() * per_sm,)](xd, od, M, R=N // CHUNK, STAGES=stages,
                                                    num_warps=4)

    dst = torch.empty_like(x)
    calls = {"torch_copy": lambda: dst.copy_(x)}
    for stages, per_sm in ((2, 1), (3, 1), (4, 1), (3, 2)):
        calls[f"tma_copy_{stages}s_{per_sm}p"] = tma_copy(stages, per_sm)
    for label, fn in calls.items():
        fn()
        torch.cuda.synchronize()
        got = dst if label == "torch_copy" else outs[tuple(int(v[:-1]) for v in
                                                          label.split("_")[2:])]
        assert torch.equal(got, x), label
    nbytes = 2 * x.numel() * 2
    events, graph = (alternated(calls, rounds, timing) for timing in (bench, bench_graph))
    for label in calls:
        ev, gr = statistics.median(events[label]), statistics.median(graph[label])
        print(f"{label:20s} events {ev:.4f} ms {nbytes / ev / 1e6:6.0f} GB/s   graph {gr:.4f} ms "
              f"{nbytes / gr / 1e6:6.0f} GB/s")


def _two_pass(rb: int, warps: int, stages: int):
    def run(x, w, s):
        out = torch.empty_like(x)
        _rms_two_pass[(M,)](x, w, s, out, N=N, RB=rb, STAGES=stages, num_warps=warps)
        return out
    return run


def two_pass_grid():
    """name → callable for the two-pass (Inductor-like) kernel's block × warps × stages."""
    return {f"two_pass_{rb}_{warps}w_{stages}s": _two_pass(rb, warps, stages)
            for rb in (1024, 2048, 4096) for warps in (4, 8, 16) for stages in (1, 2, 3)
            if rb // (32 * warps) >= 2}


def _variant(rows: int, hoist: bool, warps: int, stream: bool = False):
    def run(x, w, s):
        out = torch.empty_like(x)
        _rms_rows[(M // rows,)](x, w, s, out, N=N, ROWS=rows, HOIST=hoist, STREAM=stream,
                                num_warps=warps)
        return out
    return run


def variants(template: bool = False, args: tuple = ()):
    """name → callable(x, w, s) → output. ``template``: instead of the hand-written variants,
    the row template's own kernels swept in two blocks of 4096 (per-lane sums reduced once
    after the loop), with and without eviction hints, beside Inductor's shape written by hand —
    compiled here on ``args`` (the settings they are made with hold for their first call)."""
    f = tf.compile(scaled_rmsnorm, "cuda")
    compiled = torch.compile(_reference)
    if template:
        from benchmarks.rows_sweep import made

        swept = {}
        for label, hints in (("template_4096_hints", True), ("template_4096", None)):
            kernel, first_call = made(scaled_rmsnorm, eviction=hints, block=4096, num_warps=16,
                                      num_stages=1)
            first_call(*args)
            swept[label] = kernel
        return {"generated": f, "torch_compile": compiled, **swept,
                "two_pass_4096_16w_1s": _two_pass(4096, 16, 1)}
    return {"generated": f, "torch_compile": compiled,
            "unhoisted": _variant(1, False, 16), "hoisted": _variant(1, True, 16),
            "rows2": _variant(2, True, 16), "warps8": _variant(1, True, 8),
            "warps32": _variant(1, True, 32), "streaming": _variant(1, True, 16, True)}


def _reference(x, w, s):
    return (F.rms_norm(x.float(), (N,), w.float(), 1e-5) * s[:, None]).to(torch.bfloat16)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--csv", default=None)
    parser.add_argument("--two-pass", type=int, default=0, metavar="K",
                        help="time the two-pass kernel's grid once, then its K fastest in rounds")
    parser.add_argument("--template", action="store_true",
                        help="the row template's kernels in two blocks of 4096 instead of the "
                             "hand-written variants")
    parser.add_argument("--tma", type=int, default=0, metavar="K",
                        help="a TMA copy against torch's, then the TMA kernel's grid screened "
                             "once and its K fastest timed in rounds")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if args.tma:
        copy_probe(args.rounds)
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) * 3 + 1
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    s = torch.rand(M, device="cuda") + 0.5
    nbytes = 2 * M * N * 2 + 2 * N + 4 * M
    same = copy_at(nbytes)
    want = _reference(x.double(), w.double(), s.double())
    impls = variants(args.template, (x, w, s))
    for option, grid_of in ((args.two_pass, two_pass_grid), (args.tma, tma_grid)):
        if not option:
            continue
        grid = grid_of()
        quick = {}
        for name, fn in grid.items():
            try:
                err = relative_error(fn(x, w, s), want)
            except Exception as exc:   # noqa: BLE001 - a setting that does not build is reported
                print(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            assert err < 1e-2, (name, err)
            quick[name] = bench(lambda: fn(x, w, s), rep_ms=100)
        base = bench(lambda: impls["torch_compile"](x, w, s), rep_ms=100)
        for name in sorted(quick, key=quick.get):
            print(f"{name:24s} {quick[name]:.4f} ms  {base / quick[name]:.4f}x torch.compile")
        impls.update({name: grid[name] for name in sorted(quick, key=quick.get)[:option]})
    for name, fn in impls.items():
        fn(x, w, s)   # compiled outside the check
        poison = torch.full_like(x, float("nan"))
        del poison    # torch's allocator hands this block to the next output of its size
        got = fn(x, w, s)
        err = relative_error(got, want)
        assert err < 1e-2, (name, err)
        print(f"{name:14s} err {err:.1e}")
    calls = {name: (lambda fn=fn: fn(x, w, s)) for name, fn in impls.items()}
    events, graph = (alternated(calls, args.rounds, timing) for timing in (bench, bench_graph))
    times = {name: {"events": events[name], "graph": graph[name]} for name in impls}
    rows = []
    ref = {k: statistics.median(times["torch_compile"][k]) for k in ("events", "graph")}
    print(f"copy of the same bytes: {same:.3f} TB/s")
    print(f"{'variant':14s} {'events ms':>10s} {'GB/s':>7s} {'x compile':>9s} "
          f"{'graph ms':>9s} {'x compile':>9s}  per-round x compile (events)")
    for name in impls:
        ev, gr = (statistics.median(times[name][k]) for k in ("events", "graph"))
        per_round = [c / t for t, c in zip(times[name]["events"], times["torch_compile"]["events"])]
        print(f"{name:14s} {ev:10.4f} {nbytes / ev / 1e6:7.0f} {ref['events'] / ev:9.4f} "
              f"{gr:9.4f} {ref['graph'] / gr:9.4f}  "
              + " ".join(f"{r:.3f}" for r in per_round))
        gbps = nbytes / ev / 1e6
        rows.append(Row("rows/scaled_rmsnorm", f"{M}x{N} bf16", name, ev, 0.0, gbps,
                        gbps / 1e3 / same,
                        f"median of {args.rounds} alternated rounds; graph {gr:.4f} ms "
                        f"({ref['graph'] / gr:.4f}x torch.compile); events "
                        f"{ref['events'] / ev:.4f}x torch.compile; fraction: of a copy of the "
                        f"same bytes ({same:.2f} TB/s)"))
    if args.csv:
        write_csv(rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
