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


def _group64(q, k, v, sinks, keep, scale: float):
    """The first kv-head's group (its eight query heads) in float64, ``(q, k, v, sinks)`` as new
    leaves, and its output, the sinks appended to each row's logits as gpt-oss writes it."""
    g = H // HKV
    leaves = [t.detach()[:, :g].double().requires_grad_() for t in (q, k[:, :1], v[:, :1])]
    leaves.append(sinks.detach()[:g].double().requires_grad_())
    s = (leaves[0] @ leaves[1].transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
    B, _, M, _ = s.shape
    logits = torch.cat([s, leaves[3].view(1, g, 1, 1).expand(B, g, M, 1)], -1)
    return leaves, torch.softmax(logits, -1)[..., :-1] @ leaves[2]


def _case(name: str, B: int, M: int, N: int, training: bool) -> types.SimpleNamespace:
    """A case's tensors (bf16, random), its keys kept (causal from the bottom right, a window
    of ``WINDOW`` keys for the sliding one), tensorfuse's kernel and arguments, and what gpt-oss's
    eager attention takes (its module's sinks, the mask as an additive one)."""
    q = torch.randn(B, H, M, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    sinks = torch.randn(H, device="cuda", dtype=torch.bfloat16) * 2
    masked = name == "sliding_window"
    i, j = torch.arange(M, device="cuda")[:, None] + N - M, torch.arange(N, device="cuda")
    keep = (j <= i) & ((j > i - WINDOW) if masked else True)
    kernel = attention_kernel("bf16", not masked, masked, False, "bf16")
    args = (q, k, v, keep.expand(B, 1, M, N), sinks) if masked else (q, k, v, sinks)
    module = types.SimpleNamespace(sinks=sinks, num_key_value_groups=H // HKV,
                                   training=training)
    additive = torch.zeros(B, 1, M, N, device="cuda", dtype=torch.bfloat16).masked_fill(
        ~keep, float("-inf"))
    return types.SimpleNamespace(q=q, k=k, v=v, sinks=sinks, masked=masked, keep=keep,
                                 kernel=kernel, args=args, module=module, additive=additive,
                                 scale=D ** -0.5, shape=f"B{B} H{H}/{HKV} M{M} N{N} D{D}",
                                 density=keep.float().mean().item())


def measure(rows: list, log=print) -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    for name, B, M, N in CASES:
        c = _case(name, B, M, N, training=False)
        q, k, v, sinks, args, scale = c.q, c.k, c.v, c.sinks, c.args, c.scale
        out = torch.full((B, H, M, D), float("nan"), device="cuda", dtype=torch.bfloat16)
        ours = lambda: c.kernel(*args, scale=scale, out=out)   # noqa: E731
        theirs = lambda: eager_attention_forward(  # noqa: E731
            c.module, q, k, v, c.additive, scale)
        flops = 4 * B * H * M * N * D * c.density
        calls = {TENSORFUSE: ours, TORCH_EAGER: lambda: theirs()[0].transpose(1, 2),
                 SDPA_WITH_LSE: _sdpa_with_lse(q, k, v, sinks, c.additive, c.masked, M > 1,
                                               scale)}
        if name == "causal":   # the Hopper template applied by hand (tf.compile's once checked)
            by_hand = tf.schedule(c.kernel, "cuda:sm_90a").rolling_update(
                "m", "o", "l", axis="j").apply_template("hopper_attention").compile()
            calls[f"{TENSORFUSE} hopper"] = lambda: by_hand(*args, scale=scale, out=out)
        with torch.no_grad():
            want = _group64(q, k, v, sinks, c.keep, scale)[1]
        for label, call in calls.items():
            row = checked_row(f"attention_sinks/{name}", c.shape, label, call,
                              lambda got: relative_error(got[:, :H // HKV], want), flops, log,
                              poison=lambda: out.fill_(float("nan")))
            rows.extend([row] if row else [])


def measure_training(rows: list, log=print) -> None:
    """The ``attention_sinks_train`` rows (module docstring)."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    from benchmarks.attention import compiled_flex

    flex = compiled_flex()
    for name, B, M, N in CASES[:2]:
        c = _case(name, B, M, N, training=True)
        q, k, v, sinks, scale = c.q, c.k, c.v, c.sinks, c.scale
        leaves = [t.requires_grad_() for t in (q, k, v, sinks)]
        dout = torch.randn(B, H, M, D, device="cuda", dtype=torch.bfloat16)
        forwards = {TENSORFUSE: lambda: c.kernel(*c.args, scale=scale),
                    TORCH_EAGER: lambda: eager_attention_forward(
                        c.module, q, k, v, c.additive, scale)[0].transpose(1, 2),
                    FLEX: _flex_with_lse(flex, q, k, v, sinks, c.masked, scale)}
        exact, out = _group64(q, k, v, sinks, c.keep, scale)
        want = torch.autograd.grad(out, exact, dout[:, :H // HKV].double())
        flops = 3.5 * 4 * B * H * M * N * D * c.density   # the backward: 2.5 forwards
        for label, forward in forwards.items():
            step = lambda f=forward: torch.autograd.grad(f(), leaves, dout)  # noqa: E731
            row = checked_row(f"attention_sinks_train/{name}", c.shape, label, step,
                              lambda got: _gradient_error(got, want), flops, log)
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
