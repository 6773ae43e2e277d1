"""A decode written without its query axis (``q[b, h, d]``) — and without a kv-head axis where
every head reads one cache (``k[b, j, d]``) — run on the cluster decode of the same program with
unit axes added (``schedule_templates/lifted_kernel.py``): routed where the decode written with
all four axes is, the caller's tensors viewed, never copied; on the GPU against float64."""

import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from benchmarks.user_kernels import gqa_decode, mqa_decode
from tests.helpers import fresh_seed, needs_nvcc, relative_error

HOPPER = "cuda:sm_90a"


def test_three_axis_decodes_take_the_cluster_decode_where_four_axes_do():
    three, grouped = tf.compile(mqa_decode, HOPPER), tf.compile(gqa_decode, HOPPER)
    four = tf.compile(K.gqa_attention, HOPPER)
    for B, H, HKV, N in ((1, 8, 1, 131072), (2, 16, 1, 8192), (1, 32, 8, 32768)):
        sizes = dict(B=B, H=H, N=N, D=128)
        written = four.schedule_origin(**sizes, HKV=HKV, M=1)
        assert written.startswith("cluster_decode"), written
        made = three.schedule_origin(**sizes) if HKV == 1 else \
            grouped.schedule_origin(**sizes, HKV=HKV)
        assert made == f"lifted to four axes; {written}", made
    # where the four-axis decode leaves the cluster kernel (64 pairs), so does the lifted one
    assert three.schedule_origin(B=64, H=8, N=4096, D=128) == "template defaults"
    assert "lifted" not in grouped.schedule_origin(B=16, H=32, HKV=8, N=4096, D=128)


@pytest.mark.parametrize("kernel, H, HKV", [(mqa_decode, 16, 1), (gqa_decode, 32, 8)])
def test_a_lifted_decode_is_the_four_axis_decodes_kernel(kernel, H, HKV):
    """The cluster kernel of the lifted program is the one of the decode written with four axes
    (run against float64 on the GPU there) but for the names of the unit sizes' macros, which
    nothing reads."""
    sizes = dict(B=1, H=H, N=32768, D=128)
    lifted = tf.compile(kernel, HOPPER).source(**sizes, **({"HKV": HKV} if HKV > 1 else {}))
    four = tf.compile(K.gqa_attention, HOPPER).source(**sizes, HKV=HKV, M=1)
    renamed = {"TF_SIZE_ONE_Q": "TF_SIZE_M", "TF_SIZE_ONE_KV": "TF_SIZE_HKV"}
    for name, was in renamed.items():
        assert lifted.count(name) <= 1 and four.count(was) == 1   # defined, never read
        lifted = lifted.replace(name, was)
    assert lifted == four


def test_a_lifted_kernel_views_the_callers_tensors_on_the_cpu():
    """The wrapper alone, around the lifted program compiled for the CPU: 3-D q and cache, the
    output given (poisoned) and made, against float64; a wrong shape is refused by name."""
    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.errors import CallError
    from tensorfuse.schedule_templates.lifted_kernel import LiftedKernel
    from tensorfuse.schedule_templates.packed_lift import lift_to_four_axes

    program, inserts = lift_to_four_axes(mqa_decode.program, ("m", "l", "o"), "j")
    made = LiftedKernel(mqa_decode.program, inserts,
                        tf.compile(ProgramKernel(program), "llvm"), tf.get_target("llvm"))
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(2, 6, 16, generator=g) * 3).bfloat16()
    k, v = ((torch.randn(2, 37, 16, generator=g) * 3).bfloat16() for _ in "kv")
    want = _reference(q, k[:, None], v[:, None], 0.25)
    out = torch.full((2, 6, 16), float("nan"), dtype=torch.bfloat16)
    assert made(q, k, v, 0.25, out=out) is out
    assert relative_error(out, want) < 1e-2, seed
    assert relative_error(made(q, k, v, 0.25), want) < 1e-2, seed
    assert made.schedule_origin(B=2, H=6, N=37, D=16).startswith("lifted to four axes; ")
    with pytest.raises(CallError, match="k"):
        made(q, k[:, :, :8], v, 0.25)


