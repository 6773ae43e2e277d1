"""Fused (rolled and split) kernels on the local NVIDIA GPU, against float64 references on fresh
random inputs with outputs poisoned first."""
import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.kernels.reference import TOLERANCE, random_inputs, reference, relative_error
from tests.kernels.test_library_cpu import poisoned_outputs, sizes_for
from tests.kernels.test_library_gpu import GPU_SIZES
from tests.schedule_templates.test_rolling_update import CHAINS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", sorted(CHAINS))
@pytest.mark.parametrize("splits", [1, 4])
def test_fused_kernel_on_gpu(name, splits, rng):
    kernel = K.ALL[name]
    sizes = sizes_for(name, GPU_SIZES)
    tensors, scalars = random_inputs(kernel, sizes, rng)
    sch = tf.schedule(kernel, "cuda")
    if splits == 1:
        sch.rolling_update(*CHAINS[name], axis="j", chunk=32)
    else:
        sch.split_update(*CHAINS[name], axis="j", splits=splits, chunk=32)
    (out,) = poisoned_outputs(kernel, sizes)
    sch.compile()(**tensors, **scalars, out=out)
    err = relative_error(out, reference(kernel, tensors, scalars))
    assert err <= TOLERANCE[kernel.program.outputs[0].dtypes[0]], f"{name}: error {err:.3e}"


def test_rolled_attention_with_torch_cuda_tensors():
    import torch

    q, k, v = (torch.randn(2, 8, 333, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sch = tf.schedule(K.causal_attention, "cuda")
    sch.rolling_update("m", "l", "o", axis="j", chunk=64)
    out = torch.full_like(q, float("nan"))
    sch.compile()(q, k, v, scale=64 ** -0.5, out=out)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           is_causal=True)
    assert (out.float() - ref).abs().max().item() / ref.abs().max().item() < 8e-3
