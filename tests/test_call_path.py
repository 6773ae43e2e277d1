"""What a repeated call does: its arguments are checked once per signature (a lookup after that),
nothing is lowered or built again, and nothing is allocated besides the outputs (and, for the
split update, one scratch buffer). Counted, not timed: CI has no GPU."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.binding import signature_key
from tensorfuse.errors import CallError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@tf.kernel
def rms(x: T.Tensor["M", "N", "f32"], w: T.Tensor["N", "f32"], eps: T.f32):
    i, j = T.axes("i j")
    return x[i, j] * T.rsqrt(T.sum(x[i, j] * x[i, j], over=j) / T.size("N") + eps) * w[j]


def test_a_repeated_call_is_checked_once_per_signature(rng):
    f = tf.compile(rms, "llvm")
    x = rng.standard_normal((8, 64)).astype("f4")
    w = rng.standard_normal(64).astype("f4")
    first = f(x, w, eps=1e-5)
    for _ in range(5):
        again = f(x, w, eps=1e-5)
    np.testing.assert_array_equal(first, again)
    assert f._calls.checks == 1 and len(f._executables) == 1
    f(rng.standard_normal((4, 64)).astype("f4"), w, eps=1e-5)      # a new signature
    assert f._calls.checks == 2 and len(f._executables) == 2
    with pytest.raises(CallError, match="dtype f32, got f64"):      # still checked in full
        f(x.astype("f8"), w, eps=1e-5)
    with pytest.raises(CallError, match="size N is 64"):
        f(x, rng.standard_normal(32).astype("f4"), eps=1e-5)


def test_signature_keys_tell_apart_what_generated_code_depends_on():
    a = np.zeros((2, 3), "f4")
    assert signature_key((a, 0.5), {}) == signature_key((np.ones((2, 3), "f4"), 0.25), {})
    assert signature_key((a,), {}) != signature_key((a.astype("f8"),), {})
    assert signature_key((a,), {}) != signature_key((np.zeros((3, 2), "f4"),), {})
    # integer scalars by what Triton specialises on: equal to 1, multiples of 16
    assert signature_key((a, 32), {}) == signature_key((a, 48), {})
    assert signature_key((a, 32), {}) != signature_key((a, 33), {})
    assert signature_key((a, 1), {}) != signature_key((a, 3), {})
    assert signature_key((a,), {"out": a}) != signature_key((a,), {})
    assert signature_key((object(),), {}) is None    # unknown kinds: always checked in full


@pytest.mark.skipif(not __import__("importlib").util.find_spec("triton"), reason="needs triton")
def test_template_kernels_reuse_their_launches():
    proc = subprocess.run([sys.executable, "-m", "tests.schedule_templates.call_counts"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["same_shape"] == {"checks": 1, "builds": 1, "launch_plans": 1,
                                    "last_call_allocations": 1}   # the output
    assert counts["two_shapes"]["checks"] == 2 and counts["two_shapes"]["launch_plans"] == 2
    assert counts["two_shapes"]["last_call_allocations"] == 1
    assert "argument x must have dtype bf16, got f32" in counts["wrong_dtype"]
    # the split update: the output and one buffer for the parts' states
    assert counts["split_update"] == {"checks": 1, "builds": 1, "launch_plans": 1,
                                      "last_call_allocations": 2}


def test_a_fast_call_hands_the_launcher_each_argument_in_its_slot(monkeypatch):
    """The fast path's bookkeeping, with the C launch function stood in for: which address or
    value goes where, the outputs and scratch allocated per call, the constexprs last; and the
    checked path taken for a tensor the compiled kernel cannot read as it is."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from tensorfuse.targets.triton import launcher

    launched = []

    def launch(*args):
        launched.append(args)

    runtime = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    runtime.launch_enter_hook = runtime.launch_exit_hook = SimpleNamespace(calls=[])
    active = SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda d: 77)
    monkeypatch.setattr(launcher, "_TRITON", [runtime, active])
    monkeypatch.setattr(launcher.native_launch, "launcher", lambda: None)   # Triton's launcher
    steps = []
    for names in (["q", "k", "scale", "part_s"], ["part_s", "out_o"]):
        step = launcher.Step(None, (3, 2), names, {"q", "k", "out_o"})
        step.compiled = SimpleNamespace(function="fn", packed_metadata="pm",
                                        launch_metadata=lambda grid, stream, *a: ("meta", grid))
        step.raw = (launch, 0, 0)
        steps.append(step)
    launches = launcher.Launches(steps, dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128), 4, 2)
    fast = launcher.FastCall([("q", 0, True), ("k", "k", True), ("scale", "scale", float)],
                             [("out_o", (2, 5), "f32")], ([("part_s", (2, 4), 0)], 32),
                             launches, "cpu")
    fast.current_device = lambda: 0       # no CUDA here
    q, k = torch.ones(4), torch.ones(6)
    out = fast((q,), {"k": k, "scale": 2})
    assert out.shape == (2, 5) and out.dtype == torch.float32
    first, second = launched
    assert first[:5] == (3, 2, 1, 77, "fn") and first[9] == "pm"
    ptr_q, ptr_k, scale, part = first[13:17]
    assert (ptr_q, ptr_k, scale) == (q.data_ptr(), k.data_ptr(), 2.0)
    assert first[17:] == (16, 64, 128)                       # the constexprs, in order
    assert second[13] == part and second[14] == out.data_ptr()
    assert first[10:13] == (None, None, None)   # empty hook chains: nothing to call
    hook = SimpleNamespace(calls=[print])    # a profiler's launch hook gets what the JIT gives it
    runtime.launch_enter_hook = hook
    fast((q,), {"k": k, "scale": 2})
    assert launched[-1][10:12] == (("meta", (3, 2, 1)), hook)
    misaligned = torch.ones(8)[1:5]                          # 4 bytes in: not 16-byte aligned
    assert fast((misaligned,), {"k": k, "scale": 2.0}) is None
    assert fast((torch.ones(4, 2).t(),), {"k": k, "scale": 2.0}) is None   # not contiguous


