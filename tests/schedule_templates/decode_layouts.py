"""Decodes as users write them — without a query axis, heads sharing one cache, a paged cache
swept over its pages and slots — and their float64 references (torch, never the project's
lowering): shared by the tests of their plans and their check under Triton's interpreter
(``python -m tests.schedule_templates.decode_layouts SEED`` with ``TRITON_INTERPRET=1``)."""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels import softmax_attend, static_cache_attention
from benchmarks.user_kernels import gqa_decode, mqa_decode, paged_decode
from tests.helpers import poisoned_main, templated


@tf.kernel
def mha_decode(q: T.Tensor["B", "H", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
               v: T.Tensor["B", "H", "N", "D", "bf16"], scale: T.f32):
    """Every head on its own keys, no query axis: one query row per program."""
    b, h, j, d, e = T.axes("b h j d e")
    s = T.sum(q[b, h, d] * k[b, h, j, d], over=d) * scale
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def paged_lengths_decode(q: T.Tensor["B", "H", "D", "bf16"],
                         k_pages: T.Tensor["PAGES", "HKV", "PAGE", "D", "bf16"],
                         v_pages: T.Tensor["PAGES", "HKV", "PAGE", "D", "bf16"],
                         table: T.Tensor["B", "NP", "i32"], lengths: T.Tensor["B", "i32"],
                         scale: T.f32):
    """Pages laid out [page, kv-head, slot, d] (vLLM's), each sequence's first lengths[b] keys."""
    b, h, p, t, d, e = T.axes("b h p t d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = T.sum(q[b, h, d] * k_pages[table[b, p], hk, t, d], over=d) * scale
    keep = p * T.size("PAGE") + t < lengths[b]
    return softmax_attend(T.where(keep, s, -T.inf), v_pages[table[b, p], hk, t, e], (p, t))


def _attend(q, keys, values, scale, lengths=None):
    """float64 softmax(q·kᵀ)·v of [B, H, D] queries over [B, H, N, D] keys and values."""
    s = torch.einsum("bhd,bhnd->bhn", q.double(), keys.double()) * scale
    if lengths is not None:
        s = s.masked_fill(torch.arange(s.shape[-1])[None, None] >= lengths[:, None, None],
                          float("-inf"))
    return torch.einsum("bhn,bhnd->bhd", torch.softmax(s, -1), values.double())


def _randn(generator, *shape, width=3.0):
    return (torch.randn(*shape, generator=generator) * width).to(torch.bfloat16)


def gqa_case(generator, B=2, H=8, HKV=2, N=77, D=32):
    q, k, v = _randn(generator, B, H, D), _randn(generator, B, HKV, N, D), \
        _randn(generator, B, HKV, N, D)
    G = H // HKV
    return {"q": q, "k": k, "v": v, "scale": 0.3}, \
        _attend(q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1), 0.3)


def mha_case(generator, B=2, H=3, N=77, D=32):
    q, k, v = _randn(generator, B, H, D), _randn(generator, B, H, N, D), \
        _randn(generator, B, H, N, D)
    return {"q": q, "k": k, "v": v, "scale": 0.3}, _attend(q, k, v, 0.3)


def mqa_case(generator, B=2, H=24, N=77, D=32):
    """24 heads on one cache: a row tile of 32, its last 8 rows masked."""
    q, k, v = _randn(generator, B, H, D), _randn(generator, B, N, D), _randn(generator, B, N, D)
    return {"q": q, "k": k, "v": v, "scale": 0.3}, \
        _attend(q, k[:, None].expand(B, H, N, D), v[:, None].expand(B, H, N, D), 0.3)


def _pool(generator, B, NP, spare):
    pool = B * NP + spare
    return pool, torch.randperm(pool, generator=generator)[:B * NP].reshape(B, NP).to(torch.int32)


def paged_lengths_case(generator, B=3, H=4, HKV=2, D=16, PAGE=8, NP=5, spare=3):
    """Pages at random in a pool with unused ones; lengths from one key to every page full."""
    pool, table = _pool(generator, B, NP, spare)
    k_pages, v_pages = (_randn(generator, pool, HKV, PAGE, D) for _ in range(2))
    lengths = torch.randint(1, NP * PAGE + 1, (B,), generator=generator).to(torch.int32)
    G = H // HKV
    keys, values = (t[table.long()].permute(0, 2, 1, 3, 4).reshape(B, HKV, NP * PAGE, D)
                    .repeat_interleave(G, 1) for t in (k_pages, v_pages))
    q = _randn(generator, B, H, D)
    return {"q": q, "k_pages": k_pages, "v_pages": v_pages, "table": table, "lengths": lengths,
            "scale": 0.25}, _attend(q, keys, values, 0.25, lengths.long())


def static_cache_case(generator, B=3, H=8, HKV=2, N=77, D=32, M=1):
    """A static cache filled to a length per sequence — inside it, at it, past it — with
    ``M`` queries at the end of the filled part (decode, or a chunk of a prefill)."""
    from tensorfuse.kernels.reference import ref_static_cache_attention

    q, k, v = _randn(generator, B, H, M, D), _randn(generator, B, HKV, N, D), \
        _randn(generator, B, HKV, N, D)
    length = torch.tensor([30, N, N + 13], dtype=torch.int32)[:B]
    want = ref_static_cache_attention(*(t.double().numpy() for t in (q, k, v)),
                                      length.numpy(), 0.3)
    return {"q": q, "k": k, "v": v, "length": length, "scale": 0.3}, torch.from_numpy(want)


def static_chunk_case(generator):
    return static_cache_case(generator, M=3)


def paged_case(generator):
    """The user suite's paged decode ([page, slot, kv-head, d]) at small, ragged sizes."""
    from tests.schedule_templates.staged_floor import paged_decode_case

    return paged_decode_case(generator)


CASES = {"gqa_decode": (gqa_decode, gqa_case), "mha_decode": (mha_decode, mha_case),
         "mqa_decode": (mqa_decode, mqa_case), "paged_decode": (paged_decode, paged_case),
         "paged_lengths_decode": (paged_lengths_decode, paged_lengths_case),
         "static_cache_decode": (static_cache_attention, static_cache_case),
         "static_cache_chunk": (static_cache_attention, static_chunk_case)}


if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: templated(kernel))
