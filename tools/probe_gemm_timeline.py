"""Where the few-row FFN's time goes on the GPU (issue 18): the Hopper FFN's two GEMMs with
``%globaltimer`` read at each CTA's start, its first k-block's arrival, the end of its last
k-loop and its end (and, in the second GEMM, when its wait for the first returns), printed per
CTA and summarised as times from the first GEMM's first CTA start. The probe patches the
generated source (``hopper_gemm_source``), so it measures this checkout's kernels; printf in
the kernels makes them a little slower than the real ones.

    PYTHONPATH=. python tools/probe_gemm_timeline.py [--rows 128] [--kind gelu] [--up block_n=64]
        [--down weights_l2=normal]
    ... | python tools/probe_gemm_timeline.py --summarise
"""
import argparse
import importlib
import os
import sys

import torch

import tensorfuse.kernels as K
from benchmarks.gemm import inputs
from tensorfuse.schedule_templates.hopper_ffn import hopper_ffn
from tensorfuse.targets import get_target

sys.path.insert(0, os.path.dirname(__file__))
from timeline_clock import CLOCK, print_quantiles  # noqa: E402

EDITS = (
    ('extern "C" __global__', CLOCK + 'extern "C" __global__'),
    ("  const void* a_map = maps;\n",
     "  const void* a_map = maps;\n  const unsigned long long tr_start = tf_gtime();\n"
     "  unsigned long long tr_first = 0, tr_loop = 0, tr_dep = 0;\n"),
    ("      tf_wait_prerequisite();   // the rows operand is the kernel before's output: read after it\n",
     "      tf_wait_prerequisite();   // the rows operand is the kernel before's output: read after it\n"
     "      tr_dep = tf_gtime();\n"),
    ("        tf_mbar_wait(full + s, (it / STAGES) & 1);\n",
     "        tf_mbar_wait(full + s, (it / STAGES) & 1);\n        if (it == 0) tr_first = tf_gtime();\n"),
    ("      tf_wgmma_wait<0>();\n", "      tf_wgmma_wait<0>();\n      tr_loop = tf_gtime();\n"),
)
TAIL = "#if CLUSTER > 1\n  tf_cluster_sync();   // no CTA leaves"
PRINT = ('  if (threadIdx.x == 128) printf("TR %d %d %llu %llu %llu %llu %u\\n", DEPENDENT, '
         '(int)blockIdx.x, tr_start, tr_first, tr_loop, tf_gtime(), tf_smid());\n'
         '  if (threadIdx.x == 0 && DEPENDENT) printf("TD %d %llu\\n", (int)blockIdx.x, tr_dep);\n')


def traced(source: str) -> str:
    for old, new in EDITS:
        if source.count(old) != 1:
            raise SystemExit(f"the emitter changed: {old.strip()[:60]!r} is not there once")
        source = source.replace(old, new)
    if source.count(TAIL) != 1:
        raise SystemExit("the emitter changed: the kernel's end is not there once")
    return source.replace(TAIL, PRINT + TAIL)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--kind", default="gelu")
    ap.add_argument("--up", default="", help="the first GEMM's knobs, e.g. 'block_n=64'")
    ap.add_argument("--down", default="", help="the second GEMM's knobs")
    args = ap.parse_args(argv)
    from benchmarks.gemm import parse_knobs
    # the package exports a function of the module's name: the module itself, by its path
    template = importlib.import_module("tensorfuse.schedule_templates.hopper_gemm")
    original = template.hopper_gemm_source
    template.hopper_gemm_source = lambda *a, **k: traced(original(*a, **k))
    kernel = K.FFN_KERNELS[f"ffn_{args.kind}"]
    f = hopper_ffn(kernel, None, get_target("cuda"), up=parse_knobs(args.up) or None,
                   down=parse_knobs(args.down) or None)
    gen = torch.Generator(device="cuda").manual_seed(0)
    t = inputs(kernel, args.rows, 4096, 14336, gen, 1.0, O=4096)
    out = torch.empty(args.rows, 4096, dtype=torch.bfloat16, device="cuda")
    for call in range(3):
        print(f"CALL {call}", flush=True)
        f(**t, out=out)
        torch.cuda.synchronize()
        sys.stdout.flush()
    return 0


def summarise(lines) -> None:
    """The last call's lines (from stdin): per GEMM, quantiles of each event in µs."""
    start = max(i for i, ln in enumerate(lines) if ln.startswith("CALL"))
    rows = [ln.split() for ln in lines[start + 1:] if ln.startswith(("TR", "TD"))]
    tr = [(int(r[1]), int(r[2]), *map(int, r[3:])) for r in rows if r[0] == "TR"]
    td = {int(r[1]): int(r[2]) for r in rows if r[0] == "TD"}
    t0 = min(r[2] for r in tr if r[0] == 0)
    for dep in (0, 1):
        mine = [r for r in tr if r[0] == dep]
        if not mine:
            continue
        print(f"GEMM {dep + 1}: {len(mine)} CTAs (µs from the first GEMM's first CTA start)")
        events = {"start": [r[2] for r in mine], "first k-block": [r[3] for r in mine],
                  "k-loop done": [r[4] for r in mine], "end": [r[5] for r in mine]}
        if dep:
            events["wait returned"] = [td[r[1]] for r in mine if r[1] in td]
        # the slowest k-loops: which tile (blockIdx) on which SM (older logs have no
        # SM) — they change between runs, with more overlap than chance
        late = sorted(mine, key=lambda r: -r[4])[:12]
        print("  slowest k-loops (tile@SM: µs): " + ", ".join(
            f"{r[1]}@{r[6] if len(r) > 6 else '?'}: {(r[4] - t0) / 1e3:.1f}" for r in late))
        for name, values in events.items():
            print_quantiles(name, values, t0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--summarise":
        summarise(sys.stdin.read().splitlines())
        sys.exit(0)
    sys.exit(main())
