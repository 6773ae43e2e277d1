"""Attention whose output is a function of ``o / l`` (a sigmoid gate, a residual) as two stages —
the attention with ``o / l`` as its output, then the function — so that the Hopper template
takes the attention (:mod:`tensorfuse.schedule_templates.attention_epilogue`): the stages and
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
from tests.helpers import fresh_seed, relative_error



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
