"""Attention whose p·v runs over another head dim than q·k (DeepSeek's 192 and 128): the Hopper
template's plan and sm_90a code with the values and the output ``DV`` wide (in the library's
layout and in ``[B, S, H, D]``), its defaults by both dims, its refusals naming the dim; the CPU
target and the row-tile plan for dims the Hopper template does not take; every case against a
float64 reference of the math as written on the GPU (marked ``gpu``)."""
from __future__ import annotations

import math

import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import ScheduleError
from tensorfuse.kernels import softmax_attend
from tensorfuse.schedule_templates.hopper_attention_plan import (HopperKnobs, check_hopper,
                                                                 default_hopper_knobs,
                                                                 knob_choices,
                                                                 plan_hopper_attention,
                                                                 shared_bytes)
from tests.helpers import fresh_seed, needs_nvcc, relative_error
from tests.schedule_templates.permuted_layouts import two_head_dims, two_head_dims_case
from tests.schedule_templates.test_hopper_attention import assert_consumers_do_not_spill

CHAIN = ("m", "l", "o")
SIZES = dict(B=2, H=16, M=4096, N=4096, DQK=192, DV=128)


@tf.kernel
def bshd_two_head_dims(q: T.Tensor["B", "M", "H", "DQK", "bf16"],
                       k: T.Tensor["B", "N", "H", "DQK", "bf16"],
                       v: T.Tensor["B", "N", "H", "DV", "bf16"], scale: T.f32):
    """Causal (bottom-right), q·k over DQK and p·v over DV, on [B, S, H, D] tensors."""
    b, i, h, j, d, e = T.axes("b i h j d e")
    s = T.sum(q[b, i, h, d] * k[b, j, h, d], over=d) * scale
    s = T.where(i + T.size("N") - T.size("M") >= j, s, -T.inf)
    return softmax_attend(s, v[b, j, h, e], j)


KERNELS = {"bhsd": (two_head_dims, "bhid", "bhjd"), "bshd": (bshd_two_head_dims, "bihd", "bjhd")}


def _plan(kernel):
    return plan_hopper_attention(kernel.program, CHAIN, "j")


