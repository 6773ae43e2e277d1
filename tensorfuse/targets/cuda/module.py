"""Compile generated CUDA C++ with nvcc and wrap it in TVM's CUDA runtime module.

TVM's runtime launches a kernel from its ``launch_param_tags``: the values after the data
arguments give ``blockIdx.*``, ``threadIdx.*``, ``clusterCtaIdx.*`` (the cluster dimension,
launched through ``cuLaunchKernelEx``) and, last, ``tirx.use_dyn_shared_memory`` (dynamic shared
memory bytes; TVM raises the kernel's limit above 48 KiB). Cubins are cached by source hash.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import struct
import threading
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
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"   # builds run in threads
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


def local_gpu() -> tuple[int, int] | None:
    """The current CUDA device and its SM count, or None where there is none (code is still
    generated there)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device()
    return index, torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=1)
def libcuda() -> ctypes.CDLL:
    """The CUDA driver library, for the few driver calls TVM's runtime does not expose (tensor
    maps, cluster occupancy)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise TargetError(f"this needs the CUDA driver (libcuda.so.1): {exc}") from exc


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_FUNC_MAX_DYNAMIC_SHARED, _FUNC_NON_PORTABLE_CLUSTER, _LAUNCH_CLUSTER_DIMENSION = 8, 14, 4
_FUNC_STATIC_SHARED, _DEVICE_SHARED_OPTIN = 1, 97   # CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, CU_DEVICE_
                                                    # ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
_LAUNCH_PROGRAMMATIC_STREAM_SERIALIZATION = 6
TENSOR_MAP = "tensormap"   # an argument type of driver launches: a 128-byte tensor map by value
# each argument type's struct code and alignment in a driver launch's parameter buffer (a tensor
# map's 64 bytes: what a __grid_constant__ CUtensorMap asks of its address)
_PACKED = {"handle": ("Q", 8), "int32": ("i", 4), "float32": ("f", 4), TENSOR_MAP: ("128s", 64)}


def _parameter_layout(arg_types: tuple[str, ...]) -> tuple[struct.Struct, list[int]]:
    """The struct that packs arguments of ``arg_types`` into one buffer, each at its alignment,
    and each one's offset there."""
    code, offsets, at = "=", [], 0
    for kind in arg_types:
        letter, align = _PACKED[kind]
        pad = -at % align
        code += (f"{pad}x" if pad else "") + letter
        offsets.append(at + pad)
        at += pad + struct.calcsize("=" + letter)
    return struct.Struct(code), offsets


def _check(err: int, what: str) -> None:
    if err:
        raise TargetError(f"{what} failed (CUresult {err})")


def _load_function(cubin: bytes, name: str, shared_bytes: int,
                   cluster: int) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
    """``(module, function)`` of kernel ``name`` of ``cubin`` loaded into the current context,
    allowed ``shared_bytes`` of dynamic shared memory (and clusters above 8 CTAs)."""
    cu = libcuda()
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    _check(cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(cubin)), "cuModuleLoadData")
    try:
        _check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()),
               "cuModuleGetFunction")
        if cu.cuFuncSetAttribute(fn, _FUNC_MAX_DYNAMIC_SHARED, shared_bytes):
            raise TargetError(_shared_refusal(cu, fn, name, shared_bytes))
        if cluster > 8:
            _check(cu.cuFuncSetAttribute(fn, _FUNC_NON_PORTABLE_CLUSTER, 1),
                   "cuFuncSetAttribute(non-portable cluster size)")
    except TargetError:
        cu.cuModuleUnload(mod)
        raise
    return mod, fn


def _shared_refusal(cu, fn, name: str, shared_bytes: int) -> str:
    """Why the driver refused ``shared_bytes`` of dynamic shared memory to kernel ``name``: its
    static shared memory (the compiler's, aligned as the kernel's buffers) beside it past what
    this GPU gives a block."""
    static, device, most = ctypes.c_int(-1), ctypes.c_int(0), ctypes.c_int(-1)
    cu.cuFuncGetAttribute(ctypes.byref(static), _FUNC_STATIC_SHARED, fn)
    cu.cuCtxGetDevice(ctypes.byref(device))
    cu.cuDeviceGetAttribute(ctypes.byref(most), _DEVICE_SHARED_OPTIN, device)
    return (f"kernel {name} asks {shared_bytes} bytes of dynamic shared memory beside "
            f"{static.value} static ones ({shared_bytes + static.value} in all); this GPU gives a "
            f"block at most {most.value}: choose knobs that keep fewer tiles or stages in shared "
            "memory")


def _launch_config(grid: int | tuple[int, int], threads: int, shared_bytes: int, cluster: int,
                   dependent: bool = False):
    """``(configuration, attributes)`` of a launch of ``grid`` CTAs (a count, or ``(x, y)``)
    with clusters of ``cluster`` CTAs along x (and, ``dependent``, programmatic stream
    serialisation); the attributes must outlive the configuration's use."""
    wanted = ([(_LAUNCH_PROGRAMMATIC_STREAM_SERIALIZATION, [1])] if dependent else []) + \
        [(_LAUNCH_CLUSTER_DIMENSION, [cluster, 1, 1])]
    attrs = (_LaunchAttribute * len(wanted))()
    for attr, (kind, value) in zip(attrs, wanted):
        attr.id = kind
        attr.value[0:len(value)] = value
    x, y = (grid, 1) if isinstance(grid, int) else grid
    config = _LaunchConfig(grid=(ctypes.c_uint * 3)(x, y, 1),
                           block=(ctypes.c_uint * 3)(threads, 1, 1), shared_bytes=shared_bytes,
                           attrs=ctypes.cast(attrs, ctypes.POINTER(_LaunchAttribute)),
                           num_attrs=len(wanted))
    return config, attrs


