# %% [markdown]
# # 4. Thread-block clusters: a fused FFN whose intermediate never leaves the chip
#
# `act(X·W1)·W2` with N = 14336 intermediate columns does not fit one SM: on a Hopper GPU,
# `cluster_distribute` spreads the fused tile over a *cluster* of CTAs. Each CTA computes its slice
# of the intermediate `H` on tensor cores and keeps it in its shared memory; then each computes its
# share of the output columns from the cluster's whole `H`, reading the peers' slices through
# distributed shared memory (DSM) straight into the registers that feed the tensor cores
# (`exchange="peer"`, the default; `exchange="gather"` copies every slice into every CTA first).
# Clusters add their partial outputs in f32. This notebook runs anywhere: it shows the plan and the
# generated code, and runs the kernel (checked against float64) only when a Hopper GPU is present.

# %%
import shutil
import textwrap

import numpy as np
import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import ScheduleError


@tf.kernel
def ffn_relu2(x: T.Tensor["M", "K", "bf16"], w1: T.Tensor["K", "N", "bf16"],
              w2: T.Tensor["N", "O", "bf16"]):
    """A squared-ReLU FFN: any elementwise activation between the two products is generated."""
    i, k, n, o = T.axes("i k n o")
    h = T.sum(x[i, k] * w1[k, n], over=k)
    r = T.where(h > 0.0, h, 0.0)
    return T.sum(r * r * w2[n, o], over=n)

# %% [markdown]
# ## The schedule
# `n` is the intermediate's axis — the one the second sum runs over. The knobs have defaults chosen
# for the sizes of each call (wgmma on sm_90a, peer reads in clusters of 8 with 256-column output
# tiles, the deepest copy pipeline that fits beside the CTA's slice of `H`); `launches(...).knobs`
# shows them.

# %%
sizes = dict(M=128, K=4096, N=14336, O=4096)
sch = tf.schedule(ffn_relu2, target="cuda:sm_90a")
sch.cluster_distribute("n")
f = sch.compile()
knobs = f.launches(**sizes).knobs
print(knobs)
assert (knobs.mma, knobs.exchange) == ("wgmma", "peer")
src = f.source(**sizes)
activation = next(l for l in src.splitlines() if "h[e] =" in l).strip()   # from the DSL
peer_read = next(l for l in src.splitlines() if "tf_ld_dsm_u32x4(tf_mapa" in l).strip()
print(activation)
print(peer_read)
assert "0.0f" in activation and "?" in activation   # the ReLU's where(h > 0, h, 0), then squared

# %% [markdown]
# ## Knobs that do not fit are refused with the numbers
# With `exchange="gather"` every CTA holds the cluster's whole `H`: `block_m × cluster × block_n × 2`
# bytes of its shared memory, too many for 16 CTAs of 128 rows.

# %%
try:
    sch16 = tf.schedule(ffn_relu2, target="cuda:sm_90a")
    sch16.cluster_distribute("n", cluster=16, block_m=128, exchange="gather")
    sch16.compile().source(**sizes)
    raise AssertionError("16 CTAs each holding the whole H should not fit")
except ScheduleError as err:
    print(textwrap.fill("refused: " + str(err).splitlines()[0].split(": ", 1)[1], 100))
    assert "shared memory" in str(err)

# %% [markdown]
# ## The PTX (needs nvcc, not a GPU)
# The cluster and DSM instructions, the warpgroup MMA and the clusters' f32 vector atomics are in
# the code nvcc produced for sm_90a.

# %%
if shutil.which("nvcc"):
    ptx = f.ptx(**sizes)
    for instruction in ("ld.shared::cluster", "mapa.shared::cluster", "barrier.cluster.arrive",
                        "wgmma.mma_async", "atom.global.add.v4.f32"):
        print(f"{instruction:24s} {ptx.count(instruction):4d}")
        assert ptx.count(instruction) > 0, instruction
else:
    print("nvcc is not installed here: skipping the PTX")

# %% [markdown]
# ## Run it (Hopper GPU only) and check it against float64

# %%
try:
    import torch
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
except ImportError:
    hopper = False
if hopper:
    g = torch.Generator(device="cuda").manual_seed(0)
    M, K, N, O = 256, 1024, 4096, 1024
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    w1 = (torch.randn(K, N, device="cuda", generator=g) / K ** 0.5).bfloat16()
    w2 = (torch.randn(N, O, device="cuda", generator=g) / N ** 0.5).bfloat16()
    y = tf.schedule(ffn_relu2, target="cuda").cluster_distribute("n").compile()(x, w1, w2)
    h = torch.relu(x.double() @ w1.double())
    ref = (h * h) @ w2.double()
    error = ((y.double() - ref).norm() / ref.norm()).item()
    print("relative error", error)
    assert error < 1e-2   # bf16 inputs and output, f32 accumulation
else:
    print("no Hopper GPU here: the kernel is not run")

