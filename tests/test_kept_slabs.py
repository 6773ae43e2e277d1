"""Kept memory cut from slabs (:class:`tensorfuse.interop.KeptSlabs`), on the CPU with a
stand-in allocator: buffers never overlap, start at aligned offsets, share a slab until it is
full; a slab's memory lives exactly as long as some buffer cut from it."""
import gc
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tensorfuse.interop import KeptSlabs  # noqa: E402


def slabs(size=4096):
    made = []

    def allocate(nbytes, index):
        host = np.zeros(nbytes, dtype=np.uint8)   # its storage holds the array till freed
        made.append((nbytes, index, weakref.ref(host)))
        return torch.from_numpy(host)

    kept = KeptSlabs(allocate)
    kept.SLAB = size
    return kept, made


def byte_range(x):
    start = x.data_ptr()
    return start, start + x.numel() * x.element_size()


def test_buffers_share_a_slab_apart_and_aligned():
    kept, made = slabs()
    shapes = [((3, 5), torch.float32), ((7,), torch.int32), ((), torch.bfloat16),
              ((0, 4), torch.int64), ((2, 2, 3), torch.uint8)]
    buffers = [kept.take(shape, dtype, 0) for shape, dtype in shapes]
    assert len(made) == 1 and made[0][:2] == (4096, 0)
    base = buffers[0].data_ptr()
    for x, (shape, dtype) in zip(buffers, shapes):
        assert x.shape == shape and x.dtype == dtype
        assert x.numel() == 0 or (x.data_ptr() - base) % KeptSlabs.ALIGN == 0
    for n, x in enumerate(buffers):   # writes to one never reach another
        x.fill_(n + 1)
    for n, x in enumerate(buffers):
        assert x.numel() == 0 or bool((x == n + 1).all())
    spans = sorted(byte_range(x) for x in buffers if x.numel())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_a_full_slab_gives_way_and_devices_have_their_own():
    kept, made = slabs(1024)
    first = [kept.take((64,), torch.float32, 0) for _ in range(4)]   # 4 × 256 bytes: full
    assert len(made) == 1
    fifth = kept.take((1,), torch.int32, 0)
    assert len(made) == 2 and fifth.data_ptr() not in {x.data_ptr() for x in first}
    kept.take((1,), torch.int32, 1)
    assert len(made) == 3 and made[-1][1] == 1


def test_large_buffers_get_their_own_allocation():
    kept, made = slabs(1024)
    big = kept.take((300,), torch.uint8, 0)   # over a quarter of a slab
    assert made == [(300, 0, made[0][2])] and big.shape == (300,)


def test_a_slab_lives_while_any_of_its_buffers_does():
    kept, made = slabs(1024)
    a = kept.take((64,), torch.float32, 0)
    b = kept.take((64,), torch.float32, 0)
    kept.take((1024 // 4,), torch.uint8, 0)
    kept.take((1024 // 4,), torch.uint8, 0)   # the first slab is full: the next call moves on
    kept.take((1,), torch.uint8, 0)
    slab = made[0][2]
    del a
    gc.collect()
    assert slab() is not None   # b still reads it
    b.fill_(3.0)
    assert bool((b == 3.0).all())
    del b
    gc.collect()
    assert slab() is None
