"""Pairwise reductions on the contraction template's tiles: ``Σ_d f(x[i, d], y[j, d])`` and its
maxima and minima — distances between point sets, a max-plus product — and reductions of them
over the columns (a Gaussian kernel's sum, nearest neighbours), planned by the roles of their
loads, compiled for sm_90a and gfx942, and checked against float64 in Triton's interpreter
(the cases: :mod:`tests.schedule_templates.pairwise_check`)."""
import warnings

import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import NoTemplateWarning, ScheduleError, TargetError
from tensorfuse.schedule_templates.contraction import (ContractionKnobs, check_contraction,
                                                       default_contraction_knobs,
                                                       triton_contraction)
from tensorfuse.schedule_templates.contraction_plan import gemm_shaped, plan_contraction
from tensorfuse.targets import get_target
from tests.helpers import fresh_seed, ptxas_spills, run_interpreted
from benchmarks.unlisted_kernels import gaussian_kernel_sum
from tests.schedule_templates.pairwise_check import (CASES, TOLERANCE, batched_nearest_neighbour,
                                                     chebyshev_distances, exp_kernel_sum,
                                                     kernel_regression, max_plus,
                                                     product_statistics, squared_distances,
                                                     weighted_distances)

pytest.importorskip("triton", reason="the contraction template generates Triton kernels")
HOPPER, MI300 = get_target("cuda:sm_90a"), get_target("rocm:gfx942")


@tf.kernel
def shared_operand(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"],
                   t: T.Tensor["M", "N", "D", "f32"]):
    i, j, d = T.axes("i j d")
    return T.sum((x[i, d] - y[j, d]) * t[i, j, d], over=d)


@tf.kernel
def hamming(x: T.Tensor["M", "D", "i32"], y: T.Tensor["N", "D", "i32"]):
    i, j, d = T.axes("i j d")
    return T.sum(T.where(x[i, d] != y[j, d], 1, 0), over=d)


def test_reductions_whose_loads_read_one_side_each_are_planned_as_pairs():
    plan = plan_contraction(squared_distances.program)
    assert not plan.products and [(p.name, p.monoid) for p in plan.pairwise] == [("out", "sum")]
    assert (plan.rows.name, plan.cols.name, plan.k_names) == ("i", "j", "d")
    assert "every (row, column) pair on the CUDA cores" in plan.describe()
    assert [p.monoid for p in plan_contraction(chebyshev_distances.program).pairwise] == ["max"]
    # b[k, j]: the columns' operand read down its outer axis, by its roles, not its place
    tropical = plan_contraction(max_plus.program)
    assert tropical.pairwise[0].monoid == "max" and tropical.cols.name == "j"
    assert not gemm_shaped(squared_distances.program)   # the floor keeps GEMMs, not pairs
    # a load of both sides has no tile of its own; integers would be rounded in f32
    with pytest.raises(ScheduleError, match="no rows and columns axes"):
        plan_contraction(shared_operand.program)
    with pytest.raises(ScheduleError, match="integers"):
        plan_contraction(hamming.program)


