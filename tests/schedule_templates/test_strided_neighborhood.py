"""NATTEN's stride written in the DSL (issue 19): the queries of a ``stride × stride`` group share
the window centred on their group. The mask reads the map through ``(i // W) // stride`` and
``(i % W) // stride``; ``tf.compile`` visits it in patches like any neighbourhood, and the kernel
is right against float64 on the GPU (marked ``gpu``)."""
from __future__ import annotations

import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels.attention import KV, Q, scores, softmax_attend

torch = pytest.importorskip("torch")


@tf.kernel
def strided_neighborhood_2d(q: Q, k: KV, v: KV, scale: T.f32, width: T.i32, radius: T.i32,
                            stride: T.i32):
    """A (2·radius+1)² window on a ``width``-wide image, placed at the centre of each query's
    ``stride × stride`` group (NATTEN's stride)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = scores(q, k, b, h, h, i, j, d, scale)
    cy = (i // width) // stride * stride + stride // 2
    cx = (i % width) // stride * stride + stride // 2
    near = (T.abs(cy - j // width) <= radius) & (T.abs(cx - j % width) <= radius)
    return softmax_attend(T.where(near, s, -T.inf), v[b, h, j, e], j)


def keep(width: int, radius: int, stride: int, S: int) -> "torch.Tensor":
    """The mask, [S, S], from the definition (independent of the DSL's)."""
    t = torch.arange(S)
    y, x = t // width, t % width
    cy, cx = y // stride * stride + stride // 2, x // stride * stride + stride // 2
    return ((cy[:, None] - y[None, :]).abs() <= radius) & \
        ((cx[:, None] - x[None, :]).abs() <= radius)


def test_tf_compile_visits_the_strided_windows_in_patches():
    f = tf.compile(strided_neighborhood_2d, "cuda:sm_90a")
    origin = f.schedule_origin(B=1, H=16, M=4096, N=4096, D=128, width=64, radius=3, stride=2)
    assert "hopper_attention" in origin and "64×64 map in patches of" in origin
    sch = tf.schedule(strided_neighborhood_2d, "cuda").rolling_update("m", "l", "o", axis="j")
    sch.apply_template("attention")   # the Triton template (other GPUs) chooses the same way
    plan = sch.plan(B=1, H=16, M=4096, N=4096, D=128, width=64, radius=3, stride=2)
    assert "visiting order: queries: 64×64 map in patches of" in plan


@pytest.mark.gpu
@pytest.mark.parametrize("width, rows, radius, stride", [(64, 64, 3, 2), (48, 40, 2, 4),
                                                         (37, 29, 3, 3)])
def test_strided_neighborhood_matches_float64_on_the_gpu(width, rows, radius, stride):
    """Fresh random inputs (and ×8 wider ones), maps whose sides the patch or the stride do not
    divide, the output poisoned with NaN: within bf16 tolerance of float64."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    B, H, D, S = 1, 4, 128, width * rows
    generator = torch.Generator().manual_seed(S)
    f = tf.compile(strided_neighborhood_2d)
    mask = keep(width, radius, stride, S)
    for wide in (1.0, 8.0):
        q, k, v = ((wide * torch.randn(B, H, S, D, generator=generator)).to("cuda", torch.bfloat16)
                   for _ in range(3))
        scale = D ** -0.5
        s = (q.double() @ k.double().transpose(-1, -2)).cpu() * scale
        want = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v.double().cpu()
        out = torch.full((B, H, S, D), float("nan"), device="cuda", dtype=torch.bfloat16)
        f(q, k, v, scale=scale, width=width, radius=radius, stride=stride, out=out)
        err = (out.double().cpu() - want).abs().max() / want.abs().max()
        assert torch.isfinite(out).all() and err < 2e-2, (wide, float(err))
