"""The contraction template (Triton tensor-core tiles for GEMM-shaped programs) against cuBLAS
through torch eager and torch.compile, in one process on one GPU: GEMMs as users write them
(``nn.Linear``, a batched product, a weight gradient reading its rows operand transposed, a
gradient through a computed operand) and SwiGLU's MLP backward (``tf.grad``: its floor's GEMM
stages) against eager autograd.

Every tensorfuse kernel is checked against float64 on its own inputs (outputs poisoned with NaN
first) before it is timed; a wrong one is reported and not timed. ``template`` rows call the
contraction template directly (on sm_90a ``tf.compile`` gives the Hopper GEMM the GEMMs it takes);
``tensorfuse`` rows are ``tf.compile``'s choice.

    python -m benchmarks.contraction [--out DIR] [--only linear,weight_gradient,...] [--sweep]
                                     [--pairs] [--splits]

The CSV: ``…-contraction.csv``, ``…-contraction-<cases>.csv`` with ``--only`` (the others
likewise). ``--sweep``: the template's tiles, warps and stages around its defaults on each case
(CSV ``…-contraction-knobs.csv``); ``--pairs``: pairwise reductions' tiles (CSV
``…-contraction-pairs-knobs.csv``); ``--splits``: outputs of few tiles over a long contracted
axis (a Gram matrix, small layers' weight gradients) split into 1 to 32 parts, against cuBLAS
(CSV ``…-contraction-splits.csv``).
"""
from __future__ import annotations

import argparse
import functools

import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.common import (TENSORFUSE, TORCH_COMPILE, TORCH_EAGER, Row, bench,
                               measure_ceilings, relative_error, run_and_write)
from tensorfuse import dsl as T
from tensorfuse.autograd import grad
from tensorfuse.interop import torch_dtype
from tensorfuse.kernels.layers import swiglu_mlp_kernel
from tensorfuse.schedule_templates.contraction import triton_contraction
from tensorfuse.schedule_templates.contraction_plan import plan_contraction
from tensorfuse.targets import get_target

TOLERANCE = 1e-2   # bf16 outputs (2⁻⁹ each) of f32 accumulations; a rounded side as much again


@tf.kernel
def weight_gradient(x: T.Tensor["B", "M", "K", "bf16"], dy: T.Tensor["B", "M", "N", "bf16"]):
    """A batched weight gradient: the rows operand read transposed (its contracted axis first)."""
    b, i, k, n = T.axes("b i k n")
    return T.sum(x[b, i, k] * dy[b, i, n], over=i)


@tf.kernel
def gated_gradient(x: T.Tensor["M", "K", "bf16"], d_h: T.Tensor["M", "N", "f32"],
                   gate: T.Tensor["M", "N", "f32"]):
    """SwiGLU's gate-weight gradient as its backward's floor stores it: the columns side computed
    from two f32 tensors (rounded to bf16 for the tensor cores), out [K, N]."""
    i, k, n = T.axes("i k n")
    s = T.sigmoid(gate[i, n])
    return T.sum(d_h[i, n] * s * (1.0 + gate[i, n] * (1.0 - s)) * x[i, k], over=i)


@tf.kernel
def batched_product(a: T.Tensor["Z", "M", "K", "bf16"], b: T.Tensor["Z", "K", "N", "bf16"]):
    """``torch.bmm``: a product per batch, each with its own operands."""
    z, i, k, j = T.axes("z i k j")
    return T.sum(a[z, i, k] * b[z, k, j], over=k)


@tf.kernel
def attention_scores(q: T.Tensor["B", "H", "M", "D", "bf16"],
                     k: T.Tensor["B", "H", "N", "D", "bf16"]):
    """Attention's scores ``q·kᵀ`` materialised (two batch axes; the head dim contracted)."""
    b, h, i, j, d = T.axes("b h i j d")
    return T.sum(q[b, h, i, d] * k[b, h, j, d], over=d)


