"""Where a Hopper attention tile's time goes: the kernel this checkout generates, with clock
stamps (SM cycles) written by the producer thread and the first thread of each consumer
warpgroup at a tile's boundaries, and the cycles each consumer waited in the loop (for its
turn on the tensor cores, for keys/values to land, for q·kᵀ), into the split schedule's
workspace argument (unused by the dynamic schedule this runs). A probe: the stamps perturb the
kernel a little; the output is checked against float64 all the same.

    python tools/probe_trace.py [--variant full] [--sizes 4096,16384] [--csv PATH]
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from benchmarks.attention import make_case, variants
from benchmarks.hopper_attention import hopper
from tensorfuse.binding import bind_call
from tensorfuse.schedule_templates.hopper_attention_plan import split_workspace
from tensorfuse.targets.cuda.kernel import pointer

KMAX, SLOTS = 24, 48          # items a CTA records, stamps an item
PRODUCER, CONSUMER0, PER_WG = 0, 4, 20
PROBE_IT = 10                 # the loop block stamped step by step
STEPS = ("step begins", "turn taken", "q·kᵀ issued", "p·v issued", "q·kᵀ in", "softmax done",
         "p·v in", "step done")
EVENTS = ("tile known", "queries in", "first turn", "q·kᵀ(0) in", "loop done", "last turn",
          "last p·v in", "epilogue done")
ACCUMULATED = ("turn waits", "k/v waits", "blocks", "q·kᵀ waits")


def _sub(source: str, old: str, new: str, count: int = 1) -> str:
    assert source.count(old) == count, (old[:80], source.count(old))
    return source.replace(old, new)


def _call_end(text: str, start: int) -> int:
    """Index of the `;` closing the call that begins at ``start`` (parentheses balanced)."""
    depth, i = 0, text.index("(", start)
    while True:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text.index(";", i)
        i += 1


# Probes of what bounds the loop (wrong results: timed only): "noexp" replaces each exp2 of the
# softmax by a multiply (no MUFU), "nosoftmax" also drops the row maxima (the loop is then the
# products, the score, P's packing and the barriers)
PATCHES = {
    "noexp": [("    s[r] = tf_exp2(fmaf(s[r], k, -mx[(r % 4) / 2]));",
               "    s[r] = fmaf(s[r], k, -mx[(r % 4) / 2]) * 0.0009765625f;")],
    "nosoftmax": [("    s[r] = tf_exp2(fmaf(s[r], k, -mx[(r % 4) / 2]));",
                   "    s[r] = fmaf(s[r], k, -mx[(r % 4) / 2]) * 0.0009765625f;"),
                  ("for (int r = 0; r < R; ++r) mx[(r % 4) / 2] = fmaxf(mx[(r % 4) / 2], s[r]);",
                   "for (int r = 0; r < R; ++r) {}")],
}


def traced(source: str, patch: str | None = None, trace_at: int = 0) -> str:
    """``source`` with the stamps (see the module docstring), and the probe ``patch``;
    ``trace_at``: where the stamps begin in the workspace (in words: past the split schedule's
    partial states)."""
    s = source.replace("#define D_ ", f"#define TRACE_AT {trace_at}\n#define D_ ", 1)
    for old, new in PATCHES.get(patch, []):
        s = _sub(s, old, new)
    s = _sub(s, "  const int wg = threadIdx.x / 128;\n",
             "  const int wg = threadIdx.x / 128;\n"
             "  unsigned* trace = (unsigned*)work + TRACE_AT + blockIdx.x * (KMAX_ + 1) * SLOTS_;\n"
             "  const unsigned t_start = clock();\n"
             "  unsigned long long g_start;\n"
             "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(g_start));\n"
             "  unsigned acc_turn = 0, acc_data = 0, acc_w1 = 0, n_blocks = 0;\n"
             "#define STAMP(k, slot) if ((k) < KMAX_) trace[(k) * SLOTS_ + (slot)] = clock() -"
             " t_start\n"
             "#define TIMED(acc, stmt) { const unsigned c_ = clock(); stmt; acc += clock() -"
             " c_; }\n")
    s = _sub(s, "#define TURN_BEGIN tf_turn_wait(cw);", "#define TURN_BEGIN TIMED(acc_turn,"
                                                        " tf_turn_wait(cw))")
    s = _sub(s, "#define D_ ", "#define KMAX_ %d\n#define SLOTS_ %d\n#define PROBE_IT"
                               " %d\n#define D_ "
             % (KMAX, SLOTS, PROBE_IT))
    # the macros in the generated source sit on one line each
    s = _sub(s, "tf_mbar_wait(full_k + SLOT(it), PHASE(it));",
             "TIMED(acc_data, tf_mbar_wait(full_k + SLOT(it), PHASE(it)));")
    s = _sub(s, "tf_mbar_wait(full_v + SLOT(it), PHASE(it));",
             "TIMED(acc_data, tf_mbar_wait(full_v + SLOT(it), PHASE(it)));")
    first = s.index("#define STEP(it, acc, mma, keys)")
    end = s.index("\n", first)
    b = "if ((it) == PROBE_IT && t == 0) STAMP(k, %d + cw * %d + 12 + %%d);" % (CONSUMER0, PER_WG)
    step = s[first:end]
    body = step.index("{")
    step = step[:body + 1] + " " + b % 0 + step[body + 1:]
    for n, anchor in enumerate(("TURN_BEGIN", "ISSUE_S_INTO(acc, mma, it);", "TURN_END"), 1):
        at = step.index(anchor) + len(anchor)
        step = step[:at] + " " + b % n + step[at:]
    at = step.index("tf_wgmma_wait<", step.index("TURN_END"))
    close = step.index(";", at) + 1
    step = step[:at] + "TIMED(acc_w1, " + step[at:close - 1] + "); ++n_blocks; " + b % 4 + \
        step[close:]
    at = _call_end(step, step.index("SOFTMAX_INTO(")) + 1   # past its `;`
    step = step[:at] + " " + b % 5 + step[at:]
    at = step.index("tf_wgmma_wait<0>();", at) + len("tf_wgmma_wait<0>();")
    step = step[:at] + " " + b % 6 + step[at:]
    at = step.index("pack_p(acc, p);") + len("pack_p(acc, p);")
    step = step[:at] + " " + b % 7 + step[at:]
    s = s[:first] + step + s[end:]
    # producer
    s = _sub(s, "        const int c = claim_tile(claim, mode, counters, works);",
             "        STAMP(k, 0);\n        const int c = claim_tile(claim, mode, counters,"
             " works);\n"
             "        STAMP(k, 1);")
    s = _sub(s, "            tf_mbar_wait(q_free, (k - 1) & 1);\n",
             "            tf_mbar_wait(q_free, (k - 1) & 1);\n            STAMP(k, 2);\n")
    s = _sub(s, "          use += w.count;\n        }", "          use += w.count;\n         "
                                                        " STAMP(k, 3);\n        }")
    s = _sub(s, "      // the last CTA out resets the counters for the next launch\n",
             "      unsigned long long g_end;\n"
             "      asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(g_end));\n"
             "      trace[KMAX_ * SLOTS_ + 0] = (unsigned)g_start; trace[KMAX_ * SLOTS_ + 1] ="
             " g_start >> 32;\n"
             "      trace[KMAX_ * SLOTS_ + 2] = (unsigned)g_end; trace[KMAX_ * SLOTS_ + 3] ="
             " g_end >> 32;\n"
             "      trace[KMAX_ * SLOTS_ + 4] = k;\n"
             "      // the last CTA out resets the counters for the next launch\n")
    # consumers: thread 0 of each warpgroup stamps
    c = "if (t == 0) STAMP(k, %d + cw * %d + %%d)" % (CONSUMER0, PER_WG)
    s = _sub(s, "    tf_mbar_wait(tile_full + (k & 1), (k >> 1) & 1);\n",
             "    tf_mbar_wait(tile_full + (k & 1), (k >> 1) & 1);\n    %s;\n"
             "    acc_turn = acc_data = acc_w1 = n_blocks = 0;\n" % (c % 0))
    s = _sub(s, "    tf_mbar_wait(bar_q, k & 1);\n", "    tf_mbar_wait(bar_q, k & 1);\n   "
                                                     " %s;\n" % (c % 1))
    first = s.index("#define FIRST(acc, mma, keys)")   # a tile's first block (one line)
    end = s.index("\n", first)
    line = s[first:end].replace("TURN_BEGIN", "TURN_BEGIN %s;" % (c % 2), 1)
    line = line.replace("tf_wgmma_wait<0>();", "tf_wgmma_wait<0>(); %s;" % (c % 3), 1)
    s = s[:first] + line + s[end:]
    s = _sub(s, "      TURN_BEGIN\n      ISSUE_O(w.count - 1, LAST_STEPS(w.count - 1));\n",
             "      %s;\n      TURN_BEGIN\n      %s;\n      ISSUE_O(w.count - 1,"
             " LAST_STEPS(w.count - 1));\n"
             % (c % 4, c % 5))
    s = _sub(s, "      tf_wgmma_wait<0>();\n      tf_fence_regs(o);\n     "
                " tf_mbar_arrive(empty_v + SLOT(w.count - 1));\n    }",
             "      tf_wgmma_wait<0>();\n      tf_fence_regs(o);\n      %s;\n"
             "      tf_mbar_arrive(empty_v + SLOT(w.count - 1));\n    }" % (c % 6))
    s = _sub(s, "#if !DEFER\n    write_out();\n#endif\n  }\n",
             "#if !DEFER\n    write_out();\n#endif\n    %s;\n"
             "    if (t == 0 && k < KMAX_) {\n"
             "      trace[k * SLOTS_ + %d + cw * %d + 8] = acc_turn; trace[k * SLOTS_ + %d + cw"
             " * %d + 9] = acc_data;\n"
             "      trace[k * SLOTS_ + %d + cw * %d + 10] = n_blocks; trace[k * SLOTS_ + %d +"
             " cw * %d + 11] = acc_w1;\n"
             "    }\n  }\n" % ((c % 7,) + (CONSUMER0, PER_WG) * 4))
    return s


class _WorkRedirected:
    """The built module, its kernel called with ``work`` (argument 10) replaced."""

    def __init__(self, functions, work):
        self.functions, self.work = functions, work

    def __getitem__(self, name):
        fn = self.functions[name]

        def call(*args):
            args = list(args)
            args[10] = pointer(self.work)
            return fn(*args)
        return call


def run(name: str, S: int, log=print, patch: str | None = None,
        schedule: str = "dynamic") -> list[dict]:
    spec = variants(S)[name]
    gen = torch.Generator().manual_seed(0)
    case = make_case(name, spec, S, gen, check_rows=64)
    kernel, extra = spec[0], dict(spec[1])
    f = hopper(kernel, schedule=schedule)
    args = dict(extra, scale=case.scale)
    bound = bind_call(f.program, (case.q, case.k, case.v), args, "cuda")
    launches = f.launches(bound.scalars, **bound.dims)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    at = split_workspace(launches.knobs, sms, case.q.shape[-1]) if schedule == "split" else 0
    launches.source = traced(launches.source, patch, at)
    launches.module = None
    launches.build(f.target)
    work = torch.zeros(at + sms * 2 * (KMAX + 1) * SLOTS, dtype=torch.int32, device="cuda")
    launches.module = _WorkRedirected(launches.module, work)
    out = f(case.q, case.k, case.v, **args)
    err = float((out[:, :, case.rows].double() - case.ref).abs().max() / case.ref.abs().max())
    for _ in range(5):
        f(case.q, case.k, case.v, **args)
    work.zero_()
    f(case.q, case.k, case.v, **args)
    torch.cuda.synchronize()
    t = work[at:].view(-1, KMAX + 1, SLOTS).cpu().numpy().astype("int64") & 0xFFFFFFFF
    ctas = [c for c in range(t.shape[0]) if t[c, KMAX, 4] > 0]
    log(f"{name} S={S} {schedule}{' ' + patch if patch else ''}: error {err:.1e} (bf16 bar 2e-2"
        f"{'; a probe: wrong on purpose' if patch else ''}), {len(ctas)} CTAs")
    starts = [t[c, KMAX, 0] | (t[c, KMAX, 1] << 32) for c in ctas]
    ends = [t[c, KMAX, 2] | (t[c, KMAX, 3] << 32) for c in ctas]
    g0 = min(starts)
    step = len(ends) // 10
    deciles = ", ".join(f"{(e - g0) / 1e3:.0f}" for e in sorted(ends)[step::step])
    items = sorted(set(int(t[c, KMAX, 4]) for c in ctas))
    log(f"  CTA start spread {(max(starts) - g0) / 1e3:.1f} us; ends {(min(ends) - g0) / 1e3:.1f}"
        f"-{(max(ends) - g0) / 1e3:.1f} us (deciles {deciles}); items per CTA {items}")
    rows = []
    for c in ctas:
        items = int(t[c, KMAX, 4])
        for k in range(min(items, KMAX)):
            for cw in range(2):
                b = CONSUMER0 + cw * PER_WG
                ev = {e: int(t[c, k, b + i]) for i, e in enumerate(EVENTS)}
                acc = {a: int(t[c, k, b + 8 + i]) for i, a in enumerate(ACCUMULATED)}
                nxt = int(t[c, k + 1, b]) if k + 1 < min(items, KMAX) else None
                st = {e: int(t[c, k, b + 12 + i]) for i, e in enumerate(STEPS)}
                rows.append(dict(cta=c, item=k, wg=cw, **ev, **acc, **st, next_tile=nxt,
                                 claim=int(t[c, k, 1] - t[c, k, 0]), q_free_at=int(t[c, k, 2]),
                                 loads_done=int(t[c, k, 3])))
    # per-item phases (cycles), medians over CTAs and warpgroups, items after the first
    steady = [r for r in rows if r["item"] > 0 and r["next_tile"] is not None]
    phases = {
        "tile known -> queries in": lambda r: r["queries in"] - r["tile known"],
        "queries in -> first turn": lambda r: r["first turn"] - r["queries in"],
        "first turn -> q·kᵀ(0) in": lambda r: r["q·kᵀ(0) in"] - r["first turn"],
        "q·kᵀ(0) in -> loop done": lambda r: r["loop done"] - r["q·kᵀ(0) in"],
        "loop done -> last turn": lambda r: r["last turn"] - r["loop done"],
        "last turn -> last p·v in": lambda r: r["last p·v in"] - r["last turn"],
        "last p·v in -> epilogue done": lambda r: r["epilogue done"] - r["last p·v in"],
        "epilogue done -> next tile known": lambda r: r["next_tile"] - r["epilogue done"],
        "tile (known -> next known)": lambda r: r["next_tile"] - r["tile known"],
        "loop: cycles a block": lambda r: (r["loop done"] - r["q·kᵀ(0) in"]) / max(1, r["blocks"]),
        "tile beyond (blocks + 1) x a block": lambda r: (r["next_tile"] - r["tile known"]) - (
            r["blocks"] + 1) * (r["loop done"] - r["q·kᵀ(0) in"]) / max(1, r["blocks"]),
        "turn waits": lambda r: r["turn waits"], "k/v waits": lambda r: r["k/v waits"],
        "q·kᵀ waits (loop)": lambda r: r["q·kᵀ waits"], "blocks in loop": lambda r: r["blocks"],
        "producer claim": lambda r: r["claim"],
        f"block {PROBE_IT}: waiting for the turn": lambda r: r["turn taken"] - r["step begins"],
        f"block {PROBE_IT}: issuing q·kᵀ (k wait)": lambda r: r["q·kᵀ issued"] - r["turn taken"],
        f"block {PROBE_IT}: issuing p·v in the turn": lambda r: r["p·v issued"] - r["q·kᵀ issued"],
        f"block {PROBE_IT}: until q·kᵀ in": lambda r: r["q·kᵀ in"] - r["p·v issued"],
        f"block {PROBE_IT}: score + softmax (+ p·v)": lambda r: r["softmax done"] - r["q·kᵀ in"],
        f"block {PROBE_IT}: until p·v in": lambda r: r["p·v in"] - r["softmax done"],
        f"block {PROBE_IT}: rescale + pack": lambda r: r["step done"] - r["p·v in"],
        f"block {PROBE_IT}: the step": lambda r: r["step done"] - r["step begins"],
        "queries in - producer's q_free": lambda r: r["queries in"] - r["q_free_at"],
    }
    for label, fn in phases.items():
        for cw in range(2):
            vals = [fn(r) for r in steady if r["wg"] == cw]
            if vals:
                ordered = sorted(vals)
                p10, p90 = ordered[len(vals) // 10], ordered[9 * len(vals) // 10]
                log(f"  wg{cw} {label:34s} median {statistics.median(vals):9.0f}  "
                    f"p10 {p10:9.0f}  p90 {p90:9.0f}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="full")
    parser.add_argument("--sizes", default="4096,16384")
    parser.add_argument("--csv", default=None)
    parser.add_argument("--patches", default="", help="probes to run too: " + ", ".join(PATCHES))
    parser.add_argument("--schedules", default="dynamic", help="dynamic and/or split")
    args = parser.parse_args(argv)
    rows = []
    for S in (int(x) for x in args.sizes.split(",")):
        for name in args.variant.split(","):
            for schedule in args.schedules.split(","):
                for patch in [None] + [p for p in args.patches.split(",") if p]:
                    rows += [dict(r, variant=name, S=S, patch=patch or "", schedule=schedule)
                             for r in run(name, S, patch=patch, schedule=schedule)]
    if args.csv and rows:
        import csv
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
