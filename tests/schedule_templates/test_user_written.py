"""Kernels as users write them that no issue or benchmark lists
(:mod:`tests.schedule_templates.user_written_check`,
:mod:`tests.schedule_templates.user_written_more_check`,
:mod:`tests.schedule_templates.user_written_extra_check`,
:mod:`tests.schedule_templates.user_written_forms_check`): their numbers against float64 through
Triton's interpreter (as ``tf.compile`` makes them for sm_90a), the CPU target and (marked
``gpu``) the GPU at hand; their gradients (:mod:`tests.schedule_templates.user_gradients_check`)
through the first two; the plans of a few at a GPU's sizes; their sm_90a code compiled."""
import warnings

import pytest
import torch

import tensorfuse as tf
from tests.helpers import check_cases_compiled, check_cases_interpreted, fresh_seed
from tests.schedule_templates import (user_written_check, user_written_extra_check,
                                      user_written_forms_check, user_written_more_check)
from tests.schedule_templates.user_written_check import (cosine_attention, masked_var_tokens,
                                                         rms_over_heads, token_l2_distance_min)

MODULES = [user_written_check, user_written_more_check, user_written_extra_check,
           user_written_forms_check]
ATTENTION = dict(B=2, H=16, S=4096, D=128)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_user_written_kernels_match_float64_in_the_triton_interpreter(module):
    check_cases_interpreted(module)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_user_written_kernels_match_float64_on_the_cpu_target(module):
    """The same kernels through ``tf.compile`` on the CPU (TVM's LLVM backend), outputs
    poisoned. A masked variance over tokens — its count per sequence, its mean per sequence and
    feature — crashed building on the CPU: the row of references kept per chunk was indexed
    by the chain's common axes alone, not by the dependency's own (a ``KeyError`` on the
    feature axis)."""
    check_cases_compiled(module, "llvm")


