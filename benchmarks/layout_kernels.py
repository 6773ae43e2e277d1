"""Kernels called with tensors in another axis order than their programs declare, as users pass
them: a channels-last activation to a kernel written over ``[B, C, P]``, a weight kept ``[K, N]``
to a projection written over ``w[N, K]`` (``w.t()``), keys kept ``[B, H, S, D]`` to an attention
written over ``kt[B, H, D, S]``. tensorfuse runs the program in the tensors' memory order on the
views as they lie (``tensorfuse.memory_order``); the row ``tensorfuse (copied contiguous)`` is
the same kernel on a contiguous copy made in the timed call, as every such call ran before.
And a group norm written over the channels-last ``[B, P, G, C]`` a user keeps, reduced over
``(c, p)`` as written (swept with the contiguous channels fastest, not the pixels).
Alternatives on the same views: torch.compile and eager, cuBLAS (``x @ w.t()``), SDPA.

    python -m benchmarks.layout_kernels [--only NAMES] [--out DIR]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.common import CUBLAS, SDPA, TENSORFUSE, TORCH_COMPILE, TORCH_EAGER
from benchmarks.gemm import matmul_nk
from benchmarks.kernel_suite import Case, Recorded, main
from benchmarks.unlisted_kernels import attention_keys_transposed
from benchmarks.user_kernels import group_norm, layernorm_channels, log_softmax_channels

COPIED = f"{TENSORFUSE} (copied contiguous)"


def _origin(f, args: tuple, **sizes) -> str:
    """What runs ``f`` on these arguments: the program in their memory order where the call
    routes there, else the program as written on a copy."""
    routes = f.routes
    orders = routes.orders(args, {})
    if orders is not None and routes.taken(orders, sizes):
        return routes.kernel_for(orders).schedule_origin(**sizes)
    return f"copied contiguous: {f.schedule_origin(**sizes)}"


def _log_softmax_case(generator, B=8, C=150, P=65536) -> Case:
    """Per-pixel class log-probabilities of a channels-last segmentation map."""
    x = (torch.randn(B, P, C, generator=generator) * 4).to("cuda", torch.bfloat16)
    view = x.permute(0, 2, 1)                    # [B, C, P] as the kernel declares it
    f, copied = Recorded(log_softmax_channels), Recorded(log_softmax_channels)

    def eager(t):
        return torch.log_softmax(t.float(), 1).to(t.dtype)
    compiled = torch.compile(eager)
    rows = torch.arange(0, P, 97, device="cuda")
    ref = torch.log_softmax(view[:, :, rows].double(), 1)
    return Case("log_softmax_channels_last", f"B{B} C{C} P{P} (over C; x channels last)",
                lambda: f(view), {COPIED: lambda: copied(view.contiguous()),
                                  TORCH_COMPILE: lambda: compiled(view),
                                  TORCH_EAGER: lambda: eager(view)},
                ref, lambda out: out[:, :, rows], bytes=2 * x.numel() * x.element_size(),
                notes={TENSORFUSE: _origin(f, (view,), B=B, C=C, P=P)})


def _layer_norm_case(generator, B=8, D=1024, S=4096) -> Case:
    """Layer norm over the channels of a 1-D convolution's activations kept [B, S, D]."""
    x = (torch.randn(B, S, D, generator=generator) * 2 + 1).to("cuda", torch.bfloat16)
    w = torch.randn(D, generator=generator).to("cuda", torch.bfloat16)
    bias = torch.randn(D, generator=generator).to("cuda", torch.bfloat16)
    view = x.permute(0, 2, 1)                    # [B, D, S]
    f, copied = Recorded(layernorm_channels), Recorded(layernorm_channels)

    def eager(t, g, b):
        return F.layer_norm(t.transpose(1, 2).float(), (D,), g.float(), b.float(),
                            1e-5).transpose(1, 2).to(t.dtype)
    compiled = torch.compile(eager)
    rows = torch.arange(0, S, 31, device="cuda")
    ref = eager(view[:, :, rows].double(), w.double(), bias.double())
    return Case("layernorm_channels_last", f"B{B} D{D} S{S} (over D; x channels last)",
                lambda: f(view, w, bias, 1e-5),
                {COPIED: lambda: copied(view.contiguous(), w, bias, 1e-5),
                 TORCH_COMPILE: lambda: compiled(view, w, bias),
                 TORCH_EAGER: lambda: eager(view, w, bias)},
                ref, lambda out: out[:, :, rows], bytes=2 * x.numel() * x.element_size(),
                notes={TENSORFUSE: _origin(f, (view, w, bias), B=B, D=D, S=S)})


