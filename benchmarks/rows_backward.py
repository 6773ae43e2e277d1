"""The backward of the row kernels — softmax, log-softmax, cross-entropy, layer norm, RMSNorm — as
a training step runs it, against PyTorch's backward of the same math (eager and under
``torch.compile``), in one process on one GPU, bf16.

Each implementation runs its forward once with autograd recording; what is timed is the backward
alone, ``torch.autograd.grad`` of the output against a fixed incoming gradient (the graph kept),
by its GPU time with the host's issuing kept off the GPU's clock (``bench_queued``: a training
step's host runs ahead of its GPU; the wall clock of a lone call is in the note):
for tensorfuse, the compiled kernel's backward kernel (its gradient program: from the saved
output for softmax and log-softmax, the row statistics recomputed from the inputs for the
others); for ``torch.compile``, the backward graph
Inductor generated. Every gradient is checked against float64 autograd of the math first (a
wrong one is reported and not timed).

GB/s count the bytes a backward cannot avoid — the inputs it reads (x, the incoming gradient,
the weight) and the gradients it writes — over the time; the fraction is of the measured copy
bandwidth.

    python -m benchmarks.rows_backward [--out DIR] [--only softmax,cross_entropy,...] [--sweep]

Rows ``rows_bwd/<kernel>``, CSV ``benchmarks/results/<date>-<device>-rows-backward.csv``.
``--sweep``: instead, the row template's knobs on the backward's row kernel (the whole backward:
rows a program, block, warps, the row read again or held; for layer norm and RMSNorm, whose
weight gradients the row kernel adds up in its pass, the row tiles a program sweeps, warps,
pipeline stages and the row read again or held), each checked on every gradient
against float64 and timed from a CUDA graph beside the default (L2 warm between replays;
torch.compile's backward cannot be captured in one: compare with the main run) (CSV
``…-rows-backward-knobs.csv``).
"""
from __future__ import annotations

import argparse
import functools

import torch
import torch.nn.functional as F

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.common import (TENSORFUSE, TORCH_COMPILE, TORCH_EAGER, Row, bench,
                               bench_queued, measure_ceilings, relative_error, run_and_write)
from tensorfuse.binding import bind_call

TOLERANCE = 2e-2   # bf16 gradients (2⁻⁹ each) of f32 arithmetic, relative to the largest


def _cases():
    """name → (shape text, make() → the differentiable tensors, the torch function of the same
    math, the tensorfuse kernel, its other arguments)."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)

    def rows(M, N, scale=1.0):
        return lambda: ((torch.randn(M, N, **bf16) * scale).requires_grad_(),)

    def normed(M, N, bias):
        def made():
            ws = [(1 + 0.1 * torch.randn(N, **bf16)).requires_grad_()]
            if bias:
                ws.append((0.1 * torch.randn(N, **bf16)).requires_grad_())
            return (torch.randn(M, N, **bf16).requires_grad_(), *ws)
        return made

    def cross_entropy_inputs(M, V):
        def made():
            return ((torch.randn(M, V, **bf16) * 4).requires_grad_(),)
        return made

    M, V = 8192, 32768
    target = torch.randint(0, V, (M,), device="cuda", dtype=torch.int32)
    return {
        "softmax": ("4096x8192", rows(4096, 8192, 4.0), lambda x: torch.softmax(x, -1),
                    K.softmax, {}),
        "log_softmax": ("4096x8192", rows(4096, 8192, 4.0), lambda x: torch.log_softmax(x, -1),
                        K.log_softmax, {}),
        "cross_entropy": (f"{M}x{V}", cross_entropy_inputs(M, V),
                          lambda x: F.cross_entropy(x.float(), target.long(), reduction="none"),
                          K.cross_entropy, {"target": target}),
        "layernorm": ("8192x4096", normed(8192, 4096, True),
                      lambda x, w, b: F.layer_norm(x, (4096,), w, b, 1e-5), K.layernorm,
                      {"eps": 1e-5}),
        "rmsnorm": ("8192x4096", normed(8192, 4096, False),
                    lambda x, w: F.rms_norm(x, (4096,), w, 1e-5), K.rmsnorm, {"eps": 1e-5}),
    }


def _moved(tensors, out) -> int:
    """Bytes a backward must move: the inputs read and their gradients written (as large), and
    the incoming gradient, shaped like the output, read in the inputs' dtype (f32 where the
    output is a loss per row)."""
    inputs = sum(t.numel() * t.element_size() for t in tensors)
    return 2 * inputs + out.numel() * (4 if out.dim() == 1 else tensors[0].element_size())


def _reference(torch_fn, tensors):
    """``(incoming gradient, float64 gradients of the tensors)``: the incoming gradient random,
    shaped like the output, in float64."""
    exact = [t.detach().double().requires_grad_() for t in tensors]
    out = torch_fn(*exact)
    seed = torch.randn(out.shape, device="cuda", dtype=torch.float64)
    return seed, torch.autograd.grad(out, exact, seed)


def run(only, rows: list, log=print) -> None:
    copy = measure_ceilings()["copy_tbps"]
    for name, (shape, make, torch_fn, kernel, others) in _cases().items():
        if only and name not in only:
            continue
        tensors = make()
        seed, want = _reference(torch_fn, tensors)
        compiled = tf.compile(kernel)
        fns = {TENSORFUSE: lambda *t: compiled(*t, **others),
               TORCH_EAGER: torch_fn, TORCH_COMPILE: torch.compile(torch_fn)}
        for label, fn in fns.items():
            try:
                out = fn(*tensors)
                incoming = seed.to(out.dtype)
                backward = functools.partial(torch.autograd.grad, out, tensors, incoming,
                                             retain_graph=True)
                got = backward()
                err = max(relative_error(g, w) for g, w in zip(got, want))
            except Exception as exc:  # noqa: BLE001 - an implementation that fails is reported
                log(f"{name} {label}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            if not err <= TOLERANCE:
                log(f"{name} {label}: WRONG (relative error {err:.1e})")
                continue
            ms = bench_queued(backward)
            gbps = _moved(tensors, out) / ms / 1e6
            note = f"err {err:.1e}; wall {bench(backward):.4f} ms"
            if label == TENSORFUSE:   # what autograd ran: the kernel's own backward kernel
                dims = bind_call(kernel.program, tuple(t.detach() for t in tensors), others,
                                 "cuda").dims
                ran = compiled.torch_op.differentiation.backward_kernel()
                note += f"; {ran.schedule_origin(**dims)[:160]}"
            rows.append(Row(f"rows_bwd/{name}", f"{shape} bf16", label, ms, 0.0, gbps,
                            gbps / 1e3 / copy, note))
            log(f"{name:14s} {label:14s} {ms:8.4f} ms {gbps:7.0f} GB/s ({note})")


def _row_stage(kernel, spec):
    """The backward's row kernel: its program (the whole backward where one row kernel takes it,
    a norm's weight gradient added up in its pass; else the first stage: the row statistics and
    d_x), the names its parameters take, and the index of each of its outputs among the
    backward's gradients."""
    from tensorfuse.schedule_templates.auto import choose, takes_stage
    from tensorfuse.schedule_templates.stages import plan_stages

    program = tf.grad(kernel).program
    grads = [c.name for c in program.outputs]
    if choose(program, spec) is not None:
        return program, [p.name for p in program.params], list(range(len(grads)))
    first = plan_stages(program, lambda p: takes_stage(p, spec))[0]
    d_x = f"d_{kernel.program.tensor_params[0].name}"
    return first.program, list(first.inputs), [grads.index(d_x)]


