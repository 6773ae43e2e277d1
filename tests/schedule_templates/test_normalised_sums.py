"""Sums whose terms are divided by a finished reduction over their own axis — attention written
"softmax, then the weighted sum" — compiled as the sum divided after, and a scale inside the
score's dot product moved out of it (``schedule_templates/normalised_sums.py``); the output
through the normaliser's reciprocal read as the ratio (``attention_chain``): the rewrite's
program, the programs it leaves alone, the Hopper attention they then get, and their numbers
against float64 in Triton's interpreter and on the GPU."""
import json
import sys

import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.schedule_templates.normalised_sums import normalised_sums
from tests.helpers import fresh_seed, relative_error

HOPPER = "cuda:sm_90a"
SIZES = dict(B=2, H=16, M=4096, N=4096, D=128)


@tf.kernel
def softmax_then_sum(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                     v: T.Tensor["B", "H", "N", "D", "bf16"], scale: T.f32):
    """Attention as a user writes it from its definition: the softmax's weights, then their
    weighted sum of the values."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    p = T.exp(s - T.max(s, over=j))
    weights = p / T.sum(p, over=j)
    return T.sum(weights * v[b, h, j, e], over=j)


@tf.kernel
def normalised_inside(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                      v: T.Tensor["B", "H", "N", "D", "bf16"], scale: T.f32):
    """The same with the division written inside the weighted sum's terms."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    m = T.max(s, over=j)
    l = T.sum(T.exp(s - m), over=j)
    return T.sum(T.exp(s - m) / l * v[b, h, j, e], over=j)


@tf.kernel
def rounded_weights(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                    v: T.Tensor["B", "H", "N", "D", "bf16"], scale: T.f32):
    """The softmax's weights rounded to the values' dtype before their weighted sum, as torch's
    ``softmax(s, -1).to(v.dtype) @ v``."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    p = T.exp(s - T.max(s, over=j))
    weights = T.cast(p / T.sum(p, over=j), "bf16")
    return T.sum(weights * v[b, h, j, e], over=j)


@tf.kernel
def softmax_entropy(x: T.Tensor["R", "C", "f32"]):
    """The normaliser also read along the axis (inside the log): it stays inside."""
    r, c = T.axes("r c")
    p = T.exp(x[r, c] - T.max(x[r, c], over=c))
    w = p / T.sum(p, over=c)
    return -T.sum(w * T.log(w), over=c)


@tf.kernel
def weighted_by_rows(x: T.Tensor["R", "C", "f32"], w: T.Tensor["R", "f32"]):
    """A factor constant along the sum that reduces nothing: left where it is written."""
    r, c = T.axes("r c")
    return T.sum(x[r, c] * w[r], over=c)


@tf.kernel
def scaled_queries(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                   v: T.Tensor["B", "H", "N", "D", "bf16"], scale: T.f32):
    """The scale written on the queries inside the score's dot product, and the output through
    the reciprocal of the normaliser."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * scale * k[b, h, j, d], over=d)
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, h, j, e], over=j) * (1.0 / T.sum(p, over=j))


