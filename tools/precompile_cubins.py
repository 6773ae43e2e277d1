"""Compile, on a machine without a GPU, the cubins a GPU job will load, into the kernel cache
(``$TENSORFUSE_CACHE``): nvcc here is the device machines' (13.0), cubins are cached by source
hash, and a fresh device machine would otherwise spend its lent time in nvcc (the Hopper GPU
suite's float64 check compiles a kernel per variant, head dim, block size and last-block width).

    TENSORFUSE_CACHE=.device/cache python tools/precompile_cubins.py check
    TENSORFUSE_CACHE=.device/cache python tools/precompile_cubins.py ab --other OLD_EMITTER.py \
        --only full,alibi --sizes 4096,16384

``trace``: the stamped kernels ``tools/probe_trace.py`` runs (``--only``, ``--sizes``).
``decode``: the cluster-decode candidates of ``benchmarks.decode_knobs --only grid``
(``--grid``). ``kernel``: the CUDA C++ kernels ``tf.compile`` makes of one DSL kernel at given
sizes (every stage of a staged program), e.g.
``kernel benchmarks/unlisted_kernels.py:cosine_similarity --size M=8192 --size N=8192
--size D=1024``.
``training``: what autograd through ``tf.compile`` of an attention kernel launches at those sizes
— the forward that also writes each row's log-sum-exp, and the sm_90a backward where it takes
the plan (``training benchmarks/user_kernels.py:bshd_gqa_causal --size B=2 …``).
``check``: runs ``benchmarks.hopper_attention.check`` with its inputs on the CPU and every
launch stopped after its module is built (results are not computed). ``ab``: the sources
``benchmarks.hopper_ab`` times, this emitter's and the other's, at B=2, H=16 (GQA 32/8), D=128.
"""
from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

from tensorfuse.binding import bind_call
from tensorfuse.schedule_templates.lifted_kernel import LiftedKernel
from tensorfuse.schedule_templates.packed_kernel import PackedDecodeRoute
from tensorfuse.targets.cuda.kernel import ClusterKernel
from tensorfuse.targets.cuda.module import cubin_for


class _Built(Exception):
    """Raised instead of launching: the module is built."""


def _compile_instead_of_launching(pending: list):
    def prepare(self, args, kwargs, key=False):
        bound = bind_call(self.program, args, kwargs, "cpu")   # the inputs are on the CPU here
        launches = self.launches(bound.scalars, **bound.dims)
        pending.extend((source, self.target) for source in launches.sources)
        raise _Built()
    return prepare


def _on_cpu(fn):
    def made(*args, **kwargs):
        kwargs.pop("device", None)
        return fn(*args, **kwargs)
    return made


def _keep_on_cpu(to):
    def moved(self, *args, **kwargs):
        kwargs.pop("device", None)
        args = tuple(a for a in args if not (a == "cuda" or isinstance(a, torch.device)))
        return to(self, *args, **kwargs)
    return moved


def precompile_check() -> list:
    from benchmarks import hopper_attention as bench

    pending: list = []
    ClusterKernel._prepare = _compile_instead_of_launching(pending)
    _inputs_on_cpu()
    bench.reference = lambda *a, **k: torch.zeros(1)   # no float64 reference: nothing runs
    bench.check(log=lambda line: None if "_Built" in line or line.startswith(("ok", "WRONG"))
                else print(line, file=sys.stderr))
    return pending


