"""Gathered indices out of range (``tensorfuse/index_checks.py``): on the CPU every call checks
them and raises an ``IndexError`` naming the tensor, the dimension, the value and where — before
the kernel runs, so an ``out=`` buffer keeps what it held; in range, the gather matches NumPy."""
import numpy as np
import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import CallError
from tensorfuse.index_checks import IndexOutOfRange, checks_indices, gathers


@tf.kernel
def pooled(table: T.Tensor["V", "D", "f32"], ids: T.Tensor["B", "L", "i32"]):
    b, l, d = T.axes("b l d")   # noqa: E741
    return T.sum(table[ids[b, l], d], over=l)


@tf.kernel
def paged_rows(cache: T.Tensor["P", "S", "D", "f32"], pages: T.Tensor["B", "NP", "i32"],
               order: T.Tensor["NP", "i32"]):
    """A page table read through a permutation of its columns: a gather two deep."""
    b, p, s, d = T.axes("b p s d")
    return T.max(cache[pages[b, order[p]], s, d], over=s)


def test_gathers_in_range_match_numpy(rng):
    table = rng.standard_normal((100, 8)).astype(np.float32) * 100
    ids = rng.integers(0, 100, (4, 5)).astype(np.int32)
    got = tf.compile(pooled, "llvm")(table, ids)
    terms = table.astype(np.float64)[ids]
    # a float32 sum of L terms errs by up to L·eps times the terms' magnitudes: relative to the
    # sum itself it is unbounded where the terms cancel (a seed gave 0.359 from terms of ~100)
    bound = ids.shape[1] * np.finfo(np.float32).eps * np.abs(terms).sum(1)
    assert (np.abs(got - terms.sum(1)) <= bound).all()


@pytest.mark.parametrize("bad", [10 ** 6, -5, 100])
def test_an_index_out_of_range_names_tensor_dimension_value_and_place(rng, bad):
    table = rng.standard_normal((100, 8)).astype(np.float32)
    ids = rng.integers(0, 100, (4, 5)).astype(np.int32)
    ids[2, 3] = bad
    out = np.full((4, 8), np.nan, np.float32)
    with pytest.raises(IndexOutOfRange) as info:
        tf.compile(pooled, "llvm")(table, ids, out=out)
    text = str(info.value)
    assert f"table's dimension 0 (V=100) is indexed by ids[b, l], which is {bad} at b=2, l=3" \
        in text and "1 value out of range" in text
    assert isinstance(info.value, IndexError) and isinstance(info.value, CallError)
    assert np.isnan(out).all()    # nothing ran: the buffer holds what it held
    with pytest.raises(IndexOutOfRange):
        tf.compile(pooled, "llvm")(torch.from_numpy(table), torch.from_numpy(ids))


def test_a_gather_two_deep_checks_the_inner_index_first(rng):
    cache = rng.standard_normal((6, 4, 8)).astype(np.float32)
    pages = rng.integers(0, 6, (2, 3)).astype(np.int32)
    order = np.array([2, 0, 1], np.int32)
    f = tf.compile(paged_rows, "llvm")
    want = cache[pages[:, order]].max(2)                      # [B, NP, D]
    np.testing.assert_array_equal(f(cache, pages, order), want)
    assert [g.index.key() for g in gathers(paged_rows.program)][0] == \
        paged_rows.program.computes[0].bodies[0].indices[0].indices[1].key()
    with pytest.raises(IndexOutOfRange, match=r"pages's dimension 1 \(NP=3\) is indexed by "
                                              r"order\[p\], which is 3 at p=0"):
        f(cache, pages, np.array([3, 0, 1], np.int32))
    pages[1, 2] = 6
    with pytest.raises(IndexOutOfRange, match=r"cache's dimension 0 \(P=6\).* which is 6"):
        f(cache, pages, order)


def test_gpu_calls_are_checked_where_asked(monkeypatch):
    monkeypatch.delenv("TENSORFUSE_CHECK_INDICES", raising=False)
    assert checks_indices("cpu") and not checks_indices("cuda")
    monkeypatch.setenv("TENSORFUSE_CHECK_INDICES", "1")
    assert checks_indices("cuda")


def test_lengths_are_data_in_a_condition_past_the_size_or_negative_and_never_addresses():
    """A length past the key count keeps every key, a negative one none (a softmax over no key
    is 0/0: NaN, as written); a length tensor on another device is refused at binding. As
    docs/dsl.md says."""
    import torch

    import tensorfuse as tf
    from benchmarks.user_kernels import cross_attention_lengths
    from tensorfuse.errors import CallError

    f = tf.compile(cross_attention_lengths, "llvm")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 16, generator=g).to(torch.bfloat16) for n in (5, 7, 7))
    out = f(q, k, v, torch.tensor([7 + 5, -3], dtype=torch.int32), scale=0.25)
    s = q[0].double() @ k[0].double().transpose(-1, -2) * 0.25
    want = torch.softmax(s, -1) @ v[0].double()
    assert float((out[0].double() - want).abs().max()) <= 2e-2 * float(want.abs().max())
    assert torch.isnan(out[1].float()).all()
    with pytest.raises(CallError, match="different devices"):
        f(q, k, v, torch.empty(2, dtype=torch.int32, device="meta"), scale=0.25)
