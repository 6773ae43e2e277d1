"""The Triton attention template's block lists of a boolean mask tensor, in Triton's CPU
interpreter: kept with the mask they were made from (so that its memory cannot go to a new mask
of other data while they are kept), made again for another mask; each call's output against
float64. Prints JSON:
    TRITON_INTERPRET=1 python -m tests.schedule_templates.mask_lists_check SEED
"""
import gc
import json
import os
import sys
import weakref

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

import tensorfuse as tf  # noqa: E402
from tensorfuse.kernels.layers import attention_kernel  # noqa: E402
from tests.kernels.test_attention_sinks import sink_attention64  # noqa: E402


def run(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    B, H, M, N, D = 2, 2, 37, 70, 16
    kernel = attention_kernel("f32", False, True, False)
    made = tf.schedule(kernel, "cuda").rolling_update("m", "o", "l", axis="j") \
        .apply_template("attention", tile_m=16, tile_n=16).compile()
    q = torch.randn(B, H, M, D, generator=g)
    k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(2))

    def error(mask) -> float:
        out = made(q, k, v, mask, scale=D ** -0.5)
        want = sink_attention64(q.double(), k.double(), v.double(),   # a sink of -inf: none
                                torch.full((H,), -torch.inf, dtype=torch.float64), mask,
                                D ** -0.5)
        want = torch.where(mask.any(-1, keepdim=True), want, 0.0)   # emptied rows give 0
        return float((out.double() - want).abs().max() / want.abs().max())

    found = {}
    first = torch.rand(B, 1, M, N, generator=g) < 0.5
    found["first"] = error(first)
    held = weakref.ref(first)
    found["kept"] = any(t is first for t in made._masks_held)
    del first
    gc.collect()
    found["alive"] = held() is not None
    other = torch.rand(B, 1, M, N, generator=g) < 0.2
    found["other"] = error(other)
    gc.collect()
    found["released"] = held() is None
    return found


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]))))
