# %% [markdown]
# # 7. Attention as you write it: packed projections, rotary embeddings, two softmaxes, latents
#
# The templates plan attention from the roles of its axes, not from the library's layout. This
# notebook writes four attentions the way a model's code holds its tensors — one packed
# `[B, S, 3, H, D]` projection, GPT-J's interleaved rotary applied where the scores are made,
# differential attention's two softmaxes over one value tensor, and learned latent queries shared
# by the batch — checks each against float64 on this machine, and prints what `tf.compile` runs
# for an H100/H200 (`describe_plan` plans for a target without its GPU): the Hopper attention
# kernel in each case, by four different rewrites. (`python -m benchmarks.serving_kernels`,
# `benchmarks.variant_kernels` and `benchmarks.pipeline_kernels` time them on a GPU.)

# %%
import torch
import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels import softmax_attend

HOPPER = "cuda:sm_90a"
g = torch.Generator().manual_seed(0)


def attention64(q, k, v, scale):
    """float64 causal attention over [B, H, S, D] tensors (the reference every kernel meets)."""
    s = q.double() @ k.double().transpose(-1, -2) * scale
    S = s.shape[-1]
    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.double()


def relative(out, want):
    return ((out.double() - want).abs().max() / want.abs().max()).item()

# %% [markdown]
# ## One packed projection
# A fused QKV projection's output, kept as it is: q, k and v are its slices at index 0, 1 and 2.
# A tensor read only at constants on an axis is planned as its slices — three `[B, S, H, D]`
# tensors — and called with `qkv.select(2, c)`: views, which the Hopper kernel reads through
# tensor maps of their own strides (nothing is copied).

# %%
@tf.kernel
def packed_qkv(qkv: T.Tensor["B", "S", "THREE", "H", "D", "bf16"], scale: T.f32):
    b, i, j, h, d, e = T.axes("b i j h d e")
    s = T.where(j <= i, T.sum(qkv[b, i, 0, h, d] * qkv[b, j, 1, h, d], over=d) * scale,
                float("-inf"))
    return softmax_attend(s, qkv[b, j, 2, h, e], j)


qkv = (torch.randn(2, 40, 3, 2, 32, generator=g) * 2).bfloat16()
q, k, v = (qkv[:, :, c].transpose(1, 2) for c in range(3))
err = relative(tf.compile(packed_qkv)(qkv, 32 ** -0.5), attention64(q, k, v, 32 ** -0.5)
               .transpose(1, 2))
print(f"relative error against float64: {err:.1e}")
assert err < 1e-2
plan = tf.compile(packed_qkv, HOPPER).describe_plan(B=2, S=4096, THREE=3, H=16, D=128)
print(plan)
assert "constant indices as views: qkv_0 = qkv[:, :, 0, :, :]" in plan
assert "hopper attention plan" in plan and "tensor map of its strides" in plan

# %% [markdown]
# ## Rotary embeddings inside the scores
# GPT-J's interleaved rotary (each pair of features `2m, 2m + 1` rotated together) applied to q
# and k as the scores are made. The Hopper kernel copies its operands with TMA and computes
# nothing on the way, so the rotated operands are stored first — in the type the tensor cores
# take them in, the same rounding the fused kernel makes — and the Hopper kernel runs the
# attention over them. Tables in bf16 (as models cast them) give bf16 operands; float32 tables
# make float32 products, which only the Triton template runs.

