# %% [markdown]
# # 1. Writing a kernel in the tensorfuse DSL
#
# A kernel is a plain Python function over typed tensors. Index variables (*axes*) name the
# loops; expressions broadcast by axis name; reductions say which axes they fold with `over=`.
# Here is softmax attention, written naively, exactly as the math reads.

# %%
import numpy as np
import tensorfuse as tf
from tensorfuse import dsl as T


@tf.kernel
def attention(q: T.Tensor["B", "H", "M", "D", "f32"], k: T.Tensor["B", "H", "N", "D", "f32"],
              v: T.Tensor["B", "H", "N", "D", "f32"], scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    m = T.max(s, over=j)
    p = T.exp(s - m)
    l = T.sum(p, over=j)
    return T.sum(p * v[b, h, j, e], over=j) / l

# %% [markdown]
# Decorating the function traces it once into a **program**: one *compute* per named value
# (named after your variables), each elementwise or a reduction, with its axes and element type.
# Inputs in f32 are computed in f32; bf16/f16 inputs would be computed in f32 and the output
# stored in bf16/f16.

# %%
print(attention.program)

# %% [markdown]
# Mistakes are reported at the line that made them. Reducing over an axis the value does not
# have, for instance:

# %%
try:
    @tf.kernel
    def broken(x: T.Tensor["M", "N", "f32"]):
        i, j, k = T.axes("i j k")
        return T.sum(x[i, j], over=k)
except tf.errors.AxisError as err:
    print(err)

# %% [markdown]
# ## The TensorIR
# `tf.schedule` lowers the program to TVM TensorIR: one `sblock` per compute, named after it.
# Sizes you give are fixed in the IR; the others stay symbolic.

# %%
sch = tf.schedule(attention, target="llvm", B=1, H=2, M=64, N=64, D=32)
sch.show()

# %% [markdown]
# Every TVM schedule primitive works on it, and each one is a step you can see and undo.

# %%
loops = sch.get_loops(sch.get_sblock("l"))
sch.parallel(loops[0])
print(sch.history())
sch.undo()
print(sch.history())

# %% [markdown]
# ## Compile and call
# `tf.compile` builds a callable kernel: NumPy arrays in, NumPy arrays out. A build is made per
# shape signature and cached. We check it against a float64 NumPy reference on fresh random data.

# %%
f = tf.compile(attention, target="llvm")
rng = np.random.default_rng()
q, k, v = (rng.standard_normal((2, 4, 100, 32)).astype("float32") for _ in range(3))
out = f(q, k, v, scale=32 ** -0.5)

s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) * 32 ** -0.5
p = np.exp(s - s.max(-1, keepdims=True))
ref = np.einsum("bhij,bhje->bhie", p / p.sum(-1, keepdims=True), v.astype(np.float64))
print("max relative error:", np.abs(out - ref).max() / np.abs(ref).max())
assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-5

# %% [markdown]
# ## From PyTorch
# PyTorch tensors go in and come out through DLPack, without copies; `out=` writes into a tensor
# you own.

# %%
import torch

qt, kt, vt = (torch.from_numpy(x) for x in (q, k, v))
result = torch.empty_like(qt)
f(qt, kt, vt, scale=32 ** -0.5, out=result)
expected = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)
print("difference to torch SDPA:", (result - expected).abs().max().item())
assert torch.allclose(result, expected, atol=1e-5)

# %% [markdown]
# ## Sizes the kernel derives
# An axis can have a size computed from the tensors' sizes: a max pool of window 3 and stride 2
# has `(L - 3) // 2 + 1` outputs, named `O` after its axis and computed at every call. The window
# is an axis of fixed size, and the input is read at `o * 2 + k`.

# %%
import torch.nn.functional as F


@tf.kernel
def max_pool(x: T.Tensor["B", "C", "L", "f32"]):
    b, c = T.axes("b c")
    o = T.axis("o", (T.size("L") - 3) // 2 + 1)
    w = T.axis("w", 3)
    return T.max(x[b, c, o * 2 + w], over=w)


signal = torch.randn(2, 3, 101)
pooled = tf.compile(max_pool, target="llvm")(signal)
print(pooled.shape, max_pool.program.dim_names())
assert pooled.shape == (2, 3, 50) and torch.equal(pooled, F.max_pool1d(signal, 3, 2))

# %% [markdown]
# ## Scans
# A reduction over the positions up to each output's own is a scan. A cumulative sum is written
# as the math — every position `i` sums the terms at `j <= i` — with `i` an axis of the row's
# size. On a GPU `tf.compile` runs it as a scan (N terms a row, not N²), which
# `describe_plan` shows; here it runs on the CPU against `torch.cumsum`.

# %%
@tf.kernel
def cumulative_sum(x: T.Tensor["B", "N", "f32"]):
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j <= i, x[b, j], 0.0), over=j)


