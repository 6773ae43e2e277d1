"""Where a call of a generated-CUDA kernel spends the host's time (the Hopper attention template
through ``tf.compile``): host microseconds per call, then cProfile's top functions over a few
hundred calls.

    PYTHONPATH=. python tools/profile_call.py
"""
import cProfile
import math
import pstats

import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.common import host_us


def main() -> None:
    S, D = 4096, 128
    q, k, v = (torch.randn(1, 16, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = 1 / math.sqrt(D)
    cases = {
        "neighbourhood 2-D (tf.compile)": (tf.compile(K.neighborhood_attention_2d),
                                           dict(width=64, radius=3, dilation=1)),
        "causal (tf.compile)": (tf.compile(K.causal_attention), {}),
    }
    for name, (f, scalars) in cases.items():
        call = lambda f=f, scalars=scalars: f(q, k, v, scale, **scalars)  # noqa: E731
        print(f"{name}: {host_us(call, calls=300, warm=20):.1f} us a call on the host",
              flush=True)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(300):
            call()
        profile.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
