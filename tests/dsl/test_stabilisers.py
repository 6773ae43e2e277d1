"""Maxima that only stabilise a program (``tensorfuse.dsl.stabilisers``): found where the outputs
are unchanged when the maximum moves — softmax, log-softmax, cross-entropy, attention, a scaled
or masked softmax — and not where they change (an unnormalised exponential, a comparison with the
maximum, a sum across the maximum's axis, unmatched scales, the maximum returned). Their
backward sends no adjoint through the maximum: no tie count, one fused sweep; the gradients
still match PyTorch's in float64 with many ties, and a gathered read's partial gradient is added
into the plain read's (cross-entropy: one output)."""
import numpy as np
import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.dsl.stabilisers import stabilising_maxima

X = T.Tensor["M", "N", "f64"]


@tf.kernel
def scaled_softmax(x: X, scale: T.f64):
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    p = T.exp((x[i, j] - m) * scale)
    return p / T.sum(p, over=j)


@tf.kernel
def shifted_inside(x: X, scale: T.f64):
    """``exp(x·scale − m)``: ``m`` is not the maximum of the exponent, and still cancels."""
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    p = T.exp(x[i, j] * scale - m)
    return p / T.sum(p, over=j)


@tf.kernel
def masked_softmax(x: X, keep: T.Tensor["M", "N", "bool"]):
    i, j = T.axes("i j")
    s = T.where(keep[i, j], x[i, j], -T.inf)
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return p / T.sum(p, over=j)


def _over_row_max(name: str, outputs):
    """A kernel of ``x`` returning ``outputs(x, i, j, m)``, ``m`` the maximum of each row."""
    def kernel(x: X):
        i, j = T.axes("i j")
        return outputs(x, i, j, T.max(x[i, j], over=j))
    kernel.__name__ = kernel.__qualname__ = name
    return tf.kernel(kernel)


def _softmax_of(x, i, j, m):
    p = T.exp(x[i, j] - m)
    return p / T.sum(p, over=j)


# the outputs change when m moves: an unnormalised exponential, a comparison with m, terms that
# move by their own row's amount summed down the columns, a bounded function of x - m, m itself
unnormalised = _over_row_max("unnormalised", lambda x, i, j, m: T.exp(x[i, j] - m))
tied_to_max = _over_row_max("tied_to_max", lambda x, i, j, m: T.where(
    x[i, j] == m, T.exp(x[i, j] - m), 0.0) / T.sum(T.exp(x[i, j] - m), over=j))
across_rows = _over_row_max("across_rows",
                            lambda x, i, j, m: T.sum(T.exp(x[i, j] - m), over=i))
bounded = _over_row_max("bounded", lambda x, i, j, m: T.tanh(x[i, j] - m))
max_and_softmax = _over_row_max("max_and_softmax",
                                lambda x, i, j, m: (_softmax_of(x, i, j, m), m))


@tf.kernel
def mismatched_scales(x: X, scale: T.f64):
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    return T.exp((x[i, j] - m) * scale) / T.sum(T.exp(x[i, j] - m), over=j)


@pytest.mark.parametrize("kernel", [K.softmax, K.log_softmax, K.cross_entropy,
                                    K.causal_attention, K.gqa_attention, scaled_softmax,
                                    shifted_inside, masked_softmax], ids=lambda k: k.name)
def test_a_maximum_that_cancels_is_found(kernel):
    assert stabilising_maxima(kernel.program) == {"m"}


@pytest.mark.parametrize("kernel", [unnormalised, tied_to_max, across_rows, mismatched_scales,
                                    bounded, max_and_softmax, K.layernorm],
                         ids=lambda k: k.name)
def test_a_maximum_the_outputs_depend_on_is_not(kernel):
    maxima = [c for c in kernel.program.computes if c.is_reduction and c.monoid.name == "max"]
    assert maxima or kernel is K.layernorm   # a maximum there, and not found to stabilise
    assert stabilising_maxima(kernel.program) == set()


@pytest.mark.parametrize("kernel", [K.softmax, K.log_softmax, K.cross_entropy],
                         ids=lambda k: k.name)
def test_their_backward_is_one_row_kernel_without_a_tie_count(kernel):
    """On sm_90a the backward is the row template alone (it was two or three kernels with the
    ties counted in a pass of their own); cross-entropy's gathered term is added into the
    plain one: one gradient output."""
    backward = tf.grad(kernel)
    assert not any(c.name.startswith("ties") for c in backward.program.computes)
    assert len(backward.outputs) == 1
    compiled = tf.compile(backward, target="cuda:sm_90a")
    sizes = {n: 64 * (k + 1) for k, n in enumerate(compiled.program.dim_names())}
    assert compiled.schedule_origin(**sizes).startswith("template defaults")


@pytest.mark.parametrize("kernel", [K.softmax, K.log_softmax, K.cross_entropy],
                         ids=lambda k: k.name)
def test_gradients_with_tied_maxima_match_torch_float64(kernel, rng):
    """Rows with several exact maxima (integers, exact in bf16), large ranges and a ragged
    width: the bf16 backward without the maximum's adjoint against torch's float64 autograd of
    the same values and incoming gradient."""
    M, N = 6, 37
    x = np.round(rng.uniform(-4, 4, (M, N))) * rng.choice([1.0, 30.0], (M, 1))
    x[:, :3] = x.max(axis=1, keepdims=True)   # at least three ties per row
    xt = torch.tensor(x, requires_grad=True)
    ce = kernel is K.cross_entropy
    target = torch.tensor(rng.integers(0, N, M), dtype=torch.int32)
    out = torch.nn.functional.cross_entropy(xt, target.long(), reduction="none") if ce else \
        (torch.softmax if kernel is K.softmax else torch.log_softmax)(xt, -1)
    d_out = torch.tensor(rng.standard_normal(out.shape)).to(torch.float32 if ce else
                                                            torch.bfloat16)
    out.backward(d_out.double())
    compiled = tf.compile(tf.grad(kernel), target="llvm")
    got = compiled(xt.detach().bfloat16(), *([target] if ce else []), d_out)
    error = (got.double() - xt.grad).norm() / xt.grad.norm()
    assert error < 2e-2, f"relative error {error:.1e} (bf16)"


def test_scaled_softmax_gradient_in_float64(rng):
    """A scalar inside the exponent keeps the maximum a stabiliser: gradcheck through autograd."""
    f = tf.compile(scaled_softmax, target="llvm")
    x = torch.tensor(rng.standard_normal((3, 11)) * 4, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: f(t, scale=0.7), (x,))


def test_the_fused_backward_runs_correctly_in_the_triton_interpreter():
    """The one-kernel backward of each, as generated for sm_90a, against float64 (bf16: 2e-2;
    a product's over float32 rows, zeros among the terms: 1e-5)."""
    from tests.helpers import fresh_seed, run_interpreted

    pytest.importorskip("triton", reason="the row template generates Triton kernels")
    seed = fresh_seed()
    errors = run_interpreted("tests.dsl.row_backward_check", seed)
    assert set(errors) == {"softmax", "log_softmax", "cross_entropy", "softmax_saved",
                           "log_softmax_saved", "survival"}
    for name, error in errors.items():   # the product's rows are float32
        assert error < (1e-5 if name == "survival" else 2e-2), \
            f"{name}: relative error {error:.1e} (TENSORFUSE_SEED={seed})"
