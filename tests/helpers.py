"""Helpers shared by the tests."""
import inspect


def line_of(func, marker: str) -> int:
    """The line number in ``func``'s file of the first source line containing ``marker``."""
    lines, start = inspect.getsourcelines(func)
    for offset, text in enumerate(lines):
        if marker in text:
            return start + offset
    raise AssertionError(f"marker {marker!r} not found")


def host_compiler() -> str | None:
    """The host's C++ compiler (``c++`` or ``g++``), or None."""
    import shutil

    return shutil.which("c++") or shutil.which("g++")


def run_host_program(source: str, folder, compiler: str | None = None) -> list[str]:
    """Compile ``source`` — a ``main`` printing the values of expressions the CUDA templates
    write, checked as host code — with ``compiler`` (default :func:`host_compiler`; ``"nvcc"``
    where it needs the CUDA headers) in ``folder``, run it and return the lines it prints."""
    import os
    import subprocess

    compiler = compiler or host_compiler()
    program = os.path.join(folder, "program.cu" if compiler == "nvcc" else "program.cc")
    binary = os.path.join(folder, "program")
    with open(program, "w") as f:
        f.write(source)
    subprocess.run([compiler, "-O1", "-o", binary, program], check=True, capture_output=True)
    return subprocess.run([binary], capture_output=True, text=True,
                          check=True).stdout.splitlines()


def nvcc_found() -> bool:
    """Whether nvcc (the CUDA toolkit, 13.0 checked) is on PATH."""
    import shutil

    return shutil.which("nvcc") is not None


