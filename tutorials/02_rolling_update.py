# %% [markdown]
# # 2. The rolling update: one pass over a chain of dependent reductions
#
# Softmax attention needs three reductions over the keys `j`: the maximum `m`, the normaliser
# `l = Σ exp(s − m)` and the weighted sum `o = Σ exp(s − m)·v`. Written naively, `l` and `o` need
# the *final* `m`, so the scores are swept (and stored) more than once. The rolling update keeps
# running values instead, and repairs the running sums with a correction each time the maximum
# moves. tensorfuse derives that correction from the expression — here is how.

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
    o = T.sum(p * v[b, h, j, e], over=j)
    return o / l

# %% [markdown]
# ## Before: one block per value
# The naive TensorIR materialises the score matrix `s` and sweeps it once per reduction.

# %%
sch = tf.schedule(attention, target="llvm", B=1, H=2, M=64, N=256, D=32)
before = sch.script()
print("\n".join(l for l in before.splitlines() if "T.sblock(" in l or "alloc_buffer" in l))

# %% [markdown]
# ## The derived corrections
# `rolling_update` names the reductions to fuse and the axis. The algebra inlines `p`, sees that
# `l` and `o` depend on `m` through `exp(s − m)`, and finds that when `m` moves from `m.old` to
# `m.new` every term is rescaled by `exp(m.old − m.new)` — a factor that does not depend on `j`, so
# it can be applied to the running sums. The correction is checked numerically before it is used.

# %%
sch.rolling_update("m", "l", "o", axis="j", chunk=32)
print(sch.corrections())

# %% [markdown]
# ## After: one pass, running state in buffers, corrections as blocks
# Per chunk of 32 keys: the chunk's scores (`s_sum_local`), its partial maximum and sums
# (`*_chunk`), the corrected running values (`*_update`) and the value the next chunk starts from
# (`m_commit`). The full score matrix is gone. These are ordinary TensorIR blocks: any TVM
# schedule primitive applies to them.

# %%
after = sch.script()
print("\n".join(l for l in after.splitlines() if "T.sblock(" in l or "alloc_buffer" in l))
print(next(l.strip() for l in after.splitlines() if l.strip().startswith("l_run[") and "l_chunk" in l))

# %% [markdown]
# ## It computes the same thing
# Checked against a float64 NumPy reference on fresh random inputs, with the output poisoned first.

# %%
f = sch.compile()
rng = np.random.default_rng()
q = rng.standard_normal((1, 2, 64, 32)).astype("float32")
k_ = rng.standard_normal((1, 2, 256, 32)).astype("float32")
v = rng.standard_normal((1, 2, 256, 32)).astype("float32")
out = np.full((1, 2, 64, 32), np.nan, dtype="float32")
f(q, k_, v, scale=32 ** -0.5, out=out)
s = np.einsum("bhid,bhjd->bhij", q.astype(float), k_.astype(float)) * 32 ** -0.5
p = np.exp(s - s.max(-1, keepdims=True))
ref = np.einsum("bhij,bhje->bhie", p / p.sum(-1, keepdims=True), v.astype(float))
err = np.abs(out - ref).max() / np.abs(ref).max()
print(f"max relative error: {err:.2e}")
assert err < 1e-5

# %% [markdown]
# ## The split update (flash-decoding)
# For one query and a long key sequence, a single pass leaves the GPU idle. `split_update` cuts
# `j` into parts that run in parallel and merges their states with the same corrections, each
# part's sums rescaled from its own maximum to the global one.

# %%
dec = tf.schedule(attention, target="llvm", B=1, H=2, M=1, N=4096, D=32)
dec.split_update("m", "l", "o", axis="j", splits=8, chunk=64)
print([l.strip() for l in dec.script().splitlines() if 'T.sblock("o_merge")' in l])
q1 = rng.standard_normal((1, 2, 1, 32)).astype("float32")
k1 = rng.standard_normal((1, 2, 4096, 32)).astype("float32")
v1 = rng.standard_normal((1, 2, 4096, 32)).astype("float32")
got = dec.compile()(q1, k1, v1, scale=32 ** -0.5)
s1 = np.einsum("bhid,bhjd->bhij", q1.astype(float), k1.astype(float)) * 32 ** -0.5
p1 = np.exp(s1 - s1.max(-1, keepdims=True))
ref1 = np.einsum("bhij,bhje->bhie", p1 / p1.sum(-1, keepdims=True), v1.astype(float))
assert np.abs(got - ref1).max() / np.abs(ref1).max() < 1e-5

# %% [markdown]
# ## The same method, other chains
# Nothing above is specific to softmax. A single-pass variance (the correction shifts the centre:
# three running sums, Σ(x−μ)², Σ(x−μ) and a count) and an argmax written as a dependent reduction
# (the running minimum index resets when the maximum moves):