def _projection_case(generator, M=8192, K=4096, N=4096) -> Case:
    """``x @ w.t()`` with the weight kept [K, N]: cuBLAS reads either layout."""
    x = torch.randn(M, K, generator=generator).to("cuda", torch.bfloat16)
    wt = (torch.randn(K, N, generator=generator) / K ** 0.5).to("cuda", torch.bfloat16)
    w = wt.t()                                   # [N, K] as the kernel declares it
    f, copied = Recorded(matmul_nk), Recorded(matmul_nk)
    rows = torch.arange(0, M, 61, device="cuda")
    ref = x[rows].double() @ wt.double()
    return Case("projection_weight_transposed", f"M{M} K{K} N{N} (w kept [K, N])",
                lambda: f(x, w), {COPIED: lambda: copied(x, w.contiguous()),
                                  CUBLAS: lambda: x @ w.t()},
                ref, lambda out: out[rows], flops=2 * M * K * N,
                notes={TENSORFUSE: _origin(f, (x, w), M=M, K=K, N=N)})


def _keys_case(generator, B=2, H=16, S=4096, D=128) -> Case:
    """Causal attention written over transposed keys ``kt[B, H, D, S]``, called with the keys
    kept [B, H, S, D] (``k.transpose(-1, -2)``)."""
    q, k, v = (torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
               for _ in range(3))
    scale = D ** -0.5
    f, copied = Recorded(attention_keys_transposed), Recorded(attention_keys_transposed)
    rows = torch.cat([torch.arange(64), torch.arange(S - 64, S)]).cuda()
    s = q[:, :, rows].double() @ k.double().transpose(-1, -2) * scale
    s = s.masked_fill(rows[:, None] < torch.arange(S, device="cuda")[None], float("-inf"))
    ref = torch.softmax(s, -1) @ v.double()
    kt = k.transpose(-1, -2)
    return Case("attention_keys_passed_transposed", f"B{B} H{H} S{S} D{D} causal",
                lambda: f(q, kt, v, scale=scale),
                {COPIED: lambda: copied(q, kt.contiguous(), v, scale=scale),
                 SDPA: lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                              scale=scale)},
                ref, lambda out: out[:, :, rows], flops=2 * B * H * S * S * D,
                notes={TENSORFUSE: _origin(f, (q, kt, v), B=B, H=H, S=S, D=D)})


@tf.kernel
def group_norm_channels_last(x: T.Tensor["B", "P", "G", "C", "bf16"], w: T.Tensor["G", "C", "bf16"],
                             bias: T.Tensor["G", "C", "bf16"], eps: T.f32):
    """Group norm written over the channels-last activations a user keeps, ``[B, H·W, C]`` seen
    as ``[B, P, G, C/G]``: over a group's channels and the pixels at once, written in that order
    (the channels are the contiguous ones: swept fastest)."""
    b, p, g, c = T.axes("b p g c")
    n = T.size("C") * T.size("P")
    mean = T.sum(x[b, p, g, c], over=(c, p)) / n
    var = T.sum((x[b, p, g, c] - mean) * (x[b, p, g, c] - mean), over=(c, p)) / n
    return T.cast((x[b, p, g, c] - mean) * T.rsqrt(var + eps) * w[g, c] + bias[g, c], "bf16")


