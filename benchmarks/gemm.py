"""GEMMs from the DSL on the Hopper GEMM template (issue 18) against cuBLAS (torch eager) and
torch.compile, in one process on one GPU.

Every timed tensorfuse kernel is first checked against float64 on its own inputs (the whole
output; poisoned with NaN before the call, with a guard region after it that must stay
untouched). ``--check`` runs the correctness suite alone: ragged M, N and K, both weight layouts,
bias, a gated pair, f16 with an f32 output, wide-range inputs, every knob.

    python -m benchmarks.gemm [--check] [--csv PATH] [--shapes 8192x8192x8192,...]
                              [--no-sweep | --sweep] [--no-ffn | --ffn-only] [--ffn-rows M,...]
"""
from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.common import Row, bench, bench_graph, write_csv
from tensorfuse import dsl as T
from tensorfuse.errors import ScheduleError
from tensorfuse.targets import get_target

# rows M, depth K, columns N: the square case and the FFN's up-projection at two batch sizes
SHAPES = ((8192, 8192, 8192), (1024, 4096, 14336), (8192, 4096, 14336))
PROBES = ((8192, 512, 8192),)   # short K: the epilogue's share of the time is large
# knob sets besides tf.compile's defaults (cluster=2 split multicast, block_n=256, group_m=16,
# staged epilogue, split tail); --sweep times them all, by default only the first two
SWEEP = ({"split_tail": False}, {"epilogue": "direct"}, {"stages": 3}, {"cluster": 1},
         {"group_m": 8}, {"multicast": "leader"}, {"block_n": 128},
         {"block_n": 192, "multicast": "leader"}, {"cluster": 1, "consumers": 3, "block_n": 192})
ROUNDS = 3   # every implementation timed once per round, in turn: clock drift hits all alike


@tf.kernel
def matmul_nk(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["N", "K", "bf16"]):
    """``x · wᵀ`` with ``w`` as ``torch.nn.Linear`` stores it."""
    i, j, k = T.axes("i j k")
    return T.sum(x[i, k] * w[j, k], over=k)


@tf.kernel
def matmul_f16_f32(x: T.Tensor["M", "K", "f16"], w: T.Tensor["K", "N", "f16"]):
    """f16 operands, an f32 output, a scalar epilogue."""
    i, j, k = T.axes("i j k")
    return T.cast(T.sum(x[i, k] * w[k, j], over=k), "f32")


KERNELS = {"matmul": K.matmul, "matmul_nk": matmul_nk, "linear": K.linear,
           "swiglu_gate": K.swiglu_gate, "matmul_f16_f32": matmul_f16_f32}


def hopper(kernel, knobs: dict):
    return tf.schedule(kernel, "cuda").apply_template("hopper_gemm", **knobs).compile()


SECOND_WEIGHTS = ("w2", "down_proj")   # an FFN's second product sums over N, not K


def inputs(kernel, M: int, K_: int, N: int, gen, scale: float = 1.0, **more: int) -> dict:
    """Fresh random tensors for ``kernel`` (normal; weights scaled by 1/√(the size they are
    summed over), so outputs stay near 1; ``scale`` widens the rows' range; ``more``: further
    sizes, e.g. an FFN's O)."""
    sizes = {"M": M, "K": K_, "N": N, **more}
    made = {}
    for p in kernel.program.tensor_params:
        shape = tuple(sizes[str(d)] for d in p.dims)
        dtype = torch.float16 if p.dtype == "f16" else torch.bfloat16
        x = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32)
        fan_in = N if p.name in SECOND_WEIGHTS else K_
        made[p.name] = (x * (scale if p.name == "x" else 1.0 / math.sqrt(fan_in))).to(dtype)
    return made


def reference(name: str, t: dict) -> torch.Tensor:
    """The float64 result, from the same (rounded) inputs."""
    d = {n: v.double() for n, v in t.items()}
    if name in ("matmul", "matmul_f16_f32"):
        return d["x"] @ d["w"]
    if name == "matmul_nk":
        return d["x"] @ d["w"].T
    if name == "linear":
        return d["x"] @ d["weight"].T + d["bias"]
    gate = d["x"] @ d["w1"].T
    return gate * torch.sigmoid(gate) * (d["x"] @ d["w3"].T)


