"""Arrays in and out of compiled kernels: NumPy arrays and PyTorch tensors, through DLPack.

PyTorch tensors are passed to TVM without copies (they must already be on the kernel's device);
NumPy arrays are always accepted and are copied to the device when the kernel runs on a GPU.
"""
from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass

import numpy as np
import tvm

from .dsl import dtypes as dt


def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "__dlpack__") and hasattr(x, "dim")


def is_array(x) -> bool:
    return isinstance(x, np.ndarray) or is_torch(x) or isinstance(x, tvm.runtime.Tensor)


@dataclass(frozen=True)
class ArrayInfo:
    """What a kernel needs to know about an argument before launching."""

    dtype: str         # DSL dtype
    shape: tuple
    device: str        # "cpu", "cuda", ...
    framework: str     # "numpy", "torch" or "tvm"


def describe(x) -> ArrayInfo:
    if is_torch(x):
        return ArrayInfo(dt.from_any(x.dtype), tuple(x.shape), x.device.type, "torch")
    if isinstance(x, tvm.runtime.Tensor):
        kind = {1: "cpu", 2: "cuda", 10: "rocm"}.get(x.device.dlpack_device_type(), "other")
        return ArrayInfo(dt.from_any(x.dtype), tuple(x.shape), kind, "tvm")
    return ArrayInfo(dt.from_any(x.dtype), tuple(x.shape), "cpu", "numpy")


def to_tvm(x, device: tvm.runtime.Device) -> tvm.runtime.Tensor:
    """A TVM view of ``x`` on ``device`` (no copy unless NumPy data must move to a GPU)."""
    return to_tvm_shared(x, device)[0]


def to_tvm_shared(x, device: tvm.runtime.Device) -> tuple[tvm.runtime.Tensor, bool]:
    """Like :func:`to_tvm`, and whether the result shares ``x``'s memory (writes reach ``x``)."""
    if isinstance(x, tvm.runtime.Tensor):
        return x, True
    if is_torch(x):
        if x.is_contiguous():
            try:
                return tvm.runtime.from_dlpack(x), True
            except RuntimeError:  # TVM wants 64-byte aligned data (e.g. torch.from_numpy views)
                pass
        return tvm.runtime.from_dlpack(x.clone(memory_format=_contiguous())), False
    if device.dlpack_device_type() == 1 and x.flags.c_contiguous:
        try:
            return tvm.runtime.from_dlpack(x), True
        except Exception:  # unaligned or unusual data: fall back to a copy
            pass
    return tvm.runtime.tensor(np.ascontiguousarray(x), device), False


def _contiguous():
    import torch

    return torch.contiguous_format


PREFAULT_BYTES = 1 << 20


@functools.lru_cache(maxsize=1)
def tvm_cpu_threads() -> int:
    """The size of TVM's CPU thread pool (fixed once it has started)."""
    return int(tvm.get_global_func("runtime.NumThreads")())


def empty(shape, dtype: str, device: tvm.runtime.Device, like: str, torch_device=None):
    """A new output array in the framework of the inputs (``like``) and its TVM view.

    Fresh memory from the OS faults in page by page on its first write. Large CPU torch outputs
    are written once (zeros) before the kernel only where torch's fill runs on more threads than
    TVM's pool, which then takes the faults faster than the kernel would (2-core CPU, 4096² bf16
    softmax, torch on 2 threads: TVM on 1 thread 27.5 ms with the faults in the kernel, 20.3 with
    them taken here; TVM on 2 threads 16.1 ms in the kernel, 21.7–29.2 taken here — most of that
    is torch's OpenMP threads spinning after the fill while TVM's run, gone with
    ``OMP_WAIT_POLICY=PASSIVE``)."""
    if like == "torch":
        import torch

        prefault = device.dlpack_device_type() == 1 and \
            math.prod(shape) * np.dtype(dt.to_numpy(dtype)).itemsize >= PREFAULT_BYTES and \
            tvm_cpu_threads() < torch.get_num_threads()
        make = torch.zeros if prefault else torch.empty
        t = make(tuple(shape), dtype=torch_dtype(dtype), device=torch_device)
        return t, tvm.runtime.from_dlpack(t)
    arr = tvm.runtime.empty(tuple(shape), dt.to_tvm(dtype), device)
    return arr, arr


def to_user(x, framework: str):
    """Give back an output in the framework the caller used."""
    if framework == "numpy" and isinstance(x, tvm.runtime.Tensor):
        return x.numpy()
    return x


_TORCH_NAMES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
                "i8": "int8", "u8": "uint8", "i32": "int32", "i64": "int64", "bool": "bool"}


def torch_dtype(dtype: str):
    """torch's dtype for a DSL dtype name (``"bf16"`` → ``torch.bfloat16``)."""
    import torch

    return getattr(torch, _TORCH_NAMES[dtype])


