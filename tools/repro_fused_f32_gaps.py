"""Reproduce two known gaps of fused chains in float32 (session 22; both drawn by the f32 property
test in CI, both pre-existing — the lowering and schemes were not changed that session):

1. a fused ``logsumexp(y − v₂)`` whose dependency ``v₂`` (a sum of squares) grows to ~4e6 over the
   sweep loses up to ~200× the unfused program's error: its state is kept centred on running
   references of ``v₂`` and each correction rounds at that magnitude;
2. a fused ``max(exp(…) / v)`` whose dependency ``v`` (a sum of exponentials) overflows to +inf
   gives NaN where the unfused program (and float64) give 0: the rescaling ``v.old / v.new`` is
   inf / inf. Silently wrong — the worse of the two.

    python tools/repro_lse_shift_precision.py
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorfuse as tf  # noqa: E402
from tensorfuse import dsl as T  # noqa: E402
from tensorfuse.schedule_templates.fusion import Fusion  # noqa: E402
from tests.algebra.test_generated_chains import build, relative_errors, run  # noqa: E402


def chain_of(dtype: str):
    def chain(x: T.Tensor["M", "N", dtype], y: T.Tensor["M", "N", dtype], tau: T.f32):
        i, j = T.axes("i j")
        keep = (j % 2 == 0) | (i == 0)
        v = T.sum(T.where(keep, y[i, j], 0.0), over=j)
        v_2 = T.sum((x[i, j] * y[i, j] - v) ** 2, over=j)
        v_3 = T.min(T.where(keep, 0.5 * x[i, j] - y[i, j] - 0.5 * v, T.inf), over=j)
        r = T.logsumexp(y[i, j] - v_2, over=j)
        return v, v_2, v_3, r
    return tf.kernel(chain, name="chain")


def overflow_chain_of(dtype: str):
    def chain(x: T.Tensor["M", "N", dtype], y: T.Tensor["M", "N", dtype], tau: T.f32):
        i, j = T.axes("i j")
        v = T.sum(T.abs(T.exp(T.abs(tau) * (0.5 * y[i, j]))) + 0.5, over=j)
        v_2 = T.min(T.exp(T.abs(tau) * (0.5 * x[i, j] - y[i, j])) / v, over=j)
        r = T.max(T.where((j % 2 == 0) | (i == 0),
                          T.exp(T.abs(tau) * (x[i, j] * (j % 3) + 1.0)) / v, -T.inf), over=j)
        return v, v_2, r
    return tf.kernel(chain, name="chain")


def overflow() -> None:
    names = ("v", "v_2", "r")
    f32, f64 = overflow_chain_of("f32"), overflow_chain_of("f64")
    rng = np.random.default_rng(0)
    x, y = ((1e4 + rng.standard_normal((2, 7))).astype(np.float32) for _ in range(2))
    for label, fn, args in (("fused", build(f32, Fusion(names, "j", 96, 1)), (x, y)),
                            ("unfused", build(f32, None), (x, y)),
                            ("float64", build(f64, None), (x.astype(np.float64),
                                                            y.astype(np.float64)))):
        print(f"overflowed dependency, r {label:8}", run(fn, *args, 3, 1.0)[2])


def main() -> None:
    overflow()
    names = ("v", "v_2", "v_3", "r")
    f32, f64 = chain_of("f32"), chain_of("f64")
    rolled, naive, exact = build(f32, Fusion(names, "j", 96, 1)), build(f32, None), \
        build(f64, None)
    worst = 0.0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        m = int(rng.integers(1, 4))
        x, y = (rng.standard_normal((m, 2900)).astype(np.float32) for _ in range(2))
        ref = run(exact, x.astype(np.float64), y.astype(np.float64), 4, 1.0)
        fused, unfused = relative_errors(run(rolled, x, y, 4, 1.0)[3], ref[3],
                                         run(naive, x, y, 4, 1.0)[3])
        worst = max(worst, fused / max(unfused, 1e-12))
    print(f"worst fused/unfused error ratio of r over 200 draws: {worst:.0f}x")


if __name__ == "__main__":
    main()
