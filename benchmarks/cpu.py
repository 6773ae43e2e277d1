"""tensorfuse on the CPU (the ``llvm`` target, template defaults) against torch with the same
number of threads, one process: row reductions over 4096² and causal attention.

    python -m benchmarks.cpu --csv results/DATE-cpu.csv

Rows ``cpu/<kernel>/<shape>``: every tensorfuse kernel is first checked against float64 NumPy on
fresh inputs at a ragged size (outputs poisoned), then timed — the median of ``REPEAT`` calls,
wall clock, a new output per call as a user's call makes one (torch's too). Attention is timed as
``tf.compile`` compiles it (on the CPU: the chain fused by the rolling update, chunks of 128 keys)
and unfused (``tf.compile(kernel, template=None)``: the row schedule), against
``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.common import Row, write_csv
from tensorfuse.dsl.evaluate import run_program
from tensorfuse.kernels.layers import attention_kernel
from tensorfuse.kernels.reference import (REFERENCES, TOLERANCE, random_inputs, reference,
                                          relative_error)

REPEAT = 7
ROWS = ("softmax", "log_softmax", "layernorm", "rmsnorm", "cross_entropy")
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def wall_ms(fn, repeat: int = REPEAT) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def checked(kernel, compiled, sizes: dict, rng) -> float:
    """Relative error against float64 at ``sizes`` (fresh inputs, a NaN-poisoned output)."""
    from tensorfuse.dsl import dtypes as dt

    tensors, scalars = random_inputs(kernel, sizes, rng)
    c = kernel.program.outputs[0]
    shape = [a.extent if isinstance(a.extent, int) else sizes[a.extent] for a in c.axes]
    out = np.full(shape, np.nan).astype(dt.to_numpy(c.dtypes[0]))
    compiled(**tensors, **scalars, out=out)
    if kernel.name in REFERENCES:
        return relative_error(out, reference(kernel, tensors, scalars))
    return relative_error(out, run_program(kernel.program, tensors, scalars)[0])   # float64


def torch_row(name: str, x, w, b, target):
    n = x.shape[-1]
    return {"softmax": lambda: torch.softmax(x, -1),
            "log_softmax": lambda: torch.log_softmax(x, -1),
            "layernorm": lambda: torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5),
            "rmsnorm": lambda: torch.nn.functional.rms_norm(x, (n,), w, 1e-5),
            "cross_entropy": lambda: torch.nn.functional.cross_entropy(
                x, target.long(), reduction="none")}[name]


def rows(m: int, n: int, rng, log) -> list[Row]:
    x = torch.randn(m, n).bfloat16()
    w, b = torch.randn(n).bfloat16(), torch.randn(n).bfloat16()
    target = torch.randint(0, n, (m,), dtype=torch.int32)
    args = {"softmax": (x,), "log_softmax": (x,), "layernorm": (x, w, b, 1e-5),
            "rmsnorm": (x, w, 1e-5), "cross_entropy": (x, target)}
    out = []
    for name in ROWS:
        kernel = K.ALL[name]
        f = tf.compile(kernel, target="llvm")
        err = checked(kernel, f, dict(M=37, N=333, V=333), rng)
        ok = err <= TOLERANCE[kernel.program.outputs[0].dtypes[0]]
        ms = wall_ms(lambda: f(*args[name]))
        ref = wall_ms(torch_row(name, x, w, b, target))
        gbps = 2 * m * n * 2 / ms / 1e6
        note = f"error {err:.1e}{'' if ok else ' WRONG'}; torch {ref:.2f} ms; {ref / ms:.2f}x"
        log(f"{name:14} {ms:8.2f} ms   torch {ref:8.2f} ms   {ref / ms:5.2f}x   err {err:.1e}")
        out.append(Row(f"cpu/{name}", f"{m}x{n} bf16", "tensorfuse (tf.compile)", ms, 0.0, gbps,
                       ref / ms, note))
        out.append(Row(f"cpu/{name}", f"{m}x{n} bf16", "torch", ref, 0.0,
                       2 * m * n * 2 / ref / 1e6, 1.0, ""))
    return out


def attention(s: int, dtype: str, rng, log, heads: int = 8, d: int = 64) -> list[Row]:
    kernel = attention_kernel(dtype, True, False, False)   # causal, no mask tensor, no cap
    q, k, v = (torch.randn(1, heads, s, d).to(DTYPES[dtype]) for _ in range(3))
    scale = d ** -0.5
    flops = 4 * heads * s * s * d / 2
    made = {"tensorfuse (tf.compile)": tf.compile(kernel, target="llvm"),
            "tensorfuse (unfused rows)": tf.compile(kernel, target="llvm", template=None)}
    out = []
    sdpa = wall_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=scale), 3)
    for label, f in made.items():
        err = checked(kernel, f, dict(B=1, H=2, HKV=2, M=45, N=45, D=16), rng)
        wrong = "" if err <= TOLERANCE[dtype] else " WRONG"
        ms = wall_ms(lambda: f(q, k, v, scale=scale), 3)
        log(f"attention S={s} {dtype} {label:28} {ms:9.1f} ms  sdpa {sdpa:8.1f} ms  "
            f"{sdpa / ms:5.2f}x  err {err:.1e}{wrong}")
        out.append(Row("cpu/causal_attention", f"B1 H{heads} S{s} D{d} {dtype}", label, ms,
                       flops / ms / 1e9, 0.0, sdpa / ms,
                       f"error {err:.1e}{wrong}; sdpa {sdpa:.1f} ms"))
    out.append(Row("cpu/causal_attention", f"B1 H{heads} S{s} D{d} {dtype}", "torch sdpa", sdpa,
                   flops / sdpa / 1e9, 0.0, 1.0, ""))
    return out


VARIANTS = (   # kernel, timed sizes and scalars, checked sizes and scalars, SDPA's arguments
    ("attention", dict(B=1, H=8, M=1024, N=1024, D=64), {},            # (where it computes the
     dict(B=1, H=2, M=45, N=45, D=64), {}, {}),                         # same thing)
    ("document_attention", dict(B=1, H=8, M=1024, N=1024, D=64), {},
     dict(B=1, H=2, M=45, N=45, D=64), {}, None),
    ("gqa_attention", dict(B=4, H=32, HKV=8, M=1, N=4096, D=128), {},
     dict(B=2, H=4, HKV=2, M=1, N=45, D=128), {}, {"enable_gqa": True}),
    ("sliding_window_attention", dict(B=1, H=8, M=2048, N=2048, D=64), {"window": 256},
     dict(B=1, H=2, M=45, N=45, D=64), {"window": 9}, None),
    ("neighborhood_attention_2d", dict(B=1, H=4, M=1024, N=1024, D=64),
     {"width": 32, "radius": 3, "dilation": 1},
     dict(B=1, H=2, M=40, N=40, D=64), {"width": 8, "radius": 2, "dilation": 1}, None),
)


def variants(rng, log) -> list[Row]:
    """Attention variants no bar names, bf16: ``tf.compile`` (fused) against the unfused rows,
    and SDPA where it computes the same thing (no mask, GQA decode); each checked first at small
    sizes against float64."""
    import tensorfuse.kernels as K

    out = []
    for name, dims, scalars, small, small_scalars, sdpa in VARIANTS:
        kernel = K.ALL[name]
        args = {}
        for p in kernel.program.tensor_params:
            shape = [dims[d] if isinstance(d, str) else d for d in p.dims]
            args[p.name] = (torch.randint(0, 3, shape, dtype=torch.int32).sort(-1).values
                            if p.dtype == "i32" else torch.randn(shape).bfloat16())
        given = {"scale": dims["D"] ** -0.5, **scalars}
        shape = " ".join(f"{k}{v}" for k, v in dims.items()) + " bf16"
        for label, template in (("tensorfuse (tf.compile)", "auto"),
                                ("tensorfuse (unfused rows)", None)):
            f = tf.compile(kernel, target="llvm", template=template)
            tensors, checked_scalars = random_inputs(kernel, small, rng)
            checked_scalars.update(small_scalars)
            err = relative_error(f(**tensors, **checked_scalars),
                                 run_program(kernel.program, tensors, checked_scalars)[0])
            wrong = "" if err <= TOLERANCE["bf16"] else " WRONG"
            ms = wall_ms(lambda: f(**args, **given), 3)
            log(f"{name:26} {label:28} {ms:9.1f} ms  err {err:.1e}{wrong}")
            out.append(Row(f"cpu/{name}", shape, label, ms, 0.0, 0.0, 0.0,
                           f"error {err:.1e}{wrong}"))
        if sdpa is not None:
            ms = wall_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                args["q"], args["k"], args["v"], scale=given["scale"], **sdpa), 3)
            log(f"{name:26} {'torch sdpa':28} {ms:9.1f} ms")
            out.append(Row(f"cpu/{name}", shape, "torch sdpa", ms, 0.0, 0.0, 1.0, ""))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--csv", default=None)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--attention", default="1024,4096",
                        help="sequence lengths ('' for none)")
    parser.add_argument("--no-rows", action="store_true", help="attention only")
    parser.add_argument("--variants", action="store_true",
                        help="also other attention variants, fused against unfused")
    parser.add_argument("--dtypes", default="bf16,f32")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)   # read when TVM's pool first runs
    rng = np.random.default_rng()
    log = (lambda text: print(text, flush=True))
    log(f"CPU benchmark: {args.threads} threads (torch and TVM)")
    out = [] if args.no_rows else rows(4096, 4096, rng, log)
    for s in [int(x) for x in args.attention.split(",") if x]:
        for dtype in args.dtypes.split(","):
            out += attention(s, dtype, rng, log)
    if args.variants:
        out += variants(rng, log)
    if args.csv:
        write_csv(out, args.csv)


if __name__ == "__main__":
    main()
