"""The Hopper GEMM template: the pattern it recognises and what it refuses, its knobs and checks,
the sm_90a code nvcc makes of it (wgmma, TMA, mbarriers, setmaxnreg, multicast; no spills) and
``tf.compile``'s choice of it — on the CPU; and every layout, epilogue and knob against float64
on an H100 (marked ``gpu``)."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.contraction import batched_product
from benchmarks.gemm import KERNELS, matmul_f16_f32, matmul_nk
from tests.helpers import needs_nvcc
from tensorfuse import dsl as T
from tensorfuse.errors import ScheduleError
from tensorfuse.schedule_templates.hopper_gemm_plan import (GemmKnobs, check_gemm,
                                                            default_gemm_knobs, group_rows,
                                                            plan_hopper_gemm, shared_bytes,
                                                            wave_operand_rows, with_knobs)
from tensorfuse.targets.cuda.hopper_gemm import GEMM_PTX, MULTICAST_PTX, kernel_arguments
from tests.schedule_templates.test_hopper_attention import (_ptxas_report,
                                                           assert_consumers_do_not_spill)

SIZES = dict(M=1000, K=520, N=776)


def hopper(kernel, **knobs):
    return tf.schedule(kernel, "cuda:sm_90a").apply_template("hopper_gemm", **knobs).compile()


def test_plan_reads_layouts_epilogues_and_gated_pairs():
    plain = plan_hopper_gemm(K.matmul.program)
    assert (plain.a, plain.weights, plain.b_k_major) == ("x", ("w",), False)
    assert plain.dims == ("M", "K", "N") and plain.out_dtype == "bf16"
    linear = plan_hopper_gemm(K.linear.program)
    assert linear.b_k_major and linear.tensors == (("bias", "bf16"),)
    assert "bias[j]" in linear.describe()
    gated = plan_hopper_gemm(K.swiglu_gate.program)
    assert gated.weights == ("w1", "w3") and len(gated.sums) == 2
    mixed = plan_hopper_gemm(matmul_f16_f32.program)
    assert (mixed.dtype, mixed.out_dtype) == ("f16", "f32")


def test_plan_reads_a_batch_axis_on_either_operand():
    """``torch.bmm`` and its kin: a batch axis on the rows, the weights, or both (the other
    operand shared by every batch), read as 3-D tensor maps; the epilogue may read it too."""
    for kernel, a_batched, weights_batched, k_major in (
            (batched_product, True, True, False), (batched, True, False, False),
            (shared_rows, False, True, True), (two_batch_axes, True, True, True),
            (batched_nk_residual, True, True, True)):
        plan = plan_hopper_gemm(kernel.program)
        assert (plan.a_batched, plan.weights_batched, plan.b_k_major) == \
            (a_batched, weights_batched, k_major), kernel.name
        assert plan.batch[0][1] in ("Z", "B") and plan.dims[1] in ("K", "D")
    assert "r[z, i, j]" in plan.describe()
    # weights of their own per batch: 3-D boxes, no cluster (multicast copies 2-D tiles)
    sizes = dict(Z=4, M=4096, K=1024, N=4096)
    assert with_knobs(plan, sizes, {})[0].cluster == 1
    with pytest.raises(ScheduleError, match="3-D boxes"):
        check_gemm(plan, GemmKnobs(cluster=2), sizes)
    shared_weights = plan_hopper_gemm(batched.program)
    assert with_knobs(shared_weights, dict(B=4, M=4096, K=1024, N=4096), {})[0].cluster == 2


@tf.kernel
def batched(x: T.Tensor["B", "M", "K", "bf16"], w: T.Tensor["K", "N", "bf16"]):
    b, i, j, k = T.axes("b i j k")
    return T.sum(x[b, i, k] * w[k, j], over=k)


@tf.kernel
def batched_nk_residual(a: T.Tensor["Z", "M", "K", "bf16"], b: T.Tensor["Z", "N", "K", "bf16"],
                        r: T.Tensor["Z", "M", "N", "bf16"]):
    """A product per batch, its weights stored [Z, N, K], scaled, plus a residual of the batch."""
    z, i, k, j = T.axes("z i k j")
    return T.sum(a[z, i, k] * b[z, j, k], over=k) * 0.5 + r[z, i, j]


@tf.kernel
def shared_rows(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["Z", "N", "K", "bf16"]):
    """The same rows against each batch's weights (several adapters' projections)."""
    z, i, k, j = T.axes("z i k j")
    return T.sum(x[i, k] * w[z, j, k], over=k)


@tf.kernel
def gated_batched_apart(x: T.Tensor["Z", "M", "K", "bf16"], w1: T.Tensor["Z", "K", "N", "bf16"],
                        w3: T.Tensor["K", "N", "bf16"]):
    z, i, j, k = T.axes("z i j k")
    return T.sum(x[z, i, k] * w1[z, k, j], over=k) * T.sum(x[z, i, k] * w3[k, j], over=k)


@tf.kernel
def scalar_epilogue(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["K", "N", "bf16"], t: T.f32):
    i, j, k = T.axes("i j k")
    return T.sum(x[i, k] * w[k, j], over=k) * t


@tf.kernel
def head_bias(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
              bias: T.Tensor["H", "N", "bf16"]):
    b, h, i, j, d = T.axes("b h i j d")
    return T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) + bias[h, j]


@tf.kernel
def two_batch_axes(q: T.Tensor["B", "H", "M", "D", "bf16"],
                   k: T.Tensor["B", "H", "N", "D", "bf16"]):
    b, h, i, j, d = T.axes("b h i j d")
    return T.sum(q[b, h, i, d] * k[b, h, j, d], over=d)


@tf.kernel
def mixed_layouts(x: T.Tensor["M", "K", "bf16"], w1: T.Tensor["K", "N", "bf16"],
                  w3: T.Tensor["N", "K", "bf16"]):
    i, j, k = T.axes("i j k")
    return T.sum(x[i, k] * w1[k, j], over=k) * T.sum(x[i, k] * w3[j, k], over=k)


@tf.kernel
def float32_gemm(x: T.Tensor["M", "K", "f32"], w: T.Tensor["K", "N", "f32"]):
    i, j, k = T.axes("i j k")
    return T.sum(x[i, k] * w[k, j], over=k)


@tf.kernel
def max_product(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["K", "N", "bf16"]):
    i, j, k = T.axes("i j k")
    return T.max(x[i, k] * w[k, j], over=k)


@pytest.mark.parametrize("kernel, words", [
    (head_bias, "several batch axes are walked as one index"),
    (gated_batched_apart, "differ in whether they have the batch axis"),
    (mixed_layouts, "different layouts"),
    (float32_gemm, "bf16 or f16"),
    (max_product, "max reduction"),
    (K.softmax, "max reduction"),
    (K.layernorm, "not a sum over one axis into [rows, columns]"),
    (K.ffn_gelu, "sums over another axis"),
])
def test_plan_refuses_other_programs(kernel, words):
    with pytest.raises(ScheduleError, match="hopper GEMM") as err:
        plan_hopper_gemm(kernel.program)
    assert words in str(err.value)


@pytest.mark.parametrize("knobs, words", [
    ({"block_n": 320}, "block_n=320"),
    ({"cluster": 4}, "cluster=4"),
    ({"consumers": 3}, "a thread has 128"),           # 512 threads: 128 registers at launch
    ({"consumers": 3, "block_n": 192, "cluster": 2, "multicast": "leader"}, "spill"),
    ({"cluster": 2, "block_n": 192}, "halves"),      # split multicast needs 128 or 256
    ({"multicast": "all"}, "'split' or 'leader'"),
    ({"epilogue": "tma"}, "'direct'"),
    ({"block_n": 256, "stages": 6}, "shared memory"),
    ({"block_n": 224}, "64, 128, 192 or 256"),      # [K, N] weights: atoms of 64 columns
])
def test_check_refuses_what_the_kernel_cannot_run(knobs, words):
    plan = plan_hopper_gemm(K.matmul.program)
    with pytest.raises(ScheduleError, match="hopper GEMM") as err:
        check_gemm(plan, GemmKnobs(**{**{"stages": 3}, **knobs}), SIZES)
    assert words in str(err.value)


def test_weights_stored_n_by_k_take_tiles_of_any_multiple_of_16_columns():
    """Their TMA boxes are rows of K: a cluster's halves are whole 8-row swizzle atoms for any
    multiple of 16 (224 columns split as 112 + 112)."""
    plan = plan_hopper_gemm(matmul_nk.program)
    for bn in (64, 96, 160, 224, 256):
        check_gemm(plan, GemmKnobs(block_n=bn, cluster=2, stages=3), SIZES)
    for bn in (200, 48, 272):
        with pytest.raises(ScheduleError, match="multiple of 16 from 64 to 256"):
            check_gemm(plan, GemmKnobs(block_n=bn, stages=3), SIZES)
    knobs, _ = with_knobs(plan, SIZES, {"block_n": 224, "cluster": 2})
    assert knobs.multicast == "split"   # [K, N] weights would fall back to the leader's copies


def test_n_by_k_weights_get_narrower_tiles_where_256_columns_fit_the_waves_badly():
    """M=1024, K=4096, N=14336 on 132 SMs: 224 tiles of 256 × 256 are 3.4 waves of clusters (the
    last split along K, 0.73 of a wave), 256 of 256 × 224 are 3.9: 896 against 955 in the model.
    Where the waves fit either way (8192³, M=8192) the tiles stay 256 wide, and [K, N] weights
    (atoms of 64 columns) always do."""
    from tensorfuse.schedule_templates.hopper_gemm_plan import modeled_time

    nk, kn = plan_hopper_gemm(matmul_nk.program), plan_hopper_gemm(K.matmul.program)
    assert modeled_time(1024, 14336, 4096, 256, 2, 132) == pytest.approx(3.73 * 256)
    assert modeled_time(1024, 14336, 4096, 224, 2, 132) == 4 * 224
    ffn_up = dict(M=1024, K=4096, N=14336)
    knobs, why = default_gemm_knobs(nk, ffn_up)
    assert (knobs.block_n, knobs.cluster, knobs.multicast) == (224, 2, "split")
    assert "256 tiles of 256 × 224" in why
    assert default_gemm_knobs(kn, ffn_up)[0].block_n == 256
    # less than a wave of 256-column tiles (M=200: 56 clusters on 66) keeps 256 (224 columns,
    # the wave model's pick there, measured no faster on the H100: ``benchmarks.gemm``)
    for sizes in (dict(M=8192, K=8192, N=8192), dict(M=8192, K=4096, N=14336),
                  dict(M=200, K=4096, N=1024), dict(M=1024, K=14336, N=4096),
                  dict(M=200, K=4096, N=14336)):
        assert default_gemm_knobs(nk, sizes)[0].block_n == 256, sizes
    f = hopper(matmul_nk)
    assert "block_n=224" in f.schedule_origin(**ffn_up)
    assert "ways along K" not in f.schedule_origin(**ffn_up)


@tf.kernel
def latent_scores(q: T.Tensor["B", "H", "DQ", "bf16"], k: T.Tensor["B", "N", "DQ", "bf16"]):
    """The first GEMM of an absorbed latent decode: every head's q·k over one cache a batch."""
    b, h, j, d = T.axes("b h j d")
    return T.cast(T.sum(q[b, h, d] * k[b, j, d], over=d), "f32")


