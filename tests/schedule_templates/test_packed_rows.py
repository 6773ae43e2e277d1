"""A group's query heads as the rows of one tile (``schedule_templates/packed_rows.py``): the
rewritten program checked against float64 through the CPU target (the rewrite is the math, on
any kernel of it), the views of the caller's tensors, the refusals, the sm_90a kernel's code;
on the GPU, the Hopper attention kernel on packed rows against float64."""

import pytest
import torch

import tensorfuse as tf
from tensorfuse.dsl.program import ProgramKernel
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.errors import CallError, ScheduleError
from tensorfuse.schedule_templates.auto import _packed_decodes
from tensorfuse.schedule_templates.fusion import Fusion
from tensorfuse.schedule_templates.packed_kernel import PackedRowsKernel, packed_attention
from tensorfuse.schedule_templates.packed_rows import pack_group_rows
from tensorfuse.targets import get_target
from benchmarks.user_kernels import gqa_decode, mqa_decode
from tests.helpers import fresh_seed, relative_error

CHAIN = ("m", "l", "o")
HOPPER = get_target("cuda:sm_90a")


def on_the_cpu(kernel, one_query=False):
    """The packed program compiled for the CPU target, called with the original's tensors."""
    packed = pack_group_rows(kernel.program, CHAIN, "j", one_query)
    inner = tf.compile(ProgramKernel(packed.program), "llvm")
    return PackedRowsKernel(kernel.program, packed, inner, get_target("llvm"))


def reference(q, k, v, scale, keep=None):
    """Grouped attention in float64 (q [B, H, M, D], k and v [B, HKV, N, ·])."""
    group = q.shape[1] // k.shape[1]
    keys, values = (t.double().repeat_interleave(group, 1) for t in (k, v))
    s = q.double() @ keys.transpose(-1, -2) * scale
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ values


def tensors(g, B=2, H=8, HKV=2, M=1, N=37, D=16, DV=None):
    q = (torch.randn(B, H, M, D, generator=g) * 3).bfloat16()
    k = (torch.randn(B, HKV, N, D, generator=g) * 3).bfloat16()
    v = torch.randn(B, HKV, N, DV or D, generator=g).bfloat16()
    return q, k, v


@pytest.mark.parametrize("H, HKV, M", [(8, 2, 1), (12, 1, 1), (4, 4, 1), (8, 2, 3)])
def test_packed_rows_are_the_same_attention(H, HKV, M):
    """GQA and MQA decode, MHA (groups of one), and several query tokens over one cache."""
    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v = tensors(g, H=H, HKV=HKV, M=M)
    out = on_the_cpu(K.gqa_attention)(q, k, v, 0.25)
    assert out.shape == (2, H, M, 16)
    assert relative_error(out, reference(q, k, v, 0.25)) < 1e-2


def test_one_query_token_packs_masks_from_the_bottom_right():
    """Causal and sliding-window decodes read the query index in their masks; at one query token
    it is 0 and the mask reads the keys alone (the window keeps the last 5)."""
    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v = tensors(g, H=4, HKV=4)
    causal = on_the_cpu(K.causal_attention, one_query=True)(q, k, v, 0.25)
    assert relative_error(causal, reference(q, k, v, 0.25)) < 1e-2
    window = on_the_cpu(K.sliding_window_attention, one_query=True)(q, k, v, 0.25, 5)
    keep = torch.arange(37) >= 37 - 5
    assert relative_error(window, reference(q, k, v, 0.25, keep)) < 1e-2
    with pytest.raises(ScheduleError, match="query index"):
        pack_group_rows(K.causal_attention.program, CHAIN, "j")   # several query rows


def test_a_decode_over_a_static_cache_reads_its_lengths():
    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v = tensors(g)
    length = torch.tensor([5, 37], dtype=torch.int32)
    out = on_the_cpu(K.static_cache_attention, one_query=True)(q, k, v, length, 0.25)
    keep = torch.arange(37)[None, None, None, :] < length[:, None, None, None].long()
    assert relative_error(out, reference(q, k, v, 0.25, keep)) < 1e-2


