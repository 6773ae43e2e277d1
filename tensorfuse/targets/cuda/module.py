"""Compile generated CUDA C++ with nvcc and wrap it in TVM's CUDA runtime module.

TVM's runtime launches a kernel from its ``launch_param_tags``: the values after the data
arguments give ``blockIdx.*``, ``threadIdx.*``, ``clusterCtaIdx.*`` (the cluster dimension,
launched through ``cuLaunchKernelEx``) and, last, ``tirx.use_dyn_shared_memory`` (dynamic shared
memory bytes; TVM raises the kernel's limit above 48 KiB). Cubins are cached by source hash.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import tvm

from ...errors import TargetError
from .. import TargetSpec
from ..codegen import cuda_to_cubin
from ..triton.launch import cache_root

LAUNCH_TAGS = ["blockIdx.x", "blockIdx.y", "threadIdx.x", "clusterCtaIdx.x",
               "tirx.use_dyn_shared_memory"]


@dataclass(frozen=True)
class KernelEntry:
    """One ``__global__`` function: its name and argument types (``handle`` or ``int32``)."""

    name: str
    arg_types: tuple[str, ...]


def cubin_for(source: str, target: TargetSpec) -> bytes:
    """nvcc's cubin for ``source`` (cached under ``<cache>/cuda/``)."""
    digest = hashlib.sha256(f"{target.arch}\n{source}".encode()).hexdigest()[:24]
    folder = os.path.join(cache_root(), "cuda")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{digest}.cubin")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    cubin = cuda_to_cubin(source, target)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(cubin)
    os.replace(tmp, path)
    return cubin


def cuda_module(source: str, entries: list[KernelEntry], target: TargetSpec) -> tvm.runtime.Module:
    """A TVM CUDA module holding ``entries``, each launched with :data:`LAUNCH_TAGS`."""
    cubin = cubin_for(source, target)
    info = {"tvm_version": tvm.__version__, "func_info": {
        e.name: {"name": "", "arg_types": list(e.arg_types), "launch_param_tags": LAUNCH_TAGS}
        for e in entries}}
    fmap = tvm.get_global_func("runtime.LoadMetaDataFromJSON")(json.dumps(info))
    create = tvm.get_global_func("ffi.Module.create.cuda", allow_missing=True)
    if create is None or not tvm.cuda(0).exist:
        raise TargetError("running a cluster kernel needs an NVIDIA Hopper GPU and TVM's CUDA "
                          "runtime; none is here (the source and PTX can still be inspected)")
    return create(cubin, "cubin", fmap, {})
