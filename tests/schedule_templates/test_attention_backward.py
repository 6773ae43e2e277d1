"""The attention backward template (issue 22): its plan read off the forward's, its refusals, its
kernels run in Triton's interpreter against the backward program, their code for sm_90a, and
autograd choosing it on a GPU."""
import json
import os
import secrets
import subprocess
import sys

import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.errors import TargetError
from tensorfuse.schedule_templates.attention_backward import (BackwardKnobs,
                                                              plan_attention_backward)
from tensorfuse.schedule_templates.auto import choose
from tensorfuse.targets import get_target
from tensorfuse.targets.triton.attention_backward import AttentionBackwardKernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
DIMS = dict(B=2, H=16, M=1024, N=1024, D=128)


def _plan(kernel, dims=DIMS):
    _, fusion = choose(kernel.program, get_target("cuda:sm_90a"))
    return plan_attention_backward(kernel.program, fusion, dims)


def test_the_plan_reads_the_score_and_its_derivative_off_the_forward():
    plan = _plan(K.softcap_attention)
    assert (plan.q.param.name, plan.k.param.name, plan.v.param.name) == ("q", "k", "v")
    assert plan.group == 1 and plan.head_dim == 128 and plan.empty is None
    text = repr(plan.d_score)
    assert "tanh" in text and "__ds" in text and "scale" in text   # cap·tanh(s/cap)' · scale
    grouped = _plan(K.gqa_causal_attention, dict(B=2, H=32, HKV=8, M=1024, N=1024, D=128))
    assert grouped.group == 4 and grouped.head.name == "h" and grouped.mask is not None


def test_what_the_template_cannot_differentiate_is_refused_with_the_reason():
    @tf.kernel
    def learned_bias(q: T.Tensor["B", "H", "M", "D", "bf16"],
                     k: T.Tensor["B", "H", "N", "D", "bf16"],
                     v: T.Tensor["B", "H", "N", "D", "bf16"],
                     table: T.Tensor["H", "R", "f32"], scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale + table[h, i - j + 1023]
        m = T.max(s, over=j)
        p = T.exp(s - m)
        return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)

    with pytest.raises(TargetError, match="reads table.*scatter"):
        _plan(learned_bias, dict(DIMS, R=2047))
    with pytest.raises(TargetError, match="powers of two from 16 to 128.*not 96"):
        _plan(K.causal_attention, dict(DIMS, D=96))


def test_interpreted_kernels_match_the_backward_program():
    seed = int(os.environ.get("TENSORFUSE_SEED", secrets.randbits(32)))
    proc = subprocess.run([sys.executable, "-m",
                           "tests.schedule_templates.attention_backward_check", str(seed)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900,
                          env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(errors) == {"full", "causal", "causal_softcap", "mask_tensor",
                           "causal_whole_tiles"}
    for name, err in errors.items():   # float32, against the backward program on the CPU
        assert err <= 1e-5, f"{name}: {err:.1e} (TENSORFUSE_SEED={seed})"


def test_the_kernels_compile_for_sm90a_on_the_tensor_cores():
    """Offline (no GPU): all three kernels of a bf16 causal attention at D=128 use wgmma, and
    fit the H100's shared memory."""
    made = AttentionBackwardKernels(_plan(K.causal_attention), BackwardKnobs()).compiled(
        get_target("cuda:sm_90a"))
    assert len(made) == 3
    for kernel in made:
        assert "wgmma.mma_async" in kernel.asm["ptx"]
        assert kernel.metadata.shared <= 227 * 1024


@pytest.mark.gpu
def test_autograd_runs_the_template_on_the_gpu():
    torch.manual_seed(0)
    f = tf.compile(K.causal_attention)
    q, k, v = (torch.randn(1, 2, 150, 64, device="cuda").bfloat16().requires_grad_()
               for _ in range(3))
    out = f(q, k, v, scale=0.125)
    seed = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), seed)
    assert f.torch_op is not None
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(
        *exact, is_causal=True, scale=0.125), exact, seed.double())
    for g, w in zip(got, want):
        assert float((g.double() - w).norm() / w.norm()) < 2e-2
    from tensorfuse.autograd import _TEMPLATES   # the template ran, not the program

    used = f.torch_op.differentiation.templates
    assert [type(_TEMPLATES[key]) for key in used.values()] == [AttentionBackwardKernels]


@pytest.mark.gpu
def test_torch_compile_traces_the_template_backward():
    """AOT autograd traces the backward with fake tensors: the template runs behind its own
    operator, and the compiled graph's gradients are the eager ones."""
    torch.manual_seed(0)
    f = tf.compile(K.causal_attention)
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda").bfloat16().requires_grad_()
               for _ in range(3))

    def loss(q, k, v):
        return f(q, k, v, scale=0.125).float().square().sum()

    eager = torch.autograd.grad(loss(q, k, v), (q, k, v))
    graphed = torch.autograd.grad(torch.compile(loss, fullgraph=True)(q, k, v), (q, k, v))
    for a, b in zip(graphed, eager):
        torch.testing.assert_close(a, b)


def test_the_template_operator_gives_shapes_to_fake_tensors():
    """What AOT autograd sees of the template while it traces a graph's backward."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tensorfuse.autograd import _template_backward_op

    with FakeTensorMode():
        q, kv = torch.empty(2, 8, 33, 64), torch.empty(2, 4, 40, 64)
        grads = _template_backward_op()(0, q, kv, kv, q, q, [], [], [0.125])
    assert [tuple(g.shape) for g in grads] == [(2, 8, 33, 64), (2, 4, 40, 64), (2, 4, 40, 64)]