def test_a_lifted_fast_call_views_the_callers_tensors_for_the_inner_fast_call():
    """A repeated signature's fast call: the caller's tensors and new (or given) outputs viewed
    at the shapes the first call gave the inner kernel, handed to the inner kernel's fast call by
    name; a strided tensor (no view) declines, and a stale inner fast call makes this one stale,
    so that the checked path makes both again."""
    from tensorfuse.schedule_templates.lifted_kernel import LiftedFastCall

    given = []

    def inner_fast(args, kwargs):
        given.append(kwargs)
        return None if inner_fast.stale else kwargs["out"]
    inner_fast.stale = False
    fast = LiftedFastCall([("q", 0, True), ("k", 1, True), ("scale", "scale", float)],
                          [("o", (2, 6, 16), "bf16")], "cpu", [0], [],
                          {"q": (2, 1, 6, 16), "k": (2, 1, 37, 16)}, [(2, 1, 6, 16)],
                          inner_fast)
    q, k = torch.randn(2, 6, 16).bfloat16(), torch.randn(2, 37, 16).bfloat16()
    out = fast((q, k), {"scale": 1})
    sent = given[-1]
    assert out.shape == (2, 6, 16) and out.dtype == torch.bfloat16
    assert sent["q"].shape == (2, 1, 6, 16) and sent["q"].data_ptr() == q.data_ptr()
    assert sent["k"].shape == (2, 1, 37, 16) and sent["scale"] == 1.0
    assert type(sent["scale"]) is float
    assert sent["out"].shape == (2, 1, 6, 16) and sent["out"].data_ptr() == out.data_ptr()
    mine = torch.empty(2, 6, 16, dtype=torch.bfloat16)
    assert fast((q, k), {"scale": 1, "out": mine}) is mine
    assert given[-1]["out"].data_ptr() == mine.data_ptr()
    assert fast((q.transpose(0, 1).contiguous().transpose(0, 1), k), {"scale": 1}) is None
    assert len(given) == 2 and not fast.stale
    inner_fast.stale = True
    assert fast((q, k), {"scale": 1}) is None and fast.stale
    assert fast.calls == 3


@needs_nvcc
def test_a_lifted_decode_compiles_to_the_cluster_kernel():
    ptx = tf.compile(mqa_decode, HOPPER).ptx(B=1, H=8, N=131072, D=128)
    assert "mma.sync" in ptx and "cp.async.bulk.tensor" in ptx


def _reference(q, k, v, scale):
    """float64 decode: q [B, H, D] over k, v [B, HKV, N, ·]."""
    group = q.shape[1] // k.shape[1]
    keys, values = (t.double().repeat_interleave(group, 1) for t in (k, v))
    s = torch.einsum("bhd,bhnd->bhn", q.double(), keys) * scale
    return torch.einsum("bhn,bhnd->bhd", torch.softmax(s, -1), values)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, B, H, HKV, N, D", [(mqa_decode, 1, 8, 1, 50001, 128),
                                                     (gqa_decode, 2, 32, 8, 7777, 64)])
def test_a_lifted_decode_on_the_gpu_against_float64(kernel, B, H, HKV, N, D):
    made = tf.compile(kernel)
    sizes = dict(B=B, H=H, N=N, D=D, **({} if kernel is mqa_decode else {"HKV": HKV}))
    assert made.schedule_origin(**sizes).startswith("lifted to four axes; cluster_decode")
    for _ in range(2):   # fresh inputs each call: nothing kept from the last
        seed = fresh_seed()
        g = torch.Generator().manual_seed(seed)
        q = (torch.randn(B, H, D, generator=g) * 3).bfloat16().cuda()
        k, v = ((torch.randn(B, HKV, N, D, generator=g) * 3).bfloat16().cuda() for _ in "kv")
        out = torch.full((B, H, D), float("nan"), dtype=torch.bfloat16, device="cuda")
        cache = (k[:, 0], v[:, 0]) if kernel is mqa_decode else (k, v)
        want = _reference(q.cpu(), k.cpu(), v.cpu(), 0.125)
        assert made(q, *cache, 0.125, out=out) is out
        assert relative_error(out, want) < 1e-2, seed
        assert relative_error(made(q, *cache, 0.125), want) < 1e-2, seed
    _ran_on_lifted_fast_calls(made, 2)


def _ran_on_lifted_fast_calls(made, calls: int) -> None:
    """``tf.compile``'s kernel ran ``calls`` calls on the lifted kernel's fast calls (repeated
    signatures: with ``out=`` and without)."""
    from tensorfuse.schedule_templates.lifted_kernel import LiftedFastCall

    fast = [x for x in made._fast.values() if isinstance(x, LiftedFastCall)]
    assert len(fast) == 2 and sum(x.calls for x in fast) == calls, made._fast


