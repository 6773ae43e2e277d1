"""The scan template's one-pass look-back (``targets/triton/scan_lookback.py``) walking back
over parts that published only their own terms: Triton's interpreter runs a grid's programs
one after another, so each would find the part before it complete; here the kernel is
launched a program at a time, and before each launch every published word but the row's first
part's is set back to the part's own terms (computed by torch from the inputs) — so every
program must walk back to its row's first part. An exclusive integer prefix, a suffix over
several rows, a maximum reaching back past the position (the head folded into the first part),
ragged last parts; prints each case's error against float64 as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.scan_lookback_check SEED
"""
import json
import os
import sys

import torch

import tensorfuse as tf
from tensorfuse.targets.triton import scan_lookback
from tensorfuse.targets.triton.scan_lookback import AGGREGATE
from benchmarks.scan_kernels import segment_offsets, sum_to_the_end
from tests.schedule_templates.scan_check import long_max_from_five_back

# parts of two blocks: rows the interpreter runs in seconds are cut into several parts
scan_lookback.PART_BLOCKS = 2


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
    # an exclusive prefix (the terms one position back), integers: exact
    lengths = torch.randint(0, 1000, (20 * 1024 + 3,), generator=g, dtype=torch.int32)
    out = walked(segment_offsets, lengths, lambda t: t.sum(-1, dtype=torch.int32), 0, shift=-1)
    errors["segment_offsets"] = _error(out, torch.cumsum(lengths.double(), 0) - lengths)
    # a suffix over several rows
    r = torch.randn(3, 9 * 1024 + 500, generator=g) * 100
    out = walked(sum_to_the_end, r, lambda t: t.sum(-1), 0.0)
    errors["sum_to_the_end"] = _error(out, r.double().flip(-1).cumsum(-1).flip(-1))
    # a maximum from five back: the row's last five terms start the first part's carry
    x = torch.randn(20 * 1024 + 77, generator=g) * 100
    out = walked(long_max_from_five_back, x, lambda t: t.max(-1).values, float("-inf"),
                 shift=-5)
    suffix = x.double().flip(0).cummax(0).values.flip(0)
    errors["long_max_from_five_back"] = _error(out, torch.cat([suffix[:1].expand(5),
                                                                suffix[:-5]]))
    return errors


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