def test_a_decode_in_bshd_packs_and_several_tokens_there_are_refused():
    @tf.kernel
    def bshd(q: T.Tensor["B", "M", "H", "D", "bf16"], k: T.Tensor["B", "N", "HKV", "D", "bf16"],
             v: T.Tensor["B", "N", "HKV", "D", "bf16"], scale: T.f32):
        b, i, h, j, d, e = T.axes("b i h j d e")
        hk = h // (T.size("H") // T.size("HKV"))
        s = T.sum(q[b, i, h, d] * k[b, j, hk, d], over=d) * scale
        return K.softmax_attend(s, v[b, j, hk, e], j)

    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v = tensors(g)
    made = on_the_cpu(bshd)
    out = made(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(),
               v.transpose(1, 2).contiguous(), 0.25)
    assert relative_error(out.transpose(1, 2), reference(q, k, v, 0.25)) < 1e-2
    q3 = tensors(g, M=3)[0]
    with pytest.raises(CallError, match="query rows one after another"):
        made(q3.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(),
             v.transpose(1, 2).contiguous(), 0.25)


@pytest.mark.parametrize("kernel", [mqa_decode, gqa_decode])
def test_a_decode_written_with_three_axes_is_lifted_then_packed(kernel):
    """``q[b, h, d]`` (no query axis) over ``k[b, j, d]`` (every head on one cache) or
    ``k[b, hk, j, d]``: unit axes added, the caller's tensors viewed with them."""
    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v = tensors(g, HKV=1 if kernel is mqa_decode else 2)
    if kernel is mqa_decode:
        made = on_the_cpu(kernel)
        out = made(q[:, :, 0], k[:, 0], v[:, 0], 0.25)
        assert made.packed.lifted == (("q", 2), ("k", 1), ("v", 1), ("out", 2))
    else:
        out = on_the_cpu(kernel)(q[:, :, 0], k, v, 0.25)
    assert out.shape == (2, 8, 16)
    assert relative_error(out, reference(q, k, v, 0.25)[:, :, 0]) < 1e-2


@tf.kernel
def gqa_temperature(q: T.Tensor["B", "H", "M", "D", "bf16"],
                    k: T.Tensor["B", "HKV", "N", "D", "bf16"],
                    v: T.Tensor["B", "HKV", "N", "D", "bf16"], temp: T.Tensor["H", "f32"]):
    """Grouped attention with a temperature per query head: a read of the head apart from q."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = T.sum(q[b, h, i, d] * k[b, hk, j, d], over=d) / temp[h]
    return T.cast(K.softmax_attend(s, v[b, hk, j, e], j), "bf16")


@pytest.mark.parametrize("H, HKV, M", [(8, 2, 1), (12, 1, 3), (6, 3, 2)])
def test_a_term_per_query_head_reads_the_head_of_each_packed_row(H, HKV, M):
    """Packed row r of kv-head hk is query head hk·G + r // M: a temperature per head (and
    several query tokens a head) comes out as written."""
    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v = tensors(g, H=H, HKV=HKV, M=M)
    temp = torch.rand(H, generator=g) * 4 + 0.25
    out = on_the_cpu(gqa_temperature)(q, k, v, temp)
    want = reference(q.double() / temp.double()[None, :, None, None], k, v, 1.0)
    assert relative_error(out, want) < 1e-2


def test_an_alibi_decode_packs_its_slope_per_head():
    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v = tensors(g, H=4, HKV=4)
    out = on_the_cpu(K.alibi_attention, one_query=True)(q, k, v, 0.25)
    slopes = torch.exp2(-8.0 * torch.arange(1, 5, dtype=torch.float64) / 4)
    bias = slopes[None, :, None, None] * (torch.arange(37) - 36).double()
    s = q.double() @ k.double().transpose(-1, -2) * 0.25 + bias
    assert relative_error(out, torch.softmax(s, -1) @ v.double()) < 1e-2


@tf.kernel
def gqa_alibi(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "HKV", "N", "D", "bf16"],
              v: T.Tensor["B", "HKV", "N", "D", "bf16"], scale: T.f32):
    """ALiBi over grouped heads: the slope is a function of the head and the head count."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    slope = T.exp2(-8.0 * (h + 1) / T.size("H"))
    s = T.sum(q[b, h, i, d] * k[b, hk, j, d], over=d) * scale + slope * (j - T.size("N") + 1)
    return K.softmax_attend(s, v[b, hk, j, e], j)


def test_a_head_term_packs_where_its_sizes_are_bound():
    """At one query token the head of a packed row needs no size but the rows; with several,
    the group's size H // HKV, and H here is no packed tensor's: refused with the reason."""
    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v = tensors(g, H=8, HKV=2)
    out = on_the_cpu(gqa_alibi, one_query=True)(q, k, v, 0.25)
    slopes = torch.exp2(-8.0 * torch.arange(1, 9, dtype=torch.float64) / 8)
    bias = slopes[None, :, None, None] * (torch.arange(37) - 36).double()
    keys, values = (t.double().repeat_interleave(4, 1) for t in (k, v))
    s = q.double() @ keys.transpose(-1, -2) * 0.25 + bias
    assert relative_error(out, torch.softmax(s, -1) @ values) < 1e-2
    with pytest.raises(ScheduleError, match="size H, which no tensor"):
        pack_group_rows(gqa_alibi.program, CHAIN, "j")


