"""The contraction template: GEMM-shaped programs as Triton tensor-core tiles, planned by the roles
of their axes, checked against float64 under Triton's interpreter, compiled for sm_90a, sm_80 and
gfx942, and chosen by ``tf.compile`` (alone, and as the GEMM stages of a floor)."""
import math
import warnings

import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks import unlisted_kernels as unlisted
from benchmarks.contraction import batched_product, transposed_product
from tensorfuse import dsl as T
from tensorfuse.autograd import grad
from tensorfuse.errors import NoTemplateWarning, ScheduleError, TargetError
from tensorfuse.kernels.layers import swiglu_mlp_kernel
from tensorfuse.schedule_templates.auto import takes_stage
from tensorfuse.schedule_templates.contraction import (ContractionKnobs, check_contraction,
                                                       default_contraction_knobs, shared_bytes,
                                                       triton_contraction)
from tensorfuse.schedule_templates.contraction_plan import gemm_shaped, plan_contraction
from tensorfuse.staged import StagedKernel
from tensorfuse.targets import get_target
from tests.helpers import (assert_gpu_template_matches, fresh_seed, gpu_case, relative_error,
                           run_interpreted)
from tests.schedule_templates.contraction_cases import (BF16_INTERPRETED, CASES, TOLERANCE,
                                                        best_match, bilinear_form, contraction,
                                                        gated_gradient, matmul_f32,
                                                        scaled_linear, scores_bshd,
                                                        swiglu_backward_case,
                                                        token_weight_gradient, weight_gradient)

HOPPER, AMPERE, MI300 = (get_target(t) for t in ("cuda:sm_90a", "cuda:sm_80", "rocm:gfx942"))


def roles(kernel):
    plan = plan_contraction(kernel.program)
    return plan.rows.name, plan.cols.name, plan.k_names, tuple(a.name for a in plan.batch)


def test_the_axes_are_found_by_their_roles_in_any_layout():
    assert roles(K.matmul) == ("i", "j", "k", ())
    assert roles(K.linear) == ("i", "j", "k", ())          # the weight [N, K], read as it lies
    # a weight gradient: the rows operand x[b, i, k] read with its contracted axis outermost
    assert roles(weight_gradient) == ("k", "n", "i", ("b",))
    # nn.Linear's on [B, S, ·] activations: batch and tokens contracted, swept as one index
    assert roles(token_weight_gradient) == ("n", "k", "b, s", ())
    # scores of [B, S, H, D] tensors into [B, H, M, N]: the heads a batch axis, read in place
    assert roles(scores_bshd) == ("i", "j", "d", ("b", "h"))

    @tf.kernel
    def transposed_out(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["K", "N", "bf16"]):
        j, i, k = T.axes("j i k")   # an output's axes are in the order they are declared
        return T.sum(x[i, k] * w[k, j], over=k)

    # the output [N, M]: its innermost axis (i) takes the columns, so the stores run along it
    assert roles(transposed_out) == ("j", "i", "k", ())


def test_gated_sums_share_the_tile_loop_and_rounding_is_said():
    plan = plan_contraction(K.swiglu_gate.program)
    assert len(plan.products) == 2 and all(p.dtype == "bf16" and not p.rounded
                                           for p in plan.products)
    gated = plan_contraction(gated_gradient.program)
    assert gated.products[0].rounded == ("cols",)
    assert "cols side rounded to bf16" in gated.describe()
    f32 = plan_contraction(matmul_f32.program)
    assert f32.products[0].dtype == "f32" and not f32.products[0].rounded
    # factors of no contracted axis scale the accumulator once: the sides stay plain loads
    (scaled,) = plan_contraction(scaled_linear.program).products
    assert [type(side).__name__ for side in (scaled.rows_side, scaled.cols_side)] == \
        ["Load", "Load"] and not scaled.rounded and scaled.outer is not None


