"""The rolling update on the CPU (fusion.py with parallel="cpu", cpu.rolled_schedule): what
``tf.compile`` runs for attention-like chains there. Rows of every batch and head over the cores,
chunks cut at the mask's edges, per-key values such as exp(s - m) computed once per key, a chunk's
sums in vector lanes, the keys transposed once for q·k — each checked against float64 on fresh
inputs at ragged sizes, with masks off the diagonal and chunks the sizes do not divide."""
import re

import numpy as np
import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.kernels.layers import attention_kernel
from tensorfuse.kernels.reference import TOLERANCE, random_inputs, relative_error
from tests.helpers import float64_reference

SCALARS = {"window": 9, "prefix": 5, "radius": 6}


def checked(f, kernel, dims, rng, scale=1.0):
    tensors, scalars = random_inputs(kernel, dims, rng)
    tensors = {k: (v * scale).astype(v.dtype) if v.dtype.kind == "f" else v
               for k, v in tensors.items()}
    scalars.update({k: v for k, v in SCALARS.items() if k in scalars})
    out = f(**tensors, **scalars)
    want = float64_reference(kernel, tensors, scalars)
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(np.asarray(out, np.float32)), finite)
    return relative_error(np.asarray(out)[finite], want[finite])


def sizes(kernel, m, n):
    return {d: v for d, v in dict(B=2, H=2, HKV=1, M=m, N=n, D=16).items()
            if d in kernel.program.dim_names()}


# causal and the sliding window at each of three shapes — ragged with fewer queries than keys,
# past one chunk of 128 keys, a long key sweep — and each other variant at one of them (each
# case is a CPU build of its own: the grid of every variant at every shape took a fifth of the
# CPU module's time in CI)
SHAPES = [(45, 77), (130, 130), (64, 300)]
CASES = [(name, m, n) for name in ("causal_attention", "sliding_window_attention")
         for m, n in SHAPES] + [
    ("prefix_lm_attention", 130, 130), ("neighborhood_attention", 130, 130),
    ("document_attention", 45, 77), ("gqa_causal_attention", 64, 300),
    ("alibi_attention", 130, 130), ("softcap_attention", 45, 77), ("attention", 64, 300)]


@pytest.mark.parametrize("name, m, n", CASES)
def test_tf_compile_runs_attention_chains_fused_on_the_cpu(rng, name, m, n):
    kernel = K.ALL[name]
    f = tf.compile(kernel, target="llvm")
    dims = sizes(kernel, m, n)
    assert re.search(r"rolling_update\(m, [lo], [lo], axis=j, chunk=128, rows=4\)",
                     f.schedule_origin(**dims))
    assert checked(f, kernel, dims, rng) <= TOLERANCE["bf16"]


def test_row_programs_keep_the_row_schedule():
    f = tf.compile(K.softmax, target="llvm")
    assert f.schedule_origin(M=8, N=64) == "template defaults"


@pytest.mark.parametrize("chunk", [16, 32, 48])
@pytest.mark.parametrize("m, n", [(33, 70), (100, 100), (17, 200)])
def test_fused_f32_causal_with_lanes_and_cut_chunks_matches_float64(rng, chunk, m, n):
    """Chunks of 16 and 32 take the lanes (48 too: a multiple of 16), the sizes leave partial
    chunks, and wide scores exercise the corrections."""
    kernel = attention_kernel("f32", True, False, False)
    sch = tf.schedule(kernel, target="llvm")
    sch.rolling_update("m", "l", "o", axis="j", chunk=chunk)
    f = sch.compile()
    assert checked(f, kernel, dict(B=1, H=3, HKV=3, M=m, N=n, D=32), rng, scale=4.0) \
        <= TOLERANCE["f32"]


def test_split_update_on_the_cpu_keeps_each_splits_values_apart(rng):
    """Per-key values and per-row factors are buffers per split (the splits run in parallel)."""
    kernel = K.gqa_causal_attention
    sch = tf.schedule(kernel, target="llvm")
    sch.split_update("m", "l", "o", axis="j", splits=3, chunk=16)
    dims = dict(B=2, H=4, HKV=2, M=5, N=300, D=16)
    assert checked(sch.compile(), kernel, dims, rng) <= TOLERANCE["bf16"]


def test_the_fused_cpu_module_has_the_pieces_that_make_it_fast():
    kernel = attention_kernel("f32", True, False, False)
    f = tf.compile(kernel, target="llvm")
    script = f.module(B=1, H=2, HKV=2, M=512, N=512, D=64).script()
    chunk_loop = re.search(r"for j_chunk in range\(([^)]*)\)", script).group(1)
    assert "b_h_i_block" in chunk_loop                      # cut at the rows' diagonal
    assert re.search(r"for b_h_i_block in T\.parallel\(256\)", script)   # 4 rows of all heads
    assert 'T.sblock("j_value0")' in script                 # exp(s - m) once per key
    assert 'T.sblock("l_chunk_lanes_fold")' in script       # the chunk's sum in lanes
    assert 'T.sblock("k_global")' in script and "k_global = T.sblock_alloc_buffer((1, 2, 64, " \
        "512))" in script                                    # keys transposed once


