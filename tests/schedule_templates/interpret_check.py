"""Run generated Triton kernels in Triton's CPU interpreter and print their errors as JSON.

Triton decides at import whether to interpret, so this runs in its own process:
    TRITON_INTERPRET=1 python -m tests.schedule_templates.interpret_check NAME... SEED
A name ``decode:KERNEL`` runs KERNEL with one query row through the split update;
``reload:KERNEL`` a row kernel whose outputs read the row again (``reload=True``);
``looped:KERNEL`` a row kernel swept in blocks of 128 over ragged rows of 300 (its sums kept
per lane and reduced after the loop where they need no correction);
``offset:KERNEL:SPLITS`` runs a chain of ``offset_chains`` on data far from zero; ``gfx942:NAME``
runs NAME's kernel as generated for ROCm gfx942 (its own default knobs), which no AMD GPU here
can run.
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
from tests.schedule_templates.test_rolling_update import CHAINS  # noqa: E402


def check_offset_chain(name: str, rng) -> float:
    """``offset:KERNEL:SPLITS``: an offset chain (``offset_chains``) through the row template in
    blocks of 128 (so the rolling update corrects across blocks), the worst error over offsets."""
    from tensorfuse.algebra import plan_chain
    from tensorfuse.schedule_templates.tile_plan import Knobs, TilePlanner
    from tensorfuse.targets import get_target
    from tensorfuse.targets.triton.kernel import TritonKernel
    from tests.schedule_templates import offset_chains as C

    _, base, splits = name.split(":")
    kernel = C.KERNELS[base]
    chain = plan_chain(kernel.program, C.CHAINS[base], "j")
    knobs = Knobs(block_m=4, block_n=128, num_warps=4, num_stages=1, splits=int(splits))
    f = TritonKernel(TilePlanner(kernel.program, chain), get_target("cuda:sm_90a"),
                     lambda plan: knobs, name)
    worst = 0.0
    for offset in C.OFFSETS:
        args = C.inputs(base, offset, rng)
        out = f(*(torch.from_numpy(a) for a in args))
        worst = max(worst, C.relative_error(out.numpy(), C.reference(base, *args)))
    return worst


def check(name: str, rng) -> float:
    if name.startswith("offset:"):
        return check_offset_chain(name, rng)
    target = "cuda:sm_90a"
    if name.startswith("gfx942:"):
        target, name = "rocm:gfx942", name[len("gfx942:"):]
    base = name.split(":")[-1]
    kernel = K.ALL[base]
    sch = tf.schedule(kernel, target)
    sch.rolling_update(*CHAINS[base], axis="j")
    if name.startswith("decode:"):  # parts over ranges of keys, the last of them merging
        sch.apply_template("attention", tile_m=16, tile_n=16, splits=3)
        sizes = dict(B=1, H=2, HKV=1, M=1, N=170, D=16)
    elif base in K.ATTENTION_VARIANTS:
        sch.apply_template("attention", tile_m=16, tile_n=16)
        sizes = dict(B=1, H=2, HKV=1, M=37, N=70, D=16)
    else:
        knobs = dict(block=128) if name.startswith("looped:") else {}
        sch.apply_template("row_reduction", reload=name.startswith("reload:"), **knobs)
        sizes = dict(M=5, N=300, V=300)
    compiled, worst = sch.compile(), 0.0
    for _ in range(2 if name.startswith("decode:") else 1):   # the parts' counters start at 0
        tensors, scalars = random_inputs(kernel, sizes, rng)
        as_torch = {n: torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
                    if x.dtype.name == "bfloat16" else torch.from_numpy(x)
                    for n, x in tensors.items()}
        out = compiled(**as_torch, **scalars)
        worst = max(worst, relative_error(out.float().numpy(), reference(kernel, tensors,
                                                                         scalars)))
        if _counts_left(compiled):
            return float("inf")   # a tile's counter not set back: the next call merges early
    return worst


def _counts_left(compiled) -> int:
    """What the split parts' arrival counters hold after a call (zero: every tile's last part
    set its counter back)."""
    kernel = getattr(compiled, "template", compiled)
    counters = [made[5] for made in kernel._launch_plans.values()]   # (TritonKernel._launches)
    return sum(int(t.abs().sum()) for c in counters if c is not None
               for t in c.by_stream.values())


if __name__ == "__main__":
    *names, seed = sys.argv[1:]
    rng = np.random.default_rng(int(seed))
    print(json.dumps({n: check(n, rng) for n in names}))
