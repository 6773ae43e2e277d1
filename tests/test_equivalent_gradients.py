"""The gradient of attention written another way — the softmax's weights then their sum (rounded
to bf16 or not), weights in base two, a maximum guarded for rows without keys — planned from the
forward as ``tf.compile`` reads it (:func:`tensorfuse.read_other_ways.equivalent_program`): the
attention backward template, nothing of B·H·M·N stored (the floor's stages stored 4 GiB of
scores at B2 H16 S4096), through ``tf.grad`` and through autograd on a compiled kernel; the
equivalent program's gradients the program's against float64 on the CPU target, and on the GPU
(marked)."""
import warnings

import pytest
import torch

import tensorfuse as tf
from tensorfuse.attention_gradient import AttentionGradientKernel
from tensorfuse.dsl.program import ProgramKernel
from tensorfuse.read_other_ways import equivalent_program
from tests.helpers import fresh_seed, relative_error
from tests.schedule_templates.test_normalised_sums import softmax_then_sum
from tests.schedule_templates.user_written_forms_check import (base_two_attention,
                                                               padded_guarded_attention,
                                                               rounded_weights_attention)

HOPPER = "cuda:sm_90a"
SIZES = dict(B=2, H=16, S=4096, D=128)
FORMS = [(softmax_then_sum, dict(B=2, H=16, M=4096, N=4096, D=128)),
         (rounded_weights_attention, SIZES), (base_two_attention, SIZES),
         (padded_guarded_attention, SIZES)]


@pytest.mark.parametrize("kernel, sizes", FORMS, ids=[k.program.name for k, _ in FORMS])
def test_the_gradient_of_attention_written_another_way_runs_the_backward_template(kernel,
                                                                                 sizes):
    made = tf.compile(tf.grad(kernel), HOPPER)
    assert isinstance(made, AttentionGradientKernel), made
    assert made.schedule_origin(**sizes).startswith(
        "attention backward template (HopperAttentionBackward)"), made.schedule_origin(**sizes)


@pytest.mark.parametrize("kernel", [k for k, _ in FORMS], ids=lambda k: k.program.name)
def test_autograd_of_attention_written_another_way_saves_the_log_sum_exp(kernel):
    """A compiled kernel's training operator: the equivalent forward with each row's
    log-sum-exp as a second output (what the backward template reads)."""
    from tensorfuse.autograd import Differentiation

    differentiation = Differentiation(tf.compile(kernel, HOPPER))
    assert differentiation.training_op(f"tensorfuse::equivalent_{kernel.program.name}",
                                       "cuda") is not None
    assert [c.name for c in differentiation.saving.outputs][-1] == "lse"
    rewritten = equivalent_program(kernel.program) is not kernel.program
    assert (differentiation.attention_program is not kernel.program) == rewritten


def _causal_inputs(generator, S=33, D=16):
    q, k, v = (torch.randn(1, 2, S, D, generator=generator, dtype=torch.float64)
               for _ in range(3))
    return q, k, v, torch.randn(1, 2, S, D, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("kernel", [rounded_weights_attention, base_two_attention],
                         ids=lambda k: k.program.name)
def test_the_equivalent_programs_gradients_are_the_programs_on_the_cpu(kernel):
    """The premise: the program ``tf.compile`` reads for the gradient has the gradients of the
    one written, each within bf16's rounding of float64 autograd. (The rewritten program's
    gradient, a bf16 cast of weights whose exp binds its steps, failed to build on the CPU:
    the cast read its argument three times, its bindings defined thrice.)"""
    seed = fresh_seed()
    q, k, v, weights = _causal_inputs(torch.Generator().manual_seed(seed))
    S = q.shape[-2]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    s = (leaves[0] @ leaves[1].transpose(-1, -2) * 0.2).masked_fill(
        ~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    ((torch.softmax(s, -1) @ leaves[2]) * weights).sum().backward()
    want = [t.grad for t in leaves]
    equivalent = ProgramKernel(equivalent_program(kernel.program))
    assert equivalent.program is not kernel.program
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for made in (kernel, equivalent):
            gradient = tf.compile(tf.grad(made), "llvm")
            got = gradient(*(t.bfloat16() for t in (q, k, v)), 0.2, weights.bfloat16())
            for g, w in zip(got, want):
                assert relative_error(g, w) < 2e-2, (made.program.name, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [rounded_weights_attention, base_two_attention],
                         ids=lambda k: k.program.name)
def test_autograd_of_attention_written_another_way_matches_float64_on_the_gpu(kernel):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    generator = torch.Generator().manual_seed(fresh_seed())
    q, k, v, weights = (t.cuda() for t in _causal_inputs(generator, S=300, D=64))
    S = q.shape[-2]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    s = (leaves[0] @ leaves[1].transpose(-1, -2) * 0.2).masked_fill(
        ~torch.ones(S, S, dtype=torch.bool, device="cuda").tril(), float("-inf"))
    ((torch.softmax(s, -1) @ leaves[2]) * weights).sum().backward()
    want = [t.grad for t in leaves]
    made = tf.compile(kernel)
    for _ in range(2):
        inputs = [t.bfloat16().requires_grad_() for t in (q, k, v)]
        (made(*inputs, 0.2).double() * weights).sum().backward()
        for x, w in zip(inputs, want):
            assert relative_error(x.grad, w) < 3e-2, kernel.program.name
