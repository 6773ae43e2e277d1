"""Kernels no issue lists, written as a new user would write them — a CNN's batch-norm statistics
and 2×2 max pool in NCHW, maxout over 4 features, a masked mean over tokens (from a mask, and
from the sequences' lengths: the padding never read), Mamba's causal
depthwise convolution, a mixture of experts' gated combine, cosine similarities, squared and L1
distances between point sets, a Gaussian kernel's sum over one and nearest neighbours (and
their mean distance: a Chamfer distance's half), a histogram of byte values, a mixture of
experts' capacity positions (a running count per expert), k-means' assignment of points to
their nearest centroid, retrieval's top-1 key, a contrastive loss's
normaliser over 768-dimensional embeddings, columns
L2-normalised, a router's softmax over 8 experts, a log-softmax down the vocabulary axis of
vocabulary-major logits, rotary
embeddings, attention with a relative-position bias on ``[B, S, H, D]`` tensors, with its keys kept
transposed and with
transformers' additive float mask, an LM head's
softmax, a Gram matrix and a router's weight gradient (outputs of few tiles over a long
contracted axis), a bilinear form per row, a mean over the batch axis, a matrix-vector product
over the matrix's strided axis (``a.T @ x``), an attention-weighted pool over tokens, RMSNorm
written into the linear layer after it, DeepSeek's latent attention at decode (q·k over 576, p·v
over 512: the floor's stages by default, a row tile's features in chunks where tuned), over a
contiguous and a paged cache, and a model head's
log-sum-exp over 4096 features (past a row tile's widths: the floor's stages) — through
``tf.compile``
defaults against the best torch alternative in the same process, each checked against a float64
reference first (the harness of :mod:`benchmarks.user_kernels`).

    python -m benchmarks.unlisted_kernels [--only NAME,…] [--tune TRIALS]

Rows: ``benchmark`` = ``user/<name>``; CSV
``benchmarks/results/<date>-<device>-unlisted-kernels.csv``.
"""
import torch
import torch.nn.functional as F

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels import softmax_attend
from benchmarks.common import FLEX, SDPA, TENSORFUSE, TORCH_COMPILE, TORCH_EAGER
from benchmarks.contraction import bilinear_form, transposed_product
from benchmarks.kernel_suite import Case, Recorded, main, rows_case


@tf.kernel
def batch_norm_stats_nchw(x: T.Tensor["B", "C", "H", "W", "bf16"]):
    """Every channel's mean and variance over the batch and the pixels of NCHW activations: two
    reduced axes on either side of the kept one."""
    b, c, h, w = T.axes("b c h w")
    n = T.size("B") * T.size("H") * T.size("W")
    mean = T.sum(x[b, c, h, w], over=(b, h, w)) / n
    var = T.sum((x[b, c, h, w] - mean) * (x[b, c, h, w] - mean), over=(b, h, w)) / n
    return mean, var


@tf.kernel
def max_pool_2x2(x: T.Tensor["B", "C", "H", "P", "W", "Q", "bf16"]):
    """A 2×2 max pool of [B, C, 2H, 2W] viewed as [B, C, H, 2, W, 2]."""
    b, c, i, j, p, q = T.axes("b c i j p q")
    return T.max(x[b, c, i, p, j, q], over=(p, q))


@tf.kernel
def maxout(x: T.Tensor["M", "N", "K", "bf16"]):
    """Maxout: the largest of each K consecutive features of [M, N·K], viewed as [M, N, K]."""
    i, j, k = T.axes("i j k")
    return T.max(x[i, j, k], over=k)


@tf.kernel
def masked_mean_pool(x: T.Tensor["B", "S", "D", "bf16"], mask: T.Tensor["B", "S", "bf16"]):
    """A sentence embedding: the mean of the tokens' features where the attention mask is 1."""
    b, s, d = T.axes("b s d")
    return T.sum(x[b, s, d] * mask[b, s], over=s) / T.sum(mask[b, s], over=s)


@tf.kernel
def lengths_mean_pool(x: T.Tensor["B", "S", "D", "bf16"], lengths: T.Tensor["B", "i32"]):
    """A sentence embedding from each sequence's length: the mean of its first lengths[b]
    tokens' features (the padding past them never read)."""
    b, s, d = T.axes("b s d")
    return T.sum(T.where(s < lengths[b], x[b, s, d], 0.0), over=s) / T.max(lengths[b], 1)


@tf.kernel
def causal_conv1d(x: T.Tensor["B", "C", "L", "bf16"], w: T.Tensor["C", "K", "bf16"]):
    """Mamba's short convolution: each channel of [B, C, L] convolved causally with its own K
    taps (the taps before the sequence's start are zeros)."""
    b, c, k = T.axes("b c k")
    t = T.axis("t", "L")
    return T.sum(T.where(t >= k, x[b, c, t - k], 0.0) * w[c, k], over=k)


@tf.kernel
def moe_combine(y: T.Tensor["T", "E", "D", "bf16"], gate: T.Tensor["T", "E", "f32"]):
    """A mixture of experts' combine: each token's E expert outputs weighted by its gates."""
    t, e, d = T.axes("t e d")
    return T.cast(T.sum(gate[t, e] * y[t, e, d], over=e), "bf16")


@tf.kernel
def cosine_similarity(x: T.Tensor["M", "D", "bf16"], y: T.Tensor["N", "D", "bf16"]):
    """Every pair's cosine similarity of two sets of embeddings (retrieval, CLIP's logits)."""
    i, j, d = T.axes("i j d")
    dot = T.sum(x[i, d] * y[j, d], over=d)
    return dot * T.rsqrt(T.sum(x[i, d] * x[i, d], over=d)) * \
        T.rsqrt(T.sum(y[j, d] * y[j, d], over=d))