@tf.kernel
def pairwise_product(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"]):
    i, j, d = T.axes("i j d")
    return T.prod(x[i, d] - y[j, d], over=d)


@pytest.mark.parametrize("kernel, message", [
    (K.attention, "rolling update"),
    (K.softmax, "the output out is not indexed like the sums"),
    (pairwise_product, "is not a sum, maximum or minimum"),
    (K.ffn_gelu, "other axes"),
])
def test_programs_that_are_not_one_contraction_are_refused_with_the_reason(kernel, message):
    with pytest.raises(ScheduleError, match=message):
        plan_contraction(kernel.program)


def test_a_factor_of_rows_columns_and_the_contraction_or_a_row_vector_product_is_refused():
    @tf.kernel
    def masked_product(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["K", "N", "bf16"],
                       m: T.Tensor["M", "N", "bf16"]):
        i, j, k = T.axes("i j k")
        return T.sum(x[i, k] * w[k, j] * m[i, j], over=k)

    @tf.kernel
    def third_operand(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["K", "N", "bf16"],
                      t: T.Tensor["M", "N", "K", "bf16"]):
        i, j, k = T.axes("i j k")
        return T.sum(x[i, k] * w[k, j] * t[i, j, k], over=k)

    @tf.kernel
    def gemv(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["K", "bf16"]):
        i, k = T.axes("i k")
        return T.sum(x[i, k] * w[k], over=k)

    @tf.kernel
    def int_product(x: T.Tensor["M", "K", "i32"], w: T.Tensor["K", "N", "i32"]):
        i, j, k = T.axes("i j k")
        return T.sum(x[i, k] * w[k, j], over=k)

    for kernel in (third_operand, gemv):
        with pytest.raises(ScheduleError, match="no rows and columns axes"):
            plan_contraction(kernel.program)
    # a factor of rows and columns but not of the contracted axis leaves the sum: it is taken
    assert plan_contraction(masked_product.program).products[0].outer is not None
    with pytest.raises(ScheduleError, match="integers"):
        plan_contraction(int_product.program)
    assert not gemm_shaped(gemv.program) and gemm_shaped(K.attention.program)


def test_every_case_agrees_with_float64_under_the_interpreter():
    errors = run_interpreted("tests.schedule_templates.contraction_cases", fresh_seed())
    assert set(errors) == set(CASES)
    for name, error in errors.items():
        assert error <= TOLERANCE[name], (name, error)


def test_swiglus_backward_runs_its_gemm_stages_on_the_contraction_template():
    """tf.grad of Llama's MLP: no stage on TVM's default schedule (a weight gradient took 7.6 s
    of a training step there), every GEMM stage on the Hopper GEMM or the contraction template,
    and the gradients of all four tensors against torch's float64 autograd."""
    backward = grad(swiglu_mlp_kernel("bf16"))
    sizes = dict(M=4096, K=4096, N=14336, O=4096)
    for target, natives in ((HOPPER, ("hopper_gemm", "contraction")), (AMPERE, ("contraction",))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NoTemplateWarning)
            made = tf.compile(backward, target=target)
        assert isinstance(made, StagedKernel)
        origins = [k.schedule_origin(**{n: v for n, v in sizes.items()
                                        if n in k.program.dim_names()}) for k in made.kernels]
        assert all(o.startswith(natives) for o in origins), origins
        assert "contraction" in " ".join(origins)
    errors = run_interpreted("tests.schedule_templates.contraction_cases", fresh_seed(),
                             "swiglu_backward")
    assert len(errors) == 4 and max(errors) <= BF16_INTERPRETED, errors


def test_the_floor_cuts_sums_the_contraction_template_refuses_together():
    """Three weight gradients over the same axis into differently indexed outputs: one stage
    for the row-tile template (which would run them a row at a time), two for the contraction
    template."""
    from tensorfuse.schedule_templates.stages import plan_stages

    program = grad(swiglu_mlp_kernel("bf16")).program
    stages = plan_stages(program, lambda sub: takes_stage(sub, HOPPER))
    together = [s.reduces for s in stages if len(s.reduces) > 1]
    assert ("d_gate_proj_sum", "d_up_proj_sum") in together
    assert not any("d_down_proj_sum" in r and len(r) > 1 for r in together)
    assert all(s.templated for s in stages)


def test_a_computed_side_read_by_several_tiles_is_stored_once_before_them():
    """SwiGLU's gate-weight gradient: its columns side, computed from two f32 tensors, is
    stored in bf16 by a kernel of its own, then read by the tiles as a load (rounded as the
    tiles rounded it); where one row block of tiles reads it, it stays in the tiles."""
    plan = plan_contraction(gated_gradient.program)
    (staged,) = plan.staging.staged
    assert staged.side == "cols" and [a.name for a in staged.axes] == ["i", "n"]
    (product,) = plan.staging.products
    assert product.cols_side.param is staged.param and staged.param.dtype == "bf16"
    assert not product.rounded and "stored as bf16 before the tiles" in plan.staging.describe()
    assert plan_contraction(K.linear.program).staging is None
    sizes = dict(M=8192, K=4096, N=14336)
    assert default_contraction_knobs(plan, sizes, HOPPER).stage_sides == 1
    assert default_contraction_knobs(plan, {**sizes, "K": 64}, HOPPER).stage_sides == 0
    made = triton_contraction(gated_gradient, HOPPER)
    source = made.source(**sizes)
    stage, tiles = source.split("def gated_gradient_gemm_tiles(")
    assert "def gated_gradient_gemm_tiles_stage_0(" in stage and "tl.sigmoid" in stage
    assert "tl.sigmoid" not in tiles and "staged_out_cols" in tiles
    assert "computed sides staged" in made.schedule_origin(**sizes)
    # the interpreter's case runs the staged form (its small tiles leave two row blocks)
    assert "computed sides staged" in contraction(gated_gradient).schedule_origin(M=50, K=24,
                                                                                  N=35)
    in_tiles = triton_contraction(gated_gradient, HOPPER, stage_sides=0).source(**sizes)
    assert "_stage_0" not in in_tiles and "tl.sigmoid" in in_tiles
    with pytest.raises(TargetError, match="none to stage"):
        check_contraction(plan_contraction(K.linear.program), ContractionKnobs(stage_sides=1),
                          HOPPER)


@pytest.mark.parametrize("target, instruction", [(HOPPER, "wgmma.mma_async"),
                                                 (AMPERE, "mma.sync.aligned"),
                                                 (MI300, "v_mfma")])
def test_tiles_compile_to_the_gpus_tensor_core_instructions(target, instruction):
    from benchmarks.pipeline_kernels import expert_linear

    for kernel, sizes in ((K.linear, dict(M=4096, K=4096, N=4096)),
                          (gated_gradient, dict(M=4096, K=4096, N=1000)),
                          # rows grouped by a gathered expert: the loop over a tile's experts
                          (expert_linear, dict(T=8192, K=2048, N=4096, E=8))):
        compiled = triton_contraction(kernel, target).compiled(**sizes)
        code = compiled.asm.get("ptx") or compiled.asm["amdgcn"]
        assert instruction in code, (kernel.name, target.name)
        assert compiled.metadata.shared <= target.max_shared_memory


def test_knobs_fit_the_gpu_and_bad_knobs_are_refused():
    plan = plan_contraction(K.swiglu_gate.program)
    sizes = dict(M=4096, K=4096, N=4096)
    for target in (HOPPER, AMPERE, MI300, get_target("cuda:sm_86")):
        check_contraction(plan, default_contraction_knobs(plan, sizes, target), target)
    # a depth GPUs of 99 KiB (sm_86) and 64 KiB (CDNA) hold, three stages on the H100's 227
    assert default_contraction_knobs(plan, sizes, HOPPER).num_stages == 3
    assert default_contraction_knobs(plan, sizes, MI300).num_stages == 2
    assert shared_bytes(plan, default_contraction_knobs(plan, sizes, MI300)) <= 56 * 1024
    few = default_contraction_knobs(plan, dict(M=5, K=64, N=4096), HOPPER)
    assert few.block_m == 16   # tl.dot's smallest
    # a short contracted axis: its stores bound it, several smaller programs an SM
    bmm = plan_contraction(batched_product.program)
    short = default_contraction_knobs(bmm, dict(Z=16, M=2048, K=128, N=2048), HOPPER)
    assert (short.block_m, short.block_n, short.num_warps, short.num_stages) == (128, 128, 4, 2)
    deep = default_contraction_knobs(bmm, dict(Z=16, M=2048, K=256, N=2048), HOPPER)
    assert (deep.block_n, deep.num_warps, deep.num_stages) == (256, 8, 3)
    with pytest.raises(TargetError, match="powers of two"):
        check_contraction(plan, ContractionKnobs(block_n=48), HOPPER)
    with pytest.raises(TargetError, match="shared memory"):
        check_contraction(plan, ContractionKnobs(block_n=256, num_stages=6), HOPPER)
    with pytest.raises(ScheduleError, match="no knob"):
        triton_contraction(K.matmul, HOPPER, tile=3)


def test_outputs_of_few_tiles_split_the_contracted_axis():
    """Too few tiles for half the SMs split the contracted axis into about a program per SM
    (a Gram matrix of 1024 columns over 65536 rows: 32 tiles in 4 parts; 8 experts' gradient
    over 8192 tokens: 16 tiles in 8), each part 8 blocks deep at least; many tiles, a short
    contracted axis and pairwise reductions (which finish in one program) are not split, and
    asking them to be is refused; a GEMM reduced over its columns splits its columns instead of
    narrowing its rows to 16 (a bilinear form's 4096 rows had left the tensor cores idle);
    both kernels of a split compile for sm_90a, the parts combined in slices of rows."""
    gram, manhattan = unlisted.gram_matrix, unlisted.manhattan_distances
    knobs = default_contraction_knobs(plan_contraction(gram.program), dict(N=65536, D=1024),
                                      HOPPER)
    assert (knobs.block_m, knobs.block_n, knobs.splits) == (128, 256, 4)
    knobs = default_contraction_knobs(plan_contraction(transposed_product.program),
                                      dict(R=8192, M=8, N=4096), HOPPER)
    assert (knobs.block_m, knobs.splits) == (16, 8)
    for kernel, sizes in ((gram, dict(N=256, D=1024)), (K.linear, dict(M=4096, K=4096, N=4096)),
                          (manhattan, dict(M=64, N=64, D=65536))):
        assert default_contraction_knobs(plan_contraction(kernel.program), sizes,
                                         HOPPER).splits == 1, kernel.name
    with pytest.raises(TargetError, match="only sums on the tensor cores split"):
        check_contraction(plan_contraction(manhattan.program),
                          ContractionKnobs(block_k=4, splits=2), HOPPER)
    with pytest.raises(TargetError, match="1 to 64 parts"):
        check_contraction(plan_contraction(gram.program), ContractionKnobs(splits=0), HOPPER)
    # reductions over the columns: 64-row tiles, the columns in parts for ~8 programs an SM
    knobs = default_contraction_knobs(plan_contraction(bilinear_form.program),
                                      dict(B=4096, I=4096, J=4096), HOPPER)
    assert (knobs.block_m, knobs.block_n, knobs.splits) == (64, 256, 4)
    knobs = default_contraction_knobs(plan_contraction(best_match.program),
                                      dict(M=8192, N=65536, D=256), HOPPER)
    assert (knobs.block_m, knobs.splits) == (64, 8)
    assert default_contraction_knobs(plan_contraction(best_match.program),
                                     dict(M=65536, N=4096, D=256), HOPPER).splits == 1
    made = triton_contraction(gram, HOPPER)
    assert "in 4 parts" in made.schedule_origin(N=65536, D=1024)
    source = made.source(N=65536, D=1024)
    assert "def gram_matrix_gemm_tiles_combine(" in source and "partials" in source
    assert "wgmma.mma_async" in made.ptx(N=65536, D=1024)
    # its 32 tiles combined in 4 slices of 32 rows each: 128 programs
    assert "pid_s = pid % 4" in source.split("def gram_matrix_gemm_tiles_combine(")[1]
    combine = made.compiled("combine", N=65536, D=1024).asm["ptx"]
    assert "ld.global.v4.b32" in combine


def test_tf_compile_gives_gemms_tensor_core_tiles_on_every_gpu():
    sizes = dict(M=4096, K=4096, N=4096)
    for target in (AMPERE, MI300):
        assert tf.compile(K.matmul, target).schedule_origin(**sizes).startswith(
            "contraction template defaults")
    # where the Hopper GEMM runs, it is first (measured at cuBLAS: benchmarks.hopper_gemm)
    assert tf.compile(K.matmul, HOPPER).schedule_origin(**sizes).startswith("hopper_gemm")
    made = tf.compile(weight_gradient, HOPPER)
    assert made.schedule_origin(B=2, M=4096, K=1024, N=1024).startswith("contraction")


def test_a_fast_calls_scratch_places_each_stored_tensor_apart_on_128_byte_boundaries():
    """The staged sides (bf16, f32) and a split's partial tiles in one float32 buffer: each at a
    128-byte boundary, none overlapping the next, the buffer holding the last."""
    import torch

    from tensorfuse.targets.triton.contraction_kernel import scratch_layout

    stored = [("side", [3, 5, 7], torch.bfloat16), ("gate", [33], torch.float32),
              ("partials", [1000], torch.float32)]
    places, total = scratch_layout(stored)
    assert [name for name, _, _ in places] == ["side", "gate", "partials"]
    offsets = [4 * offset for _, _, offset in places]   # bytes
    assert all(o % 128 == 0 for o in offsets)
    ends = [o + math.prod(shape) * dtype.itemsize
            for o, (_, shape, dtype) in zip(offsets, stored)]
    assert all(end <= start for end, start in zip(ends, offsets[1:]))
    assert ends[-1] <= 4 * total < ends[-1] + 128


def test_a_new_size_is_an_argument_after_the_second_value():
    made = triton_contraction(K.linear, HOPPER)
    for m in (100, 200, 300):
        made.source(M=m, K=512, N=512)
    builds = made.cache_info()
    assert len(builds) == 2 and not builds[1].exact
    assert [s["M"] for s in builds[1].sizes] == [200, 300]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_cases_on_the_gpu_against_float64(name):
    """On the GPU (round to nearest): bf16 outputs within 2⁻⁹ and a rounded f32 side as much
    again, f32 ones exact to f32."""
    kernel, case = CASES[name]
    tolerance = 1e-5 if name == "matmul_f32" else 1e-2
    if not hasattr(kernel, "knobs"):
        assert_gpu_template_matches(kernel, case, tolerance)
        return
    args, want, seed = gpu_case(case)   # the template with these knobs, not tf.compile's pick
    made = triton_contraction(kernel, get_target("cuda"), **kernel.knobs)
    assert relative_error(made(**args), want) < tolerance, seed
    # again through the fast call, its scratch the parts' tiles and the staged sides
    assert relative_error(made(**args), want) < tolerance, seed
    assert made._fast, "a repeated call keeps a fast call"
    assert relative_error(made(**args), want) < tolerance, seed


@pytest.mark.gpu
def test_swiglus_backward_on_the_gpu_against_float64():
    args, want, seed = gpu_case(lambda g: swiglu_backward_case(g, M=300, K=256, N=700, O=200))
    got = tf.compile(grad(swiglu_mlp_kernel("bf16")))(**args)
    errors = [relative_error(g, w) for g, w in zip(got, want, strict=True)]
    assert max(errors) <= 1e-2, (errors, seed)


def test_an_ffn_too_wide_for_the_row_tile_runs_as_contraction_stages_not_tvms_schedule():
    """Two chained GEMMs on an A100 or an MI300 (no Hopper FFN there): where the row-tile
    template cannot hold the feature axis, the floor's two stages, each on the contraction
    template, said once; small sizes keep the fused row tile."""
    sizes = dict(M=4096, K=4096, N=14336, O=4096)
    for target in (AMPERE, MI300):
        made = tf.compile(K.ffn_gelu, target)
        with pytest.warns(NoTemplateWarning, match="runs as 2 kernels"):
            origin = made.schedule_origin(**sizes)
        assert origin.startswith("staged: 2 kernels") and origin.count("contraction template") == 2
        assert "TVM" not in origin
        assert made.schedule_origin(M=64, K=64, N=128, O=64) == "template defaults"
        assert "gemm_tiles" in made.source(**sizes)
    # an attention past the row tile's head dims: its scores stored between three stages, each
    # on a template (scores and p·v on the contraction template, the softmax's statistics on the
    # row template), as the unfused torch sequence stores them
    made = tf.compile(K.attention, AMPERE)
    with pytest.warns(NoTemplateWarning, match="runs as 3 kernels"):
        origin = made.schedule_origin(B=1, H=2, M=512, N=512, D=1024)
    assert origin.startswith("staged: 3 kernels") and "TVM" not in origin, origin
    assert origin.count("contraction template") == 2 and \
        "[2] m, l from scale, s_sum: template defaults" in origin, origin
    # at 512 its features in chunks: one kernel where the shared memory holds their tiles (an
    # H100's), two on an A100, whose 163 KiB do not hold the query tile's chunks beside the keys'
    # and values' (the scores on the contraction template, then the rest in chunks)
    assert tf.compile(K.attention, "cuda:sm_90a").schedule_origin(
        B=1, H=2, M=512, N=512, D=512) == "template defaults"
    with pytest.warns(NoTemplateWarning, match="needs 196608 bytes of shared memory"):
        origin = tf.compile(K.attention, AMPERE).schedule_origin(B=1, H=2, M=512, N=512, D=512)
    assert origin.startswith("staged: 2 kernels") and "needs 196608 bytes of shared memory" in \
        origin and "[2] out from v, scale, s_sum: template defaults" in origin, origin


@pytest.mark.gpu
def test_a_tuned_record_is_what_tf_compile_runs_and_agrees_with_float64(tmp_path, monkeypatch):
    """A weight gradient (the Hopper GEMM does not take it) tuned on this GPU: tf.compile then
    names the record and its result still agrees with float64."""
    from tensorfuse.autotune import tune
    from tests.schedule_templates.contraction_cases import _weight_gradient

    monkeypatch.setenv("TENSORFUSE_CACHE", str(tmp_path / "cache"))
    sizes = dict(B=2, M=512, K=256, N=192)
    summary = tune(weight_gradient, trials=8, progress=False, **sizes)
    assert summary.tasks[0].template == "contraction"
    made = tf.compile(weight_gradient)
    assert made.schedule_origin(**sizes).startswith("contraction tuned record")
    args, want, seed = gpu_case(lambda g: _weight_gradient(g, **sizes))
    assert relative_error(made(**args), want) <= 1e-2, seed


def test_more_batch_indices_than_a_grid_holds_fall_back_with_the_reason():
    made = triton_contraction(weight_gradient, HOPPER)
    with pytest.raises(TargetError, match="65535"):
        made.build(B=70000, M=16, K=16, N=16)
    assert not made.fits(B=70000, M=16, K=16, N=16) and made.fits(B=7, M=16, K=16, N=16)


def test_tensors_of_two_to_the_31_elements_are_addressed_in_64_bits():
    made = triton_contraction(K.matmul, HOPPER)
    source = made.source(M=65536, K=40000, N=4096)   # x has 2.6e9 elements
    assert "pid_m.to(tl.int64)" in source and "(k0 + tl.arange(0, BLOCK_K)).to(tl.int64)" in source
    assert "int64" not in made.source(M=4096, K=4096, N=4096)


def test_tf_compile_s_dynamic_option_reaches_the_contraction_kernels():
    """dynamic=True: every size an argument from the first build; False: one build per sizes."""
    for dynamic, builds in ((True, 1), (False, 3)):
        made = tf.compile(weight_gradient, AMPERE, dynamic=dynamic)
        for m in (100, 200, 300):
            made.source(B=2, M=m, K=64, N=64)
        assert len(made.cache_info()) == builds, dynamic


@tf.kernel
def _widened_bf16(x: T.Tensor["M", "K", "bf16"], y: T.Tensor["N", "K", "bf16"]):
    i, n, k = T.axes("i n k")
    return T.sum(T.cast(x[i, k], "f32") * T.cast(y[n, k], "f32"), over=k)


@tf.kernel
def _widened_against_f32(x: T.Tensor["M", "K", "bf16"], y: T.Tensor["N", "K", "f32"]):
    i, n, k = T.axes("i n k")
    return T.sum(T.cast(x[i, k], "f32") * y[n, k], over=k)


def test_widening_casts_of_one_16_bit_type_leave_the_products_on_the_tensor_cores():
    """Both sides 16-bit loads cast to f32 (computing in f32, as users write it): the tensor
    cores multiply the stored values, exact in f32, not IEEE f32 products on the FMA units;
    beside an f32 tensor the cast stays (its values would be rounded to bf16)."""
    plan = plan_contraction(_widened_bf16.program)
    assert [(str(p.rows_side.param.name), p.dtype, p.rounded) for p in plan.products] == \
        [("x", "bf16", ())]
    plan = plan_contraction(_widened_against_f32.program)
    assert [(p.dtype, p.rounded) for p in plan.products] == [("f32", ())]


@tf.kernel
def _expert_and_shared(x: T.Tensor["T", "K", "bf16"], w: T.Tensor["E", "N", "K", "bf16"],
                       s: T.Tensor["N", "K", "bf16"], expert: T.Tensor["T", "i32"]):
    """A routed expert's product beside a shared expert's, as two sums."""
    t, n, k = T.axes("t n k")
    return T.sum(x[t, k] * w[expert[t], n, k], over=k) + T.sum(x[t, k] * s[n, k], over=k)


def test_rows_grouped_by_a_gather_take_every_sum_through_it_or_are_refused():
    """A tile takes its rows one expert at a time for the sums through the gather; a sum
    without it would be computed again for every expert present, so the plan refuses it (the
    floor's stages take the sums apart), saying why."""
    with pytest.raises(ScheduleError, match=r"does not read the columns side through "
                                            r"expert\[t\] as the other sums do"):
        plan_contraction(_expert_and_shared.program)
