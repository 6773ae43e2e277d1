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