def test_a_fast_call_goes_through_the_c_launcher_unless_a_hook_is_set(monkeypatch):
    """With the C launcher available, every step of a call goes through it with its own
    configuration and only the values Triton did not make constexpr; a profiler's launch hook, or
    a thread without a CUDA context (the launcher says False), sends the call to Triton's."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from tensorfuse.targets.triton import launcher, native_launch

    native, triton_launches = [], []

    def c_launch(config, stream, *values):
        native.append((config, stream, values))
        return not no_context

    no_context = False
    monkeypatch.setattr(native_launch, "launcher", lambda: SimpleNamespace(launch=c_launch))
    runtime = SimpleNamespace(launch_enter_hook=SimpleNamespace(calls=[]),
                              launch_exit_hook=SimpleNamespace(calls=[]))
    active = SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda d: 77)
    monkeypatch.setattr(launcher, "_TRITON", [runtime, active])
    steps = []
    for k, names in enumerate((["x", "n", "part"], ["part", "out_y"])):
        step = launcher.Step(None, (5, 1), names, {"x", "part", "out_y"})
        types = {"x": "*bf16", "n": "constexpr", "part": "*fp32", "out_y": "*bf16"}
        signature = {**{n: types[n] for n in names}, "BLOCK_M": "constexpr"}
        step.compiled = SimpleNamespace(
            function=100 + k, packed_metadata="pm", src=SimpleNamespace(signature=signature),
            metadata=SimpleNamespace(num_ctas=1, num_warps=4, shared=1024),
            launch_metadata=lambda grid, stream, *a: ("meta", grid))
        step.raw = (lambda *a: triton_launches.append(a), 0, 0)
        steps.append(step)
    launches = launcher.Launches(steps, dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128), 4, 1)
    fast = launcher.FastCall([("x", 0, True), ("n", 1, int)], [("out_y", (2, 3), "bf16")],
                             ([("part", (4,), 0)], 16), launches, "cpu")
    fast.current_device = lambda: 0
    x = torch.ones(8)
    out = fast((x, 1), {})
    assert fast.native_calls == 1 and not triton_launches
    (first, s1, v1), (second, s2, v2) = native
    assert s1 == s2 == 77 and v1[0] == x.data_ptr() and len(v1) == 2   # n is Triton's constexpr
    assert v2 == (v1[1], out.data_ptr())
    fields = native_launch.CONFIG.unpack(first)
    assert fields[:7] == (100, 5, 1, 1, 128, 1024, 4) and fields[7][:4] == b"LLzz"
    runtime.launch_enter_hook = SimpleNamespace(calls=[print])   # a profiler is listening
    fast((x, 1), {})
    assert len(native) == 2 and len(triton_launches) == 2
    runtime.launch_enter_hook = SimpleNamespace(calls=[])
    no_context = True
    fast((x, 1), {})
    assert len(native) == 3 and len(triton_launches) == 4 and fast.native_calls == 1