# %%
@tf.kernel
def variance(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    mean = T.sum(x[i, j], over=j) / T.size("N")
    return T.sum((x[i, j] - mean) ** 2, over=j) / T.size("N")


vs = tf.schedule(variance, "llvm")
reductions = [c.name for c in variance.program.computes if c.is_reduction]
vs.rolling_update(*reductions, axis="j")
print(vs.corrections())
xs = rng.standard_normal((4, 1000)).astype("float32") + 1e4  # far from zero: the hard case
want = xs.astype(float).var(1)
err = np.abs(vs.compile()(xs) - want).max() / want.max()
print(f"float32, offset 1e4: relative error {err:.1e}")
assert err < 1e-5

# %% [markdown]
# The running states are kept relative to a running estimate of the mean (Welford's centring),
# so data far from zero cost no precision. When a fusion cannot be kept that well conditioned,
# tensorfuse measures it in float32 while planning and warns once, naming the member
# (`FusedPrecisionWarning`; `rolling_update(..., strict=True)` refuses it).

# %% [markdown]
# ## When no correction exists, tensorfuse says so
# `tanh(x − m)` does not rescale or shift when `m` changes, so the elements already summed cannot be
# repaired. The fusion is refused, naming the expression and the line; the schedule is unchanged.

# %%
@tf.kernel
def not_fusable(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    t = T.sum(T.tanh(x[i, j] - m), over=j)
    return t


bad = tf.schedule(not_fusable, "llvm")
try:
    bad.rolling_update("m", "t", axis="j")
except tf.errors.RollingUpdateError as err:
    print(err)
print("steps so far:", bad.history())

# %% [markdown]
# ## Up to each position: the corrections as a scan
# The same chain over the positions up to each output's own — a log-normaliser written out,
# the running maximum and the sum of exponentials relative to it — would visit every prefix
# (N²/2 terms a row). Correcting two parts' running states to their combined maximum and adding
# them is the split update's merge, and it is associative: on a GPU `tf.compile` scans the
# chain's states together, N terms a row. Here on the CPU against `torch.logcumsumexp`.

# %%
@tf.kernel
def causal_log_normaliser(x: T.Tensor["B", "N", "f32"]):
    b, j = T.axes("b j")
    i = T.axis("i", "N")
    m = T.max(T.where(j <= i, x[b, j], -T.inf), over=j)
    s = T.sum(T.where(j <= i, T.exp(x[b, j] - m), 0.0), over=j)
    return m + T.log(s)


import torch

logits = torch.randn(3, 200) * 30 + 300   # exp of them overflows unless taken relative
running = tf.compile(causal_log_normaliser, target="llvm")(logits)
assert torch.allclose(running, torch.logcumsumexp(logits.double(), -1).float(), atol=1e-3)
plan = tf.compile(causal_log_normaliser, target="cuda:sm_90a").describe_plan(B=3, N=200)
print(plan)
assert "m, s[i] = chain_m_s (running states scanned together" in plan

# %% [markdown]
# ## On a GPU: an image is visited in patches
# A fused chain compiles to a GPU template that sweeps the keys in blocks, skipping blocks the mask
# hides. When the mask reads the sequence as an image (`i // W`, `i % W`), the attention template
# visits it in patches instead of strips: query blocks are patches of the image, key blocks are
# windows over the keys each patch can see (each dilated sub-image on its own). `tile_as` fixes
# the patches (or `enabled=False` keeps the flat order); `plan` shows the order it gives and how
# many blocks remain. Planning needs no GPU.

# %%
nb = tf.schedule(tf.kernels.neighborhood_attention_2d, "cuda:sm_90a")
nb.rolling_update("m", "l", "o", axis="j").apply_template("attention")
nb.tile_as(patch=(8, 8), dilation=(2, 2))
text = nb.plan(B=1, H=16, M=4096, N=4096, D=128, width=64, radius=3, dilation=2)
print("\n".join(line for line in text.splitlines() if "visiting order" in line or "knobs" in line))
assert "patches of 8×8, dilation 2×2" in text

# %% [markdown]
# On Hopper (`sm_90a`), `tf.compile` runs such a map on the warp-specialised `hopper_attention`
# template instead: a query patch and a key window are each one TMA box of the map, and a partial
# block's mask comes as one bit per score, computed once per map. The same `tile_as` and `plan`
# work there; the plan says how many blocks are visited and how many of them skip the mask.

# %%
hop = tf.schedule(tf.kernels.neighborhood_attention_2d, "cuda:sm_90a")
hop.rolling_update("m", "l", "o", axis="j").apply_template("hopper_attention")
text = hop.plan(B=1, H=16, M=4096, N=4096, D=128, width=64, radius=3, dilation=2)
print("\n".join(line for line in text.splitlines() if "knobs" in line))
assert "TMA boxes of the map" in text
