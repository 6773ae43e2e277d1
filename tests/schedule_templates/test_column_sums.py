"""Sums down the rows added up in the row kernel's own pass (a norm's weight gradient beside its
input gradient: :mod:`tensorfuse.schedule_templates.column_sums`): which sums the plan takes and
why it refuses the others, the knobs, the floor where rows are too wide, the generated code for
sm_90a, and the numbers (Triton's interpreter here, the GPU where there is one)."""
import warnings

import pytest
import torch

import tensorfuse as tf
import tensorfuse.dsl as T
import tensorfuse.kernels as K
from tensorfuse.algebra import plan_chain
from tensorfuse.errors import NoTemplateWarning, TargetError
from tensorfuse.schedule_templates.auto import choose, templated_stages
from tensorfuse.schedule_templates.tile_plan import plan_rowtile
from tensorfuse.targets import get_target
from tests.schedule_templates.column_sums_check import CASES, rmsnorm3

HOPPER = get_target("cuda:sm_90a")


def _plan(kernel, **sizes):
    program = kernel.program
    found = choose(program, HOPPER)
    assert found is not None, program.name
    chain = plan_chain(program, found[1].names, found[1].axis)
    return plan_rowtile(program, chain, sizes or dict.fromkeys(program.dim_names(), 64))


def test_a_norms_weight_and_bias_gradients_are_summed_in_the_row_kernel():
    plan = _plan(tf.grad(K.layernorm))
    assert [cs.name for cs in plan.column_sums] == ["d_weight_sum", "d_bias_sum"]
    assert [(c.name, kind) for c, _, kind in plan.outputs] == [
        ("d_x", "col"), ("d_weight", "colsum"), ("d_bias", "colsum")]
    assert "summed down the rows in the same pass: d_weight_sum" in plan.describe()
    # tokens of [B, S, D]: the weight gradient sums over the batch axis and the row axis
    batched = _plan(tf.grad(rmsnorm3))
    assert [cs.name for cs in batched.column_sums] == ["d_w_sum"]
    assert [a.name for a in batched.batch] == ["b"] and batched.row.name == "s"


@tf.kernel
def per_batch_column_sums(x: T.Tensor["B", "S", "D", "bf16"]):
    """A column sum per batch entry: over the tokens only, not every row the kernel visits."""
    b, s, d = T.axes("b s d")
    ms = T.sum(x[b, s, d] * x[b, s, d], over=d) / T.size("D")
    y = x[b, s, d] * T.rsqrt(ms + 1e-6)
    return T.cast(y, "bf16"), T.sum(y, over=s)


def test_sums_the_row_kernel_cannot_add_up_are_refused_with_the_reason():
    from tensorfuse.schedule_templates.auto import why_no_template

    program = per_batch_column_sums.program
    assert choose(program, HOPPER) is None
    why = why_no_template(program, HOPPER)
    assert "cannot add up in its pass: it is over b, d, not the swept axis d alone" in why, why
    # the floor still runs it: the sums as a stage of their own
    assert len(templated_stages(program, HOPPER)) >= 2


@tf.kernel
def centred_columns(x: T.Tensor["M", "N", "bf16"]):
    """A sum down the rows of a value centred by each column's mean: the mean is another sum
    down the rows, known only after every row."""
    i, j = T.axes("i j")
    ms = T.sum(x[i, j] * x[i, j], over=j) / T.size("N")
    col_mean = T.sum(x[i, j], over=i) / T.size("M")
    return T.cast(x[i, j] * T.rsqrt(ms + 1e-6), "bf16"), \
        T.sum((x[i, j] - col_mean) * T.rsqrt(ms + 1e-6), over=i)


def test_a_sum_down_the_rows_of_a_value_known_after_every_row_is_not_fused():
    from tensorfuse.schedule_templates.auto import why_no_template

    program = centred_columns.program
    assert choose(program, HOPPER) is None
    assert "cannot add up in its pass: it reads col_mean_sum, outside the chain" in \
        why_no_template(program, HOPPER)


def test_default_knobs_hold_whole_rows_and_sweep_about_two_programs_an_sm():
    k = tf.compile(tf.grad(K.rmsnorm), target="cuda:sm_90a").template
    plan, knobs = k.build(M=8192, N=4096)[:2]
    assert (knobs.block_m, knobs.block_n, knobs.splits, knobs.num_stages, knobs.reload) == \
        (1, 4096, 1, 3, 0)
    assert knobs.row_tiles == 32   # 8192 rows over 256 programs
    from tensorfuse.targets.triton.row_grid import grid

    assert grid(plan, knobs) == (256, 1)
    # ragged: the last program's tiles run past the rows
    plan, knobs = k.build(M=1000, N=4096)[:2]
    assert knobs.row_tiles == 4 and grid(plan, knobs) == (250, 1)


