"""Calling compiled kernels: NumPy and PyTorch in and out, out= arrays, argument checks, caching."""
import numpy as np
import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import CallError, TargetError
from tensorfuse.kernels import rmsnorm, softmax


@tf.kernel
def scaled_rowsum(x: T.Tensor["M", "N", "f32"], w: T.Tensor["N", "f32"], alpha: T.f32):
    i, j = T.axes("i j")
    return T.sum(x[i, j] * w[j], over=j) * alpha


@pytest.fixture(scope="module")
def rowsum():
    return tf.compile(scaled_rowsum, target="llvm")


def test_numpy_in_numpy_out(rowsum, rng):
    x, w = rng.standard_normal((6, 5)).astype("f4"), rng.standard_normal(5).astype("f4")
    out = rowsum(x, w, 2.0)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    # against float64, within the f32 sum's rounding bound (n·2⁻²⁴ of the terms' magnitudes):
    # a relative tolerance fails rows whose terms cancel, whatever the summation order
    terms = x.astype("f8") * w
    bound = 2 * len(w) * 2.0 ** -24 * np.abs(terms).sum(1) * 2.0
    assert np.all(np.abs(out - terms.sum(1) * 2.0) <= bound)


def test_torch_in_torch_out_without_copies(rowsum):
    x, w = torch.randn(6, 5), torch.randn(5)
    out = torch.full((6,), float("nan"))
    result = rowsum(x, w, alpha=0.5, out=out)
    assert result is out  # written in place through DLPack
    torch.testing.assert_close(out, (x * w).sum(1) * 0.5)
    fresh = rowsum(x, w, 0.5)
    assert isinstance(fresh, torch.Tensor)


def test_non_contiguous_torch_output_is_filled(rowsum):
    x, w = torch.randn(6, 5), torch.randn(5)
    big = torch.full((6, 2), float("nan"))
    rowsum(x, w, 1.0, out=big[:, 0])
    torch.testing.assert_close(big[:, 0], (x * w).sum(1))
    assert torch.isnan(big[:, 1]).all()


def test_generated_kernels_get_16_byte_aligned_tensors():
    """Generated CUDA and Triton kernels copy 16-byte vectors: a contiguous view that starts
    mid-line (2 bytes into its storage) is cloned on the way in, and as out= it is written through
    a new buffer (deliver copies it back; the cluster FFN test checks that end to end on the GPU)."""
    from types import SimpleNamespace

    from tensorfuse.errors import CopiedArgumentWarning
    from tensorfuse.interop import torch_arguments, torch_output

    view = torch.arange(65, dtype=torch.float32).to(torch.bfloat16)[1:].view(8, 8)
    aligned = torch.empty(8, 8, dtype=torch.bfloat16)
    assert view.is_contiguous() and view.data_ptr() % 16 and aligned.data_ptr() % 16 == 0
    program = SimpleNamespace(name="copy", params=[SimpleNamespace(name="x")])
    with pytest.warns(CopiedArgumentWarning, match="starts 2 bytes past a 16-byte boundary"):
        x = torch_arguments(program, SimpleNamespace(scalars={}, arrays={"x": view}), "cpu")["x"]
    assert x.data_ptr() % 16 == 0 and torch.equal(x, view)
    assert torch_arguments(program, SimpleNamespace(scalars={}, arrays={"x": aligned}),
                           "cpu")["x"] is aligned
    assert torch_output((8, 8), "bf16", view, "cpu") is not view
    assert torch_output((8, 8), "bf16", aligned, "cpu") is aligned


