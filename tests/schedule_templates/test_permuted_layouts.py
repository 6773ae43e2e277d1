"""Attention on tensors in other layouts than the library's (``[B, S, H, D]``, ``[S, B, H, D]``, a
GQA cache in ``[B, S, HKV, D]``): the same plans as the library's layout, made from the roles of
the axes, not their positions — the row-tile template's rows are the queries wherever they sit,
and the Hopper template reads each tensor through a 4-D tensor map of its own strides and writes
the output at its layout's offsets (no copy, no transpose). Checked against float64 einsum
references of the math as written (``permuted_layouts``)."""
from __future__ import annotations

import os
import re
import secrets

import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tests.helpers import fresh_seed, needs_nvcc, run_interpreted
from tests.schedule_templates.test_hopper_attention import assert_consumers_do_not_spill
from tests.schedule_templates.permuted_layouts import (KERNELS, inputs, reference,
                                                       reference_gradients, relative_error)

CHAIN = ("m", "l", "o")
SIZES = dict(B=2, H=16, M=4096, N=4096, D=128)
LIBRARY = {"bshd_causal": K.causal_attention, "sbhd_attention": K.attention,
           "bshd_gqa_causal": K.gqa_causal_attention,
           "keys_innermost_causal": K.causal_attention,
           "gqa_keys_innermost_causal": K.gqa_causal_attention,
           "bshd_keys_innermost": K.attention}


def _sizes(name: str, **over) -> dict:
    return {**SIZES, **({"HKV": 4} if "gqa" in name else {}), **over}


