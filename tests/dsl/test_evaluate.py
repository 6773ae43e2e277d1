"""The NumPy interpreter (the reference for generated programs) agrees with hand-written NumPy."""
import numpy as np

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.dsl.evaluate import run_program


def test_masked_softmax_and_gather(rng):
    @tf.kernel
    def k(x: T.Tensor["M", "N", "f32"], idx: T.Tensor["M", "i32"]):
        i, j = T.axes("i j")
        s = T.where(j <= i, x[i, j], -T.inf)
        m = T.max(s, over=j)
        p = T.exp(s - m)
        return p / T.sum(p, over=j) + x[i, idx[i]]

    x = rng.standard_normal((6, 6))
    idx = rng.integers(0, 6, 6).astype(np.int32)
    out = run_program(k.program, {"x": x, "idx": idx})[0]
    s = np.where(np.arange(6)[None] <= np.arange(6)[:, None], x, -np.inf)
    p = np.exp(s - s.max(1, keepdims=True))
    ref = p / p.sum(1, keepdims=True) + x[np.arange(6), idx][:, None]
    np.testing.assert_allclose(out, ref, rtol=1e-12)


def test_logsumexp_monoid(rng):
    @tf.kernel
    def k(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        return T.logsumexp(x[i, j] * 30.0, over=j)

    x = rng.standard_normal((4, 50))
    ref = np.log(np.exp(x * 30.0 - (x * 30).max(1, keepdims=True)).sum(1)) + (x * 30).max(1)
    np.testing.assert_allclose(run_program(k.program, {"x": x})[0], ref, rtol=1e-12)


def test_relu_on_the_cpu_target_and_in_the_interpreter(rng):
    @tf.kernel
    def relu_rows(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        return T.sum(T.relu(x[i, j]) * x[i, j], over=j)

    x = rng.standard_normal((5, 33)).astype(np.float32)
    ref = (np.maximum(x.astype(np.float64), 0) * x).sum(1)
    np.testing.assert_allclose(run_program(relu_rows.program, {"x": x})[0], ref, rtol=1e-6)
    np.testing.assert_allclose(tf.compile(relu_rows, "llvm")(x), ref, rtol=1e-5)


def test_mean_over_one_axis_and_over_two_of_a_named_and_a_literal_size(rng):
    """``T.mean``: the sum over the axes divided by the elements they span — a layer norm as a user
    writes it, a mean over a literal-sized and a named axis, an integer tensor's mean in float32
    — in the interpreter and on the CPU target, against NumPy in float64."""
    @tf.kernel
    def layernorm(x: T.Tensor["R", "D", "f32"], w: T.Tensor["D", "f32"]):
        r, d = T.axes("r d")
        mu = T.mean(x[r, d], over=d)
        var = T.mean((x[r, d] - mu) * (x[r, d] - mu), over=d)
        return (x[r, d] - mu) * T.rsqrt(var + 1e-5) * w[d]

    @tf.kernel
    def group_mean(x: T.Tensor["B", 16, "P", "f32"]):
        b, g, p = T.axes("b g p")
        return T.mean(x[b, g, p], over=(g, p))

    @tf.kernel
    def int_mean(x: T.Tensor["R", "N", "i32"]):
        r, n = T.axes("r n")
        return T.mean(x[r, n], over=n)

    x = (rng.standard_normal((7, 33)) * 5 + 3).astype(np.float32)
    w = rng.standard_normal(33).astype(np.float32)
    x64 = x.astype(np.float64)
    centred = x64 - x64.mean(1, keepdims=True)
    ref = centred / np.sqrt((centred ** 2).mean(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(run_program(layernorm.program, {"x": x, "w": w})[0], ref,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(tf.compile(layernorm, "llvm")(x, w), ref, rtol=1e-4, atol=1e-4)
    y = rng.standard_normal((3, 16, 45)).astype(np.float32)
    np.testing.assert_allclose(tf.compile(group_mean, "llvm")(y), y.astype(np.float64).mean((1, 2)),
                               rtol=1e-5, atol=1e-6)
    z = rng.integers(-50, 50, (5, 7)).astype(np.int32)
    got = tf.compile(int_mean, "llvm")(z)
    assert got.dtype == np.float32   # not an integer division
    np.testing.assert_allclose(got, z.mean(1), rtol=1e-6)


def test_which_monoid_identities_are_no_usable_reference():
    """Rolling updates replace a running value still at an extreme identity (±inf, ±FLT_MAX) by 0
    as the reference later states are kept relative to; sums and products keep theirs."""
    from tensorfuse.dsl.monoid import LOGSUMEXP, MAX, MIN, PROD, SUM, Monoid

    for m in (MAX, MIN, LOGSUMEXP):
        assert m.identity_is_sentinel("f32") and m.identity_is_sentinel("f64"), m.name
    for m in (SUM, PROD):
        assert not m.identity_is_sentinel("f32"), m.name
    assert not MAX.identity_is_sentinel("i32")   # integer maxima are exact references
    user = Monoid("first", lambda a, b: a, (lambda d: np.float32(-np.inf),), check=False)
    assert user.identity_is_sentinel("f32") and user.identity_is_sentinel("bf16")


def test_maximum_minimum_and_clamp_as_torch_spells_them(rng):
    """``T.maximum``/``T.minimum`` are the elementwise ``T.max``/``T.min``; ``T.clamp`` bounds on
    either side or both, the upper bound winning where they cross (as ``torch.clamp``): the CPU
    target against NumPy, and a clamp without bounds is refused where it is written."""
    import pytest

    from tensorfuse.errors import DSLError

    @tf.kernel
    def k(x: T.Tensor["M", "N", "f32"], y: T.Tensor["M", "N", "f32"], lo: T.f32, hi: T.f32):
        i, j = T.axes("i j")
        return (T.maximum(x[i, j], y[i, j]) + 10 * T.minimum(x[i, j], 0.5)
                + 100 * T.clamp(y[i, j], lo, hi) + 1000 * T.clamp(x[i, j], high=hi))

    x, y = (rng.standard_normal((5, 7)) * 3 for _ in range(2))
    for lo, hi in ((-1.0, 2.0), (1.0, -1.0)):
        want = np.maximum(x, y) + 10 * np.minimum(x, 0.5) + 100 * np.minimum(
            np.maximum(y, lo), hi) + 1000 * np.minimum(x, hi)
        got = tf.compile(k, target="llvm")(x.astype(np.float32), y.astype(np.float32), lo, hi)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)
    with pytest.raises(DSLError, match="T.clamp needs low=, high= or both"):
        @tf.kernel
        def unbounded(x: T.Tensor["M", "f32"]):
            return T.clamp(x[T.axes("i")])
