"""Attention over head dims past one tile's block, its features taken in chunks
(``schedule_templates/feature_chunks.py``): the chunk widths, what ``tf.compile`` plans for
DeepSeek's absorbed latent attention (q·k over 576, p·v over 512), its numbers under Triton's
interpreter (the cases: :mod:`.wide_features_check`), the sm_90a and gfx942 code, and on the
GPU."""
import re

import pytest

import tensorfuse as tf
from tensorfuse.errors import TargetError
from tensorfuse.schedule_templates.feature_chunks import feature_chunk
from tests.helpers import (assert_gpu_template_matches, check_interpreted, gpu_case,
                           ptxas_spills, relative_error)
from tests.schedule_templates.wide_features_check import (CASES, latent_attention_decode,
                                                          paged_latent_decode, split_template,
                                                          wide_causal_gain)

LATENT = dict(B=8, H=128, N=4096, DQ=576, DV=512)
DECODE_KNOBS = dict(tile_m=64, tile_n=32, num_warps=8, num_stages=2, splits=8)


def test_wide_features_match_float64_in_the_triton_interpreter():
    check_interpreted("tests.schedule_templates.wide_features_check", CASES)


@pytest.mark.parametrize("sizes, chunk", [((128, 256), None), ((576, 512), 64),
                                          ((300, 264), 32), ((640,), 128), ((384, 384), 128)])
def test_chunks_are_the_widest_that_pad_the_features_least(sizes, chunk):
    assert feature_chunk(dict(enumerate(sizes))) == chunk


def test_features_past_the_chunked_limit_are_refused_with_the_reason():
    with pytest.raises(TargetError, match="1024 elements.*up to 640 in chunks"):
        feature_chunk({0: 1024, 1: 512})


def test_latent_attention_decode_runs_as_the_floors_stages_by_default():
    """The keys split over parts with the features in chunks measured slower as one kernel than
    the floor's stages (the scores through the Hopper GEMM): tf.compile says so and runs those."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    made = tf.compile(latent_attention_decode, target="cuda:sm_90a")
    origin = made.schedule_origin(**LATENT)
    assert origin.startswith("staged: 3 kernels"), origin
    assert "features in chunks with the keys split over 8 parts (a decode): the floor's stages " \
        "measured faster" in origin, origin
    assert "[1] s_sum from q, k: hopper_gemm template" in origin, origin


def test_latent_attention_decode_is_one_attention_kernel_with_its_features_in_chunks():
    """As a tuned record runs it: q·k summed over 9 chunks of 64, p·v's accumulator 8 chunks,
    the keys split over parts (8 row tiles of 64 heads would leave SMs idle), and the parts
    merged by a second kernel, a program per chunk of p·v's features."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    made = split_template(latent_attention_decode, **DECODE_KNOBS)
    plan = made.describe_plan(**LATENT)
    assert "feature in chunks of 64: e 512 and d 576" in plan, plan
    assert "knobs: block_m=64, block_n=32, num_warps=8, num_stages=2, splits=8" in plan, plan
    assert "parts merged by a second kernel: 8 programs a row tile, one per feature chunk" \
        in plan, plan
    source = made.source(**LATENT)
    main, merge = source.split("def latent_attention_decode_fused_merge(")
    assert main.count("t_s_sum = tl.dot(") == 9
    assert len(re.findall(r"nst_out_sum_0_c\d = tl\.dot\(", main)) == 8
    # the parts' merge: a program per chunk of p·v's features, no arrival counter
    assert "atomic_add" not in source and "part_count" not in source
    assert [int(c) for c in re.findall(r"if pid_c == (\d+):", merge)] == list(range(8))
    assert len(re.findall(r"tl\.store\(out_out \+", merge)) == 8


def test_a_paged_latent_decode_is_planned_over_its_pages():
    """Keys and values read through a page table (tf.compile crashed on it: the decode's lift to
    four axes looked for the batch axis among the cache's indices, inside the gather): the
    attention template plans it (the pages and slots swept as one axis, the features in chunks,
    gathered keys in two parts an SM), and its defaults leave it, split, to the floor's stages,
    the scores and p·v gathered by the contraction template."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    made = tf.compile(paged_latent_decode, target="cuda:sm_90a")
    plan = made.describe_plan(B=8, H=128, DQ=576, DV=512, PAGES=600, PAGE=64, NP=64)
    assert "not the attention template (rolling_update(m, o, l, axis=pt, chunk=32)): features " \
        "in chunks with the keys split over 16 parts (a decode)" in plan, plan
    assert "s_sum = Σ_d (q[b, h, d]) · (k_pages[table[b, pt // 64], pt % 64, d])" in plan, plan
    assert "contracted pt" in plan, plan   # p·v over the gathered values


def test_wide_attention_compiles_for_sm90a_and_gfx942():
    """wgmma for every chunk's product; the decode's shared memory within an SM's (the query
    tile's chunks stay there: 208 KiB) and no spills (496 bytes where its last part merged the
    others' chunks in the same kernel); the causal prefill over 576 / 512 none. And the code for
    gfx942 (MFMA)."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    decode = split_template(latent_attention_decode, **DECODE_KNOBS).compiled(**LATENT)
    assert decode.metadata.shared <= 227 * 1024
    assert len(re.findall(r"wgmma\.mma_async", decode.asm["ptx"])) >= 17
    assert not any(ptxas_spills(decode.asm["ptx"]))
    causal = tf.compile(wide_causal_gain, target="cuda:sm_90a").template.compiled(
        B=2, H=16, S=4096, DQ=576, DV=512)
    assert not any(ptxas_spills(causal.asm["ptx"]))
    amd = tf.compile(wide_causal_gain, target="rocm:gfx942").template.compiled(
        B=2, H=16, S=4096, DQ=576, DV=512)
    assert "v_mfma" in amd.asm["amdgcn"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_wide_features_match_float64_on_the_gpu(name):
    kernel, case = CASES[name]
    if name != "latent_decode_split":
        assert_gpu_template_matches(kernel, case)
        return
    args, want, seed = gpu_case(case)   # the template's parts and their merge kernel
    assert relative_error(split_template(kernel, tile_m=16, tile_n=32, splits=5)(**args),
                          want) < 2e-2, seed


def test_the_tuner_tries_chunked_tiles_that_fit_an_sm():
    """Its space: 16 or 32 keys a block and up to 64 rows (the accumulator of 512 features),
    one or two stages, the keys unsplit, in the defaults' parts or twice as many; every tile
    set within the shared memory (the query tile's chunks beside the keys' and values')."""
    import itertools

    from tensorfuse.autotune.spaces import space_of
    from tensorfuse.autotune.tasks import make_task
    from tensorfuse.targets import get_target

    task = make_task(latent_attention_decode, LATENT, get_target("cuda:sm_90a"))
    space = space_of(task)
    choices = space.choices()
    assert choices == {"block_m": (16, 32, 64), "block_n": (16, 32), "num_warps": (4, 8),
                       "num_stages": (1, 2), "splits": (1, 8, 16)}
    assert not [knobs for knobs in itertools.product(*choices.values())
                if space.unfit(dict(zip(choices, knobs)))]
    assert "needs 282624 bytes" in space.unfit({"num_stages": 3})
