"""Attention with sinks as gpt-oss computes it (a score per head outside the keys that shares the
softmax and attends to nothing), on tensorfuse's sink kernel
(``tensorfuse.kernels.layers.attention_kernel(..., sinks=...)``, what the transformers integration
runs) against gpt-oss's own eager attention in transformers (what a model with sinks runs
there: SDPA and FlashAttention take no sinks) and against SDPA's kernels with their log-sum-exp
and the sinks' share applied after them, ``o · σ(lse − sink)`` (what a port by hand would do:
flash for the causal prefill and the decode over kv-heads repeated to the query heads, the
memory-efficient kernel with the window as a bias), all on the same tensors: a causal prefill, a
sliding-window prefill (a boolean mask of 128 keys), a decode step; for the causal prefill also
the Hopper template applied by hand (``tensorfuse hopper``: its epilogue adds the sinks' share).
Every result is checked against float64 first, on the first eight heads.

Training (``attention_sinks_train/<case>``): the forward and backward of the causal and the
sliding-window prefill — dq, dk, dv and the sinks' gradient — through autograd: tensorfuse's
kernel (its forward saving the log-sum-exp with the sinks' term, the attention backward
template), gpt-oss's eager code, and FlexAttention under torch.compile with its log-sum-exp
and the sinks' share applied after it (``o · σ(lse − sink)``, differentiable through the
log-sum-exp); the gradients checked against float64 on the first kv-head's group.

    python -m benchmarks.attention_sinks [--out DIR]
"""
from __future__ import annotations

import types

import torch

import tensorfuse as tf
from benchmarks.common import (FLEX, TENSORFUSE, TORCH_EAGER, checked_row, relative_error,
                               writing_main)
from tensorfuse.kernels.layers import attention_kernel

SDPA_WITH_LSE = "sdpa with log-sum-exp"
# gpt-oss-120b's attention: 64 query heads over 8 kv-heads of 64, windows of 128 keys
H, HKV, D, WINDOW = 64, 8, 64, 128
CASES = (("causal", 1, 4096, 4096), ("sliding_window", 1, 4096, 4096), ("decode", 8, 1, 4096))


def _want(q, k, v, sinks, keep, scale):
    """float64 output of the first eight heads (one kv-head's group)."""
    g = H // HKV
    s = q[:, :g].double() @ k[:, :1].double().transpose(-1, -2) * scale
    s = s.masked_fill(~keep, float("-inf"))
    B, _, M, _ = s.shape
    logits = torch.cat([s, sinks[:g].double().view(1, g, 1, 1).expand(B, g, M, 1)], -1)
    return torch.softmax(logits, -1)[..., :-1] @ v[:, :1].double()