def _plan(kernel, template: str, **sizes) -> str:
    sch = tf.schedule(kernel, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    sch.apply_template(template)
    return sch.plan(**sizes)


def _without_names(text: str, program_name: str) -> str:
    return text.replace(program_name, "<kernel>")


@pytest.mark.parametrize("name", list(KERNELS))
def test_the_row_tile_plan_is_the_library_layouts(name):
    """The Triton template's plan — grid, rows, sweep, products, states, mask — is the library
    kernel's, apart from how the tensors are indexed."""
    kernel, library = KERNELS[name][0], LIBRARY[name]
    sizes = _sizes(name)

    def roles(text: str) -> list[str]:
        return [re.sub(r"\[[^\]]*\]", "[…]", line) for line in text.splitlines()
                if line.lstrip().startswith(("grid:", "swept:", "state", "mask:", "knobs:"))]

    assert roles(_plan(kernel, "attention", **sizes)) == roles(_plan(library, "attention", **sizes))
    assert "rows i" in _plan(kernel, "attention", **sizes)


@pytest.mark.parametrize("name", list(KERNELS))
def test_the_hopper_plan_is_the_library_layouts_with_strided_parts(name):
    from tensorfuse.schedule_templates.hopper_attention_plan import plan_hopper_attention

    kernel, library = KERNELS[name][0], LIBRARY[name]
    ours, theirs = (plan_hopper_attention(k.program, CHAIN, "j") for k in (kernel, library))
    assert ours.chain.dims == theirs.chain.dims and ours.chain.permuted
    assert (ours.mask is None) == (theirs.mask is None)
    assert ours.scale.key() == theirs.scale.key()
    assert ours.chain.layouts[:2] == (KERNELS[name][1], KERNELS[name][2])
    differ = {role for (role, a), (_, b) in zip(ours.parts, theirs.parts) if a != b}
    assert differ == {"load", "epilogue"}, ours.parts
    assert "each read through a 4-D tensor map of its strides" in \
        _plan(kernel, "hopper_attention", **_sizes(name))


def test_a_layout_with_the_head_dim_outside_is_refused_by_hopper_and_run_by_triton():
    from tensorfuse.errors import ScheduleError

    @tf.kernel
    def head_dim_first(q: T.Tensor["D", "B", "H", "M", "bf16"],
                       k: T.Tensor["D", "B", "H", "N", "bf16"],
                       v: T.Tensor["B", "H", "N", "D", "bf16"], scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.sum(q[d, b, h, i] * k[d, b, h, j], over=d) * scale
        return K.softmax_attend(s, v[b, h, j, e], j)

    with pytest.raises(ScheduleError, match="innermost axis of q, v and the output"):
        _plan(head_dim_first, "hopper_attention", B=1, H=2, M=256, N=256, D=64)
    assert "rows i" in _plan(head_dim_first, "attention", B=1, H=2, M=256, N=256, D=64)


@needs_nvcc
@pytest.mark.parametrize("name", ["bshd_causal", "bshd_gqa_causal"])
def test_tf_compile_takes_the_hopper_template_with_4d_tensor_maps(name):
    f = tf.compile(KERNELS[name][0], "cuda:sm_90a")
    sizes = _sizes(name)
    assert f.schedule_origin(**sizes).startswith("hopper_attention")
    source = f.source(**sizes)
    assert "OUT_AT(w.bh / H_, w.bh % H_, row)" in source
    assert_consumers_do_not_spill(source)
    ptx = f.ptx(**sizes)
    assert "cp.async.bulk.tensor.4d" in ptx and "cp.async.bulk.tensor.3d" not in ptx
    assert "wgmma.mma_async" in ptx


@needs_nvcc
@pytest.mark.parametrize("name", [n for n in KERNELS if "keys_innermost" in n])
def test_keys_kept_innermost_are_the_mn_major_operand_of_q_k(name):
    """k stored ``[B, H, D, N]`` (a transposed cache): the Hopper template copies it in boxes of
    64 keys × the head dim's rows and multiplies them as q·kᵀ's MN-major operand (wgmma's
    transposed B), in key blocks that are multiples of 64; keys whose rows are no multiple of 16
    bytes (N = 777) run on the Triton template, which says why."""
    f = tf.compile(KERNELS[name][0], "cuda:sm_90a")
    sizes = _sizes(name)
    assert f.schedule_origin(**sizes).startswith("hopper_attention")
    assert "k's keys innermost: boxes of 64 keys" in f.describe_plan(**sizes)
    source = f.source(**sizes)
    assert "tf_tma_load_4d(k_tiles + s * K_BYTES + a * D_ * 128, k_map" in source
    assert "tf_nmajor_desc(k_base + SLOT(it) * K_BYTES, D_, 0, ks * 16)" in source
    assert "#define BN 128" in source   # not 176: keys in boxes of 64
    # q·kᵀ on the transposed-B wgmma (A and B from shared memory), no K-major one left
    assert "void tf_wgmma_m64n128k16(" in source and "tf_wgmma_kk_" not in source
    assert_consumers_do_not_spill(source)
    assert "cp.async.bulk.tensor.4d" in f.ptx(**sizes)
    odd = _sizes(name, M=777, N=777)
    assert not f.schedule_origin(**odd).startswith("hopper_attention")
    assert "not a multiple of 16 bytes" in f.describe_plan(**odd)


def test_the_cpu_target_matches_float64():
    seed = int(os.environ.get("TENSORFUSE_SEED", secrets.randbits(32)))
    generator = torch.Generator().manual_seed(seed)
    for name, (kernel, *_) in KERNELS.items():
        x = inputs(name, 2, 4, 2 if "gqa" in name else 4, 33, 70, 16, generator, width=4.0)
        out = tf.compile(kernel, "llvm")(**x, scale=0.25)
        assert relative_error(out, reference(name, **x, scale=0.25)) < 1e-2, (name, seed)


def test_the_triton_template_matches_float64_in_the_interpreter():
    seed = fresh_seed()
    errors = run_interpreted("tests.schedule_templates.permuted_layouts", seed)
    assert set(errors) == {*KERNELS, "backward", "two_head_dims"}, errors
    assert max(errors.values()) < 1e-2, (errors, seed)   # bf16 outputs (the backward: f32)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("M, N, D", [(1000, 1000, 128), (333, 2048, 64), (4096, 4096, 128),
                                     (517, 517, 256)])
