"""Attention variants: tensorfuse against PyTorch SDPA (cuDNN, FlashAttention) and FlexAttention
under torch.compile, in one process on one GPU. Every implementation is checked against a float64
reference on a slice of query rows before it is timed; FLOPs count the unmasked fraction only."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from benchmarks.common import Row, bench, bench_graph, relative_error

D = 128
WINDOW = PREFIX = 1024
RADIUS = 512
CAP = 50.0
CHAIN = ("m", "l", "o")


def variants(S: int, B: int = 2, H: int = 16, window: int = WINDOW, prefix: int = PREFIX,
             radius: int = RADIUS):
    """name → (tensorfuse kernel, extra args, flex score_mod, flex mask_mod, sdpa kwargs, q heads,
    kv heads); the masks' scalars (``window``, ``prefix``, ``radius``) as given."""
    slope = lambda h, heads: torch.exp2(-8.0 * (h + 1) / heads)  # noqa: E731
    causal = lambda b, h, q, kv: q >= kv  # noqa: E731
    hg = 32 if H == 16 else H   # GQA: 32 query heads on 8 kv-heads at the default H
    return {
        "full": (K.attention, {}, None, None, dict(is_causal=False), H, H),
        "causal": (K.causal_attention, {}, None, causal, dict(is_causal=True), H, H),
        "alibi": (K.alibi_attention, {}, lambda s, b, h, q, kv: s + slope(h, H) * (kv - q), None,
                  None, H, H),
        "softcap": (K.softcap_attention, {"cap": CAP},
                    lambda s, b, h, q, kv: CAP * torch.tanh(s / CAP), causal, None, H, H),
        "sliding_window": (K.sliding_window_attention, {"window": window}, None,
                           lambda b, h, q, kv: (q >= kv) & (q - kv < window), None, H, H),
        "prefix_lm": (K.prefix_lm_attention, {"prefix": prefix}, None,
                      lambda b, h, q, kv: (q >= kv) | (kv < prefix), None, H, H),
        "document": (K.document_attention, {}, None, "document", None, H, H),
        "gqa_causal": (K.gqa_causal_attention, {}, None, causal, dict(is_causal=True,
                                                                      enable_gqa=True), hg, 8),
        "neighborhood": (K.neighborhood_attention, {"radius": radius}, None,
                         lambda b, h, q, kv: (q - kv).abs() <= radius, None, H, H),
    }


def documents(B: int, S: int, generator) -> torch.Tensor:
    """4 documents of random lengths per batch row (ids increasing along the sequence)."""
    doc = torch.empty(B, S, dtype=torch.int32, device="cuda")
    for b in range(B):
        cuts = torch.sort(torch.randperm(S - 1, generator=generator)[:3] + 1).values
        doc[b] = torch.bucketize(torch.arange(S), cuts, right=True).to(torch.int32).cuda()
    return doc


def with_documents(extra: dict, mask_mod, B: int, S: int, gen) -> tuple[dict, object]:
    """The variant's arguments and mask function, the ``"document"`` mask made concrete: random
    document ids (:func:`documents`) as the kernel's ``doc`` argument, and the mask of FlexAttention
    that compares them (per batch row)."""
    if mask_mod != "document":
        return dict(extra), mask_mod
    doc = documents(B, S, gen)
    mask_mod = lambda b, h, qq, kv, doc=doc: doc[b, qq] == doc[b, kv]  # noqa: E731
    mask_mod.per_batch = True
    return {**extra, "doc": doc}, mask_mod


