"""The block-sparse and strided-neighbourhood kernels (their tests' own programs) through the
Triton attention template in Triton's CPU interpreter, against float64, outputs poisoned (NaN)
first; prints their errors as
JSON. Triton decides at import whether to interpret, so this runs in its own process:
    TRITON_INTERPRET=1 python -m tests.schedule_templates.sparse_check SEED
"""
import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

import tensorfuse as tf  # noqa: E402
from tests.helpers import poisoned_call  # noqa: E402
from tests.schedule_templates.sparse_references import block_sparse_case, strided_case  # noqa


def run(kernel, inputs: dict, scalars: dict, want) -> float:
    sch = tf.schedule(kernel, "cuda:sm_90a").rolling_update("m", "l", "o", axis="j")
    sch.apply_template("attention", tile_m=16, tile_n=16)
    (out,) = poisoned_call(sch.compile(), kernel.program, {**inputs, **scalars}, want)
    return float((out.double() - want).abs().max() / want.abs().max())


if __name__ == "__main__":
    generator = torch.Generator().manual_seed(int(sys.argv[1]))
    print(json.dumps({"block_sparse": run(*block_sparse_case(generator, layout_block=32)),
                      "strided": run(*strided_case(generator))}))