@tf.kernel
def latent_values(p: T.Tensor["B", "H", "N", "bf16"], v: T.Tensor["B", "N", "DV", "bf16"]):
    """Its second: the weights times the values, the keys contracted."""
    b, h, j, e = T.axes("b h j e")
    return T.cast(T.sum(p[b, h, j] * v[b, j, e], over=j), "f32")


def test_a_batch_of_gemms_whose_rows_fit_one_tile_streams_its_weights_as_one_gemm_does():
    """8 batches of 128 rows: each GEMM's rows fit one tile, so the widths are those of one such
    GEMM with the tiles counted over the batch — 64 columns where every batch's tiles fit one
    wave (8 × [128 × 4096] · [4096 × 512]: 64 tiles, each split along K in two, not 16 of 256
    columns split in eight), else the width that fills one wave (8 × [128 × 576] · [576 × 4096]:
    128). One GEMM of 1024 rows keeps the 256-column tiles of rows past one tile."""
    values = dict(B=8, H=128, N=4096, DV=512)
    knobs, why = default_gemm_knobs(plan_hopper_gemm(latent_values.program), values)
    assert knobs.block_n == 64 and knobs.split_tail and "64 tiles of 128 × 64" in why
    scores = dict(B=8, H=128, N=4096, DQ=576)
    assert default_gemm_knobs(plan_hopper_gemm(latent_scores.program), scores)[0].block_n == 128
    # more batches than one wave holds at 64 columns: the one-wave width over all of them
    many = dict(B=64, H=128, N=4096, DV=512)
    assert default_gemm_knobs(plan_hopper_gemm(latent_values.program), many)[0].block_n == 128
    # rows past one tile a batch: the tile models count every batch's rows, as before
    tall = dict(B=8, H=1024, N=4096, DQ=576)
    assert default_gemm_knobs(plan_hopper_gemm(latent_scores.program), tall)[0].block_n == 256
    assert "split" in hopper(latent_values).schedule_origin(**values)