def run_checked(name: str, f, t: dict, ref: torch.Tensor) -> str | None:
    """Call ``f`` into a NaN-poisoned output followed by a NaN guard; None if every element is
    within tolerance (2⁻⁷ relative plus 2·10⁻³ of the largest magnitude: bf16 rounding of the
    output; a wrong tile or an unwritten element is off by the output's scale) and the guard is
    untouched, else what was wrong."""
    out_dtype = torch.float32 if name.endswith("f32") else \
        (torch.float16 if t["x"].dtype == torch.float16 else torch.bfloat16)
    M, N = ref.shape
    buffer = torch.full((M * N + 4096,), float("nan"), device="cuda", dtype=out_dtype)
    out = buffer[:M * N].view(M, N)
    f(**t, out=out)
    torch.cuda.synchronize()
    err = (out.double() - ref).abs()
    bound = 2.0 ** -7 * ref.abs() + 2e-3 * ref.abs().max()
    bad = ~(err <= bound)
    if not torch.isnan(buffer[M * N:]).all():
        return "wrote past the output"
    if bad.any():
        where = bad.nonzero()[:3].tolist()
        return (f"{int(bad.sum())} of {M * N} elements off (max error "
                f"{float(err.nan_to_num(float('inf')).max()):.3g}, first at {where})")
    return None


CHECKS = ([(n, s, {}) for n in KERNELS for s in ((200, 4096, 1024), (1000, 520, 776), (64, 64, 64),
                                                  (129, 1000, 136), (2048, 2048, 2048))]
          + [("matmul", (1000, 520, 776), k) for k in SWEEP]
          + [("matmul_nk", (333, 1024, 2048), k) for k in SWEEP]
          + [("matmul", (700, 776, 904), {"consumers": 1}), ("linear", (64, 256, 200), {}),
             ("matmul", (1000, 4096, 3000), {"cluster": 1}), ("swiglu_gate", (300, 8192, 520), {}),
             ("linear", (1000, 520, 776), {"epilogue": "staged"}),
             ("swiglu_gate", (200, 4096, 1024), {"epilogue": "staged"})]
          + [("swiglu_gate", (333, 1024, 2048), {"cluster": 2})]
          + [("linear", (1000, 4096, 1024), {"cluster": 2, "block_n": 128, "stages": 2})]
          # few rows, long K: every tile split along K into 4–16 pieces
          + [("matmul", (128, 14336, 4096), {}), ("matmul_nk", (100, 8192, 1000), {}),
             ("swiglu_gate", (128, 4096, 2048), {"block_n": 128})]
          # [N, K] weights in tiles of 224 or 160 columns (a narrower last 64-column chunk in
          # the staged epilogue; halves of 112 rows multicast), and the shape that picks 224
          + [("matmul_nk", (1000, 520, 776), {"block_n": 224}),
             ("linear", (333, 1024, 2000), {"block_n": 160}),
             ("linear", (700, 776, 904), {"block_n": 224, "cluster": 1}),
             ("matmul_nk", (1024, 4096, 14336), {}),
             # few rows, [N, K] weights: 112-column tiles filling one wave (one and two weights)
             ("matmul_nk", (128, 4096, 14336), {}),
             ("swiglu_gate", (100, 1024, 14336), {"block_n": 112})]
          # weights copied with the L2 evict-first policy, alone and multicast
          + [("matmul", (128, 4096, 1032), {"weights_l2": "evict_first"}),
             ("matmul_nk", (300, 520, 776), {"weights_l2": "evict_first", "cluster": 2}),
             ("swiglu_gate", (100, 1000, 1032), {"weights_l2": "evict_first"})]
          # CTAs paced to the grid's average: one tile each, split tiles (the pace counters
          # after theirs), several tiles a CTA
          + [("matmul", (128, 4096, 14336), {"pace": 4}),
             ("matmul_nk", (100, 8192, 1000), {"pace": 2}),
             ("linear", (1000, 520, 776), {"pace": 1, "cluster": 1})])

