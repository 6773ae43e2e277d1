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
from tensorfuse.schedule_templates.operand_stages import computed_operand_stages, split_terms
from tensorfuse.staged import StagedKernel
from benchmarks.attention import reference
from benchmarks.serving_kernels import (causal, rope_angles, rope_attention,
                                        rope_attention_bf16_tables, rotated)
from tests.helpers import fresh_seed, poisoned_call, relative_error, run_interpreted

HOPPER = "cuda:sm_90a"
SIZES = dict(B=2, H=16, S=4096, D=128)


def _stages(kernel):
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target

    _, fusion = choose(kernel.program, get_target(HOPPER))
    return computed_operand_stages(kernel.program, fusion.names, fusion.axis)


def _weighted_queries(weights: str):
    @tf.kernel
    def weighted_queries(q: T.Tensor["B", "H", "S", "D", "bf16"],
                         k: T.Tensor["B", "H", "S", "D", "bf16"],
                         v: T.Tensor["B", "H", "S", "D", "bf16"], w: T.Tensor["D", weights]):
        """A weight on the head dim (in ``weights``) folded into the scores: only q's side is
        computed (a float32 weight makes it float32; k stays a bf16 tensor)."""
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.where(j <= i, T.sum(q[b, h, i, d] * w[d] * k[b, h, j, d], over=d), float("-inf"))
        return softmax_attend(s, v[b, h, j, e], j)
    return weighted_queries


weighted_queries, float32_weight = _weighted_queries("bf16"), _weighted_queries("f32")


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


def test_float32_operands_are_stored_in_bf16_parts():
    """float32 tables make float32 operands (products as written): each is stored as bf16
    parts, the rotated q as [hi, hi, lo] and k as [hi, lo, hi] over a head dim three times as
    long, and the Hopper template runs q·k over it."""
    first, second, last = _stages(rope_attention)
    assert first.describe() == "operand from q, cos, sin (bf16 parts hi, hi, lo)"
    assert second.describe() == "operand_1 from k, cos, sin (bf16 parts hi, lo, hi)"
    operands = [p for p in last.program.tensor_params if p.name.startswith("operand")]
    assert [(p.dtype, p.dims[-1]) for p in operands] == [("bf16", "D_PARTS")] * 2
    assert last.program.with_derived_sizes(dict(D=128))["D_PARTS"] == 384
    made = tf.compile(rope_attention, HOPPER)
    assert made.schedule_origin(**SIZES).startswith(
        "staged: 3 kernels, their results between them stored (the computed q·k operands stored "
        "(float32 products as bf16 parts), then the Hopper attention over them")
    plan = made.describe_plan(**SIZES)
    assert "operand bf16 [2, 16, 4096, 384], operand_1 bf16 [2, 16, 4096, 384]" in plan
    assert "q·k over D_PARTS, p·v over D" in plan and "not the computed" not in plan
    # a head dim whose parts pass what the Hopper template holds: the Triton template whole
    assert made.schedule_origin(**dict(SIZES, D=256)) == "template defaults"


def test_the_terms_of_a_product_in_parts():
    assert split_terms(False, False) == (("hi", "hi", "lo"), ("hi", "lo", "hi"))
    assert split_terms(False, True) == (("hi", "lo"), ("hi", "hi"))   # k a bf16 tensor
    assert split_terms(True, False) == (("hi", "hi"), ("hi", "lo"))
    with pytest.raises(ValueError, match="no float32 product"):
        split_terms(True, True)


def _float32_attention(values: str):
    @tf.kernel
    def float32_attention(q: T.Tensor["B", "H", "S", "D", "f32"],
                          k: T.Tensor["B", "H", "S", "D", "f32"],
                          v: T.Tensor["B", "H", "S", "D", values], scale: T.f32):
        """float32 queries and keys as a user passes them, values in ``values``."""
        b, h, i, j, d, e = T.axes("b h i j d e")
        return softmax_attend(T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale,
                              v[b, h, j, e], j)
    return float32_attention


