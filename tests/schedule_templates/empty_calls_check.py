"""Calls whose every output is empty (an empty batch, an expert no token was routed to), made
as ``tf.compile`` makes them for sm_90a and run with Triton's interpreter on: each returns its
outputs empty, of the program's shapes and dtypes, launching nothing — a row template, a
gathered row (cross-entropy's target), attention with no batch and with no queries, a GEMM
chain with no tokens, a scan, the floor's stages, a held row chain.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.empty_calls_check
"""
import json
import warnings

import torch

from benchmarks.scan_kernels import cumulative_sum
from tensorfuse.kernels.attention import causal_attention
from tensorfuse.kernels.ffn import ffn_swiglu
from tensorfuse.kernels.rows import cross_entropy, softmax
from tests.schedule_templates.staged_floor import group_norm_nested, interpreted
from tests.schedule_templates.user_written_extra_check import above_mean_sum


def _bf16(*shape):
    return torch.randn(*shape).bfloat16()


CASES = {
    "softmax": (softmax, lambda: dict(x=_bf16(0, 300))),
    "cross_entropy": (cross_entropy, lambda: dict(logits=_bf16(0, 1000),
                                                   target=torch.zeros(0, dtype=torch.int32))),
    "attention_no_batch": (causal_attention, lambda: dict(
        q=_bf16(0, 2, 64, 32), k=_bf16(0, 2, 64, 32), v=_bf16(0, 2, 64, 32), scale=0.2)),
    "attention_no_queries": (causal_attention, lambda: dict(
        q=_bf16(1, 2, 0, 32), k=_bf16(1, 2, 64, 32), v=_bf16(1, 2, 64, 32), scale=0.2)),
    "ffn_no_tokens": (ffn_swiglu, lambda: dict(
        x=_bf16(0, 64), w1=_bf16(64, 96), w3=_bf16(64, 96), w2=_bf16(96, 64))),
    "cumulative_sum": (cumulative_sum, lambda: dict(x=_bf16(0, 500))),
    "group_norm_floor": (group_norm_nested, lambda: dict(x=_bf16(0, 3, 5, 67), eps=1e-5)),
    "above_mean_held": (above_mean_sum, lambda: dict(x=torch.randn(0, 700))),
}

if __name__ == "__main__":
    shapes = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (kernel, case) in CASES.items():
            out = interpreted(kernel)(**case())
            outs = out if isinstance(out, tuple) else (out,)
            shapes[name] = [[list(o.shape), str(o.dtype)] for o in outs]
    print(json.dumps(shapes))
