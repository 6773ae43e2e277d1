"""Compiled kernels inside torch.compile: each is a PyTorch custom operator (no graph break under
``fullgraph=True``), passes ``torch.library.opcheck``, and gives the same results traced as eager."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tensorfuse as tf  # noqa: E402
import tensorfuse.kernels as K  # noqa: E402
from tensorfuse import dsl as T  # noqa: E402
from tensorfuse.interop import torch_from_numpy  # noqa: E402
from tensorfuse.kernels.reference import TOLERANCE, random_inputs, reference, relative_error  # noqa: E402
from tensorfuse.torch_graph import schema  # noqa: E402

from .kernels.test_library_cpu import sizes_for  # noqa: E402

SMALL = {"attention": dict(B=1, H=2, M=9, N=9, D=8), "rows": dict(M=3, N=40, V=40),
         "ffn": dict(M=3, K=8, N=16, O=8)}


def torch_inputs(kernel, sizes, rng):
    tensors, scalars = random_inputs(kernel, sizes, rng)
    return {n: torch_from_numpy(a, "cpu") for n, a in tensors.items()}, scalars


def ordered(kernel, tensors, scalars):
    given = {**tensors, **scalars}
    return tuple(given[p.name] for p in kernel.program.params)


@pytest.mark.parametrize("name", sorted(K.ALL))
def test_library_kernel_passes_opcheck(name, rng):
    """Schema, fake (meta) implementation, dynamic-shape AOT tracing: torch's own checks."""
    kernel = K.ALL[name]
    compiled = tf.compile(kernel, target="llvm")
    tensors, scalars = torch_inputs(kernel, sizes_for(name, SMALL), rng)
    torch.library.opcheck(compiled.torch_op.op, ordered(kernel, tensors, scalars))


def test_fullgraph_compile_matches_reference_and_eager(rng):
    sizes = dict(B=1, H=4, HKV=2, M=12, N=12, D=16)
    kernel = tf.compile(K.gqa_causal_attention, target="llvm")
    tensors, scalars = torch_inputs(K.gqa_causal_attention, sizes, rng)

    @torch.compile(fullgraph=True)
    def block(q, k, v):   # torch ops around the kernel, all in one graph
        return kernel(q * 1.5, k, v=v, scale=0.3) + 1.0

    traced = block(**tensors)
    eager = kernel(tensors["q"] * 1.5, tensors["k"], tensors["v"], scale=0.3) + 1.0
    assert torch.equal(traced, eager)
    given = {n: t.float().numpy() for n, t in tensors.items()}
    given["q"] = (tensors["q"] * 1.5).float().numpy()   # bf16 * 1.5 is exact
    want = reference(K.gqa_causal_attention, given, {"scale": 0.3}) + 1.0
    assert relative_error(traced.float().numpy(), want) <= TOLERANCE["bf16"]


def test_new_sizes_inside_the_graph_build_and_run(rng):
    """Dynamic shapes: the fake implementation takes symbolic sizes; each real size still gets
    its own build when the graph runs."""
    kernel = tf.compile(K.rmsnorm, target="llvm")
    step = torch.compile(lambda x, w: kernel(x, w, eps=1e-6), fullgraph=True, dynamic=True)
    for rows in (3, 7):
        tensors, scalars = torch_inputs(K.rmsnorm, dict(M=rows, N=48), rng)
        got = step(tensors["x"], tensors["weight"])
        want = reference(K.rmsnorm, {n: t.float().numpy() for n, t in tensors.items()},
                         {"eps": 1e-6})
        assert got.shape == (rows, 48)
        assert relative_error(got.float().numpy(), want) <= TOLERANCE["bf16"]


def test_symbolic_scalars_derived_sizes_and_index_checks_under_dynamic_shapes():
    """Under ``dynamic=True`` Dynamo hands the fake implementation symbolic numbers: an integer
    scalar (a roll's shift) was refused as "got SymInt", a size the kernel derives (a SwiGLU's
    half row, a strided pool's window count) was missing (``KeyError``). Both run now, matching
    eager at every size; an index past its dimension is refused there too, symbolically."""
    from benchmarks.window_kernels import max_pool_stride_2
    from tests.dsl.test_index_bounds import next_step_difference
    from tests.schedule_templates.user_written_check import roll_diff
    from tests.schedule_templates.user_written_more_check import swiglu_rms

    cases = [(roll_diff, lambda n: (torch.randn(3, n), 5)),
             (swiglu_rms, lambda n: (torch.randn(3, n).bfloat16(),)),
             (max_pool_stride_2, lambda n: (torch.randn(2, 3, n).bfloat16(),))]
    for kernel, inputs in cases:
        made = tf.compile(kernel, target="llvm")
        step = torch.compile(lambda *a, made=made: made(*a) * 2.0, fullgraph=True, dynamic=True)
        for n in (40, 66, 90):
            args = inputs(n)
            torch.testing.assert_close(step(*args), made(*args) * 2.0)
    made = tf.compile(next_step_difference, target="llvm")
    with pytest.raises(Exception, match=r"x\[b, t \+ 1\] reads dimension 1 of x"):
        torch.compile(lambda a: made(a), fullgraph=True, dynamic=True)(torch.randn(3, 9))