steps = torch.randn(4, 300)
summed = tf.compile(cumulative_sum, target="llvm")(steps)
assert torch.allclose(summed, torch.cumsum(steps, -1), atol=1e-4)
plan = tf.compile(cumulative_sum, target="cuda:sm_90a").describe_plan(B=4, N=300)
print(plan)
assert plan.startswith("scan plan of cumulative_sum")

# %% [markdown]
# A sum whose terms read the position only through a power of the distance is a discounted
# scan: each step's return in reinforcement learning, `G_t = r_t + γ·G_{t+1}`, is the sum of the
# later rewards discounted by `γ ** (j - i)`. The plan keeps the discount as a factor a step;
# checked here against the recurrence.

# %%
@tf.kernel
def discounted_returns(r: T.Tensor["B", "N", "f32"], gamma: T.f32):
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j >= i, gamma ** (j - i) * r[b, j], 0.0), over=j)


rewards = torch.randn(2, 200)
returns = tf.compile(discounted_returns, target="llvm")(rewards, 0.9)
expected, later = torch.empty_like(rewards), torch.zeros(2)
for t in range(199, -1, -1):
    later = rewards[:, t] + 0.9 * later
    expected[:, t] = later
assert torch.allclose(returns, expected, atol=1e-4)
plan = tf.compile(discounted_returns, target="cuda:sm_90a").describe_plan(B=2, N=200, gamma=0.9)
print(plan)
assert "discounted by gamma a step over j >= i (suffix scan" in plan

# %% [markdown]
# The discount may vary along the sequence: a gated linear recurrence `h_t = a_t·h_{t−1} + u_t`
# (minGRU's, an SSM's with a scalar state) is the sum of the inputs so far, each decayed by the
# gates since it came — `exp(c_t − c_j)` with `c` the running sum of `log a`. The scan then
# decays its state by `exp(c_j − c_{j−1})` a step; checked here against the recurrence.

# %%
@tf.kernel
def gated_recurrence(c: T.Tensor["B", "N", "f32"], u: T.Tensor["B", "N", "f32"]):
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.sum(T.where(j <= i, T.exp(c[b, i] - c[b, j]) * u[b, j], 0.0), over=j)


gates, inputs = 0.5 + 0.5 * torch.rand(2, 200), torch.randn(2, 200)
states = tf.compile(gated_recurrence, target="llvm")(torch.log(gates).cumsum(-1), inputs)
h, expected = torch.zeros(2), torch.empty_like(inputs)
for t in range(200):
    h = gates[:, t] * h + inputs[:, t]
    expected[:, t] = h
assert torch.allclose(states, expected, atol=1e-4)
plan = tf.compile(gated_recurrence, target="cuda:sm_90a").describe_plan(B=2, N=200)
print(plan)
assert "discounted by exp(c[b, j] - c[b, max(j - 1, 0)]) a step over j <= i" in plan

# %% [markdown]
# A band of positions around each output's own — a rolling maximum of the last 16 values — is
# two scans a window on a GPU (the rest of its start's segment of 16, then the next segment up to
# its end), a few operations an output whatever the width.

# %%
@tf.kernel
def rolling_max(x: T.Tensor["B", "N", "f32"]):
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    return T.max(T.where((j <= i) & (j > i - 16), x[b, j], -T.inf), over=j)


rolled = tf.compile(rolling_max, target="llvm")(steps)
padded = F.pad(steps[:, None], (15, 0), value=-torch.inf)
assert torch.equal(rolled, F.max_pool1d(padded, 16, 1)[:, 0])
plan = tf.compile(rolling_max, target="cuda:sm_90a").describe_plan(B=4, N=300)
print(plan)
assert plan.startswith("band plan of rolling_max")

# %% [markdown]
# Ranges over several axes nest: a summed-area table (each pixel the sum of the rectangle from
# the origin to it) is one reduction over two axes as written; on a GPU it runs as a scan along
# the rows, then one down them — two stages, a few operations a pixel. A 5 × 5 box filter nests
# the same way, a band an axis.

# %%
@tf.kernel
def integral_image(x: T.Tensor["B", "H", "W", "f32"]):
    b, j, l = T.axes("b j l")
    i, k = T.axis("i", "H"), T.axis("k", "W")
    return T.sum(T.where((j <= i) & (l <= k), x[b, j, l], 0.0), over=(j, l))


pixels = torch.randn(2, 12, 20)
table = tf.compile(integral_image, target="llvm")(pixels)
assert torch.allclose(table, pixels.cumsum(1).cumsum(2), atol=1e-4)
plan = tf.compile(integral_image, target="cuda:sm_90a").describe_plan(B=2, H=12, W=20)
print(plan)
assert plan.startswith("out over j, l written as one reduction an axis")
assert plan.count("scan plan of") == 2

# %% [markdown]
# ## Counting
# A histogram is a sum of a condition: each bin `k` counts the values equal to it. Read as
# written, every bin would visit every value; on a GPU `tf.compile` runs it the other way round,
# as a scatter-add — each program counts a block of values into bins of its own, then adds each
# bin once — in the sum's own integer type, so the counts are exact. A condition that ties the
# summed position to the output's (`j <= i`: how many tokens so far went to each expert, a
# mixture of experts' capacity positions) is a range instead: a scan.

