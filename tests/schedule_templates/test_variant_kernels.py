"""Kernels of model variants (``benchmarks.variant_kernels``): an int8 KV cache's decode,
differential attention, retention's decay, cross-entropy with label smoothing and ignored
targets, a Dice loss — their numbers against float64 in Triton's interpreter and on the GPU,
as ``tf.compile`` makes them for sm_90a (cases: :mod:`.variant_kernels_check`)."""
import pytest

import tensorfuse as tf
from tests.helpers import check_interpreted, gpu_case, relative_error
from tests.schedule_templates.variant_kernels_check import CASES


def test_variant_kernels_match_float64_in_the_triton_interpreter():
    check_interpreted("tests.schedule_templates.variant_kernels_check", CASES)


@pytest.mark.parametrize("name, sizes, template", [
    ("int8_kv_decode", dict(B=8, H=32, HKV=8, N=16384, D=128), "attention template"),
    ("diff_attention", dict(B=2, H=16, S=4096, D=64, E=128), "attention template"),
    ("retention_causal", dict(B=2, H=16, S=4096, D=128), "attention template"),
    ("label_smoothed_ce", dict(M=8192, V=32768), "row-reduction template"),
    ("ce_ignore_index", dict(M=8192, V=32768), "row-reduction template"),
    ("dice_rows", dict(M=4096, N=65536), "row-reduction template")])
def test_each_is_one_fused_kernel_of_a_template(name, sizes, template):
    """Every chain is fused whole — both softmaxes of differential attention in one sweep of the
    keys, the decay and the int8 cache's scales read where the scores are —, none a floor of
    stages or TVM's default schedule."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    made = tf.compile(CASES[name][0], target="cuda:sm_90a").for_sizes(**sizes)
    assert template in made.description, made.description


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_variant_kernels_match_float64_on_the_gpu(name):
    kernel, case = CASES[name]
    args, want, seed = gpu_case(case)
    assert relative_error(tf.compile(kernel)(**args), want.cuda()) < 2e-2, seed