def test_pacing_is_refused_where_a_waiting_cta_would_hold_its_peer():
    plan = plan_hopper_gemm(K.matmul.program)
    with pytest.raises(ScheduleError, match="use cluster=1"):
        check_gemm(plan, GemmKnobs(pace=4, cluster=2, stages=3), SIZES)
    with pytest.raises(ScheduleError, match="pace=-1"):
        check_gemm(plan, GemmKnobs(pace=-1, stages=3), SIZES)
    check_gemm(plan, GemmKnobs(pace=4, stages=3), SIZES)


def test_accumulators_must_fit_the_registers_a_thread_has():
    gated = plan_hopper_gemm(K.swiglu_gate.program)   # two accumulators per output
    check_gemm(gated, GemmKnobs(block_n=128, stages=3), SIZES)           # 128 + 26 ≤ 168
    with pytest.raises(ScheduleError, match="a thread has 168"):
        check_gemm(gated, GemmKnobs(block_n=256, stages=2), SIZES)       # 256 + 26 > 168
    check_gemm(plan_hopper_gemm(K.matmul.program), GemmKnobs(consumers=1, stages=3), SIZES)


def test_sizes_tma_cannot_copy_are_refused_and_compile_falls_back():
    plan = plan_hopper_gemm(K.matmul.program)
    with pytest.raises(ScheduleError, match="multiple of 8"):
        check_gemm(plan, GemmKnobs(stages=3), dict(M=100, K=100, N=30))
    f = tf.compile(K.matmul, "cuda:sm_90a")
    # Triton's GEMM tiles (masked loads, no TMA)
    assert f.schedule_origin(M=100, K=100, N=30).startswith("contraction template defaults")
    assert f.schedule_origin(**SIZES).startswith("hopper_gemm template defaults")


