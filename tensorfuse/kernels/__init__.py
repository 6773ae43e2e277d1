"""A library of kernels written in the DSL: attention and its variants, row reductions, GEMMs, GEMM chains.

They are plain DSL programs (the naive specification); schedules and templates make them fast.
Each has a float64 NumPy reference in ``tensorfuse.kernels.reference`` for checking.
"""
from .attention import (attention, causal_attention, alibi_attention, softcap_attention,
                        sliding_window_attention, prefix_lm_attention, document_attention,
                        gqa_attention, gqa_causal_attention, neighborhood_attention,
                        neighborhood_attention_2d, neighborhood_attention_3d, softmax_attend,
                        static_cache_attention,
                        ATTENTION_VARIANTS)
from .rows import softmax, log_softmax, layernorm, rmsnorm, cross_entropy, ROW_KERNELS
from .ffn import ffn_gelu, ffn_swiglu, ffn_swiglu_linear, FFN_KERNELS
from .gemm import matmul, linear, swiglu_gate, GEMM_KERNELS

ALL = {**ATTENTION_VARIANTS, **ROW_KERNELS, **FFN_KERNELS, **GEMM_KERNELS}

__all__ = ["attention", "causal_attention", "alibi_attention", "softcap_attention",
           "sliding_window_attention", "prefix_lm_attention", "document_attention", "gqa_attention",
           "gqa_causal_attention", "neighborhood_attention", "neighborhood_attention_2d",
           "neighborhood_attention_3d", "softmax_attend", "static_cache_attention", "softmax",
           "log_softmax", "layernorm", "rmsnorm", "cross_entropy", "ffn_gelu", "ffn_swiglu", "ffn_swiglu_linear", "matmul", "linear", "swiglu_gate", "ALL",
           "ATTENTION_VARIANTS", "ROW_KERNELS", "FFN_KERNELS", "GEMM_KERNELS"]
