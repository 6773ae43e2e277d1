"""The device functions of the warp-specialised attention kernel (:mod:`.hopper_attention`
writes the kernel around them), each from its part (:mod:`.parts`): base-2 exponent, the
consumers' turns, wgmma descriptors of the query, key and value tiles, a block's score (the
program's expression on the accumulator fragments, masked where the block is partial) and online
softmax, ``P`` packed for ``P·V``, ``O``'s rescale, the tile list and its key blocks, the
``"split"`` schedule's tail and the merge of its pieces, and the claim of the next tile. They read
the kernel's ``#define``s (``BN``, ``D_``, ``CONSUMERS``, …), so they are emitted after them."""
from __future__ import annotations

from .parts import assemble, epilogue, mainloop, pipeline, row_state, scheduler
from .parts.scheduler import TAIL_HELPERS  # noqa: F401  (host and device code: tested on the CPU)

FUNCTIONS = (
    row_state.attention_exp2, pipeline.attention_turn_functions, mainloop.attention_pack_function,
    mainloop.attention_descriptors, row_state.attention_score_function,
    row_state.attention_softmax_functions, epilogue.attention_quad_transpose,
    mainloop.attention_pack_p, row_state.attention_rescale, scheduler.attention_tile_functions,
    epilogue.attention_merge_piece, scheduler.attention_claim_function,
)


def device_functions(c) -> str:
    """C++ of the functions for an emitter context ``c`` (``hopper_attention.AttentionSource``):
    16-bit pairs of type ``c.pair`` made by ``c.pack``, the score ``c.score`` of ``qk`` (and the
    indices ``b``, ``h``, ``i_``, ``j_``), the masking statement ``c.masked`` of a partial block
    and the parameters ``c.extra_params`` (tensors, sizes, scalars) the score and mask read;
    ``c.begin``: a statement a block's score starts with (a key-linear bias's per-block
    terms)."""
    return assemble(FUNCTIONS, c)
