"""Multi-dimensional neighbourhood attention (issue 19): tensorfuse's token tiling against
FlexAttention (the same mask as a ``mask_mod`` with its block mask, under torch.compile), in one
process on one GPU. Every implementation is checked against float64 on 1024 query rows drawn at
random over the map before it is timed; TFLOP/s count useful work only (the mask's density times the dense count), and the
dense attention of the same run (``tf.compile``, full mask) is the ceiling the fraction refers to.

    python -m benchmarks.neighborhood --csv out.csv [--quick]
    python -m benchmarks.neighborhood --csv out.csv --tune 24 --only 64x64/k15,3d   # + tuning

Implementations: ``tensorfuse`` (``tf.compile`` defaults: on the H100 the Hopper template, its
visiting order chosen — patches copied as TMA boxes), ``tensorfuse_triton`` (the attention
template, Triton, its visiting order chosen), ``tensorfuse_hopper_64`` (the Hopper template with
64 query rows and 64-key windows), ``flex_attention``; with ``--all`` also ``tensorfuse_flat``
(the Triton template in the flat order) and ``tensorfuse_hopper_flat`` (the Hopper template in
the flat order: 5–20× slower). Timed eagerly (``triton.testing.do_bench``: a call's host work
counts where the GPU waits for it — 40–120 µs a call against kernels of 40–60 µs on the 64×64
maps) and, with ``--graph``, also replayed from a CUDA graph (rows ``…_graph``: GPU time only).
"""
from __future__ import annotations

import argparse
import math
import time

import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.attention import Case, baselines, checked, compiled_flex, density, reference
from benchmarks.common import Row, bench, bench_graph, write_csv
from tensorfuse.api import AutoKernel

D, H, B = 128, 16, 1
CHAIN = ("m", "l", "o")


def mask_2d(width: int, radius: int, dilation: int):
    def mask_mod(b, h, q, kv):
        dy, dx = q // width - kv // width, q % width - kv % width
        return (dy.abs() <= radius * dilation) & (dx.abs() <= radius * dilation) & \
            (dy % dilation == 0) & (dx % dilation == 0)
    return mask_mod


