"""Tensor maps are encoded once per distinct arguments (the driver's encoding is host time on
every Hopper kernel's call) — and a map of other arguments is encoded again."""
import ctypes

import pytest

from tensorfuse.errors import TargetError
from tensorfuse.targets.cuda import tma


class _Driver:
    """``cuTensorMapEncodeTiled`` as the driver's: writes the map (here: the address and the
    outer stride in its first bytes), counts its calls, fails where told."""

    def __init__(self, fail: int = 0):
        self.calls, self.fail = 0, fail

    def cuTensorMapEncodeTiled(self, out, dtype, rank, address, dims, strides, box, elem, *rest):
        self.calls += 1
        ctypes.memmove(out, ctypes.byref(ctypes.c_uint64(address.value)), 8)
        ctypes.memmove(ctypes.addressof(out) + 8, ctypes.byref(ctypes.c_uint64(strides[0])), 8)
        return self.fail


@pytest.fixture
def driver(monkeypatch):
    made = _Driver()
    monkeypatch.setattr(tma, "libcuda", lambda: made)
    tma._encoded.cache_clear()
    yield made
    tma._encoded.cache_clear()


def test_a_map_is_encoded_once_per_arguments(driver):
    first = tma.tensor_map(0x10000, (32, 4096, 128), (1, 64, 64))
    again = tma.tensor_map(0x10000, [32, 4096, 128], [1, 64, 64], "bf16")   # lists as tuples
    assert again == first and driver.calls == 1
    other_tensor = tma.tensor_map(0x20000, (32, 4096, 128), (1, 64, 64))
    other_dtype = tma.tensor_map(0x10000, (32, 4096, 128), (1, 64, 32), "f32")
    other_strides = tma.tensor_map(0x10000, (32, 4096, 128), (1, 64, 64),
                                   strides=(128, 32 * 128))
    assert driver.calls == 4
    assert len({first, other_tensor, other_dtype, other_strides}) == 4
    assert int.from_bytes(other_tensor[:8], "little") == 0x20000


def test_a_failed_encoding_is_not_kept(monkeypatch, driver):
    driver.fail = 1
    with pytest.raises(TargetError, match="cuTensorMapEncodeTiled failed"):
        tma.tensor_map(0x10000, (32, 4096, 128), (1, 64, 64))
    driver.fail = 0
    assert len(tma.tensor_map(0x10000, (32, 4096, 128), (1, 64, 64))) == 128
    assert driver.calls == 2