@tf.kernel
def logsumexp_weights(q: T.Tensor["B", "H", "M", "D", "bf16"],
                      k: T.Tensor["B", "H", "N", "D", "bf16"],
                      v: T.Tensor["B", "H", "N", "D", "bf16"], scale: T.f32):
    """The weights written through the scores' log-sum-exp, ``exp(s − lse)``."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    lse = T.logsumexp(s, over=j)
    return T.sum(T.exp(s - lse) * v[b, h, j, e], over=j)


@tf.kernel
def scaled_rows(x: T.Tensor["R", "C", "f32"], w: T.Tensor["R", "C", "f32"], scale: T.f32):
    """A scalar in a sum of a computed value: left where it is written."""
    r, c = T.axes("r c")
    return T.sum(T.exp(x[r, c]) * scale * w[r, c], over=c)


def test_the_normaliser_is_moved_outside_the_sum():
    program, note = normalised_sums(softmax_then_sum.program)
    assert note == "factors constant along a sum moved outside it (out_sum: / weights_sum)"
    computes = {c.name: c for c in program.computes}
    assert str(computes["terms"].bodies[0]) == "p * v[b, h, j, e]"
    assert computes["terms"].monoid.name == "sum"
    assert [c.name for c in program.outputs] == ["out"]
    assert str(program.outputs[0].bodies[0]) == "terms / weights_sum"
    assert "out_sum" not in computes and "weights" in computes   # read inline, left unread
    program, note = normalised_sums(normalised_inside.program)
    assert str(program.outputs[0].bodies[0]) == "terms / l"
    program, note = normalised_sums(rounded_weights.program)   # rounded, then divided
    computes = {c.name: c for c in program.computes}
    assert str(computes["terms"].bodies[0]) == "p.astype('bf16') * v[b, h, j, e]"
    assert str(program.outputs[0].bodies[0]) == "terms / weights_sum"


def test_a_scale_inside_a_dot_product_moves_out_of_it():
    program, note = normalised_sums(scaled_queries.program)
    assert note == "factors constant along a sum moved outside it (s: × scale)"
    computes = {c.name: c for c in program.computes}
    assert str(computes["terms"].bodies[0]) == "q[b, h, i, d] * k[b, h, j, d]"
    assert "s" not in computes and str(computes["m"].bodies[0]) == "terms * scale"


def test_weights_through_the_log_sum_exp_divide_by_its_sum_after():
    """After the log-sum-exp is written as its maximum and sum (``monoid_rewrites``):
    ``exp(s − (log L + g)) = exp(s − g) / L``, L moved outside; the guarded maximum g is the
    chain's maximum wherever a row has a finite one."""
    from tensorfuse.schedule_templates.monoid_rewrites import rewritten_monoids

    program, note = normalised_sums(rewritten_monoids(logsumexp_weights.program)[0])
    assert note == "factors constant along a sum moved outside it (out_sum: / lse_sum_exp)"
    computes = {c.name: c for c in program.computes}
    assert str(computes["terms"].bodies[0]) == \
        "exp(s - where(abs(lse_max) < inf, lse_max, 0.0)) * v[b, h, j, e]"
    assert str(program.outputs[0].bodies[0]) == "terms / lse_sum_exp"


def test_sums_without_a_normaliser_to_move_are_left_alone():
    assert normalised_sums(softmax_entropy.program) is None
    assert normalised_sums(weighted_by_rows.program) is None
    assert normalised_sums(scaled_rows.program) is None
    for kernel in (K.attention, K.softmax, K.cross_entropy, K.layernorm):
        assert normalised_sums(kernel.program) is None, kernel


@pytest.mark.parametrize("kernel", [softmax_then_sum, normalised_inside, scaled_queries,
                                    logsumexp_weights, rounded_weights])
def test_attention_written_other_ways_gets_the_hopper_attention(kernel):
    made = tf.compile(kernel, HOPPER)
    plan = made.describe_plan(**SIZES).splitlines()
    at = next(k for k, line in enumerate(plan) if line.startswith("factors constant along"))
    assert ": hopper_attention (rolling_update(" in plan[at + 1], plan


def test_the_rewritten_attention_matches_float64_in_the_interpreter():
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from tests.helpers import run_interpreted

    seed = fresh_seed()
    errors = run_interpreted("tests.schedule_templates.test_normalised_sums", seed)
    assert max(errors) < 2e-2, (errors, seed)


def _inputs(seed: int, device: str = "cpu", M: int = 67, N: int = 45, D: int = 16):
    g = torch.Generator().manual_seed(seed)
    q, k, v = ((torch.randn(2, 3, n, D, generator=g) * 4).to(device, torch.bfloat16)
               for n in (M, N, N))
    s = q.double() @ k.double().transpose(-1, -2) * 0.3
    return (q, k, v), torch.softmax(s, -1) @ v.double()


def _interpreted_errors(seed: int) -> list[float]:
    """Under TRITON_INTERPRET=1: each kernel as made for sm_90a (its Triton template run by the
    interpreter) against float64, and on the CPU target (the program as written)."""
    from tests.schedule_templates.staged_floor import interpreted

    (q, k, v), want = _inputs(seed)
    errors = []
    for kernel in (softmax_then_sum, normalised_inside, scaled_queries, logsumexp_weights,
                   rounded_weights):
        errors.append(relative_error(interpreted(kernel)(q, k, v, 0.3), want))
        errors.append(relative_error(tf.compile(kernel, "llvm")(q, k, v, 0.3), want))
    return errors


@pytest.mark.gpu
def test_the_rewritten_attention_matches_float64_on_the_gpu():
    seed = fresh_seed()
    (q, k, v), want = _inputs(seed, "cuda", M=1000, N=777, D=128)
    for kernel in (softmax_then_sum, normalised_inside, scaled_queries, logsumexp_weights,
                   rounded_weights):
        made = tf.compile(kernel)
        for _ in range(2):   # the checked path, then the fast call
            assert relative_error(made(q, k, v, 0.3), want) < 2e-2, (kernel, seed)


if __name__ == "__main__":
    print(json.dumps(_interpreted_errors(int(sys.argv[1]))))