def _randn(*shape, scale=1.0, dtype=torch.bfloat16):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def cases():
    """(name, shape, kernel, arguments, float64 reference, torch's call, FLOPs)."""
    M, K_, N = 8192, 4096, 14336
    x, w, b = _randn(M, K_), _randn(N, K_, scale=0.02), _randn(N)
    yield ("linear", f"{M}x{K_}x{N}", K.linear, dict(x=x, weight=w, bias=b),
           lambda: x.double() @ w.double().T + b.double(),
           lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias), 2 * M * K_ * N)
    B, S, D = 8, 4096, 4096
    xs, dy = _randn(B, S, D), _randn(B, S, D, scale=0.01)
    yield ("weight_gradient", f"B{B} {S}x{D}x{D} (xᵀ·dy)", weight_gradient, dict(x=xs, dy=dy),
           lambda: torch.einsum("bik,bin->bkn", xs.double(), dy.double()),
           lambda x, dy: torch.einsum("bik,bin->bkn", x, dy), 2 * B * S * D * D)
    # a short contracted axis (attention-like scores written as a bmm): the output's stores
    # bound it, not the tensor cores
    Z, Ms, Ks, Ns = 16, 2048, 128, 2048
    a, bb = _randn(Z, Ms, Ks), _randn(Z, Ks, Ns)
    yield ("batched_product", f"Z{Z} {Ms}x{Ks}x{Ns}", batched_product, dict(a=a, b=bb),
           lambda: a.double() @ bb.double(), lambda a, b: torch.bmm(a, b), 2 * Z * Ms * Ks * Ns)
    B_, H_, S_, D_ = 4, 16, 2048, 128
    q, kk = _randn(B_, H_, S_, D_), _randn(B_, H_, S_, D_)
    yield ("attention_scores", f"B{B_} H{H_} {S_}x{D_}x{S_}", attention_scores, dict(q=q, k=kk),
           lambda: q.double() @ kk.double().transpose(-1, -2),
           lambda q, k: q @ k.transpose(-1, -2), 2 * B_ * H_ * S_ * S_ * D_)
    xg, d_h, gate = _randn(M, K_), torch.randn(M, N, device="cuda"), \
        torch.randn(M, N, device="cuda") * 3

    def gated_reference(x, d_h, gate):
        s = torch.sigmoid(gate)
        return torch.einsum("in,ik->kn", (d_h * s * (1 + gate * (1 - s))).to(x.dtype), x)
    yield ("gated_gradient", f"{M}x{K_}x{N} (SwiGLU's gate-weight gradient)", gated_gradient,
           dict(x=xg, d_h=d_h, gate=gate),
           lambda: gated_reference(xg.double(), d_h.double(), gate.double()), gated_reference,
           2 * M * K_ * N)


def swiglu_backward_rows(rows: list, ceiling: float, M=4096, K_=4096, N=14336, O=4096,
                         log=print) -> None:
    """``tf.grad`` of Llama's MLP (its floor's stages) against torch's autograd of the same MLP."""
    x, gate_proj, up_proj = _randn(M, K_), _randn(N, K_, scale=0.02), _randn(N, K_, scale=0.02)
    down_proj, d_out = _randn(O, N, scale=0.02), _randn(M, O)
    backward = tf.compile(grad(swiglu_mlp_kernel("bf16")))
    args = dict(x=x, gate_proj=gate_proj, up_proj=up_proj, down_proj=down_proj, d_out=d_out)

    def autograd(x, gate_proj, up_proj, down_proj, d_out):
        leaves = [t.detach().requires_grad_() for t in (x, gate_proj, up_proj, down_proj)]
        xl, g, u, d = leaves
        out = torch.nn.functional.linear(torch.nn.functional.silu(xl @ g.T) * (xl @ u.T), d)
        return torch.autograd.grad(out, leaves, d_out)

    want = autograd(*(t.double() for t in args.values()))
    got = backward(**args)
    error = max(relative_error(g, w) for g, w in zip(got, want))
    flops = 2 * M * K_ * N * 2 * 3 + 2 * M * N * O * 3   # the forward's GEMMs again, then dx, dW
    shape = f"M{M} K{K_} N{N} O{O}"
    calls = {TENSORFUSE: lambda: backward(**args), TORCH_EAGER: lambda: autograd(**args),
             TORCH_COMPILE: functools.partial(torch.compile(autograd), **args)}
    for label, call in calls.items():
        if label == TENSORFUSE and error > TOLERANCE:
            log(f"swiglu_backward {label}: WRONG (error {error:.2e}); not timed")
            continue
        ms = bench(call)
        rate = flops / ms / 1e9
        rows.append(Row("contraction/swiglu_backward", shape, label, ms, rate, 0.0,
                        rate / ceiling, f"err {error:.1e}" if label == TENSORFUSE else ""))
        log(f"swiglu_backward {shape} {label}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s")