def test_float32_tensors_are_parts_only_before_bf16_values():
    """float32 q and k (plain loads) are stored as parts where the values are bf16 — the weights
    go to p·v as 16-bit numbers —, not where they are float32 or f16 (the Triton template keeps
    the program, its products float32's)."""
    first, second, last = _stages(_float32_attention("bf16"))
    assert (first.note, second.note) == ("bf16 parts hi, hi, lo", "bf16 parts hi, lo, hi")
    assert last.inputs == ("v", "scale", "operand", "operand_1")
    assert _stages(_float32_attention("f32")) == ()
    assert _stages(_float32_attention("f16")) == ()
    first, second, last = _stages(float32_weight)    # k exact: stored as it is, twice
    assert (first.note, second.note) == ("bf16 parts hi, lo", "bf16 parts hi, hi")
    assert second.inputs == ("k",) and last.inputs[-2:] == ("operand", "operand_1")


def _cpu(kernel):
    stages = _stages(kernel)
    return StagedKernel(kernel.program, tf.get_target("llvm"), stages,
                        tuple(tf.compile(ProgramKernel(s.program), "llvm") for s in stages), "")


def test_parts_keep_float32_products_on_the_cpu():
    """At 4·randn the rotated operands rounded to bf16 put the output 2e-2 from float64; their
    parts keep the products to 2⁻¹⁵ of their size (the CPU's p·v takes float32 weights, so the
    parts' rounding is all that is left): under 1e-3."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    q, k, v = ((torch.randn(2, 3, 37, 16, generator=g) * 4).bfloat16() for _ in range(3))
    cos, sin = rope_angles(37, 16)
    want = reference(rotated(q.double(), cos.double(), sin.double()),
                     rotated(k.double(), cos.double(), sin.double()), v, 0.25, None, causal)
    rounded = reference(*(rotated(t.float(), cos, sin).bfloat16().double() for t in (q, k)), v,
                        0.25, None, causal)
    assert relative_error(rounded, want) > 5e-3, seed   # what parts are for
    (out,) = poisoned_call(_cpu(rope_attention), rope_attention.program,
                           dict(q=q, k=k, v=v, cos=cos, sin=sin, scale=0.25), want)
    assert relative_error(out, want) < 1e-3, seed
    w = torch.rand(16, generator=g) * 4 + 0.5      # one side exact: [hi, lo] · [k, k]
    want = reference(q.double() * w.double(), k, v, 1.0, None, causal)
    (out,) = poisoned_call(_cpu(float32_weight), float32_weight.program,
                           dict(q=q, k=k, v=v, w=w), want)
    assert relative_error(out, want) < 1e-3, seed
    kernel = _float32_attention("bf16")              # float32 q and k as a user passes them
    q32, k32 = (torch.randn(2, 3, 37, 16, generator=g) * 4 for _ in range(2))
    want = reference(q32.double(), k32.double(), v, 0.25, None, None)
    (out,) = poisoned_call(_cpu(kernel), kernel.program,
                           dict(q=q32, k=k32, v=v, scale=0.25), want)
    assert relative_error(out, want) < 1e-3, seed


def test_other_scores_are_left_whole():
    assert _stages(K.causal_attention) == ()          # plain loads: nothing to store
    # no operand of a tensor's size (nor a fusion: the factor reads the keys and the queries)
    assert computed_operand_stages(pair_bias_in_the_product.program, ("m", "o", "l"), "j") == ()
    first, last = _stages(weighted_queries)          # q's side alone
    assert first.inputs == ("q", "w") and last.inputs == ("k", "v", "operand")


def test_the_stages_match_float64_on_the_cpu():
    made = _cpu(rope_attention_bf16_tables)
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
@pytest.mark.parametrize("kernel, tables, width", [
    (rope_attention_bf16_tables, torch.bfloat16, 2.0), (rope_attention, torch.float32, 2.0),
    (rope_attention, torch.float32, 4.0)])
def test_rotary_attention_matches_float64_on_the_gpu(kernel, tables, width):
    """bf16 tables: the rotated operands stored in bf16 (the math as written rounds them);
    float32 tables: stored in bf16 parts — at 4·randn within a tolerance the operands rounded to
    bf16 miss (checked on the same inputs)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    B, H, S, D = 2, 4, 777, 128
    q, k, v = ((torch.randn(B, H, S, D, generator=g) * width).bfloat16() for _ in range(3))
    cos, sin = (t.to(tables) for t in rope_angles(S, D))
    made = tf.compile(kernel)
    assert made.schedule_origin(B=B, H=H, S=S, D=D).startswith("staged: 3 kernels")
    want = reference(rotated(q.double(), cos.double(), sin.double()),
                     rotated(k.double(), cos.double(), sin.double()), v, D ** -0.5, None, causal)
    tolerance = 1e-2 if width > 2 else 2e-2
    if width > 2:   # what the parts are for: bf16 operands (p·v in float64) miss the tolerance
        rounded = reference(*(rotated(t.float(), cos.float(), sin.float()).bfloat16().double()
                              for t in (q, k)), v, D ** -0.5, None, causal)
        assert relative_error(rounded, want) > tolerance, (relative_error(rounded, want), seed)
    args = dict(q=q, k=k, v=v, cos=cos, sin=sin)
    (out,) = poisoned_call(made, kernel.program,
                           {**{n: t.cuda() for n, t in args.items()}, "scale": D ** -0.5}, want)
    assert relative_error(out, want) < tolerance, (relative_error(out, want), seed)