def test_permuted_layouts_match_float64_on_the_gpu(name, M, N, D):
    """tf.compile as a user calls it (the Hopper template on sm_90a), fresh inputs at two value
    ranges, the output poisoned first: within bf16 tolerance (2e-2 of the largest output)."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    generator = torch.Generator().manual_seed(M * 7 + D)
    f = tf.compile(KERNELS[name][0])
    HKV = 2 if "gqa" in name else 4
    for width in (1.0, 8.0):
        x = {k: t.cuda() for k, t in inputs(name, 2, 4, HKV, M, N, D, generator, width).items()}
        want = reference(name, **x, scale=D ** -0.5)
        out = torch.full(want.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        f(**x, scale=D ** -0.5, out=out)
        assert relative_error(out, want) < 2e-2, (name, width, relative_error(out, want))


@pytest.mark.gpu
@pytest.mark.parametrize("name, M, N", [("bshd_gqa_causal", 700, 700),
                                        ("keys_innermost_causal", 640, 704)])
def test_training_on_a_permuted_layout_matches_float64_on_the_gpu(name, M, N):
    """autograd through tf.compile: the forward (Hopper, writing its log-sum-exps at the
    ``[B, S, H]`` offsets; keys kept transposed read as the MN-major operand) and the backward
    template, gradients within bf16 tolerance."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    generator = torch.Generator().manual_seed(3)
    f = tf.compile(KERNELS[name][0])
    x = {k: t.cuda().requires_grad_() for k, t in
         inputs(name, 2, 8, 2 if "gqa" in name else 8, M, N, 128, generator).items()}
    out = f(**x, scale=128 ** -0.5)
    d_out = torch.randn(out.shape, generator=generator).to(out)
    got = torch.autograd.grad(out, tuple(x.values()), d_out)
    want = reference_gradients(name, *x.values(), 128 ** -0.5, d_out)
    for g, w in zip(got, want):
        assert float((g.double().cpu() - w).norm() / w.norm()) < 2e-2
    assert f.torch_op.training is not None   # the forward saved the log-sum-exp


@tf.kernel
def _biased_keys_innermost(q: T.Tensor["B", "H", "S", "D", "bf16"],
                           kt: T.Tensor["B", "H", "D", "S", "bf16"],
                           v: T.Tensor["B", "H", "S", "D", "bf16"],
                           bias: T.Tensor["H", "S", "S", "bf16"], scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * kt[b, h, d, j], over=d) * scale + bias[h, i, j]
    return K.softmax_attend(s, v[b, h, j, e], j)


@pytest.mark.gpu
def test_keys_kept_innermost_beside_score_tiles_match_float64_on_the_gpu():
    """Keys kept transposed and a bias read by query and key (copied as score tiles beside the
    keys): the Hopper template against float64 at two value ranges (grouped heads and other
    layouts with such keys: the parametrized test above)."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    generator = torch.Generator().manual_seed(5)
    B, H, S, D, scale = 2, 16, 1024, 128, 128 ** -0.5
    f = tf.compile(_biased_keys_innermost)
    assert f.schedule_origin(B=B, H=H, S=S, D=D).startswith("hopper_attention")
    for width in (1.0, 6.0):
        q, kt, v, bias = ((torch.randn(*shape, generator=generator) * width).to(torch.bfloat16)
                          for shape in ((B, H, S, D), (B, H, D, S), (B, H, S, D), (H, S, S)))
        want = torch.softmax(q.double() @ kt.double() * scale + bias.double(), -1) @ v.double()
        out = torch.full(want.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        f(q.cuda(), kt.cuda(), v.cuda(), bias.cuda(), scale=scale, out=out)
        assert relative_error(out, want) < 2e-2, width
