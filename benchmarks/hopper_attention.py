"""The Hopper attention template (``apply_template("hopper_attention")``) on an H100: checked, then
timed — its defaults and knob variants (``tensorfuse_hopper …``), ``tf.compile`` defaults
(``tensorfuse``: the Hopper template for prefill on sm_90a), the Triton template
(``tensorfuse_triton``), SDPA (cuDNN, FlashAttention) and FlexAttention under torch.compile — in
one process.

    python -m benchmarks.hopper_attention --check          # correctness only (ragged, f16, D=64)
    python -m benchmarks.hopper_attention --csv out.csv    # check, then time (S=4096, 16384)
    python -m benchmarks.hopper_attention --csv out.csv --tune 40   # tf.compile with records

``--tune N``: before timing a variant, a ``tf.tune`` job of N trials at its sizes and mask
scalars (its records then in a fresh database that ``tf.compile`` reads): the ``tensorfuse`` rows
are tuned records, the ``tensorfuse_hopper`` row (knobs given explicitly) the template defaults.

The check compares every variant with the float64 reference of ``benchmarks.attention`` on fresh random inputs (normal, and
with a wide score range), ragged sizes (M ≠ N, neither a multiple of the tiles), GQA, f16 and
head dim 64, the output poisoned with NaN before the call. Timings are GPU time of the call
(``benchmarks.common.bench``); FLOPs count the unmasked fraction only.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import torch

import tensorfuse as tf
from benchmarks.attention import (baselines, checked, compiled_flex, documents, make_case,
                                  reference, variants)
from benchmarks.attention_unlisted import UNLISTED
from benchmarks.common import Row, measure_ceilings, relative_error, write_csv
from tensorfuse import dsl as T
from tensorfuse.kernels.attention import key_position, scores, softmax_attend

CHAIN = ("m", "l", "o")
TOLERANCE = {"bf16": 2e-2, "f16": 4e-3}   # relative error against float64 (inputs rounded too)


@tf.kernel
def causal_attention_f16(q: T.Tensor["B", "H", "M", "D", "f16"],
                         k: T.Tensor["B", "H", "N", "D", "f16"],
                         v: T.Tensor["B", "H", "N", "D", "f16"], scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    return softmax_attend(T.where(key_position(i) >= j, s, -T.inf), v[b, h, j, e], j)


def hopper(kernel, **knobs):
    sch = tf.schedule(kernel, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    return sch.apply_template("hopper_attention", **knobs).compile()


CHECK_SHAPES = [dict(B=2, M=333, N=333), dict(B=1, M=200, N=517), dict(B=1, M=700, N=300)]
# the template's own choice, and the persistent schedules on few CTAs (many tiles each)
CHECK_SCHEDULES = [dict(), dict(schedule="dynamic", ctas=3), dict(schedule="snake", ctas=5),
                   dict(block_n=176)]   # what wide_blocks_pay picks for long causal rows
# unmasked variants with the last round's tiles split along the keys: 24 tiles of 12 (D=128) or
# 16 (D=64) key blocks on 5 CTAs (pieces of 10 / 13 blocks, crossing tiles) and on 7 (6 / 7)
SPLIT_SHAPE = dict(B=1, M=700, N=2000)
SPLIT_SCHEDULES = [dict(schedule="split", ctas=5), dict(schedule="split", ctas=7)]


def check(log=print) -> int:
    """Every variant on every check shape (and wide-range inputs); returns the number wrong."""
    wrong = 0
    listed = variants(1024, H=4, window=97, prefix=77, radius=45)
    cases = [(name, spec, shape, spread) for name, spec in listed.items()
             for shape in CHECK_SHAPES for spread in (1.0, 4.0)]
    f16 = (causal_attention_f16, {}, None, lambda b, h, q, kv: q >= kv, None, 4, 4)
    cases += [("causal_f16", f16, CHECK_SHAPES[1], 1.0), ("causal_f16", f16, CHECK_SHAPES[0], 4.0)]
    # variants no issue lists (benchmarks.attention_unlisted): their inputs and mods made per shape
    cases += [(name, (kernel, make, None, None, None) + heads, shape, 1.0)
              for name, (kernel, make, heads) in UNLISTED.items() for shape in CHECK_SHAPES[:2]]
    runs = [case + (knobs,) for case in cases for knobs in CHECK_SCHEDULES
            if (case[3] == 1.0 or not knobs) and
            (case[0] not in UNLISTED or knobs in ({}, {"block_n": 176}))]
    runs += [(name, spec, SPLIT_SHAPE, spread, knobs) for name, spec in listed.items()
             if spec[3] is None for spread in (1.0, 4.0) for knobs in SPLIT_SCHEDULES]
    for name, (kernel, extra, score_mod, mask_mod, _, hq, hkv), shape, spread, knobs in runs:
        if mask_mod == "document" and shape["M"] > shape["N"]:
            continue   # queries before the first key have no document (doc[b, negative])
        # the scale goes into the exponent's FFMA when it is positive; a negative or zero one
        # (legal, never 1/√d) takes the other path
        factors = (1.0, -0.7, 0.0) if name in ("full", "causal", "alibi") and spread == 1.0 and \
            not knobs else (1.0,)
        for D, factor in ((d, c) for d in ((128, 64) if spread == 1.0 else (128,))
                          for c in factors):
            B, M, N = shape["B"], shape["M"], shape["N"]
            dtype = torch.float16 if name.endswith("f16") else torch.bfloat16
            hq_, hkv_ = (hq, hkv) if callable(extra) else ((8, 2) if hq != hkv else (4, 4))
            scale = factor / math.sqrt(D)
            q = (torch.randn(B, hq_, M, D, device="cuda") * spread).to(dtype)
            k = (torch.randn(B, hkv_, N, D, device="cuda") * spread).to(dtype)
            v = torch.randn(B, hkv_, N, D, device="cuda").to(dtype)
            if callable(extra):   # an unlisted variant: its inputs and mods at this shape
                args, sm, mm = extra(B, hq_, hkv_, M, N, dtype)
            else:
                args, sm, mm = dict(extra), score_mod, mask_mod
            takes_scale = "scale" in {p.name for p in kernel.program.scalar_params}
            if mask_mod == "document":
                doc = documents(B, N, torch.Generator().manual_seed(M))
                args["doc"] = doc
                mm = lambda b, h, qq, kv, doc=doc: doc[b, qq] == doc[b, kv]  # noqa: E731
            label = f"{name} B{B} H{hq_}/{hkv_} M{M} N{N} D{D} x{spread:g}" + \
                (f" scale {factor:g}/√D" if factor != 1.0 else "") + "".join(
                f" {k}={x}" for k, x in knobs.items())
            try:
                f = hopper(kernel, **knobs)
                ref = reference(q, k, v, scale if takes_scale else 1.0, sm, mm)
                rows_ok = ~torch.isnan(ref).any(-1)   # rows with no visible key are NaN in both
                err, nan_match = 0.0, True
                for _ in range(2):   # twice: the dynamic schedule's counters reset themselves
                    out = torch.full((B, hq_, M, D), float("nan"), dtype=dtype, device="cuda")
                    f(q, k, v, **({"scale": scale} if takes_scale else {}), **args, out=out)
                    torch.cuda.synchronize()
                    err = max(err, relative_error(out.double()[rows_ok], ref[rows_ok]))
                    nan_match &= bool(torch.equal(torch.isnan(out).any(-1), ~rows_ok))
                ok = err <= TOLERANCE["f16" if dtype == torch.float16 else "bf16"] and nan_match
            except Exception as exc:  # noqa: BLE001 - report every case
                ok, err, nan_match = False, float("nan"), False
                log(f"  {label}: {type(exc).__name__}: {exc}"[:400])
            wrong += not ok
            log(f"{'ok   ' if ok else 'WRONG'} {label:52s} err {err:.2e}"
                + ("" if nan_match else " (empty rows differ)"))
    return wrong


# the schedules (the defaults' other knobs; block_n=176 and stages=3 were measured apart and are
# in the tuning space); ``tensorfuse`` (tf.compile) runs the "auto" choice
KNOBS = [dict(schedule="grid"), dict(schedule="dynamic"), dict(schedule="snake")]


def tune_case(kernel, case, extra: dict, trials: int, log=print) -> None:
    """A tuning job for one variant at the case's sizes and mask scalars."""
    B, H, M, D = case.q.shape
    HKV, N = case.k.shape[1], case.k.shape[2]
    sizes = {n: v for n, v in dict(B=B, H=H, HKV=HKV, M=M, N=N, D=D).items()
             if n in kernel.program.dim_names()}
    own = {p.name for p in kernel.program.scalar_params}
    summary = tf.tune(kernel, "cuda", trials=trials, progress=False,
                      scalars={n: v for n, v in extra.items() if n in own}, **sizes)
    task = summary.tasks[0]
    log(f"  tuned {task.name}: {task.trials} trials in {summary.seconds:.0f} s, "
        f"{task.default_secs * 1e3:.4f} -> {task.best_secs * 1e3:.4f} ms")


