"""A score that divides q·k by a factor of the query and one of the key (cosine similarity) is
planned for the Hopper attention kernel as q·k times their reciprocals, each computed once per
row and per column of a fragment; scores of any other form are left as written."""
import numpy as np
import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.algebra.exprs import nodes, substitute
from tensorfuse.dsl.evaluate import evaluate_plain
from tensorfuse.dsl.expr import Load, Ref, Symbol
from tensorfuse.dsl.printer import to_text
from tensorfuse.kernels.attention import softmax_attend
from tensorfuse.schedule_templates.hopper_attention_plan import plan_hopper_attention
from tests.helpers import needs_nvcc

CHAIN = ("m", "l", "o")


def _cosine(causal: bool, pairwise: bool = False):
    """Attention over q·k divided by the rows' and the keys' norms (given), times tau; with
    ``pairwise`` also by a tensor of (query, key) pairs, which no row or column factor is."""
    @tf.kernel
    def cosine_of_norms(q: T.Tensor["B", "H", "S", "D", "bf16"],
                        k: T.Tensor["B", "H", "S", "D", "bf16"],
                        v: T.Tensor["B", "H", "S", "D", "bf16"],
                        nq: T.Tensor["B", "H", "S", "f32"], nk: T.Tensor["B", "H", "S", "f32"],
                        pairs: T.Tensor["S", "S", "bf16"], tau: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) / (nq[b, h, i] * nk[b, h, j]) * tau
        s = s / pairs[i, j] if pairwise else s
        s = T.where(i >= j, s, -T.inf) if causal else s
        return softmax_attend(s, v[b, h, j, e], j)

    return cosine_of_norms


def _values(score, plan, rng) -> dict:
    """Random values for the dot product, every load (by its text) and the scalar."""
    names = {"qk": rng.standard_normal(64) * 30}
    for n in nodes(score):
        if isinstance(n, Load):
            names[to_text(n)] = rng.uniform(0.05, 500, 64)
    names["tau"] = 2.5
    return names


def _as_symbols(score, dot: str):
    return substitute(score, lambda n: Symbol("qk", "f32") if isinstance(n, Ref) and
                      n.compute.name == dot else Symbol(to_text(n), "f32")
                      if isinstance(n, Load) else None)


def test_a_score_divided_by_row_and_column_factors_multiplies_by_their_reciprocals():
    rng = np.random.default_rng()
    for causal in (False, True):
        plan = plan_hopper_attention(_cosine(causal).program, CHAIN, "j")
        written = to_text(plan.score)
        assert written.count("1.0 /") == 2 or written.count("1 /") == 2, written
        assert written.index("nk[") < written.index("nq["), written   # the columns' first
        assert (plan.mask is not None) == causal
        dot = plan.chain.dot
        env = _values(plan.chain.score, plan, rng)
        as_written = plan.chain.score.a if causal else plan.chain.score
        want = evaluate_plain(_as_symbols(as_written, dot), env)
        got = evaluate_plain(_as_symbols(plan.score, dot), env)
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_factor_of_query_and_key_together_leaves_the_score_as_written():
    plan = plan_hopper_attention(_cosine(False, pairwise=True).program, CHAIN, "j")
    assert plan.score is plan.chain.score


def test_the_sm90a_source_divides_no_element():
    source = tf.compile(_cosine(True), target="cuda:sm_90a").source(B=1, H=2, S=512, D=128)
    assert "qk * (1.0f / " in source and "qk / (" not in source