@pytest.mark.parametrize("dilation", [1, 2])
def test_a_2d_neighbourhood_computes_its_mask_once_per_key(rng, dilation):
    """The mask divides indices (``i // width``): its masked scores are a per-key value of
    their own, read by the maximum and by ``exp(s - m)``, instead of being evaluated in both."""
    kernel = K.neighborhood_attention_2d
    f = tf.compile(kernel, target="llvm")
    dims = dict(B=1, H=2, M=80, N=80, D=16)     # a 10-wide image of 8 rows
    script = f.module(**dims).script()
    assert 'T.sblock("j_value0")' in script and 'T.sblock("j_value1")' in script
    tensors, scalars = random_inputs(kernel, dims, rng)
    scalars.update(width=10, radius=2, dilation=dilation)
    want = float64_reference(kernel, tensors, scalars)
    assert relative_error(f(**tensors, **scalars), want) <= TOLERANCE["bf16"]


@pytest.mark.parametrize("name, rows, chunk, m, n", [
    ("causal_attention", 4, 128, 45, 77),            # rows past the end of the last block
    ("causal_attention", 3, 16, 130, 130),           # a block spans two chunks' diagonals
    ("sliding_window_attention", 4, 16, 131, 131),   # rows of a block start at other chunks
    ("document_attention", 2, 128, 64, 300),
    ("gqa_causal_attention", 4, 32, 70, 77),
    ("attention", 4, 128, 37, 301)])
def test_a_block_of_rows_matches_float64(rng, name, rows, chunk, m, n):
    """``rows``: a core sweeps that many rows together (each key and value it loads serving all
    of them); the chunk loop runs over the hull of their mask ranges, a chunk a row's mask removes
    whole adding the identity to it; rows past the axis' end are skipped."""
    kernel = K.ALL[name]
    sch = tf.schedule(kernel, target="llvm")
    sch.rolling_update("m", "l", "o", axis="j", chunk=chunk, rows=rows)
    f = sch.compile()
    assert checked(f, kernel, sizes(kernel, m, n), rng, scale=3.0) <= TOLERANCE["bf16"]


def test_a_block_of_rows_in_f32_with_wide_scores_matches_float64(rng):
    kernel = attention_kernel("f32", True, False, False)
    sch = tf.schedule(kernel, target="llvm")
    sch.rolling_update("m", "l", "o", axis="j", chunk=128, rows=4)
    f = sch.compile()
    assert checked(f, kernel, dict(B=1, H=3, HKV=3, M=203, N=203, D=64), rng, scale=4.0) \
        <= TOLERANCE["f32"]


def test_tf_compile_sweeps_blocks_of_four_rows():
    """Four rows per block at every length (measured: ``benchmarks.cpu``), their
    contractions' partial sums cut to fit the registers (scores of 128 keys in two parts of 64
    for four rows), the loads of q·k's keys serving the four rows; the output's per-row factor
    computed once per row, before the loop over its features. Decode (one query row) keeps one
    row per task."""
    kernel = attention_kernel("f32", True, False, False)
    f = tf.compile(kernel, target="llvm")
    dims = dict(B=1, H=2, HKV=2, M=4096, N=4096, D=64)
    assert "chunk=128, rows=4)" in f.schedule_origin(**dims)
    script = f.module(**dims).script()
    assert re.search(r"for b_h_i_block in T\.parallel\(2048\)", script)
    assert re.search(r"for j_t_o, d, i_row, j_t_i in T\.grid\(2, 64, 4, 64\)", script)
    assert 'T.sblock("o_final_factor0")' in script
    decode = f.module(B=1, H=2, HKV=2, M=1, N=512, D=64).script()
    assert "i_row" not in decode and "T.parallel(2)" in decode


def test_rows_are_refused_where_they_mean_nothing():
    from tensorfuse.errors import RollingUpdateError, ScheduleError
    from tensorfuse.schedule_templates.fusion import Fusion

    with pytest.raises(RollingUpdateError, match="rows must be a positive integer"):
        Fusion(("m",), "j", 16, 1, 0)
    sch = tf.schedule(attention_kernel("f32", True, False, False), target="cuda")
    with pytest.raises(ScheduleError, match="block of rows is how the CPU"):
        sch.rolling_update("m", "l", "o", axis="j", rows=4)
