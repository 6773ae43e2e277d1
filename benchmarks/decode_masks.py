"""Masked decode (one query token per sequence): the masks whose bounds the cluster decode sweeps
(``schedule_templates.key_range``) — a sliding window over a long cache, a static cache filled to
ragged per-sequence lengths kept in device memory — and bottom-right causal, against SDPA with a
boolean mask (every backend that runs it) and FlexAttention (torch.compile, its block mask made
once per shape), in the same process on the same GPU.

    python -m benchmarks.decode_masks [--lengths 32768,131072] [--window 4096] [--out DIR]

Rows ``decode_masks/<mask>``: milliseconds (``bench``: L2 flushed between calls), GB/s of the
keys and values the mask keeps (what any implementation must read) and its fraction of the
copy bandwidth. Each output is checked against float64 first; a wrong one is not timed.
CSV ``benchmarks/results/<date>-<device>-decode-masks.csv``.
"""
from __future__ import annotations

import argparse
import functools
import warnings

import torch

from benchmarks.common import (FLEX, SDPA_CUDNN, SDPA_FLASH, TENSORFUSE, Row, bench,
                               measure_ceilings, relative_error, run_and_write)

SDPA_EFFICIENT = "sdpa efficient"
B, H, D = 8, 32, 128


def _cases(lengths, window):
    """(mask name, N, tensorfuse kernel, its extra arguments, the keys kept per sequence, the
    boolean mask [B, 1, 1, N] or None, FlexAttention's mask_mod or None)."""
    import tensorfuse.kernels as K

    for N in lengths:
        j = torch.arange(N, device="cuda")
        yield ("causal", N, K.causal_attention, {}, [N] * B, None, None)
        keep = (j > N - 1 - window)[None, None, None, :]
        yield ("sliding_window", N, K.sliding_window_attention, {"window": window},
               [window] * B, keep, lambda b, h, i, kv, w=window, n=N: n - 1 - kv < w)
        filled = torch.randint(N // 4, N + 1, (B,), device="cuda", dtype=torch.int32,
                               generator=torch.Generator(device="cuda").manual_seed(N))
        keep = (j[None, :] < filled[:, None])[:, None, None, :]
        yield ("static_cache", N, K.static_cache_attention, {"length": filled},
               filled.tolist(), keep, lambda b, h, i, kv, f=filled: kv < f[b])


def run(lengths, window, rows: list, log=print) -> None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import tensorfuse as tf

    scale = D ** -0.5
    copy = measure_ceilings()["copy_tbps"]
    flex = torch.compile(flex_attention)
    for name, N, kernel, extra, kept, mask, mask_mod in _cases(lengths, window):
        HKV = 8 if name == "static_cache" else H
        q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16)
        keep = torch.ones(B, 1, 1, N, dtype=torch.bool, device="cuda") if mask is None \
            else mask.expand(B, 1, 1, N)
        s = (q.double() @ k.double().repeat_interleave(H // HKV, 1).transpose(-1, -2)) * scale
        want = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ \
            v.double().repeat_interleave(H // HKV, 1)
        made = tf.compile(kernel, "cuda")
        impls = {TENSORFUSE: lambda: made(q, k, v, scale=scale, **extra)}

        def sdpa(backend):
            def attend():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                          enable_gqa=HKV != H)
            return attend

        for label, backend in ((SDPA_CUDNN, SDPBackend.CUDNN_ATTENTION),
                               (SDPA_FLASH, SDPBackend.FLASH_ATTENTION),
                               (SDPA_EFFICIENT, SDPBackend.EFFICIENT_ATTENTION)):
            impls[label] = sdpa(backend)
        block = None if mask_mod is None else create_block_mask(
            mask_mod, B, None, 1, N, device="cuda")
        impls[FLEX] = lambda: flex(q, k, v, block_mask=block, scale=scale,
                                   enable_gqa=HKV != H)
        moved = 2 * HKV * sum(min(n, N) for n in kept) * D * 2
        shape = f"B{B} Hq{H} Hkv{HKV} N{N} D{D} bf16" + \
            (f" window {window}" if name == "sliding_window" else "")
        timed = {}
        for label, fn in impls.items():
            try:
                err = relative_error(fn(), want)
            except Exception as exc:  # noqa: BLE001 - a backend that does not take it
                log(f"  {shape} {name} {label}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            if not err <= 2e-2:
                log(f"  {shape} {name} {label}: WRONG (error {err:.1e})")
                continue
            ms = bench(functools.partial(fn), rep_ms=60)
            timed[label] = ms
            gbps = moved / ms / 1e6
            note = f"err {err:.1e}; GB/s of the keys the mask keeps"
            if label == TENSORFUSE:
                dims = dict(B=B, H=H, M=1, N=N, D=D, **({"HKV": HKV} if HKV != H else {}))
                note += "; " + made.for_sizes(**dims).description
            rows.append(Row(f"decode_masks/{name}", shape, label, ms, 0.0, gbps,
                            gbps / 1e3 / copy, note))
        if TENSORFUSE in timed and len(timed) > 1:
            best = min((ms, label) for label, ms in timed.items() if label != TENSORFUSE)
            log(f"{name:15s} {shape}: tensorfuse {timed[TENSORFUSE] * 1e3:8.1f} us, "
                f"{best[0] / timed[TENSORFUSE]:.2f}x {best[1]}, "
                f"{moved / timed[TENSORFUSE] / 1e9 / copy:.0%} of copy")
        del want, s
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="32768,131072")
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*(kernel not used|runtime disabled)")
    run_and_write(lambda rows: run([int(n) for n in args.lengths.split(",")], args.window, rows),
                  args.out, "decode-masks")


if __name__ == "__main__":
    main()
