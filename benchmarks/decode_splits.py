"""The cluster decode's cluster size and clusters per (batch, kv-head) pair, swept on short and
long caches: every (cluster, splits) that fits about one wave, each checked against float64 and
timed beside ``tf.compile``'s default and SDPA (cuDNN and flash) — what the defaults of
:func:`tensorfuse.schedule_templates.cluster.decode_knobs` and the threshold of
:func:`tensorfuse.schedule_templates.decode_plan.splits_for` are chosen from. ``--groups``:
instead, groups of 32 to 128 query heads on one cache (teams of warps sharing each block on
tensor cores) at one or two teams and 2 or 3 stages, beside the CUDA-core sweep.
``--pipeline``: instead, the warps per CTA, the blocks each warp keeps in flight (stages) and how
they are copied, on caches of 0.3 to 4 GB. ``--defaults``: only ``tf.compile``'s defaults and SDPA
on each sweep's shapes (no candidates): the current standing, in a fraction of the time.

    python -m benchmarks.decode_splits [--lengths 1024,4096,16384,131072] [--groups | --pipeline]
                                       [--defaults] [--build-only] [--out DIR]

Rows ``decode_splits/<heads>`` (``mqa`` 8/1, ``gqa`` 32/8 and 64/8, ``mha`` 32/32), one per
(shape, implementation); ``tensorfuse cluster=C splits=S`` for a candidate (``S``: the splits
the launch takes at this key count), ``tensorfuse`` for the default. Milliseconds with L2
flushed between calls (``bench``, as ``benchmarks.decode_grid``), GB/s and the fraction of the
copy bandwidth. ``--build-only`` compiles every candidate's kernel into the build cache (no GPU
needed: nvcc), so that a GPU run spends its time measuring.
CSV ``benchmarks/results/<date>-<device>-decode-splits.csv``.
"""
from __future__ import annotations

import argparse
import functools

SHAPES = [(1, 8, 1), (4, 8, 1), (8, 8, 1), (1, 32, 8), (1, 64, 8), (4, 32, 8), (4, 32, 32)]
# (B, query heads, kv-heads, keys) of large groups: the user suite's MQA as a 4-D cache, and more
GROUPS = [(16, 64, 1, 16384), (16, 128, 1, 16384), (1, 64, 1, 131072), (8, 32, 1, 32768)]
# (B, query heads, kv-heads, keys) of large caches: few pairs split, about one wave, many waves
LARGE = [(4, 8, 1, 131072), (1, 32, 8, 131072), (8, 32, 8, 16384), (4, 32, 32, 131072),
         (8, 32, 8, 131072), (64, 32, 32, 4096)]
# (warps, stages, copy) of the pipeline sweep: 1 to 3 CTAs an SM, 2 to 8 blocks of 16 KB a warp,
# staged by bulk tensor copies or by every lane's cp.async
PIPELINES = [(4, 2, "tma"), (4, 3, "tma"), (2, 2, "tma"), (2, 3, "tma"), (2, 6, "tma"),
             (1, 4, "tma"), (1, 6, "tma"), (1, 8, "tma"), (4, 2, "cp.async"), (4, 3, "cp.async"),
             (2, 3, "cp.async"), (2, 6, "cp.async")]
CLUSTERS = (16, 8, 4, 2, 1)
SPLITS = (1, 2, 4, 8, 16, 32)
MOST_CTAS = 160   # candidates up to about one wave of one CTA per SM (132 on the H200)
WARPS = 4         # the default at head dim 128


def _variant(hq: int, hkv: int) -> str:
    return "mqa" if hkv == 1 else "mha" if hq == hkv else "gqa"


def candidates(pairs: int, keys: int) -> list[tuple[int, int]]:
    """(cluster, splits) pairs of about one wave, deduplicated by the splits a launch over
    ``keys`` keys takes."""
    from tensorfuse.schedule_templates.decode_plan import DecodeKnobs, splits_for

    seen = []
    for c in CLUSTERS:
        for s in SPLITS:
            if c * s * pairs > MOST_CTAS:
                continue
            taken = splits_for(DecodeKnobs(cluster=c, warps=WARPS, splits=s), keys)
            if (c, taken) not in seen:
                seen.append((c, taken))
    return seen


