"""Gathered reads' gradients as scatter-adds (:mod:`tensorfuse.schedule_templates.scatter`):
which sums the plan takes and why it refuses others, that ``tf.compile`` runs them so rather
than as dense reductions over every output element, the atomics in the sm_90a code, and the
numbers (Triton's interpreter here, the GPU where there is one)."""
import pytest
import torch

import tensorfuse as tf
import tensorfuse.dsl as T
from tensorfuse.dsl.printer import to_text
from tensorfuse.errors import TargetError
from tensorfuse.schedule_templates.scatter import plan_scatter
from tests.schedule_templates.scatter_check import CASES, embedding


def test_an_embeddings_gradient_is_a_scatter_of_the_incoming_rows_by_token():
    plan = plan_scatter(tf.grad(embedding).program)
    assert plan.describe().startswith(
        "scatter-add plan of embedding_backward: d_table_sum[table_0 = tokens[i]] += "
        "d_out[i, d], over i, d")
    assert [c.name for c, _ in plan.outputs] == ["d_table"]


def test_a_segments_gradient_keeps_the_length_condition_beside_the_index():
    from benchmarks.user_kernels import segment_mean

    plan = plan_scatter(tf.grad(segment_mean).program)
    assert plan.describe().startswith(
        "scatter-add plan of segment_mean_backward: d_x_sum[x_0 = starts[g] + r] += "
        "d_out[g, d] / max(lengths[g], 1) where r < lengths[g], over g, r, d")


@tf.kernel
def masked_row_sums(x: T.Tensor["M", "N", "bf16"], keep: T.Tensor["M", "i32"]):
    """A sum down the rows under a condition that names no output element."""
    i, j = T.axes("i j")
    return T.sum(T.where(keep[i] == 1, x[i, j], 0.0), over=i)


@tf.kernel
def two_sums(x: T.Tensor["M", "N", "bf16"]):
    i, j = T.axes("i j")
    return T.sum(x[i, j], over=j) + T.max(x[i, j], over=j)


@tf.kernel
def reads_its_own_slot(x: T.Tensor["M", "N", "bf16"], at: T.Tensor["M", "i32"]):
    """The value added reads the element's own axis: not a scatter."""
    i, j = T.axes("i j")
    return T.sum(T.where(at[i] == j, x[i, j], 0.0), over=i)


def _expert_positions():
    from benchmarks.unlisted_kernels import expert_positions

    return expert_positions


@pytest.mark.parametrize("kernel, why", [
    (masked_row_sums, "has no condition 'index == axis' on an axis of its result"),
    (two_sums, "2 reductions; a scatter-add program has one"),
    (reads_its_own_slot, "the value added into"),
    # a running count per expert: every (i, j) pair would be a term; the scan template's
    (_expert_positions(), r"j <= i relates a summed axis to one of out's result: a range")])
def test_sums_that_are_not_scatters_are_refused_with_the_reason(kernel, why):
    with pytest.raises(TargetError, match=why):
        plan_scatter(kernel.program)


def test_an_index_condition_beside_others_in_one_conjunction_is_a_scatter():
    """``(x[i, j] == k) & valid[i]``: the index's condition found among the conjunction's."""
    from tests.schedule_templates.scatter_check import masked_histogram

    plan = plan_scatter(masked_histogram.program)
    assert plan.axis.name == "k" and [to_text(c) for c in plan.conditions] == ["valid[i]"]


def test_tf_compile_runs_a_gathers_gradient_as_a_scatter_not_a_dense_row_sum():
    """The row template takes the embedding gradient too — as a sum over every token for every
    (id, feature), V·M·D terms; the scatter adds each token's row once."""
    from tensorfuse.schedule_templates.auto import choose, takes_stage
    from tensorfuse.targets import get_target
    from tensorfuse.targets.triton.scatter_kernel import ScatterKernel

    program = tf.grad(embedding).program
    hopper = get_target("cuda:sm_90a")
    assert choose(program, hopper) is not None
    assert takes_stage(program, hopper)
    made = tf.compile(tf.grad(embedding), target="cuda:sm_90a")
    assert isinstance(made, ScatterKernel)
    assert made.schedule_origin(V=64, M=128, D=32).startswith("scatter-add template")


def test_tuning_a_scatter_says_it_has_nothing_to_tune():
    """Its tasks would otherwise come from the row template's dense form, records tf.compile
    never reads."""
    from tensorfuse.autotune.tasks import make_task
    from tensorfuse.errors import TuningError
    from tensorfuse.targets import get_target

    with pytest.raises(TuningError, match="scatter-add template .* no knobs to tune"):
        make_task(tf.grad(embedding), dict(V=64, M=128, D=32), get_target("cuda:sm_90a"))


def test_a_token_count_seen_twice_becomes_an_argument_of_one_build():
    """A training loop's changing token counts: the first count exact, the second written as an
    argument, the third served by that build (tf.compile's dynamic=None)."""
    made = tf.compile(tf.grad(embedding), target="cuda:sm_90a")
    for m in (300, 200, 150):
        made.build(V=50, M=m, D=24)
    builds = made.cache_info()
    assert [b.exact for b in builds] == [True, False]
    assert [s["M"] for s in builds[1].sizes] == [200, 150]
    assert "_a_ok = _a_lin < (size_M * 24)" in made.source(V=50, M=150, D=24)


