"""Time the Hopper attention kernels this checkout generates against those another revision of
the emitter generates (``targets/cuda/hopper_attention.py`` of that revision, given as a file),
alternating in one process: same plan, knobs, schedule, launches and inputs — only the CUDA
source differs. cuDNN (SDPA) is timed in the same rounds where it runs the variant, and with
``--flex`` FlexAttention under torch.compile (the bars' references, in alternated rounds).

    python -m benchmarks.hopper_ab --other OLD_EMITTER.py [--only full,causal] [--sizes 4096]
                                   [--rounds 5] [--also block_n=176] [--flex] [--csv PATH]

Both kernels are checked against float64 first (``benchmarks.attention.checked``).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys

import torch

from benchmarks.attention import (checked, compiled_flex, flex_call, make_case, sdpa_call,
                                  variants)
from benchmarks.common import alternated, measure_ceilings, write_csv
from benchmarks.hopper_attention import hopper


def load_emitter(path: str):
    """The emitter module in ``path`` (another revision of one of ``tensorfuse.targets.cuda``'s),
    imported inside that package (its relative imports resolve there) under a name of its own,
    registered as imported (its dataclasses look their module up)."""
    name = "tensorfuse.targets.cuda._other_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def with_other_source(f, emitter, D: int) -> None:
    """Rewrite every launch ``f`` has made (head dim ``D``) with ``emitter``'s source, rebuilt on
    the next call — its fast calls dropped too (a fast call keeps the module it was made with: an
    "other" timed through it would be this revision's kernel again; the GPU test
    ``test_a_swapped_source_runs_after_forget_built`` keeps it so)."""
    for launches in f._launches.values():
        launches.source = emitter.hopper_attention_source(
            launches.plan, launches.knobs, D, launches.plan.mask is not None)
    f.forget_built()


def revision_calls(case, kernel, emitters: dict, knob_sets: dict | None = None,
                   check: bool = True, flex=None) -> dict:
    """label → callable for one case: this revision's kernel (``"this"``), the same launches
    rebuilt with each of ``emitters`` (label → emitter module), this revision with each of
    ``knob_sets`` (label → knobs), and cuDNN where SDPA runs the variant. With ``check`` each is
    checked against float64 first and left out if wrong; probe emitters that compute wrong
    results on purpose are timed with ``check=False``."""
    q, k, v, scale, extra = case.q, case.k, case.v, case.scale, case.args
    calls = {}
    builds = [("this", {}, None)] + [(label, {}, em) for label, em in emitters.items()] + \
        [(label, knobs, None) for label, knobs in (knob_sets or {}).items()]
    for label, knobs, emitter in builds:
        f = hopper(kernel, **knobs)
        f(q, k, v, scale=scale, **extra)   # makes the launches (this revision's source)
        if emitter is not None:
            with_other_source(f, emitter, q.shape[-1])
        call = lambda f=f: f(q, k, v, scale=scale, **extra)  # noqa: E731
        if not check or checked(case, label, call):
            calls[label] = call
    if case.sdpa is not None:
        from torch.nn.attention import SDPBackend

        cudnn = sdpa_call(case, SDPBackend.CUDNN_ATTENTION)
        if not check or checked(case, "sdpa_cudnn", cudnn):
            calls["sdpa_cudnn"] = cudnn
    if flex is not None:
        call = flex_call(case, flex)
        if not check or checked(case, "flex_attention", call):
            calls["flex_attention"] = call
    return calls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", required=True, help="the other revision's emitter file")
    parser.add_argument("--only", default=None)
    parser.add_argument("--sizes", default="4096")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--csv", default=None)
    parser.add_argument("--flex", action="store_true", help="time FlexAttention in the rounds too")
    parser.add_argument("--also", default=None, metavar="KNOB=VALUE,...",
                        help="also time this revision with these knobs")
    args = parser.parse_args(argv)
    emitter = load_emitter(args.other)
    names = args.only.split(",") if args.only else None
    also = {k: int(v) for k, v in (kv.split("=") for kv in args.also.split(","))} \
        if args.also else None
    gen = torch.Generator().manual_seed(0)
    gemm = measure_ceilings()["gemm_tflops"]   # the CSV's fractions: of this GPU's GEMM rate
    flex = compiled_flex() if args.flex else None
    rows = []
    print(f"{'variant':16s} {'S':>6s} {'this':>8s} {'other':>8s} {'ratio':>7s}  cuDNN  "
          f"{'also':>6s}  Flex (TFLOP/s)")
    for S in (int(s) for s in args.sizes.split(",")):
        for name, spec in variants(S).items():
            if names and name not in names:
                continue
            case = make_case(name, spec, S, gen, check_rows=64)
            knob_sets = {"this " + ",".join(f"{k}={v}" for k, v in also.items()): also} \
                if also else None
            impls = revision_calls(case, spec[0], {"other": emitter}, knob_sets, flex=flex)
            times = alternated(impls, args.rounds)
            ms = {label: statistics.median(t) for label, t in times.items()}
            tflops = {label: case.flops / t / 1e9 for label, t in ms.items()}
            ratio = ms["other"] / ms["this"] if "this" in ms and "other" in ms else float("nan")
            extra_tflops = next((t for label, t in tflops.items() if label.startswith("this ")), 0)
            print(f"{name:16s} {S:6d} {tflops.get('this', 0):8.1f} {tflops.get('other', 0):8.1f} "
                  f"{ratio:7.3f}  {tflops.get('sdpa_cudnn', 0):5.0f} {extra_tflops:6.1f}"
                  f"  {tflops.get('flex_attention', 0):4.0f}",
                  flush=True)
            for label, t in ms.items():
                rows.append(case.row(label, t, f"median of {args.rounds} alternated rounds; "
                                     f"this/other speed ratio {ratio:.3f}", gemm))
            torch.cuda.empty_cache()
    if args.csv:
        write_csv(rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
