"""Attention with sinks (gpt-oss: a score per head outside the keys that shares the softmax and
attends to nothing; ``tensorfuse.kernels.layers.attention_kernel(..., sinks=dtype)``) against
the float64 math as gpt-oss's eager code writes it — the sink appended to every row's logits,
the softmax over both, the sink's column dropped — causal and under a mask that empties rows,
grouped heads, sinks large enough to take most of a row."""
import re

import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels.attention import scores, softmax_attend
from tensorfuse.kernels.layers import attention_kernel
from tests.helpers import fresh_seed, needs_nvcc, relative_error

SIZES = dict(B=1, H=64, HKV=8, M=4096, N=4096, D=64)


@tf.kernel
def batch_sinks(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                v: T.Tensor["B", "H", "N", "D", "bf16"], sinks: T.Tensor["B", "H", "f32"],
                scale: T.f32):
    """A sink per sequence and head."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    return T.cast(softmax_attend(scores(q, k, b, h, h, i, j, d, scale), v[b, h, j, e], j,
                                 sink=sinks[b, h]), "bf16")


def hopper(kernel, **knobs):
    """``kernel`` on the Hopper template applied by hand (tf.compile keeps sinks off it)."""
    return tf.schedule(kernel, "cuda:sm_90a").rolling_update("m", "o", "l", axis="j") \
        .apply_template("hopper_attention", **knobs).compile()


def sink_case(generator, masked: bool, B=2, H=8, HKV=2, M=37, N=53, D=64, causal=True):
    """(arguments, float64 output): rows of the mask emptied whole give 0; without a mask,
    causal from the bottom right or (``causal=False``) every key."""
    q = torch.randn(B, H, M, D, generator=generator).to(torch.bfloat16)
    k, v = (torch.randn(B, HKV, N, D, generator=generator).to(torch.bfloat16) for _ in range(2))
    sinks = (torch.randn(H, generator=generator) * 4).to(torch.bfloat16)
    if masked:
        keep = torch.rand(B, 1, M, N, generator=generator) > 0.5
        keep[1, 0, :3] = False
    else:   # bottom-right causal, or every key
        keep = torch.ones(M, N, dtype=torch.bool).tril(N - M if causal else N)
    s = q.double() @ k.double().repeat_interleave(H // HKV, 1).transpose(-1, -2) * D ** -0.5
    s = s.masked_fill(~keep, float("-inf"))
    logits = torch.cat([s, sinks.double().view(1, H, 1, 1).expand(B, H, M, 1)], -1)
    want = torch.softmax(logits, -1)[..., :-1] @ v.double().repeat_interleave(H // HKV, 1)
    args = [q, k, v] + ([keep] if masked else []) + [sinks]
    return args, want


@pytest.mark.parametrize("masked", [False, True])
def test_sinks_match_float64_on_the_cpu(masked):
    seed = fresh_seed()
    args, want = sink_case(torch.Generator().manual_seed(seed), masked)
    kernel = attention_kernel("bf16", not masked, masked, False, "bf16")
    assert relative_error(kernel(*args, scale=64 ** -0.5, target="llvm"), want) < 2e-2, seed


@pytest.mark.parametrize("masked", [False, True])
def test_tf_compile_runs_sink_prefill_on_the_hopper_template_and_says_why_not_packing(masked):
    """Prefill with sinks (causal, or gpt-oss's sliding layers as a boolean mask) on the Hopper
    template; a decode with them off the packed routes, which say why."""
    made = tf.compile(attention_kernel("bf16", not masked, masked, False, "bf16"), "cuda:sm_90a")
    assert made.schedule_origin(**SIZES).startswith("hopper_attention template defaults")
    decode = {**SIZES, "B": 8, "M": 1}
    plan = made.describe_plan(**decode)
    assert not plan.splitlines()[0].split(": ")[1].startswith("packed"), plan


@pytest.mark.parametrize("kernel, at", [(attention_kernel("bf16", True, False, False, "bf16"),
                                         "w.bh % H_"), (batch_sinks, "w.bh")])
def test_the_hopper_epilogue_adds_each_rows_sink_share_after_the_merge(kernel, at):
    """m and l are in base 2 of the score: l + exp(sink − m) is l + 2^(sink·log2 e − m), added
    once the split pieces are merged, before the division."""
    sizes = SIZES if kernel is not batch_sinks else {n: v for n, v in SIZES.items() if n != "HKV"}
    source = hopper(kernel).source(**sizes)
    sink = next(line for line in source.splitlines() if "the sink's share" in line)
    assert f"t_sinks[{at}] * 1.4426950408889634f - m[x]" in sink
    assert source.index("merge_piece(o, m, l") < source.index(sink.strip()) < \
        source.index("const float inv = 1.0f / l[x];")


@needs_nvcc
def test_the_hopper_sink_kernel_compiles_with_the_plain_kernels_registers():
    from tests.schedule_templates.test_hopper_attention import _ptxas_report

    def registers(kernel):   # registers, and the bytes spilled (ptxas says 0 where none)
        report = _ptxas_report(hopper(kernel).source(**SIZES))
        return re.findall(r"Used (\d+) registers|(\d+) bytes spill stores", report)
    plain = registers(attention_kernel("bf16", True, False, False))
    assert len(plain) == 2 and registers(attention_kernel("bf16", True, False, False, "bf16")) \
        == plain, plain


def test_sinks_with_a_soft_cap_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="sinks with a soft-cap"):
        attention_kernel("bf16", True, False, True, "bf16")


@pytest.mark.gpu
@pytest.mark.parametrize("masked, sizes", [(False, {}), (True, {}),
                                           (False, dict(M=1, N=4099)), (True, dict(M=1))])
def test_sinks_match_float64_on_the_gpu(masked, sizes):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    seed = fresh_seed()
    args, want = sink_case(torch.Generator().manual_seed(seed), masked, **sizes)
    kernel = attention_kernel("bf16", not masked, masked, False, "bf16")
    out = torch.full(want.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    kernel(*(a.cuda() for a in args), scale=64 ** -0.5, out=out)
    assert relative_error(out, want) < 2e-2, seed


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, knobs", [
    (attention_kernel("bf16", True, False, False, "bf16"), {}),
    (attention_kernel("bf16", False, False, False, "bf16"), {"schedule": "split"}),
    (attention_kernel("bf16", False, True, False, "bf16"), {}),
    (batch_sinks, {})])
def test_the_hopper_sink_kernel_matches_float64_on_the_gpu(kernel, knobs):
    """The template applied by hand with its knobs (tf.compile's route); causal with ragged
    lengths, and every key with the
    tiles split along the keys (the sink's share added once the pieces are merged); a boolean
    mask emptying rows whole (gpt-oss's sliding layers: those rows give 0)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    if kernel is batch_sinks:
        B, H, M, N = 2, 4, 333, 333
        q, k, v = (torch.randn(B, H, n, 64, generator=g).to(torch.bfloat16) for n in (M, N, N))
        sinks = torch.randn(B, H, generator=g) * 4
        s = q.double() @ k.double().transpose(-1, -2) * 0.125
        logits = torch.cat([s, sinks.double().view(B, H, 1, 1).expand(B, H, M, 1)], -1)
        want = torch.softmax(logits, -1)[..., :-1] @ v.double()
        args = [q, k, v, sinks]
    else:
        masked = "masked" in kernel.program.name
        args, want = sink_case(g, masked, B=2, H=8, HKV=2, M=1000, N=1000,
                               causal="schedule" not in knobs)
    out = torch.full(want.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    hopper(kernel, **knobs)(*(a.cuda() for a in args), scale=0.125, out=out)
    assert relative_error(out, want) < 2e-2, seed


def test_one_kernel_per_variant_however_it_is_asked_for():
    """The integration passes ``sinks=None`` where a caller leaves it out: one kernel (its builds
    and ``cache_info()`` shared), not two."""
    assert attention_kernel("bf16", True, False, False) is \
        attention_kernel("bf16", 1, False, False, None) is \
        attention_kernel(dtype="bf16", causal=True, masked=False, softcap=False)
    assert attention_kernel("bf16", True, False, False, "bf16") is not \
        attention_kernel("bf16", True, False, False)
