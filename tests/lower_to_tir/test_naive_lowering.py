"""The naive lowering: one named sblock per compute, named buffers, symbolic or fixed sizes."""
import numpy as np
import tvm

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels import attention
from tensorfuse.lower_to_tir import lower_naive




def test_one_block_per_compute_named_after_variables():
    mod = lower_naive(attention.program)
    sch = tvm.s_tir.Schedule(mod)
    sch.work_on("attention")
    for c in attention.program.computes:
        block = sch.get(sch.get_sblock(c.name))
        assert block.name_hint == c.name
    text = mod.script()
    for name in ("q: T.Buffer", "k: T.Buffer", "v: T.Buffer", "scale: T.float32", "out: T.Buffer"):
        assert name in text
    assert 'T.sblock("m")' in text and "T.init()" in text


def test_reduction_blocks_have_reduce_iterators():
    text = lower_naive(attention.program).script()
    m_block = text[text.index('T.sblock("m")'):]
    assert 'T.axis.remap("SSSR"' in m_block.splitlines()[1]


def test_fixed_sizes_are_constants_in_the_ir():
    text = lower_naive(attention.program, dict(B=1, H=2, M=8, N=8, D=4)).script()
    assert "T.Buffer((1, 2, 8, 4)" in text
    symbolic = lower_naive(attention.program).script()
    assert "T.int32()" in symbolic


def test_64_bit_indexing_when_asked():
    text = lower_naive(attention.program, index_dtype="int64").script()
    assert "T.int32()" not in text and 'B = TypeVar("B")' in text  # how TVM prints int64 sizes


def test_lowered_module_runs_on_llvm(rng):
    @tf.kernel
    def mix(x: T.Tensor["M", "N", "f32"], w: T.Tensor["N", "f32"], bias: T.f32):
        i, j = T.axes("i j")
        y = T.where(x[i, j] > 0.0, x[i, j], 0.1 * x[i, j]) * w[j]
        return T.sum(y, over=j) + bias

    mod = lower_naive(mix.program)
    lib = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    x = rng.standard_normal((7, 13)).astype("float32")
    w = rng.standard_normal(13).astype("float32")
    out = tvm.runtime.tensor(np.full(7, np.nan, "float32"))
    lib["mix"](tvm.runtime.tensor(x), tvm.runtime.tensor(w), 0.25, out)
    terms = np.where(x > 0, x, 0.1 * x).astype(np.float64) * w
    ref = terms.sum(1) + 0.25
    # a sum that cancels to near 0 keeps f32's error relative to its terms, not to itself
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5,
                               atol=1e-6 * np.abs(terms).sum(1).max())


def test_a_pair_reduction_over_bf16_compares_values_not_bit_patterns():
    """``T.max_argmax`` over bf16 rows on the CPU: the pair's old values are bound before its
    stores, not its results (TVM's bf16 legalisation left a bf16 load cast inside a bound value
    as its integer bits: negative rows then picked their smallest value, NaN won)."""
    import torch

    @tf.kernel
    def best(x: T.Tensor["M", "N", "bf16"]):
        i, j = T.axes("i j")
        return T.max_argmax(x[i, j], over=j)

    x = torch.tensor([[-1.0, -5.0, -2.0, 0.5], [-7.0, -2.0, -9.0, -4.0],
                      [float("nan"), 1.0, float("nan"), 3.0], [-3e38, float("-inf"), -3e38, -1e38]])
    value, index = tf.compile(best, target="llvm")(x=x.bfloat16())
    assert index.tolist() == [3, 1, 3, 3]
    assert value.float().tolist() == x.bfloat16().float()[range(4), [3, 1, 3, 3]].tolist()


def test_a_cast_to_bf16_read_as_float32_rounds():
    """``x − f32(bf16(x))``, the rest a rounding to bf16 leaves, on the CPU: torch's values —
    ties to even, NaN kept, past bf16's largest finite value infinity (TVM's bf16 legalisation
    computes bf16 values in float32 and took the round trip for no cast at all: the rest was 0,
    and a float32 operand stored as bf16 parts lost its low part)."""
    import torch

    @tf.kernel
    def rest(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return x[i] - T.cast(T.cast(x[i], "bf16"), "f32")

    x = torch.cat([torch.randn(1000) * 100, torch.tensor(
        [1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.4e38, -3.4e38, float("nan"), float("inf"), 1e-40])])
    got = tf.compile(rest, target="llvm")(x=x)
    want = x - x.bfloat16().float()
    assert got[:1000].abs().max() > 0
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
