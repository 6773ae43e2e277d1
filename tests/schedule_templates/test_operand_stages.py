"""Attention whose q·k operands are computed where the scores are made (rotary embeddings) as
stages — each computed operand stored as the tensor cores take it, then the attention over them
on the Hopper template (:mod:`tensorfuse.schedule_templates.operand_stages`): the stages, their
results against float64 on the CPU, the sm_90a plan, and the H200 run marked ``gpu``."""
import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.dsl.program import ProgramKernel
from tensorfuse.kernels import softmax_attend
from tensorfuse.schedule_templates.operand_stages import computed_operand_stages
from tensorfuse.staged import StagedKernel
from benchmarks.attention import reference
from benchmarks.serving_kernels import (causal, rope_angles, rope_attention,
                                        rope_attention_bf16_tables, rotated)
from tests.helpers import fresh_seed, poisoned_call, relative_error

HOPPER = "cuda:sm_90a"
SIZES = dict(B=2, H=16, S=4096, D=128)


def _stages(kernel):
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target

    _, fusion = choose(kernel.program, get_target(HOPPER))
    return computed_operand_stages(kernel.program, fusion.names, fusion.axis)


@tf.kernel
def weighted_queries(q: T.Tensor["B", "H", "S", "D", "bf16"], k: T.Tensor["B", "H", "S", "D", "bf16"],
                     v: T.Tensor["B", "H", "S", "D", "bf16"], w: T.Tensor["D", "bf16"]):
    """A weight on the head dim folded into the scores: only q's side is computed."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.where(j <= i, T.sum(q[b, h, i, d] * w[d] * k[b, h, j, d], over=d), float("-inf"))
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def pair_bias_in_the_product(q: T.Tensor["B", "H", "S", "D", "bf16"],
                             k: T.Tensor["B", "H", "S", "D", "bf16"],
                             v: T.Tensor["B", "H", "S", "D", "bf16"],
                             g: T.Tensor["B", "H", "S", "S", "bf16"]):
    """A factor of query and key inside the product: stored, it would be a value per query, key
    and head dim — not an operand."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d] * g[b, h, i, j], over=d)
    return softmax_attend(s, v[b, h, j, e], j)


def test_rotary_operands_are_stages_before_the_hopper_attention():
    first, second, last = _stages(rope_attention_bf16_tables)
    assert (first.produces, second.produces, last.produces) == (
        ("operand",), ("operand_1",), ("out",))
    assert first.inputs == ("q", "cos", "sin") and second.inputs == ("k", "cos", "sin")
    assert last.inputs == ("v", "scale", "operand", "operand_1")
    # stored as the fused kernel's tensor cores take them: bf16 from bf16 loads
    assert [p.dtype for p in last.program.tensor_params] == ["bf16"] * 3
    made = tf.compile(rope_attention_bf16_tables, HOPPER)
    plan = made.describe_plan(**SIZES)
    assert plan.splitlines()[0].endswith(
        "3 stage kernels (the computed q·k operands stored, then the Hopper attention over "
        "them): operand from q, cos, sin; operand_1 from k, cos, sin; out from v, scale, "
        "operand, operand_1"), plan
    assert "hopper attention plan: out[B, H, S, D] from operand, operand_1, v" in plan


def test_float32_operands_keep_the_fused_kernel():
    """float32 tables make float32 operands (products as written): the Hopper template takes
    16-bit operands only, so the stages would buy nothing and the Triton template keeps the
    program whole."""
    *_, last = _stages(rope_attention)
    assert [p.dtype for p in last.program.tensor_params if p.name.startswith("operand")] == \
        ["f32", "f32"]
    made = tf.compile(rope_attention, HOPPER)
    assert made.schedule_origin(**SIZES) == "template defaults"
    # the plan says why the stages are not taken, and what the user can change
    said = made.describe_plan(**SIZES).splitlines()[2]
    assert said.startswith("  not the computed q·k operands stored as stages (at any sizes): "
                           "its stage rope_attention_attention runs on no native template "
                           "(hopper_attention: "), said
    assert "operand, operand_1 are stored as float32" in said and \
        "cast the table or the product to q's dtype" in said, said
    # 16-bit tables: the stages run, and nothing is said of them
    assert "not the computed" not in tf.compile(rope_attention_bf16_tables,
                                                HOPPER).describe_plan(**SIZES)


def test_other_scores_are_left_whole():
    assert _stages(K.causal_attention) == ()          # plain loads: nothing to store
    # no operand of a tensor's size (nor a fusion: the factor reads the keys and the queries)
    assert computed_operand_stages(pair_bias_in_the_product.program, ("m", "o", "l"), "j") == ()
    first, last = _stages(weighted_queries)          # q's side alone
    assert first.inputs == ("q", "w") and last.inputs == ("k", "v", "operand")


def test_the_stages_match_float64_on_the_cpu():
    stages = _stages(rope_attention_bf16_tables)
    made = StagedKernel(rope_attention_bf16_tables.program, tf.get_target("llvm"), stages,
                        tuple(tf.compile(ProgramKernel(s.program), "llvm") for s in stages), "")
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    # the rotated operands are rounded to bf16 as the products take them (the fused kernel's
    # rounding too): the scores then carry |q|·|k|·2⁻⁸ — at 3·randn that alone reached 2.4e-2
    # against float64 in 10 seeds, at 2·randn 0.9e-2 (this test's tolerance: 2e-2)
    q, k, v = ((torch.randn(2, 3, 37, 16, generator=g) * 2).bfloat16() for _ in range(3))
    cos, sin = (t.bfloat16() for t in rope_angles(37, 16))
    want = reference(rotated(q.double(), cos.double(), sin.double()),
                     rotated(k.double(), cos.double(), sin.double()), v, 0.25, None, causal)
    (out,) = poisoned_call(made, rope_attention_bf16_tables.program,
                           dict(q=q, k=k, v=v, cos=cos, sin=sin, scale=0.25), want)
    assert relative_error(out, want) < 2e-2, seed


@pytest.mark.gpu
def test_rotary_attention_matches_float64_on_the_gpu():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    B, H, S, D = 2, 4, 777, 128
    q, k, v = ((torch.randn(B, H, S, D, generator=g) * 2).bfloat16() for _ in range(3))
    cos, sin = (t.bfloat16() for t in rope_angles(S, D))
    made = tf.compile(rope_attention_bf16_tables)
    assert made.schedule_origin(B=B, H=H, S=S, D=D).startswith("staged: 3 kernels")
    want = reference(rotated(q.double(), cos.double(), sin.double()),
                     rotated(k.double(), cos.double(), sin.double()), v, D ** -0.5, None, causal)
    args = dict(q=q, k=k, v=v, cos=cos, sin=sin)
    (out,) = poisoned_call(made, rope_attention_bf16_tables.program,
                           {**{n: t.cuda() for n, t in args.items()}, "scale": D ** -0.5}, want)
    assert relative_error(out, want) < 2e-2, seed
