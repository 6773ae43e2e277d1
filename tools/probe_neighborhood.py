"""Variants of the Hopper template's tiled neighbourhood kernels on a few cases (issue 19): each
checked against float64 on 1024 rows, then timed, in one process — to see what a case's time
depends on (schedule, patch and window shapes, block sizes) before changing a default.

    PYTHONPATH=. python tools/probe_neighborhood.py [--only 64x64/k7] [--csv out.csv]
"""
import argparse

import tensorfuse as tf
from benchmarks.attention import checked
from benchmarks.common import Row, write_csv
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
    ("stages 3", {"stages": 3}, None),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="64x64/k7/dil1,64x64/k7/dil2")
    parser.add_argument("--csv", default="")
    args = parser.parse_args()
    rows = []
    for name, kernel, S, scalars, mask_mod in cases(False):
        if not any(part in name for part in args.only.split(",")):
            continue
        case = make(name, S, scalars, mask_mod)
        for label, knobs, request in VARIANTS:
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
            made = checked(case, label, lambda f=f: f(case.q, case.k, case.v, case.scale,
                                                       **case.args))
            if made:
                ms = made[0]
                rows.append(Row(name, case.shape, f"hopper {label}", ms, case.flops / ms / 1e9,
                                0.0, 0.0, made[1] + "; " + why))
                print(f"{name:42s} {label:14s} {ms:.4f} ms  {why[:150]}", flush=True)
    if args.csv:
        write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
