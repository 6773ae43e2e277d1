"""Attention with sinks as gpt-oss computes it (a score per head outside the keys that shares the
softmax and attends to nothing), on tensorfuse's sink kernel
(``tensorfuse.kernels.layers.attention_kernel(..., sinks=...)``, what the transformers integration
runs) against gpt-oss's own eager attention in transformers (SDPA and FlashAttention have no
sinks), both on the same tensors: a causal prefill, a sliding-window prefill (a boolean mask of
128 keys), a decode step. Every tensorfuse result is checked against float64 first, on the
first eight heads.

    python -m benchmarks.attention_sinks [--out DIR]
"""
from __future__ import annotations

import argparse
import types

import torch

from benchmarks.common import TENSORFUSE, TORCH_EAGER, Row, bench, relative_error, run_and_write
from tensorfuse.kernels.layers import attention_kernel

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
        error = relative_error(ours()[:, :H // HKV], _want(q, k, v, sinks, keep, scale))
        module = types.SimpleNamespace(sinks=sinks, num_key_value_groups=H // HKV,
                                       training=False)
        additive = torch.zeros(B, 1, M, N, device="cuda", dtype=torch.bfloat16).masked_fill(
            ~keep, float("-inf"))
        theirs = lambda: eager_attention_forward(module, q, k, v, additive, scale)  # noqa: E731
        shape = f"B{B} H{H}/{HKV} M{M} N{N} D{D}"
        flops = 4 * B * H * M * N * D * (keep.float().mean().item())
        for label, call in ((TENSORFUSE, ours), (TORCH_EAGER, theirs)):
            if label == TENSORFUSE and error > 2e-2:
                log(f"{shape} {name}: WRONG (error {error:.1e}); not timed")
                continue
            ms = bench(call)
            rows.append(Row(f"attention_sinks/{name}", shape, label, ms, flops / ms / 1e9, 0.0,
                            0.0, f"err {error:.1e}" if label == TENSORFUSE else ""))
            log(f"{shape} {name} {label}: {ms:.3f} ms")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    run_and_write(measure, args.out, "attention-sinks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