def measure(rows: list, only: set | None = None, log=print) -> None:
    target = get_target("cuda")
    ceiling = measure_ceilings()["gemm_tflops"]
    log(f"bf16 GEMM ceiling (cuBLAS 8192³): {ceiling:.0f} TFLOP/s")
    for name, shape, kernel, args, reference, torch_call, flops in cases():
        if only and name not in only:
            continue
        want = reference()
        made = {TENSORFUSE: tf.compile(kernel),
                f"{TENSORFUSE} template": triton_contraction(kernel, target)}
        if plan_contraction(kernel.program).staging is not None:   # the default stages them
            made[f"{TENSORFUSE} template, sides in the tiles"] = triton_contraction(
                kernel, target, stage_sides=0)
        calls = {TORCH_EAGER: functools.partial(torch_call, **args),
                 TORCH_COMPILE: functools.partial(torch.compile(torch_call), **args)}
        for label, kernel_ in made.items():
            out = torch.full(want.shape, float("nan"), device="cuda",
                             dtype=torch_dtype(kernel.program.outputs[0].dtypes[0]))
            error = relative_error(kernel_(**args, out=out), want)
            if error > TOLERANCE:
                log(f"{name} {label}: WRONG (error {error:.2e}); not timed")
                continue
            calls[label] = functools.partial(kernel_, **args)
        for label, call in calls.items():
            ms = bench(call)
            rate = flops / ms / 1e9
            rows.append(Row(f"contraction/{name}", shape, label, ms, rate, 0.0,
                            rate / ceiling, ""))
            log(f"{name} {shape} {label}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s")
    if not only or "swiglu_backward" in only:
        swiglu_backward_rows(rows, ceiling, log=log)


def _checked_time(call, pick, want, tolerance: float, what: str, log):
    """``(ms, error)`` of ``call`` where ``pick`` of its output is within ``tolerance`` of
    ``want`` (float64); None, said why, where it is wrong or fails (a candidate's failure is
    reported, not raised)."""
    try:
        error = relative_error(pick(call()), want)
        if error > tolerance:
            log(f"{what}: WRONG (error {error:.2e}); not timed")
            return None
        return bench(call), error
    except Exception as exc:  # noqa: BLE001 - a candidate that fails is reported
        log(f"{what}: {type(exc).__name__}: {str(exc)[:160]}")
        return None


# tiles, warps and stages a sweep tries around the defaults (128 × 128 / 128 × 256, 8 warps, 3
# stages): what the defaults are checked against
SWEPT = tuple((m, n, w, st) for m, n in ((128, 128), (128, 256), (256, 128), (64, 256))
              for w in (4, 8) for st in (3, 4) if not (m * n >= 32768 and w == 4)) + \
    tuple((m, n, w, 2) for m, n, w in ((128, 256, 8), (128, 128, 8), (128, 128, 4), (64, 128, 4),
                                       (128, 64, 4), (64, 64, 4)))   # short contracted axes


def sweep(rows: list, only: set | None = None, log=print) -> None:
    """The template's knobs on the cases (and SwiGLU's gated pair, two sums sharing a tile
    loop): each candidate checked against float64, then timed; ``default`` is the template's
    own choice."""
    target = get_target("cuda")
    ceiling = measure_ceilings()["gemm_tflops"]
    M, K_, N = 8192, 4096, 14336
    x, w1, w3 = _randn(M, K_), _randn(N, K_, scale=0.02), _randn(N, K_, scale=0.02)
    gated_pair = ("gated_pair", f"{M}x{K_}x{N} (two sums)", K.swiglu_gate, dict(x=x, w1=w1, w3=w3),
                  lambda: torch.nn.functional.silu(x.double() @ w1.double().T) *
                  (x.double() @ w3.double().T), None, 2 * 2 * M * K_ * N)
    for name, shape, kernel, args, reference, _, flops in (*cases(), gated_pair):
        if only and name not in only:
            continue
        want = reference()
        made = {"default": triton_contraction(kernel, target)}
        made.update({f"{m}x{n} w{w} s{st}": triton_contraction(
            kernel, target, block_m=m, block_n=n, num_warps=w, num_stages=st)
            for m, n, w, st in SWEPT})
        timed = []
        for label, kernel_ in made.items():
            found = _checked_time(functools.partial(kernel_, **args), lambda out: out, want,
                                  TOLERANCE, f"{name} {label}", log)
            if found is None:
                continue
            ms, error = found
            rate = flops / ms / 1e9
            rows.append(Row(f"contraction_knobs/{name}", shape, label, ms, rate, 0.0,
                            rate / ceiling, f"err {error:.1e}"))
            timed.append((ms, label))
        for ms, label in sorted(timed)[:4] + [t for t in timed if t[1] == "default"]:
            log(f"{name} {label}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s")