def group_candidates(group: int) -> list[dict]:
    """Knobs of a large group: one or two teams of warps, 2 or 3 stages; the CUDA-core sweep."""
    tiles = -(-group // 16)
    made = [{"warps": w, "stages": st} for w in (tiles, 2 * tiles) if w <= 16 for st in (2, 3)]
    return made + [{"mma": "fma", "copy": "cp.async"}]


@functools.lru_cache(maxsize=None)
def _kernel(cluster: int | None, splits: int | None, **knobs):
    import tensorfuse as tf
    import tensorfuse.kernels as K

    sch = tf.schedule(K.gqa_attention, target="cuda:sm_90a")
    sch.rolling_update("m", "l", "o", axis="j")
    given = {"cluster": cluster, "splits": splits, **knobs}
    sch.cluster_distribute("j", **{k: v for k, v in given.items() if v is not None})
    return sch.compile()


def tf_default_knobs(B: int, hq: int, hkv: int):
    """``tf.compile``'s decode knobs for these heads, as chosen without a GPU."""
    from tensorfuse.schedule_templates.cluster import decode_knobs
    from tensorfuse.targets import get_target

    return decode_knobs(B, hq, hkv, 128, None, {}, get_target("cuda:sm_90a"))


def build_only(lengths) -> None:
    from tensorfuse.errors import ScheduleError
    from tensorfuse.targets.cuda.module import cubin_for

    for B, hq, hkv in SHAPES:
        for c in {c for n in lengths for c, _ in candidates(B * hkv, n)}:
            made = _kernel(c, 1, warps=WARPS)
            cubin_for(made.source(B=B, H=hq, HKV=hkv, M=1, N=max(lengths), D=128), made.target)
    for B, hq, hkv, N in GROUPS:
        default = dict(vars(tf_default_knobs(B, hq, hkv)))
        for c in (16, 8, 4, 2):   # tf.compile's knobs, at each cluster the GPU may choose
            made = _kernel(c, None, warps=default["warps"], stages=default["stages"])
            cubin_for(made.source(B=B, H=hq, HKV=hkv, M=1, N=N, D=128), made.target)
        for knobs in group_candidates(hq // hkv):
            # the cluster is chosen on the GPU: those it can choose for these pairs
            for c in (16, 8) if B * hkv < 16 else (8, 4):
                made = _kernel(c, None, **knobs)
                try:
                    cubin_for(made.source(B=B, H=hq, HKV=hkv, M=1, N=N, D=128), made.target)
                except ScheduleError as exc:   # knobs that do not fit: the run reports them
                    print(f"B{B} H{hq}/{hkv} {knobs} cluster {c}: {exc.message[:100]}")


def build_pipelines() -> None:
    """The pipeline sweep's kernels into the build cache (one source per shape and knobs; the
    cluster and splits are chosen at launch)."""
    from tensorfuse.targets.cuda.module import cubin_for

    for B, hq, hkv, N in LARGE:
        for warps, stages, copy in PIPELINES:
            made = _kernel(None, None, warps=warps, stages=stages, copy=copy)
            cubin_for(made.source(B=B, H=hq, HKV=hkv, M=1, N=N, D=128), made.target)


def _case(B: int, hq: int, hkv: int, N: int, D: int = 128):
    """Random bf16 inputs of one decode, its float64 reference, the bytes it moves, its shape's
    name and the SDPA backends on it."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.common import SDPA_CUDNN, SDPA_FLASH
    from benchmarks.decode_grid import reference

    q = torch.randn(B, hq, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, hkv, N, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, hkv, N, D, device="cuda", dtype=torch.bfloat16)

    def sdpa(backend):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, scale=D ** -0.5, enable_gqa=True)

    return ((q, k, v), reference(q, k, v, D ** -0.5), 2 * k.numel() * 2 + 2 * q.numel() * 2,
            f"B{B} Hq{hq} Hkv{hkv} N{N} D{D} bf16",
            {SDPA_CUDNN: functools.partial(sdpa, SDPBackend.CUDNN_ATTENTION),
             SDPA_FLASH: functools.partial(sdpa, SDPBackend.FLASH_ATTENTION)})


@functools.lru_cache(maxsize=1)
def _copy_tbps() -> float:
    from benchmarks.common import measure_ceilings

    return measure_ceilings()["copy_tbps"]


# rounds each implementation is timed in, taking turns: in one run of single timings the same
# kernel (tf.compile's default and the candidate of its knobs, B1 8/1 heads, 4096 keys) timed
# 27.9 and 10.7 µs — on a cache of 1 MB the GPU's state when a timing starts decides as much as
# the kernel, so every implementation gets its best of several turns
ROUNDS = 3


def _measure(case: str, shape: str, impls: dict, want, moved: int, rows: list, log,
             notes: dict | None = None, rep_ms: int = 25) -> dict:
    """Each implementation checked against ``want`` (bf16 tolerance), then all timed in
    :data:`ROUNDS` alternated rounds (each its best round): a row each in ``rows``; returns
    label → ms of those that ran correctly."""
    from benchmarks.common import Row, best_alternated, relative_error

    copy = _copy_tbps()
    checked = {}
    for label, fn in impls.items():
        try:
            err = relative_error(fn(), want)
        except Exception as exc:  # noqa: BLE001 - a backend that does not take the shape
            log(f"  {shape} {label}: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        if not err <= 2e-2:
            log(f"  {shape} {label}: WRONG (error {err:.1e})")
            continue
        checked[label] = err
    timed = best_alternated({label: impls[label] for label in checked}, ROUNDS, rep_ms=rep_ms,
                            failed=lambda label, why: log(f"  {shape} {label}: not timed: {why}"))
    for label, ms in timed.items():
        err = checked[label]
        gbps = moved / ms / 1e6
        rows.append(Row(case, shape, label, ms, 0.0, gbps, gbps / 1e3 / copy,
                        f"err {err:.1e}; best of {ROUNDS} alternated rounds"
                        + (notes or {}).get(label, "")))
    return timed


def _default_knobs(default, sizes: dict):
    """The cluster decode's knobs ``tf.compile`` takes at ``sizes``, or a word for the kernel
    it runs instead (the split update from 32 pairs on)."""
    chosen = default.for_sizes(**sizes)
    return chosen.launches(**sizes).knobs if hasattr(chosen, "launches") else \
        type(chosen).__name__


def run(lengths, rows: list, log=print, sweep: bool = True) -> None:
    """Rows ``decode_splits/<heads>``: the candidates of :func:`candidates` per shape and key
    count, beside ``tf.compile``'s default and SDPA."""
    import tensorfuse as tf
    import tensorfuse.kernels as K
    from benchmarks.common import TENSORFUSE

    default = tf.compile(K.gqa_attention, "cuda")
    for (B, hq, hkv), N in ((s, n) for s in SHAPES for n in lengths):
        (q, k, v), want, moved, shape, sdpa = _case(B, hq, hkv, N)
        sizes = dict(B=B, H=hq, HKV=hkv, M=1, N=N, D=128)
        knobs = _default_knobs(default, sizes)
        impls = {TENSORFUSE: lambda: default(q, k, v, scale=128 ** -0.5), **sdpa}
        for c, s in candidates(B * hkv, N) if sweep else ():
            impls[f"{TENSORFUSE} cluster={c} splits={s}"] = functools.partial(
                _kernel(c, s, warps=WARPS), q, k, v, scale=128 ** -0.5)
        timed = _measure(f"decode_splits/{_variant(hq, hkv)}", shape, impls, want, moved, rows,
                         log, {TENSORFUSE: f"; default {knobs}"})
        ours = {label: ms for label, ms in timed.items() if label.startswith(TENSORFUSE + " ")}
        best = min(ours.items(), key=lambda x: x[1]) if ours else ("-", float("nan"))
        sdpa_best = min(ms for label, ms in timed.items() if label.startswith("sdpa"))
        log(f"{shape}: default {knobs} "
            f"{timed.get(TENSORFUSE, float('nan')) * 1e3:6.1f} us; best {best[0][11:]} "
            f"{best[1] * 1e3:6.1f} us; sdpa {sdpa_best * 1e3:6.1f} us")


def run_groups(rows: list, log=print, sweep: bool = True) -> None:
    """Rows ``decode_groups/mqa``: large groups on one cache, each candidate of
    :func:`group_candidates` (its cluster and splits the defaults) beside the default and SDPA."""
    import tensorfuse as tf
    import tensorfuse.kernels as K
    from benchmarks.common import TENSORFUSE

    default = tf.compile(K.gqa_attention, "cuda")
    for B, hq, hkv, N in GROUPS:
        (q, k, v), want, moved, shape, sdpa = _case(B, hq, hkv, N)
        impls = {TENSORFUSE: lambda: default(q, k, v, scale=128 ** -0.5), **sdpa}
        for knobs in group_candidates(hq // hkv) if sweep else ():
            label = " ".join(f"{n}={x}" for n, x in knobs.items() if n != "copy")
            impls[f"{TENSORFUSE} {label}"] = functools.partial(_kernel(None, None, **knobs),
                                                               q, k, v, scale=128 ** -0.5)
        timed = _measure("decode_groups/mqa", shape, impls, want, moved, rows, log, rep_ms=40)
        log(f"{shape}: " + "; ".join(f"{label.replace(TENSORFUSE, 'tf')} {ms * 1e3:.1f}"
                                     for label, ms in timed.items()) + " us")


def run_pipelines(rows: list, log=print, sweep: bool = True) -> None:
    """Rows ``decode_pipeline/<heads>``: each (warps, stages) of :data:`PIPELINES` on the
    large caches of :data:`LARGE` (cluster and splits chosen as ``tf.compile`` chooses them),
    beside the default and SDPA."""
    import tensorfuse as tf
    import tensorfuse.kernels as K
    from benchmarks.common import TENSORFUSE

    default = tf.compile(K.gqa_attention, "cuda")
    for B, hq, hkv, N in LARGE:
        (q, k, v), want, moved, shape, sdpa = _case(B, hq, hkv, N)
        sizes = dict(B=B, H=hq, HKV=hkv, M=1, N=N, D=128)
        knobs = _default_knobs(default, sizes)
        impls = {TENSORFUSE: lambda: default(q, k, v, scale=128 ** -0.5), **sdpa}
        for warps, stages, copy in PIPELINES if sweep else ():
            impls[f"{TENSORFUSE} warps={warps} stages={stages} copy={copy}"] = \
                functools.partial(_kernel(None, None, warps=warps, stages=stages, copy=copy),
                                  q, k, v, scale=128 ** -0.5)
        timed = _measure(f"decode_pipeline/{_variant(hq, hkv)}", shape, impls, want, moved,
                         rows, log, {TENSORFUSE: f"; default {knobs}"}, rep_ms=40)
        log(f"{shape}: " + "; ".join(f"{label.replace(TENSORFUSE, 'tf')} {ms * 1e3:.1f}"
                                     for label, ms in timed.items()) + " us")
        del q, k, v


def main() -> None:
    import warnings

    from benchmarks.common import run_and_write

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,4096,16384,131072")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--groups", action="store_true")
    parser.add_argument("--pipeline", action="store_true")
    parser.add_argument("--defaults", action="store_true",
                        help="only tf.compile's defaults and SDPA, no candidates")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.build_only:
        build_pipelines() if args.pipeline else build_only(lengths)
        return
    warnings.filterwarnings("ignore", message=".*(kernel not used|runtime disabled|same num_heads)")
    sweep = not args.defaults
    if args.groups:
        run_and_write(lambda rows: run_groups(rows, sweep=sweep), args.out, "decode-groups")
    elif args.pipeline:
        run_and_write(lambda rows: run_pipelines(rows, sweep=sweep), args.out, "decode-pipeline")
    else:
        run_and_write(lambda rows: run(lengths, rows, sweep=sweep), args.out, "decode-splits")


if __name__ == "__main__":
    main()
