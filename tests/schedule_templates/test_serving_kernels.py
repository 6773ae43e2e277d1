"""Kernels of inference serving (``benchmarks.serving_kernels``): attention over a packed QKV
tensor, speculative decoding's draft tokens, rotary embeddings inside attention, a residual add
with RMSNorm, int8 quantisation by the rows' largest magnitude — their numbers against float64
in Triton's interpreter and on the GPU (cases: :mod:`.serving_kernels_check`); and ``T.round``
itself, halves to even, on every target."""
import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tests.helpers import check_interpreted, gpu_case, relative_error
from tests.schedule_templates.serving_kernels_check import CASES


def test_serving_kernels_match_float64_in_the_triton_interpreter():
    check_interpreted("tests.schedule_templates.serving_kernels_check", CASES)


@tf.kernel
def _rounded_scaled(x: T.Tensor["M", "K", "f32"]):
    """A row's values over its largest magnitude, rounded: halves and values near them."""
    i, k = T.axes("i k")
    return T.round(x[i, k] * 4.0 / T.max(T.abs(x[i, k]), over=k))


def _halves() -> torch.Tensor:
    """Rows whose largest magnitude is 4, so that x·4/4 is x: halves of both parities and signs,
    their neighbours, and integers past 2**23 (whose halves do not exist)."""
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -4.0],
                      [2.4999998, 2.5000002, -3.4999998, 0.49999997, 4.0, 1.0, -0.0, 0.0]])
    return x


@pytest.mark.parametrize("where", ["interpreter", "llvm"])
def test_round_takes_halves_to_even_as_torch_does(where):
    x = _halves()
    if where == "interpreter":
        pytest.importorskip("triton", reason="the templates generate Triton kernels")
        from tests.helpers import run_interpreted
        got = torch.tensor(run_interpreted("tests.schedule_templates.serving_kernels_check",
                                           "round"))
    else:
        got = torch.as_tensor(tf.compile(_rounded_scaled, target="llvm")(x))
    assert torch.equal(got, torch.round(x)), (got, torch.round(x))


@tf.kernel
def _powers(x: T.Tensor["M", "K", "f32"], y: T.Tensor["M", "K", "f32"]):
    """Each base to each exponent, beside a row sum that puts the program on the row template."""
    i, k = T.axes("i k")
    return x[i, k] ** y[i, k] + 0.0 * T.sum(x[i, k], over=k)


def _bases_and_exponents() -> tuple[torch.Tensor, torch.Tensor]:
    """Every pair of negative, zero and positive bases and whole, odd, even, negative and
    fractional exponents (a negative base to a fractional power is NaN)."""
    bases = torch.tensor([-3.0, -2.0, -0.5, 0.0, 0.5, 2.0, 3.0])
    exponents = torch.tensor([0.0, 1.0, 2.0, 3.0, -1.0, -2.0, 0.5, 2.5])
    x, y = torch.meshgrid(bases, exponents, indexing="ij")
    return x.contiguous(), y.contiguous()


def test_pow_in_the_interpreter_takes_libdevice_values():
    """``a ** b`` under Triton's interpreter (libdevice's pow gives None there) through the
    written helper: the signs of negative bases by the exponent's parity, NaN for fractional
    powers of them, 1 for a zero exponent, ±inf and 0 for zero bases — torch.pow's values."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from tests.helpers import run_interpreted

    x, y = _bases_and_exponents()
    got = torch.tensor(run_interpreted("tests.schedule_templates.serving_kernels_check", "pow"))
    torch.testing.assert_close(got, torch.pow(x, y), rtol=1e-6, atol=0, equal_nan=True)


def test_every_generated_module_that_rounds_gets_the_helper_once():
    """``_rint`` is written into any whole generated module that calls it — the row template's
    and the attention backward's, which assembles its own — once, after the imports."""
    from tensorfuse.targets.triton.expr import HELPERS, with_called_helpers

    module = ("import triton\nimport triton.language as tl\n" + HELPERS +
              "\n@triton.jit\ndef k(x):\n    return _rint(x)\n")
    made = with_called_helpers(module)
    assert made.count("def _rint(") == 1 and made.index("def _rint(") < made.index("def k(")
    compile(made, "<generated>", "exec")
    assert with_called_helpers(made) == made
    assert with_called_helpers(module.replace("_rint(x)", "x")) == module.replace("_rint(x)", "x")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_serving_kernels_match_float64_on_the_gpu(name):
    kernel, case = CASES[name]
    args, want, seed = gpu_case(case)
    got = tf.compile(kernel)(**args)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    for g, w in zip(gots, wants):
        assert relative_error(g, w.cuda()) < 2e-2, seed