# %% [markdown]
# ## Decode: the keys of one query split over a cluster
# After a rolling update (the online softmax over the keys `j`), `cluster_distribute("j")` gives
# each (batch, kv-head) pair one cluster; its CTAs sweep consecutive parts of the keys and merge
# their partial softmax states through DSM with the rolling update's own correction terms.
# The default cluster size is the largest power of two whose clusters all run at once: on a GPU
# the driver is asked how many it holds (a cluster must fit one GPC — the H100 holds 7 clusters
# of 16, 15 of 8, 30 of 4, not 132 / cluster); without a GPU the SM count decides. Each warp
# stages its blocks of 32 keys and values with bulk tensor copies (`copy="tma"`, the default;
# `copy="cp.async"` for 16-byte copies by every lane), and the key count is a kernel argument:
# one kernel serves a KV cache that grows by a key a step. `tf.compile` runs decode (one query
# token) on this kernel on sm_90a where it was measured ahead of the split-update template — few
# (batch, kv-head) pairs over a cache under 256 MB, and 256–512 pairs — and on the split update
# elsewhere (on the H200 the split update matched cuDNN from 32 to 128 pairs, where this kernel
# was 0.91–0.96×).

# %%
dec = tf.schedule(tf.kernels.gqa_attention, target="cuda:sm_90a")
dec.rolling_update("m", "l", "o", axis="j")
corrections = dec.corrections()
print(corrections)
assert "exp(" in str(corrections)   # the online softmax's correction, derived
dec.cluster_distribute("j")
fd = dec.compile()
clusters = {}
for B in (1, 2, 4, 8):   # on an H100: clusters of 8, 4, 2, 2; without a GPU: 16, 8, 4, 2
    clusters[B] = fd.launches(B=B, H=32, HKV=8, M=1, N=32768, D=128).knobs.cluster
    print(f"batch {B}:", fd.launches(B=B, H=32, HKV=8, M=1, N=32768, D=128).knobs)
assert clusters[1] >= clusters[2] >= clusters[4] >= clusters[8] >= 2   # fewer pairs: larger
compiled = tf.compile(tf.kernels.gqa_attention, "cuda:sm_90a")
description = compiled.for_sizes(B=1, H=32, HKV=8, M=1, N=32768, D=128).description
print(description)
assert description.startswith("cluster_decode")   # 8 pairs, a 128 MB cache
elsewhere = compiled.for_sizes(B=4, H=32, HKV=8, M=1, N=32768, D=128).description
print(elsewhere)
assert not elsewhere.startswith("cluster_decode")   # 32 pairs: the split update

# %%
if hopper:
    B, H, HKV, N, D = 2, 32, 8, 5000, 128
    q = torch.randn(B, H, 1, D, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(B, HKV, N, D, device="cuda", generator=g).bfloat16() for _ in range(2))
    out = fd(q, k, v, scale=D ** -0.5)
    kk, vv = (t.double().repeat_interleave(H // HKV, 1) for t in (k, v))
    ref = torch.softmax(q.double() @ kk.transpose(-1, -2) * D ** -0.5, -1) @ vv
    error = ((out.double() - ref).norm() / ref.norm()).item()
    print("relative error", error)
    assert error < 1e-2
else:
    print("no Hopper GPU here: the kernel is not run")

# %% [markdown]
# ## A static cache: the length lives in device memory
# A mask made of bounds on the keys — `j <= length[b] - M + i` here, a static cache filled to
# `length[b]` slots — is read once per (batch, kv-head), and the cluster sweeps only those keys.
# The length is a tensor, so nothing about it is on the host: one decode step captured in a CUDA
# graph replays correctly while the cache fills. `describe_plan` shows the bounds.

# %%
st = tf.schedule(tf.kernels.static_cache_attention, target="cuda:sm_90a")
st.rolling_update("m", "l", "o", axis="j")
st.cluster_distribute("j")
fs = st.compile()
static_sizes = dict(B=2, H=32, HKV=8, M=1, N=8192, D=128)
plan = fs.describe_plan(**static_sizes)
print(plan)
assert "length[b]" in plan and "read once per (batch, kv-head)" in plan
source = fs.source(**static_sizes)
assert "t_length[(b)]" in source   # the kernel reads the length itself

# %%
if hopper:
    slots, start, steps = 8192, 3000, 16
    q = torch.randn(2, 32, 1, 128, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(2, 8, slots, 128, device="cuda", generator=g).bfloat16() for _ in range(2))
    length = torch.tensor([start, start + 500], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)

    def step():
        length.add_(1)
        fs(q, k, v, length, scale=128 ** -0.5, out=out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()                      # the first call builds; then capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(steps):
        graph.replay()              # no host work: the kernel reads the new length
    n = length.tolist()
    for b in range(2):
        kk = k[b, :, :n[b]].double().repeat_interleave(4, 0)
        vv = v[b, :, :n[b]].double().repeat_interleave(4, 0)
        want = torch.softmax(q[b].double() @ kk.transpose(-1, -2) * 128 ** -0.5, -1) @ vv
        err = ((out[b].double() - want).norm() / want.norm()).item()
        print(f"sequence {b}: {n[b]} keys after {steps} replays, error {err:.1e}")
        assert err < 1e-2
else:
    print("no Hopper GPU here: the static cache is not run")
