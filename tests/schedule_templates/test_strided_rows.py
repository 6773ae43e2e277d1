"""The row template across a strided axis (``row_reduction.rows_contiguous``) and over two axes
swept as one (a group norm): tiles and warps, sm_90a code without spills, the flat output given
its shape back, and float64 checks on the CPU target, under Triton's interpreter and on the
GPU."""

import pytest
import torch

import tensorfuse as tf
from benchmarks.pipeline_kernels import logsumexp_pool
from tensorfuse.schedule_templates.row_reduction import CONTIGUOUS_TILE
from tensorfuse import dsl as T
from tests.helpers import (assert_gpu_template_matches, fresh_seed, gpu_case, ptxas_spills,
                           relative_error, run_interpreted, templated)
from tests.schedule_templates.strided_rows import (CASES, INTERPRETED, group_norm,
                                                   group_norm_channels_last,
                                                   group_norm_case, layernorm_channels,
                                                   log_softmax_channels, strided_gemv)


def knobs_of(kernel, **dims):
    return tf.compile(kernel, target="cuda:sm_90a").template.build(**dims)[1]


def test_strided_rows_are_64_contiguous_rows_by_the_whole_row_or_swept_in_32_by_512():
    whole = knobs_of(log_softmax_channels, B=8, C=150, P=65536)   # 64 × 256: 4 warps
    assert (whole.block_m, whole.block_n, whole.num_warps, whole.num_stages, whole.reload,
            whole.row_tiles) == (64, 256, 4, 1, 0, 1)
    wider = knobs_of(layernorm_channels, B=8, D=512, S=4096)      # 64 × 512: 8 warps
    assert (wider.block_m, wider.block_n, wider.num_warps, wider.row_tiles) == (64, 512, 8, 1)
    # ... but 4 where the outputs are per row (the tile is not held for them): a log-sum-exp
    pooled = knobs_of(logsumexp_pool, B=64, S=512, D=4096)
    assert (pooled.block_m, pooled.block_n, pooled.num_warps) == (64, 512, 4)
    # 32 × 1024, two tiles a program, the next tiles' loads 3 ahead
    tiled = knobs_of(layernorm_channels, B=8, D=1024, S=4096)
    assert (tiled.block_m, tiled.block_n, tiled.num_warps, tiled.num_stages, tiled.row_tiles) \
        == (32, 1024, 8, 4, 2)
    # too few tiles for two programs an SM at two tiles each, and rows wider than 1024: swept in
    # 32 × 512 blocks, pipelined
    for swept in (knobs_of(layernorm_channels, B=1, D=1024, S=4096),
                  knobs_of(layernorm_channels, B=8, D=2048, S=4096)):
        assert (swept.block_m, swept.block_n, swept.num_warps, swept.num_stages,
                swept.row_tiles) == (32, 512, 4, 2, 1)
    assert 64 * 1024 > CONTIGUOUS_TILE >= 64 * 512


@pytest.mark.parametrize("D", [512, 1024])
def test_strided_row_tiles_compile_for_sm_90a_without_spills(D):
    """64 × 512 tiles with 4 warps spilled 820 bytes (ptxas); the default warps keep them in
    registers."""
    ptx = tf.compile(layernorm_channels, target="cuda:sm_90a").template.ptx(B=8, D=D, S=4096)
    assert not any(ptxas_spills(ptx))


def test_a_per_row_strided_tile_on_four_warps_spills_a_few_registers_at_most():
    """A log-sum-exp over the strided axis in 64 × 512 tiles on 4 warps spills 36 bytes (ptxas
    sm_90a) and ran 1.5× faster than on 8 warps (``row_reduction.PER_ROW_TILE_WARPS``): a few
    registers, not the tile (a layer norm's tile on 4 warps spilled 820)."""
    ptx = tf.compile(logsumexp_pool, target="cuda:sm_90a").template.ptx(B=64, S=512, D=4096)
    assert max(ptxas_spills(ptx)) <= 64