def test_a_mostly_idle_last_wave_is_split_along_k():
    from tensorfuse.schedule_templates.hopper_gemm import split_tail

    assert split_tail(224, 66, 64) == (198, 26, 2)      # M=1024, N=14336: 3.4 waves of clusters
    assert split_tail(1024, 66, 128) == (1024, 0, 1)    # 8192³: the last wave is half full
    assert split_tail(4, 66, 64) == (0, 4, 16)          # few tiles: split-K
    assert split_tail(4, 66, 8) == (0, 4, 2)            # pieces of at least 4 k-blocks
    assert split_tail(4, 66, 4) == (4, 0, 1)
    f = hopper(K.matmul)
    assert "the last 26 tiles split 2 ways along K" in f.schedule_origin(M=1024, K=4096, N=14336)
    whole = hopper(K.matmul, split_tail=False)
    assert "ways along K" not in whole.schedule_origin(M=1024, K=4096, N=14336)


def test_defaults_follow_the_sizes():
    plan = plan_hopper_gemm(K.matmul.program)
    big, why = default_gemm_knobs(plan, dict(M=8192, K=8192, N=8192))
    assert (big.block_n, big.cluster, big.multicast, big.group_m) == (256, 2, "split", 8)
    assert big.epilogue == "staged"
    wide, _ = default_gemm_knobs(plan_hopper_gemm(matmul_f16_f32.program), SIZES)
    assert wide.epilogue == "direct"   # f32 rows of 64 columns are 256 bytes
    with pytest.raises(ScheduleError, match="bf16 or f16 outputs only"):
        check_gemm(plan_hopper_gemm(matmul_f16_f32.program), replace(wide, epilogue="staged"),
                   SIZES)
    assert shared_bytes(plan, big) <= 227 * 1024 and "last wave" in why
    small, _ = default_gemm_knobs(plan, dict(M=48, K=4096, N=4096))
    assert (small.consumers, small.cluster) == (1, 1)
    # rows that fit one tile: 128-column tiles (twice the tiles, no split along K; on the H100
    # 0.87 → 0.98× cuBLAS at M=128, K=4096, N=14336), 256 columns again from 129 rows
    for M in (48, 128):
        assert default_gemm_knobs(plan, dict(M=M, K=4096, N=14336))[0].block_n == 128
        # where even 64-column tiles fit one wave, those: fewer pieces along K each (K=14336,
        # N=4096: 2 instead of 4; 5–7 % faster on the H100)
        assert default_gemm_knobs(plan, dict(M=M, K=14336, N=4096))[0].block_n == 64
    # [N, K] weights: as many columns as fill one wave (128 tiles of 112 on 132 SMs)
    nk = plan_hopper_gemm(matmul_nk.program)
    for M in (48, 128):
        assert default_gemm_knobs(nk, dict(M=M, K=4096, N=14336))[0].block_n == 112
        assert default_gemm_knobs(nk, dict(M=M, K=14336, N=4096))[0].block_n == 64
    assert default_gemm_knobs(plan_hopper_gemm(K.swiglu_gate.program),   # a gated pair: 128
                              dict(M=128, K=4096, N=14336))[0].block_n == 128
    assert default_gemm_knobs(nk, dict(M=128, K=4096, N=40000))[0].block_n == 128   # 2+ waves
    assert default_gemm_knobs(plan, dict(M=129, K=4096, N=14336))[0].block_n == 256
    assert default_gemm_knobs(plan, dict(M=129, K=14336, N=4096))[0].block_n == 256
    f = hopper(K.matmul)
    assert "ways along K" not in f.schedule_origin(M=128, K=4096, N=14336)   # 112 tiles
    # weights read once (the rows fit one tile, or one cluster's two): L2 evict-first copies
    for M, policy in ((48, "evict_first"), (128, "evict_first"), (256, "evict_first"),
                      (257, "normal"), (8192, "normal")):
        assert default_gemm_knobs(plan, dict(M=M, K=4096, N=14336))[0].weights_l2 == policy, M
    assert "L2 evict-first" in f.schedule_origin(M=128, K=4096, N=14336)
    # a gated pair keeps the normal policy (its few-row GEMM measured 3–8 % slower with it)
    assert default_gemm_knobs(plan_hopper_gemm(K.swiglu_gate.program),
                              dict(M=128, K=4096, N=14336))[0].weights_l2 == "normal"
    # one wave of whole tiles on one row of them: CTAs paced within 2 k-blocks of the average;
    # not where tiles are split along K, rows take two tiles, or a cluster shares them
    for M, K_, N, pace in ((128, 4096, 14336, 2), (48, 4096, 14336, 2), (128, 14336, 4096, 0),
                           (129, 4096, 14336, 0), (128, 4096, 40000, 0)):
        assert default_gemm_knobs(plan, dict(M=M, K=K_, N=N))[0].pace == pace, (M, K_, N)
    assert with_knobs(plan, dict(M=128, K=4096, N=14336), {"cluster": 2})[0].pace == 0
    # 64-row tiles at M=128 read each weight tile twice: the normal policy, unless given
    assert with_knobs(plan, dict(M=128, K=4096, N=14336),
                      {"consumers": 1})[0].weights_l2 == "normal"
    assert with_knobs(plan, dict(M=128, K=4096, N=14336),
                      {"consumers": 1, "weights_l2": "evict_first"})[0].weights_l2 == "evict_first"
    gated, _ = default_gemm_knobs(plan_hopper_gemm(K.swiglu_gate.program), SIZES)
    assert gated.block_n == 128   # two accumulators per thread
    given, why = with_knobs(plan, SIZES, {"block_n": 128})
    assert given.stages == 6 and why == "given: block_n=128, stages=6"
    with pytest.raises(ScheduleError, match="no knob"):
        with_knobs(plan, SIZES, {"warps": 4})