@pytest.mark.gpu
def test_a_packed_three_axis_decode_repeats_on_its_fast_call_against_float64():
    """64 heads on one cache, written with three axes: packed group rows on the Hopper attention
    kernel, repeated calls on the lifted fast call (the checked path's binding, unit axes and
    views skipped: host-bound at 0.099 ms by do_bench against 0.054 of GPU time, H200)."""
    made = tf.compile(mqa_decode)
    B, H, N, D = 2, 64, 4096, 128
    assert made.schedule_origin(B=B, H=H, N=N, D=D).startswith("packed group rows")
    for _ in range(2):
        seed = fresh_seed()
        g = torch.Generator().manual_seed(seed)
        q = (torch.randn(B, H, D, generator=g) * 3).bfloat16().cuda()
        k, v = ((torch.randn(B, 1, N, D, generator=g) * 3).bfloat16().cuda() for _ in "kv")
        want = _reference(q.cpu(), k.cpu(), v.cpu(), 0.125)
        out = torch.full((B, H, D), float("nan"), dtype=torch.bfloat16, device="cuda")
        assert made(q, k[:, 0], v[:, 0], 0.125, out=out) is out
        assert relative_error(out, want) < 1e-2, seed
        assert relative_error(made(q, k[:, 0], v[:, 0], 0.125), want) < 1e-2, seed
    _ran_on_lifted_fast_calls(made, 2)


@tf.kernel
def mqa_decode_temperature(q: T.Tensor["B", "H", "D", "bf16"], k: T.Tensor["B", "N", "D", "bf16"],
                           v: T.Tensor["B", "N", "D", "bf16"], temp: T.Tensor["H", "f32"]):
    """Multi-query decode with a float32 temperature per head: its output is float32."""
    b, h, j, d, e = T.axes("b h j d e")
    s = T.sum(q[b, h, d] * k[b, j, d], over=d) / temp[h]
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, j, e], over=j) / T.sum(p, over=j)


def test_a_float32_output_decode_takes_the_cluster_decode_and_stores_float32():
    """A float32 output (a float32 term of the score) no longer sends a decode to a program per
    head (each reading the whole cache): the cluster decode stores it unrounded."""
    made = tf.compile(mqa_decode_temperature, HOPPER)
    sizes = dict(B=16, H=64, N=16384, D=128)
    assert made.describe_plan(**sizes).splitlines()[0].endswith(
        "lifted to four axes; cluster_decode (the keys j split over a cluster per (batch, "
        "kv-head))")
    source = made.source(**sizes)
    assert "float* __restrict__ out" in source and "__float2bfloat16(oo" not in source


@pytest.mark.gpu
@pytest.mark.parametrize("B, H, N", [(1, 8, 50001), (16, 64, 4099)])
def test_a_float32_output_decode_on_the_gpu_against_float64(B, H, N):
    made = tf.compile(mqa_decode_temperature)
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, H, 128, generator=g) * 3).bfloat16().cuda()
    k, v = ((torch.randn(B, 1, N, 128, generator=g) * 3).bfloat16().cuda() for _ in "kv")
    temp = (torch.rand(H, generator=g) * 4 + 0.5).cuda()
    out = torch.full((B, H, 128), float("nan"), dtype=torch.float32, device="cuda")
    assert made(q, k[:, 0], v[:, 0], temp, out=out) is out
    q64 = q.cpu().double() / temp.cpu().double()[None, :, None]
    assert relative_error(out, _reference(q64, k.cpu(), v.cpu(), 1.0)) < 1e-2, seed


@tf.kernel
def shared_qk_attention(qk: T.Tensor["B", "S", "D", "bf16"], v: T.Tensor["B", "S", "D", "bf16"],
                        scale: T.f32):
    """Reformer's shared-QK attention: the queries are the keys (one tensor read twice)."""
    b, i, j, d, e = T.axes("b i j d e")
    s = T.sum(qk[b, i, d] * qk[b, j, d], over=d) * scale
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.cast(T.sum(p * v[b, j, e], over=j) / T.sum(p, over=j), "bf16")


def test_a_tensor_read_as_q_and_k_is_not_lifted_as_a_decode():
    """q·k of one tensor with itself (three axes, no heads): no unit axis can go where the
    tensor is q and not where it is k, so the decode lift declines (tf.compile crashed with a
    bare ValueError) and the Triton template runs it, its numbers against float64 on the CPU
    target."""
    from tensorfuse.schedule_templates.packed_lift import lift_to_four_axes

    assert lift_to_four_axes(shared_qk_attention.program, ("m", "out_sum", "out_sum_2"),
                             "j") is None
    plan = tf.compile(shared_qk_attention, HOPPER).describe_plan(B=2, S=4096, D=128)
    assert "rows i (4096)" in plan and "feature held whole: 128" in plan, plan
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    x, v = ((torch.randn(2, 37, 16, generator=g) * 4).bfloat16() for _ in "xv")
    s = x.double() @ x.double().transpose(-1, -2) * 0.25
    got = tf.compile(shared_qk_attention, "llvm")(x, v, 0.25)
    assert relative_error(got, torch.softmax(s, -1) @ v.double()) < 1e-2, seed
