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
        assert made(q, *cache, 0.125, out=out) is out
        assert relative_error(out, _reference(q.cpu(), k.cpu(), v.cpu(), 0.125)) < 1e-2, seed


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