def test_what_reads_a_strided_query_is_refused():
    g = torch.Generator().manual_seed(fresh_seed())
    q, k, v = tensors(g, M=2)
    with pytest.raises(CallError, match="contiguous"):
        on_the_cpu(K.gqa_attention)(q.transpose(2, 3).contiguous().transpose(2, 3), k, v, 0.25)


def test_the_hopper_kernel_on_packed_rows_is_split_over_every_sm():
    """B16 with 64 query heads on one cache: 16 tiles of 64 rows, each cut along the keys over
    the 132 CTAs; the code has wgmma; several query tokens do not fit a kernel packed for one."""
    made = packed_attention(K.gqa_attention, Fusion(CHAIN, "j", 32), HOPPER, consumers=1)
    dims = dict(B=16, H=64, HKV=1, M=1, N=16384, D=128)
    origin = made.schedule_origin(**dims)
    assert origin.startswith("packed group rows; hopper_attention") and \
        "16 tiles: split schedule on 132 persistent CTAs" in origin, origin
    assert made.fits(**dims) and not made.fits(**{**dims, "M": 2})
    assert "wgmma.mma_async" in made.inner.ptx(B=16, HKV=1, R=64, N=16384, D=128)
    three = packed_attention(mqa_decode, Fusion(CHAIN, "j", 32), HOPPER, consumers=1)
    assert "16 tiles: split schedule" in three.schedule_origin(B=16, H=64, N=16384, D=128)
    # a causal mask stays a mask after packing (``j <= N - 1``), and splitting refuses masks:
    # the kernel keeps its own schedule, and a schedule asked for is still honoured
    causal = packed_attention(K.gqa_causal_attention, Fusion(CHAIN, "j", 32), HOPPER)
    assert "schedule=auto" in causal.schedule_origin(**dims)
    with pytest.raises(ScheduleError, match="a mask"):
        packed_attention(K.gqa_causal_attention, Fusion(CHAIN, "j", 32), HOPPER,
                         schedule="split").schedule_origin(**dims)


