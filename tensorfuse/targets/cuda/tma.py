"""Hopper's bulk tensor copies (TMA, ``cp.async.bulk.tensor``) for generated CUDA.

A copy is described by a *tensor map* (128 bytes: the global tensor's address, sizes and strides,
the box copied, the shared-memory swizzle), made on the host by the driver's
``cuTensorMapEncodeTiled`` and handed to the kernel in global memory. One thread issues the copy;
its completion is counted in bytes on an mbarrier (``complete_tx``) that the consumers wait on.
Rows outside the tensor arrive as zeros. The maps here use the 128-byte swizzle, which is the
layout :mod:`.gemm_chain_wgmma` gives to wgmma.
"""
from __future__ import annotations

import ctypes
import functools
import math

from ...errors import TargetError
from ...interop import capturing, kept_empty
from .module import libcuda

# mbarriers: the TMA copies complete on them, and the cp.async pipelines of
# :mod:`.gemm_chain_wgmma` count their copies and their consumers' releases on them.
MBARRIER_HELPERS = r"""
__device__ __forceinline__ void tf_mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(tf_smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void tf_mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Arms the barrier's current phase for `bytes` of copies (and arrives once) — only where `issue`
// holds: a predicate, not a branch, so that one thread of a warpgroup can arm it while the others
// run on (ptxas serializes wgmma around thread-divergent code).
__device__ __forceinline__ void tf_mbar_expect(unsigned long long* bar, unsigned bytes,
                                               bool issue = true) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n"
               "@p mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n}"
               :: "r"(tf_smem_addr(bar)), "r"(bytes), "r"((int)issue) : "memory");
}
__device__ __forceinline__ void tf_mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(tf_smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void tf_mbar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile("{\n.reg .pred done;\nTF_WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra TF_WAIT;\n}\n" :: "r"(tf_smem_addr(bar)), "r"(parity) : "memory");
}
// One arrival on `bar` once every cp.async this thread has issued so far has landed (`noinc`: the
// arrival counts against the barrier's expected count, so initialise it with the arriving threads).
__device__ __forceinline__ void tf_cp_async_mbar_arrive(unsigned long long* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];"
               :: "r"(tf_smem_addr(bar)) : "memory");
}
"""

HELPERS = r"""
// The tensor map lives in global memory, written before the launch: order it for the TMA unit.
__device__ __forceinline__ void tf_tensormap_acquire(const void* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(map) : "memory");
}
// Box at (inner coordinate c0, row c1) of a 2-D tensor map into shared memory, counted on bar
// (where `issue` holds, as a predicate: see tf_mbar_expect).
__device__ __forceinline__ void tf_tma_load_2d(void* dst, const void* map, int c0, int c1,
                                               unsigned long long* bar, bool issue = true) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %5, 0;\n"
               "@p cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3}], [%4];\n}"
               :: "r"(tf_smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(tf_smem_addr(bar)),
                  "r"((int)issue) : "memory");
}
"""

def load_helper(rank: int) -> str:
    """``tf_tma_load_{rank}d(dst, map, c0, …, bar)``: the box at coordinates ``c0 …`` (innermost
    first) of a ``rank``-D tensor map into shared memory, counted on ``bar``; and
    ``tf_tma_prefetch_{rank}d(map, c0, …)``: the same box fetched into L2 only (nothing to wait
    for), so that its copy into shared memory, issued later, finds it there."""
    coords = ", ".join(f"int c{k}" for k in range(rank))
    operands = ", ".join(f"%{k + 2}" for k in range(rank))
    inputs = ", ".join(f'"r"(c{k})' for k in range(rank))
    prefetched = ", ".join(f"%{k + 1}" for k in range(rank))
    return f"""
// Box at (c0, …, c{rank - 1}), innermost first, of a {rank}-D tensor map.
__device__ __forceinline__ void tf_tma_load_{rank}d(void* dst, const void* map, {coords},
                                               unsigned long long* bar) {{
  asm volatile("cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {{{operands}}}], [%{rank + 2}];"
               :: "r"(tf_smem_addr(dst)), "l"(map), {inputs},
                  "r"(tf_smem_addr(bar)) : "memory");
}}
// The same box into L2 only.
__device__ __forceinline__ void tf_tma_prefetch_{rank}d(const void* map, {coords}) {{
  asm volatile("cp.async.bulk.prefetch.tensor.{rank}d.L2.global.tile [%0, {{{prefetched}}}];"
               :: "l"(map), {inputs} : "memory");
}}
"""