# -- torch tensors for kernels that launch through torch (Triton, generated CUDA) ------------------
def torch_from_numpy(x: np.ndarray, device):
    """A NumPy array as a torch tensor on ``device`` (bf16 through its bits: torch cannot read
    ml_dtypes' bfloat16)."""
    import torch

    x = np.ascontiguousarray(x)
    if x.dtype == dt.to_numpy("bf16"):
        return torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(x).to(device)


def numpy_from_torch(buf) -> np.ndarray:
    import torch

    if buf.dtype == torch.bfloat16:  # NumPy has no bf16: through f32 to ml_dtypes' bfloat16
        return buf.float().cpu().numpy().astype(dt.to_numpy("bf16"))
    return buf.cpu().numpy()


ALIGNMENT = 16   # bytes: generated kernels copy and store 16-byte vectors (cp.async, TMA, uint4)


def launchable(x) -> bool:
    """Whether a torch tensor can be handed to a generated kernel as it is: contiguous, and
    starting on a 16-byte boundary (a view into its storage, e.g. ``flat[1:].view(m, n)``, may
    not)."""
    return x.is_contiguous() and x.data_ptr() % ALIGNMENT == 0


def tma_servable(x) -> bool:
    """Whether a kernel that reads torch tensor ``x`` through a TMA tensor map of its own strides
    can take it as it is (a slice ``qkv[:, :, 0]`` of a packed projection, a transposed view):
    its innermost axis contiguous, its start on a 16-byte boundary and each other axis's stride
    a positive multiple of 16 bytes (``cuTensorMapEncodeTiled``'s rule). Axes of one element
    are not read along, whatever their stride."""
    if x.data_ptr() % ALIGNMENT:
        return False
    size = x.element_size()
    axes = [(n, s) for n, s in zip(x.shape, x.stride()) if n > 1]
    if not axes or axes[-1] != (x.shape[-1], 1):
        return x.is_contiguous()
    return all(s > 0 and s * size % ALIGNMENT == 0 for _, s in axes[:-1])


def torch_arguments(program, bound, device, strided=(), views=()) -> dict:
    """Every parameter of a bound call by name: scalars as given, arrays as contiguous,
    16-byte-aligned torch tensors on ``device`` (NumPy arrays copied there, other views cloned)
    — but the tensors named in ``strided``, which the kernel reads by their own strides, as
    given where TMA can read them (:func:`tma_servable`), and those named in ``views`` (a
    Triton kernel written for their strides) as given."""
    values = {}
    for p in program.params:
        if p.name in bound.scalars:
            values[p.name] = bound.scalars[p.name]
        else:
            x = bound.arrays[p.name]
            x = x if is_torch(x) else torch_from_numpy(x, device)
            kept = p.name in views or (tma_servable(x) if p.name in strided else launchable(x))
            if not kept and is_torch(bound.arrays[p.name]):
                said_copied(program.name, p.name, x)
            values[p.name] = x if kept else x.clone(memory_format=_contiguous())
    return values


_SAID_COPIED: set = set()


def copy_reason(x) -> str | None:
    """Why every kernel copies torch tensor ``x`` before a launch (a strided innermost dimension,
    a start off a 16-byte boundary), or None (a kernel of TMA maps also copies a view whose outer
    strides are not multiples of 16 bytes: :func:`tma_servable`)."""
    if x.dim() and x.shape[-1] > 1 and x.stride(-1) != 1:
        return "its innermost dimension is strided"
    off = x.data_ptr() % ALIGNMENT
    return f"it starts {off} bytes past a 16-byte boundary" if off else None


def said_copied(kernel: str, name: str, x, why: str | None = None) -> None:
    """Warn, once per kernel, argument and layout, that torch tensor ``x`` (argument ``name``)
    is copied before the launch (:class:`~tensorfuse.errors.CopiedArgumentWarning`), ``why``
    where the reason is the kernel's own."""
    import warnings

    from .errors import CopiedArgumentWarning

    key = (kernel, name, tuple(x.shape), tuple(x.stride()), x.data_ptr() % ALIGNMENT)
    if key in _SAID_COPIED:
        return
    _SAID_COPIED.add(key)
    why = why or copy_reason(x) or "its strides are not multiples of 16 bytes"
    warnings.warn(CopiedArgumentWarning(
        f"{kernel}: argument {name} (shape {tuple(x.shape)}, strides {tuple(x.stride())}) is "
        f"copied before each launch, {x.numel() * x.element_size()} bytes: {why}; a view whose "
        "innermost dimension is contiguous and whose start is 16-byte aligned is read where it "
        "lies, and one in another axis order where a template takes the program in that order "
        "as well"), stacklevel=2)


