"""Load generated Triton source, compile it for a target without a GPU, launch it with torch.

Triton needs its kernels in real Python files, so generated source goes to a cache folder
(``$TENSORFUSE_CACHE`` or ``~/.cache/tensorfuse``) under a name made from its hash.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading

from ...dsl import dtypes as dt
from ...errors import TargetError
from .shadowing import check_arguments_unshadowed

TL_SIGNATURE = _TRITON_TYPES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32", "f64": "fp64", "i32": "i32",
                 "i64": "i64", "i8": "i8", "u8": "u8", "bool": "i1"}


def cache_root() -> str:
    """``$TENSORFUSE_CACHE`` or ``~/.cache/tensorfuse``: generated kernels, tuning databases."""
    return os.environ.get("TENSORFUSE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                              "tensorfuse")


def cache_dir() -> str:
    """Where generated Triton sources are written."""
    path = os.path.join(cache_root(), "triton")
    os.makedirs(path, exist_ok=True)
    return path


def require_triton():
    try:
        import triton  # noqa: F401
    except ImportError:
        raise TargetError("this template generates Triton kernels: pip install triton "
                          "(3.6.0 is the version checked)") from None


def load_kernel(source: str, name: str):
    """The ``@triton.jit`` function ``name`` defined by ``source`` (thread-safe: a tuning job
    builds a batch's candidates in parallel threads). Found again by the source string itself
    (its hash is kept on the string) before its digest is taken: launches that load their kernel
    every call (the attention backward's) hashed 18 KB of source each time, ~20 µs."""
    found = _LOADED.get((source, name, interpreting()))
    if found is not None:
        return found
    require_triton()
    check_arguments_unshadowed(source)   # once a source: loaded ones are found above
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    module_name = f"tensorfuse_triton_{digest}" + ("_interpreted" if interpreting() else "")
    with _LOADING:
        if module_name in sys.modules:
            found = _LOADED[(source, name, interpreting())] = getattr(sys.modules[module_name],
                                                                     name)
            return found
        path = os.path.join(cache_dir(), f"{module_name}.py")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "w") as f:
                f.write(source)
            os.replace(tmp, path)  # atomic: concurrent builds never see a half-written file
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module   # others wait on the lock until it is whole
        spec.loader.exec_module(module)
        found = _LOADED[(source, name, interpreting())] = getattr(module, name)
        return found


_LOADING = threading.Lock()
_LOADED: dict = {}   # (source, name, interpreted) -> the jitted function


def interpreting() -> bool:
    """Triton's interpreter (TRITON_INTERPRET=1) runs kernels on the CPU with NumPy: slow, but it
    lets the tests check generated kernels numerically on machines without a GPU."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def launch_device(kernel, bound):
    """The torch device a bound call of ``kernel`` (a Triton template's callable) runs on: the
    CPU under Triton's interpreter, else the call's GPU — the target's device checked on the
    kernel's first call, a clear error where the GPU is missing."""
    import torch

    if interpreting():
        return torch.device("cpu")
    if not kernel._device_checked:
        kernel.target.device()
        kernel._device_checked = True
    return bound.torch_device or torch.device("cuda", torch.cuda.current_device())


def signature(program, outputs, mask_args: list[str]) -> dict:
    """Triton argument types: pointers for tensors and outputs, scalars by type."""
    sig = {}
    for p in program.params:
        if hasattr(p, "dims"):
            sig[p.name] = "*" + _TRITON_TYPES[p.dtype]
        else:
            sig[p.name] = _TRITON_TYPES[dt.resolve(p.dtype)]
    for c in outputs:
        sig[f"out_{c.name}"] = "*" + _TRITON_TYPES[c.dtypes[0]]
    for a in mask_args:
        sig[a] = "*i32"
    return sig


# One offline compile at a time in this process: a tuning builder's threads compiling two
# candidates at once failed once in CI with a front-end error at a `tl.sum` that no run of the
# same compiles one after the other reproduces — Triton's front end shares module-level JIT
# functions (the reductions' combine functions) between compiles (a tuning builder's threads
# compiling at once)
_COMPILE_LOCK = threading.Lock()


def assembly_of(compiled, target) -> str:
    """The device assembly of a Triton compile for ``target``: PTX for CUDA, AMDGCN for ROCm."""
    return compiled.asm["amdgcn" if target.kind == "rocm" else "ptx"]


def compile_for(fn, sig: dict, constexprs: dict, target, num_warps: int, num_stages: int,
                divisible: tuple = ()):
    """Compile without launching (works on machines without a GPU): CUDA → PTX/cubin, ROCm →
    AMDGCN/hsaco. ``divisible``: integer arguments whose values are multiples of 16 (the JIT
    specialises a call's so). One at a time per process (:data:`_COMPILE_LOCK`)."""
    import triton
    from triton.backends.compiler import GPUTarget

    if target.kind == "cuda":
        major, minor = target.compute_capability
        gpu = GPUTarget("cuda", major * 10 + minor, 32)
    elif target.kind == "rocm":
        gpu = GPUTarget("hip", target.arch, 64)
    else:
        raise TargetError(f"Triton kernels are for GPU targets, not {target.name}")
    full = dict(sig)
    full.update({k: "constexpr" for k in constexprs})
    # pointers 16-byte aligned, as the JIT specialises them when called (the calls pass aligned
    # tensors): the offline code is then the code that runs (vectorised loads and stores)
    aligned = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k, v in sig.items()
               if v.startswith("*") or k in divisible}
    src = triton.compiler.ASTSource(fn=fn, signature=full, constexprs=constexprs, attrs=aligned)
    with _COMPILE_LOCK:
        return triton.compile(src, target=gpu, options={"num_warps": num_warps,
                                                        "num_stages": num_stages})