# A contiguous piece of global memory (a multiple of 16 bytes, 16-byte aligned at both ends) into
# shared memory, counted on an mbarrier like the tensor copies.
BULK_HELPERS = r"""
__device__ __forceinline__ void tf_bulk_load(void* dst, const void* src, unsigned bytes,
                                             unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1], %2, [%3];"
               :: "r"(tf_smem_addr(dst)), "l"(src), "r"(bytes), "r"(tf_smem_addr(bar))
               : "memory");
}
"""

# A tensor map passed by value (a ``__grid_constant__`` kernel parameter, made on the host per
# call: no device buffer to fill).
TENSOR_MAP_TYPE = "struct __align__(64) TfTensorMap { unsigned char bytes[128]; };\n"

# Shared memory added into global memory through a tensor map (TMA reductions), tracked as bulk
# groups by the issuing thread: ``…_read`` waits until the groups have read their shared memory
# (it may be written again), ``tf_bulk_wait`` until they are done.
REDUCE_HELPERS = r"""
__device__ __forceinline__ void tf_tma_reduce_add_3d(const void* map, const void* src, int c0,
                                                     int c1, int c2) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group"
               " [%0, {%1, %2, %3}], [%4];"
               :: "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(tf_smem_addr(src)) : "memory");
}
__device__ __forceinline__ void tf_bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
__device__ __forceinline__ void tf_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void tf_bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
"""

_DATA_TYPES = {"bf16": 9, "f16": 6, "f32": 7}   # CUtensorMapDataType
ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4}
_SWIZZLE_NONE, _SWIZZLE_128B, _L2_256B = 0, 3, 3   # CUtensorMapSwizzle / L2promotion values


def tensor_map(address: int, sizes: tuple[int, ...], box: tuple[int, ...],
               dtype: str = "bf16", strides: tuple[int, ...] | None = None) -> bytes:
    """The 128-byte map of a tensor of ``sizes`` (outermost first) at ``address``, copied in
    boxes of ``box`` (outermost first; the innermost box dimension is 128 bytes: one row of the
    128-byte swizzle — 64 bf16/fp16 elements, 32 f32; or a box of one row of any multiple of 16
    bytes, copied unswizzled). ``strides``: the element strides of all
    dimensions but the innermost (which is contiguous), outermost first, in any order of
    magnitude — a permuted layout's; default row-major. Elements outside ``sizes`` arrive as
    zeros (and are not written by stores and reductions through the map) — so a box that runs
    past the end of one dimension does not touch the next slice.

    A map is a function of these arguments alone, so each is encoded once: calls that meet the
    same tensors again (a training step's buffers, a benchmark's loop) reuse it — the five
    maps of the attention backward took a seventh of its host time through autograd (cProfile,
    H200 host, a sliding window at S=4096, where that backward is bound by the host)."""
    return _encoded(int(address), tuple(sizes), tuple(box), dtype,
                    None if strides is None else tuple(strides))


@functools.lru_cache(maxsize=1024)
def _encoded(address: int, sizes: tuple[int, ...], box: tuple[int, ...], dtype: str,
             strides: tuple[int, ...] | None) -> bytes:
    """:func:`tensor_map`'s encoding (``cuTensorMapEncodeTiled``)."""
    rank = len(sizes)
    out = (ctypes.c_uint8 * 128)()
    dims = (ctypes.c_uint64 * rank)(*reversed(sizes))
    stride_arr = (ctypes.c_uint64 * max(1, rank - 1))(*reversed(
        byte_strides(sizes, box, dtype, strides)))
    box_arr = (ctypes.c_uint32 * rank)(*reversed(box))
    elem = (ctypes.c_uint32 * rank)(*([1] * rank))
    err = libcuda().cuTensorMapEncodeTiled(out, _DATA_TYPES[dtype], rank,
                                           ctypes.c_void_p(address), dims, stride_arr, box_arr,
                                           elem, 0, _SWIZZLE_NONE if _row_box(
                                               box, ELEMENT_BYTES[dtype]) else _SWIZZLE_128B,
                                           _L2_256B, 0)
    if err:
        raise TargetError(f"cuTensorMapEncodeTiled failed (CUresult {err}) for a {list(sizes)} "
                          f"{dtype} tensor at {address:#x} with {list(box)} boxes")
    return bytes(out)


