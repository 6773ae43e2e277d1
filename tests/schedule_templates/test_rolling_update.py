"""Rolling and split updates on the library kernels and more chains, on the CPU target against
float64 references; the IR they produce; TVM primitives afterwards; numerical stability."""
import math

import numpy as np
import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.dsl import dtypes as dt
from tensorfuse.algebra import plan_chain
from tensorfuse.errors import RollingUpdateError, RollingUpdateWarning, ScheduleError
from tensorfuse.kernels.reference import TOLERANCE, random_inputs, reference, relative_error
from tests.kernels.test_library_cpu import poisoned_outputs, sizes_for

CHAINS = {name: ("m", "l", "o") for name in K.ATTENTION_VARIANTS}
CHAINS.update(softmax=("m", "l"), log_softmax=("m", "l"), cross_entropy=("m", "l"),
              layernorm=("mean_sum", "var_sum"), rmsnorm=("ms_sum",))


def run_fused(kernel, sizes, rng, fuse):
    tensors, scalars = random_inputs(kernel, sizes, rng)
    sch = tf.schedule(kernel, "llvm")
    fuse(sch)
    (out,) = poisoned_outputs(kernel, sizes)
    sch.compile()(**tensors, **scalars, out=out)
    return relative_error(out, reference(kernel, tensors, scalars))


@pytest.mark.parametrize("name", sorted(CHAINS))
@pytest.mark.parametrize("splits, chunk", [(1, 8), (1, 1), (3, 5)])
def test_fused_library_kernel_matches_reference(name, splits, chunk, rng):
    kernel = K.ALL[name]
    names = CHAINS[name]

    def fuse(sch):
        if splits == 1:
            sch.rolling_update(*names, axis="j", chunk=chunk)
        else:
            sch.split_update(*names, axis="j", splits=splits, chunk=chunk)

    err = run_fused(kernel, sizes_for(name), rng, fuse)
    assert err <= TOLERANCE[kernel.program.outputs[0].dtypes[0]], f"error {err:.2e}"


def test_cross_entropy_over_a_large_vocabulary(rng):
    sizes = dict(M=3, V=50_000)
    err = run_fused(K.cross_entropy, sizes, rng,
                    lambda s: s.rolling_update("m", "l", axis="j", chunk=1024))
    assert err <= TOLERANCE["f32"]


def test_decode_split_update(rng):
    sizes = dict(B=2, H=4, HKV=2, M=1, N=300, D=16)
    err = run_fused(K.gqa_causal_attention, sizes, rng,
                    lambda s: s.split_update("m", "l", "o", axis="j", splits=8, chunk=16))
    assert err <= TOLERANCE["bf16"]


