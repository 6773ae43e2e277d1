"""Calls at the edges, made as ``tf.compile`` makes them for sm_90a and run with Triton's
interpreter on. Calls whose every output is empty (an empty batch, an expert no token was routed
to): each returns its outputs empty, of the program's shapes and dtypes, launching nothing — a
row template, a gathered row (cross-entropy's target), attention with no batch and with no
queries, a GEMM chain with no tokens, a scan, the floor's stages, a held row chain. Calls whose
``out=`` is an argument (a GEMM's input, a softmax in place, attention into its queries): each
output's error against float64.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.call_edges_check SEED
"""
import json
import sys
import warnings

import torch

from benchmarks.scan_kernels import cumulative_sum
from tensorfuse.kernels.attention import causal_attention
from tensorfuse.kernels.ffn import ffn_swiglu
from tensorfuse.kernels.gemm import matmul
from tensorfuse.kernels.rows import cross_entropy, softmax
from tests.helpers import relative_error
from tests.schedule_templates.staged_floor import group_norm_nested, interpreted
from tests.schedule_templates.user_written_extra_check import above_mean_sum


def _bf16(*shape):
    return torch.randn(*shape).bfloat16()


EMPTY = {
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



def _into_an_argument(generator) -> dict:
    """Each aliased call's error against float64 (computed before the call overwrites its
    input)."""
    def bf16(*shape):
        return (torch.randn(*shape, generator=generator) * 2).bfloat16()

    x, w = bf16(200, 256), bf16(256, 256)
    want = x.double() @ w.double()
    errors = {"matmul_into_x": relative_error(interpreted(matmul)(x, w, out=x), want)}
    x = bf16(37, 1000)
    want = torch.softmax(x.double(), -1)
    errors["softmax_in_place"] = relative_error(interpreted(softmax)(x, out=x), want)
    q, k, v = bf16(1, 2, 130, 32), bf16(1, 2, 130, 32), bf16(1, 2, 130, 32)
    s = (q.double() @ k.double().transpose(-1, -2)) * 0.2
    s = s.masked_fill(torch.ones(130, 130).triu(1).bool(), float("-inf"))
    want = torch.softmax(s, -1) @ v.double()
    errors["attention_into_q"] = relative_error(
        interpreted(causal_attention)(q, k, v, 0.2, out=q), want)
    return errors


if __name__ == "__main__":
    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (kernel, case) in EMPTY.items():
            out = interpreted(kernel)(**case())
            outs = out if isinstance(out, tuple) else (out,)
            found[name] = [[list(o.shape), str(o.dtype)] for o in outs]
        found.update(_into_an_argument(torch.Generator().manual_seed(int(sys.argv[1]))))
    print(json.dumps(found))