def operand_parts(seed: int, compiled) -> dict:
    """The rotated q's stage (float32 tables) as ``compiled(ProgramKernel)`` makes it, on fresh
    inputs: how far ``hi + lo`` is from the float64 rotation (relative to its largest value),
    and whether each ``hi`` is torch's bf16 rounding of the float32 rotation (the serving
    check's ``parts`` mode runs it in Triton's interpreter)."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(2, 3, 37, 16, generator=g) * 4).bfloat16()
    cos, sin = rope_angles(37, 16)
    first = _stages(rope_attention)[0]
    made = compiled(ProgramKernel(first.program))
    (out,) = poisoned_call(made, first.program, dict(q=q, cos=cos, sin=sin),
                           torch.zeros(2, 3, 37, 48))
    x = rotated(q.double(), cos.double(), sin.double())
    hi, lo = out[..., :16].double(), out[..., 32:].double()
    return {"rest": ((hi + lo - x).abs().max() / x.abs().max()).item(),
            "hi_twice": torch.equal(out[..., :16], out[..., 16:32]),
            "hi_rounded": (out[..., :16] == rotated(q.float(), cos, sin).bfloat16()).float()
            .mean().item()}


@pytest.mark.parametrize("where", ["cpu", "interpreter"])
def test_the_parts_stage_stores_the_rest_of_each_rounding(where):
    """hi is the float32 product's bf16 rounding, stored twice, and hi + lo is within 2⁻¹⁵ of
    the float64 rotation (hi alone: 2⁻⁹) — on the CPU target and the Triton template (Triton's
    interpreter casts float32 to bf16 toward zero, the GPU to nearest: lo holds the rest of
    either, so only the sum is checked there)."""
    seed = fresh_seed()
    if where == "interpreter":
        pytest.importorskip("triton", reason="the templates generate Triton kernels")
        found = run_interpreted("tests.schedule_templates.serving_kernels_check", "parts", seed)
    else:
        found = operand_parts(seed, lambda k: tf.compile(k, "llvm"))
    assert found["rest"] < 2 ** -15 and found["hi_twice"], (found, seed)
    # a float32 rotation computed in another order may round to the other side of a tie
    assert where == "interpreter" or found["hi_rounded"] > 0.999, (found, seed)
