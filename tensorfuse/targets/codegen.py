"""Device code for inspection on machines without the GPU: PTX/cubin/SASS for CUDA, assembly and code
objects for ROCm.

CUDA: TVM generates CUDA C++; nvcc compiles it here to PTX or cubin for the target architecture
(sm_90a for wgmma). ROCm: TVM's LLVM backend emits AMDGPU assembly; linking a code object needs the
ROCm device libraries (Debian's ``rocm-device-libs`` works) and an ``ld.lld`` that understands the
code object version TVM's LLVM 22 writes (the ``ziglang`` wheel ships LLD 22). When no ROCm install
is found, tensorfuse points TVM at those.
"""
from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import tvm

from ..errors import TargetError
from . import TargetSpec


@functools.lru_cache(maxsize=16)
def cuda_to_ptx(source: str, target: TargetSpec) -> str:
    """Compile CUDA C++ to PTX with nvcc for ``target``'s architecture. The last few are kept:
    a kernel inspected twice (its PTX, then ptxas's report on it) runs nvcc's front end — 2.5 s
    for an attention kernel — once."""
    return _nvcc(source, target, "ptx").decode()


def cuda_to_cubin(source: str, target: TargetSpec) -> bytes:
    return _nvcc(source, target, "cubin")


def cubin_to_sass(cubin: bytes) -> str:
    """Disassemble a cubin with cuobjdump (for checking the instructions that will run)."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        raise TargetError("cuobjdump (CUDA toolkit) is not installed")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run([tool, "-sass", path], check=True, capture_output=True,
                              text=True).stdout


def _nvcc(source: str, target: TargetSpec, fmt: str) -> bytes:
    if target.kind != "cuda":
        raise TargetError(f"{fmt} needs a CUDA target, got {target.name}")
    if shutil.which("nvcc") is None:
        raise TargetError("nvcc (the CUDA toolkit) is not installed; it is needed to compile "
                          f"CUDA to {fmt} on this machine")
    from tvm.support import nvcc

    with target.tvm_target:
        out = nvcc.compile_cuda(source, target_format=fmt, arch=target.arch, compiler="nvcc")
    return bytes(out)


# -- ROCm ----------------------------------------------------------------------------------------

def _system_bitcode_dir() -> str | None:
    for pattern in ("/opt/rocm/amdgcn/bitcode", "/usr/lib/*/amdgcn/bitcode", "/usr/lib/amdgcn/bitcode"):
        for path in glob.glob(pattern):
            if os.path.exists(os.path.join(path, "ocml.bc")):
                return path
    return None


def _lld_command() -> list[str] | None:
    """An ld.lld new enough for TVM's code objects: ROCm's own, else the ziglang wheel's."""
    if os.path.exists("/opt/rocm/llvm/bin/ld.lld"):
        return ["/opt/rocm/llvm/bin/ld.lld"]
    try:
        import ziglang  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "ziglang", "ld.lld"]


@functools.lru_cache(maxsize=None)
def install_rocm_toolchain() -> None:
    """Point TVM's ROCm linking at the device libraries and linker found on this machine."""
    import tvm_ffi

    bitcode_dir, lld = _system_bitcode_dir(), _lld_command()
    if bitcode_dir is None or lld is None:
        raise TargetError(
            "ROCm code generation needs the ROCm device libraries and a recent ld.lld: install "
            "Debian's rocm-device-libs (apt-get install rocm-device-libs) and the ziglang wheel "
            "(pip install ziglang), or a ROCm toolkit in /opt/rocm")
    from tvm.support import rocm

    @tvm_ffi.register_global_func("tvm_callback_rocm_bitcode_path", override=True)
    def _bitcode_path(rocdl_dir=None):
        return rocm.callback_rocm_bitcode_path(bitcode_dir + "/")

    @tvm_ffi.register_global_func("tvm_callback_rocm_link", override=True)
    def _link(obj_bin):
        with tempfile.TemporaryDirectory() as d:
            obj, cobj = os.path.join(d, "kernel.o"), os.path.join(d, "kernel.co")
            with open(obj, "wb") as f:
                f.write(bytes(obj_bin))
            proc = subprocess.run(lld + ["--no-undefined", "-shared", obj, "-o", cobj],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise TargetError(f"linking the ROCm code object failed:\n{proc.stdout}{proc.stderr}")
            with open(cobj, "rb") as f:
                return bytearray(f.read())


def build_rocm(mod: tvm.IRModule, target: TargetSpec):
    """Compile ``mod`` for a ROCm target (code object linked here; it cannot run here)."""
    install_rocm_toolchain()
    with target.tvm_target:
        return tvm.compile(mod, target=target.tvm_target)