FFN_CHECKS = (("gelu", dict(M=300, K=520, N=1032, O=264), {}),
              ("swiglu", dict(M=1000, K=256, N=512, O=776), {}),
              ("gelu", dict(M=64, K=256, N=512, O=512), {"up": {"cluster": 1}}),
              ("swiglu", dict(M=333, K=1024, N=2048, O=512),
               {"up": {"epilogue": "direct"}, "down": {"cluster": 1, "block_n": 128}}),
              ("swiglu_linear", dict(M=1000, K=520, N=1032, O=264), {}),
              ("swiglu_linear", dict(M=2048, K=4096, N=1024, O=4096), {}),
              # the few-row shape (the second GEMM split along K), ragged rows with clusters
              ("gelu", dict(M=128, K=4096, N=14336, O=4096), {}),
              ("swiglu", dict(M=200, K=2048, N=4096, O=1024), {}),
              ("swiglu_linear", dict(M=128, K=1024, N=14336, O=512), {}),
              # weights read once copied L2 evict-first (the default at M=128 and, multicast,
              # at M=200) and with the normal policy
              ("gelu", dict(M=128, K=4096, N=14336, O=4096),
               {"up": {"weights_l2": "normal"}, "down": {"weights_l2": "normal"}}),
              ("swiglu_linear", dict(M=200, K=1024, N=4096, O=1032), {}),
              # CTAs paced to the grid's average (the default at M=128 is 2) in either GEMM
              ("gelu", dict(M=128, K=4096, N=14336, O=4096), {"up": {"pace": 4}}),
              ("swiglu", dict(M=200, K=1024, N=2048, O=520),
               {"up": {"pace": 2, "cluster": 1}, "down": {"pace": 8, "cluster": 1}}))


def check(log=print) -> int:
    """The correctness suite; returns the number of failures."""
    from tensorfuse.schedule_templates.hopper_ffn import hopper_ffn

    gen = torch.Generator(device="cuda").manual_seed(0)
    precompile([(KERNELS[n], k) for n, _, k in CHECKS])
    failures = 0
    for (name, (M, K_, N), knobs), scale in itertools.product(CHECKS, (1.0, 300.0)):
        t = inputs(KERNELS[name], M, K_, N, gen, scale)
        f, ref = hopper(KERNELS[name], knobs), reference(name, t)
        # twice where tiles are split: the second launch finds the counters the first reset
        problem = run_checked(name, f, t, ref) or (run_checked(name, f, t, ref) if M <= 256
                                                    else None)
        failures += _report(problem, f"{name} M={M} K={K_} N={N} {knobs} scale={scale}", log)
    for kind, sizes, knobs in FFN_CHECKS:
        # three calls on other inputs in turn (1, 30, 1): a second GEMM that read H before the
        # first wrote it would read the call before's H
        kernel = K.FFN_KERNELS[f"ffn_{kind}"]
        f = hopper_ffn(kernel, None, get_target("cuda"), **knobs)
        for scale in (1.0, 30.0, 1.0):
            t = inputs(kernel, sizes["M"], sizes["K"], sizes["N"], gen, scale, O=sizes["O"])
            problem = run_checked("ffn", f, t, ffn_reference(kind, t))
            failures += _report(problem, f"ffn_{kind} {sizes} {knobs} scale={scale}", log)
    return failures


def _report(problem: str | None, label: str, log) -> bool:
    """Log one check; whether it failed."""
    log(f"{'ok ' if problem is None else 'BAD'} {label}" + (f": {problem}" if problem else ""))
    return problem is not None


