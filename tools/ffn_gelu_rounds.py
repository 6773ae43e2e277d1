"""Issue 18's last bar on its own: the GELU FFN (K=4096, N=14336, O=4096) at M=8192 through
``tf.compile`` against torch eager, checked against float64 first, then timed in turn for
``--rounds`` rounds by ``do_bench`` (L2 flushed) and by CUDA-graph replay: medians and each
round's ratio. Lean enough to run in the last minutes of a session's device time (no
torch.compile, one kernel).

    python tools/ffn_gelu_rounds.py [--rows 8192] [--rounds 7]
"""
from __future__ import annotations

import argparse
import statistics

import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.cluster import ffn_eager
from benchmarks.common import bench, bench_graph
from benchmarks.gemm import FFN_SHAPE, ffn_reference, inputs, precompile, run_checked


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    M, sizes = args.rows, {"M": args.rows, **FFN_SHAPE}
    f = tf.compile(K.ffn_gelu, "cuda")
    precompile([f], [sizes])
    gen = torch.Generator(device="cuda").manual_seed(36)
    t = inputs(K.ffn_gelu, M, FFN_SHAPE["K"], FFN_SHAPE["N"], gen, O=FFN_SHAPE["O"])
    args_ = [t[p.name] for p in K.ffn_gelu.program.tensor_params]
    problem = run_checked("ffn", f, t, ffn_reference("gelu", t))
    print(f"tf.compile: {f.for_sizes(**sizes).description}; check: {problem or 'ok'}")
    if problem:
        return 1
    eager = ffn_eager("gelu")
    out = torch.empty(M, FFN_SHAPE["O"], device="cuda", dtype=torch.bfloat16)
    fns = {"torch_eager": lambda: eager(*args_), "tensorfuse": lambda: f(*args_, out=out)}
    times = {name: ([], []) for name in fns}
    for r in range(args.rounds):
        for name, fn in fns.items():
            times[name][0].append(bench(fn, rep_ms=100))
            times[name][1].append(bench_graph(fn, rep_ms=100))
        print(f"round {r}: do_bench {times['torch_eager'][0][-1] / times['tensorfuse'][0][-1]:.3f}x"
              f", graphs {times['torch_eager'][1][-1] / times['tensorfuse'][1][-1]:.3f}x eager")
    med = {name: tuple(statistics.median(x) for x in pair) for name, pair in times.items()}
    for name, (ms, graph) in med.items():
        print(f"ffn_gelu M={M} {name:12s} do_bench {ms:.4f} ms, graphs {graph:.4f} ms")
    print(f"medians: tensorfuse {med['torch_eager'][0] / med['tensorfuse'][0]:.3f}x eager by "
          f"do_bench, {med['torch_eager'][1] / med['tensorfuse'][1]:.3f}x in graphs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
