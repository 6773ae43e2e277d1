"""Attention whose rows a mask may empty whole, written ``where(l > 0, o / l, 0)`` (what
``kernels.layers.attention_kernel(masked=True)`` writes and the transformers integration runs for
padded batches and sliding windows), on the Hopper template: recognised, the epilogue's inverse
guarded, compiled for sm_90a (CPU); against float64 with rows emptied whole (``gpu``)."""
from __future__ import annotations

import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import ScheduleError
from tensorfuse.kernels.attention import KV, Q, scores
from tensorfuse.kernels.layers import attention_kernel
from tensorfuse.schedule_templates.hopper_attention_plan import plan_hopper_attention
from tests.helpers import fresh_seed, needs_nvcc, relative_error

CHAIN = ("m", "l", "o")
SIZES = dict(B=2, H=8, HKV=2, M=1000, N=1000, D=64)
MASK = T.Tensor["B", 1, "M", "N", "bool"]


# the maximum as users guard it for a row without keys (the weights' shift), by spelling
SHIFTS = {"plain": lambda m: m,
          "above": lambda m: T.where(m > -T.inf, m, 0.0),
          "below": lambda m: T.where(-T.inf < m, m, 0.0),
          "equal": lambda m: T.where(m == -T.inf, 0.0, m),
          "finite": lambda m: T.where(T.abs(m) < T.inf, m, 0.0),
          "unequal": lambda m: T.where(m != -T.inf, m, -1.0),
          # no guard: another shift than the maximum where it is negative
          "positive_part": lambda m: T.where(m > 0.0, m, 0.0)}
GUARDS = sorted(set(SHIFTS) - {"plain", "positive_part"})


def _guarded(form: str, shift: str = "plain"):
    @tf.kernel
    def guarded(q: Q, k: KV, v: KV, mask: MASK, scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.where(mask[b, 0, i, j], scores(q, k, b, h, h, i, j, d, scale), -T.inf)
        m = T.max(s, over=j)
        p = T.exp(s - SHIFTS[shift](m))
        l = T.sum(p, over=j)  # noqa: E741
        o = T.sum(p * v[b, h, j, e], over=j)
        if form == "ne":
            return T.where(l != 0.0, o / l, 0.0)
        if form == "eq":
            return T.where(l == 0.0, 0.0, o / l)
        return T.where(l > 0.0, o / l, 1.0)     # not 0: another output than the template's
    return guarded


@pytest.mark.parametrize("form", ["ne", "eq"])
def test_the_guarded_ratio_is_recognised_in_each_spelling(form):
    plan = plan_hopper_attention(_guarded(form).program, CHAIN, "j")
    assert plan.chain.empty_rows and plan.mask is not None


@pytest.mark.parametrize("shift", GUARDS)
def test_the_maximum_guarded_for_empty_rows_is_recognised_in_each_spelling(shift):
    """``exp(s − where(m > −∞, m, 0))`` is ``exp(s − m)`` on every row with a key; a row
    without one has no weight either way."""
    plan = plan_hopper_attention(_guarded("ne", shift).program, CHAIN, "j")
    assert plan.chain.empty_rows and plan.mask is not None
    made = tf.compile(_guarded("ne", shift), "cuda:sm_90a")
    sizes = {n: v for n, v in SIZES.items() if n != "HKV"}   # k and v indexed by q's head
    assert ": hopper_attention (" in made.describe_plan(**sizes).splitlines()[0]


def test_a_shift_other_than_the_guarded_maximum_is_refused():
    with pytest.raises(ScheduleError, match="must be exp"):
        plan_hopper_attention(_guarded("ne", "positive_part").program, CHAIN, "j")


def test_an_empty_row_given_another_value_than_0_is_refused():
    with pytest.raises(ScheduleError, match="hopper attention: the output must be"):
        plan_hopper_attention(_guarded("one").program, CHAIN, "j")


def test_the_unguarded_ratio_keeps_the_plain_inverse():
    kernel = attention_kernel("bf16", True, False, False)
    assert not plan_hopper_attention(kernel.program, CHAIN, "j").chain.empty_rows


def _hopper(kernel, **knobs):
    return tf.schedule(kernel, "cuda:sm_90a").rolling_update("m", "o", "l", axis="j") \
        .apply_template("hopper_attention", **knobs).compile()


@needs_nvcc
def test_the_masked_layer_kernel_compiles_to_wgmma_with_the_guarded_inverse():
    """tf.compile takes the integration's masked kernel on the Hopper template; its epilogue
    tests each row's sum before the inverse, and (with sinks) before the sink's share."""
    made = tf.compile(attention_kernel("bf16", False, True, False), "cuda:sm_90a")
    assert made.describe_plan(**SIZES, scale=0.1).splitlines()[0].split(": ")[1] \
        .startswith("hopper_attention"), made.describe_plan(**SIZES, scale=0.1)
    source = made.source(**SIZES, scale=0.1)
    assert "const float inv = seen ? 1.0f / l[x] : 0.0f;" in source
    assert "wgmma.mma_async" in made.ptx(**SIZES, scale=0.1)
    sinks = _hopper(attention_kernel("bf16", False, True, False, "bf16")).source(**SIZES)
    seen, share = sinks.index("const bool seen = l[x] > 0.0f"), sinks.index("the sink's share")
    assert seen < share < sinks.index("const float inv = seen ?")


def _padded_case(generator, B=2, H=8, HKV=2, M=333, N=517, D=64):
    """Arguments and float64 output: causal from the bottom right, each batch row's keys left-
    padded (its first rows see no key: 0), and a few rows emptied at random."""
    import torch

    q = torch.randn(B, H, M, D, generator=generator).to(torch.bfloat16) * 3
    k, v = (torch.randn(B, HKV, N, D, generator=generator).to(torch.bfloat16) for _ in range(2))
    i, j = torch.arange(M)[:, None] + N - M, torch.arange(N)
    starts = torch.randint(N - M, N, (B, 1, 1, 1), generator=generator)
    keep = (j <= i) & (j >= starts)
    keep &= torch.rand(B, 1, M, 1, generator=generator) > 0.1
    g = H // HKV
    s = q.double() @ k.double().repeat_interleave(g, 1).transpose(-1, -2) * 0.125
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
    assert (~keep).all(-1).any(), "the case must empty some rows whole"
    return (q, k, v, keep), p @ v.double().repeat_interleave(g, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [{}, {"schedule": "grid"}, {"block_n": 176}])
def test_rows_the_mask_empties_give_0_on_the_gpu(knobs):
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    args, want = _padded_case(torch.Generator().manual_seed(seed))
    out = torch.full(want.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    _hopper(attention_kernel("bf16", False, True, False), **knobs)(
        *(a.cuda() for a in args), scale=0.125, out=out)
    assert not out.isnan().any(), seed
    assert relative_error(out, want) < 2e-2, seed


@pytest.mark.gpu
@pytest.mark.parametrize("shift", ["above", "equal"])
def test_a_guarded_maximum_gives_0_on_empty_rows_on_the_gpu(shift):
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    args, want = _padded_case(torch.Generator().manual_seed(seed), HKV=8)
    made = tf.compile(_guarded("ne", shift))
    for _ in range(2):   # the checked path, then the fast call
        out = torch.full(want.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
        made(*(a.cuda() for a in args), scale=0.125, out=out)
        assert not out.isnan().any(), seed
        assert relative_error(out, want) < 2e-2, seed
