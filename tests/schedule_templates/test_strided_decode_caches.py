"""Cluster decode over caches in any order of batch, kv-head and keys (the head dim innermost):
``[B, N, HKV, D]`` as FlashAttention's kv-cache keeps them, addressed by their strides — a 4-D
tensor map per cache, or ``cp.async`` rows the cache's stride apart. The addressing against the
chain's strides and the sm_90a code here; the H200 run against float64 is marked ``gpu``."""
import itertools
import math

import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels.attention import softmax_attend
from tensorfuse.schedule_templates.attention_chain import recognise_attention
from tensorfuse.targets.cuda.cluster_decode import PAIRED, cache_addressing
from tests.helpers import needs_nvcc

DECODE = dict(B=2, H=8, HKV=2, M=1, N=1000, D=128)


@tf.kernel
def decode_bnhd(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "N", "HKV", "D", "bf16"],
                v: T.Tensor["B", "N", "HKV", "D", "bf16"], scale: T.f32):
    """Grouped-query decode over a [B, N, HKV, D] cache."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = T.sum(q[b, h, i, d] * k[b, j, hk, d], over=d) * scale
    return softmax_attend(s, v[b, j, hk, e], j)


def _decode(kernel, **knobs):
    sch = tf.schedule(kernel, target="cuda:sm_90a")
    sch.rolling_update("m", "l", "o", axis="j")
    sch.cluster_distribute("j", **knobs)
    return sch.compile()


def test_the_cache_addressing_is_the_strides_of_every_order():
    """For every order of b, h, j with d innermost, the C++ offset of pair (b, hk) and the
    distance between its keys are the strides of a cache contiguous in that order."""
    B, HKV, N, D = 3, 5, 7, 64
    extent = {"b": B, "h": HKV, "j": N, "d": D}
    for order in itertools.permutations("bhj"):
        layout = "".join(order) + "d"
        stride, strides = 1, {}
        for role in reversed(layout):
            strides[role] = stride
            stride *= extent[role]
        base, row = cache_addressing(layout, B)
        env = {"N_": N, "HKV_": HKV, "D": D, "long": int}
        for b, hk in ((0, 0), (2, 4), (1, 3)):
            got = eval(base.replace("(long)", ""), {}, {**env, "b": b, "hk": hk})
            assert got == b * strides["b"] + hk * strides["h"], (layout, base)
        assert eval(row, {}, env) == strides["j"], (layout, row)
    assert cache_addressing(PAIRED, B) == ("((long)b * HKV_ + hk) * N_ * D", "D")


def test_a_cache_with_the_keys_before_the_heads_is_planned_for_cluster_decode():
    chain = recognise_attention(decode_bnhd.program, ("m", "l", "o"), "j", "test")
    assert chain.layouts[1] == chain.layouts[2] == "bjhd"
    made = tf.compile(decode_bnhd, target="cuda:sm_90a")
    assert "cluster_decode" in made.describe_plan(**{**DECODE, "B": 1}).splitlines()[0]
    source = _decode(decode_bnhd, cluster=4).source(**DECODE)
    assert "const __nv_bfloat16* kb = k + ((long)b * N_ * HKV_ + hk) * D;" in source


def test_the_suites_cache_of_keys_before_heads_matches_float64_on_the_cpu():
    """``benchmarks.user_kernels.gqa_decode_bnhd`` (no query axis) through the CPU target, on a
    ragged key count, against float64."""
    import torch

    from benchmarks.user_kernels import gqa_decode_bnhd
    from tests.helpers import fresh_seed, relative_error

    g = torch.Generator().manual_seed(fresh_seed())
    B, H, HKV, N, D = 2, 8, 2, 37, 16
    q = (torch.randn(B, H, D, generator=g) * 3).bfloat16()
    k, v = ((torch.randn(B, N, HKV, D, generator=g) * 3).bfloat16() for _ in range(2))
    out = tf.compile(gqa_decode_bnhd, target="llvm")(q, k, v, 0.25)
    kk, vv = (x.double().permute(0, 2, 1, 3).repeat_interleave(H // HKV, 1) for x in (k, v))
    s = torch.einsum("bhd,bhnd->bhn", q.double(), kk) * 0.25
    want = torch.einsum("bhn,bhnd->bhd", torch.softmax(s, -1), vv)
    assert relative_error(out, want) < 1e-2


@needs_nvcc
@pytest.mark.parametrize("group, knobs", [(4, {}), (4, {"copy": "cp.async"}),
                                          (64, {}), (4, {"mma": "fma"})])
def test_the_strided_caches_compile_for_sm90a(group, knobs):
    """Bulk copies through 4-D tensor maps (coordinates: column, key, kv-head, batch), or
    ``cp.async`` rows ``HKV · D`` apart, in every sweep."""
    sizes = {**DECODE, "H": 2 * group}
    ptx = _decode(decode_bnhd, cluster=4, **knobs).ptx(**sizes)
    tma = knobs.get("copy", "tma") == "tma" and knobs.get("mma") != "fma"
    assert ("cp.async.bulk.tensor.4d.shared::cluster.global" in ptx) == tma
    assert "cp.async.bulk.tensor.3d" not in ptx
    assert ("cp.async.cg.shared.global" in ptx) == (not tma)


@pytest.mark.gpu
@pytest.mark.parametrize("group, knobs", [(4, {}), (4, {"copy": "cp.async"}), (1, {}),
                                          (64, {}), (4, {"mma": "fma"}),
                                          (8, {"cluster": 2, "splits": 3}),
                                          (4, {"copy": "cp.async", "warps": 1})])
def test_strided_cluster_decode_matches_float64_on_the_gpu(group, knobs):
    """A [B, N, HKV, D] cache (values up to ±30, a key count that leaves every warp a ragged
    last block), outputs poisoned, against float64; and ``tf.compile`` takes it to a Hopper
    template."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    g = torch.Generator(device="cuda").manual_seed(group)
    B, HKV, N, D = 2, 2, 2777, 128
    H = HKV * group
    q = (torch.randn(B, H, 1, D, device="cuda", generator=g) * 2).bfloat16()
    k, v = ((torch.randn(B, N, HKV, D, device="cuda", generator=g) * 10).bfloat16()
            for _ in range(2))
    scale = 1 / math.sqrt(D)
    kk, vv = (x.double().permute(0, 2, 1, 3).repeat_interleave(group, 1) for x in (k, v))
    ref = torch.softmax(q.double() @ kk.transpose(-1, -2) * scale, -1) @ vv
    out = torch.full_like(q, float("nan"))
    _decode(decode_bnhd, **{"cluster": 4, **knobs})(q, k, v, scale=scale, out=out)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err
    made = tf.compile(decode_bnhd)
    origin = made.schedule_origin(B=1, H=H, HKV=HKV, M=1, N=N, D=D)
    # the cluster decode, or for a large group its heads packed as the rows of the prefill
    # template's tiles (``packed_rows``): not the split update on the keys' rows
    assert "cluster_decode" in origin or "packed group rows" in origin, origin
    out = torch.full_like(q[:1], float("nan"))
    made(q[:1], k[:1].contiguous(), v[:1].contiguous(), scale, out=out)
    err = ((out.double() - ref[:1]).norm() / ref[:1].norm()).item()
    assert err < 1e-2, err