@tf.kernel
def squared_distances(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"]):
    """Every pair's squared Euclidean distance of two point sets (k-means, kernel methods),
    written as the difference it is, not expanded into norms and a GEMM."""
    i, j, d = T.axes("i j d")
    return T.sum((x[i, d] - y[j, d]) * (x[i, d] - y[j, d]), over=d)


@tf.kernel
def manhattan_distances(x: T.Tensor["M", "D", "bf16"], y: T.Tensor["N", "D", "bf16"]):
    """Every pair's L1 distance (``torch.cdist(x, y, p=1)``), in f32 from bf16 points."""
    i, j, d = T.axes("i j d")
    return T.sum(T.abs(x[i, d] - y[j, d]), over=d)


@tf.kernel
def gaussian_kernel_sum(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"],
                        b: T.Tensor["N", "f32"]):
    """A Gaussian kernel's sum over a point set, ``Σ_j exp(−‖x_i − y_j‖²) b_j`` (kernel density,
    Gaussian processes, KeOps' first example): a reduction over the pairs' distances."""
    i, j, d = T.axes("i j d")
    d2 = T.sum((x[i, d] - y[j, d]) * (x[i, d] - y[j, d]), over=d)
    return T.sum(T.exp(-d2) * b[j], over=j)


@tf.kernel
def nearest_neighbour(x: T.Tensor["M", "D", "f32"], y: T.Tensor["N", "D", "f32"]):
    """Each point's squared distance to its nearest neighbour in another set (a Chamfer
    distance's half, ICP's matching): a minimum over the pairs' distances."""
    i, j, d = T.axes("i j d")
    d2 = T.sum((x[i, d] - y[j, d]) * (x[i, d] - y[j, d]), over=d)
    return T.min(d2, over=j)


@tf.kernel
def mean_nearest_distance(x: T.Tensor["B", "N", "C", "f32"], y: T.Tensor["B", "M", "C", "f32"]):
    """A Chamfer distance's half over a batch of point clouds: each point's squared distance to
    the nearest of the other cloud, averaged over the points (three reductions over c, j, i)."""
    b, i, j, c = T.axes("b i j c")
    d2 = T.sum((x[b, i, c] - y[b, j, c]) * (x[b, i, c] - y[b, j, c]), over=c)
    return T.sum(T.min(d2, over=j), over=i) / T.size("N")


@tf.kernel
def byte_histogram(x: T.Tensor["N", "i32"]):
    """``torch.bincount(x, minlength=256)``: how many elements hold each value 0-255 (others
    count nowhere)."""
    j = T.axes("j")
    k = T.axis("k", 256)
    return T.sum(T.where(x[j] == k, 1, 0), over=j)


@tf.kernel
def expert_positions(e: T.Tensor["N", "i32"]):
    """A mixture of experts' capacity positions: for each token and expert, how many tokens up
    to it were routed there (``one_hot(e, 64).cumsum(0)``)."""
    j = T.axes("j")
    i, k = T.axis("i", "N"), T.axis("k", 64)
    return T.sum(T.where((j <= i) & (e[j] == k), 1, 0), over=j)


@tf.kernel
def nearest_centroid(x: T.Tensor["M", "D", "f32"], c: T.Tensor["K", "D", "f32"]):
    """k-means' assignment (a codebook's lookup): each point's nearest centroid, ties to the
    first."""
    i, j, d = T.axes("i j d")
    return T.argmin(T.sum((x[i, d] - c[j, d]) * (x[i, d] - c[j, d]), over=d), over=j)


@tf.kernel
def l2_normalize_columns(x: T.Tensor["N", "D", "bf16"]):
    """Each column of [N, D] divided by its L2 norm (a reduction down the outer axis)."""
    n, d = T.axes("n d")
    return x[n, d] * T.rsqrt(T.sum(x[n, d] * x[n, d], over=n) + 1e-12)


@tf.kernel
def router_softmax(logits: T.Tensor["M", "E", "f32"]):
    """A mixture-of-experts router's probabilities: rows of 8."""
    i, e = T.axes("i e")
    m = T.max(logits[i, e], over=e)
    p = T.exp(logits[i, e] - m)
    return p / T.sum(p, over=e)


@tf.kernel
def log_softmax_vocab_major(x: T.Tensor["V", "B", "f32"]):
    """A log-softmax down the first axis of vocabulary-major logits ``[V, B]`` (``W @ Xᵀ``): few
    columns, each a long sweep with outputs along it."""
    v, b = T.axes("v b")
    mx = T.max(x[v, b], over=v)
    return x[v, b] - mx - T.log(T.sum(T.exp(x[v, b] - mx), over=v))


@tf.kernel
def attention_keys_transposed(q: T.Tensor["B", "H", "S", "D", "bf16"],
                              kt: T.Tensor["B", "H", "D", "S", "bf16"],
                              v: T.Tensor["B", "H", "S", "D", "bf16"], scale: T.f32):
    """Causal attention with the keys kept transposed, ``[B, H, D, S]`` (``q @ kt`` as code
    that stores ``k.transpose(-1, -2)`` writes it)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * kt[b, h, d, j], over=d) * scale
    s = T.where(i >= j, s, -T.inf)
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def rotary(x: T.Tensor["B", "S", "H", "D", "bf16"], cos: T.Tensor["S", "D", "f32"],
           sin: T.Tensor["S", "D", "f32"]):
    """Rotary embeddings, the rotate-half form: feature d pairs with d ± D/2 (computed in f32,
    returned in the input's dtype)."""
    b, s, h, d = T.axes("b s h d")
    half = T.size("D") // 2
    other = x[b, s, h, (d + half) % T.size("D")]
    return T.cast(x[b, s, h, d] * cos[s, d] + T.where(d < half, -other, other) * sin[s, d],
                  "bf16")


@tf.kernel
def biased_attention_bshd(q: T.Tensor["B", "S", "H", "D", "bf16"],
                          k: T.Tensor["B", "S", "H", "D", "bf16"],
                          v: T.Tensor["B", "S", "H", "D", "bf16"],
                          bias: T.Tensor["H", "S", "S", "bf16"], scale: T.f32):
    """Attention with a learned relative-position bias per head (T5, Swin) on [B, S, H, D]."""
    b, i, h, j, d, e = T.axes("b i h j d e")   # the output's axes in this order: [B, S, H, D]
    s = T.sum(q[b, i, h, d] * k[b, j, h, d], over=d) * scale + bias[h, i, j]
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, j, h, e], over=j) / T.sum(p, over=j)


@tf.kernel
def float_masked_attention(q: T.Tensor["B", "H", "S", "D", "bf16"],
                           k: T.Tensor["B", "H", "S", "D", "bf16"],
                           v: T.Tensor["B", "H", "S", "D", "bf16"],
                           mask: T.Tensor["B", 1, "S", "S", "bf16"], scale: T.f32):
    """Attention with the additive float mask ``[B, 1, S, S]`` transformers hands SDPA (padding
    and causal folded into one tensor of 0 and the dtype's lowest value)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale + mask[b, 0, i, j]
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)


@tf.kernel
def lm_head_softmax(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["N", "K", "bf16"]):
    """An LM head's next-token probabilities: a GEMM whose rows are then soft-maxed."""
    i, j, k = T.axes("i j k")
    s = T.sum(x[i, k] * w[j, k], over=k)
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return p / T.sum(p, over=j)


@tf.kernel
def gram_matrix(x: T.Tensor["N", "D", "bf16"]):
    """``xᵀx`` of a batch of embeddings (a covariance, Shampoo's statistics): few output tiles
    over a long contracted axis."""
    n, i, j = T.axes("n i j")
    return T.sum(x[n, i] * x[n, j], over=n)


@tf.kernel
def column_mean(x: T.Tensor["B", "D", "bf16"]):
    """The mean over the batch (the first) axis of ``[B, D]`` rows."""
    b, d = T.axes("b d")
    return T.sum(x[b, d], over=b) / T.size("B")


@tf.kernel
def strided_matvec(a: T.Tensor["K", "M", "bf16"], x: T.Tensor["K", "bf16"]):
    """A matrix-vector product over the matrix's strided axis, ``Σ_k a[k, i] · x[k]`` (its rows
    ``i`` contiguous: ``a.T @ x``): one tensor down the sweep, weighed by a vector along it."""
    i, k = T.axes("i k")
    return T.cast(T.sum(a[k, i] * x[k], over=k), "bf16")


@tf.kernel
def weighted_token_pool(w: T.Tensor["B", "S", "bf16"], x: T.Tensor["B", "S", "D", "bf16"]):
    """Attention pooling's last step: each sequence's tokens summed with their weights."""
    b, s, d = T.axes("b s d")
    return T.sum(w[b, s] * x[b, s, d], over=s)


@tf.kernel
def rmsnorm_linear(x: T.Tensor["M", "K", "bf16"], g: T.Tensor["K", "bf16"],
                   w: T.Tensor["N", "K", "bf16"]):
    """RMSNorm written into the linear layer after it, one sum:
    ``Σ_k x[i, k] · rsqrt(mean_k x² + ε) · g[k] · w[j, k]``."""
    i, j, k = T.axes("i j k")
    r = T.rsqrt(T.sum(x[i, k] * x[i, k], over=k) / T.size("K") + 1e-6)
    return T.sum(x[i, k] * r * g[k] * w[j, k], over=k)


def _batch_norm_stats_case(generator, B=32, C=256, H=56, W=56) -> Case:
    """A ResNet stage's NCHW activations; torch's var_mean over (0, 2, 3)."""
    x = (torch.randn(B, C, H, W, generator=generator) * 2 + 1).to("cuda", torch.bfloat16)

    def eager(t):
        var, mean = torch.var_mean(t.float() if t.dtype != torch.float64 else t, (0, 2, 3),
                                   correction=0)
        return torch.stack([mean, var])
    f, compiled = Recorded(batch_norm_stats_nchw), torch.compile(eager)
    return Case("batch_norm_stats_nchw", f"B{B} C{C} H{H} W{W} (over B, H, W)", lambda: f(x),
                {TORCH_COMPILE: lambda: compiled(x), TORCH_EAGER: lambda: eager(x)},
                eager(x.double()),
                lambda out: torch.stack(out) if isinstance(out, tuple) else out,
                bytes=x.numel() * x.element_size() + 2 * C * 2,
                notes={TENSORFUSE: f.schedule_origin(B=B, C=C, H=H, W=W)})


