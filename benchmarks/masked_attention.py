"""Attention under a boolean mask tensor, as the transformers integration runs it (what
``attn_implementation="tensorfuse"`` passes for padded batches and sliding-window layers):
``tensorfuse.kernels.layers.attention_kernel(masked=True)``, whose rows the mask empties whole
give 0 (``where(l > 0, o / l, 0)``), through ``tf.compile`` and on the attention (Triton)
template applied by hand (``tensorfuse triton``), against SDPA with the same boolean mask (its
default choice and cuDNN) and FlexAttention under torch.compile with a block mask made from the
same tensor. Llama-3-8B's heads (32 query heads over 8 kv-heads of 128), bf16:

- ``padded_causal``: B4 S4096, each sequence left-padded to a random length (≥ 1/4);
- ``sliding_window``: B1 S16384, causal within windows of 4096 keys (Mistral's layers).

Every result is checked against float64 first (the first kv-head's group of every batch).

    python -m benchmarks.masked_attention [--out DIR]
"""
from __future__ import annotations

import contextlib

import torch

import tensorfuse as tf
from benchmarks.attention import compiled_flex
from benchmarks.common import (FLEX, SDPA, SDPA_CUDNN, TENSORFUSE, checked_row, relative_error,
                               writing_main)
from tensorfuse.kernels.layers import attention_kernel

H, HKV, D = 32, 8, 128
CASES = (("padded_causal", 4, 4096, None), ("sliding_window", 1, 16384, 4096))


def _mask(name: str, B: int, S: int, window, generator) -> torch.Tensor:
    """``[B, 1, S, S]`` bool: keys a query may see (causal; left padding or a window)."""
    i, j = torch.arange(S)[:, None], torch.arange(S)
    keep = j <= i
    if window is not None:
        keep = keep & (j > i - window)
    keep = keep.expand(B, 1, S, S).clone()
    if name == "padded_causal":
        starts = torch.randint(0, 3 * S // 4, (B,), generator=generator)
        keep &= (j >= starts.view(B, 1, 1, 1))
    return keep


def _want(q, k, v, keep, scale):
    """float64 output of the first kv-head's query heads; 0 where a row sees no key."""
    g = H // HKV
    s = q[:, :g].double() @ k[:, :1].double().transpose(-1, -2) * scale
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v[:, :1].double()


def measure(rows: list, log=print) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask

    flex = compiled_flex()
    kernel = attention_kernel("bf16", False, True, False)
    compiled = tf.compile(kernel, "cuda")
    triton = tf.schedule(kernel, "cuda").rolling_update("m", "o", "l", axis="j") \
        .apply_template("attention").compile()
    g = torch.Generator().manual_seed(0)
    for name, B, S, window in CASES:
        q = torch.randn(B, H, S, D, generator=g).to(torch.bfloat16).cuda()
        k, v = (torch.randn(B, HKV, S, D, generator=g).to(torch.bfloat16).cuda()
                for _ in range(2))
        keep = _mask(name, B, S, window, g).cuda()
        scale = D ** -0.5
        out = torch.full((B, H, S, D), float("nan"), device="cuda", dtype=torch.bfloat16)
        shape = f"B{B} H{H}/{HKV} S{S} D{D}"
        sizes = dict(B=B, H=H, HKV=HKV, M=S, N=S, D=D)
        log(f"{shape} {name}: tf.compile takes {compiled.schedule_origin(**sizes)}")
        seen = keep[:, 0]
        block = create_block_mask(lambda b, h, qi, kv: seen[b, qi, kv], B, None, S, S,
                                  device="cuda")

        def sdpa(backend=None):
            def call():
                with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                    return torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, keep, scale=scale, enable_gqa=True)
            return call
        calls = {TENSORFUSE: lambda: compiled(q, k, v, keep, scale=scale, out=out),
                 f"{TENSORFUSE} triton": lambda: triton(q, k, v, keep, scale=scale, out=out),
                 SDPA: sdpa(), SDPA_CUDNN: sdpa(SDPBackend.CUDNN_ATTENTION),
                 FLEX: lambda: flex(q, k, v, block_mask=block, scale=scale, enable_gqa=True)}
        flops = 4 * H * D * keep.sum().item()    # keep: [B, 1, S, S]
        want = _want(q, k, v, keep, scale)
        # rows the mask empties: tensorfuse must give 0 (the kernel writes where(l > 0, …, 0));
        # SDPA's kernels and Flex give NaN or the values' mean there, so they are checked on
        # the other rows
        seen_any = keep.any(-1, keepdim=True)
        for label, call in calls.items():
            ours = label.startswith(TENSORFUSE)
            row = checked_row(
                f"masked_attention/{name}", shape, label, call,
                lambda got, ours=ours: relative_error(
                    got[:, :H // HKV] if ours else got[:, :H // HKV].nan_to_num(0.0) * seen_any,
                    want), flops, log, poison=lambda: out.fill_(float("nan")))
            rows.extend([row] if row else [])


def main(argv=None) -> int:
    return writing_main(measure, "masked-attention", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
