"""Launch the Hopper attention kernel and SDPA's cuDNN attention (full, bf16, B=2, H=16, S=4096,
D=128) twice each, for Nsight Compute to profile the second launch of each (tools/device-ncu)."""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tensorfuse.kernels as K
from benchmarks.hopper_attention import hopper

q, k, v = (torch.randn(2, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
f = hopper(K.attention)
for _ in range(2):
    f(q, k, v, scale=128 ** -0.5)
for _ in range(2):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=128 ** -0.5)
torch.cuda.synchronize()