@tf.kernel
def mean_and_max(x: T.Tensor["M", "N", "f32"], bias: T.f32, rows: T.i32):
    i, j = T.axes("i j")
    return T.sum(x[i, j], over=j) / rows + bias, T.max(x[i, j], over=j)


def test_schema_lists_parameters_and_outputs_in_order():
    assert schema(mean_and_max.program) == \
        "(Tensor x, float bias, SymInt rows) -> (Tensor, Tensor)"


def test_several_outputs_and_scalars_in_a_graph(rng):
    kernel = tf.compile(mean_and_max, target="llvm")
    x = torch.from_numpy(rng.standard_normal((5, 30)).astype(np.float32))
    mean, top = torch.compile(lambda x: kernel(x, 0.5, rows=30), fullgraph=True)(x)
    assert torch.allclose(mean, x.mean(1) + 0.5, rtol=1e-5, atol=1e-6)
    assert torch.equal(top, x.amax(1))


def test_schedule_compile_is_an_operator_too(rng):
    sch = tf.schedule(K.softmax, target="llvm")
    sch.rolling_update("m", "l", axis="j")
    kernel = sch.compile()
    assert kernel.torch_op is not None
    x = torch_from_numpy(rng.standard_normal((4, 50)).astype(np.float32), "cpu").bfloat16()
    got = torch.compile(lambda x: kernel(x), fullgraph=True)(x)
    assert torch.allclose(got.float(), torch.softmax(x.float(), 1), atol=8e-3)


def test_decorated_kernel_in_a_graph_after_one_eager_call(rng):
    x = torch_from_numpy(rng.standard_normal((4, 40)).astype(np.float32), "cpu").bfloat16()

    @tf.kernel
    def double_softmax(x: T.Tensor["M", "N", "bf16"]):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        p = T.exp(2.0 * (x[i, j] - m))
        return p / T.sum(p, over=j)

    step = torch.compile(lambda x: double_softmax(x, target="llvm"), fullgraph=True)
    with pytest.raises(Exception, match="call it once outside torch.compile first"):
        step(x)
    eager = double_softmax(x, target="llvm")
    torch._dynamo.reset()
    assert torch.equal(step(x), eager)


def test_out_and_wrong_shapes_are_refused_while_tracing(rng):
    kernel = tf.compile(K.softmax, target="llvm")
    x = torch.randn(3, 8).bfloat16()
    with pytest.raises(Exception, match="out= is not supported inside torch.compile"):
        torch.compile(lambda x: kernel(x, out=torch.empty_like(x)), fullgraph=True)(x)
    with pytest.raises(Exception, match="must have dtype bf16"):
        torch.compile(lambda x: kernel(x.float()), fullgraph=True)(x)


@pytest.mark.gpu
def test_a_block_in_a_cuda_graph_of_torch_compile(rng):
    """mode="reduce-overhead": torch.compile records the block's kernels (Triton RMSNorm, Hopper
    attention and FFN on an H100) in a CUDA graph and replays them. The replay gets inputs it
    was not recorded with (fresh tensors, fresh values), so a graph that kept the recording's
    addresses or tensor maps would give the old results."""
    norm = tf.compile(K.rmsnorm)
    attend = tf.compile(K.gqa_causal_attention)
    mlp = tf.compile(K.ffn_swiglu_linear)
    sizes = {"rmsnorm": dict(M=256, N=512),
             "gqa_causal_attention": dict(B=1, H=4, HKV=2, M=256, N=256, D=128),
             "ffn_swiglu_linear": dict(M=256, K=512, N=1024, O=512)}

    def inputs():
        given = {}
        for name, dims in sizes.items():
            tensors, _ = random_inputs(K.ALL[name], dims, rng)
            given[name] = {n: torch_from_numpy(a, "cuda") * (0.05 if n.endswith("proj") else 1)
                           for n, a in tensors.items()}
        return given["rmsnorm"], given["gqa_causal_attention"], given["ffn_swiglu_linear"]

    def block(a, b, c):
        return norm(**a, eps=1e-5), attend(**b, scale=0.09), mlp(**c)

    graphed = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):   # warm-up, record, replay
        graphed(*inputs())
    fresh = inputs()
    got = [t.clone() for t in graphed(*fresh)]
    for g, e in zip(got, block(*fresh)):   # same kernels eagerly: equal but for summation order
        assert torch.allclose(g.float(), e.float(), rtol=1e-2, atol=1e-2)
    x, w = fresh[0]["x"], fresh[0]["weight"]
    torch.library.opcheck(norm.torch_op.op, (x, w, 1e-5))
