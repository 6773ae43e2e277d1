"""New sizes on every call, as a serving loop meets them: builds, the first call at each size and
the steady call, tensorfuse (``tf.compile`` defaults: ``dynamic=None``) beside torch in the same
process on the same GPU.

    python -m benchmarks.dynamic [--lengths 50] [--widths 20] [--out DIR]

Rows:
- ``dynamic/row_widths``: a softmax over 4096 rows at random widths (256 to 32768), against
  ``torch.compile(dynamic=True)`` and eager torch;
- ``dynamic/prefill_lengths``: causal attention (B1 H16 D128, bf16) at random prompt lengths
  (100 to 16384), against SDPA (cuDNN) and FlexAttention under ``torch.compile(dynamic=True)``;
- ``dynamic/growing_cache``: a GQA decode loop whose cache grows a key a step
  (:func:`growing_cache`), against SDPA; and the same loop over a static cache whose length lives
  in device memory, one step captured in a CUDA graph and replayed (:func:`replayed_cache`).
Per size: ``ms`` the steady call (``bench``), ``note`` the first call's wall time (synchronised),
and the builds so far (tensorfuse: sources written, ``cache_info()``; torch.compile: frames
compiled). One row per implementation with shape ``all`` sums it up: builds, the first calls'
overhead over steady at sizes whose build existed (``within``) and at new ones.
CSV ``benchmarks/results/<date>-<device>-dynamic.csv`` (with ``--only``: ``…-dynamic-<part>.csv``).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import random
import statistics
import time

import torch

from benchmarks.common import (FLEX, SDPA, SDPA_CUDNN, TENSORFUSE, TORCH_COMPILE, TORCH_EAGER, Row,
                               bench, measure_ceilings, relative_error, write_csv)


def first_call_ms(fn) -> float:
    """Wall milliseconds of one call, the GPU drained before and after, and Python's garbage
    collected before it: a collection the earlier calls (of every implementation) left due
    would otherwise land in whichever call comes next."""
    gc.collect()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def _frames() -> int:
    """Frames torch.compile compiled so far in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def row_widths(count: int, rng: random.Random, copy_tbps: float) -> list[Row]:
    import tensorfuse as tf
    import tensorfuse.kernels as K

    made = tf.compile(K.softmax, "cuda")
    compiled = torch.compile(lambda x: torch.softmax(x, -1), dynamic=True)
    impls = {TENSORFUSE: lambda x: made(x), TORCH_COMPILE: compiled,
             TORCH_EAGER: lambda x: torch.softmax(x, -1)}
    widths = [rng.randint(256, 32768) for _ in range(count)]
    return _sweep("dynamic/row_widths", impls, widths,
                  lambda n: (torch.randn(4096, n, device="cuda", dtype=torch.bfloat16),),
                  lambda out, x: relative_error(out, torch.softmax(x.double(), -1)),
                  lambda n: f"softmax 4096x{n} bf16",
                  lambda n, ms: (0.0, 2 * 4096 * n * 2 / ms / 1e6), copy_tbps,
                  builds={TENSORFUSE: lambda: len(made.cache_info()),
                          TORCH_COMPILE: _frames})


def prefill_lengths(count: int, rng: random.Random) -> list[Row]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import tensorfuse as tf
    import tensorfuse.kernels as K

    made = tf.compile(K.causal_attention, "cuda")
    flex = torch.compile(flex_attention, dynamic=True)
    scale = 128 ** -0.5

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    def causal(b, h, i, j):
        return i >= j

    masks: dict = {}

    def flexed(q, k, v):
        n = q.shape[2]
        if n not in masks:
            masks[n] = create_block_mask(causal, None, None, n, n, device="cuda")
        return flex(q, k, v, block_mask=masks[n], scale=scale)

    impls = {TENSORFUSE: lambda q, k, v: made(q, k, v, scale=scale), SDPA_CUDNN: sdpa,
             FLEX: flexed}
    lengths = [rng.randint(100, 16384) for _ in range(count)]

    def inputs(n):
        return tuple(torch.randn(1, 16, n, 128, device="cuda", dtype=torch.bfloat16)
                     for _ in range(3))

    def check(out, q, k, v):
        """The error of the last 256 query rows against float64 (all of them would need the
        whole score matrix in float64: 34 GB at 16k tokens)."""
        n, rows = q.shape[2], min(256, q.shape[2])
        s = q[:, :, n - rows:].double() @ k.double().transpose(-1, -2) * scale
        i = torch.arange(n - rows, n, device=q.device)[:, None]
        s = s.masked_fill(torch.arange(n, device=q.device)[None, :] > i, float("-inf"))
        return relative_error(out[:, :, n - rows:], torch.softmax(s, -1) @ v.double())

    def work(n, ms):   # causal: half the products
        return 2 * 2 * 16 * n * n * 128 / 2 / ms / 1e9, 0.0
    return _sweep("dynamic/prefill_lengths", impls, lengths, inputs, check,
                  lambda n: f"causal B1 H16 S{n} D128 bf16", work, None,
                  builds={TENSORFUSE: lambda: len(made.cache_info()), FLEX: _frames})


