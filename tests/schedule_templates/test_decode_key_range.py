"""A decode sweeps only the keys its mask keeps (``schedule_templates.key_range``): bounds read
from device memory (a static cache's length), sliding windows and neighbourhoods, found from the
mask as written and checked here against the mask's own truth; the CUDA C++ compiled for sm_90a;
and on the GPU against float64, also replayed from one CUDA graph while the length grows."""
from __future__ import annotations

import math
import operator

import numpy as np
import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.dsl.expr import (Axis, Binary, Compare, Const, DimSize, Load, Scalar, Unary,
                                 Where)
from tensorfuse.kernels.attention import KV_GROUPED, Q, scores, softmax_attend
from tensorfuse.kernels.reference import reference
from tensorfuse.schedule_templates.decode_plan import plan_decode
from tests.helpers import fresh_seed, needs_nvcc

N, M = 50, 1


def _masked(condition):
    """A GQA decode whose score is masked by ``condition(b, i, j, length, window)``."""
    @tf.kernel
    def masked(q: Q, k: KV_GROUPED, v: KV_GROUPED, length: T.Tensor["B", "i32"], scale: T.f32,
               window: T.i32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        hk = h // (T.size("H") // T.size("HKV"))
        s = scores(q, k, b, h, hk, i, j, d, scale)
        s = T.where(condition(b, i, j, length, window), s, -T.inf)
        return softmax_attend(s, v[b, hk, j, e], j)
    return masked


def _end(i):   # the query's key position, bottom-right aligned
    return i + T.size("N") - T.size("M")


# (the mask, the same mask in NumPy over (j, length, window) for the one query (i = 0), whether
# the bounds take all of it, some of it, or none of it)
MASKS = {
    "below_length": (lambda b, i, j, n, w: j < n[b], lambda j, n, w: j < n, "all"),
    "up_to_last": (lambda b, i, j, n, w: j <= n[b] - T.size("M") + i,
                   lambda j, n, w: j <= n - 1, "all"),
    "length_above": (lambda b, i, j, n, w: n[b] > j, lambda j, n, w: j < n, "all"),
    "two_past": (lambda b, i, j, n, w: j + 2 <= n[b], lambda j, n, w: j + 2 <= n, "all"),
    "sliding": (lambda b, i, j, n, w: (_end(i) >= j) & (_end(i) - j < w),
                lambda j, n, w: (N - 1 >= j) & (N - 1 - j < w), "all"),
    "window_before_length": (lambda b, i, j, n, w: (j < n[b]) & (j >= n[b] - w),
                             lambda j, n, w: (j < n) & (j >= n - w), "all"),
    "near_length": (lambda b, i, j, n, w: abs(j - n[b]) <= w,
                    lambda j, n, w: np.abs(j - n) <= w, "all"),
    "near_end_strict": (lambda b, i, j, n, w: w > abs(_end(i) - j),
                        lambda j, n, w: np.abs(N - 1 - j) < w, "all"),
    "one_key": (lambda b, i, j, n, w: j == n[b] - 1, lambda j, n, w: j == n - 1, "all"),
    "from_window": (lambda b, i, j, n, w: j >= w, lambda j, n, w: j >= w, "all"),
    "bound_and_stride": (lambda b, i, j, n, w: (j < n[b]) & (j % 3 != 1),
                         lambda j, n, w: (j < n) & (j % 3 != 1), "some"),
    "twice_j": (lambda b, i, j, n, w: 2 * j < n[b], lambda j, n, w: 2 * j < n, "none"),
    "either": (lambda b, i, j, n, w: (j < n[b]) | (j < w), lambda j, n, w: (j < n) | (j < w),
               "none"),
    "halved": (lambda b, i, j, n, w: (j < (n[b] - w) // 2) & (j < n[b]),
               lambda j, n, w: (j < (n - w) // 2) & (j < n), "all"),
}

_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
           "floordiv": operator.floordiv, "mod": operator.mod, "and": operator.and_,
           "or": operator.or_}
_COMPARE = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
            "eq": operator.eq, "ne": operator.ne}


def _value(e, env):
    """The integer or boolean ``e`` at ``env`` (axes, sizes, scalars and tensors by name): a
    reading of the expression nodes written for this test."""
    if isinstance(e, (Axis, DimSize, Scalar)):
        return env[e.name]
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Load):
        return env[e.param.name][tuple(int(_value(x, env)) for x in e.indices)]
    if isinstance(e, Binary):
        return _BINARY[e.op](_value(e.a, env), _value(e.b, env))
    if isinstance(e, Compare):
        return _COMPARE[e.op](_value(e.a, env), _value(e.b, env))
    if isinstance(e, Unary):
        return {"neg": operator.neg, "abs": abs, "not": operator.not_}[e.op](_value(e.a, env))
    raise AssertionError(f"unexpected node {e!r}")


@pytest.mark.parametrize("name", list(MASKS))
def test_the_swept_keys_are_the_keys_the_mask_keeps(name):
    """For lengths below, inside and past the keys and windows of several widths, the keys the
    kernel sweeps (between the largest lower and the smallest upper bound, clamped into the
    keys) that the rest of the mask keeps are exactly those the whole mask keeps; and the
    bounds take the part of the mask they should."""
    condition, numpy_mask, taken = MASKS[name]
    plan = plan_decode(_masked(condition).program, ("m", "l", "o"), "j")
    assert plan.lower + plan.upper or taken == "none"
    rest = plan.score.cond if isinstance(plan.score, Where) else None
    assert (rest is None) == (taken == "all")
    assert bool(plan.lower + plan.upper) == (taken != "none")
    b_axis, _, i_axis, j_axis = plan.axes
    for length in (-3, 0, 1, 7, 31, 49, 50, 64):
        for window in (0, 1, 5, 60):
            env = {"length": np.array([length, 0]), "window": window, "N": N, "M": M,
                   b_axis.name: 0, i_axis.name: 0}
            low = max([0] + [int(_value(x, env)) for x in plan.lower])
            high = min([N] + [int(_value(x, env)) for x in plan.upper])
            swept = set(range(low, high))
            kept = {j for j in swept if rest is None or _value(rest, {**env, j_axis.name: j})}
            want = {j for j in range(N) if numpy_mask(j, length, window)}
            assert kept == want, (length, window, sorted(kept ^ want))


def test_a_bound_on_a_query_head_or_on_float_values_stays_in_the_score():
    """Bounds the kernel cannot evaluate once per (batch, kv-head) — one that varies with the
    query head, one over a float scalar — are left to the score, element by element."""
    @tf.kernel
    def per_head(q: Q, k: KV_GROUPED, v: KV_GROUPED, length: T.Tensor["B", "H", "i32"],
                 scale: T.f32, cut: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        hk = h // (T.size("H") // T.size("HKV"))
        s = scores(q, k, b, h, hk, i, j, d, scale)
        s = T.where((j < length[b, h]) & (j < cut), s, -T.inf)
        return softmax_attend(s, v[b, hk, j, e], j)

    plan = plan_decode(per_head.program, ("m", "l", "o"), "j")
    assert plan.lower == plan.upper == ()
    assert isinstance(plan.score, Where)
    assert plan.tensors == (("length", "i32"),)


def _decode(kernel, **knobs):
    sch = tf.schedule(kernel, target="cuda:sm_90a")
    sch.rolling_update("m", "l", "o", axis="j")
    sch.cluster_distribute("j", **knobs)
    return sch.compile()


DECODE = dict(B=2, H=8, HKV=2, M=1, N=1000, D=128)


def test_a_static_cache_decode_reads_its_length_once_per_pair_and_not_per_key():
    """The static cache's length is a kernel argument read once per (batch, kv-head) to bound
    the sweep; the score no longer tests it; one source serves every capacity; the plan says
    which keys it sweeps."""
    made = _decode(K.static_cache_attention)
    source = made.source(**DECODE)
    assert "const int* __restrict__ t_length" in source
    assert "j_high = min(N_, (int)(" in source and "t_length[(b)]" in source
    sweep = source[source.index("const int j_begin"):]
    assert "t_length" not in sweep   # not in the score
    assert made.source(**{**DECODE, "N": 4097}) == source
    assert "keys 0 ≤ j < length[b] - T.size('M') + i + 1 of N" in made.describe_plan(**DECODE)


def test_a_sliding_window_decode_sweeps_only_its_window():
    made = _decode(K.sliding_window_attention)
    source = made.source(**{k: v for k, v in DECODE.items() if k != "HKV"})
    assert "const int j_low = max(0, (int)(" in source and "window" in source.split("j_low")[1]


@needs_nvcc
def test_a_document_decode_reads_the_ids_in_its_score():
    """A mask that is no bound on the keys but reads a tensor (document ids) is evaluated per
    key in the score, the tensor a kernel argument."""
    made = _decode(K.document_attention)
    sizes = {k: v for k, v in DECODE.items() if k != "HKV"}
    source = made.source(**sizes)
    assert "const int* __restrict__ t_doc" in source and "j_low" not in source
    assert "t_doc[" in source[source.index("const int j_begin"):]
    assert "ld.global" in made.ptx(**sizes)


@needs_nvcc
@pytest.mark.parametrize("D, knobs", [(128, {}), (256, {}), (256, {"copy": "cp.async"}),
                                      (256, {"mma": "fma"})])
def test_static_cache_decode_compiles_without_spills_for_sm_90a(D, knobs, tmp_path):
    """Through every sweep and copy, at D = 256 where the tensor-core sweep keeps 255 registers
    (D = 64 and 128 have room: checked once); with bulk copies the value rows past the length
    are zeroed in a warp's last block (a static cache may hold anything there)."""
    from tests.schedule_templates.test_cluster import _assert_no_spills, _ptxas_report

    knobs = {**knobs, **({"warps": 1} if D == 256 and not knobs else {})}
    made = _decode(K.static_cache_attention, **knobs)
    source = made.source(**{**DECODE, "D": D})
    assert ("the warp's last block" in source) == (knobs.get("copy", "tma") == "tma" and
                                                   knobs.get("mma") != "fma")
    _assert_no_spills(_ptxas_report(source, tmp_path), "tf_decode_cluster")


def _static_inputs(torch, B, H, HKV, N, D, lengths, gen, device="cpu"):
    q = torch.randn(B, H, 1, D, generator=gen).to(device, torch.bfloat16)
    k = (torch.randn(B, HKV, N, D, generator=gen) * 3).to(device, torch.bfloat16)
    v = torch.randn(B, HKV, N, D, generator=gen).to(device, torch.bfloat16)
    length = torch.tensor(lengths, dtype=torch.int32, device=device)
    return q, k, v, length


def _want(q, k, v, length, scale):
    arrays = [x.double().cpu().numpy() for x in (q, k, v)]
    return reference(K.static_cache_attention, dict(zip("qkv", arrays),
                                                     length=length.cpu().numpy()),
                     {"scale": scale})


def test_static_cache_attention_matches_float64_on_the_cpu():
    """The library kernel as written (the DSL on the CPU target) against its float64 reference:
    lengths inside, at and past the cache, decode and three queries."""
    import torch

    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    for m in (1, 3):
        q, k, v, length = _static_inputs(torch, 3, 4, 2, 40, 16, [17, 40, 55], gen)
        q = torch.randn(3, 4, m, 16, generator=gen).to(torch.bfloat16)
        out = tf.compile(K.static_cache_attention, target="cpu")(q, k, v, length, scale=0.25)
        want = _want(q, k, v, length, 0.25)
        err = np.linalg.norm(out.double().numpy() - want) / np.linalg.norm(want)
        assert err < 1e-2, (m, err, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("D, knobs, H", [(128, {}, 8), (64, {"copy": "cp.async"}, 8),
                                         (256, {}, 8), (128, {"mma": "fma"}, 8),
                                         (128, {"cluster": 16}, 8), (128, {}, 128),
                                         (64, {"warps": 3}, 96)])
def test_static_cache_decode_matches_float64_on_the_gpu(D, knobs, H):
    """Per-sequence lengths in the middle of a block, of one key, past the capacity and of
    none (a row with no keys: NaN, as the math gives); the slots past each length hold NaN,
    which must not reach the output (with 64 or 48 heads per kv-head, teams of warps zero a
    shared block's tail together); the output is poisoned first."""
    import torch

    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    B, HKV, N = 5, 2, 2777
    lengths = [2001, 1, N + 40, 0, 1000]
    q, k, v, length = _static_inputs(torch, B, H, HKV, N, D, lengths, gen, "cuda")
    scale = 1 / math.sqrt(D)
    want = _want(q, k, v, length, scale)
    for b, n in enumerate(lengths):   # what the cache holds past a sequence's length
        k[b, :, max(n, 0):] = float("nan")
        v[b, :, max(n, 0):] = float("nan")
    out = torch.full_like(q, 7.0)
    made = _decode(K.static_cache_attention, **knobs) if knobs else \
        tf.compile(K.static_cache_attention, "cuda")
    made(q, k, v, length, scale=scale, out=out)
    got = out.double().cpu().numpy()
    assert np.isnan(got[3]).all() and np.isnan(want[3]).all()
    rows = [0, 1, 2, 4]
    err = np.linalg.norm(got[rows] - want[rows]) / np.linalg.norm(want[rows])
    assert err < 1e-2, (err, seed)


@pytest.mark.gpu
def test_one_captured_decode_step_replays_while_the_cache_fills():
    """A decode step — write the new key and value at the length, advance the length, attend —
    captured once in a CUDA graph and replayed 40 times: every step's output matches float64 at
    that step's length, with no host work between replays."""
    import torch

    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    B, H, HKV, N, D, start, steps = 2, 16, 4, 4096, 128, 1000, 40
    q, k, v, length = _static_inputs(torch, B, H, HKV, N, D, [start, start + 37], gen, "cuda")
    new_k = torch.randn(steps, B, HKV, D, generator=gen).to("cuda", torch.bfloat16)
    new_v = torch.randn(steps, B, HKV, D, generator=gen).to("cuda", torch.bfloat16)
    step = torch.zeros(1, dtype=torch.int64, device="cuda")   # not 0-d: indexing by one syncs
    made = tf.compile(K.static_cache_attention, "cuda")
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(D)
    batch = torch.arange(B, device="cuda")

    def decode_step():
        k[batch, :, length.long()] = new_k[step][0]
        v[batch, :, length.long()] = new_v[step][0]
        length.add_(1)
        step.add_(1)
        made(q, k, v, length, scale=scale, out=out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm up (builds, tensor maps) outside the capture
        decode_step()
    torch.cuda.current_stream().wait_stream(side)
    length -= 1
    step.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):   # recorded, not run
        decode_step()
    for s in range(steps):
        out.fill_(float("nan"))
        graph.replay()
        want = _want(q, k, v, length, scale)
        got = out.double().cpu().numpy()
        assert length.tolist() == [start + s + 1, start + 38 + s]
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 1e-2, (s, err, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name, scalars", [("sliding_window_attention", {"window": 700}),
                                           ("neighborhood_attention", {"radius": 300}),
                                           ("document_attention", {})])
def test_masked_decodes_match_float64_on_the_gpu(name, scalars):
    """Sliding windows and neighbourhoods sweep their bounds; document masks read the ids in
    the score: each against its float64 reference."""
    import torch

    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    B, H, N, D = 2, 8, 3001, 128
    kernel = getattr(K, name)
    q = torch.randn(B, H, 1, D, generator=gen).to("cuda", torch.bfloat16)
    k, v = (torch.randn(B, H, N, D, generator=gen).to("cuda", torch.bfloat16) for _ in "kv")
    args = {"q": q, "k": k, "v": v}
    if name == "document_attention":
        args["doc"] = torch.cumsum(torch.rand(B, N, generator=gen) < 0.002, 1).to(
            "cuda", torch.int32)
    scale = 1 / math.sqrt(D)
    made = tf.compile(kernel, "cuda")
    assert "cluster_decode" in made.schedule_origin(B=B, H=H, M=1, N=N, D=D)
    out = torch.full_like(q, float("nan"))
    made(**args, scale=scale, **scalars, out=out)
    arrays = {n: (x.double() if x.is_floating_point() else x).cpu().numpy()
              for n, x in args.items()}
    want = reference(kernel, arrays, {"scale": scale, **scalars})
    err = np.linalg.norm(out.double().cpu().numpy() - want) / np.linalg.norm(want)
    assert err < 1e-2, (err, seed)