def mask_block(mask_mod, B: int, S: int):
    """FlexAttention's block mask of ``mask_mod`` at S × S (one per batch row for a per-batch
    mask such as documents'), or None without a mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    if mask_mod is None:
        return None
    per_batch = getattr(mask_mod, "per_batch", False)
    return create_block_mask(mask_mod, B if per_batch else None, None, S, S, device="cuda")


def density(mask_mod, B, H, S) -> float:
    if mask_mod is None:
        return 1.0
    q = torch.arange(S, device="cuda").view(-1, 1)
    total = 0
    for b in range(B if getattr(mask_mod, "per_batch", False) else 1):
        for r0 in range(0, S, 2048):
            kv = torch.arange(S, device="cuda").view(1, -1)
            total += int(mask_mod(b, 0, q[r0:r0 + 2048], kv).sum())
    batches = B if getattr(mask_mod, "per_batch", False) else 1
    return total / (batches * S * S)


def reference(q, k, v, scale, score_mod, mask_mod, rows=None) -> torch.Tensor:
    """float64 attention of the query rows ``rows`` (default all; all heads) from the same mods,
    masks aligned to the bottom right (query i sits at key i + N - M, as in the library)."""
    M, N = q.shape[2], k.shape[2]
    rows = torch.arange(M, device=q.device) if rows is None else rows.to(q.device)
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1).double()
    v = v.repeat_interleave(groups, dim=1).double()
    s = q[:, :, rows].double() @ k.transpose(-1, -2) * scale
    B, H = s.shape[:2]
    b = torch.arange(B, device=q.device).view(B, 1, 1, 1)
    h = torch.arange(H, device=q.device).view(1, H, 1, 1)
    qi = rows.view(1, 1, -1, 1) + (N - M)
    kv = torch.arange(N, device=q.device).view(1, 1, 1, N)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, kv)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, kv), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


@dataclass
class Case:
    """One variant's inputs at one size, its density and the rows every implementation is
    checked on (against ``ref``, float64)."""

    name: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float
    args: dict          # the tensorfuse kernel's other arguments (scalars, document ids)
    score_mod: object
    mask_mod: object
    sdpa: dict | None
    density: float
    flops: float
    shape: str
    rows: torch.Tensor
    ref: torch.Tensor

    def row(self, impl: str, ms: float, note: str, ceiling: float) -> Row:
        tflops = self.flops / ms / 1e9
        return Row(f"attention/{self.name}", self.shape, impl, ms, tflops, 0.0, tflops / ceiling,
                   note + f"; density {self.density:.3f}")


def make_case(name: str, spec: tuple, S: int, gen, check_rows: int = 128, B: int = 2,
              dtype: torch.dtype = torch.bfloat16) -> Case:
    """Random inputs (bf16 unless ``dtype``) for variant ``name`` (``spec`` from
    :func:`variants`) at S = M = N."""
    kernel, extra, score_mod, mask_mod, sdpa, hq, hkv = spec
    q = torch.randn(B, hq, S, D, device="cuda", dtype=dtype)
    k = torch.randn(B, hkv, S, D, device="cuda", dtype=dtype)
    v = torch.randn(B, hkv, S, D, device="cuda", dtype=dtype)
    scale = 1.0 / math.sqrt(D)
    args, mask_mod = with_documents(extra, mask_mod, B, S, gen)
    dens = density(mask_mod, B, hq, S)
    rows = torch.cat([torch.arange(0, check_rows), torch.arange(S - check_rows, S)]).cuda()
    return Case(name, q, k, v, scale, args, score_mod, mask_mod, sdpa, dens,
                4 * B * hq * S * S * D * dens, f"B{B} Hq{hq} Hkv{hkv} S{S} D{D}", rows,
                reference(q, k, v, scale, score_mod, mask_mod, rows))


def checked_output(fn, ref: torch.Tensor, label: str, log=print, pick=lambda out: out,
                   tolerance: float = 2e-2, timing=bench):
    """``(timing(fn), error)`` when ``pick(fn())`` is within ``tolerance`` of ``ref`` (float64)
    before and after the timed calls — a kernel that keeps state between calls (counters,
    caches) must stay right —; None (and a line in the log) when it is wrong or fails."""
    try:
        err = 0.0
        for when in ("before", "after"):
            if when == "after":
                timed = timing(fn)
            err = max(err, relative_error(pick(fn()).double(), ref))
            if err > tolerance:
                log(f"  {label}: WRONG {when} timing (error {err:.2e})")
                return None
        return timed, err
    except Exception as exc:  # noqa: BLE001 - report and go on
        log(f"  {label}: {type(exc).__name__}: {exc}"[:400])
        return None


def checked(case: Case, label: str, fn, log=print, timing=bench) -> tuple[float, str] | None:
    """``(ms, note)`` for ``fn`` checked on the case's rows (:func:`checked_output`), timed by
    ``timing``."""
    made = checked_output(fn, case.ref, f"{label} {case.name} {case.shape}", log,
                          pick=lambda out: out[:, :, case.rows], timing=timing)
    return None if made is None else (made[0], f"err {made[1]:.1e}")


def compiled_flex():
    """FlexAttention under torch.compile, allowed one compiled kernel per variant and size."""
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.accumulated_recompile_limit = 4096
    return torch.compile(flex_attention, dynamic=False)


def sdpa_call(case: Case, backend):
    """The case through ``torch.nn.functional.scaled_dot_product_attention`` on ``backend`` (an
    ``SDPBackend``), as a callable (the case must have SDPA arguments)."""
    from torch.nn.attention import sdpa_kernel

    def run():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(
                case.q, case.k, case.v, scale=case.scale, **case.sdpa)
    return run


def flex_call(case: Case, flex):
    """The case through FlexAttention (``flex``: :func:`compiled_flex`) with its score modification
    and block mask (made here), as a callable."""
    q, k, v, scale = case.q, case.k, case.v, case.scale
    bm = mask_block(case.mask_mod, q.shape[0], q.shape[2])

    def call():
        return flex(q, k, v, score_mod=case.score_mod, block_mask=bm, scale=scale,
                    enable_gqa=q.shape[1] != k.shape[1])
    return call


def baselines(case: Case, flex, log=print, graph: bool = False) -> dict:
    """FlexAttention (``flex``: flex_attention under torch.compile) with the case's block mask, and
    SDPA's cuDNN and FlashAttention backends where the variant is expressible: label → (ms, note).
    ``graph``: FlexAttention also replayed from a CUDA graph (``flex_attention_graph``: GPU time
    without the host's)."""
    from torch.nn.attention import SDPBackend

    found = {}
    try:
        call = flex_call(case, flex)
        made = checked(case, "flex", call, log)
        if made:
            found["flex_attention"] = made
        made = checked(case, "flex", call, log, timing=bench_graph) if graph else None
        if made:
            found["flex_attention_graph"] = made
    except Exception as exc:  # noqa: BLE001 - the block mask itself can fail
        log(f"  flex {case.name} {case.shape}: {type(exc).__name__}: {exc}"[:300])
    for backend, label in ((SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn"),
                           (SDPBackend.FLASH_ATTENTION, "sdpa_flash")):
        if case.sdpa is None:
            break
        made = checked(case, label, sdpa_call(case, backend), log)
        if made:
            found[label] = made
    return found


def tuned_kernel(kernel, sizes: dict):
    """``tf.compile(kernel)`` when the database holds a tuned record at these sizes, else None."""
    compiled = tf.compile(kernel, "cuda")
    dims = {k: v for k, v in sizes.items() if k in kernel.program.dim_names()}
    if compiled.schedule_origin(**dims).startswith("tuned record"):
        return compiled
    return None


def tensorfuse_attention(kernel, knobs):
    sch = tf.schedule(kernel, "cuda")
    sch.rolling_update(*CHAIN, axis="j")
    sch.apply_template("attention", **knobs)
    return sch.compile()


KNOB_SWEEP = [dict(tile_m=128, tile_n=128, num_warps=8, num_stages=3),
              dict(tile_m=128, tile_n=128, num_warps=8, num_stages=2),
              dict(tile_m=128, tile_n=64, num_warps=8, num_stages=3),
              dict(tile_m=64, tile_n=64, num_warps=4, num_stages=3),
              dict(tile_m=64, tile_n=128, num_warps=4, num_stages=3)]


def run(sizes=(1024, 4096, 16384), ceilings=None, sweep_at=(4096,), log=print) -> list[Row]:
    flex = compiled_flex()
    rows: list[Row] = []
    gemm = (ceilings or {}).get("gemm_tflops", 716.0)
    gen = torch.Generator().manual_seed(0)
    best_knobs = {}
    for S in sizes:
        for name, spec in variants(S).items():
            kernel, hq, hkv = spec[0], spec[5], spec[6]
            case = make_case(name, spec, S, gen)
            q, k, v, scale, args = case.q, case.k, case.v, case.scale, case.args
            impls = {}
            knob_list = KNOB_SWEEP if S in sweep_at else [best_knobs.get(name, KNOB_SWEEP[0])]
            timings = []
            for knobs in knob_list:
                f = tensorfuse_attention(kernel, knobs)
                made = checked(case, f"tensorfuse {knobs}", lambda: f(q, k, v, scale=scale, **args),
                               log)
                if made:
                    timings.append((made[0], knobs, made[1]))
            tuned = tuned_kernel(kernel, dict(B=q.shape[0], H=hq, HKV=hkv, M=S, N=S, D=D))
            if tuned is not None:  # a record from `tensorfuse tune` in this device's database
                made = checked(case, "tensorfuse tuned",
                               lambda: tuned(q, k, v, scale=scale, **args), log)
                if made:
                    timings.append((made[0], "tuned record", made[1]))
            if timings:
                ms, chosen, note = min(timings, key=lambda t: t[0])
                best_knobs.setdefault(name, chosen if chosen != "tuned record" else KNOB_SWEEP[0])
                impls["tensorfuse"] = (ms, f"{note}; {chosen}")
            impls.update(baselines(case, flex, log))
            rows += [case.row(impl, ms, note, gemm) for impl, (ms, note) in impls.items()]
            log(f"{name:15s} S={S:5d} " + "  ".join(f"{i}={case.flops / ms / 1e9:6.1f}"
                                                    for i, (ms, _) in impls.items()))
            del case, q, k, v
            torch.cuda.empty_cache()
    return rows


DECODE_SWEEP = [dict(tile_m=16, tile_n=n, num_warps=w, num_stages=st, splits=sp)
                for sp in (8, 16, 32, 64) for n in (64, 128) for w in (4,) for st in (2, 3)]


def run_decode(ceilings=None, log=print) -> list[Row]:
    """One query token, KV 32768, 32 q heads over 8 kv heads, batch 8: ``tf.compile``'s decode
    (on sm_90a the cluster kernel), the best of a sweep of the split-update template, SDPA and
    FlexAttention."""
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    B, HQ, HKV, N = 8, 32, 8, 32768
    q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16)
    scale = 1.0 / math.sqrt(D)
    ref = reference(q, k, v, scale, None, None, torch.arange(1).cuda())
    nbytes = 2 * B * HKV * N * D * 2 + 2 * B * HQ * D * 2
    copy = (ceilings or {}).get("copy_tbps", 3.0)
    rows, impls = [], {}
    best = None
    for knobs in DECODE_SWEEP:
        try:
            sch = tf.schedule(K.gqa_attention, "cuda")
            sch.rolling_update(*CHAIN, axis="j")
            sch.apply_template("attention", **knobs)
            f = sch.compile()
            err = relative_error(f(q, k, v, scale=scale), ref)
            if err > 2e-2:
                log(f"  tensorfuse decode {knobs}: WRONG ({err:.1e})")
                continue
            ms = bench(lambda: f(q, k, v, scale=scale))
            if best is None or ms < best[0]:
                best = (ms, f"err {err:.1e}; {knobs}")
        except Exception as exc:  # noqa: BLE001
            log(f"  tensorfuse decode {knobs}: {type(exc).__name__}: {exc}"[:300])
    if best is not None:
        impls["tensorfuse_split_update"] = best
    f = tf.compile(K.gqa_attention, "cuda")   # what a user gets (sm_90a: the cluster kernel)
    err = relative_error(f(q, k, v, scale=scale), ref)
    chosen = f.for_sizes(B=B, H=HQ, HKV=HKV, M=1, N=N, D=D).description
    impls["tensorfuse"] = (bench(lambda: f(q, k, v, scale=scale)),
                           f"err {err:.1e}; tf.compile: {chosen}" + ("" if err < 2e-2 else
                                                                      " WRONG"))
    try:
        run_sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
            q, k, v, scale=scale, enable_gqa=True)
        impls["sdpa"] = (bench(run_sdpa), f"err {relative_error(run_sdpa(), ref):.1e}")
    except Exception as exc:  # noqa: BLE001
        log(f"  sdpa decode: {exc}"[:300])
    try:
        run_flex = lambda: flex(q, k, v, scale=scale, enable_gqa=True)  # noqa: E731
        impls["flex_attention"] = (bench(run_flex), f"err {relative_error(run_flex(), ref):.1e}")
    except Exception as exc:  # noqa: BLE001
        log(f"  flex decode: {exc}"[:300])
    for impl, (ms, note) in impls.items():
        gbps = nbytes / ms / 1e6
        rows.append(Row("decode/gqa", f"B{B} Hq{HQ} Hkv{HKV} N{N} D{D}", impl, ms, 0.0, gbps,
                        gbps / 1e3 / copy, note))
    log("decode " + "  ".join(f"{i}={nbytes / ms / 1e6:7.1f}GB/s" for i, (ms, _) in impls.items()))
    return rows
