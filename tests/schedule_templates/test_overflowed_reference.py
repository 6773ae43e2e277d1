"""A dependency that overflows to +inf (a maximum of exp(τ·y) with τ·y > 88 in float32): the
members kept relative to it must come out as the unfused program computes them. Its reference was
replaced by 0, against which exp(τ(x − v)) overflowed to inf — and a minimum of infinities stayed
at its "nothing seen" sentinel (FLT_MAX) where the unfused minimum is 0 (found by the f32
property test of tests/algebra/test_generated_chains.py)."""
import numpy as np
import pytest
import tvm

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.schedule_templates import lower_program
from tensorfuse.schedule_templates.fusion import Fusion


@tf.kernel
def overflowing(x: T.Tensor["M", "N", "f32"], y: T.Tensor["M", "N", "f32"], tau: T.f32):
    i, j = T.axes("i j")
    v = T.max(T.exp(T.abs(tau) * 0.5 * y[i, j]), over=j)
    r = T.min(T.where((j % 2 == 0) | (i == 0), T.exp(T.abs(tau) * (x[i, j] + 1.0 - v)), T.inf),
              over=j)
    s = T.sum(T.exp(T.abs(tau) * (x[i, j] - v)), over=j)
    return v, r, s


def run(fusion, x, y, tau):
    mod = lower_program(overflowing.program, (fusion,) if fusion else (), None, "int32")
    fn = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))["overflowing"]
    outs = [tvm.runtime.tensor(np.full(x.shape[0], np.nan, np.float32)) for _ in range(3)]
    fn(tvm.runtime.tensor(x), tvm.runtime.tensor(y), np.float32(tau), *outs)
    return [o.numpy() for o in outs]


@pytest.mark.parametrize("chunk, splits", [(32, 1), (7, 1), (32, 3)])
def test_members_of_an_overflowed_maximum_match_the_unfused_program(rng, chunk, splits):
    x, y = ((10 + 1e-3 * rng.standard_normal((3, 100))).astype(np.float32) for _ in range(2))
    unfused = run(None, x, y, 1000.0)
    assert np.all(np.isinf(unfused[0])) and np.all(unfused[1] == 0) and np.all(unfused[2] == 0)
    fused = run(Fusion(("v", "r", "s"), "j", chunk, splits), x, y, 1000.0)
    for a, b in zip(fused, unfused):
        assert np.array_equal(a, b)