def _max_pool_case(generator, B=32, C=128, H=56, W=56) -> Case:
    x = torch.randn(B, C, 2 * H, 2 * W, generator=generator).to("cuda", torch.bfloat16)
    return rows_case("max_pool_2x2", max_pool_2x2,
                      lambda t: F.max_pool2d(t.reshape(B, C, 2 * H, 2 * W), 2),
                      x.view(B, C, H, 2, W, 2), {}, f"B{B} C{C} {2 * H}x{2 * W} -> {H}x{W}")


def _maxout_case(generator, M=8192, N=3584, K=4) -> Case:
    x = torch.randn(M, N * K, generator=generator).to("cuda", torch.bfloat16)
    return rows_case("maxout", maxout, lambda t: t.amax(-1),
                     x.view(M, N, K), {}, f"M{M} N{N} K{K} (max of each {K} features)")


def _masked_mean_case(generator, B=32, S=2048, D=1024) -> Case:
    x = torch.randn(B, S, D, generator=generator).to("cuda", torch.bfloat16)
    lengths = torch.randint(S // 4, S + 1, (B,), generator=generator)
    mask = (torch.arange(S)[None, :] < lengths[:, None]).to("cuda", torch.bfloat16)

    def eager(t, m):
        t32 = t.float() if t.dtype != torch.float64 else t
        m32 = m.to(t32.dtype)
        return ((t32 * m32[..., None]).sum(1) / m32.sum(1, keepdim=True)).to(t.dtype)
    return rows_case("masked_mean_pool", masked_mean_pool, eager, x, {"mask": mask},
                     f"B{B} S{S} D{D} (over S, ragged lengths)")


def _lengths_mean_case(generator, B=32, S=2048, D=1024) -> Case:
    """The masked mean's tokens and lengths, the lengths given as such; torch masks the padding
    (a mask made from the lengths in the call, as a user's code does). GB/s of the kept tokens."""
    x = torch.randn(B, S, D, generator=generator).to("cuda", torch.bfloat16)
    lengths = torch.randint(S // 4, S + 1, (B,), generator=generator).to("cuda", torch.int32)

    def eager(t, n):
        t32 = t.float() if t.dtype != torch.float64 else t
        kept = (torch.arange(t.shape[1], device=t.device)[None, :] < n[:, None]).to(t32.dtype)
        return ((t32 * kept[..., None]).sum(1) / n[:, None].clamp(min=1).to(t32.dtype)).to(
            t.dtype)
    f, compiled = Recorded(lengths_mean_pool), torch.compile(eager)
    moved = (int(lengths.sum()) * D + B * D) * x.element_size()
    return Case("lengths_mean_pool", f"B{B} S{S} D{D} (over each sequence's first lengths[b])",
                lambda: f(x, lengths),
                {TORCH_COMPILE: lambda: compiled(x, lengths),
                 TORCH_EAGER: lambda: eager(x, lengths)},
                eager(x.double(), lengths), lambda out: out, bytes=moved,
                notes={TENSORFUSE: f.schedule_origin(B=B, S=S, D=D)})


def _causal_conv_case(generator, B=8, C=4096, L=2048, K=4) -> Case:
    x = torch.randn(B, C, L, generator=generator).to("cuda", torch.bfloat16)
    w = torch.randn(C, K, generator=generator).to("cuda", torch.bfloat16)

    def eager(t, taps):   # out[t] = Σ_k w[k]·x[t − k]: conv1d's correlation with flipped taps
        return F.conv1d(F.pad(t, (K - 1, 0)), taps.flip(-1)[:, None, :], groups=C)
    return rows_case("causal_conv1d", causal_conv1d, eager, x, {"w": w},
                     f"B{B} C{C} L{L} K{K} (depthwise, causal)")


def _moe_combine_case(generator, T_=8192, E=8, D=4096) -> Case:
    y = torch.randn(T_, E, D, generator=generator).to("cuda", torch.bfloat16)
    gate = torch.softmax(torch.randn(T_, E, generator=generator), -1).to("cuda")

    def eager(t, g):
        return (t.to(g.dtype) * g[..., None]).sum(1).to(t.dtype)
    return rows_case("moe_combine", moe_combine, eager, y, {"gate": gate},
                     f"T{T_} E{E} D{D} (over E)")


def _cosine_case(generator, M=8192, N=8192, D=1024) -> Case:
    x = torch.randn(M, D, generator=generator).to("cuda", torch.bfloat16)
    y = torch.randn(N, D, generator=generator).to("cuda", torch.bfloat16)

    def eager(a, b):
        return F.normalize(a.float(), dim=-1).to(a.dtype) @ F.normalize(b.float(), dim=-1).to(
            b.dtype).T
    f, compiled = Recorded(cosine_similarity), torch.compile(eager)
    rows = torch.arange(0, M, 97)
    ref = F.normalize(x[rows].double(), dim=-1) @ F.normalize(y.double(), dim=-1).T
    return Case("cosine_similarity", f"M{M} N{N} D{D}", lambda: f(x, y),
                {TORCH_COMPILE: lambda: compiled(x, y), TORCH_EAGER: lambda: eager(x, y)},
                ref, lambda out: out[rows], flops=2 * M * N * D,
                notes={TENSORFUSE: f.schedule_origin(M=M, N=N, D=D)})


def _pairwise_case(name, kernel, eager, reference, dtype, M, N, D, generator) -> Case:
    """A pairwise-distance case: ``eager`` is torch's own (``torch.cdist``), then what
    torch.compile makes of the broadcast form of the same math (``reference``). Operations: 3
    per pair and index (a subtraction, a square or an absolute value, an addition), against an
    f32 GEMM's measured rate on the CUDA cores — which fuses its 2 operations an index into one
    instruction where these take 2 for 3: 75 % of it is the limit of the instructions issued."""
    x = (torch.randn(M, D, generator=generator) * 2).to("cuda", dtype)
    y = (torch.randn(N, D, generator=generator) * 2 + 0.5).to("cuda", dtype)
    f, compiled = Recorded(kernel), torch.compile(reference)
    rows = torch.arange(0, M, 97)
    return Case(name, f"M{M} N{N} D{D} {'f32' if dtype == torch.float32 else 'bf16'}",
                lambda: f(x, y),
                {"torch cdist": lambda: eager(x, y), TORCH_COMPILE: lambda: compiled(x, y)},
                reference(x[rows].double(), y.double()), lambda out: out[rows],
                flops=3 * M * N * D, ceiling="f32_gemm_tflops",
                notes={TENSORFUSE: f.schedule_origin(M=M, N=N, D=D)})


def _squared_distances_case(generator, M=4096, N=4096, D=128) -> Case:
    return _pairwise_case("squared_distances", squared_distances,
                          lambda a, b: torch.cdist(a, b) ** 2,
                          lambda a, b: ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1),
                          torch.float32, M, N, D, generator)


def _manhattan_case(generator, M=4096, N=4096, D=128) -> Case:
    return _pairwise_case("manhattan_distances", manhattan_distances,
                          lambda a, b: torch.cdist(a.float(), b.float(), p=1),
                          lambda a, b: (a[:, None, :].to(torch.float32 if a.dtype != torch.float64
                                                         else a.dtype) - b[None, :, :]).abs()
                          .sum(-1),
                          torch.bfloat16, M, N, D, generator)


def _gaussian_sum_case(generator, M=16384, N=16384, D=3) -> Case:
    """3-D points (a point cloud's density); torch materialises the [M, N] kernel matrix
    (``cdist``, ``exp``, a GEMV), torch.compile gets the broadcast form. Operations: 3 a pair
    and dimension, and an exponential, a product and a sum a pair."""
    x, y = (torch.rand(n, D, generator=generator).to("cuda") * 4 for n in (M, N))
    b = torch.randn(N, generator=generator).to("cuda")

    def eager(p, q, w):
        return torch.exp(-torch.cdist(p, q) ** 2) @ w

    def broadcast(p, q, w):
        return (torch.exp(-((p[:, None, :] - q[None, :, :]) ** 2).sum(-1)) * w).sum(-1)
    f, compiled = Recorded(gaussian_kernel_sum), torch.compile(broadcast)
    rows = torch.arange(0, M, 97)
    return Case("gaussian_kernel_sum", f"M{M} N{N} D{D} f32", lambda: f(x, y, b),
                {TORCH_EAGER: lambda: eager(x, y, b), TORCH_COMPILE: lambda: compiled(x, y, b)},
                broadcast(x[rows].double(), y.double(), b.double()), lambda out: out[rows],
                flops=M * N * (3 * D + 3), ceiling="f32_gemm_tflops",
                notes={TENSORFUSE: f.schedule_origin(M=M, N=N, D=D)})


def _nearest_neighbour_case(generator, M=16384, N=16384, D=3) -> Case:
    """3-D point clouds; torch materialises the distances (``cdist``, then ``amin``),
    torch.compile gets the broadcast form. Operations: 3 a pair and dimension, 1 a pair."""
    x, y = (torch.rand(n, D, generator=generator).to("cuda") * 4 for n in (M, N))

    def eager(p, q):
        return (torch.cdist(p, q) ** 2).amin(-1)

    def broadcast(p, q):
        return ((p[:, None, :] - q[None, :, :]) ** 2).sum(-1).amin(-1)
    f, compiled = Recorded(nearest_neighbour), torch.compile(broadcast)
    rows = torch.arange(0, M, 97)
    return Case("nearest_neighbour", f"M{M} N{N} D{D} f32", lambda: f(x, y),
                {TORCH_EAGER: lambda: eager(x, y), TORCH_COMPILE: lambda: compiled(x, y)},
                broadcast(x[rows].double(), y.double()), lambda out: out[rows],
                flops=M * N * (3 * D + 1), ceiling="f32_gemm_tflops",
                notes={TENSORFUSE: f.schedule_origin(M=M, N=N, D=D)})


def _mean_nearest_case(generator, B=8, N=4096, M=4096, C=3) -> Case:
    """Batched 3-D point clouds; torch materialises the distances (``cdist``), torch.compile
    gets the broadcast form."""
    x, y = (torch.rand(B, n, C, generator=generator).to("cuda") * 4 for n in (N, M))

    def eager(p, q):
        return (torch.cdist(p, q) ** 2).amin(-1).mean(-1)

    def broadcast(p, q):
        return ((p[:, :, None, :] - q[:, None, :, :]) ** 2).sum(-1).amin(-1).mean(-1)
    f, compiled = Recorded(mean_nearest_distance), torch.compile(broadcast)
    return Case("mean_nearest_distance", f"B{B} N{N} M{M} C{C} f32", lambda: f(x, y),
                {TORCH_EAGER: lambda: eager(x, y), TORCH_COMPILE: lambda: compiled(x, y)},
                broadcast(x.double(), y.double()), lambda out: out,
                flops=B * N * M * (3 * C + 1), ceiling="f32_gemm_tflops",
                notes={TENSORFUSE: f.schedule_origin(B=B, N=N, M=M, C=C)})


def _histogram_case(generator, N=1 << 26) -> Case:
    """One value in 40 out of range (counted nowhere), the rest skewed to low values."""
    x = (torch.rand(N, generator=generator) ** 3 * 266).to(torch.int32).cuda()
    f, compiled = Recorded(byte_histogram), torch.compile(
        lambda t: torch.bincount(t[(t >= 0) & (t < 256)], minlength=256))
    ref = torch.bincount(x.cpu()[x.cpu() < 256].long(), minlength=256).double().cuda()
    return Case("byte_histogram", f"N{N} i32, 256 bins", lambda: f(x),
                {TORCH_EAGER: lambda: torch.bincount(x[x < 256], minlength=256),
                 TORCH_COMPILE: lambda: compiled(x)},
                ref, lambda out: out, bytes=x.numel() * 4,
                notes={TENSORFUSE: f.schedule_origin(N=N)})


def _expert_positions_case(generator, N=65536) -> Case:
    e = torch.randint(0, 64, (N,), generator=generator).to(torch.int32).cuda()

    def eager(t):
        return F.one_hot(t.long(), 64).cumsum(0)
    f, compiled = Recorded(expert_positions), torch.compile(eager)
    return Case("expert_positions", f"N{N} E64 i32", lambda: f(e),
                {TORCH_EAGER: lambda: eager(e), TORCH_COMPILE: lambda: compiled(e)},
                eager(e).double(), lambda out: out, bytes=N * 4 + N * 64 * 4,
                notes={TENSORFUSE: f.schedule_origin(N=N)})


def _kmeans_assign_case(generator, M=65536, K=1024, D=128) -> Case:
    """k-means' assignment step: each point's nearest centroid (``argmin_j Σ_d (x − c)²``); torch
    materialises the distances (``cdist``, then ``argmin``), torch.compile gets the broadcast
    form. Checked by what it picks: the float64 distance at the chosen centroid against the
    nearest one (rounding may choose among near ties, never a farther centroid)."""
    x = torch.randn(M, D, generator=generator).to("cuda") * 4
    c = torch.randn(K, D, generator=generator).to("cuda") * 4

    def eager(p, q):
        return torch.cdist(p, q).argmin(-1)

    def broadcast(p, q):
        return ((p[:, None, :] - q[None, :, :]) ** 2).sum(-1).argmin(-1)
    f, compiled = Recorded(nearest_centroid), torch.compile(broadcast)
    rows = torch.arange(0, M, 97, device="cuda")
    distances = torch.cdist(x[rows].double(), c.double()) ** 2
    return Case("kmeans_assign", f"M{M} K{K} D{D} f32", lambda: f(x, c),
                {TORCH_EAGER: lambda: eager(x, c), TORCH_COMPILE: lambda: compiled(x, c)},
                distances.min(-1).values,
                lambda out: distances.gather(1, out[rows].long()[:, None])[:, 0],
                flops=M * K * (3 * D + 1), ceiling="f32_gemm_tflops",
                notes={TENSORFUSE: f.schedule_origin(M=M, K=K, D=D)})


@tf.kernel
def best_match_index(x: T.Tensor["M", "D", "bf16"], y: T.Tensor["N", "D", "bf16"]):
    """Retrieval's top-1: each query's highest-scoring key (``argmax_j x·yᵀ``), ties to the
    first."""
    i, j, d = T.axes("i j d")
    return T.argmax(T.sum(x[i, d] * y[j, d], over=d), over=j)


def _best_match_index_case(generator, M=8192, N=65536, D=256) -> Case:
    """8192 queries over 65536 keys of 256 dimensions; torch computes the scores (``x @ yᵀ``,
    bf16 as SDPA would) and then ``argmax``. Checked by what it picks: the float64 score at the
    chosen key against the best one (rounding may choose among near ties, never a worse key)."""
    x, y = (torch.randn(n, D, generator=generator).to("cuda", torch.bfloat16) for n in (M, N))

    def eager(p, q):
        return (p @ q.T).argmax(-1)
    f, compiled = Recorded(best_match_index), torch.compile(eager)
    rows = torch.arange(0, M, 97, device="cuda")
    scores = x[rows].double() @ y.double().T
    return Case("best_match_index", f"M{M} N{N} D{D} bf16", lambda: f(x, y),
                {TORCH_EAGER: lambda: eager(x, y), TORCH_COMPILE: lambda: compiled(x, y)},
                scores.max(-1).values,
                lambda out: scores.gather(1, out[rows].long()[:, None])[:, 0],
                flops=2 * M * N * D, notes={TENSORFUSE: f.schedule_origin(M=M, N=N, D=D)})


@tf.kernel
def contrastive_normaliser(x: T.Tensor["M", "D", "bf16"], y: T.Tensor["N", "D", "bf16"],
                           tau: T.f32):
    """The log of a contrastive loss's normaliser (InfoNCE's, CLIP's): ``log Σ_j exp(x_i·y_j/τ)``
    over a batch of embeddings."""
    i, j, d = T.axes("i j d")
    return T.logsumexp(T.sum(x[i, d] * y[j, d], over=d) / tau, over=j)


def _contrastive_case(generator, M=16384, N=16384, D=768) -> Case:
    """CLIP ViT-L's 768-dimensional embeddings, a batch of 16384 pairs: torch materialises the
    scores (1 GiB in f32) and takes their ``logsumexp``; tensorfuse keeps the normaliser per
    lane beside the GEMM's tiles."""
    x, y = ((torch.randn(n, D, generator=generator) / D ** 0.25).to("cuda", torch.bfloat16)
            for n in (M, N))

    def eager(p, q):
        return ((p @ q.T).float() / 0.07).logsumexp(-1).to(p.dtype)
    f, compiled = Recorded(contrastive_normaliser), torch.compile(eager)
    rows = torch.arange(0, M, 97, device="cuda")
    return Case("contrastive_normaliser", f"M{M} N{N} D{D} bf16", lambda: f(x, y, 0.07),
                {TORCH_EAGER: lambda: eager(x, y), TORCH_COMPILE: lambda: compiled(x, y)},
                (x[rows].double() @ y.double().T / 0.07).logsumexp(-1), lambda out: out[rows],
                flops=2 * M * N * D, notes={TENSORFUSE: f.schedule_origin(M=M, N=N, D=D,
                                                                          tau=0.07)})


def _l2_columns_case(generator, N=8192, D=4096) -> Case:
    x = torch.randn(N, D, generator=generator).to("cuda", torch.bfloat16)

    def eager(t):
        t32 = t.float() if t.dtype != torch.float64 else t
        return (t32 * torch.rsqrt((t32 * t32).sum(0, keepdim=True) + 1e-12)).to(t.dtype)
    return rows_case("l2_normalize_columns", l2_normalize_columns, eager, x, {},
                      f"N{N} D{D} (over N)")


def _router_case(generator, M=524288, E=8) -> Case:
    x = (torch.randn(M, E, generator=generator) * 3).to("cuda", torch.float32)
    return rows_case("router_softmax", router_softmax, lambda t: torch.softmax(t, -1), x, {},
                      f"M{M} E{E} f32")


def _vocab_major_case(generator, V=32000, B=64) -> Case:
    x = (torch.randn(V, B, generator=generator) * 3).to("cuda", torch.float32)
    return rows_case("log_softmax_vocab_major", log_softmax_vocab_major,
                     lambda t: torch.log_softmax(t, 0), x, {}, f"V{V} B{B} f32 (over V)")


def _rotary_case(generator, B=4, S=4096, H=32, D=128) -> Case:
    x = torch.randn(B, S, H, D, generator=generator).to("cuda", torch.bfloat16)
    angles = torch.arange(S)[:, None] * 10000.0 ** (-torch.arange(D // 2) / (D // 2))
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos().cuda(), angles.sin().cuda()

    def eager(t, c, s):   # transformers' apply_rotary_pos_emb
        half = t.shape[-1] // 2
        rotated = torch.cat([-t[..., half:], t[..., :half]], -1)
        return (t * c[:, None] + rotated * s[:, None]).to(t.dtype)
    return rows_case("rotary", rotary, eager, x, {"cos": cos, "sin": sin},
                      f"B{B} S{S} H{H} D{D} [BSHD]")


def _biased_attention_case(generator, B=2, S=2048, H=16, D=128) -> Case:
    """SDPA with the bias as its float mask and FlexAttention with a score_mod reading it, on
    [B, H, S, D] views of the same tensors."""
    from benchmarks.attention import compiled_flex

    q, k, v = (torch.randn(B, S, H, D, generator=generator).to("cuda", torch.bfloat16)
               for _ in range(3))
    bias = torch.randn(H, S, S, generator=generator).to("cuda", torch.bfloat16)
    scale = D ** -0.5
    f = Recorded(biased_attention_bshd)
    view = (lambda x: x.transpose(1, 2))
    rows = torch.cat([torch.arange(64), torch.arange(S - 64, S)])
    s = view(q)[:, :, rows].double() @ view(k).double().transpose(-1, -2) * scale + \
        bias[:, rows].double()
    ref = torch.softmax(s, -1) @ view(v).double()
    flex = compiled_flex()

    def sdpa():
        return view(F.scaled_dot_product_attention(view(q), view(k), view(v), attn_mask=bias,
                                                   scale=scale))

    def biased(score, b, h, i, j):
        return score + bias[h, i, j]
    return Case("biased_attention_bshd", f"B{B} S{S} H{H} D{D} [BSHD] + bias[H, S, S]",
                lambda: f(q, k, v, bias, scale=scale),
                {SDPA: sdpa,
                 FLEX: lambda: view(flex(view(q), view(k), view(v), score_mod=biased,
                                         scale=scale))},
                ref, lambda out: view(out)[:, :, rows], flops=4 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, S=S, H=H, D=D)})


def _keys_transposed_case(generator, B=2, S=4096, H=16, D=128) -> Case:
    """SDPA on the transposed view as it is, and on a contiguous copy of it (the copy timed too):
    SDPA's fused kernels want the head dim innermost."""
    q, v = (torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
            for _ in range(2))
    kt = torch.randn(B, H, D, S, generator=generator).to("cuda", torch.bfloat16)
    scale = D ** -0.5
    f = Recorded(attention_keys_transposed)
    rows = torch.cat([torch.arange(64), torch.arange(S - 64, S)])
    s = q[:, :, rows].double() @ kt.double() * scale
    s = s.masked_fill(rows[:, None].cuda() < torch.arange(S, device="cuda")[None], float("-inf"))
    ref = torch.softmax(s, -1) @ v.double()

    def sdpa(keys):
        return F.scaled_dot_product_attention(q, keys, v, is_causal=True, scale=scale)
    return Case("attention_keys_transposed", f"B{B} H{H} S{S} D{D} causal [k: BHDS]",
                lambda: f(q, kt, v, scale=scale),
                {SDPA: lambda: sdpa(kt.transpose(-1, -2)),
                 SDPA + " (k copied contiguous)": lambda: sdpa(kt.transpose(-1, -2).contiguous())},
                ref, lambda out: out[:, :, rows], flops=2 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D)})


