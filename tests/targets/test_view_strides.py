"""Torch views read where they lie by the Triton kernels (:mod:`tensorfuse.targets.triton.
view_strides`): which views, the build a view gets (its strides in the source, a key of its
own), 64-bit offsets where a view reaches far, the sm_90a code's vector loads along a sliced
row, the numbers against float64 and the copies counted in Triton's interpreter, and on a GPU
the repeated call's fast path."""
import re

import pytest
import torch

import tensorfuse as tf
from tensorfuse.targets.triton.tile_text import needs_wide_offsets
from tensorfuse.targets.triton.view_strides import call_views, readable_view, reading_views
from tests.helpers import fresh_seed, run_interpreted
from tests.targets.views_check import project, softmax_rows

triton = pytest.importorskip("triton", reason="the templates generate Triton kernels")

# bf16 outputs of bf16 products: 2e-2 of the largest value; float32 softmax: 1e-5
TOLERANCES = {"project": 2e-2, "paged": 2e-2, "softmax": 1e-5, "gated": 1e-5}
# copies the call makes of its arguments: views read where they lie make none
COPIES = {"softmax column slice": 0, "softmax every other row": 0,
          "softmax misaligned slice": 1, "softmax transposed": 1,
          "project packed input": 1,   # its weight slice starts 4 bytes into a row: copied
          "project both views": 0, "gated views": 0, "paged latent decode": 0}


def test_which_views_are_read_where_they_lie():
    big = torch.zeros(40, 300)
    assert readable_view(big[:, 4:100])          # 16 bytes in, rows 300 apart
    assert readable_view(big[::3])               # rows 900 apart
    assert readable_view(big[:1].expand(40, 300))   # one row for all: rows 0 apart
    assert not readable_view(big[:, :1])          # a column: its elements 300 apart
    assert not readable_view(big[:, 3:100])      # 12 bytes in: not a 16-byte start
    assert not readable_view(big.t())            # its innermost dimension is strided
    # in a call: only the views, in the program's order, with their strides
    assert call_views(softmax_rows.program, {"logits": big[:, 4:100]}) == (("logits", (300, 1)),)
    assert call_views(softmax_rows.program, {"logits": big}) == ()
    assert call_views(softmax_rows.program, {"logits": big.t()}) == ()   # copied instead


def test_a_view_copied_before_the_launch_is_said_once_with_why():
    """A transpose and a misaligned slice are copied (the kernels read rows of contiguous
    elements from 16-byte-aligned starts): a CopiedArgumentWarning names the argument, its
    layout and why, once per kernel, argument and layout; a view read in place warns nothing."""
    import types
    import warnings

    from tensorfuse.errors import CopiedArgumentWarning
    from tensorfuse.interop import torch_arguments

    big = torch.randn(64, 300)

    def call(x):
        bound = types.SimpleNamespace(scalars={}, arrays={"logits": x})
        views = dict(call_views(softmax_rows.program, bound.arrays))
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            values = torch_arguments(softmax_rows.program, bound, "cpu", views=views)
        return values["logits"], [str(w.message) for w in said
                                   if issubclass(w.category, CopiedArgumentWarning)]

    for x, why in ((big[:, :64].t(), "innermost dimension is strided"),
                   (big[:, 3:203], "starts 12 bytes past a 16-byte boundary")):
        got, said = call(x)
        assert got.is_contiguous() and torch.equal(got, x)
        assert len(said) == 1 and why in said[0] and "logits" in said[0], said
        assert call(x)[1] == []   # said once
    got, said = call(big[:, 4:204])
    assert got.data_ptr() == big[:, 4:204].data_ptr() and said == []


def test_a_view_gets_a_build_of_its_own_with_its_strides_in_the_source():
    made = tf.compile(softmax_rows, target="cuda:sm_90a").template
    sizes = dict(M=37, E=201)
    plain = made.build(None, **sizes)[2]
    sliced = made.build(None, (("logits", (300, 1)),), **sizes)[2]
    assert plain != sliced
    assert "* 300" in sliced and "* 300" not in plain and "* 201" in plain
    assert made.build(None, (("logits", (300, 1)),), **sizes)[2] is sliced   # kept: built once
    builds = made.cache_info()
    assert len(builds) == 2 and "views" not in builds[0].describe()
    assert builds[1].describe().endswith("views read in place: logits (strides 300, 1)")


def test_a_view_reaching_past_two_to_the_31_gets_64_bit_offsets():
    """A slice of a large pool: few elements, but far apart."""
    program = softmax_rows.program
    sizes = dict(M=1024, E=512)
    assert not needs_wide_offsets(program, sizes)
    with reading_views((("logits", (2 ** 22, 1)),)):   # rows 4M elements apart: 4·10⁹ reached
        assert needs_wide_offsets(program, sizes)


def test_sm90a_code_of_a_sliced_row_loads_vectors_its_strides_allow():
    """Rows 300 float32 apart (1200 bytes, a multiple of 16) from a 16-byte-aligned start: the
    slice is read in 16-byte vectors, as the contiguous tensor is; rows 302 apart (8-byte
    multiples) in 8-byte ones — Triton sees the view's strides as numbers."""
    made = tf.compile(softmax_rows, target="cuda:sm_90a").template

    def loads(views) -> set:
        ptx = made.compiled(views, M=4096, E=256).asm["ptx"]
        return {m.group(1) for m in re.finditer(r"ld\.global[\w:.]*?\.(v\d)\.b32", ptx)}
    assert loads(()) == {"v4"}
    assert loads((("logits", (300, 1)),)) == {"v4"}
    assert loads((("logits", (302, 1)),)) == {"v2"}


def test_views_match_float64_in_the_interpreter_without_copies():
    seed = fresh_seed()
    found = run_interpreted("tests.targets.views_check", seed)
    assert set(found) == set(COPIES)
    for name, got in found.items():
        tolerance = TOLERANCES[name.split()[0]]
        assert got["error"] <= tolerance, (name, got, seed)
        assert got["copies"] == COPIES[name], (name, got, seed)


@pytest.mark.gpu
def test_views_on_the_gpu_match_float64_and_repeat_on_the_fast_path():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    gen = torch.Generator(device="cuda").manual_seed(fresh_seed())
    big = torch.randn(4096, 1024 + 64, device="cuda", generator=gen) * 10
    x = big[:, 64:]   # 256 bytes in: read where it lies
    kernel = tf.compile(softmax_rows).template   # the row template's kernel
    kept = [kernel(x) for _ in range(2)]   # (kept: the next output is a block of its own)
    kernel._prepare = None   # the checked path gone: a third call runs on the fast path
    poison = torch.full_like(x, float("nan"))
    del poison   # its block, NaN, is the one the caching allocator hands the next output
    out = kernel(x)
    assert all(torch.equal(k, out) for k in kept)   # the checked path's and the fast path's
    assert float((out.double() - torch.softmax(x.double(), -1)).abs().max()) < 1e-5
    w = (torch.randn(512, 2 * 384, device="cuda", generator=gen)).bfloat16()[:, 384:]
    a = torch.randn(300, 384, device="cuda", generator=gen).bfloat16()
    got = tf.compile(project)(a, w)
    ref = a.double() @ w.double().T
    assert float((got.double() - ref).abs().max() / ref.abs().max()) < 2e-2
