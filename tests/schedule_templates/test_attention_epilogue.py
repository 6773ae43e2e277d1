"""Attention whose output is a function of ``o / l`` (a sigmoid gate, a residual; or of several
chains' — differential attention's two softmaxes) as stages — each attention with ``o / l`` as
its output, then the function — so that the Hopper template takes the attention (:mod:`tensorfuse.schedule_templates.attention_epilogue`): the stages and
their results against float64 on the CPU, the sm_90a plan, and the H200 run marked ``gpu``."""
import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.dsl.program import ProgramKernel
from tensorfuse.schedule_templates.attention_epilogue import attention_epilogue_stages
from tensorfuse.staged import StagedKernel
from benchmarks.pipeline_kernels import gated_attention
from benchmarks.variant_kernels import diff_attention, diff_reference
from tests.helpers import fresh_seed, poisoned_call, relative_error



def _stages(kernel):
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target

    _, fusion = choose(kernel.program, get_target("cuda:sm_90a"))
    return attention_epilogue_stages(kernel.program, fusion.names)


@tf.kernel
def output_reads_the_maximum(q: T.Tensor["B", "H", "S", "D", "f32"],
                             k: T.Tensor["B", "H", "S", "D", "f32"],
                             v: T.Tensor["B", "H", "S", "D", "f32"]):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d)
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j) + m


def _reference(q, k, v, gate, scale):
    s = q.double() @ k.double().transpose(-1, -2) * scale
    S = s.shape[-1]
    s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    return (torch.softmax(s, -1) @ v.double()) * torch.sigmoid(gate.double())


def test_the_gate_is_a_stage_after_the_attention():
    first, second = _stages(gated_attention)
    assert [c.name for c in first.program.outputs] == ["attention"]
    assert first.program.outputs[0].dtypes == ("f32",)
    assert [p.name for p in second.program.params] == ["gate", "attention"]
    assert second.produces == ("out",) and not any(c.is_reduction
                                                   for c in second.program.computes)
    # nothing to split: plain attention, or an output that reads a state besides o / l
    assert _stages(K.causal_attention) == ()
    assert _stages(output_reads_the_maximum) == ()


def test_the_stages_match_float64_on_the_cpu():
    stages = _stages(gated_attention)
    llvm = tf.get_target("llvm")
    made = StagedKernel(gated_attention.program, llvm, stages,
                        tuple(tf.compile(ProgramKernel(s.program), "llvm") for s in stages), "")
    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v, gate = ((torch.randn(2, 3, 37, 16, generator=g) * 3).bfloat16() for _ in range(4))
    out = made(q, k, v, gate, 0.25)
    assert relative_error(out, _reference(q, k, v, gate, 0.25)) < 1e-2


def test_the_hopper_template_takes_the_attention_stage():
    made = tf.compile(gated_attention, "cuda:sm_90a")
    plan = made.describe_plan(B=2, H=16, S=4096, D=128)
    assert plan.splitlines()[0].endswith("2 stage kernels (the Hopper attention, then the "
                                         "function of its output): attention from q, k, v, "
                                         "scale; out from gate, attention"), plan
    assert "hopper_attention (rolling_update(m, o_sum, o_sum_2" in plan


@pytest.mark.gpu
def test_gated_attention_matches_float64_on_the_gpu():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    g = torch.Generator().manual_seed(fresh_seed())
    B, H, S, D = 2, 4, 777, 128
    q, k, v, gate = ((torch.randn(B, H, S, D, generator=g) * 2).bfloat16() for _ in range(4))
    made = tf.compile(gated_attention)
    assert made.schedule_origin(B=B, H=H, S=S, D=D, scale=0.1).startswith("staged: 2 kernels")
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    made(*(t.cuda() for t in (q, k, v, gate)), 0.1, out=out)
    assert relative_error(out, _reference(q, k, v, gate, 0.1)) < 2e-2