@tf.kernel
def attention_channels_first(q: T.Tensor["B", "H", "D", "S", "bf16"],
                             k: T.Tensor["B", "H", "D", "S", "bf16"],
                             v: T.Tensor["B", "H", "D", "S", "bf16"], scale: T.f32):
    """Attention over a channels-first feature map's heads (``x[B, C, H·W]`` projected and split
    as ``[B, heads, D, H·W]``), its output ``[B, H, D, S]`` as well."""
    b, h, e, i, j, d = T.axes("b h e i j d")
    s = T.sum(q[b, h, d, i] * k[b, h, d, j], over=d) * scale
    return softmax_attend(s, v[b, h, e, j], j)


@tf.kernel
def attention_queries_first(q: T.Tensor["B", "H", "D", "S", "bf16"],
                            k: T.Tensor["B", "H", "S", "D", "bf16"],
                            v: T.Tensor["B", "H", "S", "D", "bf16"], scale: T.f32):
    """Attention whose queries alone are held ``[B, H, D, S]`` (a channels-first model's
    queries over a cache kept as transformers keeps one)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, d, i] * k[b, h, j, d], over=d) * scale
    return softmax_attend(s, v[b, h, j, e], j)


def _heads_transposed_case(name: str, kernel, moved: str, generator, B=2, S=4096, H=16,
                           D=128) -> Case:
    """Non-causal attention with the tensors named in ``moved`` (of q, k, v and the output)
    held ``[B, H, D, S]``: SDPA on the transposed views as they are, and on contiguous copies of
    them (the copies timed too, the output transposed back into its layout by a copy); the
    Triton template, which reads any strides, beside ``tf.compile``'s choice."""
    def make(role):
        shape = (B, H, D, S) if role in moved else (B, H, S, D)
        return torch.randn(*shape, generator=generator).to("cuda", torch.bfloat16)
    q, k, v = make("q"), make("k"), make("v")
    as_bhsd = [x.transpose(-1, -2) if role in moved else x for x, role in zip((q, k, v), "qkv")]
    scale = D ** -0.5
    f = Recorded(kernel)
    rows = torch.cat([torch.arange(64), torch.arange(S - 64, S)])
    s = as_bhsd[0][:, :, rows].double() @ as_bhsd[1].double().transpose(-1, -2) * scale
    ref = torch.softmax(s, -1) @ as_bhsd[2].double()                   # [B, H, rows, D]
    back = (lambda out: out.transpose(-1, -2)) if "out" in moved else (lambda out: out)

    def sdpa(copy):
        out = back(F.scaled_dot_product_attention(
            *(x.contiguous() if copy else x for x in as_bhsd), scale=scale))
        return out.contiguous() if copy else out
    triton = tf.compile(kernel).template
    return Case(name, f"B{B} H{H} S{S} D{D} [{', '.join(moved)}: BHDS]",
                lambda: f(q, k, v, scale=scale),
                {SDPA: lambda: sdpa(False), SDPA + " (copied contiguous)": lambda: sdpa(True),
                 TENSORFUSE + " triton": lambda: triton(q, k, v, scale=scale)},
                ref, lambda out: back(out)[:, :, rows], flops=4 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D)})


