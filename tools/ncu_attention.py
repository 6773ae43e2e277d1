"""Run full attention (bf16, B=2, H=16, S=4096, D=128) through ``tf.compile`` and through SDPA's
cuDNN backend, three calls each, for Nsight Compute to profile one kernel of each (issue 17: where
the Hopper template's consumers stall, against cuDNN's kernel on the same inputs).

    ncu --clock-control none -k regex:'tf_hopper_attention|sdpa|fprop|fmha|cudnn' \\
        --launch-skip 2 --launch-count 2 --set full -o att python tools/ncu_attention.py
"""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tensorfuse as tf
import tensorfuse.kernels as K

B, H, S, D = 2, 16, 4096, 128
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
           for _ in range(3))
scale = D ** -0.5
f = tf.compile(K.attention)
for _ in range(3):
    ours = f(q, k, v, scale=scale)
torch.cuda.synchronize()
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(3):
        theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
torch.cuda.synchronize()
print("max |ours - cuDNN|:", (ours.float() - theirs.float()).abs().max().item())
