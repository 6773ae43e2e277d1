"""The serving kernels of :mod:`benchmarks.serving_kernels` at small, ragged sizes with their
float64 references: shared by ``test_serving_kernels`` and its check under Triton's interpreter
(``python -m tests.schedule_templates.serving_kernels_check SEED`` with ``TRITON_INTERPRET=1``)."""
import functools

import torch

from benchmarks.attention import reference
from benchmarks.serving_kernels import (absmax_quant, add_rmsnorm, added_rmsnorm, causal,
                                        packed_qkv_causal, quantised, rope_angles,
                                        rope_attention, rope_attention_bf16_tables, rotated,
                                        speculative_decode)
from tests.helpers import poisoned_main, templated


def packed_case(generator, B=1, S=150, H=2, D=32):
    qkv = torch.randn(B, S, 3, H, D, generator=generator).to(torch.bfloat16)
    views = [qkv[:, :, n].transpose(1, 2) for n in range(3)]
    want = reference(*views, D ** -0.5, None, causal).transpose(1, 2)
    return dict(qkv=qkv, scale=D ** -0.5), want


def speculative_case(generator, B=2, H=8, HKV=2, M=3, N=300, D=64):
    q = torch.randn(B, H, M, D, generator=generator).to(torch.bfloat16)
    k, v = (torch.randn(B, HKV, N, D, generator=generator).to(torch.bfloat16) for _ in range(2))
    return dict(q=q, k=k, v=v, scale=D ** -0.5), reference(q, k, v, D ** -0.5, None, causal)


def rope_case(generator, B=1, H=2, S=150, D=32, tables=torch.float32):
    q, k, v = (torch.randn(B, H, S, D, generator=generator).to(torch.bfloat16) for _ in range(3))
    cos, sin = (t.to(tables) for t in rope_angles(S, D))
    want = reference(rotated(q.double(), cos.double(), sin.double()),
                     rotated(k.double(), cos.double(), sin.double()), v, D ** -0.5, None, causal)
    return dict(q=q, k=k, v=v, cos=cos, sin=sin, scale=D ** -0.5), want


def add_rmsnorm_case(generator, M=37, D=300):
    x, r = ((torch.randn(M, D, generator=generator) * 3).to(torch.bfloat16) for _ in range(2))
    w = (torch.rand(D, generator=generator) + 0.5).to(torch.bfloat16)
    return dict(x=x, r=r, w=w, eps=1e-6), added_rmsnorm(x.double(), r.double(), w.double(), 1e-6)


def absmax_case(generator, M=37, K=300):
    x = (torch.randn(M, K, generator=generator) * 3).to(torch.bfloat16)
    x[0] = 0.0   # a row of zeros: its scale the floor, its values 0
    q, s = quantised(x.double())
    return dict(x=x), (q.double(), s)


CASES = {"packed_qkv_causal": (packed_qkv_causal, packed_case),
         "speculative_decode": (speculative_decode, speculative_case),
         "rope_attention": (rope_attention, rope_case),
         "rope_attention_bf16_tables": (rope_attention_bf16_tables,
                                        functools.partial(rope_case, tables=torch.bfloat16)),
         "add_rmsnorm": (add_rmsnorm, add_rmsnorm_case),
         "absmax_quant": (absmax_quant, absmax_case)}

if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["round"]:   # T.round of the halves (test_serving_kernels), as JSON
        import json

        from tests.schedule_templates.test_serving_kernels import _halves, _rounded_scaled
        print(json.dumps(templated(_rounded_scaled)(x=_halves()).tolist()))
    elif sys.argv[1:2] == ["parts"]:   # rotated q in bf16 parts (test_operand_stages), JSON
        import json

        from tests.schedule_templates.test_operand_stages import operand_parts
        import tensorfuse as tf

        made = lambda k: tf.compile(k, target="cuda:sm_90a")   # noqa: E731 - elementwise: Triton
        print(json.dumps(operand_parts(int(sys.argv[2]), made)))
    elif sys.argv[1:] == ["pow"]:   # a ** b of every pair (test_serving_kernels), as JSON
        import json

        from tests.schedule_templates.test_serving_kernels import _bases_and_exponents, _powers
        x, y = _bases_and_exponents()
        print(json.dumps(templated(_powers)(x=x, y=y).tolist()))
    else:
        poisoned_main(CASES, lambda name, kernel: templated(kernel))