@tf.kernel
def key_bias(q: T.Tensor["B", "H", "S", "D", "bf16"], k: T.Tensor["B", "H", "S", "D", "bf16"],
             v: T.Tensor["B", "H", "S", "D", "bf16"], bias: T.Tensor["B", "S", "bf16"],
             scale: T.f32):
    """A bias per key (a soft padding mask), shared by the heads."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale + bias[b, j]
    return softmax_attend(s, v[b, h, j, e], j)


@needs_nvcc
def test_a_tensor_read_by_key_alone_is_copied_as_key_strips():
    """The keys' norms (f32) and a bias per key (bf16) are copied beside each key block's keys
    (one unswizzled TMA box of the block's keys) and read from shared memory, a pair a column
    for the fragment's two rows; 128-key blocks (ptxas spilled at 176). Where the tensor's rows
    are no multiple of 16 bytes it is read element by element, as before."""
    from tensorfuse.schedule_templates.score_tiles import strip_bytes
    from tensorfuse.targets import get_target
    from tensorfuse.targets.codegen import cuda_to_ptx

    cosine = plan_hopper_attention(_cosine(False).program, CHAIN, "j")
    assert cosine.key_strip.name == "nk" and cosine.key_strip.roles == ("b", "h", "j")
    assert cosine.score_tile is None and "nk[b, h, j] read as each key block's strip" in \
        cosine.describe()
    assert cosine.key_strip.map_shape(dict(B=2, H=4, S=1000), 128, 128) == \
        ((2, 4, 1000), (1, 1, 128), None)
    assert strip_bytes(176, "f32") == 1024 and strip_bytes(512, "f16") == 1024
    assert cosine.key_strip.why_not(dict(B=2, H=4, S=777)) is not None   # 3108-byte rows
    made = tf.compile(_cosine(False), target="cuda:sm_90a")
    source = made.source(B=1, H=2, S=1000, D=128)
    assert "#define BN 128" in source and "t_nk[" not in source
    assert "tf_tma_load_3d(score_tiles + s * T_BYTES, t_map, n0, w.bh % H_, w.bh / H_" in source
    assert "ld.shared.v2.f32" in cuda_to_ptx(source, get_target("cuda:sm_90a"))
    assert "t_nk[" in made.source(B=1, H=2, S=777, D=128)   # no map: element by element
    biased = tf.compile(key_bias, target="cuda:sm_90a").source(B=1, H=2, S=1024, D=128)
    assert "tf_key_strip_pair" in biased and "t_bias[" not in biased
    assert "tf_tma_load_2d(score_tiles + s * T_BYTES, t_map, n0, w.bh / H_" in biased
    assert "ld.shared.b32" in cuda_to_ptx(biased, get_target("cuda:sm_90a"))   # one 2-D copy


@pytest.mark.gpu
@pytest.mark.parametrize("S", [1000, 777])
def test_key_strips_match_float64_on_the_gpu(S):
    """Cosine attention over given norms (strips of f32; at S=777 read element by element) and a
    bias per key (strips of bf16), causal and not, ragged lengths, outputs poisoned, against
    float64."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    g = torch.Generator(device="cuda").manual_seed(S)
    B, H, D = 2, 4, 128
    q, k, v = ((torch.randn(B, H, S, D, device="cuda", generator=g) * 2).bfloat16()
               for _ in range(3))
    nq, nk = (x.float().norm(dim=-1) for x in (q, k))
    pairs = torch.ones(S, S, device="cuda", dtype=torch.bfloat16)
    bias = (torch.randn(B, S, device="cuda", generator=g) * 3).bfloat16()
    keep = torch.ones(S, S, dtype=torch.bool, device="cuda").tril()
    qd, kd, vd = (x.double() for x in (q, k, v))
    for causal in (False, True):
        s = qd @ kd.transpose(-1, -2) / (nq.double()[..., :, None] * nk.double()[..., None, :])
        s = s * 7.0
        want = torch.softmax(s.masked_fill(~keep, float("-inf")) if causal else s, -1) @ vd
        out = torch.full(q.shape, float("nan"), device="cuda")   # float32: the norms' dtype
        tf.compile(_cosine(causal))(q, k, v, nq, nk, pairs, 7.0, out=out)
        assert float((out.double() - want).norm() / want.norm()) < 1e-2, causal
    s = qd @ kd.transpose(-1, -2) * 0.1 + bias.double()[:, None, None, :]
    want = torch.softmax(s, -1) @ vd
    out = torch.full_like(q, float("nan"))
    tf.compile(key_bias)(q, k, v, bias, 0.1, out=out)
    assert float((out.double() - want).norm() / want.norm()) < 1e-2


@tf.kernel
def alibi_slopes_tensor(q: T.Tensor["B", "H", "S", "D", "bf16"],
                        k: T.Tensor["B", "H", "S", "D", "bf16"],
                        v: T.Tensor["B", "H", "S", "D", "bf16"], slopes: T.Tensor["H", "f32"],
                        scale: T.f32):
    """ALiBi as users write it, its slopes a tensor per head."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale - slopes[h] * (i - j)
    return softmax_attend(T.where(i >= j, s, -T.inf), v[b, h, j, e], j)


def test_a_key_linear_bias_may_read_a_tensor_by_head():
    """Its coefficient (the slope) is computed once a tile, the scale folded into exp2; a
    coefficient read by key is no such bias (the score is then written as it is)."""
    plan = plan_hopper_attention(alibi_slopes_tensor.program, CHAIN, "j")
    assert to_text(plan.key_bias) == "slopes[h]" and plan.scale is not None
    source = tf.compile(alibi_slopes_tensor, target="cuda:sm_90a").source(B=1, H=2, S=512,
                                                                           D=128)
    assert "return (((float)t_slopes[(h)])) * FOLD_C;" in source

    @tf.kernel
    def slope_per_key(q: T.Tensor["B", "H", "S", "D", "bf16"],
                      k: T.Tensor["B", "H", "S", "D", "bf16"],
                      v: T.Tensor["B", "H", "S", "D", "bf16"], slopes: T.Tensor["S", "f32"]):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) - slopes[j] * (i - j)
        return softmax_attend(s, v[b, h, j, e], j)

    assert plan_hopper_attention(slope_per_key.program, CHAIN, "j").key_bias is None


@pytest.mark.gpu
def test_alibi_with_a_slopes_tensor_matches_float64_on_the_gpu():
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    g = torch.Generator(device="cuda").manual_seed(3)
    B, H, S, D = 2, 4, 777, 128
    q, k, v = ((torch.randn(B, H, S, D, device="cuda", generator=g) * 2).bfloat16()
               for _ in range(3))
    slopes = 2.0 ** -torch.arange(1, H + 1, device="cuda", dtype=torch.float32)
    i = torch.arange(S, device="cuda")
    s = q.double() @ k.double().transpose(-1, -2) * 0.1 - \
        slopes.double()[:, None, None] * (i[:, None] - i[None]).double()
    s = s.masked_fill(i[:, None] < i[None], float("-inf"))
    want = torch.softmax(s, -1) @ v.double()
    out = torch.full(q.shape, float("nan"), device="cuda")
    tf.compile(alibi_slopes_tensor)(q, k, v, slopes, 0.1, out=out)
    assert float((out.double() - want).norm() / want.norm()) < 1e-2
