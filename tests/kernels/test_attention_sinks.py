"""Attention with sinks (gpt-oss: a score per head outside the keys that shares the softmax and
attends to nothing; ``tensorfuse.kernels.layers.attention_kernel(..., sinks=dtype)``) against
the float64 math as gpt-oss's eager code writes it — the sink appended to every row's logits,
the softmax over both, the sink's column dropped — causal and under a mask that empties rows,
grouped heads, sinks large enough to take most of a row."""
import pytest
import torch

from tensorfuse.kernels.layers import attention_kernel
from tests.helpers import fresh_seed, relative_error


def sink_case(generator, masked: bool, B=2, H=8, HKV=2, M=37, N=53, D=64):
    """(arguments, float64 output): rows of the mask emptied whole give 0."""
    q = torch.randn(B, H, M, D, generator=generator).to(torch.bfloat16)
    k, v = (torch.randn(B, HKV, N, D, generator=generator).to(torch.bfloat16) for _ in range(2))
    sinks = (torch.randn(H, generator=generator) * 4).to(torch.bfloat16)
    if masked:
        keep = torch.rand(B, 1, M, N, generator=generator) > 0.5
        keep[1, 0, :3] = False
    else:   # bottom-right causal
        keep = torch.ones(M, N, dtype=torch.bool).tril(N - M)
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