def _needs_nvcc():
    """The mark of a test that runs nvcc: locally, without nvcc, the test skips; in CI (``CI``
    set: ``.ci/run``), whose machine has the toolkit, it fails with the reason — so those tests
    never skip there unnoticed."""
    import functools
    import os

    import pytest

    if nvcc_found() or not os.environ.get("CI"):
        return pytest.mark.skipif(not nvcc_found(),
                                  reason="needs nvcc (the CUDA toolkit) on PATH")

    def failing(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            pytest.fail("CI runs the sm_90a code-generation tests: put the CUDA toolkit's nvcc "
                        "(13.0) on PATH")
        return run
    return failing


needs_nvcc = _needs_nvcc()


def float64_reference(kernel, tensors: dict, scalars: dict):
    """The float64 NumPy reference of a library kernel, written apart from the DSL
    (``tensorfuse.kernels.reference``); the layers' ``attention_kernel(dtype, causal, …)``
    variants without a mask tensor or soft-cap use the grouped-heads references."""
    from tensorfuse.kernels.reference import REFERENCES, reference

    if kernel.name in REFERENCES:
        return reference(kernel, tensors, scalars)
    import numpy as np

    q, k, v = (np.asarray(tensors[n], np.float64) for n in ("q", "k", "v"))
    if kernel.name.startswith("attention_causal_f") and "_masked" not in kernel.name and \
            "_softcap" not in kernel.name:
        return REFERENCES["gqa_causal_attention"](q, k, v, scalars["scale"])
    if kernel.name.startswith("attention_f"):
        return REFERENCES["gqa_attention"](q, k, v, scalars["scale"])
    raise KeyError(f"no float64 reference for {kernel.name}")


def run_interpreted(module: str, *args, timeout: int = 900):
    """Run ``python -m module args`` from the repository's root with Triton's interpreter on
    (Triton decides at import whether to interpret, so such checks run in their own process) and
    return the JSON its last line prints; the process's stderr where it fails."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, cwd=root, timeout=timeout,
                          env=dict(os.environ, TRITON_INTERPRET="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_interpreted(module: str, cases, tolerance=2e-2) -> None:
    """Run a check module under Triton's interpreter (:func:`run_interpreted`) on a fresh seed
    and assert every one of ``cases`` came back within ``tolerance`` of its float64 reference
    (bf16 outputs: 2e-2; a function of the case's name for a tolerance per case)."""
    import pytest

    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    seed = fresh_seed()
    errors = run_interpreted(module, seed)
    assert set(errors) == set(cases), errors
    _assert_within(errors, tolerance if callable(tolerance) else (lambda name: tolerance), seed)


def _assert_within(errors: dict, allowed, seed: int) -> None:
    """Every case's error (by name) under ``allowed(name)``, the seed said where one is not."""
    too_far = {n: e for n, e in errors.items() if not e < allowed(n)}
    assert not too_far, f"relative errors {too_far} (TENSORFUSE_SEED={seed})"


# the start of a script run_with_the_gpu_stubbed runs: the GPU's parts stubbed for good
# (tools/profile_host_paths.py), every tensor map encoded kept in ``encoded`` as (address, sizes,
# strides), every set of device maps made in ``made`` (by key)
_GPU_STUBBED = """
import importlib.util, json, torch
spec = importlib.util.spec_from_file_location("tool", "tools/profile_host_paths.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)
tool.stub_the_gpu()
from tensorfuse.targets.cuda import tma
encoded, made = [], []
tma._encoded = lambda address, sizes, box, dtype, strides: encoded.append(
    (address, sizes, strides)) or bytes(128)
def get(self, key, make, device):
    if key not in self.entries:
        made.append(key)
        self.entries[key] = make()
    return torch.empty(384, dtype=torch.uint8)
tma.DeviceMaps.get = get
"""


def run_with_the_gpu_stubbed(script: str):
    """The JSON the last line of ``script``'s output holds, ``script`` run in a process of its
    own after the GPU's parts are stubbed (:data:`_GPU_STUBBED`: CPU tensors stand in for CUDA
    ones, launches do nothing, the maps encoded are kept in ``encoded``, the sets of device maps
    made in ``made``): the host side of a GPU kernel's calls, on a machine without a GPU."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _GPU_STUBBED + script], cwd=root,
                          check=True, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": root})
    return json.loads(done.stdout.strip().splitlines()[-1])


def ptxas_spills(ptx: str) -> list[int]:
    """The bytes of spill stores ptxas reports for each kernel of ``ptx`` (sm_90a; the ptxas
    of Triton's wheel, which this machine has without a GPU)."""
    import os
    import re
    import subprocess
    import tempfile

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        done = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                              capture_output=True, text=True, check=True)
    finally:
        os.unlink(f.name)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", done.stderr)]
    assert spills, done.stderr
    return spills


def fresh_seed() -> int:
    """A fresh seed for a random test, or ``TENSORFUSE_SEED`` to rerun a failing one (printed:
    pytest shows a failing test's output)."""
    import os
    import secrets

    seed = int(os.environ.get("TENSORFUSE_SEED", secrets.randbits(32)))
    print(f"random seed: {seed} (rerun with TENSORFUSE_SEED={seed})")
    return seed


def clear_of(x, *thresholds, margin: float = 1e-4, rounds: int = 50):
    """``x`` (float32, rows along dim 0) with no element within ``margin`` (relative) of any
    of ``thresholds``: functions of the float64 rows giving each row's threshold (``keepdim``
    shape). A comparison against a computed value (``x > mean``) is discontinuous: a kernel
    rounding the mean in float32 may put an element on the other side than the float64
    reference does, and a sum of the values above it then differs by one value. Such elements
    are pushed above the band, and the thresholds recomputed, until none is near."""
    import torch

    x = x.clone()
    for _ in range(rounds):
        near = None
        for threshold in thresholds:
            t = threshold(x.double())
            band = margin * t.abs().clamp_min(1.0)
            hit = (x.double() - t).abs() < band
            if hit.any():
                near = hit
                x = torch.where(hit, (t + 4 * band).float(), x)
        if near is None:
            return x
    raise AssertionError("no random case clear of its thresholds: widen the data")


def relative_error(out, want) -> float:
    """The largest absolute error of ``out`` (any device, any float dtype) against a float64
    ``want``, relative to ``want``'s largest magnitude (outputs of a kernel of several: the
    worst of them; an all-zero ``want``: the absolute error)."""
    if isinstance(out, tuple):
        return max(relative_error(o, w) for o, w in zip(out, want, strict=True))
    scale = want.abs().max()
    return float((out.double().cpu() - want.cpu()).abs().max() / (scale if scale > 0 else 1))


def poisoned_call(made, program, args: dict, want) -> tuple:
    """``made(**args)`` into NaN-filled outputs of ``program``'s dtypes shaped like ``want`` (a
    tensor, or one per output; −1 in integer ones; on the arguments' device), asserting it
    returned those very tensors: what it wrote there (an element it left alone stays NaN or −1
    and fails any comparison)."""
    import torch

    from tensorfuse.interop import torch_dtype

    wants = list(want) if isinstance(want, (tuple, list)) else [want]
    dtypes = [torch_dtype(c.dtypes[0]) for c in program.outputs]
    device = next((a.device for a in args.values() if isinstance(a, torch.Tensor)), "cpu")
    outs = tuple(torch.full(w.shape, float("nan") if d.is_floating_point else -1, dtype=d,
                            device=device) for w, d in zip(wants, dtypes))
    got = made(**args, out=outs if len(outs) > 1 else outs[0])
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(outs) and all(g is o for g, o in zip(got, outs)), program.name
    return outs


def poisoned_main(cases: dict, made, error=None) -> None:
    """The ``__main__`` of a check module that :func:`run_interpreted` runs, outputs poisoned:
    for each of ``cases`` (name → (kernel, case(generator) → (arguments, float64 reference: a
    tensor, or one per output))), the kernel ``made(name, kernel)`` makes, called on fresh
    inputs (seed: the first argument) into NaN-filled outputs of the program's dtypes
    (:func:`poisoned_call`); prints each case's error (its worst output's) as JSON: ``error(out,
    want)``, by default :func:`relative_error`."""
    import json
    import os
    import sys

    import torch

    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    generator = torch.Generator().manual_seed(int(sys.argv[1]))
    errors = {}
    for name, (kernel, case) in cases.items():
        args, want = case(generator)
        outs = poisoned_call(made(name, kernel), kernel.program, args, want)
        wants = list(want) if isinstance(want, (tuple, list)) else [want]
        errors[name] = max((error or relative_error)(o, w) for o, w in zip(outs, wants))
    print(json.dumps(errors))


def templated(kernel):
    """``kernel`` as ``tf.compile`` makes it for sm_90a with its Triton template called (run by
    Triton's interpreter on the CPU: what picks between a template and TVM's CUDA needs a GPU);
    a kernel swept over several axes as one gets each flat kernel's template."""
    import tensorfuse as tf

    return _template_of(tf.compile(kernel, target="cuda:sm_90a"))


def _template_of(made):
    """The Triton template of a compiled kernel (an elementwise kernel is its own; a kernel
    swept over several axes as one, each flat kernel's; a staged kernel's stages, each
    theirs)."""
    from tensorfuse.flat_kernel import FlatSweepKernel
    from tensorfuse.staged import StagedKernel

    if isinstance(made, FlatSweepKernel):
        return FlatSweepKernel(made.program, made.target, made.group,
                               lambda sizes: _template_of(made.for_sizes(**sizes)))
    if isinstance(made, StagedKernel):
        return StagedKernel(made.program, made.target, made.stages,
                            tuple(_template_of(k) for k in made.kernels), made.why)
    return getattr(made, "template", made)


def gpu_case(case):
    """``(arguments on the GPU, float64 reference, seed)`` of ``case(generator)`` on fresh
    inputs."""
    import torch

    seed = fresh_seed()
    args, want = case(torch.Generator().manual_seed(seed))
    return {n: a.cuda() if isinstance(a, torch.Tensor) else a for n, a in args.items()}, want, seed


def gpu_error(kernel, case) -> tuple[float, object, int]:
    """``tf.compile(kernel)`` on the GPU on fresh inputs of ``case`` (:func:`gpu_case`), its
    outputs poisoned: ``(relative error against the float64 reference — the worst output's
    where there are several, ``want`` then a tuple —, the first output's dtype, the seed)``."""
    import tensorfuse as tf

    args, want, seed = gpu_case(case)
    outs = poisoned_call(tf.compile(kernel), kernel.program, args, want)
    wants = want if isinstance(want, tuple) else (want,)
    error = max(relative_error(o, w) for o, w in zip(outs, wants, strict=True))
    return error, outs[0].dtype, seed


def runs_a_template(made, args: dict) -> bool:
    """Whether ``tf.compile``'s kernel runs these arguments on templates, not on TVM's default
    schedule (through its flat kernel where it sweeps several axes as one; every stage's kernel
    where it runs in stages)."""
    from tensorfuse.binding import bind_call

    bound = bind_call(made.program, (), args, "cuda")
    return _on_templates(made, {**bound.dims, **bound.scalars})


def _on_templates(made, dims: dict) -> bool:
    """:func:`runs_a_template` at the call's sizes and scalars (``dims``)."""
    from tensorfuse.api import AutoKernel
    from tensorfuse.binding import split_scalars
    from tensorfuse.compiled import CompiledKernel
    from tensorfuse.flat_kernel import FlatSweepKernel
    from tensorfuse.staged import StagedKernel

    if isinstance(made, StagedKernel):
        return all(_on_templates(kernel, made._own(stage, dims))
                   for stage, kernel in zip(made.stages, made.kernels))
    sizes, scalars = split_scalars(made.program, dims)
    if isinstance(made, FlatSweepKernel):
        return _on_templates(made.for_sizes(**sizes), dims)
    if isinstance(made, AutoKernel):   # the floor's stages: each on a template
        chosen = made.for_sizes(scalars, **sizes)
        return chosen is not made.fallback and \
            (not isinstance(chosen, StagedKernel) or _on_templates(chosen, dims))
    # TVM's default schedule is a CompiledKernel; the other kernels (the elementwise, scan and
    # scatter templates' own) are templates
    return not isinstance(made, CompiledKernel)


def assert_gpu_template_matches(kernel, case, tolerance: float = 2e-2) -> None:
    """``tf.compile(kernel)`` on the GPU, on fresh inputs of ``case`` (:func:`gpu_case`): a
    template runs them (not TVM's default schedule) and the result is within ``tolerance`` of
    the float64 reference."""
    import tensorfuse as tf

    args, want, seed = gpu_case(case)
    made = tf.compile(kernel)
    assert runs_a_template(made, args), made
    assert relative_error(made(**args), want) < tolerance, seed


def case_tolerance(kernel) -> float:
    """The relative error a check module's kernel is allowed against float64: 2e-2 where an
    output is stored in a 16-bit float (its rounding alone is 4e-3) or where a computed float32
    value is summed against a 16-bit tensor (attention's weights times its values: on the GPU's
    tensor cores the weights meet the values in the values' type, as ``docs/dsl.md`` says —
    ~1e-3 on the H200, the float32 outputs of ALiBi and biased attention; Triton's interpreter
    multiplies in float32 and sees none of it), 1e-5 where all are float32 or integers."""
    sixteen = {"bf16", "f16"} & {c.dtypes[0] for c in kernel.program.outputs}
    return 2e-2 if sixteen or _weights_meet_16_bit_values(kernel.program) else 1e-5


def _weights_meet_16_bit_values(program) -> bool:
    """Whether a sum's body multiplies a 16-bit tensor's load by a value computed in the
    kernel (a reduction's result), the product the tensor cores take in the tensor's type."""
    from tensorfuse.algebra.exprs import factors, nodes
    from tensorfuse.dsl.expr import Load, Ref

    for c in program.computes:
        if c.monoid is None or c.monoid.name != "sum":
            continue
        parts = factors(c.bodies[0])
        if any(isinstance(f, Load) and f.param.dtype in ("bf16", "f16") for f in parts) and \
                any(isinstance(n, Ref) for f in parts for n in nodes(f)):
            return True
    return False


def check_cases_interpreted(module) -> None:
    """Every case of a check module (``CASES``: name → (kernel, case(generator))) through
    Triton's interpreter (:func:`check_interpreted`), within :func:`case_tolerance` of float64."""
    check_interpreted(module.__name__, module.CASES,
                      lambda name: case_tolerance(module.CASES[name][0]))


def check_cases_compiled(module, target: str) -> None:
    """Every case of a check module through ``tf.compile`` for ``target`` on fresh inputs on its
    device, outputs poisoned, within :func:`case_tolerance` of float64."""
    import warnings

    import torch

    import tensorfuse as tf

    seed = fresh_seed()
    generator = torch.Generator().manual_seed(seed)
    device = "cpu" if target == "llvm" else "cuda"
    errors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (kernel, case) in module.CASES.items():
            args, want = case(generator)
            args = {n: a.to(device) if isinstance(a, torch.Tensor) else a
                    for n, a in args.items()}
            outs = poisoned_call(tf.compile(kernel, target), kernel.program, args, want)
            wants = want if isinstance(want, tuple) else (want,)
            errors[name] = max(relative_error(o, w) for o, w in zip(outs, wants))
    _assert_within(errors, lambda name: case_tolerance(module.CASES[name][0]), seed)
