"""Row chains whose mask only bounds the swept axis per program (``lo[g] <= r < hi[g]``), as
users write ragged sweeps, and their float64 references (torch, never the project's lowering):
shared by ``test_sweep_bounds`` and its check under Triton's interpreter
(``python -m tests.schedule_templates.sweep_bounds_check SEED`` with ``TRITON_INTERPRET=1``)."""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.unlisted_kernels import lengths_mean_pool
from tests.helpers import poisoned_main, templated


@tf.kernel
def window_sum(x: T.Tensor["G", "R", "D", "bf16"], lo: T.Tensor["G", "i32"],
               hi: T.Tensor["G", "i32"]):
    """The sum of rows lo[g] .. hi[g] - 1 of each group: both bounds read from tensors (empty,
    negative and past-the-end windows included)."""
    g, r, d = T.axes("g r d")
    return T.sum(T.where((r >= lo[g]) & (hi[g] > r), x[g, r, d], 0.0), over=r)


@tf.kernel
def ragged_pool_logsumexp(x: T.Tensor["G", "R", "D", "bf16"], lengths: T.Tensor["G", "i32"]):
    """log Σ exp over each group's first lengths[g] rows, per column: a state that reads
    another (the maximum), so the rolling update's corrections run across the bounded blocks."""
    g, r, d = T.axes("g r d")
    kept = T.where(r < lengths[g], x[g, r, d], float("-inf"))
    top = T.max(kept, over=r)
    return T.log(T.sum(T.exp(kept - top), over=r)) + top


@tf.kernel
def ragged_logsumexp(x: T.Tensor["B", "S", "bf16"], lengths: T.Tensor["B", "i32"]):
    """log Σ exp over each row's first lengths[b] columns: the bound on the contiguous axis
    (its loads keep their vectors: the mask is not put on them)."""
    b, s = T.axes("b s")
    kept = T.where(s <= lengths[b] - 1, x[b, s], float("-inf"))
    top = T.max(kept, over=s)
    return T.log(T.sum(T.exp(kept - top), over=s)) + top


@tf.kernel
def varlen_softmax(x: T.Tensor["B", "M", "S", "bf16"], lengths: T.Tensor["B", "i32"]):
    """Softmax over each sequence's first lengths[b] keys, zeros past them: outputs along the
    bounded sweep (written over the whole axis)."""
    b, i, s = T.axes("b i s")
    kept = T.where(s < lengths[b], x[b, i, s], float("-inf"))
    top = T.max(kept, over=s)
    e = T.exp(kept - top)
    return e / T.sum(e, over=s)


@tf.kernel
def varlen_rms_scale(x: T.Tensor["B", "S", "D", "bf16"], lengths: T.Tensor["B", "i32"]):
    """Every token of [B, S, D] scaled by the RMS of the first lengths[b] tokens, per feature:
    a bounded sweep across the strided axis, outputs along it."""
    b, s, d = T.axes("b s d")
    ms = T.sum(T.where(s < lengths[b], x[b, s, d] * x[b, s, d], 0.0), over=s) / \
        T.max(lengths[b], 1)
    return x[b, s, d] * T.rsqrt(ms + 1e-6)


def window_sum_case(generator, G=9, R=700, D=40, width=3.0):
    x = (torch.randn(G, R, D, generator=generator) * width + width).to(torch.bfloat16)
    lo = torch.randint(-50, R, (G,), generator=generator)
    hi = lo + torch.randint(-20, R, (G,), generator=generator)
    lo[0], hi[0] = 5, 5           # empty
    lo[1], hi[1] = -30, R + 40    # the whole axis
    want = torch.stack([x[k, max(int(a), 0):max(int(b), 0)].double().sum(0)
                        for k, (a, b) in enumerate(zip(lo, hi))])
    return {"x": x, "lo": lo.to(torch.int32), "hi": hi.to(torch.int32)}, want


