"""Attention written on tensors in other layouts than the library's ``[B, H, S, D]``, as users
write it (``[B, S, H, D]`` as transformers' projections give it: ``benchmarks.user_kernels``'
kernels; ``[S, B, H, D]`` as Megatron keeps it), and float64 references of the math as written
(einsum over the same layouts, never the project's lowering). Shared by the layout tests and their Triton-interpreter check:
    TRITON_INTERPRET=1 python -m tests.schedule_templates.permuted_layouts SEED
"""
from __future__ import annotations

import json
import os
import sys

import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels import softmax_attend
from benchmarks.user_kernels import (bshd_causal, bshd_gqa_causal,   # the suite's kernels
                                     gqa_causal_bshd_kernel)
from benchmarks.user_kernels import two_head_dims_causal as two_head_dims
from tests.helpers import poisoned_call


@tf.kernel
def sbhd_attention(q: T.Tensor["M", "B", "H", "D", "bf16"],
                   k: T.Tensor["N", "B", "H", "D", "bf16"],
                   v: T.Tensor["N", "B", "H", "D", "bf16"], scale: T.f32):
    i, b, h, j, d, e = T.axes("i b h j d e")
    s = T.sum(q[i, b, h, d] * k[j, b, h, d], over=d) * scale
    return softmax_attend(s, v[j, b, h, e], j)


@tf.kernel
def keys_innermost_causal(q: T.Tensor["B", "H", "M", "D", "bf16"],
                          k: T.Tensor["B", "H", "D", "N", "bf16"],
                          v: T.Tensor["B", "H", "N", "D", "bf16"], scale: T.f32):
    """Causal attention with k kept transposed, ``[B, H, D, N]`` (its keys innermost)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, d, j], over=d) * scale
    s = T.where(i + T.size("N") - T.size("M") >= j, s, -T.inf)
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def gqa_keys_innermost_causal(q: T.Tensor["B", "H", "M", "D", "bf16"],
                              k: T.Tensor["B", "HKV", "D", "N", "bf16"],
                              v: T.Tensor["B", "HKV", "N", "D", "bf16"], scale: T.f32):
    """Grouped heads over keys kept transposed."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = T.sum(q[b, h, i, d] * k[b, hk, d, j], over=d) * scale
    s = T.where(i + T.size("N") - T.size("M") >= j, s, -T.inf)
    return softmax_attend(s, v[b, hk, j, e], j)


