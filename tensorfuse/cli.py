"""The ``tensorfuse`` command.

    tensorfuse demo [--target T] [--save DIR]     compile attention, check it, time it
    tensorfuse show FILE.py:KERNEL [--target T] [--cuda] [--parts] [--size M=128 ...]
    tensorfuse tune FILE.py:KERNEL [...] [--target T] [--trials N] [--size M=128 ...]
                   [--size N=1024..16384 --size M=N]
                   [--scalar window=2048 ...] [--gpus all | --tracker HOST:PORT --key K]
                                                  tune kernels into this device's database
    tensorfuse worker --tracker HOST:PORT --key K [--gpu N]
                                                  measure tuning candidates for a tracker's jobs
    tensorfuse merge DB [DB ...] --into DB        join tuning databases

KERNEL specs are FILE.py:NAME or an importable module, e.g. tensorfuse.kernels:softmax.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time

import numpy as np

from .errors import TensorfuseError


def _load_kernel(spec: str):
    """``path/to/file.py:name`` (or ``package.module:name``) → the Kernel object ``name``."""
    from .kernel import Kernel

    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise TensorfuseError(f"expected FILE.py:KERNEL, got {spec!r}")
    if not os.path.exists(path):
        if path.endswith(".py") or os.sep in path:
            raise TensorfuseError(f"no such file: {path}")
        try:
            module = importlib.import_module(path)
        except ImportError as exc:
            raise TensorfuseError(f"no such file or module: {path} ({exc})") from None
    else:
        module_name = f"_tensorfuse_user_{abs(hash(os.path.abspath(path)))}"
        loader = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module
        loader.loader.exec_module(module)
    kernel = getattr(module, name, None)
    if not isinstance(kernel, Kernel):
        found = [k for k, v in vars(module).items() if isinstance(v, Kernel)]
        raise TensorfuseError(f"{path} has no @tensorfuse.kernel named {name!r}; kernels there: "
                              f"{', '.join(found) or 'none'}")
    return kernel


def _sizes(items: list[str], ranges: bool = False) -> dict:
    """``--size`` values: NAME=INTEGER; with ``ranges`` (tuning) also NAME=LOW..HIGH (every
    power-of-two bucket between) and NAME=OTHER (the same as size OTHER)."""
    sizes: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        low, dots, high = value.partition("..")
        if sep and key and value.isdigit():
            sizes[key] = int(value)
        elif ranges and sep and key and dots and low.isdigit() and high.isdigit():
            sizes[key] = (int(low), int(high))
        elif ranges and sep and key and value.isidentifier():
            sizes[key] = value
        else:
            raise TensorfuseError(f"--size takes NAME=INTEGER{', NAME=LOW..HIGH or NAME=OTHER' if ranges else ''}, "
                                  f"got {item!r}")
    return sizes


def _scalars(items: list[str]) -> dict[str, float]:
    scalars = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        try:
            scalars[key] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            raise TensorfuseError(f"--scalar takes NAME=NUMBER, got {item!r}") from None
        if not sep or not key:
            raise TensorfuseError(f"--scalar takes NAME=NUMBER, got {item!r}")
    return scalars


def cmd_show(args) -> int:
    from .api import compile as compile_kernel
    from .targets import get_target

    kernel = _load_kernel(args.kernel)
    target = get_target(args.target or ("cuda" if args.cuda or args.parts else "llvm"))
    sizes = _sizes(args.size)
    if target.is_gpu and (args.cuda or args.parts):
        print(_what_compile_runs(kernel, compile_kernel(kernel, target=target), sizes,
                                 _scalars(args.scalar), args.parts))
        return 0
    if args.parts:
        raise TensorfuseError(f"--parts lists the parts of a GPU kernel; {target.name} is not a "
                              "GPU target")
    compiled = compile_kernel(kernel, target=target, template=None)
    if args.cuda:
        print(compiled.cuda_source(**sizes))
    else:
        print(compiled.tvm_script(**sizes))
    return 0


def _what_compile_runs(kernel, compiled, sizes: dict, scalars: dict, parts: bool) -> str:
    """The kernel ``tf.compile`` runs at ``sizes`` (and ``scalars``) on a GPU target: which
    template, where its knobs come from, its plan, and its source — or, with ``parts``, one line
    per part it is assembled from (role, name, the plan fields it reads)."""
    missing = [d for d in kernel.program.dim_names() if d not in sizes]
    if missing:
        raise TensorfuseError(f"{kernel.program.name}: the kernel tf.compile runs is made for "
                              f"given sizes: add --size for {', '.join(missing)}")
    from .api import AutoKernel

    # tf.compile's choice among kernels at these sizes; other callables (a flat sweep over several
    # reduced axes, a staged program) describe and print their own parts
    chosen = compiled.for_sizes(scalars, **sizes) if isinstance(compiled, AutoKernel) else compiled
    named = {**sizes, **scalars}
    lines = [f"// {kernel.program.name} on {compiled.target.name}: {chosen.description}",
             f"// knobs: {chosen.schedule_origin(**named)}"]
    if hasattr(chosen, "describe_plan"):   # a template (not TVM's default schedule)
        lines += [f"// {line}" for line in chosen.describe_plan(scalars, **sizes).splitlines()]
    if parts:
        found = chosen.parts(**named) if hasattr(chosen, "parts") else ()
        lines += [part.describe() for part in found] or [
            "not assembled from parts: " + ("a CUDA C++ kernel written whole"
                                            if hasattr(chosen, "parts") else
                                            "a Triton kernel or TVM's CUDA")]
        return "\n".join(lines)
    written_by_tvm = chosen is getattr(compiled, "fallback", None) or not hasattr(chosen, "source")
    source = chosen.cuda_source(**sizes) if written_by_tvm else chosen.source(**named)
    return "\n".join(lines + [source])


def cmd_tune(args) -> int:
    from .autotune import tune
    from .autotune.lookup import bucket_sizes

    kernels = [_load_kernel(spec) for spec in args.kernel]
    gpus = None if args.gpus is None else (
        "all" if args.gpus == "all" else [int(g) for g in args.gpus.split(",") if g.strip()])
    every = bucket_sizes(_sizes(args.size, ranges=True))
    summary = tune([(kernel, sizes) for kernel in kernels for sizes in every],
                   target=args.target, trials=args.trials, database=args.database,
                   trials_per_iter=args.trials_per_iter, progress=not args.quiet,
                   scalars=_scalars(args.scalar), gpus=gpus, tracker=args.tracker, key=args.key)
    if args.quiet:
        print(summary)
    return 130 if summary.interrupted else 0


def cmd_worker(args) -> int:
    from .autotune.remote import serve

    serve(args.tracker, args.key, host=args.host, port=args.port, gpu=args.gpu)
    return 0


def cmd_merge(args) -> int:
    from .autotune.database import merge_databases

    merge_databases(args.sources, args.into)
    return 0


def cmd_demo(args) -> int:
    from . import kernels
    from .api import compile as compile_kernel
    from .kernels.reference import TOLERANCE, random_inputs, reference, relative_error
    from .targets import get_target

    target = get_target(args.target)
    kernel = kernels.causal_attention
    sizes = (dict(B=2, H=16, M=1024, N=1024, D=128) if target.is_gpu
             else dict(B=1, H=4, M=256, N=256, D=64))
    print(f"tensorfuse demo: causal attention, bf16, {sizes} on {target.name}"
          + ("" if target.is_gpu else " (no GPU found: using the CPU)"))
    rng = np.random.default_rng(int(time.time()))
    tensors, scalars = random_inputs(kernel, sizes, rng)
    started = time.perf_counter()
    compiled = compile_kernel(kernel, target=target)
    out_dtype = kernel.program.outputs[0].dtypes[0]
    poisoned = np.full(tuple(sizes[d] for d in ("B", "H", "M", "D")), np.nan).astype(
        tensors["q"].dtype)
    out = compiled(**tensors, **scalars, out=poisoned)
    built = time.perf_counter() - started
    err = relative_error(out, reference(kernel, tensors, scalars))
    ok = err <= TOLERANCE[out_dtype]
    print(f"  compiled and ran in {built:.1f} s ({compiled.schedule_origin(**sizes)})")
    print(f"  check against float64 NumPy: max relative error {err:.2e} "
          f"(tolerance {TOLERANCE[out_dtype]:.0e} for {out_dtype}) -> {'OK' if ok else 'FAILED'}")
    ms = compiled.benchmark(**tensors, **scalars, repeat=args.repeat)
    b, h, m, n, d = (sizes[k] for k in "BHMND")
    flops = 4 * b * h * m * n * d * 0.5  # causal: half the score matrix
    rate = flops / ms / 1e9
    rate_text = f"{rate:.2f} TFLOP/s" if rate >= 1 else f"{rate * 1e3:.1f} GFLOP/s"
    print(f"  time per call: {ms:.3f} ms ({rate_text} counting the unmasked half)")
    folder = args.save or tempfile.mkdtemp(prefix="tensorfuse-demo-")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{kernel.name}.{target.kind}.tvmscript.py")
    with open(path, "w") as f:
        f.write(_tensorir(kernel, compiled, sizes))
    print(f"  TensorIR (TVMScript) written to {path}")
    if hasattr(compiled, "source"):
        generated = os.path.join(folder, f"{kernel.name}.{target.kind}.triton.py")
        with open(generated, "w") as f:
            f.write(compiled.source(**sizes))
        print(f"  generated Triton kernel written to {generated}")
    return 0 if ok else 1


def _tensorir(kernel, compiled, sizes) -> str:
    """The TensorIR behind a compiled kernel (for a template: the fused TensorIR it starts from)."""
    if hasattr(compiled, "tvm_script"):
        return compiled.tvm_script(**sizes)
    from .schedule_templates import lower_program

    fusion = compiled.fusion
    return lower_program(kernel.program, (fusion,), sizes).script()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorfuse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compile, check and time attention on the local GPU or CPU")
    demo.add_argument("--target", default="auto", help="auto (default), llvm, cuda, cuda:sm_90a")
    demo.add_argument("--save", "--out", metavar="DIR", default=None,
                      help="folder for the TVMScript and generated code (default: a new "
                           "temporary folder, printed)")
    demo.add_argument("--repeat", type=int, default=10)
    demo.set_defaults(run=cmd_demo)
    show = sub.add_parser("show", help="print a kernel's TensorIR, or the source tf.compile runs "
                                       "on a GPU target")
    show.add_argument("kernel", help="FILE.py:KERNEL")
    show.add_argument("--target", default=None, help="llvm (default), cuda[:sm_XX], rocm[:gfxXXX]")
    show.add_argument("--cuda", action="store_true",
                      help="print the source tf.compile runs (on a GPU target: the template's "
                           "CUDA C++ or Triton, with its plan; on llvm: TVM's CUDA)")
    show.add_argument("--parts", action="store_true",
                      help="print the parts the GPU kernel is assembled from (role, name, the "
                           "plan fields each reads)")
    show.add_argument("--size", action="append", metavar="NAME=N", help="fix a size (repeatable)")
    show.add_argument("--scalar", action="append", metavar="NAME=V",
                      help="a scalar the kernel is made for (a window, a map's width)")
    show.set_defaults(run=cmd_show)
    tune = sub.add_parser("tune", help="tune kernels with MetaSchedule + XGBoost into this "
                                       "device's database (resumable)")
    tune.add_argument("kernel", nargs="+", help="FILE.py:KERNEL or module:KERNEL (several share "
                                                "the trial budget)")
    tune.add_argument("--target", default="auto", help="auto (default: the GPU if any, else the "
                                                       "CPU), llvm, cuda")
    tune.add_argument("--trials", type=int, default=64, help="measured candidates in all "
                                                             "(those already recorded count)")
    tune.add_argument("--size", action="append", metavar="NAME=N",
                      help="a size (every size must be given): NAME=N; NAME=LOW..HIGH tunes "
                           "each power-of-two bucket in the range (N=1024..16384: 1024, 2048, "
                           "..., 16384); NAME=OTHER takes size OTHER's value (M=N)")
    tune.add_argument("--scalar", action="append", metavar="NAME=VALUE",
                      help="a scalar argument's value as you call the kernel (window=2048): "
                           "records are kept per value of those that change the mask")
    tune.add_argument("--database", default=None, help="database folder (default: this device's,"
                                                       " which compile reads)")
    tune.add_argument("--trials-per-iter", type=int, default=None)
    tune.add_argument("--gpus", default=None, help="measure on every GPU of this machine (all) "
                                                   "or these (0,1): one worker per GPU")
    tune.add_argument("--tracker", default=None, metavar="HOST:PORT",
                      help="measure on the workers registered with this TVM RPC tracker "
                           "(their secret in TENSORFUSE_TUNING_SECRET)")
    tune.add_argument("--key", default="tensorfuse", help="the workers' tracker key (one per "
                                                          "GPU model, e.g. h100)")
    tune.add_argument("--quiet", action="store_true", help="only the summary table")
    tune.set_defaults(run=cmd_tune)
    worker = sub.add_parser("worker", help="measure tuning candidates for jobs of a TVM RPC "
                                           "tracker (secret in TENSORFUSE_TUNING_SECRET)")
    worker.add_argument("--tracker", required=True, metavar="HOST:PORT")
    worker.add_argument("--key", default="tensorfuse", help="the key jobs ask for (one per GPU "
                                                            "model, e.g. h100)")
    worker.add_argument("--host", default="127.0.0.1", help="the address to listen on "
                                                            "(default: this machine only)")
    worker.add_argument("--port", type=int, default=9091, help="the first port to try")
    worker.add_argument("--gpu", type=int, default=None, help="the GPU index to measure on")
    worker.set_defaults(run=cmd_worker)
    merge = sub.add_parser("merge", help="add the records of tuning databases to another")
    merge.add_argument("sources", nargs="+", help="database folders")
    merge.add_argument("--into", required=True, help="the database folder to add them to")
    merge.set_defaults(run=cmd_merge)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except TensorfuseError as exc:
        # a location in the user's file helps; the launcher's own line (or runpy's) does not
        where = exc.location.filename if exc.location is not None else ""
        launcher = where.startswith("<") or os.path.abspath(where) == os.path.abspath(sys.argv[0])
        print(f"tensorfuse: error: {exc.message if launcher else exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # a Ctrl-C outside a tuning batch (while the job times its defaults and best records,
        # say): every record is already written whole, so the shell's usual status, no traceback
        print("tensorfuse: interrupted; what was recorded is kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
