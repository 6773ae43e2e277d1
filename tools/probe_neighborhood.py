"""Variants of the Hopper template's tiled neighbourhood kernels on a few cases (issue 19): each
checked against float64 on 1024 rows, then timed, in one process — to see what a case's time
depends on (schedule, patch and window shapes, block sizes) before changing a default. Each
variant is timed eagerly (``bench``: host work between launches counts where the GPU waits for
it), replayed from a CUDA graph (GPU time only), and by its host time per call.

    PYTHONPATH=. python tools/probe_neighborhood.py [--only 64x64/k7] [--csv out.csv]
"""
import argparse

import tensorfuse as tf
from benchmarks.attention import checked
from benchmarks.common import Row, bench_graph, host_us, write_csv
from benchmarks.neighborhood import B, CHAIN, D, H, cases, make

# (label, template knobs, tile_as request or None)
VARIANTS = [
    ("default", {}, None),
    ("grid", {"schedule": "grid"}, None),
    ("dynamic", {"schedule": "dynamic"}, None),
    ("snake", {"schedule": "snake"}, None),
    ("q8x16 k8x16", {}, {"patch": (8, 16), "key_patch": (8, 16)}),
    ("q16x8 k16x8", {}, {"patch": (16, 8), "key_patch": (16, 8)}),
    ("q8x16 k16x8", {}, {"patch": (8, 16), "key_patch": (16, 8)}),
    ("c1 b64", {"consumers": 1, "block_n": 64}, None),
    ("c2 b64", {"consumers": 2, "block_n": 64}, None),
    ("c1 b128", {"consumers": 1, "block_n": 128}, None),
    ("c1 b64 x2", {"consumers": 1, "block_n": 64, "ctas_per_sm": 2}, None),
    ("c1 b64 x2 seq", {"consumers": 1, "block_n": 64, "ctas_per_sm": 2, "overlap": False}, None),
    ("c1 b64 x2 grid", {"consumers": 1, "block_n": 64, "ctas_per_sm": 2, "schedule": "grid"},
     None),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="64x64/k7/dil1,64x64/k7/dil2,64x64/k15/dil1")
    parser.add_argument("--variants", default="", help="labels of VARIANTS to run (all if empty)")
    parser.add_argument("--csv", default="")
    parser.add_argument("--no-triton", action="store_true", help="skip the Triton template's row")
    args = parser.parse_args()
    wanted = [v for v in VARIANTS if not args.variants or v[0] in args.variants.split(",")]
    rows = []
    for name, kernel, S, scalars, mask_mod in cases(False):
        if not any(part in name for part in args.only.split(",")):
            continue
        case = make(name, S, scalars, mask_mod)
        made = None
        if not args.no_triton:
            triton = tf.schedule(kernel, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
            triton = triton.apply_template("attention").compile()
            run = lambda f=triton: f(case.q, case.k, case.v, case.scale, **case.args)  # noqa: E731
            made = checked(case, "triton", run)
        if made:
            print(f"{name:42s} {'triton tiled':14s} {made[0]:.4f} ms eager, "
                  f"{bench_graph(run):.4f} ms graph, host {host_us(run):.0f} us", flush=True)
        for label, knobs, request in wanted:
            sch = tf.schedule(kernel, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
            sch.apply_template("hopper_attention", **knobs)
            if request:
                sch.tile_as(**request)
            try:
                f = sch.compile()
                why = f.launches(scalars, B=B, H=H, M=S, N=S, D=D).why
            except Exception as exc:  # noqa: BLE001 - a variant the map refuses
                print(f"{name} {label}: {type(exc).__name__}: {exc}"[:300])
                continue
            run = lambda f=f: f(case.q, case.k, case.v, case.scale, **case.args)  # noqa: E731
            made = checked(case, label, run)
            if made:
                ms, graph, host = made[0], bench_graph(run), host_us(run)
                rows.append(Row(name, case.shape, f"hopper {label}", graph,
                                case.flops / graph / 1e9, 0.0, 0.0,
                                f"{made[1]}; eager {ms:.4f} ms; host {host:.0f} us; {why}"))
                print(f"{name:42s} {label:14s} {ms:.4f} ms eager, {graph:.4f} ms graph, "
                      f"host {host:.0f} us  {why[:110]}", flush=True)
    if args.csv:
        write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