# %%
@tf.kernel
def histogram(x: T.Tensor["N", "i32"]):
    j = T.axes("j")
    k = T.axis("k", 16)
    return T.sum(T.where(x[j] == k, 1, 0), over=j)


@tf.kernel
def expert_positions(e: T.Tensor["N", "i32"]):
    j = T.axes("j")
    i, k = T.axis("i", "N"), T.axis("k", 8)
    return T.sum(T.where((j <= i) & (e[j] == k), 1, 0), over=j)


values = torch.randint(-2, 18, (5000,), dtype=torch.int32)   # some outside 0..15: counted nowhere
counts = tf.compile(histogram, target="llvm")(values)
kept = values[(values >= 0) & (values < 16)]
assert torch.equal(counts.long(), torch.bincount(kept, minlength=16))
plan = tf.compile(histogram, target="cuda:sm_90a").schedule_origin(N=5000)
print(plan)
assert "16 bins of its own" in plan
experts = torch.randint(0, 8, (300,), dtype=torch.int32)
positions = tf.compile(expert_positions, target="llvm")(experts)
assert torch.equal(positions.long(), F.one_hot(experts.long(), 8).cumsum(0))
assert tf.compile(expert_positions, target="cuda:sm_90a").describe_plan(N=300).startswith(
    "scan plan of expert_positions")

# %% [markdown]
# ## Experts
# A mixture of experts' layer with one expert a token reads each token's weights through its
# expert, `w[expert[t], n, k]`. On a GPU that is a GEMM whose tiles take their rows one expert at
# a time — a block of an expert's weights serves every row of the tile routed to it (tokens
# sorted by expert take a turn or two a tile) — with its bf16 products on the tensor cores even
# though the sum is written in f32 (exact: the products of bf16 values are f32 numbers).

# %%
@tf.kernel
def expert_linear(x: T.Tensor["T", "K", "bf16"], w: T.Tensor["E", "N", "K", "bf16"],
                  expert: T.Tensor["T", "i32"]):
    t, n, k = T.axes("t n k")
    return T.sum(T.cast(x[t, k], "f32") * T.cast(w[expert[t], n, k], "f32"), over=k)


tokens, weights = torch.randn(64, 32).bfloat16(), torch.randn(4, 48, 32).bfloat16()
routed = torch.randint(0, 4, (64,), dtype=torch.int32)
mixed = tf.compile(expert_linear, target="llvm")(tokens, weights, routed)
want = torch.stack([weights[e].double() @ x for e, x in zip(routed.long(), tokens.double())])
assert (mixed.double() - want).abs().max() <= 1e-2 * want.abs().max()   # stored as bf16
plan = tf.compile(expert_linear, target="cuda:sm_90a").describe_plan(T=4096, K=2048, N=4096, E=8)
print(plan)
assert "rows grouped by expert[t]" in plan and "[tensor cores in bf16" in plan

# %% [markdown]
# ## The same kernel for the GPU
# Code generation needs no GPU. For a GPU target, `tf.compile` fuses the kernel's chain of
# reductions (see tutorial 2) and generates one Triton kernel — tensor cores for q·kᵀ and p·v, the
# softmax state in registers. `template=None` asks for TVM's own CUDA from the unfused TensorIR
# instead. On a machine with a GPU, `target="auto"` picks it.

# %%
g = tf.compile(attention, target="cuda:sm_90a")
print(g)
print(g.source(B=1, H=2, M=64, N=64, D=32).split("@triton.jit")[-1][:1500])

# %%
plain = tf.compile(attention, target="cuda:sm_90a", template=None)
print(plain.cuda_source(B=1, H=2, M=64, N=64, D=32)[-1200:])

# %% [markdown]
# ## Which kernel runs, and why
# `describe_plan(**sizes)` names the kernel that runs those sizes, why each one ahead of it in the
# order of choice passes, and its plan. A head dim past one tile's block (576, as DeepSeek's
# latent attention has) is still one fused pass, its features taken in chunks. Past what the
# chunks hold (1024) it is not one fused pass any more: it runs as *stages*, each on a template —
# the scores as a GEMM, the softmax's statistics as a row reduction, the weighted sum as another
# GEMM — with what they pass on stored between them, which the plan says in bytes.

# %%
print(g.describe_plan(B=1, H=2, M=64, N=64, D=32).splitlines()[0])
chunked = g.describe_plan(B=1, H=16, M=4096, N=4096, D=576, scale=0.04)
assert "feature in chunks of 64: 576" in chunked, chunked
wide = g.describe_plan(B=1, H=16, M=4096, N=4096, D=1024, scale=0.04)
print("\n".join(wide.splitlines()[:6]))
assert "3 stage kernels" in wide.splitlines()[0]
assert "stored between the stages: 1.0 GiB (s_sum f32 [1, 16, 4096, 4096]" in wide