def test_the_masked_variance_builds_on_the_cpu_with_its_references_per_feature():
    """The crash above, alone: the CPU lowering's buffer of references per chunk for a mean
    indexed by (b, d) inside a chain whose common axis is b."""
    x, mask = torch.randn(2, 9, 5) + 4, (torch.rand(2, 9) > 0.3).float()
    mask[:, 0] = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = tf.compile(masked_var_tokens)(x, mask)
    var = [x[b][mask[b] > 0].var(0, unbiased=False) for b in range(2)]
    assert torch.allclose(out, torch.stack(var), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernel, sizes, expected", [
    # the norms as stages before the Hopper kernel, read as strips beside the key blocks
    (cosine_attention, dict(B=2, H=16, S=4096, D=128),
     ("hopper_attention", "kn[b, h, j] read as each key block's strip")),
    # two reduced axes that lie together, swept as one
    (rms_over_heads, dict(B=4, S=4096, H=32, D=128), ("h, d swept as one axis",)),
    # the min over the codebook kept beside the distances' tiles, nothing stored between
    (token_l2_distance_min, dict(B=8, N=4096, K=1024, D=64),
     ("contraction template", "out_min = min_k dist")),
    # attention as other tools' users write it, on the Hopper template
    (user_written_forms_check.base_two_attention, ATTENTION,
     ("base-two weights as natural exponentials", ": hopper_attention (")),
    (user_written_forms_check.rounded_weights_attention, ATTENTION,
     ("moved outside it (out_sum: / w_sum)", ": hopper_attention (")),
    (user_written_forms_check.padded_guarded_attention, ATTENTION,
     (": hopper_attention (", "mask: keep[b, j]")),
    (user_written_forms_check.relative_bias_attention, dict(ATTENTION, R=128),
     (": hopper_attention (", "+ table[h, min(i - j, T.size('R') - 1)]")),
])
def test_user_written_kernels_plan_on_templates_at_a_gpus_sizes(kernel, sizes, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = tf.compile(kernel, target="cuda:sm_90a").describe_plan(**sizes)
    assert "TVM's default" not in plan, plan
    for text in expected:
        assert text in plan, plan


@pytest.mark.gpu
@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_user_written_kernels_match_float64_on_the_gpu(module):
    """The same kernels as ``tf.compile`` makes them for the GPU at hand (its choice between
    templates, TVM's CUDA and the staged floor, at these small ragged sizes), outputs
    poisoned."""
    check_cases_compiled(module, "cuda")


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_user_written_kernels_compile_for_sm_90a(module):
    """Each kernel's sm_90a code at its case's sizes, compiled (Triton to PTX, nvcc where CUDA
    C++): Triton's compiler checks what its interpreter does not — an i32-masked variance over
    rows of 40000 in two parts carried its count's reference as a float and reassigned it an
    integer, refused only on the GPU."""
    from tensorfuse.binding import bind_call

    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    generator = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (kernel, case) in module.CASES.items():
            args, _ = case(generator)
            sizes = bind_call(kernel.program, (), args, "cpu").dims
            assert ".entry" in tf.compile(kernel, target="cuda:sm_90a").ptx(**sizes), name


def _gradients_too_far(errors: dict) -> dict:
    from tests.schedule_templates.user_gradients_check import CASES, tolerance

    return {n: e for n, e in errors.items() if not e < tolerance(CASES[n][0])}


def test_user_written_gradients_match_float64_on_the_cpu_target():
    from tests.schedule_templates.user_gradients_check import gradient_errors

    seed = fresh_seed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errors = gradient_errors(torch.Generator().manual_seed(seed),
                                 lambda k: tf.compile(k, "llvm"))
    assert not _gradients_too_far(errors), f"{_gradients_too_far(errors)} (TENSORFUSE_SEED={seed})"


def test_user_written_gradients_match_float64_in_the_triton_interpreter():
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from tests.helpers import run_interpreted

    seed = fresh_seed()
    errors = run_interpreted("tests.schedule_templates.user_gradients_check", seed)
    from tests.schedule_templates.user_gradients_check import CASES

    assert set(errors) == set(CASES), errors
    assert not _gradients_too_far(errors), f"{_gradients_too_far(errors)} (TENSORFUSE_SEED={seed})"


@pytest.mark.gpu
def test_user_written_gradients_match_float64_on_the_gpu():
    """The same gradients as ``tf.compile`` makes them for the GPU at hand (the floor's stages,
    each on its template)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from tests.schedule_templates.user_gradients_check import gradient_errors

    seed = fresh_seed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errors = gradient_errors(torch.Generator().manual_seed(seed), tf.compile, "cuda")
    assert not _gradients_too_far(errors), f"{_gradients_too_far(errors)} (TENSORFUSE_SEED={seed})"


# the more and the extra kernels' sizes on a GPU: rows of 1k-50k, attention of 4k keys
GPU_SIZES = {"ce_ignore_index": dict(M=8192, V=32000), "mean_over_batch": dict(B=64, S=512, D=1024),
             "global_norm": dict(M=8192, N=8192), "int8_softmax": dict(M=8192, N=4096),
             "l1_normalize": dict(M=8192, N=4096), "add_rmsnorm": dict(M=8192, N=4096),
             "argmax_repeated": dict(M=8192, N=32000), "argmax_down_columns": dict(M=8192, N=4096),
             "swiglu_rms": dict(M=8192, N2=8192), "unbiased_var": dict(M=8192, N=4096),
             "pairwise_sqdist": dict(N=8192, M=8192, D=64), "lse_wide_range": dict(M=8192, N=4096),
             "lse_middle": dict(A=64, B=512, C=1024), "padded_softmax": dict(B=8, S=1024, N=1024),
             "softmax_of_one": dict(M=8192, N=4096), "sum_outer_inner": dict(B=64, S=512, D=1024),
             "column_softmax": dict(N=4096, M=8192), "std_fp16": dict(M=8192, N=4096),
             "cross_entropy_gpt2": dict(M=8192, V=50257),
             "causal_attention_d20": dict(B=2, H=16, S=4096, D=20),
             "causal_bottom_right": dict(B=8, M=256, N=8192, D=128),
             "int_max": dict(M=8192, N=4096),
             "int8_sum": dict(M=8192, N=4096), "product": dict(M=8192, N=4096),
             "rmsnorm_into_fp16": dict(M=8192, N=4096),
             "classifier_softmax": dict(B=4096, D=4096, C=1000), "row_range": dict(M=8192, N=4096),
             "quantize_rows": dict(M=8192, N=4096), "transposed_dot": dict(M=8192, N=8192),
             "alibi_causal": dict(B=2, H=16, M=4096, N=4096, D=128),
             "attention_pool": dict(B=32, T=4096, D=1024), "grouped_argmax": dict(M=8192, N=4096),
             "biased_softmax": dict(B=16, M=1024, N=1024), "capped_ce": dict(M=8192, V=50257),
             "cosine_matrix": dict(M=4096, N=4096, D=128),
             "layernorm_two_axes": dict(B=16, S=4096, D=1024),
             "reversed_weighted": dict(M=8192, N=4096), "above_mean_sum": dict(M=8192, N=4096),
             "relu_centered": dict(M=8192, N=4096), "count_above_half_max": dict(M=8192, N=4096),
             "above_mean_mask": dict(M=8192, N=4096), "mean_of_lse": dict(M=8192, N=4096),
             "softmax_variance": dict(M=8192, N=4096), "multi_margin": dict(M=8192, C=1000),
             "global_max_shift": dict(M=8192, N=4096)}


@pytest.mark.parametrize("module", [user_written_more_check, user_written_extra_check],
                         ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_no_user_written_kernel_falls_to_tvms_default_schedule_at_a_gpus_sizes(module):
    """Each of the more and the extra kernels at a GPU's sizes plans onto a template (rows,
    attention, contraction, GEMM, a flat sweep, written-out monoids; several as stages) for
    sm_90a, never TVM's untiled default."""
    assert set(module.CASES) <= set(GPU_SIZES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (kernel, _) in module.CASES.items():
            plan = tf.compile(kernel, target="cuda:sm_90a").describe_plan(**GPU_SIZES[name])
            assert "TVM's default" not in plan, (name, plan)