@tf.kernel
def soft_nearest(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"]):
    i, j, d = T.axes("i j d")
    d2 = T.sum((x[i, d] - y[j, d]) * (x[i, d] - y[j, d]), over=d)
    m = T.min(d2, over=j)
    return T.sum(T.exp(m - d2), over=j)


def test_reductions_of_the_pairs_over_the_columns_are_one_kernel():
    """A Gaussian kernel's sum, nearest neighbours, kernel regression: a program a row block
    sweeps the columns, nothing [rows, columns] stored; a reduction over the columns read by
    another (a soft minimum's) is left to the stages, with the reason."""
    plan = plan_contraction(gaussian_kernel_sum.program)
    assert [p.name for p in plan.pairwise] == ["d2"] and plan.cols.name == "j"
    assert [(p.name, p.monoid) for p in plan.over_columns] == [("out", "sum")]
    assert "over each row's columns" in plan.describe()
    regression = plan_contraction(kernel_regression.program)
    assert sorted(p.monoid for p in regression.over_columns) == ["sum", "sum"]
    assert [p.monoid for p in
            plan_contraction(batched_nearest_neighbour.program).over_columns] == ["min"]
    with pytest.raises(ScheduleError, match="rolling update"):
        plan_contraction(soft_nearest.program)
    made = tf.compile(gaussian_kernel_sum, "cuda:sm_90a")
    origin = made.schedule_origin(M=16384, N=16384, D=3)
    assert origin.startswith("contraction template") and "staged" not in origin
    source = made.source(M=16384, N=16384, D=3)
    assert "for n0 in range(" in source and source.count("tl.store(") == 1
    # 16 rows × 256 columns a block over a short contracted axis, 32 × 128 over a long one,
    # narrowed for two programs on each SM
    assert "block_m=16, block_n=256" in origin
    assert "block_m=32, block_n=128" in made.schedule_origin(M=16384, N=16384, D=64)
    assert "block_m=16, block_n=128" in made.schedule_origin(M=4096, N=4096, D=64)


def test_tf_compile_tiles_pairs_however_few_their_terms():
    """A few terms a pair are not written out in one flat pass (which reads both operands'
    rows again for every pair): the tiles take them, narrower over a short contracted axis, and
    tuning tunes those."""
    made = tf.compile(squared_distances, "cuda:sm_90a")
    assert made.schedule_origin(M=4096, N=4096, D=128).startswith(
        "contraction template defaults (block_m=128, block_n=128, block_k=4, warps=4")
    assert made.schedule_origin(M=4096, N=4096, D=8).startswith(
        "contraction template defaults (block_m=64, block_n=64, block_k=4, warps=2")
    # tuning agrees: it tunes the tiles, and does not refuse them as written out
    from tensorfuse.autotune.tasks import make_task

    assert make_task(squared_distances, dict(M=4096, N=4096, D=8), HOPPER).template == \
        "contraction"


@pytest.mark.parametrize("target", [HOPPER, MI300], ids=["sm_90a", "gfx942"])
def test_pairs_compile_at_ragged_sizes_without_shuffles(target):
    """Each block's indices stay inside a thread: no warp shuffles (a [M, K, N] broadcast
    reduced along K had 64 a block on sm_90a)."""
    for kernel, sizes in ((squared_distances, dict(M=4096, N=4096, D=128)),
                          (weighted_distances, dict(M=1000, N=999, D=77))):
        compiled = triton_contraction(kernel, target).compiled(**sizes)
        code = compiled.asm.get("ptx") or compiled.asm["amdgcn"]
        assert "shfl" not in code and "ds_swizzle" not in code and "dpp" not in code, kernel.name
        if target is HOPPER:
            assert "sub.f32" in code or "add.f32" in code
    # reductions over the columns: one fold across the lanes a block of columns
    compiled = triton_contraction(kernel_regression, target).compiled(M=1000, N=999, D=5)
    code = compiled.asm.get("ptx") or compiled.asm["amdgcn"]
    assert ("ex2.approx" in code) if target is HOPPER else ("v_exp_f32" in code)


def test_three_reductions_over_the_columns_take_narrower_tiles_without_spills():
    """Each keeps a tile-sized state: 64 × 256 tiles spilled three of them (332 bytes), 128
    columns hold them; fewer keep the wide tiles."""
    sizes = dict(M=8192, N=65536, D=256)
    knobs = default_contraction_knobs(plan_contraction(product_statistics.program), sizes, HOPPER)
    assert (knobs.block_m, knobs.block_n) == (64, 128)
    one = default_contraction_knobs(plan_contraction(exp_kernel_sum.program), sizes, HOPPER)
    assert (one.block_m, one.block_n) == (64, 256)
    ptx = triton_contraction(product_statistics, HOPPER).compiled(**sizes).asm["ptx"]
    assert not any(ptxas_spills(ptx))


def test_pairwise_knobs_and_their_limits():
    plan = plan_contraction(squared_distances.program)
    sizes = dict(M=4096, N=4096, D=128)
    knobs = default_contraction_knobs(plan, sizes, HOPPER)
    assert (knobs.block_m, knobs.block_n, knobs.block_k, knobs.num_warps) == (128, 128, 4, 4)
    few = default_contraction_knobs(plan, dict(M=5, N=4096, D=128), HOPPER)
    assert (few.block_m, few.block_n) == (16, 128)
    check_contraction(plan, knobs, HOPPER)
    check_contraction(plan, ContractionKnobs(64, 64, 1, 4, 2), HOPPER)
    with pytest.raises(TargetError, match="at most 16"):
        check_contraction(plan, ContractionKnobs(64, 64, 32, 4, 2), HOPPER)
    with pytest.raises(TargetError, match="at least 16"):
        check_contraction(plan, ContractionKnobs(8, 64, 4, 4, 2), HOPPER)
    with pytest.raises(TargetError, match="powers of two"):
        check_contraction(plan, ContractionKnobs(64, 64, 3, 4, 2), HOPPER)
    # GEMM tiles keep tl.dot's depth of 16 at least
    gemm = plan_contraction(tf.kernels.linear.program)
    with pytest.raises(TargetError, match="at least 16"):
        check_contraction(gemm, ContractionKnobs(64, 64, 4, 4, 2), HOPPER)


def test_source_splits_each_block_into_its_indices():
    source = triton_contraction(squared_distances, HOPPER).source(M=37, N=45, D=21)
    assert source.count("tl.split(") == 6   # x's and y's tiles of 4 indices, in two halvings
    assert "tl.dot" not in source
    # the last block's indices past D fold in the sum's identity
    assert "tl.where(k0 + 3 < 21" in source


@pytest.mark.parametrize("sizes", ["exact", "dynamic"])
def test_every_pairwise_case_agrees_with_float64_under_the_interpreter(sizes):
    """Sizes written into the source, and every size a kernel argument (``dynamic=True``: the
    bounds of every loop and mask read from arguments)."""
    seed = fresh_seed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        errors = run_interpreted("tests.schedule_templates.pairwise_check", seed,
                                 *(["dynamic"] if sizes == "dynamic" else []))
    assert set(errors) == set(CASES)
    for name, error in errors.items():
        assert error <= TOLERANCE[name], f"{name}: {error:.1e} (TENSORFUSE_SEED={seed})"


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_pairwise_cases_on_the_gpu_through_the_fast_call(name):
    """On the GPU, through ``tf.compile``: three calls of one signature on fresh inputs, the
    later two on the contraction kernel's fast call (no binding, straight to the launch), each
    against float64."""
    import torch

    from tensorfuse.api import AutoKernel
    from tests.helpers import gpu_case, relative_error

    kernel, case = CASES[name]
    made = tf.compile(kernel)
    for call in range(3):
        args, want, seed = gpu_case(case)
        got = made(**args)
        wants = want if isinstance(want, tuple) else (want,)
        gots = got if isinstance(got, tuple) else (got,)
        error = max(relative_error(g, w) for g, w in zip(gots, wants))
        assert error <= TOLERANCE[name], (call, error, seed)
    torch.cuda.synchronize()
    if isinstance(made, AutoKernel):
        chosen = next(iter(made._by_shapes.values()))
        assert chosen._fast, f"{name}: no fast call kept"


def test_a_reduction_over_the_columns_into_another_axis_is_refused():
    """Kernel regression of vector values: a row state per value index (``[rows, e]``) is
    not what a row block keeps, whichever of its two reductions comes first."""
    for first_the_vector in (True, False):
        @tf.kernel
        def vector_regression(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"],
                              v: T.Tensor["N", "E", "f32"]):
            i, j, d, e = T.axes("i j d e")
            d2 = T.sum((x[i, d] - y[j, d]) * (x[i, d] - y[j, d]), over=d)
            weight = T.exp(-d2)
            if first_the_vector:
                top = T.sum(weight * v[j, e], over=j)
                return top / T.sum(weight, over=j)
            bottom = T.sum(weight, over=j)
            return T.sum(weight * v[j, e], over=j) / bottom

        with pytest.raises(ScheduleError, match="not indexed like|other axes"):
            plan_contraction(vector_regression.program)


def test_an_arg_reduction_over_the_columns_is_kept_as_pairs_in_one_pass():
    """A nearest centroid (``argmin_j Σ_d (x − c)²``) and a greedy token (``argmax_v h·Wᵀ``)
    keep (value, index) states over the columns in the contraction's one kernel — written out
    as an extremum and the first index holding it, the index would read the extremum: two
    passes, the ``[rows, columns]`` scores stored between (256 MiB for 65536 points and 1024
    centroids) —; split over parts of the columns, an index crosses the partials as its bits."""
    from tests.schedule_templates.arg_columns_check import greedy_token, nearest_centroid

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = tf.compile(nearest_centroid, HOPPER)
        text = made.describe_plan(M=65536, K=1024, D=128)
    assert text.splitlines()[0].endswith("contraction template (GEMM tiles: rows i, columns j, "
                                         "contracted d)"), text
    assert "out_argmin = argmin_j out_sum  [over each row's columns, block by block, in the " \
           "same program; the extremum and its first column]" in text
    assert "stored between" not in text
    plan = plan_contraction(greedy_token.program)
    assert [(r.monoid, r.states) for r in plan.over_columns] == [("argmax", 2)]
    split = triton_contraction(greedy_token, HOPPER)
    knobs = default_contraction_knobs(plan, dict(M=37, V=3000, D=64), HOPPER)
    assert knobs.splits > 1
    source = split.source(M=37, V=3000, D=64)
    assert ".to(tl.float32, bitcast=True)" in source and ".to(tl.int32, bitcast=True)" in source
    ptx = split.compiled(M=37, V=3000, D=64).asm["ptx"]
    assert "wgmma" in ptx and not any(ptxas_spills(ptx))
    for kernel, sizes in ((greedy_token, dict(M=37, V=3000, D=64)),
                          (nearest_centroid, dict(M=333, K=300, D=20))):   # and for gfx942
        assert "v_cmp" in triton_contraction(kernel, MI300).compiled(**sizes).asm["amdgcn"]


def test_arg_reductions_over_the_columns_pick_as_float64_under_the_interpreter():
    """Each index picks a column whose float64 score is the row's best (no worse by a relative
    1e-6: rounding may only choose among near ties), and exactly equal scores give the first
    column — repeated centroids within a lane, across lanes, and across parts of split columns
    (:mod:`tests.schedule_templates.arg_columns_check`)."""
    seed = fresh_seed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        found = run_interpreted("tests.schedule_templates.arg_columns_check", seed)
    assert set(found) == {"nearest_centroid", "greedy_token", "best_match", "top1_router"}
    for name, got in found.items():
        assert got["worse"] <= 1e-6 and got["ties_missed"] == 0, (name, got, seed)
    assert found["best_match"]["score"] < 2e-2, seed   # the best score, stored in bf16
    assert found["top1_router"]["score"] < 2e-2, seed   # the chosen expert's probability


def test_an_arg_reduction_over_the_contracted_axis_is_refused():
    @tf.kernel
    def argmin_coordinate(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"]):
        i, j, d = T.axes("i j d")
        return T.argmin(T.abs(x[i, d] - y[j, d]), over=d)

    with pytest.raises(ScheduleError, match="out_argmin is an arg reduction over the contracted"):
        plan_contraction(argmin_coordinate.program)


@pytest.mark.gpu
def test_arg_reductions_over_the_columns_pick_as_float64_on_the_gpu():
    """Through ``tf.compile`` on the GPU, twice (the checked call, then the fast one): the
    same picks and ties as under the interpreter."""
    import torch

    from tests.schedule_templates.arg_columns_check import CASES as ARG_CASES
    from tests.schedule_templates.arg_columns_check import first_of_ties, picked

    seed = fresh_seed()
    generator = torch.Generator().manual_seed(seed)
    for name, (kernel, case) in ARG_CASES.items():
        args, scores = case(generator)
        args = {n: a.cuda() for n, a in args.items()}
        made = tf.compile(kernel)
        for _ in range(2):
            got = made(**args)
            at = (got[-1] if isinstance(got, tuple) else got).cpu()
            assert picked(at, scores) <= 1e-6 and first_of_ties(at, scores) == 0, (name, seed)
