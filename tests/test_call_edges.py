"""Calls at the edges. Empty arguments: where every output is empty (an empty batch, an expert
no token was routed to) the kernel returns them empty and launches nothing, in the arguments'
framework and on their device, into ``out=`` where given, under autograd and
``torch.compile``; where an output is not empty it would be reduced over no elements, and the
call is refused, naming the empty argument and that output. An ``out=`` sharing memory with an
argument (``f(x, w, out=x)``): computed into new outputs and copied, as torch's in-place ops —
written in place, a GEMM's first tiles overwrote rows its other tiles still read."""
import warnings

import numpy as np
import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import CallError
from tests.schedule_templates.realigned_rows_check import softmax_f32


@tf.kernel
def sum_and_max(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    return T.sum(x[i, j], over=j), T.max(x[i, j], over=j)


@pytest.fixture(scope="module")
def cpu_softmax():
    return tf.compile(softmax_f32, "llvm")


@pytest.mark.parametrize("shape", [(0, 64), (5, 0), (0, 0)])
def test_every_output_empty_returns_them_empty(cpu_softmax, shape):
    out = cpu_softmax(torch.randn(*shape))
    assert isinstance(out, torch.Tensor) and out.shape == shape and out.dtype == torch.float32
    got = cpu_softmax(np.zeros(shape, "f4"))
    assert isinstance(got, np.ndarray) and got.shape == shape and got.dtype == np.float32


def test_out_is_given_back_and_several_outputs(cpu_softmax):
    given = torch.full((0, 4), 1.0)
    assert cpu_softmax(torch.zeros(0, 4), out=given) is given
    with pytest.raises(CallError, match="must have shape"):
        cpu_softmax(torch.zeros(0, 4), out=torch.zeros(0, 5))
    total, largest = tf.compile(sum_and_max, "llvm")(torch.zeros(0, 7))
    assert total.shape == largest.shape == (0,)


def test_an_output_over_no_elements_is_refused_by_name():
    made = tf.compile(sum_and_max, "llvm")
    with pytest.raises(CallError, match=r"argument x has an empty dimension 1 .*output out\w* is "
                                        r"not empty: it would be reduced over no elements"):
        made(torch.zeros(6, 0))
    assert made(torch.ones(2, 3))[0].tolist() == [3.0, 3.0]   # the kernel still runs after


def test_attention_with_no_batch_or_no_queries():
    from tensorfuse.kernels.attention import causal_attention

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = tf.compile(causal_attention, "llvm")
    kv = torch.randn(1, 2, 9, 8).bfloat16()
    assert made(kv[:0], kv[:0], kv[:0], 0.3).shape == (0, 2, 9, 8)
    assert made(kv[:, :, :0], kv, kv, 0.3).shape == (1, 2, 0, 8)
    with pytest.raises(CallError, match="empty dimension 2"):   # no keys: a softmax of nothing
        made(kv, kv[:, :, :0], kv[:, :, :0], 0.3)


def test_autograd_and_torch_compile_take_empty_batches(cpu_softmax):
    x = torch.randn(0, 8, requires_grad=True)
    y = cpu_softmax(x)
    assert y.shape == (0, 8) and y.requires_grad
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == (0, 8)
    compiled = torch.compile(lambda t: cpu_softmax(t) * 2, fullgraph=True)
    assert compiled(torch.randn(0, 8)).shape == (0, 8)
    ones = compiled(torch.zeros(2, 4))
    assert torch.allclose(ones, torch.full((2, 4), 0.5))


def test_nothing_launches_for_an_empty_call(cpu_softmax, monkeypatch):
    import tensorfuse.compiled as compiled

    prepared = []   # what each launch's outputs pass through after it
    real = compiled.CompiledKernel._finish
    monkeypatch.setattr(compiled.CompiledKernel, "_finish",
                        staticmethod(lambda *a: prepared.append(1) or real(*a)))
    cpu_softmax(torch.randn(0, 16))
    assert prepared == []
    cpu_softmax(torch.randn(2, 16))
    assert prepared == [1], "the check above watches the launch path"


def test_the_gpu_templates_at_the_edges_in_the_triton_interpreter():
    """Empty calls return empty outputs; calls into an argument match float64 (bf16)."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from tests.helpers import fresh_seed, run_interpreted

    seed = fresh_seed()
    found = run_interpreted("tests.schedule_templates.call_edges_check", seed)
    for name in ("matmul_into_x", "softmax_in_place", "attention_into_q"):
        assert found.pop(name) < 2e-2, f"{name} (TENSORFUSE_SEED={seed})"
    assert found == {
        "softmax": [[[0, 300], "torch.bfloat16"]],
        "cross_entropy": [[[0], "torch.float32"]],
        "attention_no_batch": [[[0, 2, 64, 32], "torch.bfloat16"]],
        "attention_no_queries": [[[1, 2, 0, 32], "torch.bfloat16"]],
        "ffn_no_tokens": [[[0, 64], "torch.bfloat16"]],
        "cumulative_sum": [[[0, 500], "torch.bfloat16"]],
        "group_norm_floor": [[[0, 3, 5, 67], "torch.bfloat16"]],
        "above_mean_held": [[[0], "torch.float32"]]}


@pytest.mark.gpu
def test_call_edges_on_the_gpu():
    from tensorfuse.kernels.attention import causal_attention, gqa_attention
    from tensorfuse.kernels.rows import softmax as bf16_softmax

    x = torch.randn(0, 4096, device="cuda", dtype=torch.bfloat16)
    assert tf.compile(bf16_softmax)(x).shape == (0, 4096)
    q = torch.randn(0, 16, 512, 128, device="cuda", dtype=torch.bfloat16)
    assert tf.compile(causal_attention)(q, q, q, 0.1).shape == (0, 16, 512, 128)
    q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(4, 8, 0, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(CallError, match="reduced over no elements"):
        tf.compile(gqa_attention)(q, kv, kv, 0.1)
    kv = torch.randn(0, 8, 64, 128, device="cuda", dtype=torch.bfloat16)
    out = tf.compile(gqa_attention)(q[:0], kv, kv, 0.1)
    assert out.shape == (0, 32, 1, 128) and out.device.type == "cuda"
    from tensorfuse.kernels.gemm import matmul   # into its own input, on the Hopper GEMM

    x = torch.randn(2048, 1024, device="cuda").bfloat16()
    w = torch.randn(1024, 1024, device="cuda").bfloat16()
    want = x.double() @ w.double()
    assert tf.compile(matmul)(x, w, out=x) is x
    assert (x.double() - want).abs().max() / want.abs().max() < 2e-2


@tf.kernel
def matmul_f32(x: T.Tensor["M", "K", "f32"], w: T.Tensor["K", "N", "f32"]):
    i, k, n = T.axes("i k n")
    return T.sum(x[i, k] * w[k, n], over=k)


@pytest.fixture(scope="module")
def cpu_matmul():
    return tf.compile(matmul_f32, "llvm")


def test_an_out_that_is_an_argument_gets_the_math_as_written(cpu_matmul, cpu_softmax):
    x, w = torch.randn(64, 64), torch.randn(64, 64)
    want = x.double() @ w.double()
    assert cpu_matmul(x, w, out=x) is x
    assert torch.allclose(x.double(), want, rtol=1e-5, atol=1e-4)
    a, b = np.random.default_rng(0).standard_normal((2, 32, 32)).astype("f4")
    want = a.astype("f8") @ b
    assert cpu_matmul(a, b, out=b) is b and np.allclose(b, want, rtol=1e-5, atol=1e-4)
    rows = torch.randn(6, 50)
    want = torch.softmax(rows.double(), -1)
    assert torch.allclose(cpu_softmax(rows, out=rows).double(), want, atol=1e-6)


def test_an_out_overlapping_part_of_an_argument(cpu_matmul):
    buffer = torch.randn(48, 96)
    x, w = buffer[:, :48], torch.randn(48, 48)   # out= the right half: rows share their bytes
    want = x.double() @ w.double()
    out = buffer[:, 48:]
    assert cpu_matmul(x, w, out=out) is out
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-4)


def test_only_overlapping_outs_take_the_copy(cpu_matmul, monkeypatch):
    from tensorfuse.torch_graph import GraphCallable

    copied = []
    real = GraphCallable._into_overlapping
    monkeypatch.setattr(GraphCallable, "_into_overlapping",
                        lambda self, a, k: copied.append(1) or real(self, a, k))
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    cpu_matmul(x, w, out=torch.empty(16, 16))
    cpu_matmul(x[:8], w, out=x[8:])   # the other rows of the same tensor: no bytes shared
    assert copied == []
    cpu_matmul(x, w, out=w)
    assert copied == [1]
    with pytest.raises(CallError, match=r"out= for output out\w* must have shape \(16, 8\)"):
        cpu_matmul(x, w[:, :8], out=x)