def precompile_decode(grid: str) -> list:
    from benchmarks import decode_knobs as bench

    pending: list = []
    ClusterKernel._prepare = _compile_instead_of_launching(pending)
    for B, H, HKV, N in bench.parse_grid(grid):
        args = bench.grid_inputs(B, H, HKV, N, 128, "cpu")
        # tf.compile's own choice needs a GPU to be made: only the candidates here
        for label, f in bench.cluster_candidates(H // HKV).items():
            try:
                f(*args, scale=0.1)
            except _Built:
                pass
            except Exception as exc:  # noqa: BLE001 - the benchmark reports it too
                print(f"{B}:{H}/{HKV}:{N} {label}: {type(exc).__name__}: {str(exc)[:160]}",
                      file=sys.stderr)
    return pending


def precompile_kernel(spec: str, sizes: list[str]) -> list:
    """The CUDA C++ sources ``tf.compile(kernel, target="cuda")`` launches at ``sizes``
    (NAME=INTEGER): here the plans are sized for the H200's and the H100's 132 SMs. A kernel that
    runs as stages (the program's own, or the floor's at these sizes) gives every stage's."""
    import tensorfuse as tf
    from tensorfuse.cli import _load_kernel, _sizes

    return _cuda_sources(tf.compile(_load_kernel(spec), target="cuda"), _sizes(sizes))


def precompile_training(spec: str, sizes: list[str]) -> list:
    """The CUDA C++ sources a training step through ``tf.compile`` of the attention ``spec``
    launches at ``sizes``: the forward autograd records (the program with each row's
    log-sum-exp, :mod:`tensorfuse.autograd`) and the sm_90a backward, where it takes the plan
    (the Triton kernels build on the GPU)."""
    import tensorfuse as tf
    from tensorfuse.cli import _load_kernel, _sizes
    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.schedule_templates.attention_backward import plan_attention_backward
    from tensorfuse.schedule_templates.attention_chain import with_logsumexp
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.hopper_attention_backward import plan_hopper_backward
    from tensorfuse.targets.cuda.hopper_attention_backward import backward_source

    kernel, dims = _load_kernel(spec), _sizes(sizes)
    target = tf.compile(kernel, target="cuda").target
    _, fusion = choose(kernel.program, target)
    saving = ProgramKernel(with_logsumexp(kernel.program, fusion.names),
                           getattr(kernel, "fn", None), tuned_as=kernel.program)
    pending = _cuda_sources(tf.compile(saving, target=target), dims)
    plan = plan_attention_backward(kernel.program, fusion, dims)
    source = backward_source(plan_hopper_backward(plan, target.arch),
                             [(p.name, p.dtype) for p in plan.program.scalar_params])
    return pending + [(source, target)]


def _cuda_sources(kernel, dims: dict) -> list:
    """``(source, target)`` of every CUDA C++ module ``kernel`` launches at ``dims``, through
    the kernel a compiled one chooses at them, the inner kernel of one that views the caller's
    tensors (packed rows, a decode lifted to four axes) and the stages of a staged one (Triton
    kernels build on the GPU)."""
    from tensorfuse.api import AutoKernel

    if isinstance(kernel, AutoKernel):
        kernel = kernel.for_sizes({}, **dims)
    if isinstance(kernel, PackedDecodeRoute):   # made at its first call
        kernel = kernel.made()
    if isinstance(kernel, LiftedKernel):   # packed rows, or a decode lifted to four axes
        return _cuda_sources(kernel.inner, kernel.inner_dims(dims))
    if isinstance(kernel, ClusterKernel):
        return [(source, kernel.target) for source in kernel.launches({}, **dims).sources]
    pending = []
    for stage, inner in zip(getattr(kernel, "stages", ()), getattr(kernel, "kernels", ())):
        names = stage.program.dim_names()
        pending += _cuda_sources(inner, {n: v for n, v in dims.items() if n in names})
    return pending


def _inputs_on_cpu() -> None:
    """Tensors the benchmarks make on ``"cuda"`` made on the CPU instead."""
    for name in ("randn", "rand", "randint", "full", "empty", "zeros", "ones", "arange",
                 "tensor", "as_tensor"):
        setattr(torch, name, _on_cpu(getattr(torch, name)))
    torch.cuda.synchronize = lambda *a, **k: None
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.Tensor.to = _keep_on_cpu(torch.Tensor.to)


def precompile_ab(other: str | None, only: list[str], sizes: list[int],
                  trace: bool = False) -> list:
    from benchmarks.attention import D, documents, variants
    from benchmarks.hopper_ab import load_emitter
    from benchmarks.hopper_attention import hopper

    emitter = load_emitter(other) if other else None
    _inputs_on_cpu()
    pending = []
    for S in sizes:
        for name, (kernel, extra, _, mask_mod, _, hq, hkv) in variants(S).items():
            if name not in only:
                continue
            q = torch.empty(2, hq, S, D, dtype=torch.bfloat16)
            k, v = (torch.empty(2, hkv, S, D, dtype=torch.bfloat16) for _ in range(2))
            args = dict(extra, scale=1.0 / D ** 0.5)
            if mask_mod == "document":
                args["doc"] = documents(2, S, torch.Generator().manual_seed(0)).cpu()
            if trace:   # tools/probe_trace.py's stamped kernels, as they are and probed
                from probe_trace import PATCHES, traced
                from tensorfuse.schedule_templates.hopper_attention_plan import split_workspace
                for schedule in ("dynamic", "split"):
                    f = hopper(kernel, schedule=schedule)
                    bound = bind_call(f.program, (q, k, v), args, "cpu")
                    launches = f.launches(bound.scalars, **bound.dims)
                    at = split_workspace(launches.knobs, 132, D) if schedule == "split" else 0
                    pending += [(traced(launches.source, p, at), f.target)
                                for p in [None, *PATCHES]]
                continue
            f = hopper(kernel)
            bound = bind_call(f.program, (q, k, v), args, "cpu")
            launches = f.launches(bound.scalars, **bound.dims)
            pending.append((launches.source, f.target))
            pending.append((emitter.hopper_attention_source(
                launches.plan, launches.knobs, D, launches.plan.mask is not None), f.target))
    return pending


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("check", "ab", "trace", "decode", "kernel",
                                         "training"))
    parser.add_argument("spec", nargs="?", help="kernel: FILE.py:KERNEL")
    parser.add_argument("--size", action="append", default=[], help="kernel: NAME=INTEGER")
    parser.add_argument("--grid", default=None, help="decode: benchmarks.decode_knobs's GRID")
    parser.add_argument("--other")
    parser.add_argument("--only", default="full")
    parser.add_argument("--sizes", default="4096")
    parser.add_argument("--jobs", type=int, default=4)
    args = parser.parse_args(argv)
    if args.what == "check":
        pending = precompile_check()
    elif args.what == "decode":
        from benchmarks.decode_knobs import GRID

        pending = precompile_decode(args.grid or GRID)
    elif args.what in ("kernel", "training"):
        if not args.spec:
            parser.error(f"{args.what} needs FILE.py:KERNEL")
        pending = (precompile_kernel if args.what == "kernel" else precompile_training)(
            args.spec, args.size)
    elif args.what == "ab" and args.other is None:
        parser.error("ab needs --other OLD_EMITTER.py")
    else:
        pending = precompile_ab(args.other, args.only.split(","),
                                [int(s) for s in args.sizes.split(",")], args.what == "trace")
    unique = {source: target for source, target in pending}
    print(f"{len(unique)} distinct sources; compiling", file=sys.stderr)
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda item: cubin_for(*item), unique.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
