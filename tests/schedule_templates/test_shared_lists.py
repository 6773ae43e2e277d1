"""The Hopper attention's block lists of a mask over the query and key positions alone (causal, a
window, a prefix) are made for one batch·head and read by every one; a mask that reads the batch,
the head or a tensor keeps a list per batch·head. On the CPU: the plan, the source's list index
and the lists' length; on an H100/H200 (``gpu``): both kinds against float64."""
from __future__ import annotations

import importlib
import math

import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.kernels.attention import KV, Q, key_position, scores, softmax_attend
from tensorfuse.schedule_templates.hopper_attention_plan import plan_hopper_attention

CHAIN = ("m", "l", "o")
SIZES = dict(B=2, H=3, M=700, N=1000, D=128)


@tf.kernel
def head_window_attention(q: Q, k: KV, v: KV, scale: T.f32):
    """Causal, each head seeing a window of its own width: a mask that reads the head."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    keep = (key_position(i) >= j) & (key_position(i) - j < 200 * (h + 1))
    return softmax_attend(T.where(keep, s, -T.inf), v[b, h, j, e], j)


def _hopper(kernel):
    sch = tf.schedule(kernel, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    return sch.apply_template("hopper_attention", block_n=128).compile()


@pytest.mark.parametrize("kernel, shared", [
    (K.causal_attention, True), (K.sliding_window_attention, True),
    (K.prefix_lm_attention, True), (K.document_attention, False),
    (head_window_attention, False), (K.attention, False)])
def test_masks_over_positions_alone_share_one_batch_heads_lists(kernel, shared):
    plan = plan_hopper_attention(kernel.program, CHAIN, "j")
    assert plan.lists_shared == shared
    source = _hopper(kernel).source(**SIZES)
    if plan.mask is None:   # no lists at all: the source reads none
        assert "#define LISTS 0" in source
        return
    index = "const int at = w.rb;" if shared else "const int at = w.bh * row_blocks + w.rb;"
    assert index in source


@pytest.mark.parametrize("kernel, scalars", [(K.causal_attention, {"scale": 0.1}),
                                             (K.sliding_window_attention,
                                              {"scale": 0.1, "window": 300}),
                                             (head_window_attention, {"scale": 0.1})])
def test_the_lists_are_one_batch_heads_where_shared(kernel, scalars):
    """The lists ``_Lists`` makes: ``row blocks`` counts where shared, ``B·H·row blocks``
    otherwise (made on the CPU here: the host's sort and the device's evaluation alike)."""
    module = importlib.import_module("tensorfuse.schedule_templates.hopper_attention")
    launches = _hopper(kernel).launches(**SIZES)
    lists = module._Lists(launches.plan, launches.knobs, None)
    (pn, pi, fn, fi, _, _), _ = lists(dict(scalars), SIZES, "cpu")
    row_blocks = math.ceil(SIZES["M"] / launches.knobs.block_m)
    copies = 1 if launches.plan.lists_shared else SIZES["B"] * SIZES["H"]
    assert pn.shape == fn.shape == (copies * row_blocks,)
    assert pi.shape[0] == copies * row_blocks


def _reference(q, k, v, scale, keep):
    """float64 softmax attention of the visible keys (``keep``: [H, M, N] booleans)."""
    import torch

    s = torch.einsum("bhid,bhjd->bhij", q.double(), k.double()) * scale
    s = s.masked_fill(~keep.unsqueeze(0), float("-inf"))
    return torch.einsum("bhij,bhje->bhie", torch.softmax(s, dim=-1), v.double())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["causal", "head_window"])
def test_shared_and_per_head_lists_match_float64_on_the_gpu(name):
    """B=2, H=3, 700 queries over 1000 keys (ragged blocks), inputs over a wide range, the output
    poisoned: causal (one batch·head's lists for all six) and a window per head (six lists)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    B, H, M, N, D = (SIZES[n] for n in "BHMND")
    generator = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, H, n, D, generator=generator) * 3
               for n in (M, N, N))
    q, k, v = (t.to("cuda", torch.bfloat16) for t in (q, k, v))
    scale = 1 / math.sqrt(D)
    kernel = K.causal_attention if name == "causal" else head_window_attention
    made = _hopper(kernel)
    out = torch.full((B, H, M, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    made(q, k, v, scale, out=out)
    position = torch.arange(M, device="cuda").view(1, -1, 1) + (N - M)
    key = torch.arange(N, device="cuda").view(1, 1, -1)
    heads = torch.arange(H, device="cuda").view(-1, 1, 1)
    keep = (position >= key).expand(H, M, N)
    if name == "head_window":
        keep = keep & (position - key < 200 * (heads + 1))
    want = _reference(q, k, v, scale, keep)
    error = (out.double() - want).abs().max().item()
    assert not out.isnan().any() and error < 3e-2 * want.abs().max().item(), error