def group_norm_reference(x, w, bias, eps):
    """torch's group norm of ``x[B, P, G, C]`` in ``x``'s dtype (float64 for a reference), on
    the channels-last view ``[B, G·C, P]`` of the same memory, as a model's activations lie."""
    B, P, G, C = x.shape
    y = F.group_norm(x.reshape(B, P, G * C).transpose(1, 2), G, w.reshape(-1), bias.reshape(-1),
                     eps)
    return y.transpose(1, 2).reshape(B, P, G, C)


def _group_norm_inputs(generator, B, P, G, C):
    """Channels-last activations ``x[B, P, G, C]`` (bf16, on the GPU), weights and biases."""
    x = (torch.randn(B, P, G, C, generator=generator) * 2 + 1).to("cuda", torch.bfloat16)
    w = (torch.rand(G, C, generator=generator) + 0.5).to("cuda", torch.bfloat16)
    bias = torch.randn(G, C, generator=generator).to("cuda", torch.bfloat16)
    return x, w, bias


def _group_norm_case(generator, B=16, P=4096, G=32, C=16) -> Case:
    """A diffusion U-Net's group norm (512 channels in 32 groups, 64×64 pixels) on activations
    kept channels last; torch.compile and eager on the same memory."""
    x, w, bias = _group_norm_inputs(generator, B, P, G, C)
    f = Recorded(group_norm_channels_last)
    compiled = torch.compile(group_norm_reference)
    ref = group_norm_reference(x.double(), w.double(), bias.double(), 1e-5)
    return Case("group_norm_channels_last", f"B{B} P{P} G{G} C{C} (x [B, P, G, C])",
                lambda: f(x, w, bias, 1e-5),
                {TORCH_COMPILE: lambda: compiled(x, w, bias, 1e-5),
                 TORCH_EAGER: lambda: group_norm_reference(x, w, bias, 1e-5)},
                ref, lambda out: out, bytes=2 * x.numel() * x.element_size(),
                notes={TENSORFUSE: f.schedule_origin(B=B, P=P, G=G, C=C)})


def _group_norm_view_case(generator, B=16, G=32, C=16, P=4096) -> Case:
    """The suite's group norm, written over [B, G, C/G, P], called with the channels-last
    activations of ``_group_norm_case`` seen in that order."""
    x, w, bias = _group_norm_inputs(generator, B, P, G, C)
    view = x.permute(0, 2, 3, 1)                 # [B, G, C, P]
    f, copied = Recorded(group_norm), Recorded(group_norm)
    compiled = torch.compile(group_norm_reference)
    ref = group_norm_reference(x.double(), w.double(), bias.double(), 1e-5).permute(0, 2, 3, 1)

    def seen(out):   # torch's result on the channels-last memory, seen as [B, G, C, P]
        return out.permute(0, 2, 3, 1)
    return Case("group_norm_passed_channels_last", f"B{B} G{G} C{C} P{P} (x channels last)",
                lambda: f(view, w, bias, 1e-5),
                {COPIED: lambda: copied(view.contiguous(), w, bias, 1e-5),
                 TORCH_COMPILE: lambda: seen(compiled(x, w, bias, 1e-5)),
                 TORCH_EAGER: lambda: seen(group_norm_reference(x, w, bias, 1e-5))},
                ref, lambda out: out, bytes=2 * x.numel() * x.element_size(),
                notes={TENSORFUSE: _origin(f, (view, w, bias, 1e-5), B=B, G=G, C=C, P=P)})


LAYOUTS = {"log_softmax_channels_last": _log_softmax_case,
           "layernorm_channels_last": _layer_norm_case,
           "projection_weight_transposed": _projection_case,
           "attention_keys_passed_transposed": _keys_case,
           "group_norm_channels_last": _group_norm_case,
           "group_norm_passed_channels_last": _group_norm_view_case}

if __name__ == "__main__":
    main(LAYOUTS, "layout-kernels", __doc__)
