"""Tensors of 8-bit integers (``i8``: quantised weights, ``u8``: image bytes): arithmetic on them
in i32, a product with a float in f32, on the CPU target against float64/int64 references; the
GEMM of an ``i8`` weight and a ``bf16`` activation (``benchmarks.pipeline_kernels``) on the
contraction template for sm_90a (its bytes given to the tensor cores as bf16, exactly). The interpreter's numbers:
:mod:`tests.schedule_templates.unlisted_check`."""
import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.dsl import dtypes as dt
from benchmarks.pipeline_kernels import w8a16_linear
from tensorfuse.errors import DSLError
from tests.helpers import fresh_seed, relative_error


@tf.kernel
def pixel_means(img: T.Tensor["B", "C", "P", "u8"]):
    """Each channel's mean intensity of images stored as bytes, scaled to [0, 1]."""
    b, c, p = T.axes("b c p")
    return T.mean(img[b, c, p] / 255.0, over=p)


@tf.kernel
def byte_sums(x: T.Tensor["M", "N", "i8"]):
    i, n = T.axes("i n")
    return T.sum(x[i, n], over=n)


@tf.kernel
def byte_dots(x: T.Tensor["M", "N", "i8"], y: T.Tensor["M", "N", "i8"]):
    """Each row's dot product of two byte vectors: products up to 2¹⁴, past int8."""
    i, n = T.axes("i n")
    return T.sum(x[i, n] * y[i, n], over=n)


@tf.kernel
def byte_column_argmax(x: T.Tensor["M", "N", "i8"]):
    """Where each column's largest byte is (the first, on ties)."""
    i, n = T.axes("i n")
    return T.argmax(x[i, n], over=i)


def test_the_types_and_their_arithmetic():
    assert dt.canonical("int8") == "i8" and dt.canonical("uint8") == "u8"
    assert dt.from_any(torch.int8) == "i8" and dt.from_any(torch.uint8) == "u8"
    assert dt.compute_dtype("i8") == dt.compute_dtype("u8") == "i32"
    assert dt.promote(dt.compute_dtype("i8"), dt.compute_dtype("bf16")) == "f32"
    with pytest.raises(DSLError, match="i8, u8"):
        T.Tensor["N", "i4"]


def test_byte_tensors_on_the_cpu_against_float64():
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-128, 128, (64, 300), generator=g, dtype=torch.int8)
    s, x = torch.rand(64, generator=g), (torch.randn(5, 300, generator=g) * 4).bfloat16()
    out = tf.compile(w8a16_linear, target="llvm")(w, s, x)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, (x.double() @ w.double().T) * s.double()) < 2e-2, seed
    img = torch.randint(0, 256, (2, 3, 1000), generator=g, dtype=torch.uint8)
    means = tf.compile(pixel_means, target="llvm")(img)
    assert relative_error(means, (img.double() / 255).mean(-1)) < 1e-6, seed
    x8 = torch.randint(-128, 128, (7, 1000), generator=g, dtype=torch.int8)
    sums = tf.compile(byte_sums, target="llvm")(x8)
    assert sums.dtype == torch.int32 and torch.equal(sums.long(), x8.long().sum(-1)), seed


def test_an_int8_weight_gemm_runs_on_the_tensor_cores_for_sm90a():
    """At a GEMM's sizes (and a GEMV's: a batch of 4) the contraction template takes it — the
    row template it fell to otherwise read each output's weights row again per batch row, on the
    CUDA cores; at the GEMM's, wgmma on bf16 tiles converted from the bytes."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    made = tf.compile(w8a16_linear, target="cuda:sm_90a")
    for dims in (dict(B=4096, N=8192, K=8192), dict(B=4, N=8192, K=8192)):
        plan = made.describe_plan(**dims)
        assert "contraction template" in plan.splitlines()[0], plan
        assert "cols side's bytes converted to bf16 (exactly)" in plan, plan
    assert "wgmma" in made.ptx(B=4096, N=8192, K=8192)