def growing_cache(steps: int, copy_tbps: float) -> list[Row]:
    """A decode loop whose cache grows by one key a step, as ``DynamicCache`` grows it (the new
    key and value concatenated: new tensors every step): B8, 32 query heads on 8 KV heads, D128,
    bf16, from 4096 keys. Each implementation is called once at the first length, then runs the
    loop twice: the first pass meets every later length for the first time, the second has seen
    them all. ``ms``: wall time a step of the
    first pass (the GPU drained only at the end); the note: the second pass's, the builds, and
    the GPU time of one step at the last length."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tensorfuse as tf
    import tensorfuse.kernels as K

    B, H, HKV, D, start = 8, 32, 8, 128, 4096
    made = tf.compile(K.gqa_attention, "cuda")
    scale = D ** -0.5

    def sdpa(q, k, v):
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                          SDPBackend.EFFICIENT_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)

    impls = {TENSORFUSE: lambda q, k, v: made(q, k, v, scale=scale), SDPA: sdpa}
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k0 = torch.randn(B, HKV, start, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v0 = torch.randn_like(k0)
    new = torch.randn(steps, B, HKV, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    rows = []
    for label, fn in impls.items():
        walls = []
        fn(q, k0, v0)   # the first call builds (nvcc, once per build cache): not a step's cost
        for _ in range(2):
            k, v = k0, v0
            torch.cuda.synchronize()
            begin = time.perf_counter()
            for step in range(steps):
                k = torch.cat([k, new[step]], dim=2)
                v = torch.cat([v, new[step] * 0.5], dim=2)
                out = fn(q, k, v)
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - begin) * 1e3 / steps)
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=scale,
                                              enable_gqa=True)
        error = relative_error(out, want)
        gpu = bench(lambda: fn(q, k, v), rep_ms=50)
        moved = 2 * k.numel() * k.element_size()
        builds = len(made.cache_info()) if label == TENSORFUSE else 0
        note = (f"{steps} steps from {start} keys; second pass {walls[1]:.4f} ms a step; "
                f"builds {builds}; one step's GPU time {gpu:.4f} ms at {start + steps} keys "
                f"(the cat of k and v included in the wall times); error {error:.1e}")
        rows.append(Row("dynamic/growing_cache", f"decode B{B} H{H}/{HKV} D{D} bf16", label,
                        walls[0], 0.0, moved / gpu / 1e6, moved / gpu / 1e6 / (copy_tbps * 1e3),
                        note))
        print(f"dynamic/growing_cache {label:12s} first pass {walls[0]:.4f} ms/step, second "
              f"{walls[1]:.4f}, GPU {gpu:.4f} ms, builds {builds}, err {error:.1e}", flush=True)
    return rows


def replayed_cache(steps: int, copy_tbps: float) -> list[Row]:
    """The decode loop of :func:`growing_cache` over a static cache (``start + steps`` slots,
    filled to a per-sequence length in device memory): one step — the new key and value written
    at the length, the length advanced, attention — captured in a CUDA graph and replayed
    ``steps`` times. tensorfuse runs ``kernels.static_cache_attention`` (keys past the length
    never read); SDPA masks the unfilled slots with a boolean mask made from the length (cuDNN
    with GQA where it takes the mask, else the cache expanded to every head, as transformers'
    static cache does for SDPA). ``ms``: wall time a replayed step; the note: the GPU time of one
    step's attention at the last length and the error of the last step against float64."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tensorfuse as tf
    import tensorfuse.kernels as K

    B, H, HKV, D, start = 8, 32, 8, 128, 4096
    slots, scale = start + steps, D ** -0.5
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(B, HKV, slots, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    new = torch.randn(steps, B, HKV, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    length = torch.full((B,), start, dtype=torch.int32, device="cuda")
    step = torch.zeros(1, dtype=torch.int64, device="cuda")   # not 0-d: indexing by one syncs
    batch, slot = torch.arange(B, device="cuda"), torch.arange(slots, device="cuda")
    made = tf.compile(K.static_cache_attention, "cuda")
    out = torch.empty_like(q)

    def tensorfuse():
        made(q, k, v, length, scale=scale, out=out)

    def sdpa_masked(backends, expand):
        def attend():
            mask = (slot[None, :] < length[:, None])[:, None, None, :]
            kk, vv = k, v
            if expand:
                kk, vv = (x.repeat_interleave(H // HKV, 1) for x in (k, v))
            with sdpa_kernel(backends):
                out.copy_(F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=scale,
                                                         enable_gqa=not expand))
        return attend

    impls = {TENSORFUSE: (tensorfuse, "static_cache_attention"),
             SDPA_CUDNN: (sdpa_masked([SDPBackend.CUDNN_ATTENTION], False), "cuDNN, GQA"),
             SDPA: (sdpa_masked([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                                 SDPBackend.FLASH_ATTENTION], True), "kv expanded to 32 heads")}
    rows = []
    for label, (attend, how) in impls.items():
        def decode_step():
            k[batch, :, length.long()] = new[step][0]
            v[batch, :, length.long()] = new[step][0] * 0.5
            length.add_(1)
            step.add_(1)
            attend()

        try:
            length.fill_(start)
            step.zero_()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):   # warm up outside the capture (builds, maps)
                decode_step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                decode_step()
        except RuntimeError as exc:
            print(f"dynamic/growing_cache {label} (cuda graph): {exc}"[:300], flush=True)
            continue
        length.fill_(start)
        step.zero_()
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for _ in range(steps):
            graph.replay()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - begin) * 1e3 / steps
        n = start + steps
        want = F.scaled_dot_product_attention(q.double(), k[:, :, :n].double(),
                                              v[:, :, :n].double(), scale=scale, enable_gqa=True)
        error = relative_error(out, want)
        gpu = bench(attend, rep_ms=50)
        moved = 2 * B * HKV * n * D * k.element_size()
        note = (f"{how}; static cache of {slots} slots, {steps} steps from {start} keys, one "
                f"step captured and replayed; one step's attention {gpu:.4f} ms at {n} keys; "
                f"error {error:.1e}")
        rows.append(Row("dynamic/growing_cache", f"decode B{B} H{H}/{HKV} D{D} bf16, CUDA graph",
                        label, wall, 0.0, moved / gpu / 1e6, moved / gpu / 1e6 / (copy_tbps * 1e3),
                        note))
        print(f"dynamic/growing_cache {label:12s} (cuda graph) {wall:.4f} ms/step, attention "
              f"{gpu:.4f} ms, err {error:.1e}", flush=True)
    return rows


def _sweep(bench_name, impls, sizes, inputs, check, shape, work, copy_tbps, builds) -> list:
    """Each size in turn through every implementation: the first call's wall time, its output
    checked against float64 (``check(out, *args)``: the relative error), then the steady time."""
    rows, seen = [], {label: [] for label in impls}
    for n in sizes:
        args = inputs(n)
        for label, fn in impls.items():
            before = builds[label]() if label in builds else 0
            first = first_call_ms(lambda: fn(*args))
            made = builds[label]() if label in builds else 0
            error = check(fn(*args), *args)
            steady = bench(lambda: fn(*args), rep_ms=50)
            tflops, gbps = work(n, steady)
            fraction = gbps / (copy_tbps * 1e3) if copy_tbps and gbps else 0.0
            seen[label].append((first, steady, made > before))
            rows.append(Row(bench_name, shape(n), label, steady, tflops, gbps, fraction,
                            f"first call {first:.2f} ms; builds {made}; "
                            f"{'new build' if made > before else 'no new build'}; "
                            f"error {error:.1e}"))
            print(f"{bench_name} {n:6d} {label:16s} steady {steady:8.4f} ms first {first:9.2f} "
                  f"ms builds {made:3d} err {error:.1e}", flush=True)
    for label, calls in seen.items():
        within = [f - s for f, s, new in calls[1:] if not new]
        fresh = [f - s for f, s, new in calls if new]
        total = builds[label]() if label in builds else 0
        note = (f"builds {total} for {len(calls)} sizes; first call over steady: within a "
                f"build {_summary(within)}; new builds {_summary(fresh)}")
        rows.append(Row(bench_name, "all", label, statistics.mean(s for _, s, _ in calls), 0.0,
                        0.0, 0.0, note))
        print(f"{bench_name} {label}: {note}", flush=True)
    return rows


def _summary(values: list) -> str:
    if not values:
        return "none"
    return (f"median {statistics.median(values):.2f} ms, max {max(values):.2f} ms "
            f"({len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, default=50)
    parser.add_argument("--widths", type=int, default=20)
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--only", default="",
                        help="row_widths, prefill_lengths or growing_cache")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    rng = random.Random(20261129)
    ceilings = measure_ceilings()
    rows = []
    if args.only in ("", "row_widths"):
        rows += row_widths(args.widths, rng, ceilings["copy_tbps"])
    if args.only in ("", "prefill_lengths"):
        rows += prefill_lengths(args.lengths, rng)
    if args.only in ("", "growing_cache"):
        rows += growing_cache(args.steps, ceilings["copy_tbps"])
        rows += replayed_cache(args.steps, ceilings["copy_tbps"])
    device = torch.cuda.get_device_name().replace(" ", "_")
    part = f"-{args.only.replace('_', '-')}" if args.only else ""
    path = f"{args.out}/{datetime.date.today()}-{device}-dynamic{part}.csv"
    write_csv(rows, path)
    print("wrote", path)


if __name__ == "__main__":
    main()