def test_offsets_past_two_to_the_31_are_64_bit():
    """A vocabulary of 2²⁰ rows of 4096: the accumulator's offsets (an i32 token times a row)
    pass 2³¹; with as many tokens, so do the terms'. With 8192 tokens the sums go through
    slots, whose offsets stay below: only the outputs' walk is 64-bit."""
    made = tf.compile(tf.grad(embedding), target="cuda:sm_90a")
    wide = made.source(V=1 << 20, M=1 << 20, D=4096)
    assert "_a_idx = (tl.load(tokens + (ax_i), mask=_a_ok, other=0)).to(tl.int64)" in wide
    assert "_a_lin = tl.program_id(0).to(tl.int64) * BLOCK_M" in wide
    assert "int64" not in made.source(V=32000, M=30000, D=4096)
    kernels = made.source(V=1 << 20, M=8192, D=4096).split("@triton.jit")
    assert ["int64" in k for k in kernels[-3:]] == [False, False, True]


def test_sm90a_code_adds_vectors_of_f32_atomically_and_relaxed():
    pytest.importorskip("triton", reason="the template generates Triton kernels")
    made = tf.compile(tf.grad(embedding), target="cuda:sm_90a")
    for sizes in (dict(V=128256, M=8192, D=4096), dict(V=8192, M=8192, D=4096)):
        terms = made.ptx("terms", **sizes)
        assert "atom.global.gpu.relaxed.add.v4.f32" in terms
        outputs = made.ptx("outputs", **sizes)
        assert "atom" not in outputs and "st.global.v4.b32" in outputs
    assert "atom.global.gpu.relaxed.min.s32" in made.ptx("claims", V=128256, M=8192, D=4096)
    with pytest.raises(ValueError, match="no 'claims' kernel: terms, outputs"):
        made.ptx("claims", V=8192, M=8192, D=4096)


@tf.kernel
def wide_histogram(x: T.Tensor["N", "i32"]):
    j = T.axes("j")
    k = T.axis("k", 5000)
    return T.sum(T.where(x[j] == k, 1, 0), over=j)


def test_counts_into_few_bins_are_counted_a_program_then_added_a_bin():
    """A byte histogram: each program counts its block into 256 bins in shared memory, then adds
    each bin to the accumulator once (an atomic add a term serialised on 256 addresses); a
    weighted sum and a count into more bins than a program holds keep an atomic add a term —
    and compile (a constant added a term once failed in Triton, not in its interpreter)."""
    pytest.importorskip("triton", reason="the template generates Triton kernels")
    from benchmarks.unlisted_kernels import byte_histogram
    from tests.schedule_templates.scatter_check import weighted_counts

    made = tf.compile(byte_histogram, target="cuda:sm_90a")
    assert "tl.histogram(" in made.source(N=1 << 20)
    assert made.schedule_origin(N=1 << 20).endswith(
        "each program counts 16384 terms into 256 bins of its own, then adds them")
    terms = made.ptx("terms", N=1 << 20)
    assert "atom.shared.add" in terms and "atom.global.gpu.relaxed.add.u32" in terms
    for kernel in (weighted_counts, wide_histogram):
        made = tf.compile(kernel, target="cuda:sm_90a")
        assert "tl.histogram" not in made.source(N=4096)
        assert "atom.global.gpu.relaxed.add" in made.ptx("terms", N=4096)


def test_a_vocabulary_far_larger_than_the_tokens_sums_into_slots():
    """Llama-3's vocabulary and 8192 tokens: the accumulator holds a row for each token (134 MB
    of f32), not one for each id of the vocabulary (2.1 GB); at as many ids as tokens it does
    not."""
    from tensorfuse.targets.triton.scatter import scratch_shapes

    made = tf.compile(tf.grad(embedding), target="cuda:sm_90a")
    llama = dict(V=128256, M=8192, D=4096)
    assert scratch_shapes(made.plan, llama) == {"acc": [8192, 4096], "owner": [128256]}
    assert scratch_shapes(made.plan, dict(V=16000, M=8192, D=4096)) == {"acc": [16000, 4096]}
    assert made.schedule_origin(**llama).endswith(
        "slots for the 8192 positions tokens[i] takes, of table_0's 128256 elements")
    source = made.source(**llama)
    assert "def embedding_backward_scatter_claims(" in source
    assert "tl.atomic_add(acc + (_a_slot * 4096 + ax_d)" in source
    assert "claims" not in made.source(V=16000, M=8192, D=4096)


def test_slots_are_decided_again_outside_a_builds_guards():
    """With sizes as arguments the choice of slots is a guard of the build: a vocabulary that
    turns it gets a build of its own."""
    made = tf.compile(tf.grad(embedding), target="cuda:sm_90a", dynamic=True)
    made.build(V=3000, M=200, D=24)
    made.build(V=3000, M=300, D=24)
    made.build(V=3000, M=2000, D=24)
    builds = made.cache_info()
    assert len(builds) == 2
    assert "2 * size_M <= size_V" in builds[0].guards.describe()
    assert [s["M"] for s in builds[0].sizes] == [200, 300]


def test_scatters_match_float64_in_the_triton_interpreter():
    from tests.helpers import check_interpreted

    check_interpreted("tests.schedule_templates.scatter_check", CASES)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_scatters_match_float64_on_the_gpu(name):
    from tests.helpers import gpu_case

    from tests.schedule_templates.scatter_check import exact_for_integers

    kernel, case = CASES[name]
    args, want, seed = gpu_case(case)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32}[
        kernel.program.outputs[0].dtypes[0]]
    out = torch.full(want.shape, float("nan") if dtype.is_floating_point else -7, device="cuda",
                     dtype=dtype)
    assert tf.compile(kernel)(**args, out=out) is out
    assert exact_for_integers(out, want.cuda()) < 2e-2, seed