# %%
@tf.kernel
def interleaved_rope(q: T.Tensor["B", "H", "S", "D", "bf16"], k: T.Tensor["B", "H", "S", "D", "bf16"],
                     v: T.Tensor["B", "H", "S", "D", "bf16"], cos: T.Tensor["S", "D", "bf16"],
                     sin: T.Tensor["S", "D", "bf16"], scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    pair = d + 1 - 2 * (d % 2)                     # the other feature of d's pair
    sign = T.where(d % 2 == 0, -1.0, 1.0)
    qr = q[b, h, i, d] * cos[i, d] + sign * q[b, h, i, pair] * sin[i, d]
    kr = k[b, h, j, d] * cos[j, d] + sign * k[b, h, j, pair] * sin[j, d]
    s = T.where(j <= i, T.sum(qr * kr, over=d) * scale, float("-inf"))
    return softmax_attend(s, v[b, h, j, e], j)


def rotated_pairs(t, cos, sin):
    """GPT-J's rotary in torch: (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin) per pair."""
    pairs = torch.stack([-t[..., 1::2], t[..., 0::2]], -1).flatten(-2)
    return t * cos + pairs * sin


S, D = 40, 32
angles = torch.arange(S)[:, None] * 10000.0 ** (-torch.arange(D // 2) / (D // 2))
angles = angles.repeat_interleave(2, -1)
cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
q, k, v = ((torch.randn(2, 2, S, D, generator=g) * 2).bfloat16() for _ in range(3))
want = attention64(rotated_pairs(q.double(), cos.double(), sin.double()),
                   rotated_pairs(k.double(), cos.double(), sin.double()), v, D ** -0.5)
err = relative(tf.compile(interleaved_rope)(q, k, v, cos, sin, D ** -0.5), want)
print(f"relative error against float64: {err:.1e}")
assert err < 2e-2
plan = tf.compile(interleaved_rope, HOPPER).describe_plan(B=2, H=16, S=4096, D=128)
print(plan.splitlines()[0])
assert "the computed q·k operands stored, then the Hopper attention over them" in plan
assert "hopper attention plan: out[B, H, S, D] from operand, operand_1, v" in plan

# %% [markdown]
# ## Two softmaxes over one value tensor
# Differential attention subtracts a second softmax's output, weighted by λ. Each softmax is a
# chain of its own over the same keys; each runs on the Hopper kernel with its `o / l` kept in
# float32, then their difference is one elementwise pass. Under 65 query rows (a decode) the
# Triton template keeps both chains in one kernel instead.

# %%
@tf.kernel
def diff_attention(q1: T.Tensor["B", "H", "S", "D", "bf16"], k1: T.Tensor["B", "H", "S", "D", "bf16"],
                   q2: T.Tensor["B", "H", "S", "D", "bf16"], k2: T.Tensor["B", "H", "S", "D", "bf16"],
                   v: T.Tensor["B", "H", "S", "E", "bf16"], lam: T.f32, scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s1 = T.where(j <= i, T.sum(q1[b, h, i, d] * k1[b, h, j, d], over=d) * scale, float("-inf"))
    s2 = T.where(j <= i, T.sum(q2[b, h, i, d] * k2[b, h, j, d], over=d) * scale, float("-inf"))
    return T.cast(softmax_attend(s1, v[b, h, j, e], j) - lam * softmax_attend(s2, v[b, h, j, e], j),
                  "bf16")


q1, k1, q2, k2 = ((torch.randn(2, 2, S, 16, generator=g) * 2).bfloat16() for _ in range(4))
v = (torch.randn(2, 2, S, 32, generator=g) * 2).bfloat16()
want = attention64(q1, k1, v, 0.25) - 0.6 * attention64(q2, k2, v, 0.25)
err = relative(tf.compile(diff_attention)(q1, k1, q2, k2, v, 0.6, 0.25), want)
print(f"relative error against float64: {err:.1e}")
assert err < 2e-2
hopper = tf.compile(diff_attention, HOPPER)
print(hopper.schedule_origin(B=2, H=16, S=4096, D=64, E=128)[:160])
assert "the Hopper attention of each of 2 chains" in hopper.describe_plan(B=2, H=16, S=4096,
                                                                          D=64, E=128)
assert hopper.schedule_origin(B=2, H=16, S=64, D=64, E=128) == "template defaults"

# %% [markdown]
# ## Latent queries shared by the batch
# Perceiver's cross-attention reads a learned array of latent queries `q[l, d]`, the same for
# every sequence, over each sequence's tokens. The Hopper kernel plans q by its batch, head,
# query and head-dim axes; this q has neither a batch nor a head axis. So the call copies q once
# per sequence (`B × L × D` elements, small beside the keys and values) and views every tensor
# with a unit head axis: the kernel is then the library's attention, byte for byte. Its few
# tiles (32 sequences × 2 blocks of 128 latents) are cut along the keys over every SM.

# %%
@tf.kernel
def latent_cross(q: T.Tensor["L", "D", "bf16"], k: T.Tensor["B", "S", "D", "bf16"],
                 v: T.Tensor["B", "S", "D", "bf16"], scale: T.f32):
    b, l, j, d, e = T.axes("b l j d e")
    s = T.sum(q[l, d] * k[b, j, d], over=d) * scale
    return softmax_attend(s, v[b, j, e], j)


q = (torch.randn(24, 32, generator=g) * 2).bfloat16()
k, v = ((torch.randn(3, S, 32, generator=g) * 2).bfloat16() for _ in range(2))
want = torch.softmax(q.double() @ k.double().transpose(-1, -2) * 0.2, -1) @ v.double()
err = relative(tf.compile(latent_cross)(q, k, v, 0.2), want)
print(f"relative error against float64: {err:.1e}")
assert err < 2e-2
plan = tf.compile(latent_cross, HOPPER).describe_plan(L=256, B=32, S=4096, D=128, scale=0.088)
print(plan)
assert "queries shared by the batch: q copied once per sequence" in plan
assert "hopper attention plan: out[B, ONE_H, L, D] from q, k, v" in plan
assert "split schedule on 132 persistent CTAs" in plan
