"""The scan template's one-pass look-back (``targets/triton/scan_lookback.py``) walking back
over parts that published only their own terms: Triton's interpreter runs a grid's programs
one after another, so each would find the part before it complete; here the kernel is
launched a program at a time, and before each launch every published word but the row's first
part's is set back to the part's own terms (computed by torch from the inputs) — so every
program must walk back to its row's first part. Prefix and suffix, sums and maxima, several
rows, an exclusive scan and a ragged last part; prints each case's error against float64 as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.scan_lookback_check SEED
"""
import json
import os
import sys

import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.targets.triton import scan_lookback
from tensorfuse.targets.triton.scan_lookback import AGGREGATE

# parts of two blocks: rows the interpreter runs in seconds are cut into several parts
scan_lookback.PART_BLOCKS = 2


@tf.kernel
def running_total(x: T.Tensor["B", "N", "i32"]):
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j <= i, x[b, j], 0), over=j)


@tf.kernel
def maximum_to_the_end(x: T.Tensor["B", "N", "f32"]):
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.max(T.where(j >= i, x[b, j], float("-inf")), over=j)


@tf.kernel
def total_before(x: T.Tensor["N", "f32"]):
    """Exclusive: the terms strictly before each position (read one position back)."""
    j = T.axis("j", "N")
    i = T.axis("i", "N")
    return T.sum(T.where(j < i, x[j], 0.0), over=j)


def _own(x: torch.Tensor, block: int, parts: int, reduce, shift: int) -> list:
    """Each part's own terms combined, ``[rows]`` a part (the terms of a part at positions
    ``p·block …`` are ``x`` at those positions plus ``shift``; None where it has none)."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    own = []
    for p in range(parts):
        lo, hi = max(0, p * block + shift), min(n, min(n, (p + 1) * block) + shift)
        own.append(reduce(rows[:, lo:hi]) if hi > lo else None)
    return own


def _bits(values: torch.Tensor) -> torch.Tensor:
    """Each value's 32 bits as the low half of an int64."""
    as_int = values.view(torch.int32) if values.dtype == torch.float32 else values
    return as_int.to(torch.int64) & 0xFFFFFFFF


def walked(kernel, x: torch.Tensor, reduce, identity, shift: int = 0):
    """``kernel`` on ``x`` a program at a time, every published word but each row's first
    block's set back to the block's own terms before each program (:data:`AGGREGATE`)."""
    made = tf.compile(kernel, target="cuda:sm_90a")
    launches, values, outs, _, bound = made._prepare((x,), {})
    assert made._kernels(bound.dims) == ["lookback"], made._kernels(bound.dims)
    step = launches.steps[0]
    parts = values["scan_parts"]
    rows = x.reshape(-1, x.shape[-1]).shape[0]
    block = made._layout(bound.dims)[4] * values["scan_part_blocks"]   # a part's positions
    first = 0 if made.plan.direction == "prefix" else parts - 1
    own = _own(x, block, parts, reduce, shift)
    flags = values["scan_flags"]
    for _ in range(step.grid[0]):
        words = flags[1:1 + rows * parts].view(rows, parts)
        for p in range(parts):
            if p != first and bool((words[:, p] != 0).any()):
                value = own[p] if own[p] is not None else torch.full((rows,), identity,
                                                                       dtype=x.dtype)
                words[:, p] = _bits(value.to(x.dtype)) | (AGGREGATE << 32)
        step.fn[(1,)](*[values[n] for n in step.names], **launches.meta, **launches.options)
    return outs[0]


def _error(out, want) -> float:
    return float(((out.double() - want).abs().max() / want.abs().max().clamp(min=1)).item())


def main(seed: int) -> dict:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    g = torch.Generator().manual_seed(seed)
    errors = {}
    x = torch.randint(-1000, 1000, (3, 9 * 1024 + 77), generator=g, dtype=torch.int32)
    out = walked(running_total, x, lambda t: t.sum(-1, dtype=torch.int32), 0)
    errors["running_total"] = _error(out, torch.cumsum(x.double(), -1))
    x = torch.randn(3, 9 * 1024 + 500, generator=g) * 100
    out = walked(maximum_to_the_end, x, lambda t: t.max(-1).values, float("-inf"))
    want = torch.flip(torch.cummax(torch.flip(x.double(), (-1,)), -1).values, (-1,))
    errors["maximum_to_the_end"] = _error(out, want)
    x = torch.randn(20 * 1024 + 3, generator=g) * 100 + 3
    out = walked(total_before, x, lambda t: t.sum(-1), 0.0, shift=-1)
    want = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(x.double(), 0)[:-1]])
    errors["total_before"] = _error(out, want)
    return errors


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
