"""Run Triton kernels written with their sizes as arguments (``tf.compile(..., dynamic=True)``)
in Triton's CPU interpreter at several sizes each, against the float64 references; print, per
kernel, the worst relative error and how many sources it wrote, as JSON.

    TRITON_INTERPRET=1 python -m tests.targets.dynamic_sizes_check SEED

The sizes of a kernel fall in one bucket of its plan (the same block count, widths of one
alignment class), so each should be served by one source; the values themselves are ragged
(nothing a multiple of a block) and come in a shuffled order.
"""
import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tensorfuse as tf  # noqa: E402
import tensorfuse.kernels as K  # noqa: E402
from tensorfuse.kernels.reference import random_inputs, reference, relative_error  # noqa: E402

# rows: widths 264..312, all 8 mod 16 (one alignment class), one 512-wide block; ragged rows
ROW_SIZES = [dict(M=m, N=n, V=n) for m, n in ((5, 296), (11, 264), (9, 312), (7, 280))]
# attention: ragged queries and keys at one head dim (sizes that are no tensor's innermost
# dimension have no alignment class)
ATTENTION_SIZES = [dict(B=1, H=2, HKV=1, M=m, N=n, D=16)
                   for m, n in ((37, 70), (45, 90), (50, 66))]
KERNELS = ["softmax", "layernorm", "rmsnorm", "cross_entropy", "log_softmax",
           "causal_attention", "gqa_attention"]


def check(name: str, rng) -> dict:
    kernel = K.ALL[name]
    made = tf.compile(kernel, "cuda:sm_90a", dynamic=True).template
    sizes = ATTENTION_SIZES if name in K.ATTENTION_VARIANTS else ROW_SIZES
    worst = 0.0
    for at in sizes:
        at = {d: v for d, v in at.items() if d in kernel.program.dim_names()}
        tensors, scalars = random_inputs(kernel, at, rng)
        as_torch = {n: torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
                    if x.dtype.name == "bfloat16" else torch.from_numpy(x)
                    for n, x in tensors.items()}
        out = made(**as_torch, **scalars)
        worst = max(worst, relative_error(out.float().numpy(),
                                          reference(kernel, tensors, scalars)))
    return {"error": worst, "builds": len(made.cache_info()), "calls": len(sizes)}


if __name__ == "__main__":
    rng = np.random.default_rng(int(sys.argv[1]))
    print(json.dumps({n: check(n, rng) for n in KERNELS}))