def test_the_decode_timeline_probe_still_finds_its_spots():
    """``tools/probe_decode_timeline.py`` patches the emitted source: each of its timer reads
    lands once in the packed decode's kernel, with one consumer warpgroup and with two."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[2] / "tools" / "probe_decode_timeline.py"
    spec = importlib.util.spec_from_file_location("probe_decode_timeline", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    dims = dict(B=16, H=64, HKV=1, M=1, N=16384, D=128)
    for knobs in (dict(consumers=1), dict(consumers=2)):
        made = packed_attention(K.gqa_attention, Fusion(CHAIN, "j", 32), HOPPER, **knobs)
        traced = probe.traced(made.source(**dims))
        for read in ("tr_q = tf_gtime()", "tr_first = tf_gtime()", "tr_loop = tf_gtime()",
                     "tr_merge = tf_gtime()", 'printf("TR '):
            assert traced.count(read) == 1, (knobs, read)


def test_tf_compile_routes_large_groups_on_one_cache_to_packed_rows():
    """Where packing measured faster than the cluster decode (2+ (batch, kv-head) pairs of
    32–64 heads, any of 65–128, no mask; a decode written without kv-head and query axes at
    any), and only there."""
    made = tf.compile(K.gqa_attention, "cuda:sm_90a")
    sizes = dict(B=16, H=64, HKV=1, M=1, N=16384, D=128)
    origin = made.schedule_origin(**sizes)
    assert origin.startswith("packed group rows") and "consumers=1" in origin, origin
    assert "stages=3" in origin, origin
    assert "consumers=2" in made.schedule_origin(**{**sizes, "H": 128})
    # a third key slot does not fit beside 128 rows of head dim 256: packed on two
    wide = made.schedule_origin(**{**sizes, "H": 128, "D": 256})
    assert wide.startswith("packed group rows") and "stages=2" in wide, wide
    for other in (dict(B=1, N=131072), dict(B=1, H=32, N=32768), dict(H=16)):
        assert made.schedule_origin(**{**sizes, **other}).startswith("cluster_decode"), other
    for other in (dict(B=2, H=32, N=65536), dict(B=2, N=65536), dict(B=1, H=128, N=131072)):
        assert made.schedule_origin(**{**sizes, **other}).startswith("packed group rows"), other
    # 64 (batch, kv-head) pairs of 4 heads: the split update (decode_plan.cluster_decode_pays)
    assert made.schedule_origin(**{**sizes, "B": 8, "H": 32, "HKV": 8}) == "template defaults"
    assert "packed" not in made.schedule_origin(**{**sizes, "H": 256})   # not measured
    assert "packed" not in tf.compile(K.gqa_causal_attention, "cuda:sm_90a").schedule_origin(
        **sizes)
    # written without the kv-head and query axes: packed at one batch too (the Triton split
    # update read the cache once per 16-row tile there), small groups not
    three = tf.compile(mqa_decode, "cuda:sm_90a")
    for B in (1, 16):
        assert three.schedule_origin(B=B, H=64, N=16384, D=128).startswith("packed group rows")
    assert "packed" not in three.schedule_origin(B=1, H=16, N=16384, D=128)
    # nothing is packed until a call at routed sizes: sizes alone turn the others away
    routes = _packed_decodes(K.gqa_attention, Fusion(CHAIN, "j", 32), HOPPER)
    assert [r.groups for r in routes] == [(32, 63)] * 2 + [(64, 64)] * 2 + [(65, 128)] * 2
    assert not routes[2].fits(**{**sizes, "B": 1, "N": 131072}) and routes[2]._made is None
    assert [r.min_pairs for r in _packed_decodes(mqa_decode, Fusion(CHAIN, "j", 32),
                                                 HOPPER)] == [1] * 6
    assert routes[2].fits(**sizes) and routes[2]._made and routes[4]._made is None


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [dict(B=16, H=64, HKV=1, M=1, N=2049, D=128),
                                   dict(B=4, H=96, HKV=2, M=1, N=3001, D=128),
                                   dict(B=5, H=40, HKV=1, M=1, N=1111, D=64),
                                   dict(B=16, H=64, HKV=1, M=1, N=2049, D=96)])
def test_a_routed_packed_decode_on_the_gpu_against_float64(sizes):
    seed = fresh_seed()
    q, k, v = (t.cuda() for t in tensors(torch.Generator().manual_seed(seed), **sizes))
    made = tf.compile(K.gqa_attention)
    assert made.schedule_origin(**sizes).startswith("packed group rows")
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    made(q, k, v, 0.125, out=out)
    assert relative_error(out, reference(q.cpu(), k.cpu(), v.cpu(), 0.125)) < 1e-2, seed


GPU_CASES = [(K.gqa_attention, dict(B=3, H=32, HKV=1, M=1, N=3001, D=128), {}),
             (K.gqa_attention, dict(B=2, H=32, HKV=8, M=1, N=2777, D=64), {}),
             (K.gqa_causal_attention, dict(B=2, H=128, HKV=1, M=1, N=1500, D=128),
              dict(consumers=2)),
             (K.gqa_attention, dict(B=1, H=16, HKV=2, M=4, N=5000, D=128), {}),
             # one or two tiles cut into ~130 pieces: merged in two rounds (groups of 8–12)
             (K.gqa_attention, dict(B=1, H=64, HKV=1, M=1, N=131071, D=128), {}),
             (K.gqa_causal_attention, dict(B=1, H=128, HKV=1, M=1, N=20011, D=128),
              dict(consumers=2, block_n=64)),
             (K.gqa_attention, dict(B=2, H=48, HKV=1, M=1, N=40000, D=64), {})]


@pytest.mark.gpu
def test_a_three_axis_mqa_decode_on_the_gpu_against_float64():
    seed = fresh_seed()
    q, k, v = (t.cuda() for t in tensors(torch.Generator().manual_seed(seed), B=4, H=64, HKV=1,
                                           N=4099, D=128))
    made = packed_attention(mqa_decode, Fusion(CHAIN, "j", 32), get_target("cuda"), consumers=1)
    out = made(q[:, :, 0], k[:, 0], v[:, 0], 0.125)
    assert relative_error(out, reference(q.cpu(), k.cpu(), v.cpu(), 0.125)[:, :, 0]) < 1e-2, seed


@pytest.mark.gpu
def test_a_routed_three_axis_mqa_decode_of_one_batch_on_the_gpu_against_float64():
    """``tf.compile`` of a decode written ``q[b, h, d]`` over ``k[b, j, d]``, one batch: packed
    (one tile cut over every SM, its pieces merged in two rounds), called twice."""
    made = tf.compile(mqa_decode)
    assert made.schedule_origin(B=1, H=64, N=30001, D=128).startswith("packed group rows")
    for _ in range(2):
        seed = fresh_seed()
        q, k, v = (t.cuda() for t in tensors(torch.Generator().manual_seed(seed), B=1, H=64,
                                               HKV=1, N=30001, D=128))
        out = torch.full((1, 64, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
        made(q[:, :, 0], k[:, 0], v[:, 0], 0.125, out=out)
        want = reference(q.cpu(), k.cpu(), v.cpu(), 0.125)[:, :, 0]
        assert relative_error(out, want) < 1e-2, seed


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, sizes, knobs", GPU_CASES)
def test_packed_rows_on_the_gpu_against_float64(kernel, sizes, knobs):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    q, k, v = (t.cuda() for t in tensors(g, sizes["B"], sizes["H"], sizes["HKV"], sizes["M"],
                                           sizes["N"], sizes["D"]))
    made = packed_attention(kernel, Fusion(CHAIN, "j", 32), get_target("cuda"),
                            one_query=sizes["M"] == 1, **{"consumers": 1, **knobs})
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    assert made(q, k, v, 0.125, out=out) is out
    assert relative_error(out, reference(q.cpu(), k.cpu(), v.cpu(), 0.125)) < 1e-2, seed


def test_a_decode_route_says_why_it_does_not_take_a_call():
    """The plan names each packed route's own reason: sizes outside its groups, or the
    program's refusal to pack — not a bare "it does not take these sizes"."""
    from tests.schedule_templates.test_lifted_kernel import mqa_decode_temperature

    plan = tf.compile(mqa_decode_temperature, "cuda:sm_90a").describe_plan(B=16, H=64, N=16384,
                                                                           D=128)
    reasons = [line for line in plan.splitlines() if line.startswith("  not packed group rows")]
    assert reasons and not any(r.endswith("it does not take these sizes") for r in reasons)
    assert any("these sizes are not one query token in groups of 65–128 heads" in r
               for r in reasons)
    assert any("groups of 64 heads" in r and "the program does not pack: it reads the query "
               "head apart from q·k" in r for r in reasons)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [dict(B=16, H=64, HKV=1, M=1, N=4099, D=128),
                                   dict(B=2, H=96, HKV=2, M=1, N=20011, D=128),
                                   dict(B=1, H=16, HKV=2, M=4, N=5000, D=128)])
