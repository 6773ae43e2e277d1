"""A block-sparse mask written as a lookup (issue 19): ``layout[i // 128, j // 128] > 0``. The
block schedule is computed from the layout's values — only the key blocks it keeps are visited,
and a kept block is whole (no mask arithmetic in it) where the kernel's blocks fall inside the
layout's; the kernel is right against float64 on the GPU (marked ``gpu``)."""
from __future__ import annotations

import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels.attention import KV, Q, scores, softmax_attend
from tensorfuse.schedule_templates.block_schedule import block_lists
from tensorfuse.schedule_templates.hopper_attention_plan import plan_hopper_attention
from tests.helpers import run_interpreted

torch = pytest.importorskip("torch")

CHAIN = ("m", "l", "o")
LAYOUT_BLOCK = 128


def kernel_for_block(size: int):
    """Attention where a [query block, key block] table of ``size``-token blocks says which
    pairs see each other."""
    @tf.kernel
    def block_sparse_attention(q: Q, k: KV, v: KV, layout: T.Tensor["MB", "NB", "i32"],
                               scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = scores(q, k, b, h, h, i, j, d, scale)
        keep = layout[i // size, j // size] > 0
        return softmax_attend(T.where(keep, s, -T.inf), v[b, h, j, e], j)
    return block_sparse_attention


block_sparse_attention = kernel_for_block(LAYOUT_BLOCK)


def random_layout(blocks: int, generator) -> "torch.Tensor":
    """About a third of the pairs, the diagonal always (so no query row is left empty)."""
    layout = (torch.rand(blocks, blocks, generator=generator) < 0.3).to(torch.int32)
    layout.fill_diagonal_(1)
    return layout


@pytest.mark.parametrize("block_n", [128, 64])
def test_the_schedule_visits_exactly_the_layouts_blocks_whole(block_n):
    plan = plan_hopper_attention(block_sparse_attention.program, CHAIN, "j")
    b, h, i, j = plan.chain.axes
    S, blocks = 1024, 8
    sizes = dict(B=1, H=2, HKV=2, M=S, N=S, D=128, MB=blocks, NB=blocks)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        layout = random_layout(blocks, generator)
        partial_num, _, full_num, full_idx = block_lists(
            plan.mask, [b, h], i, j, sizes, {"layout": layout}, {}, 128, block_n, "cpu")
        per = LAYOUT_BLOCK // block_n   # kernel key blocks per layout block
        assert int(partial_num.sum()) == 0   # blocks inside the layout's: whole, never masked
        for row in range(full_num.numel()):   # (batch·head, row block), the layout's row
            want = [per * c + x for c in layout[row % blocks].nonzero().flatten().tolist()
                    for x in range(per)]
            assert sorted(full_idx[row, :full_num[row]].tolist()) == want


def test_a_block_that_straddles_the_layout_is_partial():
    """A layout of 96-token blocks cuts the kernel's 128-token blocks: the pairs it cuts are
    partial (their mask evaluated in registers) — with a diagonal layout, none is whole."""
    @tf.kernel
    def coarse(q: Q, k: KV, v: KV, layout: T.Tensor["MB", "NB", "i32"], scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = scores(q, k, b, h, h, i, j, d, scale)
        return softmax_attend(T.where(layout[i // 96, j // 96] > 0, s, -T.inf), v[b, h, j, e], j)

    plan = plan_hopper_attention(coarse.program, CHAIN, "j")
    b, h, i, j = plan.chain.axes
    layout = torch.eye(11, dtype=torch.int32)
    sizes = dict(B=1, H=1, HKV=1, M=1024, N=1024, D=128, MB=11, NB=11)
    partial_num, _, full_num, _ = block_lists(plan.mask, [b, h], i, j, sizes,
                                              {"layout": layout}, {}, 128, 128, "cpu")
    assert int(partial_num.sum()) > 0 and int(full_num.sum()) == 0


def test_tf_compile_takes_the_hopper_template_with_lists_per_call():
    f = tf.compile(block_sparse_attention, "cuda:sm_90a")
    sizes = dict(B=1, H=2, M=1024, N=1024, D=128, MB=8, NB=8)
    assert "hopper" in f.description
    sch = tf.schedule(block_sparse_attention, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    sch.apply_template("hopper_attention")
    assert "mask: layout[i // 128, j // 128] > 0 (blocks sorted per call into skipped, partial " \
        "and full)" in sch.plan(**sizes)


@pytest.mark.gpu
@pytest.mark.parametrize("S", [1024, 1000])
def test_block_sparse_matches_float64_on_the_gpu(S):
    """Fresh random inputs (and ×8 wider ones), a random layout, a ragged length, the output
    poisoned with NaN before the call: within bf16 tolerance of float64."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    B, H, D = 2, 4, 128
    blocks = -(-S // LAYOUT_BLOCK)
    generator = torch.Generator().manual_seed(S)
    f = tf.compile(block_sparse_attention)
    for width in (1.0, 8.0):
        q, k, v = (width * torch.randn(B, H, S, D, generator=generator) for _ in range(3))
        layout = random_layout(blocks, generator)
        keep = layout.repeat_interleave(LAYOUT_BLOCK, 0).repeat_interleave(LAYOUT_BLOCK, 1)
        keep = keep[:S, :S].bool()
        scale = D ** -0.5
        q16, k16, v16 = (x.to("cuda", torch.bfloat16) for x in (q, k, v))
        s = (q16.double() @ k16.double().transpose(-1, -2)).cpu() * scale
        s = s.masked_fill(~keep, float("-inf"))
        want = torch.softmax(s, dim=-1) @ v16.double().cpu()
        out = torch.full((B, H, S, D), float("nan"), device="cuda", dtype=torch.bfloat16)
        f(q16, k16, v16, layout.cuda(), scale=scale, out=out)
        err = (out.double().cpu() - want).abs().max() / want.abs().max()
        assert torch.isfinite(out).all() and err < 2e-2, (width, float(err))


def test_block_sparse_and_strided_kernels_match_float64_off_the_hopper_path():
    """The CPU target (the fused rolling update) and the Triton template (through Triton's
    interpreter) on small ragged cases, against float64 references made from the masks'
    definitions; the Hopper path's numbers are the GPU tests'."""
    import os
    import secrets

    from tests.schedule_templates.sparse_references import block_sparse_case, strided_case

    seed = int(os.environ.get("TENSORFUSE_SEED", secrets.randbits(32)))
    generator = torch.Generator().manual_seed(seed)
    for kernel, inputs, scalars, want in (block_sparse_case(generator), strided_case(generator)):
        out = tf.compile(kernel, "llvm")(**inputs, **scalars)
        err = float((out.double() - want).abs().max() / want.abs().max())
        assert err < 1e-2, (kernel.program.name, err, seed)   # bf16 output
    errors = run_interpreted("tests.schedule_templates.sparse_check", seed)
    assert max(errors.values()) < 1e-2, (errors, seed)
