"""The Hopper GEMM mainloop: persistent, warp-specialised sm_90a CUDA C++ for
``out[i, j] = epilogue(Σ_k a[i, k] · b_g[k, j] for each weight g)`` (the plan and its knobs:
``schedule_templates.hopper_gemm_plan``).

``gridDim.x`` CTAs (a multiple of the cluster size, at most as many as fit the GPU at once) walk
the output tiles of ``BM × BN`` in a grouped order (``group_m`` row units — a cluster's tiles —
per group, so that the tiles in flight at one time share their operands in L2); every CTA walks
the same sequence of tiles, ``128 · (1 + CONSUMERS)`` threads each:

- warpgroup 0 is the producer: it gives its registers back (``setmaxnreg.dec``) and one thread
  issues TMA bulk-tensor copies of each k-block (64 deep) of the a rows and of every weight into a
  ring of ``STAGES`` slots; each slot has a "full" mbarrier (the copies' bytes) and an "empty" one
  (the consumers' releases). The producer runs up to ``STAGES`` k-blocks ahead — across tile
  boundaries, so the next tile's operands load while the consumers write the last one's output.
  With ``CLUSTER`` = 2 the two CTAs of a cluster take vertically neighbouring tiles, which share
  their weight tiles: each producer copies half of every weight tile and multicasts it to both
  CTAs (``.multicast::cluster``), halving the weights' L2 traffic; a slot is then released to a
  producer only when the consumers of both CTAs are done with it;
- each consumer warpgroup (``setmaxnreg.inc``) owns 64 rows of the tile: per k-block four
  ``wgmma.mma_async`` m64nBNk16 per weight on the shared-memory tiles (128-byte swizzle; weights
  K-major when stored ``[N, K]`` as ``torch.nn.Linear`` keeps them, MN-major when ``[K, N]``),
  keeping one k-block's MMAs in flight while the previous slot is released;
- the epilogue evaluates the program's output expression on the accumulator fragments (with the
  tensors and scalars it reads) and writes it from registers (``STAGED``: 64 columns at a time
  through shared memory, 16-byte stores); rows and columns past the edge are not written, and
  the copies read zeros there (ragged M, N and K).

Weights whose tiles are each read once may be copied with an L2 evict-first policy
(``EVICT_WEIGHTS``), so that streaming them does not push out what the kernels around the GEMM
use. With ``PACE`` a producer adds the k-blocks it issued to a grid-wide count and, while it is
more than ``PACE`` k-blocks ahead of the grid's average, sleeps a bounded while before its next
copies: CTAs that read the weights' k-blocks together finish together (few-row GEMMs).

Where the last wave of tiles would leave most clusters idle, the host splits its tiles along K
(``full_items``, ``tail``, ``pieces``): each piece stores its f32 partial accumulators in ``ws``,
and the last piece of a tile to finish (an atomic counter, reset by that piece) adds the others
and runs the epilogue.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .dsm import HELPERS as DSM_HELPERS
from .expr import (C_TYPES, KernelArguments, scalar_arguments, size_aliases, stored_value,
                   tensor_arguments, to_cuda)
from .parts import (Part, assemble, epilogue, loads, mainloop, named_parts, pipeline,
                    scheduler)
from .split import HELPERS as SPLIT_HELPERS
from .tma import HELPERS as TMA_HELPERS
from .tma import MBARRIER_HELPERS, load_helper
from .wgmma import HELPERS as WGMMA_HELPERS
from .wgmma import wgmma_function

ENTRY = "tf_hopper_gemm"

# What the PTX of every Hopper GEMM holds (checked by the tests); with a cluster also MULTICAST_PTX.
GEMM_PTX = ("wgmma.mma_async", "cp.async.bulk.tensor.2d", "mbarrier.try_wait",
            "setmaxnreg.inc", "setmaxnreg.dec")
MULTICAST_PTX = ("multicast::cluster", "mapa.shared::cluster", "barrier.cluster.arrive")


_STORE = {"bf16": ("__nv_bfloat162", "__floats2bfloat162_rn({}, {})"),
          "f16": ("__half2", "__floats2half2_rn({}, {})"),
          "f32": ("float2", "make_float2({}, {})")}

MULTICAST_HELPERS = r"""
// Box at (c0, c1) into the same shared-memory offset of every CTA in `mask`, each CTA's copy
// counted on its own mbarrier at `bar`'s offset.
__device__ __forceinline__ void tf_tma_load_2d_multicast(void* dst, const void* map, int c0,
                                                         int c1, unsigned long long* bar,
                                                         unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;"
               :: "r"(tf_smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(tf_smem_addr(bar)),
                  "h"(mask) : "memory");
}
// The same copies with an L2 cache policy (`policy`: from tf_l2_evict_first): weights that are
// read once need not push out of L2 what the kernels before and after use (nor write back the
// dirty lines they would evict while the GEMM streams).
__device__ __forceinline__ unsigned long long tf_l2_evict_first() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void tf_tma_load_2d_hint(void* dst, const void* map, int c0, int c1,
                                                    unsigned long long* bar,
                                                    unsigned long long policy) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;"
               :: "r"(tf_smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(tf_smem_addr(bar)),
                  "l"(policy) : "memory");
}
__device__ __forceinline__ void tf_tma_load_2d_multicast_hint(void* dst, const void* map, int c0,
                                                              int c1, unsigned long long* bar,
                                                              unsigned short mask,
                                                              unsigned long long policy) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               ".multicast::cluster.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5, %6;"
               :: "r"(tf_smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(tf_smem_addr(bar)),
                  "h"(mask), "l"(policy) : "memory");
}
// Pacing (PACE): a relaxed add to, and a relaxed read of, the count of k-blocks every CTA of the
// grid has issued.
__device__ __forceinline__ void tf_pace_add(unsigned* counter, unsigned n) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" :: "l"(counter), "r"(n) : "memory");
}
__device__ __forceinline__ unsigned tf_pace_read(const unsigned* counter) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
  return v;
}
// Programmatic dependent launch: a GEMM lets the next kernel of its stream start once every
// CTA is running (a kernel launched without the attribute ignores it); a GEMM launched with it
// waits for the kernel before it (its memory visible) before reading what that one wrote.
__device__ __forceinline__ void tf_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void tf_wait_prerequisite() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
// One arrival on the mbarrier at `bar`'s offset in CTA `rank` of the cluster. CTA-scope release
// (the default): it releases a slot whose reads (wgmma) have completed, with no writes to order.
// `.release.cluster` compiled to MEMBAR.ALL.GPU before every arrival, which stalled the
// warpgroup once per k-block: multicast ran 1.3-1.9x slower than no cluster (H100, 2026-11-24).
__device__ __forceinline__ void tf_mbar_arrive_cluster(unsigned long long* bar, unsigned rank) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];"
               :: "r"(tf_mapa(tf_smem_addr(bar), rank)) : "memory");
}
"""


def kernel_arguments(plan) -> list[tuple[str, str, str]]:
    """(C++ name, TVM argument type, C++ type) of the kernel's arguments, in order: the tensor
    maps (a, then each weight), the output, the tensors the epilogue reads, the sizes (the
    batch's last, where there is one), the scalars, then :data:`SPLIT_ARGUMENTS` and
    :data:`ORDER_ARGUMENTS`."""
    sizes = ("M_", "N_", "K_") + (("Z_",) if plan.batch else ())
    return [("maps", "handle", "const void*"), ("out", "handle", "void*")] + \
        tensor_arguments(plan.tensors) + [(d, "int32", "int") for d in sizes] + \
        scalar_arguments(plan.scalars) + list(SPLIT_ARGUMENTS) + list(ORDER_ARGUMENTS)


# The split of the last wave (see hopper_gemm_source), last in the argument list: partial
# accumulators, one arrival counter per split tile and CTA, whole units, split units, pieces each.
SPLIT_ARGUMENTS = (("ws", "handle", "float* __restrict__"), ("counters", "handle", "int*"),
                   ("full_items", "int32", "int"), ("tail", "int32", "int"),
                   ("pieces", "int32", "int"))
# The tiles' order, after the split's: row units per rasterisation group (a launch argument, so
# that one cubin serves every size; the plan picks it per size)
ORDER_ARGUMENTS = (("group_m", "int32", "int"),)


def epilogue_code(plan) -> str:
    """C++ of the output element from the accumulators ``g0, g1, …`` at ``row``, ``col``."""
    i, j = plan.axes
    # one batch axis is the tile's batch z; several are walked as one and not read apart
    axes = {i: "row", j: "col", **({plan.batch[0][0]: "z"} if len(plan.batch) == 1 else {})}
    return to_cuda(stored_value(plan.epilogue, plan.out_dtype),
                   {name: f"g{x}" for x, name in enumerate(plan.sums)},
                   f"the output {plan.output}", axes=axes,
                   loads={t: f"t_{t}" for t, _ in plan.tensors}, wide=plan.wide)


@dataclass(frozen=True)
class GemmSource(KernelArguments):
    """What the parts of one Hopper GEMM read: the plan
    (``schedule_templates.hopper_gemm_plan.HopperGemmPlan``), its knobs, whether it is launched
    as a programmatic dependent; and the C++ names and expressions made from them once."""

    entry = ENTRY
    plan: object
    knobs: object
    dependent: bool = False

    header = "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n"

    @property
    def g(self) -> int:
        """Weights, one accumulator each."""
        return len(self.plan.weights)

    @property
    def bn(self) -> int:
        return self.knobs.block_n

    @property
    def mma(self) -> str:
        suffix = "_f16" if self.plan.dtype == "f16" else ""
        return (f"tf_wgmma_{'' if self.plan.a_k_major else 'ta_'}"
                f"{'kk_' if self.plan.b_k_major else ''}m64n{self.bn}k16{suffix}")

    @property
    def functions(self) -> str:
        return wgmma_function(self.bn, b_k_major=self.plan.b_k_major, dtype=self.plan.dtype,
                              a_mn_major=not self.plan.a_k_major)

    @cached_property
    def arguments(self) -> list:
        return kernel_arguments(self.plan)


    @property
    def pair(self) -> str:
        return _STORE[self.plan.out_dtype][0]

    @property
    def make_pair(self) -> str:
        return _STORE[self.plan.out_dtype][1]

    @property
    def out_elem(self) -> str:
        return C_TYPES[self.plan.out_dtype]

    @property
    def sizes(self) -> str:
        batch = ((self.plan.batch[0][1], "Z_"),) if len(self.plan.batch) == 1 else ()
        return size_aliases((*zip(self.plan.dims, ("M_", "K_", "N_")), *batch))

    @property
    def batched(self) -> bool:
        return bool(self.plan.batch)

    @property
    def z(self) -> str:
        """``", z"``: the batch index passed on (after a tile's origin, into the epilogue) where
        there is a batch axis; nothing otherwise."""
        return ", z" if self.batched else ""

    @property
    def z_param(self) -> str:
        return ", int z" if self.batched else ""

    @property
    def batch_output(self) -> str:
        """The tile's batch of the output (``[batch, M, N]``, contiguous), where there is one."""
        return "\n      out_t* out_z = (out_t*)out + (long)z * M_ * N_;" if self.batched else ""

    @property
    def out(self) -> str:
        """The output's first element of the tile's batch (``out_z``, declared by the store)."""
        return "out_z" if self.batched else "out"

    @property
    def forwarded_arguments(self) -> list:
        """What the epilogue may read: the tensors, sizes and scalars."""
        return self.arguments[2:-len(SPLIT_ARGUMENTS) - len(ORDER_ARGUMENTS)]

    @property
    def gate_params(self) -> str:
        return ", ".join(f"float g{x}" for x in range(self.g))

    def gate_args(self, r: str) -> str:
        """The accumulators' register ``r`` of every weight, as arguments."""
        return ", ".join(f"acc[{x}][{r}]" for x in range(self.g))

    @cached_property
    def epilogue(self) -> str:
        return epilogue_code(self.plan)


def _head(c: GemmSource) -> str:
    """Includes, the helpers the parts call, the ``wgmma`` function."""
    return f"""{c.header}#include <math.h>
{DSM_HELPERS}
{WGMMA_HELPERS}
{MBARRIER_HELPERS}
{TMA_HELPERS}{load_helper(3) if c.batched else ""}
{MULTICAST_HELPERS}
{SPLIT_HELPERS}
{c.functions}
"""


def _types(c: GemmSource) -> str:
    """The sizes' aliases and the output's types."""
    return f"""{c.sizes}
typedef {c.pair} out_pair_t;
typedef {c.out_elem} out_t;
"""


# The kernel's parts, by role (``tensorfuse show --parts``).
PARTS = (
    Part("scheduler", "grouped_persistent_tiles", ("knobs.group_m", "knobs.cluster",
                                                   "knobs.split_tail"),
         (scheduler.gemm_work, scheduler.gemm_tile_order)),
    Part("load", "tma_multicast", ("a_k_major", "b_k_major", "weights", "knobs.cluster", "knobs.multicast",
                                   "knobs.weights_l2", "knobs.pace", "dependent"),
         (loads.gemm_tile_bytes, loads.gemm_producer_defines, loads.gemm_weight_loads,
          loads.gemm_producer_loop)),
    Part("pipeline", "warp_specialized_ring", ("knobs.consumers", "knobs.block_n",
                                               "knobs.stages", "knobs.cluster"),
         (pipeline.gemm_config, pipeline.gemm_release_slot, pipeline.gemm_kernel_begin,
          pipeline.gemm_producer_begin, pipeline.gemm_kernel_end)),
    Part("mainloop", "wgmma_from_shared", ("dtype", "a_k_major", "b_k_major", "knobs.block_n",
                                           "weights"),
         (mainloop.gemm_consumer_begin, mainloop.gemm_k_loop)),
    Part("epilogue", "register_or_staged_store", ("epilogue", "tensors", "scalars",
                                                  "out_dtype", "knobs.epilogue"),
         (epilogue.gemm_defines, epilogue.gemm_split_defines, epilogue.gemm_warpgroup_barrier,
          epilogue.gemm_value_function, epilogue.gemm_split_combine, epilogue.gemm_store)),
)

# The kernel's source, fragment by fragment.
KERNEL = (
    _head, pipeline.gemm_config, loads.gemm_tile_bytes, _types, epilogue.gemm_defines,
    loads.gemm_producer_defines, epilogue.gemm_split_defines, scheduler.gemm_work,
    epilogue.gemm_warpgroup_barrier, scheduler.gemm_tile_order, pipeline.gemm_release_slot,
    loads.gemm_weight_loads, epilogue.gemm_value_function, pipeline.gemm_kernel_begin,
    pipeline.gemm_producer_begin, loads.gemm_producer_loop, mainloop.gemm_consumer_begin,
    mainloop.gemm_k_loop, epilogue.gemm_split_combine, epilogue.gemm_store,
    pipeline.gemm_kernel_end,
)


def hopper_gemm_source(plan, knobs, dependent: bool = False) -> str:
    """CUDA C++ for ``tf_hopper_gemm``: a 1-D grid of ``knobs.cluster``-CTA clusters,
    ``knobs.threads`` threads, dynamic shared memory ``hopper_gemm_plan.shared_bytes``. M, N, K
    are kernel arguments: one cubin serves every size. Every GEMM lets a programmatic
    dependent launched after it start once all its CTAs run. ``dependent``: this one is such a
    dependent (the FFN's second GEMM): its CTAs start, set up their barriers and tensor maps
    while the kernel before finishes, and its producer waits for that kernel before the first
    copy (the rows operand is its output; everything the consumers write follows from it).
    Assembled from :data:`PARTS`."""
    named_parts(PARTS, plan.parts)
    return assemble(KERNEL, GemmSource(plan, knobs, dependent))