def measure(rows: list, log=print) -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    for name, B, M, N in CASES:
        q = torch.randn(B, H, M, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        sinks = torch.randn(H, device="cuda", dtype=torch.bfloat16) * 2
        scale = D ** -0.5
        i, j = torch.arange(M, device="cuda")[:, None] + N - M, torch.arange(N, device="cuda")
        keep = (j <= i) & ((j > i - WINDOW) if name == "sliding_window" else True)
        masked = name == "sliding_window"
        kernel = attention_kernel("bf16", not masked, masked, False, "bf16")
        mask = keep.expand(B, 1, M, N)
        args = (q, k, v, mask, sinks) if masked else (q, k, v, sinks)
        out = torch.full((B, H, M, D), float("nan"), device="cuda", dtype=torch.bfloat16)
        ours = lambda: kernel(*args, scale=scale, out=out)   # noqa: E731
        module = types.SimpleNamespace(sinks=sinks, num_key_value_groups=H // HKV,
                                       training=False)
        additive = torch.zeros(B, 1, M, N, device="cuda", dtype=torch.bfloat16).masked_fill(
            ~keep, float("-inf"))
        theirs = lambda: eager_attention_forward(module, q, k, v, additive, scale)  # noqa: E731
        shape = f"B{B} H{H}/{HKV} M{M} N{N} D{D}"
        flops = 4 * B * H * M * N * D * (keep.float().mean().item())
        calls = {TENSORFUSE: ours, TORCH_EAGER: lambda: theirs()[0].transpose(1, 2),
                 SDPA_WITH_LSE: _sdpa_with_lse(q, k, v, sinks, additive, masked, M > 1, scale)}
        if name == "causal":   # the Hopper template applied by hand (tf.compile's once checked)
            by_hand = tf.schedule(kernel, "cuda:sm_90a").rolling_update(
                "m", "o", "l", axis="j").apply_template("hopper_attention").compile()
            calls[f"{TENSORFUSE} hopper"] = lambda: by_hand(*args, scale=scale, out=out)
        want = _want(q, k, v, sinks, keep, scale)
        for label, call in calls.items():
            row = checked_row(f"attention_sinks/{name}", shape, label, call,
                              lambda got: relative_error(got[:, :H // HKV], want), flops, log,
                              poison=lambda: out.fill_(float("nan")))
            rows.extend([row] if row else [])


def measure_training(rows: list, log=print) -> None:
    """The ``attention_sinks_train`` rows (module docstring)."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    from benchmarks.attention import compiled_flex

    flex = compiled_flex()
    for name, B, M, N in CASES[:2]:
        q = torch.randn(B, H, M, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        sinks = torch.randn(H, device="cuda", dtype=torch.bfloat16) * 2
        leaves = [t.requires_grad_() for t in (q, k, v, sinks)]
        dout = torch.randn(B, H, M, D, device="cuda", dtype=torch.bfloat16)
        scale, masked = D ** -0.5, name == "sliding_window"
        i, j = torch.arange(M, device="cuda")[:, None] + N - M, torch.arange(N, device="cuda")
        keep = (j <= i) & ((j > i - WINDOW) if masked else True)
        kernel = attention_kernel("bf16", not masked, masked, False, "bf16")
        args = (q, k, v, keep.expand(B, 1, M, N), sinks) if masked else (q, k, v, sinks)
        module = types.SimpleNamespace(sinks=sinks, num_key_value_groups=H // HKV,
                                       training=True)
        additive = torch.zeros(B, 1, M, N, device="cuda", dtype=torch.bfloat16).masked_fill(
            ~keep, float("-inf"))
        forwards = {TENSORFUSE: lambda: kernel(*args, scale=scale),
                    TORCH_EAGER: lambda: eager_attention_forward(
                        module, q, k, v, additive, scale)[0].transpose(1, 2),
                    FLEX: _flex_with_lse(flex, q, k, v, sinks, masked, scale)}
        want = _float64_gradients(q, k, v, sinks, keep, scale, dout)
        flops = 3.5 * 4 * B * H * M * N * D * keep.float().mean().item()   # backward: 2.5×
        for label, forward in forwards.items():
            step = lambda f=forward: torch.autograd.grad(f(), leaves, dout)  # noqa: E731
            row = checked_row(f"attention_sinks_train/{name}", f"B{B} H{H}/{HKV} M{M} N{N} "
                              f"D{D}", label, step, lambda got: _gradient_error(got, want),
                              flops, log)
            rows.extend([row] if row else [])


def _flex_with_lse(flex, q, k, v, sinks, masked: bool, scale: float):
    """FlexAttention (causal, or the window, as a block mask) returning each row's log-sum-exp,
    then the sinks' share: differentiable through both."""
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask

    M, N = q.shape[2], k.shape[2]

    def keep(b, h, i, j):
        near = j <= i + N - M
        return near & (j > i + N - M - WINDOW) if masked else near
    block_mask = create_block_mask(keep, None, None, M, N, device="cuda")
    share = sinks.view(1, H, 1)

    def call():
        out, aux = flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True,
                        return_aux=AuxRequest(lse=True))
        return out * torch.sigmoid(aux.lse - share.float()).unsqueeze(-1).to(out.dtype)
    return call


def _float64_gradients(q, k, v, sinks, keep, scale: float, dout) -> list:
    """float64 gradients of the first kv-head's group (its query heads' dq and sinks, its dk and
    dv), the sinks appended to each row's logits as gpt-oss writes it."""
    g = H // HKV
    exact = [t.detach()[:, :g].double().requires_grad_() for t in (q, k[:, :1], v[:, :1])]
    sink = sinks.detach()[:g].double().requires_grad_()
    s = exact[0] @ exact[1].transpose(-1, -2) * scale
    s = s.masked_fill(~keep, float("-inf"))
    B, _, M, _ = s.shape
    logits = torch.cat([s, sink.view(1, g, 1, 1).expand(B, g, M, 1)], -1)
    out = torch.softmax(logits, -1)[..., :-1] @ exact[2]
    return torch.autograd.grad(out, (*exact, sink), dout[:, :g].double())


def _gradient_error(got, want) -> float:
    """The worst of dq's, dk's, dv's and d sinks' ‖g − g₆₄‖ / ‖g₆₄‖ on the first kv-head's group
    (relative norms, as the training tests compare gradients)."""
    g = H // HKV
    parts = (got[0][:, :g], got[1][:, :1], got[2][:, :1], got[3][:g])
    return max(float((a.double() - b).norm() / b.norm()) for a, b in zip(parts, want))


def _sdpa_with_lse(q, k, v, sinks, additive, masked: bool, causal: bool, scale: float):
    """SDPA's kernel returning each row's log-sum-exp, then the sinks' share of the softmax:
    ``o · L / (L + e^sink) = o · σ(lse − sink)``."""
    group = H // HKV
    ke, ve = (t.repeat_interleave(group, 1) for t in (k, v))   # the aten kernels want equal heads
    share = sinks.float().view(1, H, 1)

    def call():
        if masked:
            out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
                q, ke, ve, additive.expand(q.shape[0], H, -1, -1), True, scale=scale)[:2]
        else:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
                q, ke, ve, 0.0, causal, False, scale=scale)[:2]
        return out * torch.sigmoid(lse[..., :q.shape[2]] - share).unsqueeze(-1).to(out.dtype)
    return call


def measure_all(rows: list, log=print) -> None:
    measure(rows, log)
    measure_training(rows, log)


def main(argv=None) -> int:
    return writing_main(measure_all, "attention-sinks", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