def mask_3d(height: int, width: int, radius: int, causal: int):
    def mask_mod(b, h, q, kv):
        frame = height * width
        dt = q // frame - kv // frame
        dy = (q // width) % height - (kv // width) % height
        dx = q % width - kv % width
        near = (dt.abs() <= radius) & (dy.abs() <= radius) & (dx.abs() <= radius)
        return near & (dt >= 0) if causal else near
    return mask_mod


def cases(quick: bool):
    """(benchmark name, kernel, tokens, scalars, mask_mod)."""
    out = []
    for side in ((64,) if quick else (64, 128)):
        for kernel_size in ((7, 31) if quick else (7, 15, 31)):
            for dil in (1, 2):
                r = kernel_size // 2
                out.append((f"attention/neighborhood_2d/{side}x{side}/k{kernel_size}/dil{dil}",
                            K.neighborhood_attention_2d, side * side,
                            dict(width=side, radius=r, dilation=dil), mask_2d(side, r, dil)))
    for causal in (0, 1):
        out.append((f"attention/neighborhood_3d/16x32x32/k7/{'causal' if causal else 'full'}",
                    K.neighborhood_attention_3d, 16 * 32 * 32,
                    dict(height=32, width=32, radius=3, causal=causal), mask_3d(32, 32, 3, causal)))
    return out


def make(name, S, scalars, mask_mod, check_rows=1024) -> Case:
    """The case's inputs; implementations are checked on ``check_rows`` query rows drawn at
    random over the whole map (a visiting order's mistakes need not sit at its ends)."""
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = 1.0 / math.sqrt(D)
    dens = density(mask_mod, B, H, S)
    rows = torch.sort(torch.randperm(S)[:check_rows]).values.cuda()
    return Case(name, q, k, v, scale, dict(scalars), None, mask_mod, None, dens,
                4 * B * H * S * S * D * dens, f"B{B} H{H} S{S} D{D}", rows,
                reference(q, k, v, scale, None, mask_mod, rows))


def triton_template(kernel, tiling, **knobs):
    sch = tf.schedule(kernel, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    return sch.apply_template("attention", **knobs).tile_as(enabled=tiling).compile()


def hopper_template(kernel, tiling=True, **knobs):
    sch = tf.schedule(kernel, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    return sch.apply_template("hopper_attention", **knobs).tile_as(enabled=tiling).compile()


def tune_case(kernel, S: int, scalars: dict, trials: int, log=print) -> None:
    """A ``tf.tune`` job at the case's sizes and map scalars (records go to the database
    ``tf.compile`` reads: the ``tensorfuse_tuned`` row)."""
    summary = tf.tune(kernel, "cuda", trials=trials, progress=False, scalars=scalars,
                      B=B, H=H, M=S, N=S, D=D)
    task = summary.tasks[0]
    log(f"  tuned {task.name}: {task.trials} trials in {summary.seconds:.0f} s, "
        f"{task.default_secs * 1e3:.4f} -> {task.best_secs * 1e3:.4f} ms")


def run(quick: bool, log=print, tune: int = 0, only: str = "", csv: str = "",
        graph: bool = False, every: bool = False) -> list[Row]:
    """Every case's rows (written to ``csv`` after each case, so that a run stopped by a time
    limit keeps what it measured)."""
    flex = compiled_flex()   # a mask_mod per case: one compile each
    rows: list[Row] = []
    dense_rate = {}
    for S in sorted({S for _, _, S, _, _ in cases(quick)}):
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        f = tf.compile(K.attention)
        f(q, k, v, 1 / math.sqrt(D))
        ms = bench(lambda: f(q, k, v, 1 / math.sqrt(D)))
        dense_rate[S] = 4 * B * H * S * S * D / ms / 1e9
        rows.append(Row(f"attention/dense/S{S}", f"B{B} H{H} S{S} D{D}", "tensorfuse", ms,
                        dense_rate[S], 0.0, 1.0, "dense ceiling of this run"))
        log(f"dense S={S}: {dense_rate[S]:.0f} TFLOP/s")
    for name, kernel, S, scalars, mask_mod in cases(quick):
        if only and not any(part in name for part in only.split(",")):
            continue
        case = make(name, S, scalars, mask_mod)
        impls = {"tensorfuse": tf.compile(kernel)}
        if not tune:
            impls.update({"tensorfuse_triton": triton_template(kernel, True),
                          "tensorfuse_hopper_64": hopper_template(kernel, consumers=1,
                                                                  block_n=64)})
            if every:
                impls.update({"tensorfuse_flat": triton_template(kernel, False),
                              "tensorfuse_hopper_flat": hopper_template(kernel, False)})
        found = {}
        for label, f in list(impls.items()) + [("tensorfuse_tuned", None)] * bool(tune):
            if f is None:   # after the defaults were built and timed
                tune_case(kernel, S, scalars, tune, log)
                f = impls[label] = tf.compile(kernel)
            t0 = time.time()
            call = lambda f=f: f(case.q, case.k, case.v, case.scale, **case.args)  # noqa: E731
            made = checked(case, label, call, log)
            if made:
                found[label] = (made[0], made[1] + f"; first call {time.time() - t0:.1f} s")
            made = checked(case, label, call, log, timing=bench_graph) if graph else None
            if made:
                found[label + "_graph"] = made
        found.update(baselines(case, flex, log, graph))
        order = impls["tensorfuse"].for_sizes(scalars, B=B, H=H, M=S, N=S, D=D)
        plan = order.build(scalars, B=B, H=H, M=S, N=S, D=D)[0] if hasattr(order, "build") \
            else None
        if "tensorfuse_tuned" in impls:   # what the records chose
            tuned = impls["tensorfuse_tuned"].for_sizes(scalars, B=B, H=H, M=S, N=S, D=D)
            if hasattr(tuned, "launches"):   # the Hopper template: its record and order
                made = (None, tuned.schedule_origin(B=B, H=H, M=S, N=S, D=D, **scalars))
                chosen = "(above)"
            else:
                made = tuned.build(scalars, B=B, H=H, M=S, N=S, D=D)
                chosen = made[0].tiling.describe() if made[0].tiling is not None else \
                    "flat order"
            if "tensorfuse_tuned" in found:
                ms, note = found["tensorfuse_tuned"]
                found["tensorfuse_tuned"] = (ms, f"{note}; {made[1]}; {chosen}")
            log(f"  tuned knobs: {made[1]}; order: {chosen}")
        how = plan.tiling.describe() if plan is not None and plan.tiling is not None else \
            getattr(order, "description", "")
        flex_ms = found.get("flex_attention", (math.nan,))[0]
        flex_graph = found.get("flex_attention_graph", (math.nan,))[0]
        line = [f"{name} density {case.density:.4f}"]
        for label, (ms, note) in found.items():
            rate = case.flops / ms / 1e9
            base = label[:-len("_graph")] if label.endswith("_graph") else label
            chosen = impls.get(base)
            if isinstance(chosen, AutoKernel):   # tf.compile: the kernel at this call
                chosen = chosen.for_sizes(scalars, B=B, H=H, M=S, N=S, D=D)
            if chosen is not None and hasattr(chosen, "launches"):   # Hopper: order, schedule
                note += "; " + chosen.launches(scalars, B=B, H=H, M=S, N=S, D=D).why
            rows.append(Row(name, case.shape, label, ms, rate, 0.0, rate / dense_rate[S],
                            note + (f"; {how}" if label == "tensorfuse" else "")))
            versus = flex_graph if label.endswith("_graph") else flex_ms
            line.append(f"{label} {ms:.3f} ms {rate:.0f} TF ({versus / ms:.2f}x flex, "
                        f"{rate / dense_rate[S]:.0%} dense)")
        log("\n  ".join(line) + f"\n  order: {how}")
        if csv:
            write_csv(rows, csv)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default="")
    parser.add_argument("--quick", action="store_true", help="64x64 maps, kernels 7 and 31")
    parser.add_argument("--tune", type=int, default=0, metavar="TRIALS",
                        help="time the defaults, tune each case, time tf.compile with the "
                             "records (in a fresh database)")
    parser.add_argument("--only", default="", help="cases whose name holds one of these "
                                                   "(comma-separated)")
    parser.add_argument("--graph", action="store_true",
                        help="also time each implementation replayed from a CUDA graph")
    parser.add_argument("--all", action="store_true",
                        help="also the flat orders of both templates")
    args = parser.parse_args()
    if args.tune:
        import os
        import tempfile

        os.environ["TENSORFUSE_CACHE"] = tempfile.mkdtemp(prefix="tensorfuse-neighborhood-")
    run(args.quick, tune=args.tune, only=args.only, csv=args.csv, graph=args.graph,
        every=args.all)


if __name__ == "__main__":
    main()