def test_each_chain_of_differential_attention_is_a_stage():
    """Two softmax chains over one value cache: a stage each (its own q, k and the shared v; its
    o / l in float32), then their difference, elementwise."""
    first, second, last = _stages(diff_attention)
    assert (first.produces, second.produces, last.produces) == (
        ("attention",), ("attention_1",), ("out",))
    assert first.inputs == ("q1", "k1", "v", "scale") and \
        second.inputs == ("q2", "k2", "v", "scale")
    assert set(first.reduces) == {"p1_max", "o1_sum", "o1_sum_2"}
    assert last.inputs == ("lam", "attention", "attention_1")
    assert all(s.program.outputs[0].dtypes == ("f32",) for s in (first, second))
    made = tf.compile(diff_attention, "cuda:sm_90a")
    plan = made.describe_plan(B=2, H=16, S=4096, D=64, E=128)
    assert plan.splitlines()[0].endswith(
        "3 stage kernels (the Hopper attention of each of 2 chains, then the function of their "
        "outputs): attention from q1, k1, v, scale; attention_1 from q2, k2, v, scale; out from "
        "lam, attention, attention_1"), plan
    assert plan.count("hopper attention plan:") == 2
    # a decode's few rows: the Triton template takes the program whole
    assert made.schedule_origin(B=2, H=16, S=64, D=64, E=128) == "template defaults"


def test_differential_attention_stages_match_float64_on_the_cpu():
    stages = _stages(diff_attention)
    made = StagedKernel(diff_attention.program, tf.get_target("llvm"), stages,
                        tuple(tf.compile(ProgramKernel(s.program), "llvm") for s in stages), "")
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    q1, k1, q2, k2 = ((torch.randn(2, 3, 37, 16, generator=g) * 3).bfloat16() for _ in range(4))
    v = (torch.randn(2, 3, 37, 24, generator=g) * 3).bfloat16()
    want = diff_reference(q1, k1, q2, k2, v, 0.6, 0.25, torch.arange(37))
    (out,) = poisoned_call(made, diff_attention.program,
                           dict(q1=q1, k1=k1, q2=q2, k2=k2, v=v, lam=0.6, scale=0.25), want)
    assert relative_error(out, want) < 1e-2, seed


@pytest.mark.gpu
def test_differential_attention_matches_float64_on_the_gpu():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    B, H, S, D, E = 2, 4, 777, 64, 128
    q1, k1, q2, k2 = ((torch.randn(B, H, S, D, generator=g) * 2).bfloat16() for _ in range(4))
    v = (torch.randn(B, H, S, E, generator=g) * 2).bfloat16()
    made = tf.compile(diff_attention)
    assert made.schedule_origin(B=B, H=H, S=S, D=D, E=E).startswith("staged: 3 kernels")
    want = diff_reference(q1, k1, q2, k2, v, 0.6, 0.125, torch.arange(S))
    tensors = dict(q1=q1, k1=k1, q2=q2, k2=k2, v=v)
    (out,) = poisoned_call(made, diff_attention.program, {
        **{n: t.cuda() for n, t in tensors.items()}, "lam": 0.6, "scale": 0.125}, want)
    assert relative_error(out, want) < 2e-2, seed


def test_a_gated_attention_called_in_another_axis_order_is_planned_in_it():
    """Tensors whose memory holds the head dim outside the tokens route the call to the program
    in their order, whose o / l has other axes than the gated output's position: the stages'
    check compares the axes by identity (comparing the axes themselves built DSL expressions,
    and planning raised 'a tensor value was used where Python needs True/False')."""
    made = tf.compile(gated_attention, target="cuda:sm_90a")

    def stored(order):   # [B, H, S, D] seen over memory laid out in ``order``
        t = torch.randn([(2, 8, 96, 64)[k] for k in order]).to(torch.bfloat16)
        return t.permute([order.index(k) for k in range(4)])
    q, k, v, gate = (stored((0, 1, 3, 2)) for _ in range(4))
    plan = made.describe_call(q, k, v, gate, 0.125)
    assert "read in memory order: q as [B, H, D, S]" in plan, plan
    q, k, v, gate = (stored((0, 2, 1, 3)) for _ in range(4))
    assert "the Hopper attention, then the function of its output" in \
        made.describe_call(q, k, v, gate, 0.125)
