"""Attention's weights written in base two, ``exp2(s − max s)`` with the scores scaled by
``log2(e)`` (Triton's and FlashAttention's form), compiled as the natural exponentials the
attention templates recognise (``schedule_templates/base_two_weights.py``): the rewritten
program, the programs left alone, the Hopper attention they then get (the source of the same
attention written with ``T.exp``), and their numbers against float64 in Triton's interpreter, on
the CPU target and on the GPU."""
import json
import math
import sys

import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.dsl.printer import to_text
from tensorfuse.schedule_templates.base_two_weights import base_two_weights
from tests.helpers import fresh_seed, poisoned_call, relative_error

HOPPER = "cuda:sm_90a"
SIZES = dict(B=2, H=16, M=4096, N=4096, D=128)
LOG2E = 1.4426950408889634
Q = T.Tensor["B", "H", "M", "D", "bf16"]
KV = T.Tensor["B", "H", "N", "D", "bf16"]


@tf.kernel
def base_two_causal(q: Q, k: KV, v: KV, scale: T.f32):
    """The scores scaled by log2(e), masked causally (bottom right), weighed by exp2."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * (scale * LOG2E)
    s = T.where(j <= i + T.size("N") - T.size("M"), s, float("-inf"))
    m = T.max(s, over=j)
    p = T.exp2(s - m)
    return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)


@tf.kernel
def natural_causal(q: Q, k: KV, v: KV, scale: T.f32):
    """The same attention written with T.exp: the source the rewritten one must have."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    s = T.where(j <= i + T.size("N") - T.size("M"), s, float("-inf"))
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)


@tf.kernel
def base_two_after(q: Q, k: KV, v: KV, scale: T.f32):
    """Natural scores, the difference scaled by log2(e) inside exp2."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    m = T.max(s, over=j)
    p = T.exp2((s - m) * LOG2E)
    return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)


@tf.kernel
def base_two_lse(q: Q, k: KV, v: KV, scale: T.f32):
    """The output and the base-two log-sum-exp FlashAttention's Triton code keeps,
    ``m + log2(l)``: the maximum read outside the weights."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * (scale * LOG2E)
    m = T.max(s, over=j)
    p = T.exp2(s - m)
    l = T.sum(p, over=j)  # noqa: E741 - the name used in the attention literature
    return T.sum(p * v[b, h, j, e], over=j) / l, m + T.log2(l)


@tf.kernel
def base_two_rows(x: T.Tensor["R", "C", "f32"]):
    """A row's softmax in base two: no weighted sum, left as written."""
    r, c = T.axes("r c")
    p = T.exp2(x[r, c] - T.max(x[r, c], over=c))
    return p / T.sum(p, over=c)


@tf.kernel
def base_two_by_scalar(q: Q, k: KV, v: KV, c: T.f32):
    """The difference scaled by a scalar: its sign unknown, max(c·s) may not be c·max(s)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d)
    m = T.max(s, over=j)
    p = T.exp2((s - m) * c)
    return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)


@tf.kernel
def base_two_of_other_values(q: Q, k: KV, v: KV, bias: T.Tensor["B", "H", "M", "N", "f32"]):
    """exp2 of another value than the one maximised: not a softmax's weights."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d)
    m = T.max(s, over=j)
    p = T.exp2(s + bias[b, h, i, j] - m)
    return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)


def test_the_weights_are_natural_exponentials_of_the_scaled_scores():
    program, note = base_two_weights(base_two_causal.program)
    assert note == ("base-two weights as natural exponentials (exp2 under m read as exp of its "
                    "scores × ln 2)")
    computes = {c.name: c for c in program.computes}
    scores = "where(j <= i + T.size('N') - T.size('M'), s_sum * scale, -inf)"
    assert to_text(computes["m"].bodies[0]) == scores   # log2(e) · ln 2 is 1: dropped
    assert to_text(computes["p"].bodies[0]) == f"exp({scores} - m)"
    program, _ = base_two_weights(base_two_after.program)
    computes = {c.name: c for c in program.computes}
    assert to_text(computes["p"].bodies[0]) == "exp(s_sum * scale - m)"


