"""The cluster-decode template plan: one query token's rolled attention chain with its keys split
over a thread-block cluster per (batch, kv-head), as data (the CUDA C++:
:mod:`tensorfuse.targets.cuda.cluster_decode`).

:func:`plan_decode` checks that the rolled chain is exactly softmax-weighted attention with the
layouts the kernel indexes and reads its pieces; :func:`check_decode` refuses sizes and knobs the
kernel cannot run.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..dsl.expr import Expr
from ..dsl.printer import to_text
from ..dsl.program import Program
from ..errors import ScheduleError
from ..targets.cuda.cluster_decode import bound_code, head_tiles, score_code
from .attention_chain import AttentionChain, check_head_map, recognise_attention
from .key_range import key_range, reads_tensors


@dataclass(frozen=True)
class DecodePlan(AttentionChain):
    """The recognised chain, as the cluster-decode kernel runs it: the keys it sweeps per
    (batch, kv-head) are ``max(lower…) ≤ j < min(upper…)`` within the key tensor
    (:mod:`.key_range`: the mask's bounds on the keys, evaluated once per pair; ``score`` is
    what is left of the mask), and ``tensors`` (name, dtype) are those the bounds and the score
    read besides q, k and v."""

    lower: tuple[Expr, ...] = ()
    upper: tuple[Expr, ...] = ()
    tensors: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        b, h, hkv, m, n, d = self.dims
        keys = f"keys {n}"
        if self.lower or self.upper:
            low, high = (", ".join(to_text(x) for x in side) for side in (self.lower,
                                                                           self.upper))
            low = f"max({low})" if len(self.lower) > 1 else low or "0"
            high = f"min({high})" if len(self.upper) > 1 else high or n
            keys = (f"keys {low} ≤ {self.axes[3].name} < {high} of {n} (the mask's bounds, "
                    "read once per (batch, kv-head))")
        return "\n".join([
            f"cluster-decode plan: {self.out}[{b}, {h}, {m}, {d}] from {self.q}, {self.k}, "
            f"{self.v} ({hkv} kv-heads)",
            f"  score: {to_text(self.score)} ({self.dot}: q·k on tensor cores or CUDA cores)",
            f"  {keys} split over a cluster per (batch, kv-head); softmax states merged in "
            "distributed shared memory with exp(m_part - m)"])


MAX_STAGES = 8   # blocks of 32 keys a warp keeps in shared memory (16 KB each at D = 128)


@dataclass(frozen=True)
class DecodeKnobs:
    """``cluster`` CTAs per (batch, kv-head); ``warps`` per CTA, each sweeping blocks of 32 keys
    with ``stages`` blocks in its shared memory; ``mma``: the group's q·k and p·v on tensor cores
    (``"mma_sync"``, 16 heads a warp: a larger group shares each block between a team of warps)
    or CUDA cores (``"fma"``); ``copy``: how a warp
    stages its blocks — bulk tensor copies (``"tma"``, tensor-core sweep only) or 16-byte
    ``cp.async`` copies by every lane (``"cp.async"``); ``splits``: at most this many clusters
    per (batch, kv-head), each sweeping a part of its keys, merged by the last to finish (a
    launch takes as many as give each warp two blocks of keys: :func:`splits_for`)."""

    cluster: int = 8
    warps: int = 2
    stages: int = 2
    mma: str = "mma_sync"
    copy: str = "tma"
    splits: int = 1

    def __str__(self) -> str:
        return (f"cluster={self.cluster}, warps={self.warps}, stages={self.stages}, "
                f"mma={self.mma}, copy={self.copy}, splits={self.splits}")


# Where ``tf.compile`` runs a decode on the cluster kernel rather than the split update (the
# Triton decode kernel), by (batch × kv-head) pairs and the bytes of the cache, from the H200's
# dense grid (``benchmarks.decode_grid --routes``, bf16, 1k–131k keys, 1–2048 pairs, both forced
# side by side): the split update 1.00–1.10× the cluster kernel from 32 pairs on, and with few
# pairs over a cache past 256 MB (B1 H32/8 at 131k keys: 135 µs against 150); the cluster kernel
# ahead with few pairs over smaller caches (B1 H8/1 at 131k keys: 35 µs against 51). At 128–512
# pairs the split update runs its row tiles unsplit over 128-key blocks
# (``benchmarks.decode_knobs --only grid``: B8 32/32 at 4k keys 0.122 ms, the cluster kernel's
# best knobs 0.129; B64 32/8 0.241 against 0.260).
SPLIT_UPDATE_PAIRS = 32
LARGE_CACHE = 256 << 20   # bytes


def cluster_decode_pays(pairs: int, cache_bytes: int) -> bool:
    """Whether the cluster decode is ``tf.compile``'s choice over the split update for
    ``pairs`` (batch × kv-head) sweeps of a cache of ``cache_bytes`` (keys and values)."""
    return pairs < SPLIT_UPDATE_PAIRS and cache_bytes < LARGE_CACHE


# Clusters per pair past which another one must give every warp of it LONG_SHARE blocks of 32
# keys: one pair of 8 query heads on the H200 (``benchmarks.decode_splits``, clusters of 16 of
# 4 warps): 16k keys 14.0 µs in 4 clusters, 14.9 in 2; 32k keys 17.3 µs in 4, 18.3 in the 7
# the GPU holds (cuDNN 18.1); 131k keys 34.9 in 7, 35.9 in 4 (cuDNN 64.8)
FEW_SPLITS, LONG_SHARE = 4, 8


def splits_for(knobs: DecodeKnobs, keys: int, chosen: bool = False) -> int:
    """The clusters per pair a launch over ``keys`` keys takes: ``knobs.splits`` at most, and no
    more than give every warp of every CTA two blocks of 32 keys — a few keys gain less from
    another cluster than its merge through L2 costs (one pair, 16k keys: 4 clusters of 16
    beat 8; ``benchmarks.decode_splits``) —; where the defaults ``chosen`` the splits (the
    clusters the GPU holds), no more than :data:`FEW_SPLITS` unless each warp then gets
    :data:`LONG_SHARE` blocks (splits given or tuned are taken up to the two blocks)."""
    warp_blocks = keys // (knobs.cluster * knobs.warps * 32)
    most = warp_blocks // 2
    if chosen and knobs.splits > FEW_SPLITS:
        most = max(min(most, FEW_SPLITS), warp_blocks // LONG_SHARE)
    return max(1, min(knobs.splits, most))


WHO = "cluster_distribute (attention)"
COPIES = ("tma", "cp.async")   # the ``copy`` knob's values; tuning samples and records the index


def knobs_of_setting(values: dict) -> dict:
    """The template's knobs of a tuning setting or record (``copy`` given by its index in
    :data:`COPIES`)."""
    return {**values, "copy": COPIES[int(values["copy"])]} if "copy" in values else dict(values)


def _refuse(message: str, loc=None) -> ScheduleError:
    return ScheduleError(f"{WHO}: {message}", loc)


def plan_decode(program: Program, names: tuple[str, ...], axis: str) -> DecodePlan:
    """Check that the rolled chain is exactly softmax-weighted attention
    (:func:`.attention_chain.recognise_attention`) in bf16 or fp16 (the output also float32)
    with a score the kernel can
    write, and read its pieces: the mask's bounds on the keys (:mod:`.key_range`) apart from
    the rest of the score. Anything else is refused: the kernel's merge hard-codes this chain's
    correction ``exp(m_part - m)``."""
    chain = recognise_attention(program, names, axis, WHO, dtypes=("bf16", "f16"),
                                float32_output=True)
    q, k, v, out = chain.layouts[:4]
    if k != v or sorted(k) != sorted("bhjd") or k[-1] != "d" or \
            {q.replace("i", ""), out.replace("i", "")} != {"bhd"}:
        # one query token: where the query axis sits in q and the output does not move them;
        # the caches in any order of batch, kv-head and keys ([B, HKV, N, D] as transformers
        # keeps them, [B, N, HKV, D] as FlashAttention's kv-cache), addressed by their strides
        raise _refuse(f"cluster decode reads k and v in one order of batch, kv-head and keys "
                      f"with the head dim innermost, and q and the output with the head dim "
                      f"innermost after the head (the layouts by role here: q {q}, k {k}, v {v}, "
                      f"output {out}); the attention template's split update takes the others")
    plan = DecodePlan(**{f.name: getattr(chain, f.name) for f in fields(chain)})
    b, _, i, j = chain.axes
    keys = key_range(chain.score, j, (b, i))
    read = reads_tensors(keys.score)
    for bound in keys.lower + keys.upper:
        read += tuple(t for t in reads_tensors(bound) if t not in read)
    plan = replace(plan, score=keys.score, lower=keys.lower, upper=keys.upper, tensors=read)
    score_code(plan)   # what the kernel cannot write is refused now, not at the first call
    bound_code(plan)
    return plan


def check_decode(plan: DecodePlan, knobs: DecodeKnobs, sizes: dict) -> None:
    """Refuse sizes and knobs the decode kernel cannot run, saying which."""
    B, H, HKV, M, N, D = (sizes[d] for d in plan.dims)
    if M != 1:
        raise _refuse(f"cluster decode is for one query token (M=1), got M={M}; prefill uses the "
                      "attention template")
    if D not in (64, 128, 256):
        raise _refuse(f"head dim D={D}: cluster decode handles 64, 128 and 256")
    if H % HKV:
        raise _refuse(f"H={H} query heads do not share HKV={HKV} kv-heads evenly")
    G = H // HKV
    check_head_map(plan, sizes, H, G, WHO)
    C, W = knobs.cluster, knobs.warps
    if not 1 <= C <= 16:
        raise _refuse(f"cluster={C}: a cluster has 1 to 16 CTAs (over 8 with the non-portable "
                      "size, which the H100 allows)")
    if not 1 <= W <= 16:
        raise _refuse(f"warps={W}: a CTA has 1 to 16 warps")
    if not 1 <= knobs.splits <= 256:
        raise _refuse(f"splits={knobs.splits}: 1 to 256 clusters per (batch, kv-head) pair")
    if not 2 <= knobs.stages <= MAX_STAGES:
        raise _refuse(f"stages={knobs.stages} is not 2 to {MAX_STAGES} (blocks of 32 keys per "
                      "warp in shared memory, stages − 1 of them in flight)")
    if knobs.mma not in ("mma_sync", "fma"):
        raise _refuse(f"mma={knobs.mma!r} is not 'mma_sync' (tensor cores) or 'fma' (CUDA cores)")
    if knobs.copy not in ("tma", "cp.async"):
        raise _refuse(f"copy={knobs.copy!r} is not 'tma' (bulk tensor copies) or 'cp.async'")
    if knobs.copy == "tma" and knobs.mma != "mma_sync":
        raise _refuse("copy='tma' stages blocks in the 128-byte swizzle that the tensor-core "
                      "sweep reads; the CUDA-core sweep (mma='fma') uses copy='cp.async'")
    tiles = head_tiles(knobs, G)
    if tiles > 1:
        if tiles > 8:
            raise _refuse(f"mma='mma_sync' takes up to 128 query heads per kv-head (8 tiles of 16 "
                          f"rows, a warp each); this group has {G}: use mma='fma'")
        if W % tiles:
            raise _refuse(f"warps={W}: a group of {G} heads takes {tiles} warps per block of keys "
                          f"(16 heads a warp), so warps must be a multiple of {tiles}")
        if knobs.copy != "tma":
            raise _refuse(f"a group of {G} heads shares each block between {tiles} warps, which "
                          "wait on its bulk copy: copy='tma'")