def test_argmax_written_as_a_dependent_chain(rng):
    @tf.kernel
    def first_argmax(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        first = T.min(T.where(x[i, j] == m, j, T.size("N")), over=j)
        return first

    x = rng.integers(-3, 3, size=(6, 41)).astype("f4")  # many ties: the first one must win
    # a maximum of +∞ (its reference is the largest finite number: the index compares with the
    # value itself) and −∞ beside finite values
    x[2, 17], x[2, 30], x[3, :20] = np.inf, np.inf, -np.inf
    for fuse in (lambda s: s.rolling_update("m", "first", axis="j", chunk=4),
                 lambda s: s.split_update("m", "first", axis="j", splits=3, chunk=4)):
        sch = tf.schedule(first_argmax, "llvm")
        fuse(sch)
        np.testing.assert_array_equal(sch.compile()(x), x.argmax(1))


def test_a_count_of_the_maxima_resets_where_the_maximum_moves(rng):
    """How many elements equal the row's maximum and the sum of the weights there, rolled and
    split (0 for what was seen before the maximum moved); rows of +∞ and ties included."""
    @tf.kernel
    def at_max(x: T.Tensor["M", "N", "f32"], w: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        ties = T.sum(T.where(x[i, j] == m, 1.0, 0.0), over=j)
        mass = T.sum(T.where(x[i, j] == m, w[i, j], 0.0), over=j)
        return ties, mass

    x = rng.integers(-3, 3, size=(6, 41)).astype("f4")
    x[2, 17], x[2, 30] = np.inf, np.inf
    w = rng.standard_normal((6, 41)).astype("f4")
    top = x == x.max(1, keepdims=True)
    for fuse in (lambda s: s.rolling_update("m", "ties", "mass", axis="j", chunk=4),
                 lambda s: s.split_update("m", "ties", "mass", axis="j", splits=3, chunk=4)):
        sch = tf.schedule(at_max, "llvm")
        fuse(sch)
        ties, mass = sch.compile()(x, w)
        np.testing.assert_array_equal(ties, top.sum(1))
        np.testing.assert_allclose(mass, (w * top).sum(1), rtol=1e-5, atol=1e-6)


def test_rolled_ir_has_running_states_and_corrections_as_blocks():
    sch = tf.schedule(K.attention, "llvm", B=1, H=2, M=16, N=64, D=16)
    sch.rolling_update("m", "l", "o", axis="j", chunk=16)
    text = sch.script()
    for block in ("m_init", "m_chunk", "m_update", "l_update", "o_update", "m_commit", "s_sum_local"):
        assert f'T.sblock("{block}")' in text, block
    update = next(line for line in text.splitlines() if line.strip().startswith("o_run[") and
                  "o_chunk" in line)
    # exp(m_old − m_new): on the CPU as the polynomial the vector units run (vector_math.py)
    assert "T.reinterpret" in update and "m_prev" in update and "m_run" in update
    # on the CPU the running weighted sum accumulates in float64 (TargetSpec.accumulate)
    assert 'o_run = T.sblock_alloc_buffer((1, 2, 16, 16), "float64")' in text
    assert "s_sum = " not in text  # the score matrix is never stored


def test_tvm_primitives_apply_after_the_rolling_update(rng):
    sch = tf.schedule(K.softmax, "llvm", M=8, N=96)
    sch.rolling_update("m", "l", axis="j", chunk=32)
    loops = sch.get_loops(sch.get_sblock("l_chunk"))
    sch.unroll(loops[-1])
    block = sch.get_sblock("out")
    sch.vectorize(sch.split(sch.get_loops(block)[-1], [None, 8])[-1])
    assert len(sch.history()) == 4  # the fusion, then three TVM steps
    x = rng.standard_normal((8, 96)).astype(dt.to_numpy("bf16"))
    out = sch.compile()(x)
    xf = x.astype(np.float64)
    ref = np.exp(xf - xf.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    assert relative_error(out, ref) <= TOLERANCE["bf16"]


def test_fusion_after_tvm_primitives_is_refused():
    sch = tf.schedule(K.softmax, "llvm", M=8, N=96)
    sch.parallel(sch.get_loops(sch.get_sblock("out"))[0])
    with pytest.raises(ScheduleError, match="must come before TVM schedule primitives"):
        sch.rolling_update("m", "l", axis="j")
    sch.undo()
    sch.rolling_update("m", "l", axis="j")


def test_refusal_leaves_the_schedule_unchanged():
    @tf.kernel
    def k(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        return T.sum(T.tanh(x[i, j] - m), over=j)

    sch = tf.schedule(k, "llvm")
    before = sch.script()
    with pytest.raises(RollingUpdateError, match="tanh"):
        sch.rolling_update("m", "out", axis="j")
    assert sch.script() == before and sch.history() == []


def test_rolled_softmax_is_stable_on_huge_inputs(rng):
    """Inputs near ±1e4 (exp(x) alone would overflow) whose softmax is far from one-hot, against
    an independent float64 reference; then a range of ±3e4, where it is one-hot."""
    @tf.kernel
    def softmax32(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        p = T.exp(x[i, j] - m)
        return p / T.sum(p, over=j)

    def reference(x):
        x = x.astype(np.float64)
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    spread = (1e4 + rng.standard_normal((16, 257))).astype("f4")
    spread[8:] -= 2e4                       # rows near −1e4 as well
    huge = (rng.standard_normal((4, 257)) * 1e4).astype("f4")
    names = [c.name for c in softmax32.program.computes if c.is_reduction]
    for x, tol in ((spread, 1e-5), (huge, 1e-6)):
        want = reference(x)
        assert x is huge or want.max() < 0.5  # not one-hot
        for fuse in (lambda s: s.rolling_update(*names, axis="j", chunk=16),
                     lambda s: s.split_update(*names, axis="j", splits=4, chunk=16)):
            sch = tf.schedule(softmax32, "llvm")
            fuse(sch)
            out = sch.compile()(x)
            assert np.all(np.isfinite(out))
            assert relative_error(out, want) <= tol


def _user_logaddexp(a, b):
    hi, lo = T.where(a > b, a, b), T.where(a > b, b, a)
    return T.where(hi == -T.inf, hi, hi + T.log(1.0 + T.exp(lo - hi)))


USER_LSE = T.Monoid("user_lse", _user_logaddexp, (-math.inf,), homomorphisms=("shift",))


@pytest.mark.parametrize("dep", ["logsumexp", "max", "min", "user_lse"])
def test_a_dependency_that_has_seen_only_masked_elements_is_no_reference(dep, rng):
    """A split (or a first chunk) whose elements are all masked leaves a running logsumexp at
    −inf (a max at −FLT_MAX, a min at FLT_MAX; a user's monoid likewise). Later members kept
    relative to it — here Σ (x − v)², which reads every element, masked or not — would be
    infinite, and correcting them to the final value gives inf − inf = NaN. Found by the property
    test: a logsumexp dependency in a split of odd columns only."""
    reduce = {"logsumexp": T.logsumexp, "max": T.max, "min": T.min,
              "user_lse": lambda e, over: T.reduce(e, over=over, monoid=USER_LSE)}[dep]
    neutral = T.inf if dep == "min" else -T.inf

    @tf.kernel
    def centred(x: T.Tensor["M", "N", "f64"]):
        i, j = T.axes("i j")
        v = reduce(T.where((j >= 5) | (i == 0), x[i, j], neutral), over=j)
        return T.sum((x[i, j] - v) ** 2, over=j)

    x = rng.standard_normal((3, 13))
    xm = np.where(np.arange(13) >= 5, x, np.nan)
    xm[0] = x[0]
    lse = lambda a: np.log(np.nansum(np.exp(a), 1))  # noqa: E731
    v = {"logsumexp": lse, "user_lse": lse, "max": lambda a: np.nanmax(a, 1),
         "min": lambda a: np.nanmin(a, 1)}[dep](xm)
    want = ((x - v[:, None]) ** 2).sum(1)
    names = [c.name for c in centred.program.computes if c.is_reduction]
    for fuse in (lambda s: s.rolling_update(*names, axis="j", chunk=2),
                 lambda s: s.split_update(*names, axis="j", splits=3, chunk=2)):
        sch = tf.schedule(centred, "llvm")
        fuse(sch)
        np.testing.assert_allclose(sch.compile()(x), want, rtol=1e-12)


def test_a_rescaled_max_that_has_seen_nothing_is_still_no_reference(rng):
    """A max of x / S (S a positive sum) is kept as max(x) and rescaled when read: in a split of
    masked columns its value was (1/S)·(−FLT_MAX) — huge, yet not the identity, so it served as a
    reference and Σ exp(x − v)·x came out NaN. Nothing seen now reads as the identity."""
    @tf.kernel
    def rescaled(x: T.Tensor["M", "N", "f64"]):
        i, j = T.axes("i j")
        total = T.sum(T.abs(x[i, j]) + 0.25, over=j)
        v = T.max(T.where((j % 2 == 0) | (i == 0), x[i, j] / total, -T.inf), over=j)
        return T.sum(T.exp(x[i, j] - v) * x[i, j], over=j)

    x = rng.standard_normal((3, 7))
    names = [c.name for c in rescaled.program.computes if c.is_reduction]
    keep = (np.arange(7) % 2 == 0) | (np.arange(3)[:, None] == 0)
    v = np.where(keep, x / (np.abs(x) + 0.25).sum(1, keepdims=True), -np.inf).max(1)
    want = (np.exp(x - v[:, None]) * x).sum(1)   # float64 NumPy, not the program under test
    with pytest.warns(RollingUpdateWarning, match="can exceed 1"):  # v falls when total grows
        plan_chain(rescaled.program, names, "j")
    for splits in (2, 7):
        sch = tf.schedule(rescaled, "llvm")
        sch.split_update(*names, axis="j", splits=splits, chunk=1)
        np.testing.assert_allclose(sch.compile()(x), want, rtol=1e-12)


def test_rows_whose_masked_max_saw_nothing_match_an_independent_reference(rng):
    """A row whose masked max sees nothing holds −FLT_MAX; what depends on it is degenerate in the
    unfused program too — but it must stay degenerate (or exactly 0 where a mask discards it),
    never become a plausible finite number. Three ways the fused program went wrong, found by the
    property test with masked prefixes: the final correction zeroed an overflowing coefficient of
    a non-empty state (Σ (x − v)² came out as Σ x²); the value formula multiplied an empty state
    by an overflowing coefficient (Σ where(m, x − 2v, 0) came out NaN, not 0); and after a rolling
    sweep the final step assumed the states were kept relative to the true value of a dependent
    sum, while they were kept relative to its running reference (a later max came out 0.13, not
    −9e307)."""
    @tf.kernel
    def degenerate(x: T.Tensor["M", "N", "f64"]):
        i, j = T.axes("i j")
        keep = (j >= 5) & (i != 1)                        # row 1: nothing kept
        v = T.max(T.where(keep, x[i, j], -T.inf), over=j)
        square = T.sum((x[i, j] - v) ** 2, over=j)
        kept = T.sum(T.where(keep, x[i, j] - 2.0 * v, 0.0), over=j)
        weights = T.sum(T.exp(T.where(keep, x[i, j], -T.inf) - v), over=j)
        v2 = T.sum(x[i, j] - 0.5 * v, over=j)
        later = T.max(T.where(j % 2 == 0, x[i, j] - 0.5 * v2, -T.inf), over=j)
        return square, kept, weights, later

    x = rng.standard_normal((3, 13))
    names = [c.name for c in degenerate.program.computes if c.is_reduction]
    naive = _degenerate_reference(x)
    assert np.isinf(naive[0][1]) and naive[1][1] == 0 and naive[2][1] == 0  # what row 1 gives
    for fuse in (lambda s: s.rolling_update(*names, axis="j", chunk=2),
                 lambda s: s.split_update(*names, axis="j", splits=3, chunk=2)):
        sch = tf.schedule(degenerate, "llvm")
        fuse(sch)
        for got, want in zip(sch.compile()(x), naive):
            usable = np.isfinite(want) & (np.abs(want) < 1e300)
            np.testing.assert_array_equal(np.isfinite(got) & (np.abs(got) < 1e300), usable)
            np.testing.assert_allclose(got[usable], want[usable], rtol=1e-9, atol=1e-12)


def _degenerate_reference(x):
    """The degenerate kernel in float64 NumPy, with the DSL's semantics for a row whose masked max
    sees nothing: the max is the identity −FLT_MAX (the largest finite negative), so Σ (x − v)²
    overflows to inf, masked sums are 0 and exp(−inf − v) is 0."""
    n = x.shape[1]
    j, i = np.arange(n), np.arange(x.shape[0])[:, None]
    keep = (j >= 5) & (i != 1)
    v = np.where(keep, x, -np.finfo(np.float64).max).max(1, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        square = ((x - v) ** 2).sum(1)
        kept = np.where(keep, x - 2.0 * v, 0.0).sum(1)
        weights = np.exp(np.where(keep, x, -np.inf) - v).sum(1)
        v2 = (x - 0.5 * v).sum(1, keepdims=True)
        later = np.where(j % 2 == 0, x - 0.5 * v2, -np.inf).max(1)
    return square, kept, weights, later


def test_corrections_are_shown_readably():
    sch = tf.schedule(K.attention, "llvm")
    sch.rolling_update("m", "l", "o", axis="j")
    text = sch.corrections()
    assert "o: linear over m" in text and "exp(m.old - m.new)" in text


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_fused_attention_compiles_for_cuda(arch):
    sch = tf.schedule(K.causal_attention, f"cuda:{arch}", B=1, H=2, M=128, N=128, D=64)
    sch.rolling_update("m", "l", "o", axis="j", chunk=32)
    ptx = sch.compile().ptx()
    assert f".target {arch}" in ptx and "ex2.approx" in ptx
    assert "%ctaid.x" in ptx and "%tid.x" in ptx  # rows spread over blocks and threads