@needs_nvcc
@pytest.mark.parametrize("name, knobs", [
    ("matmul", {}), ("matmul_nk", {}), ("linear", {"cluster": 1}), ("swiglu_gate", {}),
    ("matmul_f16_f32", {}), ("matmul_nk", {"cluster": 2, "multicast": "leader"}),
    ("matmul", {"consumers": 3, "block_n": 192, "cluster": 1}), ("matmul", {"consumers": 1}),
    ("matmul_nk", {"block_n": 224}), ("linear", {"block_n": 160, "cluster": 1}),
    ("swiglu_gate", {"block_n": 112}), ("matmul_nk", {"weights_l2": "evict_first"}),
    ("matmul", {"weights_l2": "evict_first", "cluster": 2}), ("matmul", {"pace": 4, "cluster": 1}),
])
def test_code_holds_the_hopper_instructions(name, knobs):
    """PTX: wgmma of the tile's width, 2-D bulk tensor copies, mbarriers, setmaxnreg — and with a
    cluster the multicast copies, remote arrivals at CTA scope (a cluster-scope release compiled
    to a GPU-wide memory barrier per k-block, measured 1.3–1.9× slower); ptxas spills nothing."""
    f = hopper(KERNELS[name], **knobs)
    launches = f.launches(**SIZES)
    ptx = f.ptx(**SIZES)
    for instruction in GEMM_PTX:
        assert instruction in ptx, f"{name} {knobs}: no {instruction}"
    assert f"m64n{launches.knobs.block_n}k16" in ptx
    if launches.knobs.cluster > 1:
        for instruction in MULTICAST_PTX:
            assert instruction in ptx, f"{name} {knobs}: no {instruction}"
        assert "mbarrier.arrive.release.cluster" not in ptx
    else:
        assert "multicast::cluster" not in ptx
    # weights read once may be copied with an L2 evict-first policy; only then a cache hint
    hinted = launches.knobs.weights_l2 == "evict_first"
    assert ("createpolicy.fractional.L2::evict_first" in ptx) == hinted
    assert ("L2::cache_hint" in ptx) == hinted
    # paced CTAs add to and read the grid's count of issued k-blocks; others never touch it
    paced = launches.knobs.pace > 0
    assert ("red.relaxed.gpu.global.add.u32" in ptx) == paced
    assert ("nanosleep" in ptx) == paced
    report = _ptxas_report(f.source(**SIZES))
    spilled = int(re.search(r"(\d+) bytes spill stores", report).group(1))
    # f32 outputs stored from the fragments keep a few more registers live than the 168 a
    # thread has at launch: ptxas spills 4 bytes there (outside the k-loop)
    # pacing's producer keeps one more value than its 40 registers hold: 12 bytes, outside the
    # consumers' k-loop
    assert spilled <= (4 if name == "matmul_f16_f32" else 12 if paced else 0), report


@tf.kernel
def scaled_product(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["N", "K", "bf16"],
                   a: T.Tensor["M", "bf16"], b: T.Tensor["N", "bf16"]):
    """A GEMM whose epilogue scales each row and each column (cosine similarities' last step)."""
    i, j, k = T.axes("i j k")
    return T.sum(x[i, k] * w[j, k], over=k) * a[i] * b[j]


@needs_nvcc
@pytest.mark.parametrize("epilogue", ["staged", "direct"])
def test_the_epilogue_loads_what_it_reads_per_row_or_column_once(epilogue):
    """A thread of a 128 × 256 tile holds 2 rows and 64 columns: 66 loads of the row and column
    vectors, not one per output element (they were re-read at every value — 192 — between the
    shared-memory stores; cosine similarity at 8192² × 1024 took 0.286 ms against 0.229 once
    loaded apart: ``benchmarks.unlisted_kernels``)."""
    f = hopper(scaled_product, block_n=256, epilogue=epilogue)
    ptx = f.ptx(M=8192, K=1024, N=8192)
    assert len(re.findall(r"ld\.global\.nc\.u16", ptx)) == 2 + 64


@needs_nvcc
@pytest.mark.parametrize("kernel", [batched_product, batched, shared_rows, batched_nk_residual,
                                    two_batch_axes])
def test_batched_operands_are_copied_as_3d_boxes(kernel):
    """An operand with the batch axis is copied by 3-D bulk tensor copies at the tile's batch,
    a shared one by 2-D copies as unbatched; ptxas spills nothing."""
    plan = plan_hopper_gemm(kernel.program)
    f = hopper(kernel)
    sizes = {**{size: 3 for _, size in plan.batch}, "M": 300, plan.dims[1]: 136, "N": 264}
    source = f.source(**sizes)
    assert ("tf_tma_load_3d(a_tiles" in source) == plan.a_batched
    assert ("tf_tma_load_2d(a_tiles" in source) != plan.a_batched
    assert ("tf_tma_load_3d(b" in source) == plan.weights_batched
    assert ("copy_weight_box(b" in source) != plan.weights_batched
    ptx = f.ptx(**sizes)
    assert "cp.async.bulk.tensor.3d" in ptx and "wgmma.mma_async" in ptx
    # a [Z, M, N] residual read at its batch's 64-bit offsets beside 128 accumulators: ptxas
    # spills one 64-bit value, stored and loaded once in a tile's epilogue (never among its
    # wgmmas); the others spill nothing
    residual = kernel is batched_nk_residual
    report = assert_consumers_do_not_spill(source, per_tile=2 if residual else 0)
    assert int(re.search(r"(\d+) bytes spill stores", report).group(1)) <= (8 if residual else 0)