@tf.kernel
def attention_softmax_then_sum(q: T.Tensor["B", "H", "S", "D", "bf16"],
                               k: T.Tensor["B", "H", "S", "D", "bf16"],
                               v: T.Tensor["B", "H", "S", "D", "bf16"], scale: T.f32):
    """Attention written from its definition: the softmax's weights, then their weighted sum of
    the values (``softmax(q @ k.T * scale) @ v``)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    p = T.exp(s - T.max(s, over=j))
    weights = p / T.sum(p, over=j)
    return T.sum(weights * v[b, h, j, e], over=j)


def _softmax_then_sum_case(generator, B=2, S=4096, H=16, D=128) -> Case:
    """SDPA (cuDNN, flash) on the same tensors, and the two steps as torch writes them eager."""
    from benchmarks.common import sdpa_backends

    q, k, v = (torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
               for _ in range(3))
    scale = D ** -0.5
    f = Recorded(attention_softmax_then_sum)
    rows = torch.cat([torch.arange(64), torch.arange(S - 64, S)])
    s = q[:, :, rows].double() @ k.double().transpose(-1, -2) * scale
    ref = torch.softmax(s, -1) @ v.double()
    return Case("attention_softmax_then_sum", f"B{B} H{H} S{S} D{D}",
                lambda: f(q, k, v, scale=scale),
                {**sdpa_backends(q, k, v, scale=scale),
                 TORCH_EAGER: lambda: torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v},
                ref, lambda out: out[:, :, rows], flops=4 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D)})


LOG2E = 1.4426950408889634   # log2(e) as FlashAttention's and Triton's sources write it


@tf.kernel
def attention_base_two(q: T.Tensor["B", "H", "S", "D", "bf16"],
                       k: T.Tensor["B", "H", "S", "D", "bf16"],
                       v: T.Tensor["B", "H", "S", "D", "bf16"], scale: T.f32):
    """Causal attention in base two, as Triton's tutorial writes it: the scores scaled by
    log2(e), the weights ``exp2(s - m)``."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * (scale * LOG2E)
    s = T.where(j <= i, s, float("-inf"))
    m = T.max(s, over=j)
    p = T.exp2(s - m)
    return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)