class DriverLaunch:
    """A kernel launched through the driver (``cuLaunchKernelEx``), for what TVM's runtime
    launcher cannot pass: a *programmatic dependent* of the kernel before it on the stream
    (``dependent``: it may start while that one finishes — its CTAs on SMs the other leaves
    free, its prologue overlapping the other's last tiles — and must execute
    ``griddepcontrol.wait`` before reading what that kernel wrote), and tensor maps passed by
    value (argument type :data:`TENSOR_MAP`, a ``__grid_constant__`` parameter: made on the host
    per call, with no device buffer to fill). Such a kernel has its own module, loaded once per
    device. The parameter buffer and the launch configurations are made once and refilled per
    call: built per call they made the host slower than the GPU (H100,
    ``tools/profile_call.py``)."""

    def __init__(self, source: str, target: TargetSpec, name: str, arg_types: tuple[str, ...],
                 dependent: bool = False):
        self.source, self.target, self.name, self.arg_types = source, target, name, arg_types
        self.dependent = dependent
        self.functions: dict = {}   # (device, shared bytes, cluster) -> (module, function)
        unknown = sorted(set(arg_types) - set(_PACKED))
        if unknown:
            raise TargetError(f"{name}: no driver launch argument type {unknown[0]!r} (one of "
                              f"{', '.join(_PACKED)})")
        self._packer, self._offsets = _parameter_layout(tuple(arg_types))
        self._handles = [k for k, t in enumerate(arg_types) if t == "handle"]
        self._memory = self._params = None   # the parameters' memory, refilled per launch
        self._shift = 0                      # from the memory's start to a 64-byte boundary
        self._configs: dict = {}             # (grid, threads, cluster, smem) -> configuration
        self._lock = threading.Lock()

    def parameters(self, args: list):
        """The driver's ``void**`` kernel parameters holding ``args`` (kept memory, refilled by
        one ``struct`` pack per launch; addresses as ints or ``ctypes.c_void_p``, a tensor map
        as its 128 bytes)."""
        if len(args) != len(self.arg_types):
            raise TargetError(f"{self.name} takes {len(self.arg_types)} arguments, not "
                              f"{len(args)}")
        if self._memory is None:
            self._memory = ctypes.create_string_buffer(self._packer.size + 64)
            base = ctypes.addressof(self._memory)
            self._shift = -base % 64
            self._params = (ctypes.c_void_p * len(args))(
                *[base + self._shift + offset for offset in self._offsets])
        values = list(args)
        for k in self._handles:
            if type(values[k]) is ctypes.c_void_p:
                values[k] = values[k].value or 0
        try:
            self._packer.pack_into(self._memory, self._shift, *values)
        except struct.error as exc:
            raise TargetError(f"{self.name}: arguments {args!r} do not fit its parameter types "
                              f"{self.arg_types}: {exc}") from exc
        return self._params

    def __call__(self, args: list, grid: int | tuple[int, int], threads: int, cluster: int,
                 shared_bytes: int, device) -> None:
        """Launch with ``args`` (``ctypes.c_void_p`` for handles, numbers for the others, in the
        order and types of ``arg_types``) on torch's current stream of ``device`` (a CUDA
        ``torch.device``), in that device's context."""
        import torch

        from ...interop import device_index, raw_stream

        index = device_index(device)
        if index != torch.cuda.current_device():   # the driver launches in the current context
            with torch.cuda.device(index):
                return self(args, grid, threads, cluster, shared_bytes, device)
        with self._lock:   # threads sharing the kernel share its buffers
            key = (index, shared_bytes, cluster)
            if key not in self.functions:
                self.functions[key] = _load_function(cubin_for(self.source, self.target),
                                                     self.name, shared_bytes, cluster)
            params = self.parameters(args)
            shape = (grid, threads, cluster, shared_bytes)
            if shape not in self._configs:
                self._configs[shape] = _launch_config(grid, threads, shared_bytes, cluster,
                                                      dependent=self.dependent)
            config = self._configs[shape][0]
            config.stream = raw_stream(index)
            _check(libcuda().cuLaunchKernelEx(ctypes.byref(config), self.functions[key][1],
                                              params, None), f"cuLaunchKernelEx({self.name})")


def max_active_clusters(cubin: bytes, name: str, cluster: int, threads: int, shared_bytes: int,
                        device: int = 0) -> int:
    """How many clusters of ``cluster`` CTAs of kernel ``name`` (``threads`` per CTA,
    ``shared_bytes`` of dynamic shared memory) the GPU can hold at once, from the driver
    (``cuOccupancyMaxActiveClusters``). A cluster's CTAs must share one GPC, so this is often
    fewer than ``SMs / cluster`` — the number that decides whether a grid of clusters runs in one
    wave."""
    cu = libcuda()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    try:
        _check(cu.cuInit(0), "cuInit")
        _check(cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        _check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        _check(cu.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        try:
            mod, fn = _load_function(cubin, name, shared_bytes, cluster)
            try:
                config, _attrs = _launch_config(cluster, threads, shared_bytes, cluster)
                count = ctypes.c_int()
                _check(cu.cuOccupancyMaxActiveClusters(ctypes.byref(count), fn,
                                                       ctypes.byref(config)),
                       "cuOccupancyMaxActiveClusters")
                return count.value
            finally:
                cu.cuModuleUnload(mod)
        finally:
            cu.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
            cu.cuDevicePrimaryCtxRelease_v2(dev)
    except TargetError as exc:
        raise TargetError(f"{exc} while asking the driver how many clusters of {cluster} CTAs "
                          f"of {name} fit the GPU") from exc
