"""Gathered reads' gradients as ``tf.compile`` makes them for sm_90a — the scatter-add template
(:mod:`tensorfuse.schedule_templates.scatter`) — run by Triton's interpreter against float64
references (torch's ``index_add_``, never the project's lowering), outputs poisoned first:
an embedding's with tokens that repeat (over a vocabulary small and large: through slots),
a segment mean's with rows no segment covers. Prints
each case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.scatter_check SEED
"""
import torch

import tensorfuse as tf
from benchmarks.user_kernels import embedding, segment_mean
from tests.helpers import poisoned_main


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
         "embedding_sizes_as_arguments": (tf.grad(embedding), embedding_case)}

if __name__ == "__main__":
    # every size an argument of the kernels from the first call where the case's name says so
    poisoned_main(CASES, lambda name, kernel: tf.compile(
        kernel, target="cuda:sm_90a",
        dynamic=True if name.endswith("sizes_as_arguments") else None))
