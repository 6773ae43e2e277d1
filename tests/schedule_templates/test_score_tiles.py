"""A tensor the attention score reads by query and key (a bias ``[H, S, S]``, a float mask
``[B, 1, S, S]``, rows of it at the dtype's lowest value) in the Hopper attention kernel: copied
as tiles of the scores by TMA into a ring of their own after each key block's keys
(``schedule_templates/score_tiles.py``). On the CPU: the plan by the roles of its indices, the
refusals and their reasons, the choice ``tf.compile`` makes, the sm_90a code (TMA copies of the
tiles, their elements read from shared memory in 32-bit pairs, no spills among the consumers'
products); on an sm_90 GPU, every case against float64, outputs poisoned."""
from __future__ import annotations

import math
import re

import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import ScheduleError
from tensorfuse.schedule_templates.hopper_attention_plan import (SM90_SHARED, HopperKnobs,
                                                                 check_hopper,
                                                                 plan_hopper_attention,
                                                                 shared_bytes, with_knobs)
from tests.helpers import fresh_seed, needs_nvcc
from tests.schedule_templates.test_hopper_attention import assert_consumers_do_not_spill

CHAIN = ("m", "out_sum", "out_sum_2")


def _attend(s, v, b, h, j, e):
    """Softmax over the keys ``j`` of the score ``s``, weighting ``v``'s rows of head ``h``."""
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)


@tf.kernel
def bias_per_head(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                  v: T.Tensor["B", "H", "N", "D", "bf16"], bias: T.Tensor["H", "M", "N", "bf16"],
                  scale: T.f32):
    """A learned relative-position bias per head (T5, Swin)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale + bias[h, i, j]
    return _attend(s, v, b, h, j, e)


@tf.kernel
def float_mask(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
               v: T.Tensor["B", "H", "N", "D", "bf16"], mask: T.Tensor["B", 1, "M", "N", "bf16"],
               scale: T.f32):
    """transformers' additive float mask ``[B, 1, M, N]`` (what it passes SDPA)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale + mask[b, 0, i, j]
    return _attend(s, v, b, h, j, e)


