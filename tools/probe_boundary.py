"""What a tile boundary costs the Hopper attention kernel (issue 17): the kernel this checkout
generates against probe emitters that leave out part of the boundary's work. The probes compute
wrong results, so they are timed without a check:

- ``no_q_reload``: the query tile is loaded for a CTA's first tile only (the bound on waiting for
  the next tile's queries);
- ``no_stores``: the output is not written (kept in the code behind a condition never true: the
  bound on the epilogue's stores);
- ``neither``: both.

They are made from this checkout's emitter by the text edits below (``probe_sources``). On the
H100, from the repository root:

    PYTHONPATH=. python tools/probe_boundary.py [--sizes 4096] [--only full,causal,gqa_causal]

Session 25's run (RESULTS.md) found the stores 4–6 % of the kernel at S=4096.
"""
import argparse
import os
import statistics
import tempfile

import torch

from benchmarks.attention import make_case, variants
from benchmarks.common import alternated
from benchmarks.hopper_ab import load_emitter, revision_calls

EMITTER = os.path.join(os.path.dirname(__file__), "..", "tensorfuse", "targets", "cuda",
                       "hopper_attention.py")
# (what the emitter writes, what the probe writes instead)
NO_Q_RELOAD = ("""        if (k >= 1) tf_mbar_wait(q_free, (k - 1) & 1);
        tf_mbar_expect(bar_q, Q_BYTES);
        #pragma unroll
        for (int a = 0; a < ATOMS; ++a)
          tf_tma_load_3d(q_tile + a * BM * 128, q_map, a * 64, w.rb * BM, w.bh, bar_q);""",
               """        if (k >= 1) {{ tf_mbar_wait(q_free, (k - 1) & 1); tf_mbar_arrive(bar_q); }} else {{
        tf_mbar_expect(bar_q, Q_BYTES);
        #pragma unroll
        for (int a = 0; a < ATOMS; ++a)
          tf_tma_load_3d(q_tile + a * BM * 128, q_map, a * 64, w.rb * BM, w.bh, bar_q); }}""")
NO_STORES = ("      if (pending_at[x] >= 0) {{",
             "      if (pending_at[x] >= 0 && mode == 12345) {{")


def probe_sources(folder: str) -> dict:
    """Probe emitter files written to ``folder``: name → path. Refuses if the emitter no longer
    holds the text a probe edits."""
    with open(EMITTER) as f:
        source = f.read()
    edits = {"no_q_reload": [NO_Q_RELOAD], "no_stores": [NO_STORES],
             "neither": [NO_Q_RELOAD, NO_STORES]}
    paths = {}
    for name, changes in edits.items():
        text = source
        for old, new in changes:
            if text.count(old) != 1:
                raise SystemExit(f"the emitter changed: the {name} probe's edit does not apply")
            text = text.replace(old, new)
        paths[name] = os.path.join(folder, f"probe_{name}.py")
        with open(paths[name], "w") as f:
            f.write(text)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4096")
    parser.add_argument("--only", default="full,causal,gqa_causal")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        probes = {name: load_emitter(path) for name, path in probe_sources(folder).items()}
        for S in (int(s) for s in args.sizes.split(",")):
            for name, spec in variants(S).items():
                if name not in args.only.split(","):
                    continue
                case = make_case(name, spec, S, gen, check_rows=64)
                calls = revision_calls(case, spec[0], probes, check=False)
                times = alternated(calls, args.rounds)
                ms = {label: statistics.median(t) for label, t in times.items()}
                print(f"{name:12s} S={S} " + "  ".join(
                    f"{label} {case.flops / t / 1e9:6.1f}" for label, t in ms.items())
                    + " TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