def test_a_temperature_per_head_on_packed_rows_on_the_gpu_against_float64(sizes):
    """``tf.compile``'s packed route with a read of the query head (each row's own head's
    temperature), on the Hopper kernel: one query token and several."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    q, k, v = (t.cuda() for t in tensors(g, **sizes))
    temp = (torch.rand(sizes["H"], generator=g) * 4 + 0.25).cuda()
    made = packed_attention(gqa_temperature, Fusion(CHAIN, "j", 32), get_target("cuda"),
                            one_query=sizes["M"] == 1,
                            consumers=1 if sizes["H"] // sizes["HKV"] * sizes["M"] <= 64 else 2)
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    made(q, k, v, temp, out=out)
    want = reference(q.cpu().double() / temp.cpu().double()[None, :, None, None], k.cpu(),
                     v.cpu(), 1.0)
    assert relative_error(out, want) < 1e-2, seed


def test_tf_compile_keeps_a_head_term_decode_off_the_packed_route():
    """Packed, a term per head is applied per score element (the cluster decode's per tile was
    twice as fast): ``tf.compile`` leaves such decodes to the cluster decode."""
    sizes = dict(B=8, H=64, HKV=2, M=1, N=9001, D=128)
    made = tf.compile(gqa_alibi, "cuda:sm_90a")
    assert made.schedule_origin(**sizes).startswith("cluster_decode")
    assert tf.compile(K.gqa_attention, "cuda:sm_90a").schedule_origin(**sizes).startswith(
        "packed group rows")


@pytest.mark.gpu
def test_an_alibi_decode_over_grouped_heads_on_packed_rows_on_the_gpu_against_float64():
    sizes = dict(B=8, H=64, HKV=2, M=1, N=9001, D=128)
    made = packed_attention(gqa_alibi, Fusion(CHAIN, "j", 32), get_target("cuda"), consumers=1)
    seed = fresh_seed()
    q, k, v = (t.cuda() for t in tensors(torch.Generator().manual_seed(seed), **sizes))
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    made(q, k, v, 0.125, out=out)
    slopes = torch.exp2(-8.0 * torch.arange(1, 65, dtype=torch.float64) / 64)
    bias = slopes[None, :, None, None] * (torch.arange(9001) - 9000).double()
    keys, values = (t.cpu().double().repeat_interleave(32, 1) for t in (k, v))
    s = q.cpu().double() @ keys.transpose(-1, -2) * 0.125 + bias
    assert relative_error(out, torch.softmax(s, -1) @ values) < 1e-2, seed