# pairwise reductions' tiles (block_m, block_n, block_k, warps, stages) a sweep tries around
# their defaults (64 × 64 pairs, blocks of 4 indices, 4 warps, 2 stages)
# pairwise reductions' tiles (block_m, block_n, block_k, warps, stages) a sweep tries around
# their defaults (128 × 128 or 64 × 64 pairs, blocks of 4 indices, 2 stages)
PAIRS_SWEPT = ((64, 64, 8, 4, 2), (64, 64, 2, 4, 2), (64, 64, 4, 4, 3), (64, 64, 4, 2, 2),
               (128, 64, 4, 4, 2), (64, 128, 4, 4, 2), (128, 128, 4, 8, 2), (128, 128, 8, 8, 2),
               (128, 128, 4, 4, 2), (32, 64, 4, 2, 2), (32, 32, 4, 1, 2))
# a program a row block sweeping the columns (a reduction over them): its rows and columns
ROW_BLOCKS_SWEPT = ((16, 128, 4, 4, 2), (32, 128, 4, 4, 2), (64, 128, 4, 4, 2),
                    (16, 256, 4, 4, 2), (64, 128, 4, 8, 2))


def _pair_cases():
    """(name, kernel, arguments, float64 reference of the picked rows, picked rows, sizes,
    operations, tolerance, candidates) of the pairs swept."""
    from benchmarks.unlisted_kernels import (gaussian_kernel_sum, manhattan_distances,
                                             squared_distances)

    for name, kernel, dtype, M, N, D, tolerance in (
            ("squared_distances", squared_distances, torch.float32, 4096, 4096, 128, 1e-5),
            ("manhattan_distances", manhattan_distances, torch.bfloat16, 4096, 4096, 128, 8e-3),
            ("squared_distances", squared_distances, torch.float32, 16384, 16384, 128, 1e-5),
            ("squared_distances", squared_distances, torch.float32, 16384, 16384, 16, 1e-5),
            ("squared_distances", squared_distances, torch.float32, 16384, 16384, 3, 1e-5)):
        x, y = (_randn(n, D, scale=2.0, dtype=dtype) for n in (M, N))
        picked = torch.arange(0, M, 97, device="cuda")
        p = 2 if name == "squared_distances" else 1
        yield (name, kernel, (x, y), torch.cdist(x[picked].double(), y.double(), p=p) ** p,
               picked, dict(M=M, N=N, D=D), 3 * M * N * D, tolerance, PAIRS_SWEPT)
    for M, D in ((16384, 3), (4096, 3), (16384, 64)):
        # spread so that distances are a few units whatever D (exp(−d2) far from f32's underflow)
        x, y = (torch.rand(M, D, device="cuda") * 4 * (3 / D) ** 0.5 for _ in range(2))
        b = torch.randn(M, device="cuda")
        picked = torch.arange(0, M, 97, device="cuda")
        d2 = torch.cdist(x[picked].double(), y.double()) ** 2
        yield ("gaussian_kernel_sum", gaussian_kernel_sum, (x, y, b),
               torch.exp(-d2) @ b.double(), picked, dict(M=M, N=M, D=D), M * M * (3 * D + 3),
               1e-5, ROW_BLOCKS_SWEPT)