def in_turn(candidates: dict, name: str, t: dict, ref: torch.Tensor, baselines: dict,
            sizes: dict, label: str, log) -> dict:
    """Check every tensorfuse candidate (``{label: (kernel, call)}``; ``call(kernel, out)``)
    against ``ref`` at ``sizes`` (a wrong or refused one is logged and left out), then time it
    and the ``baselines`` (``{label: fn}``) in turn for :data:`ROUNDS` rounds: ``{label: (median
    ms, CUDA-graph ms, note)}`` (the note: tensorfuse's schedule origin)."""
    fns = {key: (fn, "") for key, fn in baselines.items()}
    M, N = ref.shape
    for key, (f, call) in candidates.items():
        try:
            problem = run_checked(name, f, t, ref)
        except Exception as exc:   # noqa: BLE001 - a refused knob set is reported, not fatal
            problem = f"{type(exc).__name__}: {str(exc)[:200]}"
        if problem:
            log(f"{label} {key}: WRONG or refused: {problem}")
            continue
        out = torch.empty(M, N, device="cuda", dtype=t["x"].dtype)
        fns[key] = ((lambda f=f, out=out: call(f, out)), f.schedule_origin(**sizes))
    times: dict = {key: [] for key in fns}
    for _ in range(ROUNDS):
        for key, (fn, _) in fns.items():
            times[key].append(bench(fn, rep_ms=100))
    return {key: (statistics.median(times[key]), bench_graph(fn, rep_ms=100), note)
            for key, (fn, note) in fns.items()}



def precompile(kernels_knobs, sizes=({"M": 8192, "K": 8192, "N": 8192},)) -> None:
    """nvcc every distinct source first, in parallel (cached by source): of ``hopper(kernel,
    knobs)`` for each pair, or of a compiled kernel given in place of the pair, at ``sizes``."""
    from tensorfuse.targets.cuda.module import cubin_for

    sources = {}
    for item in kernels_knobs:
        f = hopper(*item) if isinstance(item, tuple) else item
        for dims in sizes:
            chosen = f.for_sizes(**dims) if hasattr(f, "for_sizes") else f   # tf.compile's pick
            try:
                made = chosen.launches(**dims).sources if hasattr(chosen, "launches") else ()
            except ScheduleError:   # a knob set this layout refuses: reported when it is timed
                continue
            for src in made:
                sources[src] = f.target
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda item: cubin_for(*item), sources.items()))


FFN_SHAPE = dict(K=4096, N=14336, O=4096)
FFN_ROWS = (1024, 8192, 128)


def ffn_reference(kind: str, t: dict) -> torch.Tensor:
    """The FFN in float64 from the same inputs (the DSL's tanh GELU; SwiGLU)."""
    d = {n: v.double() for n, v in t.items()}
    if kind == "swiglu_linear":   # weights [out, in]
        gate = d["x"] @ d["gate_proj"].T
        return (gate * torch.sigmoid(gate) * (d["x"] @ d["up_proj"].T)) @ d["down_proj"].T
    if kind == "gelu":
        h = d["x"] @ d["w1"]
        h = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * h ** 3)))
    else:
        gate = d["x"] @ d["w1"]
        h = gate * torch.sigmoid(gate) * (d["x"] @ d["w3"])
    return h @ d["w2"]


def ffn_variant(knobs: dict) -> tuple[str, dict]:
    """One ``--ffn-knobs`` set → (its label, :func:`hopper_ffn`'s keyword arguments): a plain
    knob goes to both GEMMs, ``up.<knob>`` / ``down.<knob>`` to one of them, ``dependent`` to the
    FFN itself."""
    split = {"up": {}, "down": {}}
    extra = {}
    for name, value in knobs.items():
        gemm, _, knob = name.rpartition(".")
        if name == "dependent":
            extra[name] = value
        elif gemm in split:
            split[gemm][knob] = value
        else:
            split["up"][name] = split["down"][name] = value
    label = "tensorfuse_hopper_ffn " + ",".join(f"{k}={v}" for k, v in knobs.items())
    return label, {**split, **extra}