def _sweep_knobs(cols: int, sums: bool):
    """Knobs by label: the row tiles a program sweeps, warps, pipeline stages and the row read
    again or held (for a row kernel that adds sums down the rows up: only these); the rows a
    program, the whole row or blocks of 4096-16384, 4-16 warps."""
    import itertools

    whole = 1 << max(4, (cols - 1).bit_length())
    for tiles, warps, stages, reload in itertools.product((8, 16, 32, 64), (4, 8), (1, 2, 3, 4),
                                                          (0, 1)):
        if sums or tiles <= 32 and stages > 1 and whole <= 16384:
            yield f"t{tiles} w{warps} s{stages}" + (" reload" if reload else ""), dict(
                row_tiles=tiles, num_warps=warps, num_stages=stages, reload=bool(reload))
    if sums:
        return
    for rows, block, warps in itertools.product((1, 2), (4096, 8192, 16384), (4, 8, 16)):
        if block > whole or rows * block > 16384:
            continue
        for reload in ((0, 1) if block >= cols else (0,)):
            yield f"r{rows} b{block} w{warps}" + (" reload" if reload else ""), dict(
                rows=rows, block=block, num_warps=warps, reload=bool(reload))


def sweep(only, log=print) -> list[Row]:
    """Rows ``rows_bwd_knobs/<kernel>``: the backward program's row kernel at each knob set,
    checked on every gradient it writes (a norm staged: its first stage, by its d_x)."""
    from tensorfuse.dsl.program import ProgramKernel

    from benchmarks.common import measure_candidates
    from tensorfuse.schedule_templates.auto import choose, sums_down_rows
    from tensorfuse.schedule_templates.row_reduction import row_reduction
    from tensorfuse.targets import get_target
    from tensorfuse.interop import torch_dtype
    from tensorfuse.targets.triton.compile_pool import CompilePool

    spec = get_target("cuda:sm_90a")
    rows: list[Row] = []
    pool = CompilePool()
    try:
        for name, (shape, make, torch_fn, kernel, others) in _cases().items():
            if only and name not in only:
                continue
            tensors = make()
            seed, want = _reference(torch_fn, tensors)
            program, inputs, wrote = _row_stage(kernel, spec)
            stage = ProgramKernel(program)
            given = {p.name: t.detach() for p, t in zip(kernel.program.tensor_params, tensors)}
            d_out = next(p for p in tf.grad(kernel).program.params if p.name == "d_out")
            given.update(others, d_out=seed.to(torch_dtype(d_out.dtype)))
            args = {p.name: given[n] for p, n in zip(program.params, inputs)}
            _, fusion = choose(program, spec)
            made = {label: row_reduction(stage, fusion, spec, **knobs)
                    for label, knobs in _sweep_knobs(tensors[0].shape[-1],
                                                     sums_down_rows(program, fusion))}
            def written(f):
                made = f(**args)
                return made if isinstance(made, tuple) else (made,)

            def error(got, wrote=wrote, want=want):   # each gradient against its own size
                return max(relative_error(g, want[k]) for g, k in zip(got, wrote))
            rows += measure_candidates("rows_bwd_knobs", name, f"{shape} bf16",
                                       {"default": tf.compile(stage)}, made,
                                       lambda cand: cand.warm(**args), written, None, {},
                                       _moved([tensors[k] for k in wrote], seed), pool, log,
                                       error)
    finally:
        pool.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--only", default="")
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    only = {n for n in args.only.split(",") if n}
    if args.sweep:
        run_and_write(lambda rows: rows.extend(sweep(only)), args.out, "rows-backward-knobs")
    else:
        run_and_write(lambda rows: run(only, rows), args.out, "rows-backward")


if __name__ == "__main__":
    main()
