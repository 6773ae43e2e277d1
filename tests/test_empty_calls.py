"""Calls with empty arguments: where every output is empty (an empty batch, an expert no token
was routed to) the kernel returns them empty and launches nothing, in the arguments' framework
and on their device, into ``out=`` where given, under autograd and ``torch.compile``; where an
output is not empty it would be reduced over no elements, and the call is refused, naming the
empty argument and that output."""
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


def test_the_gpu_templates_return_empty_outputs_in_the_triton_interpreter():
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from tests.helpers import run_interpreted

    shapes = run_interpreted("tests.schedule_templates.empty_calls_check")
    assert shapes == {
        "softmax": [[[0, 300], "torch.bfloat16"]],
        "cross_entropy": [[[0], "torch.float32"]],
        "attention_no_batch": [[[0, 2, 64, 32], "torch.bfloat16"]],
        "attention_no_queries": [[[1, 2, 0, 32], "torch.bfloat16"]],
        "ffn_no_tokens": [[[0, 64], "torch.bfloat16"]],
        "cumulative_sum": [[[0, 500], "torch.bfloat16"]],
        "group_norm_floor": [[[0, 3, 5, 67], "torch.bfloat16"]],
        "above_mean_held": [[[0], "torch.float32"]]}


@pytest.mark.gpu
def test_empty_calls_on_the_gpu():
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
    out = tf.compile(gqa_attention)(q[:0], kv[:0, :, :0].expand(0, 8, 64, 128).contiguous(),
                                    kv[:0, :, :0].expand(0, 8, 64, 128).contiguous(), 0.1)
    assert out.shape == (0, 32, 1, 128) and out.device.type == "cuda"