def ffn(rows=FFN_ROWS, log=print, knob_sets: tuple = ()) -> list[Row]:
    """The FFN blocks (GELU and SwiGLU, K=4096, N=14336, O=4096) at each M: torch eager (cuBLAS
    and PyTorch's activation kernels), torch.compile, ``tf.compile`` (the Hopper FFN above 32
    rows) and the Hopper FFN template at every M (and with each of ``knob_sets``:
    :func:`ffn_variant`); checked against float64 first, timed in turn over :data:`ROUNDS`
    rounds."""
    from benchmarks.cluster import ffn_eager as ffn_eager_in_out
    from tensorfuse.schedule_templates.hopper_ffn import hopper_ffn

    def ffn_eager(kind):
        if kind != "swiglu_linear":
            return ffn_eager_in_out(kind)
        F = torch.nn.functional   # Llama's MLP: weights as nn.Linear keeps them
        return lambda x, g, u, d: F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d)

    gen = torch.Generator(device="cuda").manual_seed(2)
    out_rows = []
    kernels = {"gelu": K.ffn_gelu, "swiglu": K.ffn_swiglu, "swiglu_linear": K.ffn_swiglu_linear}
    variants = [ffn_variant(k) for k in knob_sets]
    made = {kind: (auto, hopper_ffn(kernel, None, auto.target)) + tuple(
                hopper_ffn(kernel, None, auto.target, **kw) for _, kw in variants)
            for kind, kernel in kernels.items() for auto in (tf.compile(kernel),)}
    precompile([f for fs in made.values() for f in fs], [{"M": m, **FFN_SHAPE} for m in rows])
    for kind, M in itertools.product(kernels, rows):
        kernel = kernels[kind]
        t = inputs(kernel, M, FFN_SHAPE["K"], FFN_SHAPE["N"], gen, O=FFN_SHAPE["O"])
        eager = ffn_eager(kind)
        args = [t[p.name] for p in kernel.program.tensor_params]
        compiled = torch.compile(eager)
        compiled(*args)
        call = lambda f, out: f(*args, out=out)  # noqa: E731
        ours = {"tensorfuse": (made[kind][0], call), "tensorfuse_hopper_ffn": (made[kind][1], call)}
        for x, (label, _) in enumerate(variants):
            ours[label] = (made[kind][2 + x], call)
        timed = in_turn(ours,
                        "ffn", t, ffn_reference(kind, t),
                        {"torch_eager": lambda: eager(*args),
                         "torch.compile": lambda: compiled(*args)},
                        {"M": M, **FFN_SHAPE}, f"ffn_{kind} M={M}", log)
        gates = 1 if kind == "gelu" else 2
        flops = 2.0 * M * FFN_SHAPE["N"] * (gates * FFN_SHAPE["K"] + FFN_SHAPE["O"])
        eager_ms = timed["torch_eager"][0]
        for label, (ms, graph, note) in timed.items():
            note = note or ("cuBLAS + PyTorch's activation kernels" if label == "torch_eager"
                            else "")
            out_rows.append(Row(f"ffn_{kind}", f"M={M}", label, ms, flops / ms / 1e9, 0.0, 0.0,
                                f"graph {graph:.4f} ms; {eager_ms / ms:.3f}x torch eager"
                                + (f"; {note}" if note else "")))
            log(f"ffn_{kind:7s} M={M:5d} {label:24s} {ms:8.4f} ms (graph {graph:.4f}) "
                f"{eager_ms / ms:.3f}x eager")
    return out_rows


def _row(shape: str, impl: str, ms: float, graph_ms: float, flops: float, cublas_ms: float | None,
         ceiling: float, note: str = "") -> Row:
    tflops = flops / ms / 1e9
    ratio = f"; {cublas_ms / ms:.3f}x cuBLAS" if cublas_ms else ""
    return Row("gemm", shape, impl, ms, tflops, 0.0, tflops / ceiling,
               f"graph {graph_ms:.4f} ms{ratio}" + (f"; {note}" if note else ""))


