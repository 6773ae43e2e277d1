"""Softmax and cross-entropy over rows as wide as a language model's vocabulary — GPT-2's 50257,
Llama-3's 128256, Qwen-2's 151936 words and a power of two — through ``tf.compile`` defaults
against torch eager and ``torch.compile``, in one process on one GPU, bf16, each checked against
float64 first. Rows this wide are swept in blocks, twice for a softmax (its statistics, then its
outputs); widths that are not a multiple of 8 start each row off a 16-byte boundary.

GB/s count the logits read (and for the softmax its output written) over the time; the fraction
is of the measured copy bandwidth.

    python -m benchmarks.rows_vocab [--out DIR]

Rows ``rows_vocab/<kernel>``, CSV ``benchmarks/results/<date>-<device>-rows-vocab.csv``.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks.common import (TENSORFUSE, TORCH_COMPILE, TORCH_EAGER, Row, bench,
                               measure_ceilings, relative_error, run_and_write)

# (rows, vocabulary): about 0.4-1.2 GB of bf16 logits each
SHAPES = [(8192, 50257), (2048, 128256), (1024, 131072), (4096, 151936)]


def _softmax(x):
    return torch.softmax(x.float(), -1).to(x.dtype)


def _cross_entropy(x, target):
    return F.cross_entropy(x.float(), target.long(), reduction="none")


def run(rows: list, log=print) -> None:
    import tensorfuse as tf
    import tensorfuse.kernels as K

    copy = measure_ceilings()["copy_tbps"]
    made = {"softmax": tf.compile(K.softmax), "cross_entropy": tf.compile(K.cross_entropy)}
    compiled = {"softmax": torch.compile(_softmax, dynamic=False),
                "cross_entropy": torch.compile(_cross_entropy, dynamic=False)}
    eager = {"softmax": _softmax, "cross_entropy": _cross_entropy}
    generator = torch.Generator(device="cuda").manual_seed(0)
    for M, V in SHAPES:
        x = (4 * torch.randn(M, V, device="cuda", generator=generator)).bfloat16()
        target = torch.randint(0, V, (M,), device="cuda", generator=generator, dtype=torch.int32)
        for name in ("softmax", "cross_entropy"):
            args = (x,) if name == "softmax" else (x, target)
            want = torch.softmax(x.double(), -1) if name == "softmax" else \
                F.cross_entropy(x.double(), target.long(), reduction="none")
            moved = x.numel() * x.element_size() * (2 if name == "softmax" else 1)
            shape = f"{M}x{V} bf16"
            for label, fn in ((TENSORFUSE, made[name]), (TORCH_COMPILE, compiled[name]),
                              (TORCH_EAGER, eager[name])):
                error = relative_error(fn(*args), want)
                if not error < 2e-2:
                    log(f"{name} {shape} {label}: WRONG (error {error:.1e}); not timed")
                    continue
                ms = bench(lambda: fn(*args), rep_ms=100)
                gbps = moved / ms / 1e6
                rows.append(Row(f"rows_vocab/{name}", shape, label, ms, 0.0, gbps,
                                gbps / 1e3 / copy, f"error {error:.1e}"))
                log(f"{name} {shape} {label}: {ms * 1e3:.1f} us, {gbps:.0f} GB/s "
                    f"({gbps / 1e3 / copy:.0%} of copy)")
        del x, target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    run_and_write(run, args.out, "rows-vocab")


if __name__ == "__main__":
    main()
