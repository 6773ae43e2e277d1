"""CUDA and ROCm code generation, checked on a machine without GPUs: CUDA C++ compiled with nvcc to
PTX for sm_90a/sm_80, AMDGPU assembly for gfx942/gfx90a."""
import re

import pytest

import tensorfuse as tf
import tensorfuse.kernels as K

SIZES = dict(B=1, H=2, M=128, N=128, D=64)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_attention_compiles_to_ptx(arch):
    f = tf.compile(K.causal_attention, target=f"cuda:{arch}", template=None)
    source = f.cuda_source(**SIZES)
    assert "__global__" in source
    ptx = f.ptx(**SIZES)
    assert f".target {arch}" in ptx
    assert "ex2.approx" in ptx            # the exponentials of the softmax
    assert re.search(r"ld\.global(\.nc)?\.(b16|u16)", ptx)  # bf16 loads


def test_every_library_kernel_generates_cuda():
    for name, kernel in K.ALL.items():
        every = dict(SIZES, HKV=1, V=256, K=64, O=64)
        sizes = {d: every[d] for d in kernel.program.dim_names()}   # a size it lacks is refused
        source = tf.compile(kernel, target="cuda:sm_90a", template=None).cuda_source(**sizes)
        assert "__global__" in source, name


def _rocm_toolchain_or_skip():
    """Locally, a missing ROCm toolchain skips; in CI (which installs it) it is a failure."""
    import os

    from tensorfuse.errors import TargetError
    from tensorfuse.targets.codegen import install_rocm_toolchain

    try:
        install_rocm_toolchain()
    except TargetError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


@pytest.mark.parametrize("arch", ["gfx942", "gfx90a"])
def test_rocm_assembly(arch):
    _rocm_toolchain_or_skip()
    asm = tf.compile(K.softmax, target=f"rocm:{arch}", template=None).assembly(M=64, N=1024)
    assert f"amdgcn-amd-amdhsa--{arch}" in asm or arch in asm
    assert "v_exp_f32" in asm
    assert "s_endpgm" in asm


@pytest.mark.parametrize("kernel, sizes", [
    (K.softmax, dict(M=64, N=1024)),
    (K.gqa_attention, dict(B=1, H=4, HKV=1, M=128, N=256, D=64)),
])
def test_assembly_of_the_default_kernels_on_each_gpu_kind(kernel, sizes):
    """``assembly()`` is the device code on every GPU target — AMDGCN from the Triton templates
    on ROCm (whose compiles have no PTX), PTX on CUDA, where ``ptx()`` is the same text — and
    ``ptx()`` on a ROCm kernel says to use it."""
    from tensorfuse.errors import TargetError

    rocm = tf.compile(kernel, target="rocm:gfx942")
    asm = rocm.assembly(**sizes)
    assert ".amdgcn_target" in asm and "s_endpgm" in asm and "v_exp_f32" in asm
    with pytest.raises(TargetError, match=r"ptx\(\) is for CUDA targets.*assembly"):
        rocm.ptx(**sizes)
    cuda = tf.compile(kernel, target="cuda:sm_90a")
    ptx = cuda.assembly(**sizes)
    assert ".target sm_90a" in ptx and ptx == cuda.ptx(**sizes)


def test_triton_floor_division_is_plain_only_where_both_sides_are_non_negative():
    """Triton's // and % truncate; the DSL's floor. Axes, sizes and non-negative literals (and
    their sums, products, quotients) are ≥ 0, where the two agree: plain operators, which keep
    the contiguity Triton vectorises by. A difference may be negative: the floor's helper."""
    from tensorfuse.dsl.expr import Axis, Const, DimSize, binary
    from tensorfuse.targets.triton.expr import TileContext, nonnegative, to_triton

    d = Axis("d", 128)
    tile = TileContext(axes={d.uid: "ax_d"}, sizes={"D": 128})
    half = binary("floordiv", DimSize("D"), Const(2, "i32"))
    assert to_triton(binary("mod", binary("add", d, half), DimSize("D")), tile) == \
        "((ax_d + 64) % 128)"
    shifted = binary("sub", d, Const(64, "i32"))
    assert not nonnegative(shifted) and not nonnegative(Const(-1, "i32"))
    assert to_triton(binary("mod", shifted, Const(128, "i32")), tile).startswith("_floormod(")