@needs_nvcc
def test_a_scalar_named_like_a_kernel_variable_is_read_from_its_argument():
    """The scalar ``t`` is the kernel's ``s_t``: named ``t`` in the C++, the consumers' thread
    index ``t`` shadowed it and the H200 multiplied each output by its thread's index (relative
    error 195). PTX: the argument is loaded (it was never read)."""
    f = hopper(scalar_epilogue)
    ptx = f.ptx(M=1000, K=1032, N=776)
    index = [name for name, _, _ in kernel_arguments(plan_hopper_gemm(
        scalar_epilogue.program))].index("s_t")
    assert re.search(rf"ld\.param\.f32\s+\S+,\s*\[\w+_param_{index}\]", ptx)


def test_one_source_serves_every_size_with_these_knobs():
    f = hopper(K.matmul, block_n=256, cluster=2, stages=4)
    assert f.source(**SIZES) == f.source(M=8192, K=8192, N=8192)


def test_compile_chooses_it_on_sm90a_only():
    for kernel in (K.matmul, K.linear, K.swiglu_gate, matmul_nk):
        assert "hopper_gemm" in tf.compile(kernel, "cuda:sm_90a").description
    assert "hopper_gemm" not in tf.compile(K.matmul, "cuda:sm_80").description
    assert "hopper_gemm" not in tf.compile(K.causal_attention, "cuda:sm_90a").description


def test_schedule_applies_it_on_a_fresh_schedule_only():
    sch = tf.schedule(K.linear, "cuda:sm_90a").apply_template("hopper_gemm", cluster=1)
    text = sch.plan(M=256, K=512, N=1024)
    assert "hopper GEMM plan" in text and "K-major, as nn.Linear" in text and "cluster=1" in text
    fused = tf.schedule(K.matmul, "cuda:sm_90a").rolling_update("out_sum", axis="k")
    with pytest.raises(ScheduleError, match="fresh schedule"):
        fused.apply_template("hopper_gemm")
    with pytest.raises(ScheduleError, match="no knob"):
        tf.schedule(K.matmul, "cuda:sm_90a").apply_template("hopper_gemm", tile_m=64)


FFN = dict(M=1000, K=520, N=1032, O=264)


@needs_nvcc
@pytest.mark.parametrize("kernel", [K.ffn_gelu, K.ffn_swiglu])
def test_ffn_is_two_gemms_with_the_activation_in_the_first(kernel):
    f = tf.schedule(kernel, "cuda:sm_90a").apply_template("hopper_ffn").compile()
    launches = f.launches(**FFN)
    first, second = launches.sources
    assert "tanh" in first or "__expf" in first          # the activation: first epilogue only
    assert "tanh" not in second and "__expf" not in second
    ptx = f.ptx(**FFN)
    assert ptx.count(".entry tf_hopper_gemm") == 2 and "m64n256k16" in ptx
    if kernel is K.ffn_swiglu:
        assert launches.knobs.up.block_n == 128             # two accumulators per thread
    for source in launches.sources:
        report = _ptxas_report(source)
        assert "0 bytes spill stores, 0 bytes spill loads" in report, report
    assert "intermediate [M, N] written once" in launches.plan.describe()
    # the second GEMM is a programmatic dependent of the first: every GEMM lets its dependents
    # start once its CTAs run; only the second waits for the kernel before it
    assert "#define DEPENDENT 0" in first and "#define DEPENDENT 1" in second
    assert ptx.count("griddepcontrol.launch_dependents") >= 2
    assert ptx.count("griddepcontrol.wait") == 1


@needs_nvcc
def test_ffn_second_gemm_launches_in_stream_order_when_asked():
    f = tf.schedule(K.ffn_gelu, "cuda:sm_90a").apply_template("hopper_ffn", dependent=False) \
        .compile()
    assert "griddepcontrol.wait" not in f.ptx(**FFN)