def pairs_sweep(rows: list, only: set | None = None, log=print) -> None:
    """Pairwise reductions' tiles (``benchmarks.unlisted_kernels``' distances, and a Gaussian
    kernel's sum over them, whose programs each sweep a row block's columns) around their
    defaults: each candidate checked against float64 on every 97th row, then timed; operations
    3 per pair and index (and 3 a pair for the sum), against cuBLAS's f32 GEMM on the CUDA
    cores (2 an instruction there, 1.5 here: 75 % is the instructions' limit)."""
    from benchmarks.common import measure_f32_gemm

    target = get_target("cuda")
    ceiling = measure_f32_gemm()
    for name, kernel, args, want, picked, sizes, flops, tolerance, swept in _pair_cases():
        if only and name not in only:
            continue
        made = {"tf.compile": tf.compile(kernel),
                "default": triton_contraction(kernel, target)}
        made.update({f"{m}x{n} k{k} w{w} s{st}": triton_contraction(
            kernel, target, block_m=m, block_n=n, block_k=k, num_warps=w, num_stages=st)
            for m, n, k, w, st in swept})
        shape = " ".join(f"{n}{v}" for n, v in sizes.items()) + \
            (" bf16" if args[0].dtype == torch.bfloat16 else " f32")
        timed = []
        for label, kernel_ in made.items():
            found = _checked_time(functools.partial(kernel_, *args), lambda out: out[picked],
                                  want, tolerance, f"{name} {shape} {label}", log)
            if found is None:
                continue
            ms, error = found
            rate = flops / ms / 1e9
            note = f"err {error:.1e}" + (f"; {kernel_.schedule_origin(**sizes)}"
                                         if label == "tf.compile" else "")
            rows.append(Row(f"contraction_pairs/{name}", shape, label, ms, rate, 0.0,
                            rate / ceiling, note))
            timed.append((ms, label))
        for ms, label in sorted(timed)[:4] + [t for t in timed if t[1] in ("default",
                                                                             "tf.compile")]:
            log(f"{name} {shape} {label}: {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s "
                f"({flops / ms / 1e9 / ceiling:.0%} of f32 GEMM)")


@tf.kernel
def transposed_product(a: T.Tensor["R", "M", "bf16"], b: T.Tensor["R", "N", "bf16"]):
    """``aᵀb`` over the rows ``R``: a Gram matrix (``b`` = ``a``), a weight gradient."""
    r, i, j = T.axes("r i j")
    return T.sum(a[r, i] * b[r, j], over=r)


@tf.kernel
def bilinear_form(x: T.Tensor["B", "I", "bf16"], W: T.Tensor["I", "J", "bf16"],
                  y: T.Tensor["B", "J", "bf16"]):
    """``xᵀ W y`` per batch row: a GEMM whose columns are then summed against ``y``."""
    b, i, j = T.axes("b i j")
    return T.sum(T.sum(x[b, i] * W[i, j], over=i) * y[b, j], over=j)


@tf.kernel
def best_match(x: T.Tensor["M", "D", "bf16"], y: T.Tensor["N", "D", "bf16"]):
    """Each row's highest inner product over a set (retrieval's best score): a GEMM's row
    maxima."""
    i, j, d = T.axes("i j d")
    return T.max(T.sum(x[i, d] * y[j, d], over=d), over=j)


# (name, R, M, N): a Gram matrix of 1024 features, a router's (8 experts) and a LoRA adapter's
# (rank 16) weight gradients over a batch's tokens, a 4096² weight gradient over few tokens
SPLIT_CASES = (("gram", 65536, 1024, 1024), ("router_gradient", 16384, 8, 4096),
               ("lora_gradient", 16384, 16, 4096), ("square_gradient", 2048, 4096, 4096))
SPLITS = (1, 2, 4, 8, 16, 32)


# (name, kernel, sizes, inputs, float64 reference, torch): reductions over a GEMM's columns —
# a bilinear form per row (a GEMM's 4096 rows in blocks of 16 had left the tensor cores idle:
# 0.27× torch.compile), each row's best match over a set of embeddings
def _row_reduced_cases():
    x, W, y = _randn(4096, 4096), _randn(4096, 4096, scale=0.02), _randn(4096, 4096)
    yield ("bilinear_form", bilinear_form, dict(B=4096, I=4096, J=4096), (x, W, y),
           lambda: ((x.double() @ W.double()) * y.double()).sum(-1),
           lambda x, W, y: ((x @ W).float() * y.float()).sum(-1).to(x.dtype),
           2 * 4096 ** 3)
    q, keys = _randn(8192, 256), _randn(65536, 256)
    yield ("best_match", best_match, dict(M=8192, N=65536, D=256), (q, keys),
           lambda: (q.double() @ keys.double().T).max(-1).values,
           lambda q, keys: (q @ keys.T).max(-1).values, 2 * 8192 * 65536 * 256)


