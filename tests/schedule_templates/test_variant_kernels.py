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
    ("diff_attention", dict(B=2, H=16, S=64, D=64, E=128), "attention template"),
    ("diff_attention", dict(B=2, H=16, S=4096, D=64, E=128),
     "the Hopper attention of each of 2 chains"),
    ("retention_causal", dict(B=2, H=16, S=4096, D=128), "attention template"),
    ("label_smoothed_ce", dict(M=8192, V=32768), "row-reduction template"),
    ("ce_ignore_index", dict(M=8192, V=32768), "row-reduction template"),
    ("dice_rows", dict(M=4096, N=65536), "row-reduction template")])
def test_each_is_one_fused_kernel_of_a_template(name, sizes, template):
    """Every chain is fused whole — both softmaxes of differential attention in one sweep of the
    keys, the decay and the int8 cache's scales read where the scores are —, none a floor of
    stages or TVM's default schedule; but differential attention past 64 query rows runs each
    softmax on the Hopper attention, then their difference (``benchmarks.variant_kernels``:
    0.72 ms fused, 0.50 ms so, B2 H16 S4096 on the H200)."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    made = tf.compile(CASES[name][0], target="cuda:sm_90a").for_sizes(**sizes)
    assert template in made.description, made.description


def test_differential_attentions_defaults_fit_shared_memory_as_its_bound_says():
    """Differential attention's two scores read two query and two key tiles beside the values:
    the attention template's bound counts each tensor the products read (360448 bytes at
    128 × 128 in 3 stages, what Triton asks — which ran out of resources at its first launch
    when the bound counted one query and two key/value tiles), and the defaults take the first
    tiles whose pipeline fits an SM."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from tensorfuse.schedule_templates.attention import attention, shared_bytes
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target

    hopper, sizes = get_target("cuda:sm_90a"), dict(B=2, H=16, S=4096, D=64, E=128)
    kernel = CASES["diff_attention"][0]
    made = tf.compile(kernel, target="cuda:sm_90a").template   # where Hopper's stages do not run
    plan, knobs = made.build(None, **sizes)[:2]
    assert shared_bytes(plan, knobs) == made.compiled(**sizes).metadata.shared <= \
        hopper.max_shared_memory, knobs
    given = attention(kernel, choose(kernel.program, hopper)[1], hopper, tile_m=128, tile_n=128,
                      num_warps=8, num_stages=3)
    plan, knobs = given.build(None, **sizes)[:2]
    assert shared_bytes(plan, knobs) == given.compiled(**sizes).metadata.shared == 360448


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_variant_kernels_match_float64_on_the_gpu(name):
    kernel, case = CASES[name]
    args, want, seed = gpu_case(case)
    assert relative_error(tf.compile(kernel)(**args), want.cuda()) < 2e-2, seed


def test_out_of_shared_memory_at_the_first_launch_names_the_tiles(monkeypatch):
    """Triton's OutOfResources (raised where a kernel is loaded on the GPU) reaches the user as a
    TargetError naming the kernel's tiles, stages and warps and what to change."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from types import SimpleNamespace

    from triton.runtime.errors import OutOfResources

    from tensorfuse.errors import TargetError
    from tensorfuse.targets.triton import launcher

    def runs_out(*args):
        raise OutOfResources(360448, 232448, "shared memory")
    monkeypatch.setattr(launcher, "compiled_or_jit", runs_out)
    step = SimpleNamespace(fn=SimpleNamespace(__name__="diff_attention_fused"), grid=(1,),
                           names=[])
    with pytest.raises(TargetError, match=r"diff_attention_fused: .*shared memory.*block_m=128, "
                                          r"block_n=128, 3 stage\(s\), 8 warps\): use smaller"):
        launcher._first_launch(step, {}, {"BLOCK_M": 128, "BLOCK_N": 128},
                               {"num_stages": 3, "num_warps": 8})