@pytest.mark.parametrize("consumers", [1, 2, 3])
def test_consumers_never_ask_for_more_registers_than_the_cta_holds(consumers):
    """setmaxnreg.inc waits until the CTA's pool has the registers: asking for more than the
    threads held at launch, less what the producer gave back, hangs the kernel (it did on the
    H100 with a 64-register producer). Read from the generated source."""
    from tensorfuse.targets.cuda.hopper_gemm import hopper_gemm_source

    plan = plan_hopper_gemm(K.matmul.program)
    knobs = GemmKnobs(block_n=128, consumers=consumers, cluster=1)
    source = hopper_gemm_source(plan, knobs)
    producer, consumer = (int(re.search(rf"#define {n}_REGS (\d+)", source).group(1))
                          for n in ("PRODUCER", "CONSUMER"))
    at_launch = min(65536 // knobs.threads // 8 * 8, 248)
    assert 128 * producer + 128 * consumers * consumer <= at_launch * knobs.threads
    assert consumer >= min(at_launch, 240)   # and never fewer than the launch gave them


def test_ffn_reads_nn_linear_weights_as_stored():
    f = tf.compile(K.ffn_swiglu_linear, "cuda:sm_90a")
    assert f.schedule_origin(**FFN).startswith("hopper_ffn template defaults")
    first, second = f.for_sizes(**FFN).launches(**FFN).sources
    few = dict(FFN, M=128)   # the cluster template cannot read them: the Hopper FFN at any M
    assert f.schedule_origin(**few).startswith("hopper_ffn template defaults")
    assert "#define B_KMAJOR 1" in first and "#define B_KMAJOR 1" in second
    with pytest.raises(ScheduleError, match="hopper_ffn"):   # the cluster template needs [in, out]
        tf.schedule(K.ffn_swiglu_linear, "cuda:sm_90a").cluster_distribute("n")


def test_compile_prefers_the_hopper_ffn_above_32_rows():
    """H100, ``benchmarks.gemm``: the cluster template took 1.3–1.6× the Hopper FFN's time at
    M=200/256
    and 3–7 % more at 64/128; at 32 rows they are within a few per cent either way."""
    f = tf.compile(K.ffn_swiglu, "cuda:sm_90a")
    for M in (FFN["M"], 256, 200, 128, 64, 33):
        assert f.schedule_origin(**dict(FFN, M=M)).startswith("hopper_ffn template defaults")
    assert not f.schedule_origin(**dict(FFN, M=32)).startswith("hopper_ffn")
    with pytest.raises(ScheduleError, match="no knob"):
        tf.schedule(K.ffn_gelu, "cuda:sm_90a").apply_template("hopper_ffn", block_n=64)


@pytest.mark.gpu
def test_every_layout_epilogue_and_knob_matches_float64_on_the_gpu():
    """Ragged M, N and K, both weight layouts, bias, a gated pair, f16 with an f32 output, wide
    ranges, every knob set of the benchmark's sweep, the FFN blocks on two GEMMs; outputs
    poisoned, a guard after them."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from benchmarks.gemm import check

    assert check(log=lambda line: None) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, sizes, knobs", [
    (batched_product, dict(Z=3, M=300, K=136, N=264), {}),
    (batched_product, dict(Z=16, M=2048, K=128, N=2048), {}),
    (batched_product, dict(Z=2, M=40, K=72, N=200), {"epilogue": "direct"}),   # one warpgroup
    (batched_product, dict(Z=2, M=128, K=4096, N=256), {}),   # a last wave split along K
    (batched, dict(B=3, M=520, K=264, N=392), {}),            # shared weights: a cluster of two
    (shared_rows, dict(Z=5, M=200, K=136, N=136), {}),
    (batched_nk_residual, dict(Z=3, M=300, K=136, N=264), {"block_n": 128}),
    (two_batch_axes, dict(B=2, H=3, M=300, D=136, N=264), {}),   # attention's scores, q·kᵀ
    (scalar_epilogue, dict(M=1000, K=1032, N=776), {}),   # a scalar named t (a thread's index)
])
def test_batched_products_match_float64_on_the_gpu(kernel, sizes, knobs):
    """Each batch's product against float64 (torch.matmul in float64 on the same inputs), ragged
    sizes, values up to ±30, the output poisoned with NaN first."""
    args = gpu_operands(kernel, sizes, 7, ("a", "x", "q"))
    f = hopper(kernel, **knobs)
    d = {n: t.double() for n, t in args.items()}
    if kernel is batched_nk_residual:
        want = d["a"] @ d["b"].transpose(-1, -2) * 0.5 + d["r"]
    elif kernel is two_batch_axes:
        want = d["q"] @ d["k"].transpose(-1, -2)
    elif kernel is scalar_epilogue:
        want = d["x"] @ d["w"] * 0.5
    elif kernel is shared_rows:
        want = d["x"] @ d["w"].transpose(-1, -2)
    else:
        first, second = list(d.values())
        want = first @ second
    assert_poisoned_calls_match(f, {**args, **({"t": 0.5} if kernel is scalar_epilogue else {})},
                                want, f"{kernel.name} {sizes} {knobs}")


def gpu_operands(kernel, sizes: dict, seed: int, scaled: tuple) -> dict:
    """Random bf16 operands of ``kernel`` at ``sizes`` on an sm_90 GPU (the test skipped
    without one), those named in ``scaled`` up to ±30."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return {p.name: (torch.randn([sizes[str(d)] for d in p.dims], device="cuda", generator=gen)
                     * (30.0 if p.name in scaled else 1.0)).to(torch.bfloat16)
            for p in kernel.program.tensor_params}