def test_few_row_tiles_over_a_long_sweep_split_it_where_their_outputs_are_per_row():
    """Batch-norm statistics of [100352, 256]: 4 tiles of 64 channels in blocks of 64 rows, its
    sums kept per lane (reduced across the warps every block, 8 tiles of 32 × 512 in 33 parts
    were faster), the sweep over the rows split in 64 parts (the last of a tile merging);
    RMSNorm's weight gradient down 8192 rows is 64 tiles of 64 × 64 in 8 parts (about
    four programs an SM; a mean down one tensor's rows takes blocks of 128), and a cross-entropy
    of 16 rows over a vocabulary of 131072 (two a SM); a softmax of 64 rows, whose outputs run
    along the row, and a tall matrix's statistics, with tiles enough, are not."""
    from tensorfuse.dsl.program import ProgramKernel

    from tensorfuse.kernels import cross_entropy, rmsnorm, softmax
    from tensorfuse.schedule_templates.auto import takes_stage
    from tensorfuse.schedule_templates.stages import plan_stages
    from tensorfuse.targets import get_target
    from benchmarks.unlisted_kernels import column_mean, weighted_token_pool
    from tests.schedule_templates.strided_rows import channel_stats

    stats = knobs_of(channel_stats, N=100352, C=256)
    assert (stats.block_m, stats.block_n, stats.splits, stats.lanes) == (64, 64, 64, 1)
    spec = get_target("cuda:sm_90a")
    second = plan_stages(tf.grad(rmsnorm).program, lambda p: takes_stage(p, spec))[1]
    weight = knobs_of(ProgramKernel(second.program), M=8192, N=4096)
    assert (weight.block_m, weight.block_n, weight.splits) == (64, 64, 8)
    # one tensor down the rows: blocks of 128 (a mean of [65536, 1024]: 16 tiles in 33 parts)
    mean = knobs_of(column_mean, B=65536, D=1024)
    assert (mean.block_m, mean.block_n, mean.splits) == (64, 128, 33)
    assert knobs_of(cross_entropy, M=16, V=131072).splits == 4
    # a long sweep, outputs per row: 32-row tiles up to about 8 programs an SM, else 64
    assert knobs_of(weighted_token_pool, B=32, S=2048, D=1024).block_m == 32   # 1024 tiles
    assert knobs_of(weighted_token_pool, B=64, S=4096, D=1024).block_m == 64
    assert knobs_of(softmax, M=64, N=65536).splits == 1
    assert knobs_of(channel_stats, N=512, C=4096).splits == 1
    # ... weighed by a vector along the sweep (a matrix-vector product over the strided axis):
    # 128-row tiles (256-byte pieces) × 64, parts for about four programs an SM
    for (K, M), parts in (((8192, 8192), 8), ((16384, 4096), 16), ((4096, 16384), 4)):
        gemv = knobs_of(strided_gemv, K=K, M=M)
        assert (gemv.block_m, gemv.block_n, gemv.num_warps, gemv.splits) == (128, 64, 4, parts)


def test_a_long_strided_sweep_with_outputs_along_it_loads_three_blocks_ahead():
    """Columns of [8192, 4096] L2-normalised (outputs along the sweep, so not split): blocks of
    256, 4 stages; a sweep whose outputs are per row keeps the split 32 × 512 tiles."""
    from benchmarks.unlisted_kernels import l2_normalize_columns

    knobs = knobs_of(l2_normalize_columns, N=8192, D=4096)
    assert (knobs.block_m, knobs.block_n, knobs.num_stages, knobs.splits) == (32, 256, 4, 1)
    short = knobs_of(l2_normalize_columns, N=2048, D=4096)
    assert (short.block_n, short.num_stages) == (512, 2)


