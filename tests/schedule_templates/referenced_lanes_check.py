"""Variances swept with their sums kept per lane (``Knobs.lanes``: the mean's reference fixed
after the first block, :func:`tensorfuse.targets.triton.row_states.referenced_lanes`), generated
for sm_90a and run by Triton's interpreter against torch's float64: a layer norm over rows wider
than a block (offset far from zero and drifting along the sweep), a
channels-last batch norm's statistics down a strided axis in parallel parts (the parts' own
references merged), a group norm's flat rows whose last block is ragged, and a layer norm over
the strided channels of [B, D, S] swept in blocks. Prints each case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.referenced_lanes_check SEED
"""
import torch

import tensorfuse.kernels as K
from benchmarks.user_kernels import channel_stats, layernorm_channels
from tests.helpers import poisoned_main
from tests.schedule_templates.swept_row_tiles_check import group_norm_flat

HOPPER = "cuda:sm_90a"


def _ramp(n: int) -> torch.Tensor:
    """A drift along the sweep: each block's mean far from the first's (a reference that moved
    without its correction would show)."""
    return torch.linspace(0.0, 40.0, n)


def _layernorm(generator, R=5, D=640):
    x = (torch.randn(R, D, generator=generator) * 2 + 300.0 + _ramp(D)).bfloat16()
    w, b = (torch.randn(D, generator=generator).bfloat16() for _ in range(2))
    want = torch.nn.functional.layer_norm(x.double(), (D,), w.double(), b.double(), 1e-5)
    return dict(x=x, weight=w, bias=b, eps=1e-5), want


def _channel_stats(generator, N=1000, C=48):
    x = (torch.randn(N, C, generator=generator) * 3 - 40.0 + _ramp(N)[:, None]).bfloat16()
    var, mean = torch.var_mean(x.double(), 0, correction=0)
    return dict(x=x), (mean, var)


def _group_norm(generator, B=2, G=3, N=600):
    x = (torch.randn(B, G, N, generator=generator) * 5 + 20.0 + _ramp(N)).bfloat16()
    var, mean = torch.var_mean(x.double(), -1, keepdim=True, correction=0)
    return dict(x=x, eps=1e-5), (x.double() - mean) / torch.sqrt(var + 1e-5)


def _layernorm_channels(generator, B=2, D=300, S=40):
    x = (torch.randn(B, D, S, generator=generator) * 2 - 80.0 + _ramp(D)[:, None]).bfloat16()
    w, b = (torch.randn(D, generator=generator).bfloat16() for _ in range(2))
    xd = x.double().transpose(1, 2)
    want = torch.nn.functional.layer_norm(xd, (D,), w.double(), b.double(), 1e-5)
    return dict(x=x, w=w, bias=b, eps=1e-5), want.transpose(1, 2)


# name → (kernel, knobs of row_reduction, case): rows swept in several blocks each
CASES = {
    "layernorm": (K.layernorm, dict(block=128, num_warps=4, num_stages=2), _layernorm),
    "channel_stats": (channel_stats, dict(rows=16, block=64, num_warps=4, num_stages=2,
                                          splits=5), _channel_stats),
    "group_norm": (group_norm_flat, dict(block=256, num_warps=4, num_stages=1), _group_norm),
    "layernorm_channels": (layernorm_channels, dict(rows=16, block=64, num_warps=4,
                                                    num_stages=3), _layernorm_channels),
}


def template(kernel, knobs: dict, lanes: bool = True):
    """``kernel``'s row template for sm_90a at ``knobs``, its variance's sums per lane."""
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.row_reduction import row_reduction
    from tensorfuse.targets import get_target

    spec = get_target(HOPPER)
    _, fusion = choose(kernel.program, spec)
    return row_reduction(kernel, fusion, spec, lanes=lanes, **knobs)


if __name__ == "__main__":
    poisoned_main({n: (k, case) for n, (k, _, case) in CASES.items()},
                  lambda name, kernel: template(kernel, CASES[name][1]))
