"""Target names resolve to TVM targets in dictionary form, with their capabilities."""
import pytest

from tensorfuse.errors import TargetError
from tensorfuse.targets import detect_local_gpu, get_target


def test_cpu_and_auto():
    assert get_target("llvm").kind == "llvm"
    assert get_target("cpu").kind == "llvm"
    auto = get_target("auto")
    assert auto.kind == ("cuda" if detect_local_gpu() else "llvm")


@pytest.mark.parametrize("name, kind, arch", [
    ("cuda:sm_80", "cuda", "sm_80"), ("cuda:sm_90", "cuda", "sm_90"),
    ("cuda:sm_90a", "cuda", "sm_90a"), ("rocm", "rocm", "gfx942"), ("rocm:gfx90a", "rocm", "gfx90a"),
])
def test_gpu_targets(name, kind, arch):
    t = get_target(name)
    assert (t.kind, t.arch) == (kind, arch)
    assert t.tvm_target.kind.name == kind
    assert t.is_gpu and t.has_tensor_cores


def test_capabilities():
    assert get_target("cuda:sm_90a").has_wgmma and get_target("cuda:sm_90a").has_clusters
    assert not get_target("cuda:sm_80").has_clusters
    assert get_target("rocm").warp_size == 64 and get_target("cuda:sm_80").warp_size == 32


@pytest.mark.parametrize("bad", ["tpu", "cuda:sm_70x", "rocm:gfx1100", 42])
def test_unknown_targets_are_errors(bad):
    with pytest.raises(TargetError):
        get_target(bad)