# the tiles (rows, columns, warps) and parts a row-reduced case tries
ROW_REDUCED_SWEPT = tuple((m, n, w, p) for m, n, w in ((64, 256, 8), (128, 128, 8), (64, 128, 4))
                          for p in (1, 2, 4, 8))


def splits_sweep(rows: list, only: set | None = None, log=print) -> None:
    """:data:`SPLIT_CASES` with the contracted axis in each of :data:`SPLITS` parts and at the
    template's default, each checked against float64 first, against cuBLAS (``aᵀ @ b``)."""
    target = get_target("cuda")
    ceiling = measure_ceilings()["gemm_tflops"]
    for name, R, M, N in SPLIT_CASES:
        if only and name not in only:
            continue
        a = _randn(R, M)
        b = a if name == "gram" else _randn(R, N)
        want = a.double().T @ b.double()
        flops, shape = 2 * R * M * N, f"R{R} M{M} N{N}"
        made = {"default": triton_contraction(transposed_product, target)}
        made.update({f"splits={n}": triton_contraction(transposed_product, target, splits=n)
                     for n in SPLITS})
        made[TORCH_EAGER] = lambda a, b: a.T @ b
        _time_candidates(rows, name, shape, made, (a, b), want, flops, ceiling,
                         dict(R=R, M=M, N=N), log)
    for name, kernel, sizes, args, reference, eager, flops in _row_reduced_cases():
        if only and name not in only:
            continue
        made = {"default": triton_contraction(kernel, target),
                "16 rows, one part": triton_contraction(kernel, target, block_m=16, block_n=256,
                                                        num_warps=4, splits=1)}
        made.update({f"{m}x{n} w{w} parts={p}": triton_contraction(
            kernel, target, block_m=m, block_n=n, num_warps=w, splits=p)
            for m, n, w, p in ROW_REDUCED_SWEPT})
        made[TORCH_EAGER] = eager
        made[TORCH_COMPILE] = torch.compile(eager)
        _time_candidates(rows, name, " ".join(f"{n}{v}" for n, v in sizes.items()), made, args,
                         reference(), flops, ceiling, sizes, log)


def _time_candidates(rows: list, name: str, shape: str, made: dict, args: tuple, want,
                     flops: float, ceiling: float, sizes: dict, log) -> None:
    """Each of ``made`` (label → callable) checked against ``want`` and timed into ``rows``
    (``contraction_splits/<name>``; the default's note says its knobs)."""
    for label, kernel_ in made.items():
        found = _checked_time(functools.partial(kernel_, *args), lambda out: out, want,
                              TOLERANCE, f"{name} {label}", log)
        if found is None:
            continue
        ms, error = found
        rate = flops / ms / 1e9
        note = f"err {error:.1e}"
        if label == "default":
            note += "; " + kernel_.schedule_origin(**sizes)
        rows.append(Row(f"contraction_splits/{name}", shape, label, ms, rate, 0.0,
                        rate / ceiling, note))
        log(f"{name:16s} {label:22s} {ms:.4f} ms {rate:6.0f} TFLOP/s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--sweep", action="store_true",
                        help="the template's knobs around its defaults, per case")
    parser.add_argument("--pairs", action="store_true",
                        help="pairwise reductions' tiles around their defaults")
    parser.add_argument("--splits", action="store_true",
                        help="outputs of few tiles, the contracted axis split into parts")
    args = parser.parse_args(argv)
    only = {n for n in args.only.split(",") if n} or None
    cases = "".join(f"-{n.replace('_', '-')}" for n in sorted(only or ()))   # the CSV's name
    if args.splits:
        run_and_write(lambda rows: splits_sweep(rows, only), args.out,
                      "contraction-splits" + cases)
    elif args.pairs:
        run_and_write(lambda rows: pairs_sweep(rows, only), args.out,
                      "contraction-pairs-knobs" + cases)
    elif args.sweep:
        run_and_write(lambda rows: sweep(rows, only), args.out, "contraction-knobs" + cases)
    else:
        run_and_write(lambda rows: measure(rows, only), args.out, "contraction" + cases)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
