"""The GEMM-chain kernel's body on Hopper's warpgroup MMA (``mma="wgmma"``).

The same algorithm as the mma.sync body in :mod:`.gemm_chain` — first product into H in shared
memory, shared over the cluster through DSM, then ``O / cluster`` output columns per CTA — with the
tensor-core work issued by two warpgroups as ``wgmma.mma_async`` on shared-memory descriptors, and,
with ``exchange="peer"``, the second product's A operand in registers loaded from the peers' slices
(``ld.shared::cluster``, two register sets: one feeds the k-tile in flight, the other is refilled).
Every tile (x, the gate weights, H, W2) is kept in the 128-byte-swizzled layout, so that the
cp.async copies read whole 128-byte lines *and* write 128-byte spans of shared memory. (A first
version used the unswizzled core-matrix layout: its scattered shared-memory destinations split
each copy into 2.7× the L2 requests of the mma.sync path — ncu: L2 87 % busy — and it ran 1.4×
slower.) With ``copy="tma"`` and the all-gather a producer warp fills the same tiles by bulk
tensor copies (:mod:`.tma`) into one ring of slots — phase 1's stages, then phase 2's W2 tiles —
and the consumer warpgroups release each slot on an mbarrier when their MMAs on it are done; with
``copy="tma"`` and peer reads one consumer thread issues them into the cp.async rings below. With
``copy="producer"`` a third warpgroup (``setmaxnreg``) issues every cp.async copy and copies each
k-tile of H from its owner into the ring, so both products read A from shared memory. Both measured
slower than cp.async by every thread (``benchmarks.cluster``). With cp.async the same
two mbarriers per slot drive two rings (phase 1's stages, then W2's tiles): every thread's copies
arrive on the slot's "full" barrier as they land (``cp.async.mbarrier.arrive``), each warpgroup
arrives on "empty" once its MMAs on the slot are done, and the copies run up to ``slots − 1`` k-tiles
ahead with no CTA barrier per k-tile (a ``__syncthreads`` version ran ``STAGES − 2`` ahead:
``benchmarks.cluster``). Each thread's copies follow a plan made once per CTA (``CopyPlan``): with
only two warps per scheduler, the per-copy address arithmetic had made the first product bound by
instruction issue (Nsight Compute).
"""
from __future__ import annotations

from dataclasses import dataclass

from .parts import Part, assemble, epilogue, loads, mainloop, named_parts, pipeline
from .tma import HELPERS as TMA_HELPERS
from .tma import MBARRIER_HELPERS
from .wgmma import HELPERS, wgmma_function


PRODUCER_THREADS = 128  # copy="producer": one warpgroup (setmaxnreg works per warpgroup)


@dataclass(frozen=True)
class ChainSource:
    """What the parts of the GEMM chain's wgmma body read: the plan
    (``schedule_templates.gemm_chain_plan.GemmChainPlan``), its knobs, the pipeline geometry
    the template chose (``layout``: ``gemm_chain_plan.WgmmaLayout``) and the activation's C++."""

    producer_threads = PRODUCER_THREADS
    plan: object
    knobs: object
    layout: object
    activation: str

    @property
    def g(self) -> int:
        return len(self.plan.gates)

    @property
    def wg_m(self) -> int:
        """Warpgroups along the rows (1 or 2)."""
        return self.knobs.block_m // 64

    @property
    def wg_n(self) -> int:
        """And along the columns."""
        return 2 // self.wg_m

    @property
    def nw(self) -> int:
        return self.knobs.block_n // self.wg_n

    @property
    def ow(self) -> int:
        return self.knobs.block_o // self.wg_n

    @property
    def peer(self) -> bool:
        return self.knobs.exchange == "peer"

    @property
    def producer(self) -> bool:
        return self.knobs.copy == "producer"

    @property
    def tma(self) -> bool:
        return self.knobs.copy == "tma"

    @property
    def functions(self) -> str:
        return wgmma_function(self.nw) + (wgmma_function(self.ow, a_in_registers=True)
                                          if self.peer and not self.producer else
                                          wgmma_function(self.ow) if self.ow != self.nw else "")

    @property
    def gate_values(self) -> str:
        return "".join(f"float g{j} = acc[{j}][4 * jj + 2 * half + e]; " for j in range(self.g))

    pipe_bytes = property(lambda self: self.layout.pipe_bytes)   # STAGES slots of the larger
    w2_stages = property(lambda self: self.layout.w2_stages)
    ahead1 = property(lambda self: self.layout.ahead1)
    ahead2 = property(lambda self: self.layout.ahead2)


def _head(c: ChainSource) -> str:
    """The helpers the parts call and the ``wgmma`` functions."""
    return f"""{HELPERS}
{MBARRIER_HELPERS}
{TMA_HELPERS if c.tma else ""}
{c.functions}
"""


# The body's parts, by role (``tensorfuse show --parts``); the rest of the kernel (sizes, the f32
# epilogue kernel, the cluster's rasterisation): :func:`.gemm_chain._header`.
PARTS = (
    Part("load", "cp_async_tma_or_producer", ("knobs.copy", "knobs.block_*", "gates"),
         (loads.chain_swizzle, loads.chain_copy_geometry, loads.chain_cp_async, loads.chain_tma,
          loads.chain_h_tiles, loads.chain_producers)),
    Part("pipeline", "mbarrier_rings", ("knobs.copy", "knobs.stages", "knobs.warps", "layout"),
         (pipeline.chain_config, pipeline.chain_ring, pipeline.chain_fill,
          pipeline.chain_consumers_sync, pipeline.chain_kernel_begin)),
    Part("mainloop", "wgmma_two_products", ("knobs.exchange", "knobs.block_*", "gates"),
         (mainloop.chain_peer_fragment, mainloop.chain_first_product,
          mainloop.chain_second_product_peer, mainloop.chain_second_product_shared)),
    Part("epilogue", "activation_exchange_atomic_sums", ("activation", "knobs.exchange"),
         (epilogue.chain_add_tile, epilogue.chain_activation_exchange)),
)

# The body's source, fragment by fragment.
BODY = (
    _head, pipeline.chain_config, loads.chain_swizzle, loads.chain_copy_geometry,
    loads.chain_cp_async, mainloop.chain_peer_fragment, epilogue.chain_add_tile,
    pipeline.chain_ring, loads.chain_tma, pipeline.chain_fill, loads.chain_h_tiles,
    pipeline.chain_consumers_sync, pipeline.chain_kernel_begin,
    loads.chain_producers, mainloop.chain_first_product, epilogue.chain_activation_exchange,
    mainloop.chain_second_product_peer, mainloop.chain_second_product_shared,
)


def wgmma_body(plan, knobs, layout, activation: str) -> str:
    """Device code after :func:`gemm_chain._header` for ``mma="wgmma"``: ``layout`` is the
    pipeline geometry the template chose (``gemm_chain_plan.WgmmaLayout``), ``activation`` the
    activation's C++. Assembled from :data:`PARTS`."""
    named_parts(PARTS, plan.parts)
    return assemble(BODY, ChainSource(plan, knobs, layout, activation))