def test_bf16_numpy_inputs(rng):
    import ml_dtypes

    x = rng.standard_normal((4, 64)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal(64).astype(ml_dtypes.bfloat16)
    out = tf.compile(rmsnorm, "llvm")(x, w, 1e-6)
    assert out.dtype == ml_dtypes.bfloat16
    xf, wf = x.astype(np.float64), w.astype(np.float64)
    ref = xf / np.sqrt((xf * xf).mean(1, keepdims=True) + 1e-6) * wf
    assert np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max() < 8e-3


def test_one_build_per_shape_signature(rowsum, rng):
    for m in (3, 4, 3):
        rowsum(rng.standard_normal((m, 5)).astype("f4"), rng.standard_normal(5).astype("f4"), 1.0)
    keys = {k for k in rowsum._executables if dict(k[0]).get("N") == 5}
    assert {dict(k[0])["M"] for k in keys} >= {3, 4}
    assert len([k for k in keys if dict(k[0])["M"] == 3]) == 1


@pytest.mark.parametrize("call, message", [
    (lambda f, x, w: f(x), "missing argument"),
    (lambda f, x, w: f(x, w, 1.0, 2.0), "takes 3 arguments"),
    (lambda f, x, w: f(x, w, alpah=1.0), "unexpected argument 'alpah'"),
    (lambda f, x, w: f(x, w, 1.0, x=x), "two values"),
    (lambda f, x, w: f(x.astype("f8"), w, 1.0), "must have dtype f32, got f64"),
    (lambda f, x, w: f(x[0], w, 1.0), "must have 2 dimensions"),
    (lambda f, x, w: f(x, w[:3], 1.0), "size N is 5"),
    (lambda f, x, w: f(x, w, "2"), "f32 scalar, got str"),
    (lambda f, x, w: f(x, 3.0, 1.0), "must be an array"),
    (lambda f, x, w: f(x, w, 1.0, out=np.zeros(7, "f4")), "must have shape (6,)"),
    (lambda f, x, w: f(np.zeros((6, 0), "f4"), w, 1.0), "empty dimension"),
])
def test_bad_calls_are_reported_before_launch(rowsum, rng, call, message):
    x, w = rng.standard_normal((6, 5)).astype("f4"), rng.standard_normal(5).astype("f4")
    with pytest.raises(CallError) as info:
        call(rowsum, x, w)
    assert message in str(info.value)
    assert __file__ in str(info.value)  # names the caller's line


def test_integer_scalar_rejects_floats():
    @tf.kernel
    def shift(x: T.Tensor["N", "f32"], k: T.i32):
        i = T.axes("i")
        return x[i] + k

    with pytest.raises(CallError, match="integer scalar"):
        tf.compile(shift, "llvm")(np.ones(3, "f4"), 1.5)


def test_fixed_dimension_is_checked():
    @tf.kernel
    def head(x: T.Tensor["N", 4, "f32"]):
        i, j = T.axes("i j")
        return T.sum(x[i, j], over=j)

    with pytest.raises(CallError, match="must have size 4 in dimension 1"):
        tf.compile(head, "llvm")(np.ones((3, 5), "f4"))


@pytest.mark.parametrize("inspect, sizes, message", [
    ("tvm_script", dict(Q=3), "no size named Q"),                      # a typo is not ignored
    ("tvm_script", dict(M=3.5), "positive integers, got M=3.5"),
    ("cluster_source", dict(M=128, K=4096), "sizes N, O not given"),   # was a bare KeyError
    ("cluster_source", dict(m=128, K=4096, N=14336, O=4096), "no size named m; size M not given"),
    ("triton_source", dict(M=0, N=128), "positive integers, got M=0"),
    # tf.compile's choice among its templates, asked by the plan: was a template's KeyError 'M'
    ("describe_plan", dict(B=2, H=16, S=4096, D=128), "no size named S; sizes M, N not given"),
    ("schedule_origin", dict(B=2, H=16, M=64, D=128), "size N not given"),
])
def test_sizes_given_by_name_are_checked(inspect, sizes, message):
    """Generated code is inspected at sizes given by name (no arrays to take them from): each
    inspection path refuses sizes the kernel does not have, lacks, or cannot have, naming them
    and the kernel's sizes."""
    if inspect == "tvm_script":
        get = tf.compile(rmsnorm, "llvm").tvm_script
        assert "T.float32" in get(M=3)   # a partial set is fine: the rest stays symbolic
    elif inspect == "cluster_source":
        sch = tf.schedule(tf.kernels.ffn_gelu, target="cuda:sm_90a")
        get = sch.cluster_distribute("n").compile().source
    elif inspect in ("describe_plan", "schedule_origin"):
        get = getattr(tf.compile(tf.kernels.causal_attention, "cuda:sm_90a"), inspect)
    else:
        get = tf.compile(softmax, "cuda:sm_90a").source
    with pytest.raises(CallError) as refused:
        get(**sizes)
    assert message in str(refused.value) and "(its sizes: " in str(refused.value), refused.value


def test_torch_tensor_on_wrong_device_for_target(rowsum):
    x = torch.randn(6, 5, device="meta")
    with pytest.raises(CallError):
        rowsum(x, torch.randn(5), 1.0)


def test_gpu_target_without_gpu_says_so(rng):
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("this machine has a GPU")
    f = tf.compile(softmax, target="cuda:sm_90a")
    with pytest.raises(TargetError, match="needs an NVIDIA GPU"):
        f(rng.standard_normal((2, 3)).astype("f4"))


def test_rocm_target_cannot_run_here(rng):
    f = tf.compile(softmax, target="rocm:gfx942")
    with pytest.raises(TargetError, match="generates AMD GPU code only"):
        f(rng.standard_normal((2, 3)).astype("f4"))


def test_large_tensors_switch_to_64_bit_indexing():
    from tensorfuse.binding import bind_call

    base = np.zeros(1, "f4")  # views with zero strides: the shapes of huge arrays, no memory
    x = np.lib.stride_tricks.as_strided(base, shape=(2**16, 2**16), strides=(0, 0))
    w = np.lib.stride_tricks.as_strided(base, shape=(2**16,), strides=(0,))
    assert bind_call(scaled_rowsum.program, (x, w, 1.0), {}, "cpu").index_dtype == "int64"
    small = bind_call(scaled_rowsum.program, (x[:4, :4], w[:4], 1.0), {}, "cpu")
    assert small.index_dtype == "int32"


def test_benchmark_returns_milliseconds(rowsum, rng):
    x, w = rng.standard_normal((64, 64)).astype("f4"), rng.standard_normal(64).astype("f4")
    ms = rowsum.benchmark(x, w, 1.0, repeat=3, min_repeat_ms=1)
    assert 0 < ms < 1000


def test_a_size_the_kernel_fixes_is_checked_by_name_and_by_call():
    """One check (Program.fixed_size_conflicts) for sizes given by name and sizes from arrays."""
    @tf.kernel
    def window(x: T.Tensor["N", "f32"]):
        i = T.axis("i", 4)
        return x[i] * 2.0

    f = tf.compile(window, "llvm")
    with pytest.raises(CallError, match="size N is 5 here, but the kernel uses it as size 4"):
        f.tvm_script(N=5)
    with pytest.raises(CallError, match="size N is 5 here, but the kernel uses it as size 4"):
        f(np.ones(5, "f4"))
    np.testing.assert_array_equal(f(np.ones(4, "f4")), np.full(4, 2.0, "f4"))


@tf.kernel
def _nested(x: T.Tensor["B", "M", "N", "f32"]):
    b, i, j = T.axes("b i j")
    return T.max(T.sum(x[b, i, j], over=j), over=i)


@tf.kernel
def _over_two_axes(x: T.Tensor["B", "M", "N", "f32"]):
    """A sum over two axes at once, written in the other order than the tensors and the output
    hold them: swept as one axis in their order (a sum's value is the same in any), whole."""
    b, i, j = T.axes("b i j")
    return x[b, i, j] - T.sum(x[b, i, j], over=(j, i))


# a user's monoid of two components (a sum and a count)
_SUM_COUNT = T.Monoid("sum_count", lambda s, n, t, m: (s + t, n + m), (0.0, 0.0), arity=2)


@tf.kernel
def _user_monoid_over_two_axes(x: T.Tensor["B", "M", "N", "f32"]):
    """As above with a user's pair monoid."""
    b, i, j = T.axes("b i j")
    total = T.reduce((x[b, i, j], 1.0), over=(j, i), monoid=_SUM_COUNT)
    return x[b, i, j] - total[0] / total[1]


@tf.kernel
def _user_monoid_mean_over_two_axes(x: T.Tensor["B", "M", "N", "f32"]):
    """The pair's mean alone: one stage (no elementwise pass after it for a template to take)."""
    b, i, j = T.axes("b i j")
    total = T.reduce((x[b, i, j], 1.0), over=(j, i), monoid=_SUM_COUNT)
    return total[0] / total[1]


def _compiled_for_sm80(kernel):
    """``tf.compile(kernel, "cuda:sm_80")`` and its schedule_origin at one size, with the warnings
    they gave."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = tf.compile(kernel, "cuda:sm_80")
        f.schedule_origin(B=2, M=32, N=64)
    return f, caught


def test_a_gpu_kernel_no_template_takes_says_so_once_and_why(monkeypatch):
    """The fallback where no stage has a template either is TVM's default schedule, unfused:
    compile warns once, and schedule_origin() names the path and the refusal. (A user's monoid
    is a state of the row template wherever Triton can write its combine expressions; here the
    template is told it cannot, as for an operation the Triton writer lacks.)"""
    from tensorfuse.errors import NoTemplateWarning
    from tensorfuse.schedule_templates import tile_plan
    from tensorfuse.targets.triton import row_states

    f, caught = _compiled_for_sm80(_user_monoid_over_two_axes)   # the pair on the row template
    assert "it runs as 2 kernels, each with its own template" in str(caught[0].message)
    assert "j, i swept as one axis of N × M elements: template defaults" in \
        f.schedule_origin(B=2, M=32, N=64)
    for module in (tile_plan, row_states):
        monkeypatch.setattr(module, "reducible", lambda monoid: monoid.arity == 1)
    f, caught = _compiled_for_sm80(_user_monoid_mean_over_two_axes)
    assert [w.category for w in caught] == [NoTemplateWarning]
    assert "no template takes _user_monoid_mean_over_two_axes on cuda:sm_80" in \
        str(caught[0].message)
    origin = f.schedule_origin(B=2, M=32, N=64)
    assert origin == ("TVM's default GPU schedule, unfused (no template takes "
                      "_user_monoid_mean_over_two_axes: it has no reductions over one axis to "
                      "fuse)"), origin
    # with an elementwise pass after the pair: that stage on the elementwise template
    f, caught = _compiled_for_sm80(_user_monoid_over_two_axes)
    origin = f.schedule_origin(B=2, M=32, N=64)
    assert origin.startswith("staged: 2 kernels") and "[1] out_sum_count_0 from x: TVM's " \
        "default" in origin and "elementwise template" in origin, origin
    # a sum over (j, i) of x[b, i, j] is swept in the tensors' order (i, j), with its output
    f, caught = _compiled_for_sm80(_over_two_axes)
    assert caught == []
    assert f.schedule_origin(B=2, M=32, N=64) == \
        "i, j swept as one axis of M × N elements: template defaults"


def test_a_gpu_kernel_no_template_takes_whole_runs_in_stages_and_says_so_once():
    """A max of row sums: the max needs every sum's final value, so the sums are one row-tile
    kernel and the max another; compile warns once, schedule_origin() names both and why."""
    from tensorfuse.errors import NoTemplateWarning

    f, caught = _compiled_for_sm80(_nested)
    assert [w.category for w in caught] == [NoTemplateWarning]
    assert "no template takes _nested whole on cuda:sm_80" in str(caught[0].message)
    origin = f.schedule_origin(B=2, M=32, N=64)
    assert origin.startswith("staged: 2 kernels"), origin
    assert "out_sum over j" in origin and "[1] out_sum from x: template defaults" in origin and \
        "[2] out from out_sum: template defaults" in origin


def test_a_compiled_kernels_plan_and_origin_take_scalar_values_by_name_among_the_sizes():
    """``describe_plan(M=…, eps=…)`` as on every other kernel: a scalar given by name is passed
    over by TVM's schedule (it used to be refused as a size named ``eps``)."""
    made = tf.compile(rmsnorm, "cpu")
    assert made.describe_plan(M=4, N=8, eps=1e-5) == made.schedule_origin(M=4, N=8)
    assert made.schedule_origin(M=4, N=8, eps=1e-5) == made.schedule_origin(M=4, N=8)