def ragged_pool_logsumexp_case(generator, G=9, R=700, D=40, width=4.0):
    x = (torch.randn(G, R, D, generator=generator) * width).to(torch.bfloat16)
    lengths = torch.randint(1, R + 1, (G,), generator=generator)
    lengths[0] = R
    want = torch.stack([x[k, :int(n)].double().logsumexp(0) for k, n in enumerate(lengths)])
    return {"x": x, "lengths": lengths.to(torch.int32)}, want


def ragged_logsumexp_case(generator, B=7, S=3000, width=4.0):
    x = (torch.randn(B, S, generator=generator) * width).to(torch.bfloat16)
    lengths = torch.randint(1, S + 1, (B,), generator=generator)
    want = torch.stack([x[k, :int(n)].double().logsumexp(0) for k, n in enumerate(lengths)])
    return {"x": x, "lengths": lengths.to(torch.int32)}, want


def varlen_softmax_case(generator, B=3, M=5, S=3000, width=4.0):
    x = (torch.randn(B, M, S, generator=generator) * width).to(torch.bfloat16)
    lengths = torch.randint(1, S + 1, (B,), generator=generator)
    lengths[0] = 1
    kept = torch.arange(S)[None, None, :] < lengths[:, None, None]
    want = torch.softmax(x.double().masked_fill(~kept, float("-inf")), -1)
    return {"x": x, "lengths": lengths.to(torch.int32)}, want


def varlen_rms_scale_case(generator, B=3, S=700, D=40, width=3.0):
    x = (torch.randn(B, S, D, generator=generator) * width).to(torch.bfloat16)
    lengths = torch.randint(1, S + 1, (B,), generator=generator)
    lengths[0] = 1
    kept = (torch.arange(S)[None, :, None] < lengths[:, None, None]).double()
    ms = (x.double() ** 2 * kept).sum(1, keepdim=True) / lengths[:, None, None].double()
    return {"x": x, "lengths": lengths.to(torch.int32)}, x.double() * torch.rsqrt(ms + 1e-6)


def lengths_mean_case(generator, B=5, S=300, D=70, width=3.0):
    """Lengths of 0 (its mean 0: the kernel divides by at least 1), S and past S."""
    x = (torch.randn(B, S, D, generator=generator) * width + width).to(torch.bfloat16)
    lengths = torch.randint(1, S + 1, (B,), generator=generator)
    lengths[0], lengths[1], lengths[2] = 0, S, S + 9
    want = torch.stack([x[k, :int(n)].double().sum(0) / max(int(n), 1)
                        for k, n in enumerate(lengths)])
    return {"x": x, "lengths": lengths.to(torch.int32)}, want


CASES = {"window_sum": (window_sum, window_sum_case),
         "ragged_pool_logsumexp": (ragged_pool_logsumexp, ragged_pool_logsumexp_case),
         "ragged_logsumexp": (ragged_logsumexp, ragged_logsumexp_case),
         "varlen_softmax": (varlen_softmax, varlen_softmax_case),
         "varlen_rms_scale": (varlen_rms_scale, varlen_rms_scale_case),
         "lengths_mean_pool": (lengths_mean_pool, lengths_mean_case)}


# (the default takes a row a program): tiles of 4 rows, the last past the rows, each sweeping
# from its rows' loosest bounds
ROW_TILES = {"ragged_logsumexp_row_tiles": (ragged_logsumexp, ragged_logsumexp_case)}


def in_row_tiles(kernel, rows: int = 4):
    """``kernel``'s row template with ``rows`` rows a program, blocks of 512."""
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.row_reduction import row_reduction
    from tensorfuse.targets import get_target

    hopper = get_target("cuda:sm_90a")
    return row_reduction(kernel, choose(kernel.program, hopper)[1], hopper, rows=rows, block=512)


if __name__ == "__main__":
    poisoned_main({**CASES, **ROW_TILES}, lambda name, kernel: in_row_tiles(kernel)
                  if name in ROW_TILES else templated(kernel))
