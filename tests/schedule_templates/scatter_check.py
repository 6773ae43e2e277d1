"""Gathered reads' gradients as ``tf.compile`` makes them for sm_90a — the scatter-add template
(:mod:`tensorfuse.schedule_templates.scatter`) — run by Triton's interpreter against float64
references (torch's ``index_add_``, never the project's lowering), outputs poisoned first:
an embedding's with tokens that repeat (over a vocabulary small and large: through slots),
a segment mean's with rows no segment covers, integer sums by a computed bin (weighted
counts past 2²⁴: exact, or an error of 1) and counts into few bins (a histogram, exact; counts
scaled in f32). Prints each case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.scatter_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.unlisted_kernels import byte_histogram
from benchmarks.user_kernels import embedding, segment_mean
from tests.helpers import poisoned_main, relative_error


@tf.kernel
def weighted_counts(x: T.Tensor["N", "i32"], w: T.Tensor["N", "i32"]):
    """A weighted histogram of 16 bins: each bin's sum of the weights of the elements in it."""
    j = T.axes("j")
    k = T.axis("k", 16)
    return T.sum(T.where(x[j] == k, w[j], 0), over=j)


def weighted_counts_case(generator, N=300):
    """Weights just past 2²⁴ (an f32 sum would round their last bits), bins out of range among
    them (they add nothing)."""
    x = torch.randint(-2, 18, (N,), generator=generator).to(torch.int32)
    w = (2**24 + torch.randint(1, 1000, (N,), generator=generator)).to(torch.int32)
    kept = (x >= 0) & (x < 16)
    return dict(x=x, w=w), torch.zeros(16, dtype=torch.int64).index_add_(
        0, x[kept].long(), w[kept].long())


@tf.kernel
def scaled_counts(x: T.Tensor["N", "i32"]):
    """Each of 37 bins' count times 0.5, in f32: counted into bins a program, then scaled."""
    j = T.axes("j")
    k = T.axis("k", 37)
    return T.sum(T.where(x[j] == k, 0.5, 0.0), over=j)


@tf.kernel
def masked_histogram(x: T.Tensor["M", "N", "u8"], valid: T.Tensor["M", "bool"]):
    """The first 100 values' counts over the valid rows of a byte image: the index's condition
    and the rows' in one conjunction."""
    i, j = T.axes("i j")
    k = T.axis("k", 100)
    return T.sum(T.where((x[i, j] == k) & valid[i], 1, 0), over=(i, j))


def masked_histogram_case(generator, M=37, N=999):
    x = torch.randint(0, 256, (M, N), generator=generator).to(torch.uint8)
    valid = torch.rand(M, generator=generator) > 0.3
    return dict(x=x, valid=valid), torch.bincount(x[valid].flatten().long(),
                                                  minlength=256)[:100]


def histogram_case(generator, N=40000, bins=256):
    """More values than a program counts (several programs add into each bin), one in ten out
    of range either side (counted nowhere)."""
    x = torch.randint(-bins // 10, bins + bins // 10, (N,), generator=generator).to(torch.int32)
    kept = (x >= 0) & (x < bins)
    return dict(x=x), torch.bincount(x[kept].long(), minlength=bins)


def scaled_counts_case(generator, N=20000):
    args, counts = histogram_case(generator, N, 37)
    return args, counts.double() * 0.5


def exact_for_integers(out, want) -> float:
    """:func:`relative_error` of a float output; 1.0 where an integer output differs anywhere
    from its reference, else 0.0."""
    if want.is_floating_point():
        return relative_error(out, want)
    return float(bool((out.cpu().long() != want.cpu().long()).any()))


def embedding_case(generator, V=50, M=300, D=24, width=4.0):
    """300 tokens over 50 ids: most repeat, some ids never occur."""
    tokens = torch.randint(0, V - 5, (M,), generator=generator).to(torch.int32)
    table = (torch.randn(V, D, generator=generator) * width).to(torch.bfloat16)
    d_out = (torch.randn(M, D, generator=generator) * width).to(torch.bfloat16)
    want = torch.zeros(V, D, dtype=torch.float64).index_add_(0, tokens.long(), d_out.double())
    return dict(table=table, tokens=tokens, d_out=d_out), want


def large_vocabulary_case(generator, V=3000, M=200, D=24, width=4.0):
    """200 tokens over 3000 ids, drawn from 40 of them (most repeat), the last one out of range
    (it adds nothing): the plan compacts (slots for the 200 positions)."""
    ids = torch.randperm(V, generator=generator)[:40]
    tokens = ids[torch.randint(0, 40, (M,), generator=generator)].to(torch.int32)
    tokens[-1] = V + 7
    table = (torch.randn(V, D, generator=generator) * width).to(torch.bfloat16)
    d_out = (torch.randn(M, D, generator=generator) * width).to(torch.bfloat16)
    want = torch.zeros(V, D, dtype=torch.float64).index_add_(0, tokens[:-1].long(),
                                                              d_out[:-1].double())
    return dict(table=table, tokens=tokens, d_out=d_out), want


def segment_mean_case(generator, G=20, D=40, spare=7, width=4.0):
    """Segments of 1 to 128 rows, then ``spare`` rows no segment covers (their gradient: 0)."""
    lengths = torch.randint(1, 129, (G,), generator=generator)
    starts = lengths.cumsum(0) - lengths
    x = (torch.randn(int(lengths.sum()) + spare, D, generator=generator) * width).bfloat16()
    d_out = (torch.randn(G, D, generator=generator) * width).to(torch.bfloat16)
    want = torch.zeros(x.shape, dtype=torch.float64)
    for s, n, row in zip(starts.tolist(), lengths.tolist(), d_out.double()):
        want[s:s + n] += row / n
    return dict(x=x, starts=starts.to(torch.int32), lengths=lengths.to(torch.int32),
                d_out=d_out), want


CASES = {"embedding": (tf.grad(embedding), embedding_case),
         "segment_mean": (tf.grad(segment_mean), segment_mean_case),
         "embedding_large_vocabulary": (tf.grad(embedding), large_vocabulary_case),
         "embedding_large_vocabulary_sizes_as_arguments": (tf.grad(embedding),
                                                           large_vocabulary_case),
         # every size an argument of the kernels from the first call (tf.compile's dynamic=True)
         "embedding_sizes_as_arguments": (tf.grad(embedding), embedding_case),
         "weighted_counts": (weighted_counts, weighted_counts_case),
         "byte_histogram": (byte_histogram, histogram_case),
         "scaled_counts": (scaled_counts, scaled_counts_case),
         "masked_histogram": (masked_histogram, masked_histogram_case)}

if __name__ == "__main__":
    # every size an argument of the kernels from the first call where the case's name says so
    poisoned_main(CASES, lambda name, kernel: tf.compile(
        kernel, target="cuda:sm_90a",
        dynamic=True if name.endswith("sizes_as_arguments") else None), exact_for_integers)
