"""Tensors named like a generated Triton kernel's own variables (``targets/triton/shadowing.py``):
refused with the name and what to do, where they had failed inside Triton (a pointer overwritten
by a block offset, ``tl`` by a tensor) — and ``tf.compile`` then runs another schedule, saying
why; names the kernels do not use pass."""
import warnings

import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import TargetError
from tensorfuse.targets.triton.shadowing import check_arguments_unshadowed, shadowed_arguments


def scaled_softmax(name: str):
    """A softmax of tensor ``name``'s rows, scaled by a weight per column."""
    source = f'''
@tf.kernel
def scaled_softmax({name}: T.Tensor["M", "N", "f32"], w: T.Tensor["N", "f32"]):
    i, j = T.axes("i j")
    m = T.max({name}[i, j], over=j)
    e = T.exp({name}[i, j] - m)
    return e / T.sum(e, over=j) * w[j]
'''
    scope = dict(tf=tf, T=T)
    exec(source, scope)
    return scope["scaled_softmax"]


SOURCE = '''import triton
import triton.language as tl

def helper(a):
    seen = a
    return seen

@triton.jit
def kernel(x, lo, helper, n, out, BLOCK: tl.constexpr):
    n = n // 16 * 16
    offs = tl.arange(0, BLOCK)
    lo = offs * 2
    tl.store(out + offs, tl.load(x + lo), mask=offs < n)
'''


def test_arguments_a_kernel_replaces_or_a_module_name_are_found():
    """``lo`` assigned in the kernel, ``helper`` a module-level function; a helper's own
    variable (``seen``) is its own scope, and a size rounded to its divisor (``n = n // 16 *
    16``) keeps its meaning."""
    assert shadowed_arguments(SOURCE) == {"kernel": ["helper", "lo"]}
    assert shadowed_arguments(SOURCE.replace("x, lo, helper", "x, y, z")) == {}


@pytest.mark.parametrize("name", ["seen", "offs_m", "tl", "BLOCK_M", "ref_m"])
def test_a_tensor_named_like_the_row_templates_variables_is_refused_with_its_name(name):
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    template = tf.compile(scaled_softmax(name), target="cuda:sm_90a").template
    with pytest.raises(TargetError, match=f"'{name}'.*rename it"):
        template.compiled(M=64, N=300)


def test_tf_compile_says_why_the_template_passed_over_such_a_name():
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    made = tf.compile(scaled_softmax("seen"), target="cuda:sm_90a")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        origin = made.schedule_origin(M=64, N=300)
    assert "'seen': a tensor or scalar of this kernel has the name of a variable" in origin, origin


def test_other_names_pass_and_compute_the_softmax_in_the_interpreter():
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from tests.helpers import run_interpreted

    assert run_interpreted("tests.targets.test_shadowed_names") < 1e-5


def _interpreted_error() -> float:
    """Under TRITON_INTERPRET=1: the template's kernel for a tensor named ``logits``, against
    float64."""
    template = tf.compile(scaled_softmax("logits"), target="cuda:sm_90a").template
    check_arguments_unshadowed(template.source(M=37, N=300))
    x, w = torch.randn(37, 300) * 3, torch.rand(300)
    got = template(logits=x, w=w)
    want = torch.softmax(x.double(), -1) * w.double()
    return float((got.double() - want).abs().max())


if __name__ == "__main__":
    import json

    print(json.dumps(_interpreted_error()))