def _hopper(kernel, **knobs):
    sch = tf.schedule(kernel, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    return sch.apply_template("hopper_attention", **knobs).compile()


def case(name: str, B: int, H: int, M: int, N: int, DQK: int, DV: int, generator,
         width: float = 1.0):
    """Fresh bf16 q, k, v in the kernel's layout and the float64 causal (bottom-right)
    ``softmax(q·kᵀ · DQK^-½) · v`` by einsum over that layout."""
    _, q_axes, k_axes = KERNELS[name]
    extent = dict(b=B, h=H, i=M, j=N)
    q = torch.randn(*(dict(extent, d=DQK)[a] for a in q_axes), generator=generator) * width
    k = torch.randn(*(dict(extent, d=DQK)[a] for a in k_axes), generator=generator) * width
    v = torch.randn(*(dict(extent, d=DV)[a] for a in k_axes), generator=generator) * width
    q, k, v = (x.bfloat16() for x in (q, k, v))
    scale = DQK ** -0.5
    s = torch.einsum(f"{q_axes},{k_axes}->bhij", q.double(), k.double()) * scale
    keep = torch.arange(M)[:, None] + N - M >= torch.arange(N)[None]
    p = torch.softmax(s.masked_fill(~keep, -math.inf), -1)
    return {"q": q, "k": k, "v": v}, scale, torch.einsum(f"bhij,{k_axes}->{q_axes}", p,
                                                         v.double())


@pytest.mark.parametrize("name", list(KERNELS))
def test_the_plan_keeps_both_head_dims(name):
    plan = _plan(KERNELS[name][0])
    assert plan.chain.dims[5] == "DQK" and plan.chain.dv == "DV"
    assert plan.chain.strides(2, SIZES)["h"] == (128 if name == "bshd" else 4096 * 128)
    assert plan.chain.strides(0, SIZES)["h"] == (192 if name == "bshd" else 4096 * 192)
    sch = tf.schedule(KERNELS[name][0], "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    text = sch.apply_template("hopper_attention").plan(**SIZES)
    assert "out[B, H, M, DV]" in text and "q·k over DQK, p·v over DV" in text


@pytest.mark.parametrize("dims, block_n", [((192, 128), 128), ((256, 128), 64),
                                           ((128, 256), 64), ((192, 192), 64), ((128, 64), 128)])
def test_defaults_fit_both_head_dims(dims, block_n):
    """The values' dim sets the registers (o is DV/2 a thread), both set the shared memory:
    192/128 keeps 128-key blocks in two slots (208 KiB), 256/128 would need 256 KiB there."""
    plan = _plan(two_head_dims)
    sizes = dict(SIZES, DQK=dims[0], DV=dims[1])
    knobs = default_hopper_knobs(plan, sizes)
    assert knobs.block_n == block_n
    check_hopper(plan, knobs, sizes, 227 * 1024)
    assert shared_bytes(HopperKnobs(), 192) - shared_bytes(HopperKnobs(), 192, DV=128) == \
        2 * 128 * 64 * 2   # two value slots, 64 columns narrower
    for block_n in knob_choices(plan, sizes)["block_n"]:   # what tuning tries fits
        check_hopper(plan, HopperKnobs(block_n=block_n), sizes, 227 * 1024)


def test_head_dims_the_template_does_not_take_are_refused_by_name():
    plan = _plan(two_head_dims)
    with pytest.raises(ScheduleError, match=r"head dim DV=100: .*multiples of 8 from 32 to 256"):
        check_hopper(plan, HopperKnobs(), dict(SIZES, DV=100), 227 * 1024)
    with pytest.raises(ScheduleError, match=r"head dim DQK=24"):
        check_hopper(plan, HopperKnobs(), dict(SIZES, DQK=24), 227 * 1024)
    with pytest.raises(ScheduleError, match=r"at head dim 256/128 needs \d+ bytes"):
        check_hopper(plan, HopperKnobs(block_n=128), dict(SIZES, DQK=256), 227 * 1024)


@needs_nvcc
@pytest.mark.parametrize("name, dims", [("bhsd", (192, 128)), ("bshd", (192, 128)),
                                        ("bhsd", (128, 256)), ("bhsd", (384, 128))])
def test_the_sm90a_code_multiplies_each_product_at_its_own_dim(name, dims):
    """q·kᵀ runs K = DQK in 16-wide steps on block_n-wide wgmma; p·v is a wgmma DV wide; the
    values are copied DV wide (their own tensor map); the consumers do not spill."""
    f = _hopper(KERNELS[name][0])
    sizes = dict(SIZES, M=1000, N=1000, DQK=dims[0], DV=dims[1])
    source = f.source(**sizes)
    assert f"#define D_ {dims[0]}\n#define DV_ {dims[1]}" in source
    assert "#define V_BYTES (BN * DV_ * 2)" in source and "o[DV_ / 2]" in source
    block_n = default_hopper_knobs(_plan(KERNELS[name][0]), sizes).block_n
    assert f"tf_wgmma_rs_m64n{dims[1]}k16(o, p[ks]" in source
    assert f"tf_wgmma_kk_m64n{block_n}k16" in source
    assert_consumers_do_not_spill(source)


@tf.kernel
def sized_scale(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                v: T.Tensor["B", "H", "N", "D", "bf16"]):
    """Full attention scaled by the head dim's size read in the score (D^-½)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * T.rsqrt(T.cast(T.size("D"), "f32"))
    return softmax_attend(s, v[b, h, j, e], j)


@needs_nvcc
@pytest.mark.parametrize("name, dims, tiles", [("bhsd", (96, 96), (128, 128)),
                                               ("bshd", (80, 80), (128, 128)),
                                               ("bhsd", (160, 96), (192, 128)),
                                               ("bshd", (40, 72), (64, 128))])
def test_head_dims_between_swizzle_atoms_are_held_padded(name, dims, tiles):
    """A head dim that is a multiple of 8 but not of 64 runs on the Hopper template in tiles of
    the next 128-byte swizzle atom: the tiles' dims in the code, the tensors' rows beside them
    (the sizes an expression reads, the output's row stride, its 16-byte pieces past the row
    not stored, the log-sum-exp's row), the plan saying so; the consumers do not spill."""
    f = tf.compile(KERNELS[name][0], "cuda:sm_90a")
    sizes = dict(SIZES, M=1000, N=1000, DQK=dims[0], DV=dims[1])
    assert f.schedule_origin(**sizes).startswith("hopper_attention")
    assert f"head dims {dims[0]}/{dims[1]} held as {tiles[0]}/{tiles[1]}" in \
        f.describe_plan(**sizes)
    source = f.source(**sizes)
    assert f"#define D_ {tiles[0]}\n#define DV_ {tiles[1]}" in source
    assert f"#define ROW_D_ {dims[0]}\n#define OUT_DV_ {dims[1]}" in source
    assert "#define TF_SIZE_DQK ROW_D_" in source and "#define TF_SIZE_DV OUT_DV_" in source
    assert "if (32 * g + 8 * (lane % 4) < OUT_DV_) dst[4 * g] = pending[x][g];" in source
    if name == "bshd":   # rows and heads of the output by its strides, OUT_DV_ elements apart
        assert "OUT_AT(w.bh / H_, w.bh % H_, row)" in source and "(long)OUT_DV_" in source
    else:
        assert "((long)w.bh * M_ + row) * OUT_DV_" in source
    # p·v multiplies the values' columns alone (wgmma's N the tensor's dim, not the tile's):
    # the accumulator's first registers
    assert f"tf_wgmma_rs_m64n{dims[1]}k16(*reinterpret_cast<float (*)[{dims[1] // 2}]>(o), " \
        "p[ks]" in source
    # q·kᵀ runs only the 16-column steps that hold the tensors' columns (TMA's zeros past them)
    assert "for (int ks = 0; ks < (ROW_D_ + 15) / 16; ++ks)" in source
    assert_consumers_do_not_spill(source)
    # the same tiles without padding keep their source (a whole atom is the tensor's row)
    whole = f.source(**dict(sizes, DQK=tiles[0], DV=tiles[1]))
    assert "ROW_D_" not in whole and "OUT_DV_" not in whole
    assert "for (int ks = 0; ks < D_ / 16; ++ks)" in whole
    assert f"tf_wgmma_rs_m64n{tiles[1]}k16(o, p[ks]" in whole


def test_tf_compile_takes_the_hopper_template_for_192_and_128():
    f = tf.compile(two_head_dims, "cuda:sm_90a")
    assert f.schedule_origin(**SIZES).startswith("hopper_attention")


def test_dims_the_hopper_template_does_not_take_run_on_the_row_tiles_and_the_cpu():
    """q·k over 48 and p·v over 32: the CPU target against float64; the row-tile plan holds both
    sizes (the interpreter check of ``permuted_layouts`` runs its numbers)."""
    seed = fresh_seed()
    x, want = two_head_dims_case(torch.Generator().manual_seed(seed))
    assert relative_error(tf.compile(two_head_dims, "llvm")(**x, scale=0.2), want) < 1e-2, seed
    small = dict(SIZES, DQK=20, DV=12)
    sch = tf.schedule(two_head_dims, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    assert "feature held whole: e 12 and d 20" in sch.apply_template("attention").plan(**small)
    chosen = tf.compile(two_head_dims, "cuda:sm_90a").for_sizes(**small)
    assert type(chosen).__name__ == "TritonKernel"     # not TVM's default schedule


@pytest.mark.gpu
@pytest.mark.parametrize("name, M, N, dims", [
    ("bhsd", 1000, 1000, (192, 128)), ("bhsd", 333, 2048, (192, 128)),
    ("bshd", 777, 777, (192, 128)), ("bhsd", 517, 517, (256, 128)),
    ("bhsd", 300, 700, (128, 256)), ("bshd", 4096, 4096, (192, 128)),
    ("bhsd", 1000, 1000, (96, 96)), ("bshd", 777, 777, (80, 80)),
    ("bhsd", 333, 2048, (160, 96)), ("bshd", 517, 517, (40, 72)),
    ("bhsd", 300, 700, (224, 32)), ("bhsd", 777, 1000, (384, 128)),
    ("bshd", 517, 517, (320, 64))])
def test_two_head_dims_match_float64_on_the_gpu(name, M, N, dims):
    """tf.compile as a user calls it (the Hopper template on sm_90a), fresh inputs at two value
    ranges, the output poisoned first: within bf16 tolerance (2e-2 of the largest output)."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    seed = fresh_seed()
    generator = torch.Generator().manual_seed(seed)
    f = tf.compile(KERNELS[name][0])
    for width in (1.0, 6.0):
        x, scale, want = case(name, 2, 4, M, N, *dims, generator, width)
        x = {n: t.cuda() for n, t in x.items()}
        out = torch.full(want.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        f(**x, scale=scale, out=out)
        assert f.schedule_origin(**{**dict(B=2, H=4, M=M, N=N), "DQK": dims[0],
                                    "DV": dims[1]}).startswith("hopper_attention")
        assert relative_error(out, want) < 2e-2, (name, width, relative_error(out, want), seed)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [96, 48])
def test_a_size_read_in_the_score_is_the_tensors_not_the_tiles_on_the_gpu(D):
    """D^-½ read from the head dim's size in the score is the tensor's (96), not the tiles'
    (128): against float64, outputs poisoned."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, 450, D, generator=g).bfloat16() for _ in range(3))
    s = torch.einsum("bhid,bhjd->bhij", q.double(), k.double()) * D ** -0.5
    want = torch.einsum("bhij,bhjd->bhid", torch.softmax(s, -1), v.double())
    f = tf.compile(sized_scale)
    out = torch.full(want.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    f(q.cuda(), k.cuda(), v.cuda(), out=out)
    assert f.schedule_origin(B=2, H=3, M=450, N=450, D=D).startswith("hopper_attention")
    assert relative_error(out, want) < 2e-2, (relative_error(out, want), seed)
