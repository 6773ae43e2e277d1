"""The model variants' kernels of :mod:`benchmarks.variant_kernels` at small, ragged sizes with
their float64 references: shared by ``test_variant_kernels`` and its check under Triton's
interpreter (``python -m tests.schedule_templates.variant_kernels_check SEED`` with
``TRITON_INTERPRET=1``)."""
import torch

from benchmarks.variant_kernels import (ce_ignore_index, diff_attention, dice, dice_rows,
                                        diff_reference, ignoring_ce, int8_kv_decode,
                                        int8_kv_dequantised, int8_kv_inputs, label_smoothed_ce,
                                        retention_causal, retention_reference, smoothed_ce,
                                        targets)
from tests.helpers import poisoned_main, templated


def int8_kv_case(generator, B=2, H=8, HKV=2, N=300, D=64):
    q, k, ks, v, vs = int8_kv_inputs(generator, B, H, HKV, N, D)
    scale = D ** -0.5
    return dict(q=q, k=k, ks=ks, v=v, vs=vs, scale=scale), \
        int8_kv_dequantised(q, k, ks, v, vs, scale)


def diff_case(generator, B=1, H=2, S=150, D=32, E=64):
    q1, k1, q2, k2 = (torch.randn(B, H, S, D, generator=generator).to(torch.bfloat16)
                      for _ in range(4))
    v = torch.randn(B, H, S, E, generator=generator).to(torch.bfloat16)
    return dict(q1=q1, k1=k1, q2=q2, k2=k2, v=v, lam=0.6, scale=D ** -0.5), \
        diff_reference(q1, k1, q2, k2, v, 0.6, D ** -0.5, torch.arange(S))


def retention_case(generator, B=1, H=2, S=150, D=32):
    q, k, v = ((torch.randn(B, H, S, D, generator=generator) / 2).to(torch.bfloat16)
               for _ in range(3))
    gamma = torch.tensor([0.97, 0.8])
    return dict(q=q, k=k, v=v, gamma=gamma), retention_reference(q, k, v, gamma, torch.arange(S))


def smoothed_case(generator, M=37, V=3000):
    x = (torch.randn(M, V, generator=generator) * 4 + 20).to(torch.bfloat16)
    t = targets(generator, M, V)
    return dict(x=x, t=t, eps=0.1), smoothed_ce(x.double(), t, 0.1)


def ignore_case(generator, M=37, V=3000):
    x = (torch.randn(M, V, generator=generator) * 4).to(torch.bfloat16)
    t = targets(generator, M, V, ignored=True)
    return dict(x=x, t=t), ignoring_ce(x.double(), t)


def dice_case(generator, M=37, N=3000):
    p = torch.rand(M, N, generator=generator).to(torch.bfloat16)
    t = (torch.rand(M, N, generator=generator) > 0.7).to(torch.bfloat16)
    return dict(p=p, t=t), dice(p.double(), t.double())


CASES = {"int8_kv_decode": (int8_kv_decode, int8_kv_case),
         "diff_attention": (diff_attention, diff_case),
         "retention_causal": (retention_causal, retention_case),
         "label_smoothed_ce": (label_smoothed_ce, smoothed_case),
         "ce_ignore_index": (ce_ignore_index, ignore_case),
         "dice_rows": (dice_rows, dice_case)}

if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: templated(kernel))
