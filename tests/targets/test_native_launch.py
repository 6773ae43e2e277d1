"""The C launcher of compiled Triton kernels (``targets/triton/native_launch.py``): built here
with Triton's builder, its argument packing checked byte for byte (no GPU needed)."""
from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

pytest.importorskip("triton")

from tensorfuse.targets.triton import native_launch  # noqa: E402


@pytest.fixture(scope="module")
def module():
    built = native_launch.launcher()
    if built is None:
        pytest.skip("no C compiler or Python headers here: Triton could not build its launcher "
                    "either")
    return built


def config(codes: str) -> bytes:
    return native_launch.CONFIG.pack(1, 1, 1, 1, 128, 0, len(codes), codes.encode())


def test_values_are_packed_in_their_parameter_types(module):
    codes = "LilIfdhbcCsSzz"
    values = (2**63 + 5, -7, -2**40, 2**32 - 1, 1.1, 1.1, -2.5, 1.1, -3, 200, -300, 60000)
    slots = module.packed(config(codes), *values)
    assert len(slots) == 8 * len(codes)
    want = [struct.pack("<Q", 2**63 + 5), struct.pack("<i", -7), struct.pack("<q", -2**40),
            struct.pack("<I", 2**32 - 1), struct.pack("<f", 1.1), struct.pack("<d", 1.1),
            struct.pack("<e", -2.5), struct.pack("<f", 1.1)[2:], struct.pack("<b", -3),
            struct.pack("<B", 200), struct.pack("<h", -300), struct.pack("<H", 60000),
            b"", b""]
    for k, expected in enumerate(want):
        slot = slots[8 * k:8 * k + 8]
        assert slot == expected.ljust(8, b"\0"), (codes[k], slot, expected)


@pytest.mark.parametrize("codes, values, error, text", [
    ("i", (2**31,), OverflowError, "does not fit"),
    ("I", (-1,), OverflowError, "does not fit"),
    ("Li", (1,), TypeError, "too few"),
    ("L", (1, 2), TypeError, "too many"),
    ("f", ("x",), TypeError, "must be real number"),
    ("q", (1,), ValueError, "unknown parameter code"),
])
def test_bad_values_raise_clear_errors(module, codes, values, error, text):
    with pytest.raises(error, match=text):
        module.packed(config(codes), *values)


def test_a_configuration_is_checked(module):
    with pytest.raises(TypeError, match="not a launch configuration"):
        module.packed(b"short", 1)


def _kernel(signature, **meta):
    fields = dict(num_ctas=1, num_warps=8, shared=4096)
    fields.update(meta)
    return SimpleNamespace(function=42, src=SimpleNamespace(signature=signature),
                           metadata=SimpleNamespace(**fields))


def test_the_plan_follows_the_kernels_signature():
    signature = {"x": "*bf16", "t": "*i32", "n": "i32", "one": "constexpr", "scale": "fp32",
                 "out": "*fp32", "BLOCK_M": "constexpr"}
    kernel = _kernel(signature)
    fields = native_launch.CONFIG.unpack(native_launch.plan(kernel, (7, 3)))
    assert fields[:7] == (42, 7, 3, 1, 256, 4096, 7)
    assert fields[7].rstrip(b"\0") == b"LLifLzz"     # Triton's two scratch pointers last
    names = ["x", "t", "n", "one", "scale", "out"]
    assert native_launch.values_in_order(kernel, names) == ["x", "t", "n", "scale", "out"]


@pytest.mark.parametrize("signature, meta", [
    ({"x": "*bf16"}, dict(num_ctas=2)),                          # a thread-block cluster
    ({"x": "*bf16"}, dict(launch_pdl=True)),
    ({"x": "*bf16"}, dict(global_scratch_size=64)),              # Triton's scratch memory
    ({"d": "nvTmaDesc"}, {}),                                    # a tensor map argument
    ({"t": ("*fp32", "*fp32")}, {}),                             # a tuple argument
])
def test_kernels_it_does_not_cover_keep_tritons_launcher(signature, meta):
    assert native_launch.plan(_kernel(signature, **meta), (1,)) is None


def test_it_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("TENSORFUSE_NATIVE_LAUNCH", "0")
    assert native_launch.launcher() is None