def assert_poisoned_calls_match(f, args: dict, want, label: str) -> None:
    """``f(**args)`` into a NaN-poisoned bf16 output, twice (a split tile's counters are reset
    by the first call), each within 1e-2 of float64 ``want`` relative to its largest value."""
    import torch

    out = torch.full(want.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        got = f(**args, out=out)
        assert got is out
        error = float((out.double() - want).abs().max() / want.abs().max())
        assert error < 1e-2, f"{label}: relative error {error:.2e}"


def test_driver_launch_packs_the_arguments_as_the_kernel_takes_them():
    """The driver launch's parameter buffer (refilled per call) holds each argument as its
    type: pointers (ints or ``c_void_p``), 32-bit ints, floats, tensor maps by value (their 128
    bytes, at a 64-byte boundary) — and a wrong count, a value its type cannot hold or an
    unknown type are refused before any launch."""
    import ctypes

    from tensorfuse.errors import TargetError
    from tensorfuse.targets.cuda.module import TENSOR_MAP, DriverLaunch

    launch = DriverLaunch("", tf.get_target("cuda:sm_90a"), "k",
                          ("handle", "int32", "float32", TENSOR_MAP))
    for args in ([ctypes.c_void_p(0xDEAD0), 7, 0.5, bytes(range(128))],
                 [0xBEEF0, -3, 2.25, bytes(range(255, 127, -1))],
                 [ctypes.c_void_p(0), 2 ** 31 - 1, -1e30, bytes(128)]):
        params = launch.parameters(args)
        read = [ctypes.cast(params[i], ctypes.POINTER(t)).contents.value
                for i, t in enumerate((ctypes.c_void_p, ctypes.c_int, ctypes.c_float))]
        address = args[0].value if isinstance(args[0], ctypes.c_void_p) else args[0]
        assert read == [address, args[1], pytest.approx(args[2], rel=1e-7)]
        assert ctypes.string_at(params[3], 128) == args[3] and params[3] % 64 == 0
    with pytest.raises(TargetError, match="takes 4 arguments"):
        launch.parameters([1, 2])
    with pytest.raises(TargetError, match="do not fit"):
        launch.parameters([0, 2 ** 31, 0.0, bytes(128)])
    with pytest.raises(TargetError, match="no driver launch argument type 'int64'"):
        DriverLaunch("", tf.get_target("cuda:sm_90a"), "k", ("handle", "int64"))


@pytest.mark.gpu
def test_ffn_calls_on_two_streams_keep_their_own_intermediate():
    """Two streams calling one FFN kernel at once: each stream's second GEMM reads the H its own
    first GEMM wrote (one buffer for both let one stream's first GEMM overwrite what the
    other's second was reading)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from benchmarks.gemm import ffn_reference, inputs
    from tensorfuse.schedule_templates.hopper_ffn import hopper_ffn
    from tensorfuse.targets import get_target

    f = hopper_ffn(K.ffn_gelu, None, get_target("cuda"))
    gen = torch.Generator(device="cuda").manual_seed(3)
    given = [inputs(K.ffn_gelu, 1024, 1024, 4096, gen, scale, O=1024) for scale in (1.0, 30.0)]
    outs = [torch.full((1024, 1024), float("nan"), dtype=torch.bfloat16, device="cuda")
            for _ in given]
    streams = [torch.cuda.Stream() for _ in given]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(20):   # interleaved: one stream's first GEMM beside the other's second
        for t, out, s in zip(given, outs, streams):
            with torch.cuda.stream(s):
                f(**t, out=out)
    torch.cuda.synchronize()
    for t, out in zip(given, outs):
        ref = ffn_reference("gelu", t)
        assert float((out.double() - ref).abs().max() / ref.abs().max()) < 1e-2


def test_rasterisation_groups_read_the_fewest_bytes_a_wave():
    """The group of row units is the one whose waves read the fewest operand rows
    (``wave_operand_rows``, which follows the kernel's tile order): 8 units of 256 rows for the
    large shapes (a wave then spans about as many row units as column tiles), 16 — the default
    before — where the rows make too few units for the group to change the order."""
    plan = plan_hopper_gemm(K.matmul.program)
    for sizes in (dict(M=8192, K=14336, N=4096), dict(M=8192, K=8192, N=8192),
                  dict(M=8192, K=4096, N=14336)):
        knobs, _ = default_gemm_knobs(plan, sizes)
        assert knobs.group_m == 8, sizes
        rows = {g: wave_operand_rows(sizes["M"], sizes["N"], 128, 256, 2, 1, 132, g)
                for g in (16, 8, 4)}
        assert rows[8] < min(rows[16], rows[4]), rows
    # 32 row units × 4 column tiles in groups of 16 on 66 clusters: the first wave takes group
    # 0 (16 × 4 units) and two units of group 1's first column (18 row units, 4 columns), the
    # second the rest of group 1 (16 row units, 4 columns)
    assert wave_operand_rows(8192, 1024, 128, 256, 2, 1, 132, 16) == (18 + 4 + 16 + 4) * 256
    assert default_gemm_knobs(plan, dict(M=1024, K=4096, N=14336))[0].group_m == 16
    assert group_rows(1024, 14336, 128, 256, 2, 1, 132) == 16   # 4 row units: any group ≥ 4
    given, _ = with_knobs(plan, dict(M=8192, K=8192, N=8192), {"group_m": 2})
    assert given.group_m == 2