def torch_output(shape, dtype: str, given, device):
    """The buffer a kernel writes: the caller's ``out`` when it is a contiguous, 16-byte-aligned
    torch tensor, else a new one (:func:`deliver` copies it into ``out``)."""
    import torch

    if given is not None and is_torch(given) and launchable(given):
        return given
    return torch.empty(shape, dtype=torch_dtype(dtype), device=device)


def deliver(buf, given, framework: str):
    """What the caller gets back: ``buf`` in their framework, or their ``out`` filled from it."""
    if given is None:
        return buf if framework == "torch" else numpy_from_torch(buf)
    if given is not buf:
        if is_torch(given):
            given.copy_(buf)
        else:
            np.copyto(given, numpy_from_torch(buf).astype(given.dtype))
    return given


def memory_span(x) -> tuple[int, int] | None:
    """The first and one past the last byte address a torch tensor's or NumPy array's elements
    occupy (None for anything else, or no elements). Addresses of different devices never meet
    under CUDA's unified addressing; where they might, a shared span costs a copy, not a wrong
    result."""
    kind = _SPAN_KINDS.get(type(x))
    if kind is None:
        kind = _SPAN_KINDS.setdefault(type(x), "torch" if is_torch(x) else
                                      "numpy" if isinstance(x, np.ndarray) else "")
    if kind == "torch":
        start, size = x.data_ptr(), x.nbytes
        if x.is_contiguous():
            return (start, start + size) if size else None
        if not x.numel():
            return None
        last = sum((n - 1) * s for n, s in zip(x.shape, x.stride()))
        return start, start + (last + 1) * x.element_size()
    if kind == "numpy" and x.size:
        return tuple(int(b) for b in _byte_bounds(x))
    return None


# NumPy 2 moved it; setup.cfg allows 1.26
_byte_bounds = getattr(np.lib, "array_utils", np).byte_bounds


_SPAN_KINDS: dict = {}   # type -> "torch", "numpy" or "" (decided once a type: calls are hot)


def fill(given, made):
    """The caller's ``out`` array ``given`` filled from a kernel's output ``made`` (torch or
    NumPy, in either framework)."""
    if is_torch(made):
        return deliver(made, given, "torch")
    if is_torch(given):
        import torch

        given.copy_(torch.from_numpy(np.ascontiguousarray(made)))
    else:
        np.copyto(given, np.asarray(made).astype(given.dtype))
    return given


# -- buffers kept between calls -------------------------------------------------------------------
def device_index(device) -> int:
    """The index of a CUDA ``torch.device`` (the current device where it names none)."""
    import torch

    return device.index if device.index is not None else torch.cuda.current_device()


def raw_stream(index: int) -> int:
    """The raw handle of torch's current stream on CUDA device ``index``, which kernels launch
    on — through torch's private fast path where it exists (the one Inductor's generated code
    calls: no ``Stream`` object per call; ``torch.cuda.current_stream`` took ~5 µs of a call's host
    time on the H100 host, several times per call)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (no memory may be allocated outside
    the graph's pool then, and what is made belongs to that graph). Asked on every launch of a
    kernel that keeps buffers: CUDA's presence is asked once (``torch.cuda.is_available`` reads
    environment variables each time: under cProfile on the H100 host a fifth of a GEMM call's
    Python, ``tools/profile_call.py``), the capture state through torch's own query."""
    import torch

    if not _CUDA_PRESENT:
        if not torch.cuda.is_available():
            return False
        _CUDA_PRESENT.append(getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
                             or torch.cuda.is_current_stream_capturing)
    return _CUDA_PRESENT[0]()


_CUDA_PRESENT: list = []   # once CUDA was found: the capture query


def stream_key(device) -> tuple[int, int]:
    """(device index, raw stream) of torch's current stream on a CUDA ``torch.device``: the key
    of buffers kept per device and stream."""
    index = device_index(device)
    return index, raw_stream(index)


def kept_empty(shape, dtype, device):
    """A torch tensor on ``device`` whose memory TVM's allocator owns, not torch's caching
    allocator: buffers a kernel keeps between calls (workspaces, counters, tensor maps, block
    lists) must never sit in a CUDA-graph memory pool — torch.compile's CUDA graphs
    (``mode="reduce-overhead"``) refuse a recording after which pool memory is alive that is not
    one of its outputs. Small buffers are cut from shared slabs (:class:`KeptSlabs`). Not to be
    called while a stream captures (see :func:`capturing`)."""
    import torch

    dtype = dtype if isinstance(dtype, torch.dtype) else torch_dtype(dtype)
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    return _KEPT.take(tuple(shape), dtype, index)


