"""Random bands, scans and discounted scans, as ``tf.compile`` makes them for sm_90a, run by
Triton's interpreter against the math as written, evaluated pair by pair in float64 (every
output ``i`` against every position ``j`` of its row: no scan, no window), outputs poisoned.

Each program draws: a band ``[i + lo, i + hi]`` (offsets on either side of the position, some
wider than the row), a scan up to or from the position (offset by up to 3 either way), or a
discounted sum up to or from it (``c ** (i − j)`` or ``exp(−(i − j)/τ)``), a monoid (sum,
max, min, logsumexp, argmax for bands), a further condition on the terms or none, the positions
along the rows (``[B, N]``) or down the middle axis (``[B, N, C]``), a row length that is no
multiple of any tile. Prints
``{"programs": n, "worst": [error, description]}`` as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.band_fuzz_check SEED [PROGRAMS]
"""
import json
import random
import sys

import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tests.helpers import poisoned_call, relative_error
from tests.schedule_templates.staged_floor import interpreted

HIGHEST = torch.finfo(torch.float32).max   # max's and min's identity where a window is empty


def _program(spec: dict):
    """The kernel ``spec`` describes, written as a user writes it."""
    lo, hi, monoid, cond, middle, decay = (spec[k] for k in ("lo", "hi", "monoid", "cond",
                                                             "middle", "decay"))
    reduce = {"sum": T.sum, "max": T.max, "min": T.min, "logsumexp": T.logsumexp,
              "argmax": T.argmax}[monoid]
    identity = {"sum": 0.0, "max": -T.inf, "argmax": -T.inf, "min": T.inf,
                "logsumexp": -T.inf}[monoid]

    def body(x, lengths, b, i, j, read):
        if decay:
            keep = (j <= i) if decay[0] == "prefix" else (j >= i)
            distance = (i - j) if decay[0] == "prefix" else (j - i)
            factor = 0.97 ** distance if decay[1] == "pow" else \
                T.exp(-T.cast(distance, "f32") / 40.0)
            term = factor * read
        elif spec["scan"]:
            keep = (j <= i + spec["scan"][1]) if spec["scan"][0] == "prefix" else \
                (j >= i + spec["scan"][1])
            term = read
        else:
            keep, term = (j <= i + hi) & (j >= i + lo), read
        if cond:
            keep = keep & (j < lengths[b])
        return reduce(T.where(keep, term, identity), over=j)

    if middle:
        def kernel(x: T.Tensor["B", "N", "C", "f32"], lengths: T.Tensor["B", "i32"]):
            b = T.axis("b", "B")
            i = T.axis("i", "N")
            j, c = T.axes("j c")
            return body(x, lengths, b, i, j, x[b, j, c])
    else:
        def kernel(x: T.Tensor["B", "N", "f32"], lengths: T.Tensor["B", "i32"]):
            b, j = T.axes("b j")
            i = T.axis("i", "N")
            return body(x, lengths, b, i, j, x[b, j])
    kernel.__name__ = kernel.__qualname__ = "fuzzed"
    return tf.kernel(kernel)


def _reference(spec: dict, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The math, pair by pair: each output position ``i`` against each ``j`` of its row."""
    data = x.double() if not spec["middle"] else x.double().transpose(1, 2)   # [B, (C,) N]
    n = data.shape[-1]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    if spec["decay"]:
        prefix = spec["decay"][0] == "prefix"
        keep = (j <= i) if prefix else (j >= i)
        distance = ((i - j) if prefix else (j - i)).clamp(min=0).double()
        factor = 0.97 ** distance if spec["decay"][1] == "pow" else torch.exp(-distance / 40)
    else:
        if spec["scan"]:
            keep = (j <= i + spec["scan"][1]) if spec["scan"][0] == "prefix" else \
                (j >= i + spec["scan"][1])
        else:
            keep = (j <= i + spec["hi"]) & (j >= i + spec["lo"])
        factor = torch.ones(n, n, dtype=torch.float64)
    shape = (-1,) + (1,) * (data.dim() - 1)
    keep = keep & (j < lengths.view(*shape, 1).long()) if spec["cond"] else \
        keep.expand(*data.shape[:-1], n, n)
    terms = data[..., None, :] * factor                     # [..., i, j]
    monoid = spec["monoid"]
    if monoid == "sum":
        out = torch.where(keep, terms, 0.0).sum(-1)
    elif monoid in ("max", "argmax"):
        masked = torch.where(keep, terms, -torch.inf)
        # argmax: the first of ties; an empty window (every term −∞) the first index, as
        # torch.argmax gives it
        out = masked.amax(-1).clamp(min=-HIGHEST) if monoid == "max" else \
            masked.argmax(-1).double()
    elif monoid == "min":
        out = torch.where(keep, terms, torch.inf).amin(-1).clamp(max=HIGHEST)
    else:
        out = torch.logsumexp(torch.where(keep, terms, -torch.inf), -1)
    return out.transpose(1, 2) if spec["middle"] else out


def _draw(rng: random.Random) -> dict:
    kind = rng.random()
    decay, scan = kind < 0.3, 0.3 <= kind < 0.55
    lo = rng.randint(-70, 8)
    spec = {"lo": lo, "hi": lo + rng.choice([0, 1, 4, 20, 63, 99, 400]),
            "monoid": "sum" if decay else rng.choice(["sum", "max", "min", "logsumexp",
                                                       "argmax"]),
            "cond": rng.random() < 0.4, "middle": rng.random() < 0.35,
            "decay": (rng.choice(["prefix", "suffix"]), rng.choice(["pow", "exp"]))
            if decay else None,
            "scan": (rng.choice(["prefix", "suffix"]), rng.randint(-3, 3)) if scan else None}
    return spec


def main(seed: int, programs: int) -> dict:
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    worst = (0.0, "")
    for _ in range(programs):
        spec = _draw(rng)
        B, N, C = rng.randint(1, 3), rng.randint(50, 700), rng.randint(1, 40)
        shape = (B, N, C) if spec["middle"] else (B, N)
        x = torch.randn(*shape, generator=generator) * 10
        if spec["monoid"] == "argmax":
            x = x.round()   # ties in most windows: the first must win
        lengths = torch.randint(0, N + 20, (B,), generator=generator, dtype=torch.int32)
        kernel = _program(spec)
        made = tf.compile(kernel, target="cuda:sm_90a")
        origin = made.schedule_origin(**dict(zip("BNC", shape)))
        want = _reference(spec, x, lengths)
        (out,) = poisoned_call(interpreted(kernel), kernel.program, dict(x=x, lengths=lengths),
                               want)
        error = relative_error(out, want) if spec["monoid"] != "argmax" else \
            float((out.double() != want).double().mean())
        if error >= worst[0]:
            worst = (error, f"{spec} B={B} N={N} C={C} ({origin.split(';')[0]})")
    return {"programs": programs, "worst": worst}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 12)))
