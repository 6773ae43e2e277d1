"""Reductions across a strided axis and over several axes as users write them (the suite's
log-softmax over the channels of ``[B, C, P]``, layer norm over the channels of ``[B, D, S]``,
QK-norm over the head dim of ``[B, S, H, D]``, group norm over two axes at once) and their float64
references (torch, never the project's lowering):
shared by their tests and the check under Triton's interpreter
(``python -m tests.schedule_templates.strided_rows SEED`` with ``TRITON_INTERPRET=1``)."""
import torch

import tensorfuse as tf
from benchmarks.layout_kernels import group_norm_channels_last, group_norm_reference
from benchmarks.unlisted_kernels import strided_matvec as strided_gemv
from benchmarks.user_kernels import (channel_stats, group_norm, layernorm_channels,
                                     log_softmax_channels, qk_norm_bshd)
from tests.helpers import poisoned_main, templated


def log_softmax_case(generator, B=2, C=37, P=150, width=6.0):
    x = (torch.randn(B, C, P, generator=generator) * width).to(torch.bfloat16)
    return {"x": x}, torch.log_softmax(x.double(), 1)


def layernorm_case(generator, B=2, D=300, S=77, width=3.0):
    """D=300: swept in two blocks of 256, the second ragged."""
    x = (torch.randn(B, D, S, generator=generator) * width + width).to(torch.bfloat16)
    w = (torch.rand(D, generator=generator) + 0.5).to(torch.bfloat16)
    bias = torch.randn(D, generator=generator).to(torch.bfloat16)
    xd = x.double()
    mean = xd.mean(1, keepdim=True)
    var = ((xd - mean) ** 2).mean(1, keepdim=True)
    want = (xd - mean) / torch.sqrt(var + 1e-5) * w.double()[:, None] + bias.double()[:, None]
    return {"x": x, "w": w, "bias": bias, "eps": 1e-5}, want


def qk_norm_case(generator, B=2, S=19, H=3, D=64, width=3.0):
    x = (torch.randn(B, S, H, D, generator=generator) * width).to(torch.bfloat16)
    w = (torch.rand(D, generator=generator) + 0.5).to(torch.bfloat16)
    xd = x.double()
    want = xd * torch.rsqrt((xd * xd).mean(-1, keepdim=True) + 1e-6) * w.double()
    return {"x": x, "w": w, "eps": 1e-6}, want


def group_norm_case(generator, B=2, G=3, C=5, P=67, width=3.0):
    """C·P = 335: the flat axis swept in blocks, the last ragged."""
    x = (torch.randn(B, G, C, P, generator=generator) * width + width).to(torch.bfloat16)
    w = (torch.rand(G, C, generator=generator) + 0.5).to(torch.bfloat16)
    bias = torch.randn(G, C, generator=generator).to(torch.bfloat16)
    xd = x.double()
    mean = xd.mean((2, 3), keepdim=True)
    var = ((xd - mean) ** 2).mean((2, 3), keepdim=True)
    want = (xd - mean) / torch.sqrt(var + 1e-5) * w.double()[None, :, :, None] + \
        bias.double()[None, :, :, None]
    return {"x": x, "w": w, "bias": bias, "eps": 1e-5}, want


def group_norm_channels_last_case(generator, B=2, P=67, G=3, C=5, width=3.0):
    """P·C = 335 swept channels fastest, the last block ragged."""
    x = (torch.randn(B, P, G, C, generator=generator) * width + width).to(torch.bfloat16)
    w = (torch.rand(G, C, generator=generator) + 0.5).to(torch.bfloat16)
    bias = torch.randn(G, C, generator=generator).to(torch.bfloat16)
    return ({"x": x, "w": w, "bias": bias, "eps": 1e-5},
            group_norm_reference(x.double(), w.double(), bias.double(), 1e-5))


def channel_stats_case(generator, N=4096, C=40, width=3.0):
    """Two row tiles of 32 channels over 4096 rows: the sweep split into parts."""
    x = (torch.randn(N, C, generator=generator) * width + width).to(torch.bfloat16)
    var, mean = torch.var_mean(x.double(), 0, correction=0)
    return {"x": x}, (mean, var)


def strided_gemv_case(generator, K=1000, M=300, width=3.0):
    a = (torch.randn(K, M, generator=generator) * width).to(torch.bfloat16)
    x = torch.randn(K, generator=generator).to(torch.bfloat16)
    return {"a": a, "x": x}, a.double().t() @ x.double()


def weighed_in_parts(kernel):
    """``kernel`` on the row template with the knobs of a few row tiles weighed along their
    sweep (``row_reduction.WEIGHED_FEW_TILES``), in 4 parts: the sizes of a test are too small
    for the defaults to take them."""
    from tensorfuse.schedule_templates.row_reduction import WEIGHED_FEW_TILES

    rows, block, warps, stages = WEIGHED_FEW_TILES
    sch = tf.schedule(kernel, "cuda:sm_90a").rolling_update("out_sum", axis="k")
    return sch.apply_template("row_reduction", rows=rows, block=block, num_warps=warps,
                              num_stages=stages, splits=4).compile()


CASES = {"log_softmax_channels": (log_softmax_channels, log_softmax_case),
         "channel_stats": (channel_stats, channel_stats_case),
         "layernorm_channels": (layernorm_channels, layernorm_case),
         "qk_norm_bshd": (qk_norm_bshd, qk_norm_case),
         "group_norm": (group_norm, group_norm_case),
         "group_norm_channels_last": (group_norm_channels_last, group_norm_channels_last_case),
         "strided_gemv": (strided_gemv, strided_gemv_case)}
# run by the interpreter beside CASES: what a case's knobs are, by name
INTERPRETED = {**CASES, "strided_gemv_in_parts": (strided_gemv, strided_gemv_case)}


if __name__ == "__main__":
    poisoned_main(INTERPRETED, lambda name, kernel: weighed_in_parts(kernel)
                  if name == "strided_gemv_in_parts" else templated(kernel))
