"""The interpreter's scans and reductions with combine functions of their own against
:mod:`tests.interpreter_scans`'s trees: each case run with the interpreter's own, then
vectorised — a max with its first index (ties among the values) equal bit for bit, a discounted
sum (``(a, u) ⊕ (b, v) = (a·v + b, u·v)``, associative) within float32's rounding — along
either axis of a tile, reversed, kept dims or not, and along a tile of one row.

    TRITON_INTERPRET=1 python -m tests.interpreter_scans_check
"""
import json

import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from tests.interpreter_scans import _reduce, _scan, vectorise


@triton.jit
def _first_max(a, i, b, j):
    keep = (a > b) | ((a == b) & (i < j))
    return tl.where(keep, a, b), tl.where(keep, i, j)


@triton.jit
def _discounted(a, u, b, v):
    return a * v + b, u * v


@triton.jit
def kernel(x, w, scanned, index, discounted, rows, row_index, totals, M: tl.constexpr,
           N: tl.constexpr, AXIS: tl.constexpr, REVERSE: tl.constexpr):
    offs_m, offs_n = tl.arange(0, M), tl.arange(0, N)
    at = offs_m[:, None] * N + offs_n[None, :]
    v, u = tl.load(x + at), tl.load(w + at)
    where = tl.broadcast_to(offs_n[None, :], (M, N)) if AXIS == 1 else \
        tl.broadcast_to(offs_m[:, None], (M, N))
    s, i = tl.associative_scan((v, where), AXIS, _first_max, reverse=REVERSE)
    tl.store(scanned + at, s)
    tl.store(index + at, i)
    d, _ = tl.associative_scan((v, u), AXIS, _discounted, reverse=REVERSE)
    tl.store(discounted + at, d)
    r, ri = tl.reduce((v, where), AXIS, _first_max, keep_dims=True)
    if AXIS == 1:
        tl.store(rows + offs_m[:, None], r)
        tl.store(row_index + offs_m[:, None], ri)
    else:
        tl.store(rows + offs_n[None, :], r)
        tl.store(row_index + offs_n[None, :], ri)
    total, _ = tl.reduce((v, u), AXIS, _discounted)
    tl.store(totals + (offs_m if AXIS == 1 else offs_n), total)


def _run(M: int, N: int, axis: int, reverse: bool) -> list:
    generator = torch.Generator().manual_seed(M + N + axis + 2 * reverse)
    x = torch.randn(M, N, generator=generator).round(decimals=1)   # many ties
    w = torch.rand(M, N, generator=generator) * 0.5 + 0.5
    kept = M if axis == 1 else N
    outs = [torch.empty(M, N), torch.empty(M, N, dtype=torch.int32), torch.empty(M, N),
            torch.empty(kept), torch.empty(kept, dtype=torch.int32), torch.empty(kept)]
    kernel[(1,)](x, w, *outs, M=M, N=N, AXIS=axis, REVERSE=reverse)
    return outs


def equal_to_the_interpreters() -> dict:
    """Each case's verdict: the exact outputs equal, the discounted ones within 1e-5."""
    cases = [(8, 32, a, r) for a in (0, 1) for r in (False, True)] + [(1, 256, 1, False)]
    vectorise(False)
    own = {c: _run(*c) for c in cases}
    assert interpreter.ScanOps.generic_scan is interpreter.ScanOps.own_generic_scan
    vectorise()
    mine = {c: _run(*c) for c in cases}
    assert interpreter.ScanOps.generic_scan is _scan and \
        interpreter.ReduceOps.generic_reduce is _reduce
    verdicts = {}
    for c in cases:
        a, b = own[c], mine[c]
        exact = all(torch.equal(a[k], b[k]) for k in (0, 1, 3, 4))
        close = all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-5) for k in (2, 5))
        verdicts["{}x{} axis {}{}".format(*c[:3], " reversed" if c[3] else "")] = exact and close
    return verdicts


if __name__ == "__main__":
    print(json.dumps(equal_to_the_interpreters()))
