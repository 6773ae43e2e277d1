"""Rows off 16-byte boundaries read through aligned windows (targets.triton.row_realign): where the
row kernel takes them, what sm_90a code they make (16-byte loads), the numbers through Triton's
interpreter, and on a GPU."""
from __future__ import annotations

import re

import pytest

import tensorfuse.kernels as K
from tests.helpers import check_interpreted
from tests.schedule_templates.realigned_rows_check import CASES, SIZES_AS_ARGUMENTS, template

pytest.importorskip("triton", reason="the row template generates Triton kernels")


def _source(kernel, block: int, **sizes) -> str:
    return template(kernel, block).source(**sizes)


def test_windows_where_rows_start_off_boundaries():
    # 301 bf16 a row: rows start at every offset modulo 16 bytes; the tensor ends inside a
    # vector (7 · 301 = 2107), so a last block reads its tail element by element
    source = _source(K.softmax, 128, M=7, N=301)
    assert "al_m = row_at // 8 * 8" in source
    assert "tl.load(x + (flat_n), mask=" in source          # the window, not the row's offsets
    assert source.count("start_n = 2104 - (2107 - 301) // 8 * 8") == 2   # both passes' tails
    # 8 · 301 ends on a whole vector: no tail block
    assert "start_n = 2408" not in _source(K.softmax, 128, M=8, N=301)


@pytest.mark.parametrize("knobs, sizes, why", [
    (dict(block=128), dict(M=7, N=304), "rows start on 16-byte boundaries"),
    (dict(block=512), dict(M=7, N=301), "one block holds the row"),
    (dict(block=128, rows=1, num_warps=4), dict(M=7, N=301), "a thread holds one element"),
])
def test_no_windows_where_they_do_not_pay(knobs, sizes, why):
    assert "al_m" not in template(K.softmax, **knobs).source(**sizes), why


def test_no_windows_for_a_weight_along_the_columns():
    """A norm's weight would be gathered at every row's shifted columns, element by element."""
    assert "al_m" not in template(K.layernorm, 128).source(M=7, N=301)


def test_blocks_inside_every_row_test_nothing():
    source = _source(K.softmax, 128, M=8, N=301)   # whole row tiles: no rows' mask either
    inside = source[source.index("for start_n in range(BLOCK_N, mid_n"):]
    inside = inside[:inside.index("for start_n in range(mid_n")]
    assert "col_ok" not in inside and "mask=" not in inside
    assert "tl.store(out_out + (flat_n)" in source   # the output at the aligned positions


def test_f32_rows_take_four_a_vector():
    source = _source(CASES["softmax_f32"][0], 64, M=5, N=301)
    assert "al_m = row_at // 4 * 4" in source


def test_sm90a_reads_the_windows_in_16_byte_vectors():
    """The realigned loads are ``ld.global.v4`` (16 bytes); stores are too, but for each row's
    first and last vector, stored element by element (a store may not touch the neighbouring
    row): two such stores a thread, not the whole first and last blocks'."""
    import tensorfuse as tf
    from tests.targets.golden_sources import pinned

    with pinned():   # the template's defaults: blocks of 16384, 32 elements a thread
        ptx = tf.compile(K.softmax, "cuda:sm_90a").ptx(M=8192, N=50257)
    loads = re.findall(r"ld\.global[\w.:]*", ptx)
    assert loads and all(x.endswith(".v4.b32") for x in loads), sorted(set(loads))
    assert re.search(r"st\.global\.v4", ptx)
    assert len(re.findall(r"st\.global[\w.:]*\.b16", ptx)) == 2


def test_gfx942_reads_the_windows_in_16_byte_vectors():
    """ROCm's code for the same windows: the logits in ``global_load_dwordx4`` (the one 2-byte
    load is the gathered target logit)."""
    import tensorfuse as tf
    from tests.targets.golden_sources import pinned

    with pinned():
        made = tf.compile(K.cross_entropy, "rocm:gfx942").for_sizes(M=8192, V=50257)
        assert "al_m = row_at" in made.source(M=8192, V=50257)
        assembly = made.compiled(M=8192, V=50257).asm["amdgcn"]
    assert "global_load_dwordx4" in assembly
    assert len(re.findall(r"global_load_ushort", assembly)) == 1


def test_realigned_rows_interpreted():
    check_interpreted("tests.schedule_templates.realigned_rows_check", CASES)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, M, N", [(K.softmax, 64, 50257), (K.softmax, 33, 20757),
                                          (K.log_softmax, 1025, 20757),
                                          (K.cross_entropy, 65, 50257)])
def test_realigned_rows_on_the_gpu(kernel, M, N):
    """GPT-2's vocabulary and a width whose tensor ends inside a vector, through ``tf.compile``
    on the GPU, into poisoned outputs, against float64."""
    import torch

    import tensorfuse as tf
    from tensorfuse.interop import torch_dtype
    from tests.helpers import relative_error

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (8 * torch.randn(M, N, device="cuda", generator=g)).bfloat16()
    if kernel is K.softmax:
        args, want = dict(x=x), torch.softmax(x.double(), -1)
    elif kernel is K.log_softmax:
        args, want = dict(x=x), torch.log_softmax(x.double(), -1)
    else:
        target = torch.randint(0, N, (M,), device="cuda", generator=g, dtype=torch.int32)
        args = dict(logits=x, target=target)
        want = torch.nn.functional.cross_entropy(x.double(), target.long(), reduction="none")
    made = tf.compile(kernel)
    out = torch.full(want.shape, float("nan"), device="cuda",
                     dtype=torch_dtype(kernel.program.outputs[0].dtypes[0]))
    assert made(**args, out=out) is out
    error = relative_error(out, want)
    assert error < 2e-2, (error, made.source(M=M, **({"V": N} if kernel is K.cross_entropy
                                                      else {"N": N}))[-3000:])


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_interpreted_case_is_read_through_windows(name):
    """The interpreted cases test the windows only where their kernels take them."""
    import torch

    kernel, block, case = CASES[name]
    args, _ = case(torch.Generator().manual_seed(0))
    sizes = {d: n for p in kernel.program.tensor_params
             for d, n in zip(p.dims, args[p.name].shape) if isinstance(d, str)}
    made = template(kernel, block, dynamic=name in SIZES_AS_ARGUMENTS)
    assert "al_m = row_at" in made.source(**sizes)
