"""A softmax's normaliser over the columns of the contraction template's sums
(:mod:`tensorfuse.targets.triton.column_states`): ``T.logsumexp`` of a GEMM's values in one
pass where the row-tile template cannot hold the features, planned, routed, compiled for sm_90a
and gfx942, and checked against float64 in Triton's interpreter
(:mod:`tests.schedule_templates.normaliser_check`)."""
import warnings

import pytest

import tensorfuse as tf
from tensorfuse.errors import NoTemplateWarning
from tensorfuse.schedule_templates.contraction_plan import plan_contraction
from tensorfuse.targets import get_target
from tests.helpers import fresh_seed, ptxas_spills, run_interpreted
from tests.schedule_templates.normaliser_check import (lse_scores, masked_lse,
                                                       on_the_contraction_template)

pytest.importorskip("triton", reason="the contraction template generates Triton kernels")


def test_the_normaliser_is_kept_per_lane_beside_its_maximum():
    from tensorfuse.schedule_templates.monoid_rewrites import rewritten_monoids

    plan = plan_contraction(rewritten_monoids(lse_scores.program)[0])
    assert [(r.monoid, r.of) for r in plan.over_columns] == [
        ("max", None), ("normaliser", "out_logsumexp_max")]
    assert "relative to out_logsumexp_max lane by lane" in plan.describe()


def test_a_hand_written_normaliser_is_one_too():
    """``Σ exp(s − m)`` with ``m`` unguarded, as users write a log-sum-exp: the same normaliser,
    NaN where the maximum is infinite (as the sum written so is)."""
    from tests.schedule_templates.normaliser_check import by_hand

    plan = plan_contraction(by_hand.program)
    assert [(r.monoid, r.of, r.guarded) for r in plan.over_columns] == [
        ("max", None, True), ("normaliser", "m", False)]


def test_tf_compile_runs_it_where_the_row_tile_template_cannot_hold_the_features():
    """Up to 256 features the attention template's rolling update fuses the pass (unchanged);
    past them the contraction template does, where the scores were stored between two kernels
    (8192² f32: 256 MiB); from 2048 the Hopper GEMM's stages (its measured policy)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = tf.compile(lse_scores, "cuda:sm_90a")

    def chosen(D):
        return made.describe_plan(M=8192, N=8192, D=D, tau=0.07).splitlines()[1]
    assert "attention template (rolling_update(" in chosen(128)
    assert "contraction template (GEMM tiles" in chosen(512)
    assert "contraction template (GEMM tiles" in chosen(1024)
    assert "the Hopper GEMM's stages" in chosen(4096)
    # over pairwise values (a Gaussian kernel's log-sum) at any depth: no other template fuses it
    from tests.schedule_templates.normaliser_check import log_gaussian_sum

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        pairs = tf.compile(log_gaussian_sum, "cuda:sm_90a")
    assert "contraction template (GEMM tiles" in pairs.describe_plan(M=16384, N=16384,
                                                                     D=3).splitlines()[1]


@pytest.mark.parametrize("target", ["cuda:sm_90a", "rocm:gfx942"])
def test_the_normaliser_compiles(target):
    sizes = dict(M=8192, N=8192, D=512)
    asm = on_the_contraction_template(lse_scores, get_target(target)).compiled(**sizes).asm
    if "ptx" in asm:
        assert "wgmma" in asm["ptx"] and "ex2.approx" in asm["ptx"]
        assert not any(ptxas_spills(asm["ptx"]))
    else:
        assert "v_exp_f32" in asm["amdgcn"]


def test_the_normaliser_matches_float64_under_the_interpreter():
    """A GEMM's scores at 300 features in three parts of the columns (bf16 output: 2e-2), a
    Gaussian kernel's log-sum of pairwise distances (f32: 1e-5), masked columns, and every
    column masked (−∞ exactly)."""
    seed = fresh_seed()
    found = run_interpreted("tests.schedule_templates.normaliser_check", seed)
    assert found["lse_scores"] < 2e-2 and found["masked_lse"] < 2e-2, (found, seed)
    assert found["log_gaussian_sum"] < 1e-5, (found, seed)
    assert found["all_masked_not_minus_inf"] == 0, (found, seed)
    assert found["by_hand"] < 2e-2 and found["all_masked_by_hand_not_nan"] == 0, (found, seed)


@pytest.mark.gpu
def test_the_normaliser_on_the_gpu_matches_float64():
    import torch

    from tests.helpers import relative_error
    from tests.schedule_templates.normaliser_check import _masked, _scores

    seed = fresh_seed()
    generator = torch.Generator().manual_seed(seed)
    for kernel, case in ((lse_scores, _scores), (masked_lse, _masked)):
        args, want = case(generator)
        args = {n: a.cuda() if isinstance(a, torch.Tensor) else a for n, a in args.items()}
        made = tf.compile(kernel)
        for _ in range(2):   # the checked call, then the fast one
            assert relative_error(made(**args), want) < 2e-2, (kernel.name, seed)


def test_it_is_tuned_as_the_program_tf_compile_runs():
    """``T.logsumexp`` is written as a maximum and a sum before any template plans it; a tuning
    task is that program's, on the template ``tf.compile`` picks at its sizes (it was the
    program as written, which no GPU template plans past 256 features: refused)."""
    from tensorfuse.autotune.tasks import make_task

    hopper = get_target("cuda:sm_90a")
    wide = make_task(lse_scores, dict(M=8192, N=8192, D=512), hopper, {"tau": 0.07})
    narrow = make_task(lse_scores, dict(M=8192, N=8192, D=128), hopper, {"tau": 0.07})
    assert (wide.template, narrow.template) == ("contraction", "attention")
    assert wide.kernel.name == lse_scores.name and wide.kernel.program is not lse_scores.program


def test_the_rule_the_routed_kernel_and_the_floor_share():
    """Left to the row-tile template: tensor-core sums up to 256 features; never pairwise
    values. The floor asks the same rule (a size the row tile then refuses is cut, not run
    whole on TVM's default schedule)."""
    from tensorfuse.schedule_templates.auto import _contraction_takes, takes_stage
    from tensorfuse.schedule_templates.contraction import left_to_row_tiles
    from tensorfuse.schedule_templates.monoid_rewrites import rewritten_monoids
    from tests.schedule_templates.normaliser_check import by_hand, log_gaussian_sum

    gemm = plan_contraction(by_hand.program)
    pairs = plan_contraction(rewritten_monoids(log_gaussian_sum.program)[0])
    assert left_to_row_tiles(gemm, dict(M=64, N=64, D=256))
    assert not left_to_row_tiles(gemm, dict(M=64, N=64, D=257))
    assert not left_to_row_tiles(pairs, dict(M=64, N=64, D=3))
    # the floor's view: the contraction template takes the program whole at 300 features, not
    # at 128 (where the row tile's plan decides whether the floor cuts it)
    assert _contraction_takes(by_hand.program, dict(M=5, N=70, D=300))
    assert not _contraction_takes(by_hand.program, dict(M=5, N=70, D=128))
    assert takes_stage(by_hand.program, get_target("cuda:sm_90a"), sizes=dict(M=5, N=70, D=128))