def test_another_read_of_the_maximum_reads_it_in_base_two():
    program, _ = base_two_weights(base_two_lse.program)
    lse = program.outputs[1]
    assert to_text(lse.bodies[0]) == f"m * {1 / math.log(2)} + log2(l)"


def test_programs_without_base_two_attention_weights_are_left_alone():
    for kernel in (base_two_rows, base_two_by_scalar, base_two_of_other_values, natural_causal):
        assert base_two_weights(kernel.program) is None, kernel.program.name


def test_base_two_attention_gets_the_source_of_the_natural_one():
    made = tf.compile(base_two_causal, HOPPER)
    plan = made.describe_plan(**SIZES).splitlines()
    assert plan[0].startswith("base-two weights as natural exponentials"), plan
    assert ": hopper_attention (rolling_update(m, " in plan[1], plan
    natural = tf.compile(natural_causal, HOPPER).source(**SIZES)
    assert made.source(**SIZES).replace("base_two_causal", "natural_causal") == natural
    after = tf.compile(base_two_after, HOPPER).describe_plan(**SIZES)
    assert ": hopper_attention (" in after and "score: s_sum * scale" in after, after


def test_base_two_attention_matches_float64_in_the_interpreter():
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from tests.helpers import run_interpreted

    seed = fresh_seed()
    errors = run_interpreted("tests.schedule_templates.test_base_two_weights", seed)
    assert max(errors) < 2e-2, (errors, seed)


def _inputs(seed: int, device: str = "cpu", M: int = 45, N: int = 67, D: int = 16):
    """q, k, v (bf16, a wide range of scores), the scale, and float64's output and natural
    log-sum-exp of the bottom-right causal attention (every query sees a key: M ≤ N) and the
    unmasked one."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = ((torch.randn(2, 3, n, D, generator=g) * 4).to(device, torch.bfloat16)
               for n in (M, N, N))
    s = q.double() @ k.double().transpose(-1, -2) * 0.3
    causal = torch.ones(M, N, dtype=torch.bool, device=s.device).tril(N - M)
    masked = s.masked_fill(~causal, float("-inf"))
    return (q, k, v), {"causal": torch.softmax(masked, -1) @ v.double(),
                       "full": torch.softmax(s, -1) @ v.double(),
                       "lse": torch.logsumexp(s, -1)}


def _checked(run, inputs: tuple, want: dict) -> list[float]:
    """Relative errors of each kernel made by ``run`` (a compile of it), called into poisoned
    outputs, against float64."""
    q, k, v = inputs
    args = dict(q=q, k=k, v=v, scale=0.3)
    out, lse = poisoned_call(run(base_two_lse), base_two_lse.program, args,
                             (want["full"], want["lse"]))
    return [relative_error(poisoned_call(run(base_two_causal), base_two_causal.program, args,
                                         want["causal"])[0], want["causal"]),
            relative_error(poisoned_call(run(base_two_after), base_two_after.program, args,
                                         want["full"])[0], want["full"]),
            relative_error(out, want["full"]), relative_error(lse, want["lse"] / math.log(2))]


def _interpreted_errors(seed: int) -> list[float]:
    """Under TRITON_INTERPRET=1: each kernel as made for sm_90a (its Triton template run by the
    interpreter) and on the CPU target, against float64."""
    from tests.schedule_templates.staged_floor import interpreted

    inputs, want = _inputs(seed)
    return _checked(interpreted, inputs, want) + \
        _checked(lambda k: tf.compile(k, "llvm"), inputs, want)


@pytest.mark.gpu
def test_base_two_attention_matches_float64_on_the_gpu():
    seed = fresh_seed()
    inputs, want = _inputs(seed, "cuda", M=777, N=1000, D=128)
    made: dict = {}

    def run(kernel):
        if kernel not in made:
            made[kernel] = tf.compile(kernel)
        return made[kernel]
    for _ in range(2):   # the checked path, then the fast call
        errors = _checked(run, inputs, want)
        assert max(errors) < 2e-2, (errors, seed)


if __name__ == "__main__":
    print(json.dumps(_interpreted_errors(int(sys.argv[1]))))