def _base_two_case(generator, B=2, S=4096, H=16, D=128) -> Case:
    """SDPA (cuDNN, flash) causal on the same tensors."""
    from benchmarks.common import sdpa_backends

    q, k, v = (torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
               for _ in range(3))
    scale = D ** -0.5
    f = Recorded(attention_base_two)
    rows = torch.cat([torch.arange(64), torch.arange(S - 64, S)])
    s = q[:, :, rows].double() @ k.double().transpose(-1, -2) * scale
    s = s.masked_fill(rows.to(s.device)[:, None] < torch.arange(S, device=s.device), float("-inf"))
    ref = torch.softmax(s, -1) @ v.double()
    return Case("attention_base_two", f"B{B} H{H} S{S} D{D} causal",
                lambda: f(q, k, v, scale=scale),
                sdpa_backends(q, k, v, scale=scale, is_causal=True),
                ref, lambda out: out[:, :, rows], flops=2 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, S=S, D=D)})


def _float_mask_case(generator, B=2, S=4096, H=16, D=128) -> Case:
    """Left padding (each sequence's first tokens masked) and causal in one float mask, as
    transformers builds it; SDPA with it as ``attn_mask``, FlexAttention with a score_mod
    reading it."""
    from benchmarks.attention import compiled_flex

    q, k, v = (torch.randn(B, H, S, D, generator=generator).to("cuda", torch.bfloat16)
               for _ in range(3))
    pad = torch.tensor([0, S // 8])[:B]
    j = torch.arange(S)
    hidden = (j[None, None, :] > j[None, :, None]) | (j[None, None, :] < pad[:, None, None])
    mask = torch.zeros(B, 1, S, S).masked_fill(hidden[:, None], torch.finfo(torch.bfloat16).min)
    mask = mask.to("cuda", torch.bfloat16)
    scale = D ** -0.5
    f = Recorded(float_masked_attention)
    # the first rows too: the padded sequence's are masked whole (at the dtype's lowest value,
    # so their keys weigh equally)
    rows = torch.cat([torch.arange(64), torch.arange(S // 8, S // 8 + 64),
                      torch.arange(S - 64, S)])
    s = q[:, :, rows].double() @ k.double().transpose(-1, -2) * scale + mask[:, :, rows].double()
    ref = torch.softmax(s, -1) @ v.double()
    flex = compiled_flex()

    def masked(score, b, h, i, j):
        return score + mask[b, 0, i, j]
    return Case("float_masked_attention", f"B{B} S{S} H{H} D{D} + mask[B, 1, S, S]",
                lambda: f(q, k, v, mask, scale=scale),
                {SDPA: lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                              scale=scale),
                 FLEX: lambda: flex(q, k, v, score_mod=masked, scale=scale)},
                ref, lambda out: out[:, :, rows], flops=4 * B * H * S * S * D,
                notes={TENSORFUSE: f.schedule_origin(B=B, S=S, H=H, D=D)})


def _lm_head_case(generator, M=4096, K=4096, N=32000) -> Case:
    x = torch.randn(M, K, generator=generator).to("cuda", torch.bfloat16)
    w = (torch.randn(N, K, generator=generator) * K ** -0.5).to("cuda", torch.bfloat16)

    def eager(a, b):
        return torch.softmax((a @ b.T).float(), -1).to(a.dtype)
    f, compiled = Recorded(lm_head_softmax), torch.compile(eager)
    rows = torch.arange(0, M, 97)
    return Case("lm_head_softmax", f"M{M} K{K} N{N}", lambda: f(x, w),
                {TORCH_COMPILE: lambda: compiled(x, w), TORCH_EAGER: lambda: eager(x, w)},
                torch.softmax(x[rows].double() @ w.double().T, -1), lambda out: out[rows],
                flops=2 * M * K * N, notes={TENSORFUSE: f.schedule_origin(M=M, K=K, N=N)})


def _rmsnorm_linear_case(generator, M=8192, K=4096, N=4096) -> Case:
    x = (torch.randn(M, K, generator=generator) * 3).to("cuda", torch.bfloat16)
    g = (torch.rand(K, generator=generator) + 0.5).to("cuda", torch.bfloat16)
    w = (torch.randn(N, K, generator=generator) * K ** -0.5).to("cuda", torch.bfloat16)

    def eager(a, gain, weight):
        return F.linear(F.rms_norm(a, (a.shape[-1],), gain, 1e-6), weight)
    f, compiled = Recorded(rmsnorm_linear), torch.compile(eager)
    rows = torch.arange(0, M, 97)
    x64 = x[rows].double()
    normed = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + 1e-6) * g.double()
    return Case("rmsnorm_linear", f"M{M} K{K} N{N}", lambda: f(x, g, w),
                {TORCH_COMPILE: lambda: compiled(x, g, w), TORCH_EAGER: lambda: eager(x, g, w)},
                normed @ w.double().T, lambda out: out[rows], flops=2 * M * K * N,
                notes={TENSORFUSE: f.schedule_origin(M=M, K=K, N=N)})


def _gram_case(generator, N=65536, D=1024) -> Case:
    x = torch.randn(N, D, generator=generator).to("cuda", torch.bfloat16)

    def eager(a):
        return a.T @ a
    f, compiled = Recorded(gram_matrix), torch.compile(eager)
    rows = torch.arange(0, D, 37)
    return Case("gram_matrix", f"N{N} D{D}", lambda: f(x),
                {TORCH_COMPILE: lambda: compiled(x), TORCH_EAGER: lambda: eager(x)},
                x[:, rows].double().T @ x.double(), lambda out: out[rows],
                flops=2 * N * D * D, notes={TENSORFUSE: f.schedule_origin(N=N, D=D)})


def _router_gradient_case(generator, T_=16384, E=8, D=4096) -> Case:
    g = torch.randn(T_, E, generator=generator).to("cuda", torch.bfloat16)
    x = torch.randn(T_, D, generator=generator).to("cuda", torch.bfloat16)

    def eager(a, b):
        return a.T @ b
    # ``dlogitsᵀ x`` over the tokens: the transposed product a user writes for it
    f, compiled = Recorded(transposed_product), torch.compile(eager)
    return Case("router_weight_gradient", f"T{T_} E{E} D{D}", lambda: f(g, x),
                {TORCH_COMPILE: lambda: compiled(g, x), TORCH_EAGER: lambda: eager(g, x)},
                g.double().T @ x.double(), lambda out: out, bytes=(T_ * (E + D) + E * D) * 2,
                notes={TENSORFUSE: f.schedule_origin(R=T_, M=E, N=D)})


def _bilinear_case(generator, B=4096, I_=4096, J=4096) -> Case:
    x = torch.randn(B, I_, generator=generator).to("cuda", torch.bfloat16)
    W = (torch.randn(I_, J, generator=generator) * I_ ** -0.5).to("cuda", torch.bfloat16)
    y = torch.randn(B, J, generator=generator).to("cuda", torch.bfloat16)

    def eager(a, m, b):
        return ((a @ m).float() * b.float()).sum(-1).to(a.dtype)
    f, compiled = Recorded(bilinear_form), torch.compile(eager)
    return Case("bilinear_form", f"B{B} I{I_} J{J}", lambda: f(x, W, y),
                {TORCH_COMPILE: lambda: compiled(x, W, y), TORCH_EAGER: lambda: eager(x, W, y)},
                ((x.double() @ W.double()) * y.double()).sum(-1), lambda out: out,
                flops=2 * B * I_ * J, notes={TENSORFUSE: f.schedule_origin(B=B, I=I_, J=J)})


def _column_mean_case(generator, B=65536, D=1024) -> Case:
    x = (torch.randn(B, D, generator=generator) + 0.5).to("cuda", torch.bfloat16)

    def eager(t):
        return t.float().mean(0).to(t.dtype)
    f, compiled = Recorded(column_mean), torch.compile(eager)
    return Case("column_mean", f"B{B} D{D} (over B)", lambda: f(x),
                {TORCH_COMPILE: lambda: compiled(x), TORCH_EAGER: lambda: eager(x)},
                x.double().mean(0), lambda out: out, bytes=x.numel() * 2 + D * 2,
                notes={TENSORFUSE: f.schedule_origin(B=B, D=D)})


def _strided_matvec_case(generator, K=8192, M=8192) -> Case:
    a = torch.randn(K, M, generator=generator).to("cuda", torch.bfloat16)
    x = torch.randn(K, generator=generator).to("cuda", torch.bfloat16)

    def eager(m, v):   # cuBLAS's gemv on the transposed view
        return m.t() @ v
    f, compiled = Recorded(strided_matvec), torch.compile(eager)
    return Case("strided_matvec", f"K{K} M{M} (a.T @ x)", lambda: f(a, x),
                {TORCH_COMPILE: lambda: compiled(a, x), TORCH_EAGER: lambda: eager(a, x)},
                a.double().t() @ x.double(), lambda out: out,
                bytes=a.numel() * 2 + K * 2 + M * 2,
                notes={TENSORFUSE: f.schedule_origin(K=K, M=M)})


def _weighted_pool_case(generator, B=64, S=4096, D=1024) -> Case:
    w = torch.softmax(torch.randn(B, S, generator=generator), -1).to("cuda", torch.bfloat16)
    x = torch.randn(B, S, D, generator=generator).to("cuda", torch.bfloat16)

    def eager(a, t):
        return torch.einsum("bs,bsd->bd", a, t)
    f, compiled = Recorded(weighted_token_pool), torch.compile(eager)
    return Case("weighted_token_pool", f"B{B} S{S} D{D} (over S)", lambda: f(w, x),
                {TORCH_COMPILE: lambda: compiled(w, x), TORCH_EAGER: lambda: eager(w, x)},
                torch.einsum("bs,bsd->bd", w.double(), x.double()), lambda out: out,
                bytes=x.numel() * 2 + w.numel() * 2 + B * D * 2,
                notes={TENSORFUSE: f.schedule_origin(B=B, S=S, D=D)})


@tf.kernel
def latent_attention_decode(q: T.Tensor["B", "H", "DQ", "bf16"],
                            k: T.Tensor["B", "N", "DQ", "bf16"],
                            v: T.Tensor["B", "N", "DV", "bf16"], scale: T.f32):
    """DeepSeek's absorbed latent attention at decode: every head over one latent cache, q·k
    over 576 and p·v over 512 (past a row tile's block: its features in chunks; its keys split,
    the floor's stages by default, :func:`tensorfuse.schedule_templates.attention.
    chunked_split_refusal`)."""
    b, h, j, d, e = T.axes("b h j d e")
    s = T.sum(q[b, h, d] * k[b, j, d], over=d) * scale
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.cast(T.sum(p * v[b, j, e], over=j) / T.sum(p, over=j), "bf16")


@tf.kernel
def paged_latent_decode(q: T.Tensor["B", "H", "DQ", "bf16"],
                        k_pages: T.Tensor["PAGES", "PAGE", "DQ", "bf16"],
                        v_pages: T.Tensor["PAGES", "PAGE", "DV", "bf16"],
                        table: T.Tensor["B", "NP", "i32"], scale: T.f32):
    """The latent decode over a paged cache: sequence b's key p·PAGE + t is slot t of page
    table[b, p]; the values the first DV features of the same pages (a view)."""
    b, h, p, t, d, e = T.axes("b h p t d e")
    s = T.sum(q[b, h, d] * k_pages[table[b, p], t, d], over=d) * scale
    return T.cast(softmax_attend(s, v_pages[table[b, p], t, e], (p, t)), "bf16")


@tf.kernel
def head_logsumexp(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["V", "K", "bf16"]):
    """A language model head's log-sum-exp over the vocabulary (a fused cross-entropy's first
    half) over 4096 features (past a row tile's: the floor's stages)."""
    i, j, k = T.axes("i j k")
    s = T.sum(x[i, k] * w[j, k], over=k)
    m = T.max(s, over=j)
    return T.cast(m + T.log(T.sum(T.exp(s - m), over=j)), "f32")


def _latent_decode_case(generator, B=8, H=128, N=4096, DQ=576, DV=512) -> Case:
    q = torch.randn(B, H, DQ, generator=generator).to("cuda", torch.bfloat16)
    k = torch.randn(B, N, DQ, generator=generator).to("cuda", torch.bfloat16)
    v = torch.randn(B, N, DV, generator=generator).to("cuda", torch.bfloat16)
    scale = DQ ** -0.5

    def eager(q, k, v):   # the unfused sequence in bf16, softmax in float32
        s = torch.einsum("bhd,bnd->bhn", q, k).float() * scale
        return torch.einsum("bhn,bne->bhe", torch.softmax(s, -1).to(v.dtype), v)
    f, compiled = Recorded(latent_attention_decode), torch.compile(eager)
    s = torch.einsum("bhd,bnd->bhn", q.double(), k.double()) * scale
    ref = torch.einsum("bhn,bne->bhe", torch.softmax(s, -1), v.double())
    # the attention template's one kernel (features in chunks, the keys in 8 parts merged by a
    # kernel of their own), which the defaults leave to the floor's stages
    sch = tf.schedule(latent_attention_decode)
    sch.rolling_update("m", "out_sum", "out_sum_2", axis="j")
    sch.apply_template("attention", tile_m=64, tile_n=32, num_warps=8, num_stages=2, splits=8)
    one = sch.compile()
    return Case("latent_attention_decode", f"B{B} H{H} N{N} DQ{DQ} DV{DV}",
                lambda: f(q, k, v, scale), {TORCH_COMPILE: lambda: compiled(q, k, v),
                                            TORCH_EAGER: lambda: eager(q, k, v),
                                            f"{TENSORFUSE} one kernel": lambda: one(q, k, v, scale)},
                ref, lambda out: out, bytes=(k.numel() + v.numel()) * 2,
                notes={TENSORFUSE: f.schedule_origin(B=B, H=H, N=N, DQ=DQ, DV=DV)})


def _paged_latent_case(generator, B=8, H=128, PAGE=64, NP=64, DQ=576, DV=512) -> Case:
    """Pages of 64 keys in a shuffled pool of twice the pages the batch uses; against the
    unfused sequence on the pages gathered (torch has no paged attention of its own)."""
    pages_used = B * NP
    q = torch.randn(B, H, DQ, generator=generator).to("cuda", torch.bfloat16)
    pages = torch.randn(2 * pages_used, PAGE, DQ, generator=generator).to("cuda", torch.bfloat16)
    table = torch.randperm(2 * pages_used, generator=generator)[:pages_used].reshape(B, NP)
    table = table.to("cuda", torch.int32)
    scale = DQ ** -0.5

    def eager(q, pages, table):
        keys = pages[table.long()].reshape(B, NP * PAGE, DQ)
        s = torch.einsum("bhd,bnd->bhn", q, keys).float() * scale
        return torch.einsum("bhn,bne->bhe", torch.softmax(s, -1).to(q.dtype), keys[..., :DV])
    f, compiled = Recorded(paged_latent_decode), torch.compile(eager)
    keys = pages[table.long()].reshape(B, NP * PAGE, DQ).double()
    s = torch.einsum("bhd,bnd->bhn", q.double(), keys) * scale
    ref = torch.einsum("bhn,bne->bhe", torch.softmax(s, -1), keys[..., :DV])
    sizes = dict(B=B, H=H, DQ=DQ, DV=DV, PAGES=2 * pages_used, PAGE=PAGE, NP=NP)
    return Case("paged_latent_decode", f"B{B} H{H} N{NP * PAGE} pages of {PAGE} DQ{DQ} DV{DV}",
                lambda: f(q, pages, pages[..., :DV], table, scale),
                {TORCH_COMPILE: lambda: compiled(q, pages, table),
                 TORCH_EAGER: lambda: eager(q, pages, table)},
                ref, lambda out: out, bytes=pages_used * PAGE * DQ * 2,
                notes={TENSORFUSE: f.schedule_origin(**sizes)})


def _head_logsumexp_case(generator, M=4096, K=4096, V=32000) -> Case:
    x = (torch.randn(M, K, generator=generator) / 8).to("cuda", torch.bfloat16)
    w = (torch.randn(V, K, generator=generator) / 8).to("cuda", torch.bfloat16)

    def eager(x, w):
        return (x @ w.T).float().logsumexp(-1)
    f, compiled = Recorded(head_logsumexp), torch.compile(eager)
    rows = torch.arange(0, M, 61)
    ref = torch.logsumexp(x[rows].double() @ w.double().T, -1)
    return Case("head_logsumexp", f"M{M} K{K} V{V}", lambda: f(x, w),
                {TORCH_COMPILE: lambda: compiled(x, w), TORCH_EAGER: lambda: eager(x, w)},
                ref, lambda out: out[rows], flops=2 * M * K * V,
                notes={TENSORFUSE: f.schedule_origin(M=M, K=K, V=V)})


UNLISTED = {
    "batch_norm_stats_nchw": _batch_norm_stats_case,
    "max_pool_2x2": _max_pool_case,
    "maxout": _maxout_case,
    "masked_mean_pool": _masked_mean_case,
    "lengths_mean_pool": _lengths_mean_case,
    "causal_conv1d": _causal_conv_case,
    "moe_combine": _moe_combine_case,
    "cosine_similarity": _cosine_case,
    "squared_distances": _squared_distances_case,
    "manhattan_distances": _manhattan_case,
    "gaussian_kernel_sum": _gaussian_sum_case,
    "nearest_neighbour": _nearest_neighbour_case,
    "mean_nearest_distance": _mean_nearest_case,
    "byte_histogram": _histogram_case,
    "expert_positions": _expert_positions_case,
    "kmeans_assign": _kmeans_assign_case,
    "best_match_index": _best_match_index_case,
    "contrastive_normaliser": _contrastive_case,
    "l2_normalize_columns": _l2_columns_case,
    "router_softmax": _router_case,
    "log_softmax_vocab_major": _vocab_major_case,
    "rotary": _rotary_case,
    "biased_attention_bshd": _biased_attention_case,
    "attention_keys_transposed": _keys_transposed_case,
    "attention_channels_first": lambda g: _heads_transposed_case(
        "attention_channels_first", attention_channels_first, ("q", "k", "v", "out"), g),
    "attention_queries_first": lambda g: _heads_transposed_case(
        "attention_queries_first", attention_queries_first, ("q",), g),
    "attention_softmax_then_sum": _softmax_then_sum_case,
    "attention_base_two": _base_two_case,
    "float_masked_attention": _float_mask_case,
    "lm_head_softmax": _lm_head_case,
    "gram_matrix": _gram_case,
    "router_weight_gradient": _router_gradient_case,
    "bilinear_form": _bilinear_case,
    "column_mean": _column_mean_case,
    "weighted_token_pool": _weighted_pool_case,
    "strided_matvec": _strided_matvec_case,
    "rmsnorm_linear": _rmsnorm_linear_case,
    "latent_attention_decode": _latent_decode_case,
    "paged_latent_decode": _paged_latent_case,
    "head_logsumexp": _head_logsumexp_case,
}

if __name__ == "__main__":
    main(UNLISTED, "unlisted-kernels", __doc__)