def _row_box(box: tuple[int, ...], element: int) -> bool:
    """A box of one row whose bytes are not one 128-byte swizzle row (a key block's strip of a
    tensor read by key): copied unswizzled, its bytes a multiple of 16 as TMA needs."""
    return all(b == 1 for b in box[:-1]) and box[-1] * element % 16 == 0 and \
        box[-1] * element != 128


def byte_strides(sizes: tuple[int, ...], box: tuple[int, ...], dtype: str,
                 strides: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The byte strides of a tensor map's outer dimensions, outermost first (what
    :func:`tensor_map` encodes): ``strides`` (elements) or row-major ones of ``sizes``, times
    the element's bytes; an error for a box or a stride TMA cannot take."""
    element = ELEMENT_BYTES[dtype]
    if box[-1] * element != 128 and not _row_box(box, element):
        raise ValueError(f"the innermost box dimension is 128 bytes ({128 // element} {dtype} "
                         f"elements), not {box[-1]} (in a box of one row: any multiple of 16 "
                         "bytes)")
    if any(not 1 <= b <= 256 for b in box):
        raise ValueError(f"a TMA box has 1 to 256 elements per dimension, not {box}")
    if strides is None:
        strides = tuple(math.prod(sizes[k + 1:]) for k in range(len(sizes) - 1))
    if len(strides) != len(sizes) - 1 or any(s * element % 16 for s in strides):
        raise TargetError(f"a tensor map takes {len(sizes) - 1} outer strides, each a multiple "
                          f"of 16 bytes, not {list(strides)} elements")
    return tuple(element * s for s in strides)


def tensor_map_2d(address: int, rows: int, cols: int, box_rows: int) -> bytes:
    """The 128-byte map of a row-major bf16 ``[rows, cols]`` tensor at ``address``, copied in
    boxes of ``box_rows`` rows × 64 columns (128 bytes: one row of the 128-byte swizzle)."""
    return tensor_map(address, (rows, cols), (box_rows, 64))


class DeviceMaps:
    """Tensor maps in device memory, made once per key (the operands' addresses and whatever
    else the maps encode) and kept — up to ``keep`` sets, the oldest dropped first — because a
    CUDA graph captured with a set replays with its device buffer. The kept buffers are TVM's
    memory, outside torch's allocator and any graph pool (:func:`~tensorfuse.interop.kept_empty`).
    A set first needed while a stream captures (torch.compile's CUDA graphs record with fresh
    input buffers) is that graph's own: a temporary from its pool, filled by a captured copy from
    pinned host memory that is kept alive for the graph's replays, and not cached."""

    def __init__(self, keep: int = 64):
        self.keep = keep
        self.entries: dict = {}
        self.captured: list = []   # pinned sources of copies inside captured graphs

    def get(self, key, make_blob, device):
        """The device buffer for ``key``, made from ``make_blob()`` (bytes) the first time."""
        found = self.entries.get(key)
        if found is None:
            import torch

            host = torch.frombuffer(bytearray(make_blob()), dtype=torch.uint8).pin_memory()
            if capturing():
                self.captured.append(host)
                return host.to(device, non_blocking=True)
            if len(self.entries) >= self.keep:
                self.entries.pop(next(iter(self.entries)))
            buffer = kept_empty(host.shape, torch.uint8, device)
            buffer.copy_(host, non_blocking=True)
            found = self.entries[key] = (buffer, host)
        return found[0]

