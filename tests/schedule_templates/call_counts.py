"""Count what repeated calls of a template kernel do, in Triton's interpreter (its own process:
Triton decides at import whether it interprets). Prints one JSON line.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.call_counts
"""
import json
import os

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

import tensorfuse as tf  # noqa: E402
import tensorfuse.kernels as K  # noqa: E402
from tensorfuse.errors import CallError  # noqa: E402


def counted(kernel, calls):
    """Run ``calls`` (callables of the kernel) and count full argument checks, builds, launch
    plans and torch allocations of the last one."""
    built = []
    original = kernel.build

    def build(scalars=None, views=(), **dims):
        built.append(tuple(sorted(dims.items())) + views)
        return original(scalars, views, **dims)

    kernel.build = build
    allocations = []
    empty = torch.empty

    def counting_empty(*args, **kwargs):
        allocations.append(args)
        return empty(*args, **kwargs)

    for k, call in enumerate(calls):
        if k == len(calls) - 1:
            torch.empty = counting_empty
        try:
            call()
        finally:
            torch.empty = empty
    return {"checks": kernel._binder().checks, "builds": len(set(built)),
            "launch_plans": len(kernel._launch_plans), "last_call_allocations": len(allocations)}


def main():
    out = {}
    sch = tf.schedule(K.softmax, "cuda:sm_90a")
    sch.rolling_update("m", "l", axis="j")
    sch.apply_template("row_reduction")
    f = sch.compile()
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    y = torch.randn(8, 256, dtype=torch.bfloat16)
    out["same_shape"] = counted(f, [lambda: f(x)] * 4)
    out["two_shapes"] = counted(f, [lambda: f(x), lambda: f(y), lambda: f(x), lambda: f(y)])
    try:
        f(x.float())
        out["wrong_dtype"] = "no error"
    except CallError as exc:
        out["wrong_dtype"] = str(exc)
    dec = tf.schedule(K.gqa_attention, "cuda:sm_90a")
    dec.rolling_update("m", "l", "o", axis="j")
    dec.apply_template("attention", tile_m=16, tile_n=16, splits=3)
    g = dec.compile()
    q = torch.randn(1, 4, 1, 16, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 100, 16, dtype=torch.bfloat16) for _ in range(2))
    out["split_update"] = counted(g, [lambda: g(q, k, v, scale=0.25)] * 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