def test_a_tile_holds_its_row_operands_within_32k_elements():
    """x and the incoming gradient of a strided layer norm's backward (D=1024): 16-row tiles,
    not the forward's 32 (1696 bytes spilled, ptxas); a row of 16384 read again for the
    outputs rather than held (1464 bytes spilled)."""
    from benchmarks.user_kernels import layernorm_channels

    strided = tf.compile(tf.grad(layernorm_channels), target="cuda:sm_90a").template
    knobs = strided.build(B=8, D=1024, S=4096)[1]
    assert (knobs.block_m, knobs.block_n, knobs.reload) == (16, 1024, 0)
    # over D=2048 the forward sweeps 32 × 512 blocks: the whole row in 8-row tiles, not 1
    wider = strided.build(B=8, D=2048, S=4096)[1]
    assert (wider.block_m, wider.block_n) == (8, 2048)
    wide = tf.compile(tf.grad(K.layernorm), target="cuda:sm_90a").template
    assert wide.build(M=4096, N=16384)[1].reload == 1
    assert wide.build(M=4096, N=8192)[1].reload == 0


def test_rows_too_wide_for_one_block_run_staged():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = tf.compile(tf.grad(K.rmsnorm), target="cuda:sm_90a")
        wide = made.for_sizes(M=64, N=32768)
    from tensorfuse.staged import StagedKernel

    assert isinstance(wide, StagedKernel) and len(wide.stages) == 2
    assert made.for_sizes(M=64, N=4096) is made.template
    with pytest.raises(TargetError, match="whole row is one block"):
        made.template.build(M=64, N=32768)


def test_sm90a_code_pipelines_the_next_row_tile_and_adds_partials_in_a_second_kernel():
    """The row tiles' loop is Triton's pipeline (asynchronous copies); the source holds the
    kernel that adds the partial rows up."""
    pytest.importorskip("triton", reason="the row template generates Triton kernels")
    k = tf.compile(tf.grad(K.layernorm), target="cuda:sm_90a").template
    source = k.source(M=8192, N=4096)
    assert "for row_tile in tl.range(0, 32, 1, num_stages=3):" in source
    assert "def layernorm_backward_fused_sums(" in source
    assert "tl.atomic" not in source   # the same sums on every run
    ptx = k.ptx(M=8192, N=4096)
    assert "cp.async" in ptx


def test_column_sums_match_float64_in_the_triton_interpreter():
    from tests.helpers import check_interpreted

    check_interpreted("tests.schedule_templates.column_sums_check", CASES)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_column_sums_match_float64_on_the_gpu(name):
    from tests.helpers import gpu_case, relative_error
    from tests.schedule_templates.column_sums_check import _template

    kernel, knobs, case = CASES[name]
    args, want, seed = gpu_case(case)
    made = _template(kernel, **knobs)
    want = tuple(w.cuda() for w in want) if isinstance(want, tuple) else want.cuda()
    assert relative_error(made(**args), want) < 2e-2, seed


@pytest.mark.gpu
def test_a_norm_backward_at_training_sizes_matches_float64_on_the_gpu():
    """RMSNorm's backward at [8192, 4096] as tf.compile runs it (256 programs of 32 rows)."""
    from tests.helpers import fresh_seed, relative_error

    seed = fresh_seed()
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(8192, 4096, device="cuda", generator=g) * 4).bfloat16()
    w = (1 + 0.3 * torch.randn(4096, device="cuda", generator=g)).bfloat16()
    dy = torch.randn(8192, 4096, device="cuda", generator=g).bfloat16()
    leaves = [t.double().requires_grad_() for t in (x, w)]
    out = torch.nn.functional.rms_norm(leaves[0], (4096,), leaves[1], 1e-5)
    want = torch.autograd.grad(out, leaves, dy.double())
    made = tf.compile(tf.grad(K.rmsnorm))
    got = made(x, w, 1e-5, dy)
    assert made.for_sizes(M=8192, N=4096) is made.template
    assert relative_error(got, want) < 2e-2, seed
