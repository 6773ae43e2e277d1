"""The library kernels on the local NVIDIA GPU (default schedule), against float64 NumPy references
on fresh random inputs with outputs poisoned first; and PyTorch CUDA tensors in and out."""
import numpy as np
import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.kernels.reference import TOLERANCE, random_inputs, reference, relative_error
from tests.kernels.test_library_cpu import poisoned_outputs, sizes_for

pytestmark = pytest.mark.gpu

GPU_SIZES = {
    "attention": dict(B=2, H=4, M=256, N=256, D=64),
    "rows": dict(M=64, N=4096, V=4096),
    "ffn": dict(M=64, K=256, N=512, O=256),
}


@pytest.mark.parametrize("name", sorted(K.ALL))
@pytest.mark.parametrize("template", [None, "auto"])
def test_library_kernel_on_gpu(name, template, rng):
    kernel = K.ALL[name]
    sizes = sizes_for(name, GPU_SIZES)
    tensors, scalars = random_inputs(kernel, sizes, rng)
    (out,) = poisoned_outputs(kernel, sizes)
    compiled = tf.compile(kernel, target="cuda", template=template)
    assert compiled.target.kind == "cuda"
    compiled(**tensors, **scalars, out=out)
    err = relative_error(out, reference(kernel, tensors, scalars))
    assert err <= TOLERANCE[kernel.program.outputs[0].dtypes[0]], f"{name}: error {err:.3e}"


def test_torch_cuda_tensors_in_and_out():
    import torch

    x = torch.randn(33, 1000, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(x, float("nan"))
    f = tf.compile(K.softmax, target="auto")
    assert f(x, out=out) is out
    torch.testing.assert_close(out.float(), torch.softmax(x.float(), 1), atol=4e-3, rtol=1e-2)


def _torch_inputs(kernel, sizes, rng):
    import torch

    from tensorfuse.interop import torch_from_numpy

    tensors, scalars = random_inputs(kernel, sizes, rng)
    return tensors, {n: torch_from_numpy(x, "cuda") for n, x in tensors.items()}, scalars


@pytest.mark.parametrize("name", sorted(n for n in K.ALL if not n.startswith("ffn")))
def test_repeated_calls_are_right_on_fresh_inputs(name, rng):
    """After the first call of a signature, calls launch the compiled kernels directly (no
    re-binding, no JIT dispatch): each of several calls with fresh data must still be right."""
    kernel = K.ALL[name]
    sizes = sizes_for(name, GPU_SIZES)
    f = tf.compile(kernel, target="cuda")
    tol = TOLERANCE[kernel.program.outputs[0].dtypes[0]]
    for _ in range(3):
        tensors, on_gpu, scalars = _torch_inputs(kernel, sizes, rng)
        out = f(**on_gpu, **scalars)
        err = relative_error(out.float().cpu().numpy(), reference(kernel, tensors, scalars))
        assert err <= tol, f"{name}: error {err:.3e}"


@pytest.mark.parametrize("name, sizes", [
    ("softmax", dict(M=4, N=128)),
    ("causal_attention", dict(B=1, H=4, M=256, N=256, D=64)),
    ("document_attention", dict(B=1, H=4, M=256, N=256, D=64)),
    ("gqa_attention", dict(B=4, H=64, HKV=8, M=1, N=4096, D=128)),   # decode: split update
    ("linear", dict(M=512, K=256, N=1024)),                          # sm_90a: the Hopper GEMM
    ("ffn_swiglu", dict(M=512, K=256, N=1024, O=256)),               # sm_90a: two Hopper GEMMs
])
def test_compiled_kernels_replay_in_a_cuda_graph(name, sizes, rng):
    import torch

    kernel = K.ALL[name]
    f = tf.compile(kernel, target="cuda")
    tensors, on_gpu, scalars = _torch_inputs(kernel, sizes, rng)
    f(**on_gpu, **scalars)     # the first call of a signature builds and compiles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(**on_gpu, **scalars)
    fresh, fresh_gpu, _ = _torch_inputs(kernel, sizes, rng)
    for n, x in fresh_gpu.items():
        if x.is_floating_point():
            on_gpu[n].copy_(x)
            tensors[n] = fresh[n]
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    err = relative_error(out.float().cpu().numpy(), reference(kernel, tensors, scalars))
    assert err <= TOLERANCE[kernel.program.outputs[0].dtypes[0]], f"{name}: error {err:.3e}"


@pytest.mark.parametrize("name", sorted(K.ROW_KERNELS))
@pytest.mark.parametrize("sizes", [dict(M=37, N=8192), dict(M=37, N=6000), dict(M=37, N=12000),
                                   dict(M=5, N=65536)], ids=["8192", "6000", "12000", "65536"])
def test_rows_swept_in_blocks_on_gpu(name, sizes, rng):
    """Rows the template sweeps in blocks on CUDA — RMSNorm's over 4097-8192 columns in blocks
    of 4096 (its sum per lane, the row read twice), ragged ones, rows of 65536 (cross-entropy's
    gathered logit per lane) — against float64, outputs poisoned first; the norms on inputs far
    from zero (a long sum of squares around 1e3 is where per-block f32 sums lose digits)."""
    kernel = K.ALL[name]
    sizes = dict(sizes, V=sizes["N"])
    tensors, scalars = random_inputs(kernel, sizes, rng)
    if name.endswith("norm"):
        tensors["x"] = (tensors["x"].astype(np.float64) + 1e3).astype(tensors["x"].dtype)
    (out,) = poisoned_outputs(kernel, sizes)
    tf.compile(kernel, target="cuda")(**tensors, **scalars, out=out)
    err = relative_error(out, reference(kernel, tensors, scalars))
    assert err <= TOLERANCE[kernel.program.outputs[0].dtypes[0]], f"{name}: error {err:.3e}"