def _tvm_cuda_bytes(nbytes: int, index: int):
    """``nbytes`` of TVM's memory on CUDA device ``index``, as a torch uint8 tensor (a
    ``cudaMalloc`` of its own; ``cudaFree``'d when the last tensor viewing it goes)."""
    import torch

    return torch.from_dlpack(tvm.runtime.empty((nbytes,), "uint8", tvm.cuda(index)))


class KeptSlabs:
    """Kept memory cut from slabs: each small buffer a view of the current slab of its device,
    the slab's next ``ALIGN``-byte boundary on; a full slab is let go, and lives as long as any
    view of it does (torch's views hold their base's storage), so its memory is freed exactly
    when the last buffer cut from it is — as each buffer's own allocation was. What it saves: a
    ``cudaMalloc`` per buffer (~0.2 ms of a causal attention's first call at a new length on the
    H200 host, ``tools/profile_new_sizes.py --phases``'s "kept memory"). What it costs: a slab
    stays while any one of its buffers does. Buffers over a quarter of a slab get their own
    allocation."""

    SLAB = 4 << 20
    ALIGN = 256   # tensor maps want 64 bytes, TMA's global addresses 16; 256 as cudaMalloc

    def __init__(self, allocate=_tvm_cuda_bytes):
        self.allocate = allocate
        self.current: dict = {}   # device index -> [slab, bytes used]
        self.lock = threading.Lock()

    def take(self, shape: tuple, dtype, index: int):
        nbytes = max(1, math.prod(shape)) * dtype.itemsize
        if nbytes > self.SLAB // 4:
            memory = self.allocate(nbytes, index)
        else:
            with self.lock:
                slab = self.current.get(index)
                if slab is None or slab[1] + nbytes > self.SLAB:
                    slab = self.current[index] = [self.allocate(self.SLAB, index), 0]
                at = slab[1]
                slab[1] = -(-(at + nbytes) // self.ALIGN) * self.ALIGN
                memory = slab[0][at:at + nbytes]
        return memory.view(dtype)[:math.prod(shape)].view(shape)


_KEPT = KeptSlabs()


class StreamScratch:
    """Buffers a kernel keeps between its launches — workspaces, and counters it leaves at zero
    for the next launch — one set per device and stream, so that launches on two streams never
    share them; each ``(shape, dtype, zeroed)`` in ``layout`` (dtypes by their DSL names). Inside a CUDA-graph capture, a
    fresh set from the graph's pool (kept memory cannot be allocated then), the zeroed ones
    cleared by a captured memset before each replay."""

    def __init__(self, layout):
        self.layout = list(layout)
        self.kept: dict = {}

    def __call__(self, device) -> tuple:
        import torch

        if capturing():
            return tuple((torch.zeros if zeroed else torch.empty)(shape, dtype=torch_dtype(dtype),
                                                                   device=device)
                         for shape, dtype, zeroed in self.layout)
        key = stream_key(device)
        if key not in self.kept:
            made = []
            for shape, dtype, zeroed in self.layout:
                buffer = kept_empty(shape, dtype, device)
                made.append(buffer.zero_() if zeroed else buffer)
            self.kept[key] = tuple(made)
        return self.kept[key]


def kept_copies(tensors) -> tuple | None:
    """``tensors`` copied into kept memory (:func:`kept_empty`; CPU tensors as they are), for a
    cache that outlives the call — or ``None`` while a stream captures: what is made then is the
    graph's own, and must not be cached."""
    if capturing():
        return None
    # one allocation per device and dtype (each costs a driver call at a new size), each tensor
    # at a 16-byte boundary in it; a tensor given twice (lists a plan has no use for) copied once
    unique = {id(x): x for x in tensors if x.device.type == "cuda"}
    places, totals = {}, {}
    for key, x in unique.items():
        group, align = (x.device, x.dtype), max(1, 16 // x.element_size())
        at = -(-totals.get(group, 0) // align) * align
        places[key], totals[group] = (group, at), at + x.numel()
    memory = {group: kept_empty((max(total, 1),), group[1], group[0])
              for group, total in totals.items()}
    copied = {key: memory[group][at:at + unique[key].numel()].view(unique[key].shape)
              .copy_(unique[key]) for key, (group, at) in places.items()}
    return tuple(copied.get(id(x), x) for x in tensors)


def data_key(tensors) -> tuple:
    """What identifies the data of ``tensors`` a mask reads, for lists made from them: address,
    torch's version counter (bumped by every in-place write torch sees), shape and strides. Only
    while the tensors are held (the lists' cache keeps them): a tensor freed, its memory handed
    by the caching allocator to a new mask of other data with a version of 0, would else find
    the old lists."""
    return tuple((t.data_ptr(), t._version, tuple(t.shape), t.stride()) for t in tensors)