def timed(sizes=(4096, 16384), names=None, log=print, ceiling: float | None = None,
          tune: int = 0) -> list[Row]:
    """Every variant at each size: the Hopper template's knob points, the Triton template,
    ``tf.compile`` and the baselines, float-checked, in TFLOP/s; fractions of ``ceiling`` (the bf16
    GEMM rate, measured now where not given)."""
    if ceiling is None:
        ceiling = measure_ceilings()["gemm_tflops"]
        log(f"bf16 GEMM ceiling {ceiling:.0f} TFLOP/s")
    flex = compiled_flex()
    rows = []
    gen = torch.Generator().manual_seed(0)
    for S in sizes:
        for name, spec in variants(S).items():
            if names and name not in names:
                continue
            if S > 4096 and name not in ("full", "causal", "gqa_causal"):
                continue
            kernel = spec[0]
            case = make_case(name, spec, S, gen, check_rows=64)
            q, k, v, scale, args = case.q, case.k, case.v, case.scale, case.args
            impls = {}
            if tune:
                tune_case(kernel, case, spec[1], tune, log)

            def measure(label, fn):
                made = checked(case, label, fn, log)
                if made:
                    impls[label] = made

            for knobs in KNOBS:
                if knobs.get("block_n") == 176 and case.mask_mod is not None:
                    continue
                f = hopper(kernel, **knobs)
                label = "tensorfuse_hopper" + "".join(f" {k}={x}" for k, x in knobs.items())
                measure(label, lambda f=f: f(q, k, v, scale=scale, **args))
            triton = tf.schedule(kernel, "cuda").rolling_update(*CHAIN, axis="j") \
                .apply_template("attention").compile()
            measure("tensorfuse_triton", lambda: triton(q, k, v, scale=scale, **args))
            default = tf.compile(kernel, "cuda")   # what a user gets: the Hopper template here
            measure("tensorfuse", lambda: default(q, k, v, scale=scale, **args))
            impls.update(baselines(case, flex, log))
            rows += [case.row(impl, ms, note, ceiling) for impl, (ms, note) in impls.items()]
            log(f"{name:14s} S={S:5d} " + "  ".join(f"{i.replace('tensorfuse_hopper', 'H')}="
                                                    f"{case.flops / ms / 1e9:5.0f}"
                                                    for i, (ms, _) in impls.items()))
            del case, q, k, v
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="correctness only")
    parser.add_argument("--csv", help="write the timings here")
    parser.add_argument("--only", help="comma-separated variant names to time")
    parser.add_argument("--sizes", default="4096,16384")
    parser.add_argument("--tune", type=int, default=0, metavar="TRIALS",
                        help="tune each variant first (tf.compile then uses the records)")
    parser.add_argument("--knobs", default="all", choices=("all", "defaults"),
                        help="time every knob variant of the Hopper template, or its defaults")
    args = parser.parse_args(argv)
    start = time.time()
    if args.check:
        wrong = check()
        print(f"{wrong} wrong; {time.time() - start:.0f} s")
        return 1 if wrong else 0
    if args.tune:   # records in a fresh database, which tf.compile reads
        import os
        import tempfile

        os.environ["TENSORFUSE_CACHE"] = tempfile.mkdtemp(prefix="tensorfuse-hopper-tuned-")
    if args.knobs == "defaults":
        KNOBS[:] = [dict()]
    rows = timed(tuple(int(s) for s in args.sizes.split(",")),
                 args.only.split(",") if args.only else None, tune=args.tune)
    if args.csv:
        write_csv(rows, args.csv)
    print(f"{time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