def test_a_swept_strided_row_loads_its_next_block_while_reducing_one():
    """The 2 stages of a strided row's sweep are Triton's pipeline (asynchronous copies into
    shared memory); a row-major sweep keeps its loads synchronous (the pipeline measured slower
    there) and so does a strided row held in one tile."""
    from tensorfuse.kernels import softmax

    swept = tf.compile(layernorm_channels, target="cuda:sm_90a").template.ptx(B=2, D=1024, S=256)
    whole = tf.compile(layernorm_channels, target="cuda:sm_90a").template.ptx(B=2, D=512, S=256)
    rows = tf.compile(softmax, target="cuda:sm_90a").template.ptx(M=4, N=65536)
    assert "cp.async" in swept
    assert "cp.async" not in whole and "cp.async" not in rows


def test_a_group_norm_is_swept_over_its_two_axes_as_one_and_written_in_its_shape():
    from tensorfuse.flat_kernel import FlatSweepKernel
    from tensorfuse.schedule_templates.flat_sweeps import flatten_sweeps

    flat = flatten_sweeps(group_norm.program, dict(B=2, G=3, C=5, P=67))
    assert [a.name for a in flat.outputs[0].axes] == ["b", "g", "cp"]
    made = templated(group_norm)
    assert isinstance(made, FlatSweepKernel)
    assert made._shapes(dict(B=2, G=3, C=5, P=67)) == [(0, (2, 3, 5, 67))]


def test_a_flat_sweep_writes_out_through_a_view_of_its_memory():
    """out= arrays of the user's shape: the flat kernel writes them itself through views over
    the merged axis (a memory-order route passes its output so), not a result copied in after;
    an array whose strides give no such view is filled from the result."""
    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.flat_kernel import FlatSweepKernel
    from tensorfuse.schedule_templates.flat_sweeps import flatten_sweeps, swept_together
    from tensorfuse.targets import get_target

    handed = []

    def make(sizes):
        inner = tf.compile(ProgramKernel(flatten_sweeps(group_norm.program, sizes)), target="cpu")
        real = inner.invoke

        def invoke(key, args, kwargs):
            handed.append(kwargs.get("out"))
            return real(key, args, kwargs)
        inner.invoke = invoke
        return inner
    made = FlatSweepKernel(group_norm.program, get_target("cpu"),
                           swept_together(group_norm.program), make)
    seed = fresh_seed()
    args, want = group_norm_case(torch.Generator().manual_seed(seed))
    out = torch.full(want.shape, float("nan"), dtype=torch.bfloat16)
    assert made(**args, out=out) is out
    assert relative_error(out, want) < 2e-2, seed
    assert handed[-1].data_ptr() == out.data_ptr() and handed[-1].shape != out.shape
    # a transposed array: no view over the merged axis, filled from the result
    apart = torch.full(want.shape[:2] + want.shape[:1:-1], float("nan"),
                       dtype=torch.bfloat16).transpose(2, 3)
    assert made(**args, out=apart) is apart
    assert relative_error(apart, want) < 2e-2, seed
    assert handed[-1] is None


