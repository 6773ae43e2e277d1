"""What each target is and can do: CPU ``llvm`` (tests), CUDA sm_80/sm_90/sm_90a, ROCm gfx90a/gfx942.

``get_target("auto")`` picks the local GPU when there is one and the CPU otherwise. Targets are built
in TVM's dictionary form (the old ``"llvm -num-cores 2"`` strings are rejected by TVM 0.27).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import tvm

from ..errors import TargetError

CUDA_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a")
ROCM_ARCHS = ("gfx90a", "gfx942")


@dataclass(frozen=True)
class TargetSpec:
    """A compilation target and its capabilities."""

    kind: str                 # "llvm", "cuda" or "rocm"
    arch: str = ""            # "sm_90a", "gfx942", "" for the CPU
    tvm_target: tvm.target.Target = field(compare=False, hash=False, repr=False, default=None)

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.arch}" if self.arch else self.kind

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("cuda", "rocm")

    @property
    def accumulate(self) -> str | None:
        """The dtype narrower float sums accumulate in (None: their own). On the CPU, f64: a
        sequential f32 sum of tens of thousands of terms loses most digits (a mean of 65,536
        values near 1e4 came out 8.6 relative off), and an f64 add costs what an f32 one does in
        the scalar reduction loops the CPU schedules run. GPU kernels keep f32 (their sums are
        blocked across threads)."""
        return "f64" if self.kind == "llvm" else None

    @property
    def vector_math(self) -> bool:
        """Whether ``exp`` is generated as arithmetic LLVM vectorises (the CPU: TVM's ``exp`` is a
        scalar libm call there, 38 of 44 ms of a 4096² softmax; GPUs have their own fast
        ``exp``). See :mod:`tensorfuse.lower_to_tir.vector_math`."""
        return self.kind == "llvm"

    @property
    def warp_size(self) -> int:
        return {"cuda": 32, "rocm": 64}.get(self.kind, 1)

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        if self.kind != "cuda":
            return None
        digits = self.arch[3:].rstrip("a")
        return int(digits[:-1]), int(digits[-1])

    @property
    def has_tensor_cores(self) -> bool:
        return self.kind == "rocm" or (self.kind == "cuda" and self.compute_capability >= (8, 0))

    @property
    def has_clusters(self) -> bool:
        """Thread-block clusters and distributed shared memory (Hopper)."""
        return self.kind == "cuda" and self.compute_capability >= (9, 0)

    @property
    def has_wgmma(self) -> bool:
        return self.kind == "cuda" and self.arch == "sm_90a"

    @property
    def max_shared_memory(self) -> int:
        return {"sm_80": 163 * 1024, "sm_90": 227 * 1024, "sm_90a": 227 * 1024}.get(
            self.arch, 64 * 1024 if self.is_gpu else 0)

    def device(self) -> tvm.runtime.Device:
        """The TVM device to run on; a clear error when it is not present here."""
        if self.kind == "llvm":
            return tvm.cpu(0)
        if self.kind == "cuda":
            dev = tvm.cuda(0)
            if not dev.exist:
                raise TargetError(
                    f"target {self.name} needs an NVIDIA GPU, and none is visible on this machine. "
                    "Code generation still works (kernel.source(), kernel.assembly()); to run "
                    "here, use target='llvm' or target='auto'")
            return dev
        raise TargetError(
            f"target {self.name} generates AMD GPU code only: this TVM build has no ROCm runtime "
            "and no AMD GPU is reachable, so the kernel cannot run here. Inspect it with "
            "kernel.assembly(), or run on target='llvm' / 'cuda'")

    def __str__(self) -> str:
        return self.name


def _make(kind: str, arch: str) -> TargetSpec:
    if kind == "llvm":   # this machine's CPU: its vector units (AVX-512, …), not x86-64's SSE2
        tvm_target = tvm.target.Target({"kind": "llvm", "mcpu": _host_cpu()})
    elif kind == "cuda":
        tvm_target = tvm.target.Target({"kind": "cuda", "arch": arch})
    else:
        tvm_target = tvm.target.Target({"kind": "rocm", "mcpu": arch})
    return TargetSpec(kind, arch, tvm_target)


@functools.lru_cache(maxsize=None)
def _host_cpu() -> str:
    """LLVM's name for this machine's CPU (``generic`` where LLVM does not know it)."""
    from tvm.target import codegen

    name = codegen.llvm_get_system_cpu()
    triple = codegen.llvm_get_system_triple()
    return name if name and codegen.llvm_is_valid_cpu(name, triple) else "generic"


@functools.lru_cache(maxsize=None)
def detect_local_gpu() -> TargetSpec | None:
    """The local NVIDIA GPU as a target (sm_90a on Hopper), or ``None`` when there is none."""
    dev = tvm.cuda(0)
    if not dev.exist:
        return None
    major, minor = (int(x) for x in dev.compute_version.split("."))
    arch = f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")
    return _make("cuda", arch)


def get_target(target: "str | TargetSpec | None" = "auto") -> TargetSpec:
    """Resolve a target name: ``"auto"`` (local GPU, else CPU), ``"llvm"``/``"cpu"``, ``"cuda"``
    (the local GPU's architecture, else sm_90a), ``"cuda:sm_80"``, ``"rocm"`` (gfx942),
    ``"rocm:gfx90a"``."""
    if isinstance(target, TargetSpec):
        return target
    if target is None or target == "auto":
        return detect_local_gpu() or _make("llvm", "")
    if not isinstance(target, str):
        raise TargetError(f"target must be a name such as 'llvm', 'cuda' or 'cuda:sm_90a', got "
                          f"{target!r}")
    kind, _, arch = target.strip().lower().partition(":")
    if kind in ("llvm", "cpu"):
        return _make("llvm", "")
    if kind == "cuda":
        if not arch:
            local = detect_local_gpu()
            return local if local is not None else _make("cuda", "sm_90a")
        if arch not in CUDA_ARCHS:
            raise TargetError(f"unknown CUDA architecture {arch!r}; supported: "
                              f"{', '.join(CUDA_ARCHS)}")
        return _make("cuda", arch)
    if kind == "rocm":
        arch = arch or "gfx942"
        if arch not in ROCM_ARCHS:
            raise TargetError(f"unknown ROCm architecture {arch!r}; supported: "
                              f"{', '.join(ROCM_ARCHS)}")
        return _make("rocm", arch)
    raise TargetError(f"unknown target {target!r}; use 'auto', 'llvm', 'cuda[:sm_XX]' or "
                      "'rocm[:gfxXXX]'")
