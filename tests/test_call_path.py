"""What a repeated call does: its arguments are checked once per signature (a lookup after that),
nothing is lowered or built again, and nothing is allocated besides the outputs (and, for the
split update, one scratch buffer). Counted, not timed: CI has no GPU."""

import numpy as np
import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.binding import signature_key
from tensorfuse.errors import CallError
from tests.helpers import run_interpreted



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


def test_a_binding_handed_over_is_not_checked_again(rng):
    """``AutoKernel`` binds a new signature to pick its kernel and hands the binding to the
    kernel it picked, which then copies it rather than checking the call a second time."""
    from tensorfuse.binding import bind_call, signature_key

    f = tf.compile(rms, "llvm")
    x = rng.standard_normal((8, 64)).astype("f4")
    w = rng.standard_normal(64).astype("f4")
    key = signature_key((x, w), {"eps": 1e-5})
    f._calls.remember(key, bind_call(f.program, (x, w), {"eps": 1e-5}, "cpu"))
    got = f(x, w, eps=1e-5)
    assert f._calls.checks == 0
    want = x / np.sqrt((x.astype("f8") ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_kernel_keeps_no_argument_of_its_calls_alive(rng):
    """What a kernel remembers of a signature holds none of the call's tensors: a decode loop
    whose cache grows a key a step (a new signature each step) would keep every step's cache."""
    import gc
    import weakref

    torch = pytest.importorskip("torch")
    f = tf.compile(rms, "llvm")
    gone = []
    for n in (64, 96, 64):
        x = torch.randn(8, n)
        w = torch.randn(n)
        out = f(x, w, eps=1e-5)
        gone += [weakref.ref(x), weakref.ref(w), weakref.ref(out)]
        del x, w, out
    gc.collect()
    assert all(ref() is None for ref in gone), "a kernel kept a call's tensor alive"
    assert f._calls.checks == 2


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
    counts = run_interpreted("tests.schedule_templates.call_counts", timeout=600)
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


def test_a_fast_call_allocates_outputs_like_an_input_of_their_shape(monkeypatch):
    """An output with the shape and dtype of a tensor argument is made by ``empty_like`` of it
    (cheaper on the host than ``torch.empty``): a new, contiguous tensor, never the input."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from tensorfuse.targets.triton import launcher

    runtime = SimpleNamespace(launch_enter_hook=SimpleNamespace(calls=[]),
                              launch_exit_hook=SimpleNamespace(calls=[]))
    active = SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda d: 7)
    monkeypatch.setattr(launcher, "_TRITON", [runtime, active])
    launched = []
    step = launcher.Step(None, (1,), ["x", "w", "out_y", "out_s"], {"x", "w", "out_y", "out_s"})
    step.compiled = SimpleNamespace(function="fn", packed_metadata="pm")
    step.raw = (lambda *a: launched.append(a), 0, 0)
    launches = launcher.Launches([step], dict(BLOCK_M=1, BLOCK_N=64, BLOCK_K=16), 4, 1)
    made = []
    monkeypatch.setattr(torch, "empty_like", lambda t: made.append(t) or torch.zeros_like(t))
    fast = launcher.FastCall([("x", 0, True), ("w", 1, True)],
                             [("out_y", (3, 4), "f32"), ("out_s", (3,), "f32")], None, launches,
                             "cpu", likes=[0, None])
    fast.current_device = lambda: 0
    x, w = torch.ones(3, 4), torch.ones(4)
    y, s = fast((x, w), {})
    assert made == [x] and y.shape == (3, 4) and y.data_ptr() != x.data_ptr()
    assert y.is_contiguous() and s.shape == (3,)
    assert launched[0][13:17] == (x.data_ptr(), w.data_ptr(), y.data_ptr(), s.data_ptr())


def test_a_fast_call_declines_other_values_of_the_scalars_records_are_kept_per():
    """A fast call made for window=256 leaves a call with window=512 to the checked path (whose
    launches may have other knobs: tuning records are kept per window), and says it is stale."""
    pytest.importorskip("torch")
    from tensorfuse.targets.triton.launcher import META, FastCall, Launches

    launches = Launches([], {k: 16 for k in META}, 4, 2)
    fast = FastCall([("x", 0, True), ("window", 1, int)], [], None, launches, "cpu",
                    guards=[(1, 256)])
    assert fast(("tensor", 512), {}) is None and fast.declined == 1 and fast.stale
    keyword = FastCall([("x", 0, True), ("window", "window", int)], [], None, launches, "cpu",
                       guards=[("window", 256)])
    assert keyword(("tensor",), {"window": 128}) is None and keyword.stale


def test_kept_scratch_is_one_set_per_stream_and_the_graphs_own_in_a_capture(monkeypatch):
    """Counters and workspaces a kernel keeps between launches: one set per (device, stream) —
    two streams never share them —, zeroed once where asked; inside a capture a fresh set."""
    import torch

    import tensorfuse.interop as interop

    made = []

    def kept_empty(shape, dtype, device):
        made.append((shape, dtype))
        return torch.full(shape, 7, dtype=interop.torch_dtype(dtype))

    class Stream:
        def __init__(self, n):
            self.cuda_stream = n

    stream = [Stream(1)]
    monkeypatch.setattr(interop, "kept_empty", kept_empty)
    monkeypatch.setattr(interop, "capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream[0])
    scratch = interop.StreamScratch([((4,), "f32", False), ((2,), "i32", True)])
    cuda0 = torch.device("cuda", 0)
    first = scratch(cuda0)
    assert scratch(cuda0) is first and len(made) == 2
    assert first[1].tolist() == [0, 0] and first[0].tolist() == [7.0] * 4   # only the counters
    stream[0] = Stream(2)
    second = scratch(cuda0)
    assert second is not first and second[1] is not first[1] and len(made) == 4
    monkeypatch.setattr(interop, "capturing", lambda: True)
    captured = scratch("cpu")          # a temporary of the graph's pool (here: the CPU)
    assert captured[1].tolist() == [0, 0] and len(made) == 4


def test_a_generated_cuda_fast_call_runs_the_launches_with_the_calls_values(monkeypatch):
    """The generated-CUDA kernels' fast path: the launches' ``run`` gets every parameter by name
    (tensors as given, scalars converted), a new output, the kept module, on torch's stream of
    the kernel's device; an unaligned or strided tensor, or another value of a guarded scalar,
    is left to the checked path."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from tensorfuse.targets.cuda import kernel

    streams, ran = [], []
    monkeypatch.setattr(kernel, "on_torch_stream",
                        lambda index, launch, *args: streams.append(index) or launch(*args))
    launches = SimpleNamespace(run=lambda module, values, out, device: ran.append(
        (module, values, out, device)), module="built module")
    fast = kernel.ClusterFastCall([("q", 0, True), ("k", 1, True), ("scale", "scale", float),
                                   ("width", "width", int)],
                                  [("o", (4,), "f32"), ("lse", (2,), "f32")], launches,
                                  torch.device("cuda", 1), likes=[0, None],
                                  guards=[("width", 64)])
    fast.device = "cpu"        # the outputs' device (no CUDA here)
    q, k = torch.ones(4), torch.ones(6)
    o, lse = fast((q, k), {"scale": 1, "width": 64})
    module, values, out, _ = ran[-1]
    assert module == "built module" and streams == [1]
    assert values == {"q": q, "k": k, "scale": 1.0, "width": 64}
    assert type(values["scale"]) is float and out == (o, lse)
    assert o.shape == (4,) and lse.shape == (2,) and o.data_ptr() != q.data_ptr()
    assert fast((torch.ones(8)[1:5], k), {"scale": 1, "width": 64}) is None   # 4 bytes in
    assert fast((torch.ones(4, 2).t(), k), {"scale": 1, "width": 64}) is None  # strided
    assert not fast.stale and fast.declined == 2
    assert fast((q, k), {"scale": 1, "width": 32}) is None and fast.stale
    assert len(ran) == 1 and fast.calls == 1


def test_a_fast_call_writes_the_callers_out_in_place(monkeypatch):
    """``out=`` on the fast path: the launches write the caller's tensors and the call returns
    those very tensors (no buffer, no copy); an out that is strided or off a 16-byte boundary is
    left to the checked path (which writes a buffer and copies it in)."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from tensorfuse.targets.cuda import kernel
    from tensorfuse.targets.signature_call import fast_call_applies

    monkeypatch.setattr(kernel, "on_torch_stream", lambda index, launch, *args: launch(*args))
    ran = []
    launches = SimpleNamespace(run=lambda module, values, out, device: ran.append(out),
                               module="built module")
    fast = kernel.ClusterFastCall([("q", 0, True)], [("o", (4,), "f32")], launches,
                                  torch.device("cuda", 0))
    fast.device = "cpu"
    q, out = torch.ones(4), torch.full((4,), float("nan"))
    assert fast((q,), {"out": out}) is out and ran == [out]
    assert fast((q,), {"out": torch.ones(8)[1:5]}) is None          # 4 bytes off
    assert fast((q,), {"out": torch.ones(4, 2).t()[0]}) is None      # strided
    assert fast.declined == 2 and fast.calls == 1 and len(ran) == 1
    two = kernel.ClusterFastCall([("q", 0, True)], [("o", (4,), "f32"), ("lse", (2,), "f32")],
                                 launches, torch.device("cuda", 0))
    two.device = "cpu"
    pair = (torch.empty(4), torch.empty(2))
    got = two((q,), {"out": pair})
    assert got[0] is pair[0] and got[1] is pair[1]
    bound = SimpleNamespace(framework="torch", arrays={"q": q}, outs=[out])
    assert fast_call_applies(bound, "cuda")
    assert not fast_call_applies(SimpleNamespace(**{**vars(bound), "outs": [out.numpy()]}),
                                 "cuda")


def test_tvm_launches_go_on_torch_stream_and_the_previous_one_comes_back(monkeypatch):
    """``on_torch_stream`` sets TVM's current stream of the device to torch's current one for the
    launch and puts the previous one back, also when the launch raises."""
    torch = pytest.importorskip("torch")
    from tvm_ffi import core

    from tensorfuse.targets.cuda.kernel import on_torch_stream

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 4242 + index,
                        raising=False)
    seen = []

    def launch(tag):
        seen.append((tag, core._env_set_current_stream(2, 3, 99)))
        core._env_set_current_stream(2, 3, 4245)   # what the launch found, put back

    before = core._env_set_current_stream(2, 3, 7)
    on_torch_stream(3, launch, "a")
    assert seen == [("a", 4245)]
    assert core._env_set_current_stream(2, 3, 7) == 7
    with pytest.raises(ZeroDivisionError):
        on_torch_stream(3, lambda: 1 / 0)
    assert core._env_set_current_stream(2, 3, before) == 7


@pytest.mark.gpu
def test_generated_cuda_kernels_repeat_calls_on_their_fast_path():
    """``tf.compile``'s Hopper attention on the H100: a repeated signature runs on its fast call
    and gives the float64 answer; an unaligned view is left to the checked path (which copies
    it) and is still right; a document mask rewritten in place between calls is read again (its
    block lists are keyed by the tensor's version); a 2-D map's other radius (a guarded scalar:
    the launches were made per value) takes the checked path and gets a fast call of its own."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    import tensorfuse.kernels as K
    from benchmarks.attention import reference
    from benchmarks.common import relative_error
    from tensorfuse.targets.cuda.kernel import ClusterFastCall

    B, H, S, D = 2, 2, 600, 128
    scale = D ** -0.5

    def fresh():
        return [torch.randn(B, H, S, D, device="cuda").to(torch.bfloat16) for _ in range(3)]

    f = tf.compile(K.causal_attention)
    q, k, v = fresh()
    causal = lambda b, h, i, j: i >= j  # noqa: E731
    f(q, k, v, scale)
    fast = [x for x in f._fast.values() if isinstance(x, ClusterFastCall)]
    assert len(fast) == 1, f._fast
    q, k, v = fresh()
    out = f(q, k, v, scale)
    assert fast[0].calls == 1
    assert relative_error(out.double(), reference(q, k, v, scale, None, causal)) <= 2e-2
    storage = torch.randn(q.numel() + 1, device="cuda").to(torch.bfloat16)
    shifted = storage[1:].view(q.shape)                   # 2 bytes past a 16-byte boundary
    out = f(shifted, k, v, scale)
    assert fast[0].declined >= 1 and fast[0].calls == 1   # (tf.compile's and the kernel's try)
    assert relative_error(out.double(), reference(shifted, k, v, scale, None, causal)) <= 2e-2

    f = tf.compile(K.document_attention)
    doc = (torch.arange(S, device="cuda") // 97).repeat(B, 1).to(torch.int32)
    same_doc = lambda b, h, i, j: doc[b, i] == doc[b, j]  # noqa: E731
    f(q, k, v, doc, scale)
    doc.copy_((torch.arange(S, device="cuda") // 41).repeat(B, 1))   # rewritten in place
    out = f(q, k, v, doc, scale)
    assert sum(x.calls for x in f._fast.values()) == 1
    assert relative_error(out.double(), reference(q, k, v, scale, None, same_doc)) <= 2e-2

    f = tf.compile(K.neighborhood_attention_2d)
    q, k, v = (torch.randn(1, 2, 1024, D, device="cuda").to(torch.bfloat16) for _ in range(3))

    def window(radius):
        def keep(b, h, i, j):
            return ((i // 32 - j // 32).abs() <= radius) & ((i % 32 - j % 32).abs() <= radius)
        return keep

    for radius in (3, 3, 5, 5):
        out = f(q, k, v, scale, width=32, radius=radius, dilation=1)
        assert relative_error(out.double(), reference(q, k, v, scale, None, window(radius))) \
            <= 2e-2
    # one fast call per radius (tf.compile's choice is keyed by the map's scalars), each used once
    assert [(type(x), x.calls) for x in f._fast.values()] == [(ClusterFastCall, 1)] * 2


def test_the_capture_query_asks_for_cuda_once_it_is_there(monkeypatch):
    """``capturing()`` runs on every launch of a kernel with kept buffers: CUDA's presence is
    asked until it is found (an environment read each time), then only the capture state."""
    torch = pytest.importorskip("torch")
    from tensorfuse import interop

    asked, present = [], [False]
    monkeypatch.setattr(interop, "_CUDA_PRESENT", [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or present[0])
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: True, raising=False)
    assert not interop.capturing() and not interop.capturing() and len(asked) == 2
    present[0] = True
    assert interop.capturing() and interop.capturing() and len(asked) == 3


@pytest.mark.gpu
def test_repeated_calls_with_out_run_on_the_fast_path_into_out():
    """A Triton row kernel and the Hopper attention called again with ``out=``: the fast call
    runs (counted), writes the given tensor in place (poisoned first) and returns it."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    import tensorfuse.kernels as K
    from tensorfuse.targets.signature_call import SignatureCall

    x = torch.randn(64, 1000, device="cuda").to(torch.bfloat16)
    cases = [(tf.compile(K.softmax), (x,), torch.softmax(x.double(), -1))]
    if torch.cuda.get_device_capability() == (9, 0):
        q, k, v = (torch.randn(1, 2, 300, 128, device="cuda").to(torch.bfloat16)
                   for _ in range(3))
        s = (q.double() @ k.double().transpose(-1, -2)) * 0.1
        cases.append((tf.compile(K.attention), (q, k, v, 0.1), torch.softmax(s, -1) @ v.double()))
    for f, args, want in cases:
        out = torch.empty(want.shape, device="cuda", dtype=torch.bfloat16)
        f(*args, out=out)
        fast = [c for c in f._fast.values() if isinstance(c, SignatureCall)]
        assert len(fast) == 1, f._fast
        out.fill_(float("nan"))
        assert f(*args, out=out) is out and fast[0].calls == 1
        assert (out.double() - want).abs().max() / want.abs().max() < 2e-2


def test_a_kept_fast_call_launches_the_arguments_outputs_and_sizes_in_the_kernels_order(
        monkeypatch):
    """``launcher.remember_fast_call`` (every Triton template's fast call): a repeated call hands
    the launch the tensors' addresses, the new outputs' and the sizes the kernel reads as
    arguments, each where the kernel's argument names put them, the scalars by value; none is
    kept where a kernel has no direct launch (or the call is not torch on the GPU)."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from tensorfuse.targets.triton import launcher

    @tf.kernel
    def scaled(x: T.Tensor["M", "N", "f32"], w: T.Tensor["N", "f32"], s: T.f32):
        i, j = T.axes("i j")
        return x[i, j] * w[j] * s

    x, w = torch.randn(3, 4), torch.randn(4)
    bound = SimpleNamespace(framework="torch", arrays={"x": x, "w": w}, scalars={"s": 2.0},
                            outs=None, dims={"M": 3, "N": 4}, torch_device=torch.device("cpu"))
    binder = SimpleNamespace(target_device="cuda", scalar_kinds={"s": float})
    from tensorfuse.dsl.symbolic_sizes import PREFIX

    names = ["w", "s", "out_out", PREFIX + "N", "x"]   # the kernel's arguments, in its order
    step = SimpleNamespace(raw="raw launch", compiled="compiled", grid=(1, 1, 1), names=names)
    launches = SimpleNamespace(steps=[step], constexprs=[8])
    outputs = [("out_out", (3, 4), "f32")]
    calls: dict = {}
    launcher.remember_fast_call(calls, "key", scaled.program, (x, w, 2.0), bound, binder,
                                outputs, launches)
    fast = calls["key"]
    launched = []
    monkeypatch.setattr(launcher, "launch_raw", lambda raw, kernel, grid, stream, args, *_:
                        launched.append((raw, kernel, args)))
    active = SimpleNamespace(get_current_stream=lambda device: "stream")
    monkeypatch.setattr(launcher, "_triton", lambda: (SimpleNamespace(
        launch_enter_hook=None, launch_exit_hook=None), active))
    fast.current_device = lambda: 0
    out = fast((x, w, 3.0), {})
    assert out.shape == (3, 4)
    assert launched == [("raw launch", "compiled",
                         [w.data_ptr(), 3.0, out.data_ptr(), 4, x.data_ptr(), 8])]
    step.raw, kept = None, {}
    launcher.remember_fast_call(kept, "key", scaled.program, (x, w, 2.0), bound, binder,
                                outputs, launches)
    assert kept == {}


def test_tensors_read_by_their_strides_are_taken_as_given_where_tma_reads_them():
    """``tma_servable``: TMA reads a view whose innermost axis is contiguous, whose start is
    16-byte aligned and whose other strides are positive multiples of 16 bytes (a packed
    projection's slice, a transposed view; an axis of one element whatever its stride).
    ``torch_arguments`` keeps such a tensor as given only where the kernel reads it by its
    strides; every other one arrives contiguous, as before."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from tensorfuse.interop import tma_servable, torch_arguments

    qkv = torch.zeros(2, 5, 3, 4, 64, dtype=torch.bfloat16)
    assert all(tma_servable(qkv[:, :, c]) for c in range(3))
    assert tma_servable(qkv[:, :, 0].transpose(1, 2))          # [B, H, S, D] by strides
    flat = torch.zeros(2 * 4 * 64 + 1, dtype=torch.bfloat16)
    assert tma_servable(flat[:-1].as_strided((2, 1, 4, 64), (256, 3, 64, 1)))   # one element
    assert not tma_servable(flat[1:].view(2, 4, 64))            # 2 bytes in
    assert not tma_servable(qkv[:, :, 0].transpose(2, 3))       # head dim not innermost
    assert not tma_servable(torch.zeros(8, 12, dtype=torch.bfloat16)[:, :4])   # 24-byte rows
    assert not tma_servable(torch.zeros(1, 64, dtype=torch.bfloat16).expand(8, 64))
    program = SimpleNamespace(name="attention",
                              params=[SimpleNamespace(name=n) for n in ("q", "k")])
    view = qkv[:, :, 1]
    bound = SimpleNamespace(scalars={}, arrays={"q": view, "k": view})
    values = torch_arguments(program, bound, "cpu", strided=("q",))
    assert values["q"] is view
    assert values["k"] is not view and values["k"].is_contiguous()
    assert torch.equal(values["k"], view)


def test_a_generated_cuda_fast_call_takes_strided_views_where_the_kernel_reads_strides(
        monkeypatch):
    """A fast call of launches that read q by its strides hands a TMA-readable view of q on as
    it is (a view TMA cannot read, and any strided k, are left to the checked path), and makes
    no output like such a q (``empty_like`` keeps a dense view's order)."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from tensorfuse.targets.cuda import kernel

    monkeypatch.setattr(kernel, "on_torch_stream", lambda index, launch, *args: launch(*args))
    ran = []
    launches = SimpleNamespace(run=lambda module, values, out, device: ran.append(values),
                               module="built module")
    fast = kernel.ClusterFastCall([("q", 0, True), ("k", 1, True)], [("o", (4, 2, 64), "bf16")],
                                  launches, torch.device("cuda", 0), likes=[0], strided=("q",))
    fast.device = "cpu"
    packed = torch.randn(2, 4, 3, 64).bfloat16()
    q, k = packed[:, :, 0].transpose(0, 1), torch.ones(6).bfloat16()
    out = fast((q, k), {})
    assert ran[-1]["q"] is q and out.is_contiguous() and out.shape == (4, 2, 64)
    assert fast((packed[..., 1:33].transpose(0, 1)[:, :, 0], k), {}) is None   # 2 bytes in
    assert fast((q, torch.ones(6, 2).bfloat16()[:, 0]), {}) is None            # k strided
    assert fast.declined == 2 and len(ran) == 1