@tf.kernel
def bshd_keys_innermost(q: T.Tensor["B", "M", "H", "D", "bf16"],
                        k: T.Tensor["B", "H", "D", "N", "bf16"],
                        v: T.Tensor["B", "N", "H", "D", "bf16"], scale: T.f32):
    """q and v on [B, S, H, D], k kept [B, H, D, N]: every tensor in a layout of its own."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, i, h, d] * k[b, h, d, j], over=d) * scale
    return softmax_attend(s, v[b, j, h, e], j)


def two_head_dims_case(generator, B=1, H=2, M=37, N=53, DQK=48, DV=32, width=3.0):
    """Inputs of ``two_head_dims`` (causal, q·k over DQK, p·v over DV: the suite's kernel) and the
    float64 reference of its output."""
    q, k = (torch.randn(B, H, n, DQK, generator=generator) * width for n in (M, N))
    v = torch.randn(B, H, N, DV, generator=generator) * width
    q, k, v = (x.bfloat16() for x in (q, k, v))
    s = q.double() @ k.double().transpose(-1, -2) * 0.2
    keep = torch.arange(M)[:, None] + N - M >= torch.arange(N)[None]
    want = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v.double()
    return {"q": q, "k": k, "v": v}, want


# name -> (kernel, q's axes, k's axes, output's axes as einsum letters — b batch, h head,
# i queries, j keys, d head dim; the library's layout is "bhid" / "bhjd" — and causal or not)
KERNELS = {"bshd_causal": (bshd_causal, "bihd", "bjhd", "bihd", True),
           "sbhd_attention": (sbhd_attention, "ibhd", "jbhd", "ibhd", False),
           "bshd_gqa_causal": (bshd_gqa_causal, "bihd", "bjhd", "bihd", True),
           "keys_innermost_causal": (keys_innermost_causal, "bhid", "bhdj", "bhid", True),
           "gqa_keys_innermost_causal": (gqa_keys_innermost_causal, "bhid", "bhdj", "bhid",
                                         True),
           "bshd_keys_innermost": (bshd_keys_innermost, "bihd", "bhdj", "bhid", False)}
# v's axes where they are not k's
V_AXES = {"keys_innermost_causal": "bhjd", "gqa_keys_innermost_causal": "bhjd",
          "bshd_keys_innermost": "bjhd"}


def inputs(name: str, B: int, H: int, HKV: int, M: int, N: int, D: int, generator,
           width: float = 1.0) -> dict:
    """Fresh random bf16 q, k, v in the kernel's layouts (× ``width``: large value ranges)."""
    _, q_axes, k_axes, _, _ = KERNELS[name]
    extent = {"b": B, "h": H, "i": M, "j": N, "d": D}
    q = torch.randn(*(extent[a] for a in q_axes), generator=generator) * width
    kv_extent = dict(extent, h=HKV)
    k, v = (torch.randn(*(kv_extent[a] for a in axes), generator=generator) * width
            for axes in (k_axes, V_AXES.get(name, k_axes)))
    return {"q": q.bfloat16(), "k": k.bfloat16(), "v": v.bfloat16()}


def reference(name: str, q, k, v, scale: float) -> torch.Tensor:
    """float64 softmax(q·kᵀ · scale [causal, bottom-right]) · v in the kernel's layouts."""
    _, q_axes, k_axes, out_axes, causal = KERNELS[name]
    v_axes = V_AXES.get(name, k_axes)
    q, k, v = (x.double().cpu() for x in (q, k, v))
    H, HKV = q.shape[q_axes.index("h")], k.shape[k_axes.index("h")]
    if HKV != H:   # each kv-head serves H / HKV consecutive query heads
        k, v = (x.repeat_interleave(H // HKV, dim=axes.index("h"))
                for x, axes in ((k, k_axes), (v, v_axes)))
    s = torch.einsum(f"{q_axes},{k_axes}->bhij", q, k) * scale
    M, N = s.shape[-2:]
    if causal:
        keep = torch.arange(M)[:, None] + N - M >= torch.arange(N)[None]
        s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum(f"bhij,{v_axes}->{out_axes}", torch.softmax(s, -1), v)


# the interpreter has no bfloat16 products: the suite's kernel in float32 for the backward check
bshd_gqa_causal_f32 = gqa_causal_bshd_kernel("f32")


def reference_gradients(name: str, q, k, v, scale: float, d_out) -> tuple:
    """float64 dq, dk, dv of :func:`reference` for the output's gradient ``d_out``."""
    exact = [x.detach().double().cpu().requires_grad_() for x in (q, k, v)]
    out = reference(name, *exact, scale)
    return torch.autograd.grad(out, exact, d_out.double().cpu())


def backward_errors(generator) -> list[float]:
    """The attention backward template's dq, dk, dv (from the log-sum-exp the forward writes)
    for ``bshd_gqa_causal`` against float64, on ragged sizes."""
    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.schedule_templates.attention_backward import (BackwardKnobs,
                                                                  plan_attention_backward)
    from tensorfuse.schedule_templates.attention_chain import with_logsumexp
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target
    from tensorfuse.targets.triton.attention_backward import AttentionBackwardKernels

    program = bshd_gqa_causal_f32.program
    _, fusion = choose(program, get_target("cuda"))
    plan = plan_attention_backward(program, fusion, dict(B=1, H=4, HKV=2, M=37, N=45, D=16))
    x = {n: t.float() for n, t in inputs("bshd_gqa_causal", 1, 4, 2, 37, 45, 16, generator,
                                          width=3.0).items()}
    d_out = torch.randn(1, 37, 4, 16, generator=generator)
    saving = ProgramKernel(with_logsumexp(program, fusion.names))
    out, lse = tf.compile(saving, target="llvm")(**x, scale=0.25)
    got = AttentionBackwardKernels(plan, BackwardKnobs(16, 16, 16, 16, merged=True))(
        x, {"scale": 0.25}, out, d_out, lse)
    want = reference_gradients("bshd_gqa_causal", *x.values(), 0.25, d_out)
    return [float((g.double() - w).abs().max() / w.abs().max()) for g, w in zip(got, want)]


def relative_error(out, want) -> float:
    return float((out.double().cpu() - want).abs().max() / want.abs().max())


if __name__ == "__main__":
    # the Triton attention template in Triton's interpreter, on small ragged sizes
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    generator = torch.Generator().manual_seed(int(sys.argv[1]))
    errors = {}
    for name, (kernel, *_) in KERNELS.items():
        HKV = 1 if "gqa" in name else 3
        x = inputs(name, 2, 3, HKV, 37, 53, 32, generator, width=4.0)
        sch = tf.schedule(kernel, "cuda:sm_90a").rolling_update("m", "l", "o", axis="j")
        sch.apply_template("attention", tile_m=16, tile_n=16)
        want = reference(name, **x, scale=0.2)
        (out,) = poisoned_call(sch.compile(), kernel.program, {**x, "scale": 0.2}, want)
        errors[name] = relative_error(out, want)
    errors["backward"] = max(backward_errors(generator))
    x, want = two_head_dims_case(generator)
    sch = tf.schedule(two_head_dims, "cuda:sm_90a").rolling_update("m", "l", "o", axis="j")
    sch.apply_template("attention", tile_m=16, tile_n=16)
    (out,) = poisoned_call(sch.compile(), two_head_dims.program, {**x, "scale": 0.2}, want)
    errors["two_head_dims"] = relative_error(out, want)
    print(json.dumps(errors))
