"""A hand-written Triton kernel of RMSNorm's backward with its weight gradient summed in the row
kernel's own pass — the design the row template's sums down the rows now generate
(``schedule_templates.column_sums``), kept as a reference point for them.

Each program loops over ``ROWS`` whole rows of ``[M, N]``, each read once — its statistics,
``dx = r·(dy·w) − x·r³·Σ(dy·w·x)/N``, and its contribution ``dy·x·r`` added into the program's
column partials, kept in registers — then stores its partials (``[M / ROWS, N]`` in f32) for a
column sum. Checked against float64 autograd of ``rms_norm``, timed beside tensorfuse's
backward and ``torch.compile``'s (GPU time, ``bench_queued``).

On the H200 at [8192, 4096] bf16: 0.081 ms at 32 rows a program on 8 warps (8 rows: 0.087; 64:
0.108; timed whole with ``bench``, the partials' sum included), against torch.compile's 0.089.
Its rows loop waits on each row's loads; the template's pipelines the next rows' loads and ran
the same backward in 0.065 ms (``benchmarks.rows_backward``).

    python tools/probe_norm_backward.py [--m 8192 --n 4096]
    TRITON_INTERPRET=1 python tools/probe_norm_backward.py --check   # small sizes, CPU
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_backward(x, w, dy, dx, partial, eps, M, N: tl.constexpr, ROWS: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, N)
    weight = tl.load(w + cols).to(tl.float32)
    acc = tl.zeros([N], tl.float32)
    for k in range(ROWS):
        row = pid * ROWS + k
        if row < M:
            xr = tl.load(x + row * N + cols).to(tl.float32)
            g = tl.load(dy + row * N + cols).to(tl.float32)
            r = tl.rsqrt(tl.sum(xr * xr, axis=0) / N + eps)
            gw = g * weight
            c = tl.sum(gw * xr, axis=0) / N
            tl.store(dx + row * N + cols, (r * gw - xr * (r * r * r * c)).to(dx.dtype.element_ty))
            acc += g * xr * r
    tl.store(partial + pid * N + cols, acc)


def fused(x, w, dy, eps: float, rows: int, warps: int):
    """``(dx, dw)`` by the probe kernel and a column sum of its partials."""
    M, N = x.shape
    programs = triton.cdiv(M, rows)
    dx = torch.empty_like(x)
    partial = torch.empty(programs, N, device=x.device, dtype=torch.float32)
    _rmsnorm_backward[(programs,)](x, w, dy, dx, partial, eps, M, N, rows, num_warps=warps)
    return dx, partial.sum(0).to(w.dtype)


def reference(x, w, dy, eps: float):
    exact = [t.detach().double().requires_grad_() for t in (x, w)]
    out = torch.nn.functional.rms_norm(exact[0], (x.shape[1],), exact[1], eps)
    return torch.autograd.grad(out, exact, dy.double())


def _error(got, want) -> float:
    return max(float((g.double() - w).abs().max() / w.abs().max()) for g, w in zip(got, want))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=8192)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--check", action="store_true", help="small sizes (the interpreter)")
    args = parser.parse_args()
    device = "cpu" if args.check else "cuda"
    M, N = (37, 256) if args.check else (args.m, args.n)
    eps = 1e-5
    x = (torch.randn(M, N, device=device) * 3).bfloat16()
    w = (1 + 0.1 * torch.randn(N, device=device)).bfloat16()
    dy = torch.randn(M, N, device=device).bfloat16()
    want = reference(x, w, dy, eps)
    shapes = [(8, 4)] if args.check else [(r, k) for r in (8, 16, 32, 64) for k in (4, 8)]
    for rows, warps in shapes:
        got = fused(x, w, dy, eps, rows, warps)
        error = _error(got, want)
        assert error < 2e-2, f"rows={rows} warps={warps}: relative error {error:.1e}"
        if args.check:
            print(f"rows={rows} warps={warps}: error {error:.1e}")
            continue
        from benchmarks.common import bench
        ms = bench(lambda: fused(x, w, dy, eps, rows, warps))
        print(f"fused rows={rows:3d} warps={warps}: {ms:.4f} ms (error {error:.1e})")
    if args.check:
        return
    import tensorfuse as tf
    import tensorfuse.kernels as K
    from benchmarks.common import bench_queued

    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    for label, fn in (("tensorfuse", lambda a, b: tf.compile(K.rmsnorm)(a, b, eps=eps)),
                      ("torch.compile", torch.compile(
                          lambda a, b: torch.nn.functional.rms_norm(a, (N,), b, eps))),
                      ("eager", lambda a, b: torch.nn.functional.rms_norm(a, (N,), b, eps))):
        out = fn(xs, ws)
        ms = bench_queued(lambda: torch.autograd.grad(out, (xs, ws), dy, retain_graph=True))
        print(f"{label:13s} backward: {ms:.4f} ms (GPU time)")


if __name__ == "__main__":
    main()
