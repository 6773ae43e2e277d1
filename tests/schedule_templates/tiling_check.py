"""Run the attention template with tiled visiting orders in Triton's CPU interpreter (outputs
poisoned first); print, as JSON, each case's error against float64 and the order it ran in.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.tiling_check SEED
"""
import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tensorfuse as tf  # noqa: E402
import tensorfuse.kernels as K  # noqa: E402
from tensorfuse.interop import torch_from_numpy  # noqa: E402
from tensorfuse.kernels.reference import random_inputs, reference, relative_error  # noqa: E402
from tests.helpers import poisoned_call  # noqa: E402

# (name, kernel, sizes, scalars, tile_as request or None for the automatic choice)
CASES = [
    ("dilated 20x12", K.neighborhood_attention_2d, dict(B=1, H=2, M=240, N=240, D=16),
     dict(width=12, radius=2, dilation=2), None),
    ("ragged 13x11", K.neighborhood_attention_2d, dict(B=1, H=2, M=143, N=143, D=16),
     dict(width=11, radius=1, dilation=1), dict(patch=(4, 4), key_patch=(2, 8))),
    ("short last row 9x10", K.neighborhood_attention_2d, dict(B=2, H=1, M=87, N=87, D=16),
     dict(width=10, radius=1, dilation=1), dict(patch=(4, 4), key_patch=(4, 4))),
    ("video causal 5x6x7", K.neighborhood_attention_3d, dict(B=1, H=2, M=210, N=210, D=16),
     dict(height=6, width=7, radius=1, causal=1), None),
]


def run(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    results = {}
    for name, kernel, sizes, scalars, request in CASES:
        sch = tf.schedule(kernel, "cuda:sm_90a")
        sch.rolling_update("m", "l", "o", axis="j")
        sch.apply_template("attention", tile_m=16, tile_n=16)
        if request is not None:
            sch.tile_as(**request)
        f = sch.compile()
        tensors, values = random_inputs(kernel, sizes, rng, scalars)
        want = reference(kernel, tensors, values)
        (out,) = poisoned_call(f, kernel.program, {
            **{n: torch_from_numpy(x, "cpu") for n, x in tensors.items()}, **values},
            torch.from_numpy(np.asarray(want)))
        err = relative_error(out.float().numpy(), want)
        plan = f.build(values, **sizes)[0]
        results[name] = {"error": err, "order": plan.tiling.describe(),
                         "tiled": plan.row_tiling is not None}
    return results


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]))))