def timed(shapes=SHAPES, sweep: tuple = SWEEP[:2], log=print) -> list[Row]:
    """For each shape and weight layout: cuBLAS, torch.compile, ``tf.compile``'s defaults and (with
    ``sweep``) the knob sets given, each tensorfuse kernel checked first; each timed
    in turn for :data:`ROUNDS` rounds (the median), so that the GPU's clock drift under a long
    run of GEMMs is shared by all (one config measured 609 and 572 TFLOP/s first and later in one
    run, 2026-11-24)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    F = torch.nn.functional
    rows = []
    layouts = {"kn": (K.matmul, lambda x, w: x @ w), "nk": (matmul_nk, lambda x, w: F.linear(x, w))}
    precompile([(k, s) for k, _ in layouts.values() for s in sweep])
    for (M, K_, N), (layout, (kernel, eager)) in itertools.product(shapes, layouts.items()):
        shape = f"{M}x{K_}x{N}/{layout}"
        name = "matmul" if layout == "kn" else "matmul_nk"
        t = inputs(kernel, M, K_, N, gen)
        ref = reference(name, t)
        flops = 2.0 * M * N * K_
        x, w = t["x"], t["w"]
        call = lambda f, out: f(x, w, out=out)  # noqa: E731
        candidates = {"tensorfuse": (tf.compile(kernel), call)}
        candidates.update({f"tensorfuse_hopper[{','.join(f'{k}={v}' for k, v in s.items())}]":
                           (hopper(kernel, s), call) for s in sweep})
        compiled = torch.compile(eager)
        compiled(x, w)
        timed = in_turn(candidates, name, t, ref, {"cublas": lambda: eager(x, w),
                                                   "torch.compile": lambda: compiled(x, w)},
                        {"M": M, "K": K_, "N": N}, shape, log)
        cublas = timed["cublas"][0]
        for label, (ms, graph, note) in timed.items():
            rows.append(_row(shape, label, ms, graph, flops, None if label == "cublas" else cublas,
                             flops / cublas / 1e9, note or ("torch eager" if label == "cublas"
                                                             else "")))
            r = rows[-1]
            log(f"{r.shape:24s} {r.implementation:56s} {r.ms:8.4f} ms {r.tflops:6.1f} TFLOP/s "
                + " ".join(r.note.split(";")[:2]))
    return rows


def parse_knobs(text: str) -> dict:
    """``"block_n=128,split_tail=False"`` → ``{"block_n": 128, "split_tail": False}``."""
    values = {"True": True, "False": False}
    knobs = {}
    for item in filter(None, text.split(",")):
        name, value = item.split("=")
        value = value.strip()
        knobs[name.strip()] = values.get(value, int(value) if value.isdigit() else value)
    return knobs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="correctness suite only")
    ap.add_argument("--csv", help="write the timed rows here")
    ap.add_argument("--shapes", help="MxKxN,... (default: the issue's three and a short-K probe)")
    ap.add_argument("--no-sweep", action="store_true", help="defaults only")
    ap.add_argument("--sweep", action="store_true", help="every knob set of SWEEP")
    ap.add_argument("--knobs", help="knob sets to time besides the defaults, e.g. "
                                    "'block_n=128;block_n=64,split_tail=False'")
    ap.add_argument("--no-ffn", action="store_true", help="GEMMs only")
    ap.add_argument("--ffn-only", action="store_true", help="the FFN blocks only")
    ap.add_argument("--ffn-rows", help="M values of the FFN blocks (default 1024,8192,128)")
    ap.add_argument("--ffn-knobs", help="also time the Hopper FFN with each of these knob sets "
                                        "(';' between sets): a knob for both GEMMs, or 'up.' / "
                                        "'down.' before it for one, e.g. 'block_n=128,stages=4;"
                                        "down.weights_l2=normal' (and the FFN's 'dependent=False')")
    args = ap.parse_args(argv)
    if args.check:
        bad = check()
        print(f"{bad} wrong")
        return int(bad > 0)
    shapes = SHAPES + PROBES if not args.shapes else tuple(
        tuple(int(v) for v in s.split("x")) for s in args.shapes.split(","))
    sweep = () if args.no_sweep else SWEEP if args.sweep else SWEEP[:2]
    if args.knobs:
        sweep = tuple(parse_knobs(k) for k in args.knobs.split(";"))
    rows = [] if args.ffn_only else timed(shapes, sweep=sweep)
    if not args.no_ffn:
        knob_sets = tuple(parse_knobs(k) for k in args.ffn_knobs.split(";")) \
            if args.ffn_knobs else ()
        rows += ffn(tuple(int(m) for m in args.ffn_rows.split(",")) if args.ffn_rows
                    else FFN_ROWS, knob_sets=knob_sets)
    if args.csv:
        write_csv(rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