@tf.kernel
def causal_bias_gqa(q: T.Tensor["B", "H", "M", "D", "f16"], k: T.Tensor["B", "G", "N", "D", "f16"],
                    v: T.Tensor["B", "G", "N", "D", "f16"],
                    bias: T.Tensor["B", "H", "M", "N", "f16"], scale: T.f32):
    """Causal, a bias per batch and query head, heads sharing key/value heads, in f16."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    g = h // (T.size("H") // T.size("G"))
    s = T.sum(q[b, h, i, d] * k[b, g, j, d], over=d) * scale + bias[b, h, i, j]
    return _attend(T.where(j <= i, s, -math.inf), v, b, g, j, e)


@tf.kernel
def bias_dqk192(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                v: T.Tensor["B", "H", "N", "E", "bf16"], bias: T.Tensor["H", "M", "N", "bf16"],
                scale: T.f32):
    """q·k over 192, p·v over 128 (DeepSeek's), with a bias per head."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale + bias[h, i, j]
    return _attend(s, v, b, h, j, e)


def _plan(kernel):
    return plan_hopper_attention(kernel.program, CHAIN, "j")


def test_the_tile_is_planned_by_the_roles_of_its_indices():
    from benchmarks.unlisted_kernels import biased_attention_bshd

    for kernel, roles in ((bias_per_head, ("h", "i", "j")), (float_mask, ("b", 0, "i", "j")),
                          (causal_bias_gqa, ("b", "h", "i", "j")),
                          (biased_attention_bshd, ("h", "i", "j"))):
        plan = _plan(kernel)
        assert plan.score_tile is not None and plan.score_tile.roles == roles, kernel.name
        assert "read as tiles of the scores" in plan.describe()
    assert _plan(causal_bias_gqa).mask is not None   # the mask still sorts the blocks
    tile = _plan(float_mask).score_tile
    assert tile.coordinates("n", "r", "bb", "hh") == "n, r, 0, bb"
    assert tile.map_shape(dict(B=2, M=300, N=304), 128) == ((2, 1, 300, 304), (1, 1, 128, 64),
                                                            None)
    assert tile.why_not(dict(B=2, M=300, N=304)) is None
    assert "16 bytes" in tile.why_not(dict(B=2, M=300, N=301))


def _refused(source_line: str) -> str:
    namespace = {"T": T, "tf": tf, "math": math, "_attend": _attend}
    exec(f'''
@tf.kernel
def kernel(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
           v: T.Tensor["B", "H", "N", "D", "bf16"], t: T.Tensor[{source_line[0]}], scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale + {source_line[1]}
    return _attend(s, v, b, h, j, e)
''', namespace)
    with pytest.raises(ScheduleError) as raised:
        _plan(namespace["kernel"])
    return str(raised.value)


@pytest.mark.parametrize("declared, read, reason", [
    ('"H", "N", "M", "bf16"', "t[h, j, i]", "key axis not its innermost"),
    ('"H", "M", "N", "bf16"', "t[h, i, j] + t[0, i, j]", "different indices"),
    ('2, "M", "N", "bf16"', "t[(h + 1) % 2, i, j]", "neither an axis of the chain nor a constant"),
])
def test_tiles_it_cannot_copy_are_refused_with_the_reason(declared, read, reason):
    assert reason in _refused((declared, read))


def test_the_tiles_take_their_shared_memory_and_64_key_boxes():
    plan, sizes = _plan(bias_per_head), dict(B=2, H=16, M=2048, N=2048, D=128)
    knobs = with_knobs(plan, sizes, {})
    assert knobs.block_n == 128   # not the 176 of the plain score: a tile's boxes are 64 keys
    need = shared_bytes(knobs, 128, score_tile=True)
    # two slots of 128 × 128 16-bit scores, each with a full and a free mbarrier
    assert need == shared_bytes(knobs, 128) + 2 * (128 * 128 * 2 + 16) and need <= SM90_SHARED
    with pytest.raises(ScheduleError, match="multiples of 64"):
        check_hopper(plan, HopperKnobs(block_n=80), sizes, SM90_SHARED)
    with pytest.raises(ScheduleError, match="shared memory"):
        check_hopper(plan, HopperKnobs(stages=3), sizes, SM90_SHARED)
    narrow = with_knobs(_plan(bias_dqk192), dict(sizes, D=192, E=128), {})
    assert narrow.block_n == 64   # 192/128 with tiles: two slots of 128 keys do not fit


def test_compile_runs_the_hopper_kernel_where_the_rows_can_be_copied():
    """``tf.compile`` takes the Hopper kernel for a bias whose rows are whole 16-byte pieces,
    and the attention template where they are not (a TMA copy cannot address them)."""
    from benchmarks.unlisted_kernels import biased_attention_bshd

    made = tf.compile(biased_attention_bshd, target="cuda:sm_90a")
    assert "hopper_attention" in made.schedule_origin(B=2, S=2048, H=16, D=128)
    assert "hopper_attention" not in made.schedule_origin(B=2, S=2047, H=16, D=128)


@needs_nvcc
@pytest.mark.parametrize("kernel, sizes", [
    (bias_per_head, dict(B=2, H=4, M=1016, N=1016, D=128)),
    (float_mask, dict(B=2, H=4, M=1016, N=1016, D=64)),
    (causal_bias_gqa, dict(B=2, H=8, G=2, M=1016, N=1016, D=128)),
    (bias_dqk192, dict(B=2, H=4, M=1016, N=1016, D=192, E=128)),
])
def test_the_tiles_are_copied_by_tma_and_read_from_shared_memory(kernel, sizes):
    made = tf.compile(kernel, target="cuda:sm_90a")
    assert "hopper_attention" in made.schedule_origin(**sizes)
    source = made.source(**sizes)
    rank = len(_plan(kernel).score_tile.roles)
    assert re.search(rf"tf_tma_load_{rank}d\(score_tiles \+ s \* T_BYTES", source)
    # in a ring of their own, filled after the keys and freed after the score
    assert "tf_mbar_expect(full_t + s, T_BYTES)" in source
    assert "tf_mbar_expect(full_v + s, V_BYTES)" in source
    assert source.index("tf_mbar_wait(full_t + SLOT(it)") < \
        source.index("tf_mbar_arrive(empty_t + SLOT(it))") < source.index("softmax_block(acc")
    # a mask's lowest values: a block of huge rows is scaled to base 2 first, bounded (the GPU
    # check's "lowest" regime fails without it); other blocks keep the fold
    assert "fminf(fmaxf(s[r], -1e38f), 1e38f) * k" in source
    assert "tf_exp2(fmaf(s[r], k, -mx[(r % 4) / 2]))" in source
    ptx = made.ptx(**sizes)
    assert f"cp.async.bulk.tensor.{rank}d" in ptx and "ld.shared.b32" in ptx
    assert_consumers_do_not_spill(source, per_tile=8)


def _case(kernel, sizes: dict, generator, regime: str):
    """Arguments (bf16/f16 on the GPU) and the float64 reference of ``kernel`` at ``sizes``:
    ``regime`` "normal", "wide" (values 8× larger) or "lowest" (the score's tensor at its dtype's
    lowest value in a quarter of its elements and in every element of its first 40 query rows,
    as transformers writes masks: those rows weigh their keys equally)."""
    import torch

    program = kernel.program
    shapes = {p.name: tuple(d if isinstance(d, int) else sizes[d] for d in p.dims)
              for p in program.params if hasattr(p, "dims")}
    dtype = torch.float16 if program.params[0].dtype == "f16" else torch.bfloat16
    spread = 8.0 if regime == "wide" else 1.0
    args = {n: (torch.randn(s, generator=generator) * spread).to(dtype)
            for n, s in shapes.items()}
    tile = next(n for n in shapes if n not in ("q", "k", "v"))
    if regime == "lowest":
        lowest = torch.finfo(dtype).min
        hidden = torch.rand(shapes[tile], generator=generator) < 0.25
        args[tile] = args[tile].masked_fill(hidden, lowest)
        args[tile][..., :40, :] = lowest
    scale = sizes["D"] ** -0.5
    q, k, v = (args[n].double() for n in ("q", "k", "v"))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    extra = args[tile].double()
    extra = extra if extra.dim() == 4 else extra[None]
    s = q @ k.transpose(-1, -2) * scale + extra
    if kernel is causal_bias_gqa:
        M, N = s.shape[-2:]
        s = s.masked_fill(torch.ones(M, N, dtype=torch.bool).triu(1), -math.inf)
    want = torch.softmax(s, -1) @ v
    return {**{n: a.cuda() for n, a in args.items()}, "scale": scale}, want, dtype


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, sizes", [
    (bias_per_head, dict(B=2, H=4, M=1016, N=1016, D=128)),
    (bias_per_head, dict(B=1, H=2, M=4096, N=4096, D=128)),
    (float_mask, dict(B=2, H=4, M=520, N=1016, D=64)),
    (causal_bias_gqa, dict(B=2, H=8, G=2, M=1016, N=1016, D=128)),
    (bias_dqk192, dict(B=2, H=4, M=1016, N=1016, D=192, E=128)),
])
@pytest.mark.parametrize("regime", ["normal", "wide", "lowest"])
def test_the_tiles_match_float64_on_the_gpu(kernel, sizes, regime):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    args, want, dtype = _case(kernel, sizes, torch.Generator().manual_seed(seed), regime)
    made = tf.compile(kernel)
    assert "hopper_attention" in made.schedule_origin(**sizes)
    out = torch.full(want.shape, float("nan"), dtype=dtype, device="cuda")
    assert made(**args, out=out) is out
    error = float((out.double().cpu() - want).abs().max() / want.abs().max())
    assert error < 2e-2, (seed, error)