def test_axes_reduced_together_are_swept_in_memory_order():
    """A group norm written over ``(c, p)`` of channels-last ``x[b, p, g, c]``: swept with the
    contiguous channels fastest (its sums' order is free), not a 2-byte read every G·C elements;
    a user's monoid over two axes keeps the order written (its combine may not be)."""
    from tensorfuse.schedule_templates.flat_sweeps import swept_together

    made = tf.compile(group_norm_channels_last, target="cuda:sm_90a")
    plan = made.describe_plan(B=16, P=4096, G=32, C=16)
    assert "p, c swept as one axis of P × C elements" in plan, plan
    assert "sum of x[b, pc // 16, g, pc % 16]" in plan, plan
    pair = T.Monoid("pair_sum", lambda s, n, t, m: (s + t, n + m), (0.0, 0.0), arity=2)

    @tf.kernel
    def paired(x: T.Tensor["B", "M", "N", "f32"]):
        b, i, j = T.axes("b i j")
        total = T.reduce((x[b, i, j], 1.0), over=(j, i), monoid=pair)
        return total[0] / total[1]
    assert [a.name for a in swept_together(paired.program)] == ["j", "i"]

    @tf.kernel
    def pixel_channel_mean(x: T.Tensor["B", "P", "G", "C", "bf16"]):
        b, p, g, c = T.axes("b p g c")
        return T.sum(x[b, p, g, c], over=(c, p)) / (T.size("C") * T.size("P"))
    assert [a.name for a in swept_together(pixel_channel_mean.program)] == ["p", "c"]

    @tf.kernel
    def centred_channels_first(x: T.Tensor["B", "P", "G", "C", "bf16"]):
        """Its output ``[b, g, c, p]`` holds (c, p) in the order written, not the order x lies
        in: no flat sweep (it would read x a strided element at a time)."""
        b, g, c, p = T.axes("b g c p")
        return x[b, p, g, c] - T.sum(x[b, p, g, c], over=(c, p)) / (T.size("C") * T.size("P"))
    assert [a.name for a in centred_channels_first.program.outputs[0].axes] == \
        ["b", "g", "c", "p"]
    assert swept_together(centred_channels_first.program) is None


@pytest.mark.parametrize("name", list(CASES))
def test_strided_rows_match_float64_on_the_cpu_target(name):
    kernel, case = CASES[name]
    seed = fresh_seed()
    args, want = case(torch.Generator().manual_seed(seed))
    assert relative_error(tf.compile(kernel, target="cpu")(**args), want) < 2e-2, seed


def test_strided_row_templates_match_float64_in_the_interpreter():
    seed = fresh_seed()
    errors = run_interpreted("tests.schedule_templates.strided_rows", seed)
    assert set(errors) == set(INTERPRETED), errors
    assert max(errors.values()) < 2e-2, (errors, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_strided_rows_match_float64_on_the_gpu(name):
    assert_gpu_template_matches(*CASES[name])


@pytest.mark.gpu
def test_a_flat_swept_group_norm_fills_out_in_its_own_shape_on_the_gpu():
    from tensorfuse.errors import CallError

    args, want, seed = gpu_case(group_norm_case)
    made = tf.compile(group_norm)
    out = torch.full(want.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    assert made(**args, out=out) is out
    assert relative_error(out, want) < 2e-2, seed
    # out= is checked against the user's shape, not the flat one
    with pytest.raises(CallError, match="out= for output out must have shape"):
        made(**args, out=torch.empty(2, 3, 335, dtype=torch.bfloat16, device="cuda"))
    # a repeated call takes the flat kernel's fast call, its output given the user's shape
    first = made(**args)
    fast = dict(made._fast)
    assert fast, "no fast call kept for the flat sweep"
    again = made(**args)
    assert again.shape == want.shape and relative_error(again, want) < 2e-2, seed
    assert torch.equal(first, again) and dict(made._fast) == fast


def test_a_record_tuned_before_row_tiles_runs_its_own_tiles_one_a_program():
    """Layer norm over D=1024 defaults to two 32 × 1024 tiles a program; a record of 32 × 512
    blocks (swept, which row tiles cannot be) from before row tiles were a knob still builds."""
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.row_reduction import row_reduction
    from tensorfuse.targets import get_target

    spec = get_target("cuda:sm_90a")
    record = dict(block_m=32, block_n=512, num_warps=4, num_stages=2, splits=1, reload=0)
    made = row_reduction(layernorm_channels, choose(layernorm_channels.program, spec)[1], spec,
                         tuned=lambda dims, scalars: (record, "an older record", None))
    knobs = made.build(B=8, D=1024, S=4096)[1]
    assert (knobs.block_n, knobs.row_tiles) == (512, 1)
    assert made.schedule_origin(B=8, D=1024, S=4096).startswith("tuned record (an older record")

