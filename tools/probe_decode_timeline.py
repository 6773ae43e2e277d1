"""Where a packed decode's time goes on the GPU: the Hopper attention kernel on a group's heads
as rows (``packed_attention``) with ``%globaltimer`` read in each CTA's first consumer thread at
its start, when its queries land, when its first key/value slot lands, at the end of its key
loop, after the split pieces' merge, and at its end; printed per CTA and summarised as times from
the first CTA's start, with the key loop's time per block. With the cache small enough to stay in
L2 (``--no-flush``, a few CTAs) the loop's time per block is the consumers' own pace; with a
cache past L2 it is the pace of the slower of them and the memory. The probe patches the
generated source, so it measures this checkout's kernel; printf makes it a little slower.

    PYTHONPATH=. python tools/probe_decode_timeline.py --batch 16 --keys 16384 \\
        --knobs consumers=1,block_n=64 | python tools/probe_decode_timeline.py --summarise
    ... --batch 1 --keys 32768 --knobs ctas=16,consumers=1 --no-flush   # the consumers' pace
    ... --build-only   # the patched kernel's cubin into $TENSORFUSE_CACHE (no GPU needed)
"""
import argparse
import importlib
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from timeline_clock import CLOCK, print_quantiles  # noqa: E402

EVENTS = ("start", "queries", "first slot", "loop end", "merged", "end")
EDITS = (
    ('extern "C" __global__', CLOCK + 'extern "C" __global__'),
    ("  tf_setmaxnreg_inc<CONSUMER_REGS>();\n",
     "  tf_setmaxnreg_inc<CONSUMER_REGS>();\n  const unsigned long long tr_start = tf_gtime();\n"
     "  unsigned long long tr_q = 0, tr_first = 0, tr_loop = 0, tr_merge = 0;\n"
     "  int tr_n = 0;\n"),
    # the first slot: waited for twice (here and by the first q·kᵀ), the same phase both times
    ("    tf_mbar_wait(bar_q, k & 1);\n",
     "    tf_mbar_wait(bar_q, k & 1);\n    if (!tr_q) tr_q = tf_gtime();\n"
     "    if (w.count > 0 && !tr_first) {\n"
     "      tf_mbar_wait(full_k + SLOT(0), PHASE(0));\n"
     "      tf_mbar_wait(full_v + SLOT(0), PHASE(0));\n"
     "      tr_first = tf_gtime();\n    }\n    tr_n += w.count;\n"),
    ("    } else {\n      tf_mbar_arrive(q_free);",
     "      tr_loop = tf_gtime();\n    } else {\n      tf_mbar_arrive(q_free);"),
    # after the statement that merges a split tile's pieces
    ("work, counters, flags);\n", "work, counters, flags);\n    tr_merge = tf_gtime();\n"),
    ("  write_out();   // the last tile's\n",
     "  write_out();   // the last tile's\n"
     '  if (threadIdx.x == 128) printf("TR %d %u %d %llu %llu %llu %llu %llu %llu\\n", '
     "(int)blockIdx.x, tf_smid(), tr_n, tr_start, tr_q, tr_first, tr_loop, tr_merge, "
     "tf_gtime());\n"),
)


def traced(source: str) -> str:
    """``source`` with the timer reads (an error where the emitter no longer has a spot)."""
    for old, new in EDITS:
        if source.count(old) != 1:
            raise SystemExit(f"the emitter changed: {old.strip()[:60]!r} is not there once")
        source = source.replace(old, new)
    return source


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=64, help="query heads on one kv-head")
    ap.add_argument("--keys", type=int, default=16384)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--knobs", default="consumers=1", help="the kernel's, e.g. 'block_n=64'")
    ap.add_argument("--no-flush", action="store_true",
                    help="leave L2 as the previous call left it (a small cache stays there)")
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args(argv)
    import torch

    import tensorfuse.kernels as K
    from benchmarks.gemm import parse_knobs
    from tensorfuse.schedule_templates.fusion import Fusion
    from tensorfuse.schedule_templates.packed_kernel import packed_attention
    from tensorfuse.targets import get_target
    # the package exports a function of the module's name: the module itself, by its path
    template = importlib.import_module("tensorfuse.schedule_templates.hopper_attention")
    original = template.hopper_attention_source
    template.hopper_attention_source = lambda *a, **k: traced(original(*a, **k))
    made = packed_attention(K.gqa_attention, Fusion(("m", "l", "o"), "j", 32),
                            get_target("cuda:sm_90a"), **parse_knobs(args.knobs))
    B, H, N, D = args.batch, args.heads, args.keys, args.head_dim
    if args.build_only:
        from tensorfuse.targets.cuda.module import cubin_for
        cubin_for(made.source(B=B, H=H, HKV=1, M=1, N=N, D=D), made.target)
        return 0
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, 1, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for call in range(3):
        if not args.no_flush:
            flush.zero_()
        torch.cuda.synchronize()
        print(f"CALL {call}", flush=True)
        made(q, k, v, D ** -0.5)
        torch.cuda.synchronize()
        sys.stdout.flush()
    return 0


def summarise(lines) -> None:
    """The last call's lines (from stdin): quantiles of each event in µs, and the key loop's
    time per block (from the first slot's arrival to the last block's end: every block's
    products and softmax lie in that span)."""
    start = max(i for i, ln in enumerate(lines) if ln.startswith("CALL"))
    rows = [[int(x) for x in ln.split()[1:]] for ln in lines[start + 1:] if ln.startswith("TR")]
    t0 = min(r[3] for r in rows)
    print(f"{len(rows)} CTAs, key blocks each: {sorted({r[2] for r in rows})} "
          "(µs from the first CTA's start)")
    for k, name in enumerate(EVENTS):
        print_quantiles(name, [r[3 + k] for r in rows], t0, 11)
    per = [(r[6] - r[5]) / 1e3 / r[2] for r in rows if r[5] and r[2]]
    if per:
        print(f"  key loop per block: median {statistics.median(per):.3f} µs, "
              f"max {max(per):.3f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--summarise":
        summarise(sys.stdin.read().splitlines())
        sys.exit(0)
    sys.exit(main())
