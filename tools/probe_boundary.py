"""What a tile boundary costs the Hopper attention kernel (issue 17): the kernel this checkout
generates against probe emitters that leave out part of the boundary's work — they compute wrong
results, so they are timed without a check: ``tools/ab/probe_no_q_reload.py`` (the query tile is
not reloaded after the first: the bound on waiting for the next tile's queries) and
``tools/ab/probe_no_stores.py`` (the output is not written: the bound on the epilogue's stores).
Make them from the emitter by the edits in this session's RESULTS.md note; run on the H100:

    python tools/probe_boundary.py tools/ab/probe_no_q_reload.py tools/ab/probe_no_stores.py
"""
import statistics
import sys

import torch

from benchmarks.attention import make_case, sdpa_call, variants
from benchmarks.common import alternated
from benchmarks.hopper_ab import load_emitter, with_other_source
from benchmarks.hopper_attention import hopper

gen = torch.Generator().manual_seed(0)
probes = {path.split("/")[-1].removesuffix(".py"): load_emitter(path) for path in sys.argv[1:]}
for S in (4096,):
    for name, spec in variants(S).items():
        if name not in ("full", "causal", "gqa_causal"):
            continue
        case = make_case(name, spec, S, gen, check_rows=64)
        q, k, v, scale, extra = case.q, case.k, case.v, case.scale, case.args
        calls = {}
        for label in ["this", *probes]:
            f = hopper(spec[0])
            f(q, k, v, scale=scale, **extra)
            if label in probes:
                with_other_source(f, probes[label], q.shape[-1])
                f(q, k, v, scale=scale, **extra)
            calls[label] = lambda f=f: f(q, k, v, scale=scale, **extra)
        if case.sdpa is not None:
            from torch.nn.attention import SDPBackend
            calls["sdpa_cudnn"] = sdpa_call(case, SDPBackend.CUDNN_ATTENTION)
        times = alternated(calls, 5)
        ms = {label: statistics.median(t) for label, t in times.items()}
        print(f"{name:12s} S={S} " + "  ".join(
            f"{label} {case.flops / t / 1e9:6.1f}" for label, t in ms.items()) + " TFLOP/s",
            flush=True)
