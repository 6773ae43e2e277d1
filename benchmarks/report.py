"""The results as current tables: ``benchmarks/RESULTS.md`` and the README's results table and
its cases furthest behind, written from the newest CSV of each benchmark on each device in ``benchmarks/results/``; and the
plots the benchmarks draw of their CSVs.

    python -m benchmarks.report            # write RESULTS.md and the README's tables
    python -m benchmarks.report --check    # exit 1 where either differs from what it would write

A CSV is named ``<date>-<device>-<benchmark>.csv`` (``common.write_csv``); the output depends on
the CSVs alone (no time of generation), so the committed files reproduce byte for byte.
"""
from __future__ import annotations

import csv
import os
import sys


def load(path: str) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _bar_chart(path: str, out: str, groups: list, impls: list, value, labels: list[str],
               ylabel: str, parity: bool = False, inches_per_group: float = 1.0,
               lines: tuple = ()) -> None:
    """Grouped bars: ``value(impl, group)`` for every implementation in every group; ``lines``:
    further horizontal lines (a bar to meet)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, len(groups) * inches_per_group), 5))
    width = 0.8 / max(1, len(impls))
    for k, impl in enumerate(impls):
        ax.bar([g + k * width for g in range(len(groups))], [value(impl, g) for g in groups],
               width, label=impl)
    for at in ((1.0,) if parity else ()) + tuple(lines):
        ax.axhline(at, color="black", linewidth=0.8, linestyle="-" if at == 1.0 else "--")
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars
    ax.set_title(path.rsplit("/", 1)[-1].replace(".csv", ""))
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def _ms(rows: list, impl: str, bench: str, shape: str, field: str = "ms") -> float | None:
    hit = [float(r[field]) for r in rows if r["implementation"] == impl
           and r["benchmark"] == bench and r["shape"] == shape]
    return hit[0] if hit else None


def plot(path: str, out: str, prefix: str = "attention/",
         ylabel: str = "TFLOP/s (unmasked FLOPs)") -> None:
    """Attention TFLOP/s per variant and size (``prefix``: ``attention_bwd/`` for the backward
    passes, whose rows count the mask's FLOPs only)."""
    rows = [r for r in load(path) if r["benchmark"].startswith(prefix)]
    if not rows:
        return
    groups = sorted({(r["benchmark"], r["shape"]) for r in rows},
                    key=lambda g: (int(g[1].split("S")[1].split()[0]), g[0]))
    _bar_chart(path, out, groups, sorted({r["implementation"] for r in rows}),
               lambda impl, g: _ms(rows, impl, *g, field="tflops") or 0.0,
               [f"{b.split('/')[1]}\nS={s.split('S')[1].split()[0]}" for b, s in groups],
               ylabel)


def plot_neighborhood(paths: list[str], out: str, bar: float = 2.5) -> None:
    """Neighbourhood attention (``benchmarks.neighborhood`` CSVs, eager and ``_graph`` rows):
    each implementation's speed-up over FlexAttention timed the same way, per case, with the
    issue's bar."""
    rows = [r for path in paths for r in load(path)
            if r["benchmark"].startswith("attention/neighborhood")]
    groups = list(dict.fromkeys(r["benchmark"] for r in rows))

    def flex(bench: str, graph: bool) -> float | None:
        hit = [float(r["ms"]) for r in rows if r["benchmark"] == bench and r["implementation"]
               == "flex_attention" + ("_graph" if graph else "")]
        return hit[0] if hit else None

    impls = [i for i in dict.fromkeys(r["implementation"] for r in rows)
             if not i.startswith("flex") and "flat" not in i]

    def speedup(impl: str, bench: str) -> float:
        ms = [float(r["ms"]) for r in rows if r["benchmark"] == bench and
              r["implementation"] == impl]
        base = flex(bench, impl.endswith("_graph"))
        return base / ms[0] if ms and base else 0.0

    _bar_chart(paths[0], out, groups, impls, speedup,
               [g.split("/", 2)[2].replace("/", "\n") for g in groups],
               "× FlexAttention (same timing)", parity=True, lines=(bar,),
               inches_per_group=1.1)


def plot_rows_sweep(path: str, out: str,
                    impls: tuple = ("keep", "reload", "torch.compile")) -> None:
    """``benchmarks.rows_sweep`` rows: the fraction of the copy ceiling per kernel and shape for
    each implementation (``--reload``: the row kept in registers, read again, torch.compile)."""
    rows = [r for r in load(path) if r["implementation"] in impls]   # not the read ceilings
    groups = sorted({(r["benchmark"], r["shape"]) for r in rows})
    _bar_chart(path, out, groups, list(impls),
               lambda impl, g: float(next((r["fraction_of_ceiling"] for r in rows
                                           if r["implementation"] == impl
                                           and (r["benchmark"], r["shape"]) == g), 0.0)),
               [f"{b.split('/')[1]}\n{s.split()[0]}" for b, s in groups],
               "fraction of the copy ceiling", inches_per_group=0.9)


def plot_gemm(path: str, out: str, impls: tuple = ("cublas", "torch.compile")) -> None:
    """GEMM TFLOP/s per shape and weight layout for cuBLAS, torch.compile and the tensorfuse
    rows (every implementation whose name starts with ``tensorfuse`` unless ``impls`` names
    them)."""
    rows = [r for r in load(path) if r["benchmark"] == "gemm"]
    if not rows:   # the FFN blocks: one group per (block, M)
        rows = [dict(r, shape=f"{r['benchmark']} {r['shape']}", benchmark="gemm")
                for r in load(path) if r["benchmark"].startswith("ffn")]
    groups = list(dict.fromkeys(r["shape"] for r in rows))
    names = list(dict.fromkeys(r["implementation"] for r in rows))
    shown = [i for i in names if i in impls or (i.startswith("tensorfuse") and
                                                  not any(x.startswith("tensorfuse") for x in impls))]
    _bar_chart(path, out, groups, shown,
               lambda impl, g: _ms(rows, impl, "gemm", g, field="tflops") or 0.0,
               [g.replace("/", "\n").replace(" ", "\n") for g in groups], "TFLOP/s")


def plot_cpu(path: str, out: str, prefix: str = "cpu/") -> None:
    """The CPU benchmark (``cpu/<kernel>``; ``cpu_tuned/<kernel>`` for benchmarks/cpu_tuning.py):
    each implementation's speed relative to torch (its ``torch``/``torch sdpa`` row) per kernel
    and shape; 1.0 is parity, 1/3 the attention bar."""
    rows = [r for r in load(path) if r["benchmark"].startswith(prefix)]
    base = {(r["benchmark"], r["shape"]): float(r["ms"]) for r in rows
            if r["implementation"].startswith("torch")}
    groups = list(dict.fromkeys((r["benchmark"], r["shape"]) for r in rows
                                if (r["benchmark"], r["shape"]) in base))   # with a torch row
    impls = list(dict.fromkeys(r["implementation"] for r in rows
                               if not r["implementation"].startswith("torch")))

    def speed(impl, group):
        ms = _ms(rows, impl, *group)
        return base[group] / ms if ms else 0.0

    short = lambda s: s.replace("B1 H8 ", "").replace(" D64", "").replace(" ", "\n")  # noqa: E731
    _bar_chart(path, out, groups, impls, speed,
               [f"{b.split('/')[1]}\n{short(s)}" for b, s in groups],
               "speed relative to torch (2 threads)", parity=True, inches_per_group=1.5)


def plot_model(paths: list[str], out: str) -> None:
    """The model benchmark (``model/<phase>``): tokens/s of each implementation relative to the
    SDPA model, per phase and shape, from one or more CSVs (first row of each shape wins)."""
    rows, seen = [], set()
    for path in paths:
        for r in load(path):
            key = (r["benchmark"], r["shape"], r["implementation"])
            if r["benchmark"].startswith("model/") and key not in seen:
                seen.add(key)
                rows.append(r)
    groups = list(dict.fromkeys((r["benchmark"], r["shape"]) for r in rows))

    def speed(impl, group):
        base, ms = _ms(rows, "sdpa", *group), _ms(rows, impl, *group)
        return base / ms if base and ms else 0.0

    _bar_chart(paths[0], out, groups, list(dict.fromkeys(r["implementation"] for r in rows)),
               speed, [f"{b.split('/')[1]}\n{s}" for b, s in groups],
               "tokens/s relative to attn_implementation='sdpa'", parity=True)


def plot_cluster(path: str, out: str) -> None:
    """Cluster kernels: each implementation's speed relative to torch eager (FFN) or to the
    split-update template (decode), per shape; 1.0 is parity."""
    rows = [r for r in load(path) if r["benchmark"].startswith(("ffn/", "decode/gqa_cluster"))]
    if not rows:
        return
    def order(group):   # by benchmark, then by the leading size of the shape (M128 < M1024)
        bench, shape = group
        digits = "".join(ch for ch in shape.split()[0] if ch.isdigit())
        return bench, int(digits or 0), shape

    groups = sorted({(r["benchmark"], r["shape"]) for r in rows}, key=order)
    baseline = {"ffn": "torch_eager", "decode": "tensorfuse_split_update"}

    def speed(impl, group):
        base = _ms(rows, baseline[group[0].split("/")[0]], *group)
        ms = _ms(rows, impl, *group)
        return base / ms if base and ms else 0.0

    _bar_chart(path, out, groups, sorted({r["implementation"] for r in rows}), speed,
               [f"{b.split('/')[-1]}\n{s.split()[0]}" for b, s in groups],
               "speed vs torch eager (FFN) / split update (decode)", parity=True)


def plot_neptune(path: str, out: str) -> None:
    """The Neptune suite: tensorfuse's speed over each alternative per operator (GPU time for
    prefill, wall clock per call for decode — the rows' ``ms``)."""
    rows = load(path)
    groups = list(dict.fromkeys(r["benchmark"] for r in rows))
    impls = sorted({r["implementation"] for r in rows} - {"tensorfuse"})

    def speed(impl, bench):
        ours = _ms(rows, "tensorfuse", bench, _shape_of(rows, bench))
        theirs = _ms(rows, impl, bench, _shape_of(rows, bench))
        return theirs / ours if ours and theirs else 0.0

    _bar_chart(path, out, groups, impls, speed, [g.split("/")[1] for g in groups],
               "tensorfuse's speed over it (×)", parity=True)


def plot_tuning_gpus(paths: list[str], out: str) -> None:
    """``--gpus-compare`` runs: a job's wall clock on one GPU and on all, per CSV (a run)."""
    runs = {p.rsplit("/", 1)[-1].replace(".csv", "").split("tuning-gpus-")[-1]: load(p)
            for p in paths}
    groups = list(runs)

    def seconds(impl, run):
        return next((float(r["job_s"]) for r in runs[run] if r["gpus"] == impl), 0.0)

    impls = sorted({r["gpus"] for rows in runs.values() for r in rows})
    _bar_chart(paths[0], out, groups, impls, seconds, groups, "job wall clock (s), per GPU count")


def _shape_of(rows: list, bench: str) -> str:
    return next(r["shape"] for r in rows if r["benchmark"] == bench)


HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(HERE, "results")
RESULTS_MD = os.path.join(HERE, "RESULTS.md")
README = os.path.join(os.path.dirname(HERE), "README.md")
README_BEGIN, README_END = "<!-- results table: benchmarks/report.py -->", "<!-- end of results -->"
BEHIND_BEGIN, BEHIND_END = "<!-- behind table: benchmarks/report.py -->", "<!-- end of behind -->"

# The benchmarks in the order RESULTS.md shows them: the CSV's name after the device, a title,
# what the numbers are and the command that makes them (each run checks against float64 first).
SECTIONS = (
    ("hopper-attention", "Attention prefill (`tf.compile`: the Hopper template on sm_90a)",
     "bf16, B=2, 16 heads (GQA 32/8), D=128; TFLOP/s of the unmasked FLOPs; `tensorfuse` is "
     "`tf.compile`'s choice, `tensorfuse hopper` / `tensorfuse triton` each template by hand",
     "python -m benchmarks.hopper_attention --csv PATH"),
    ("hopper-attention-tuned", "Attention prefill with tuned records",
     "as above, after `tf.tune` (16 trials a kernel)",
     "python -m benchmarks.hopper_attention --csv PATH --tune 16"),
    ("user-kernels", "Kernels as users write them (their layouts, `tf.compile` defaults)",
     "bf16; each against the best torch alternative on the same tensors (SDPA on views of them)",
     "python -m benchmarks.user_kernels"),
    ("user-kernels-tuned", "Kernels as users write them, tuned",
     "as above, then `tf.tune` at each call's sizes (`tensorfuse tuned`: tf.compile reading "
     "the records; trials a task in its note)", "python -m benchmarks.user_kernels --tune 6"),
    ("unlisted-kernels", "Kernels no issue lists, as a new user writes them",
     "bf16 (the router, the squared distances, the Gaussian sum and the nearest neighbours "
     "f32); each against the best "
     "torch alternative on the same tensors; the distances in TFLOP/s (3 operations a pair and "
     "dimension) against cuBLAS's f32 GEMM on the CUDA cores, whose fused multiply-adds make "
     "75 % the limit here", "python -m benchmarks.unlisted_kernels"),
    ("unlisted-kernels-weighted-token-pool", "Tokens summed with weights, again",
     "bf16; the weighted token pool of the section above, run alone after its defaults changed",
     "python -m benchmarks.unlisted_kernels --only weighted_token_pool"),
    ("unlisted-kernels-rmsnorm-linear", "RMSNorm written into a linear layer",
     "bf16; one sum `Σ_k x[i, k] · rsqrt(mean x²) · g[k] · w[j, k]`: the norm's sum, the "
     "normalised rows stored, the Hopper GEMM with the row scale in its epilogue; against "
     "`F.linear(F.rms_norm(x))`", "python -m benchmarks.unlisted_kernels --only rmsnorm_linear"),
    ("unlisted-kernels-bilinear-form", "A bilinear form per row",
     "bf16; `Σ_j (Σ_i x[b, i] · W[i, j]) · y[b, j]`: the GEMM stored in f32 by the Hopper GEMM, "
     "then the row template's sum over its columns; against `((x @ W) * y).sum(-1)`",
     "python -m benchmarks.unlisted_kernels --only bilinear_form"),
    ("unlisted-kernels-strided-matvec", "A matrix-vector product over the strided axis",
     "bf16; `Σ_k a[k, i] · x[k]` (`a.T @ x`, the rows i contiguous) on the row template: 128 "
     "contiguous rows a tile in blocks of 64, the sweep in parts for about four programs an SM; "
     "against cuBLAS's gemv on the transposed view and torch.compile",
     "python -m benchmarks.unlisted_kernels --only strided_matvec"),
    ("unlisted-kernels-router-softmax", "A router's softmax over 8 experts, again",
     "f32; the router softmax of the section above after rows of at most 8 columns took blocks "
     "of their width, 128 rows a program, held in registers",
     "python -m benchmarks.unlisted_kernels --only router_softmax"),
    ("unlisted-kernels-head-logsumexp-latent-attention-decode",
     "Chains past the row tile, cut at the call's sizes",
     "bf16; DeepSeek's absorbed latent attention at decode (q·k over 576, p·v over 512, every "
     "head over one cache) and a language model head's log-sum-exp over 4096 features: the "
     "floor's stages, each on a template (the Hopper GEMM for the products)",
     "python -m benchmarks.unlisted_kernels --only latent_attention_decode,head_logsumexp"),
    ("unlisted-kernels-lengths-mean-pool-masked-mean-pool",
     "A mean over tokens, from a mask and from the sequences' lengths",
     "bf16 `[32, 2048, 1024]`, 512-2048 tokens kept a sequence: the mask read whole, or the "
     "lengths bounding each program's sweep (the padding never read: GB/s of the kept tokens); "
     "torch.compile's time varied 45-97 µs between runs of the same day",
     "python -m benchmarks.unlisted_kernels --only lengths_mean_pool,masked_mean_pool"),
    ("unlisted-kernels-log-softmax-vocab-major",
     "A log-softmax down the vocabulary axis of vocabulary-major logits",
     "f32 `[V, B]`, reduced over V (the first axis): few columns, each a long sweep with outputs "
     "along it — the floor's two stages; against torch.compile and eager",
     "python -m benchmarks.unlisted_kernels --only log_softmax_vocab_major"),
    ("unlisted-kernels-attention-keys-transposed", "Attention with its keys kept transposed",
     "bf16, causal, k stored `[B, H, D, S]`; against SDPA on the transposed view and on a "
     "contiguous copy of it (the copy timed too)",
     "python -m benchmarks.unlisted_kernels --only attention_keys_transposed"),
    ("pipeline-kernels", "Kernels of training and serving pipelines, as a new user writes them",
     "bf16; a distillation loss (KL divergence of two soft-maxed rows) and a policy's entropy "
     "over a 128k vocabulary, sigmoid attention (no normaliser), groups of 128 features scaled "
     "by their largest magnitude, a global average pool, a log-sum-exp down the tokens; each "
     "against the best torch alternative on the same tensors",
     "python -m benchmarks.pipeline_kernels"),
    ("pipeline-kernels-attention-pool-latent-cross-attention-relu2-causal-attention",
     "Attention's kin as a new user writes them",
     "bf16; causal attention weighted by squared ReLU scores (no normaliser), Perceiver's latent "
     "queries shared by the batch (against SDPA on the latents broadcast), attention pooling by "
     "a learned query vector; each against the best torch alternative on the same tensors",
     "python -m benchmarks.pipeline_kernels --only relu2_causal_attention,"
     "latent_cross_attention,attention_pool"),
    ("pipeline-kernels-cosine-attention-gated-attention-w8a16-linear",
     "Attention by cosine similarity, gated attention, int8 weights",
     "bf16; Swin v2's attention by cosine similarity with a learned temperature (the norms "
     "stored, then the Hopper template reading the keys' norms as strips), Qwen3-Next's "
     "causal attention gated by a sigmoid of the query's projection (the Hopper attention, "
     "then the gate), a linear layer of int8 weights scaled per output channel (GB/s of the "
     "weights); each against the best torch alternative on the same tensors",
     "python -m benchmarks.pipeline_kernels --only cosine_attention,w8a16_linear,"
     "gated_attention"),
    ("pipeline-kernels-logsumexp-pool", "A log-sum-exp down the tokens, again",
     "bf16; the log-sum-exp pool of the section above after per-row strided tiles took 4 warps",
     "python -m benchmarks.pipeline_kernels --only logsumexp_pool"),
    ("variant-kernels", "Kernels of model variants, as a new user writes them",
     "bf16; GQA decode over an int8 cache with a scale per key (GB/s of the cache), the DIFF "
     "Transformer's differential attention (two causal softmaxes over one value tensor), "
     "RetNet's retention (a causal decay, no softmax), cross-entropy with label smoothing and "
     "with ignored targets, a Dice loss per row; each against the best torch alternative on the "
     "same tensors",
     "python -m benchmarks.variant_kernels"),
    ("serving-kernels", "Kernels of inference serving, as a new user writes them",
     "bf16; causal attention over a packed `[B, S, 3, H, D]` QKV tensor (against SDPA on its "
     "slices as views), speculative decoding's 4 draft tokens over a GQA cache (against SDPA "
     "with their boolean mask), causal attention with rotary embeddings applied where the "
     "scores are made (float32 tables: float32 products), a residual add written beside its "
     "RMSNorm, int8 quantisation of rows by their largest magnitude; each against the best "
     "torch alternative on the same tensors",
     "python -m benchmarks.serving_kernels"),
    ("monoid-kernels", "Reductions by the DSL's other monoids",
     "greedy decoding's argmax over a vocabulary (bf16), a row's logsumexp (f32), a KL "
     "divergence written with two logsumexps (bf16), the count of a row's maxima (bf16), the "
     "margin between a row's two largest logits as a user's monoid of two components (bf16), "
     "a product of survival factors (f32); each against torch eager and torch.compile",
     "python -m benchmarks.monoid_kernels"),
    ("full-reductions", "Values reduced over every axis",
     "the largest magnitude of 8192 × 8192 bf16 (an fp8 scale), the sum of squares of 64M f32 "
     "(a gradient norm's square), a cross-entropy averaged over 8192 tokens of a 32000-word "
     "vocabulary (bf16 logits); each against torch eager and torch.compile",
     "python -m benchmarks.full_reductions"),
    ("neighborhood", "Neighbourhood attention on 2-D and 3-D maps",
     "bf16; TFLOP/s of the kept FLOPs; `graph`: calls replayed from a CUDA graph",
     "python -m benchmarks.neighborhood --csv PATH"),
    ("neptune-suite", "Neptune's attention suite",
     "fp16, head dim 128: prefill and decode variants of the Neptune paper's table",
     "python -m benchmarks.neptune_suite --csv PATH"),
    ("attention-backward", "Attention backward",
     "bf16, D=128; TFLOP/s of the backward's FLOPs",
     "python -m benchmarks.attention_backward --csv PATH"),
    ("attention-backward-kernels", "Attention backward kernels: sm_90a and Triton",
     "bf16; both on the same inputs and the forward's saved log-sum-exp",
     "python -m benchmarks.attention_backward --kernels --sizes 4096,16384 --csv PATH"),
    ("attention-backward-kernels-d96", "Attention backward kernels at head dim 96",
     "bf16; the sm_90a kernel in tiles of 128 (TMA's zeros past the rows) and the Triton "
     "kernels (a block of 128 columns, 32 masked) on the same inputs and saved log-sum-exp",
     "python -m benchmarks.attention_backward --kernels --variants full,causal --sizes 4096 "
     "--head-dim 96 --csv PATH"),
    ("attention-backward-kernels-d64", "Attention backward kernels at head dim 64",
     "bf16; the sm_90a kernel (blocks of 128 queries) and the Triton kernels on the same inputs "
     "and saved log-sum-exp, against SDPA's backward",
     "python -m benchmarks.attention_backward --kernels --head-dim 64 --variants "
     "full,causal,gqa_causal --sizes 4096,16384 --csv PATH"),
    ("attention-backward-kernels-variants", "Attention backward kernels: soft-cap and masks",
     "bf16, D=128; the sm_90a kernel (a soft-cap's score and derivative per element; masks "
     "through the transposed block lists) and the Triton kernels on the same inputs and saved "
     "log-sum-exp, against FlexAttention's backward",
     "python -m benchmarks.attention_backward --kernels --variants "
     "softcap,prefix_lm,neighborhood,document --sizes 4096,16384 --csv PATH"),
    ("attention-backward-variants", "Attention backward: soft-cap and masks",
     "bf16, D=128; through autograd (the sm_90a kernel), against FlexAttention's backward",
     "python -m benchmarks.attention_backward --variants softcap,prefix_lm,neighborhood,document "
     "--sizes 4096,16384 --csv PATH"),
    ("attention-backward-kernels-alibi", "Attention backward kernels: ALiBi",
     "bf16; the sm_90a kernel (the score's bias evaluated where P is) and the Triton kernels on "
     "the same inputs and saved log-sum-exp, against FlexAttention's backward",
     "python -m benchmarks.attention_backward --kernels --variants alibi --sizes 4096,16384 "
     "--csv PATH"),
    ("attention-backward-alibi", "Attention backward: ALiBi",
     "bf16, D=128; through autograd (the sm_90a kernel), against FlexAttention's backward",
     "python -m benchmarks.attention_backward --variants alibi --sizes 4096,16384 --csv PATH"),
    ("attention-backward-masks", "Attention backward: masks and knobs",
     "the backward template's knobs per mask", "python -m benchmarks.attention_backward_masks"),
    ("cluster-decode", "Decode (one query token)",
     "bf16, 32 query / 8 KV heads, D=128; GB/s of the keys and values read",
     "python -m benchmarks.cluster --decode-only"),
    ("packed-decode", "Decode with a group's heads as the Hopper attention kernel's rows",
     "bf16, D=128; GB/s of the cache read; `tensorfuse packed …` is the plan measured before "
     "`tf.compile` takes it, `tensorfuse` what it runs now", "python -m benchmarks.packed_decode"),
    ("packed-decode-same-bytes", "Decode on one shared cache against a copy of the same bytes",
     "bf16, D=128; GB/s of the cache read; the note gives what a device copy moving the same "
     "bytes reaches when timed alike (the ceiling's 2 GiB copy hides fixed costs a 134 MB cache "
     "does not)", "python -m benchmarks.packed_decode --only 16/64/1/16384,8/64/1/65536"),
    ("decode-knobs", "The split update's knobs on the suite's decodes",
     "bf16; GB/s of the cache read; every candidate checked against float64, timed from a CUDA "
     "graph; `default` is `tf.compile`'s choice", "python -m benchmarks.decode_knobs"),
    ("decode-knobs-grid", "The decode kernels' knobs on the decode grid's shapes",
     "bf16, one query token, D=128; GB/s of the cache read; the split update's candidates "
     "(`m… n… w… s… splits…`) and the cluster decode's (`cluster w… s… copy`), each checked "
     "against float64, timed from a CUDA graph; `default` is `tf.compile`'s choice",
     "python -m benchmarks.decode_knobs --only grid"),
    ("strided-rows-knobs", "The row template's knobs across a strided axis",
     "bf16; GB/s of the bytes each kernel must move; every candidate checked against float64, "
     "timed from a CUDA graph; `default` is `tf.compile`'s choice",
     "python -m benchmarks.strided_rows_knobs"),
    ("strided-rows-knobs-layernorm-log-softmax-max-pool-row-tiles",
     "The row template's knobs across a strided axis: several row tiles a program",
     "bf16; the whole row in one block, each program sweeping 2 or 4 row tiles with the next "
     "ones' loads issued ahead (`t`: tiles a program); as the section above",
     "python -m benchmarks.strided_rows_knobs --tiles --only layernorm,log_softmax,max_pool"),
    ("strided-rows-knobs-logsumexp-pool",
     "The row template's knobs on a log-sum-exp down the tokens",
     "bf16; two states (a maximum and a sum of exponents) down the 512 strided tokens of "
     "[64, 512, 4096]; as the section above",
     "python -m benchmarks.strided_rows_knobs --only logsumexp_pool"),
    ("strided-rows-knobs-group-norm-swept-tiles",
     "The row template's knobs on a group norm: several swept row tiles a program",
     "bf16; each 65536-element row swept in blocks of 4k-16k, each program taking 1-4 row tiles "
     "in turn (`t`: tiles a program; fewer rows held between a row's two passes); as the "
     "section above",
     "python -m benchmarks.strided_rows_knobs --only group_norm --family swept_tiles"),
    ("strided-rows-knobs-group-norm-pipelined-tiles-cold",
     "The row template's knobs on a group norm, L2 flushed: swept row tiles pipelined",
     "bf16; each program taking 2-8 row tiles in turn, the sweep's loads 2-3 blocks ahead in "
     "8-16 warps; each call timed with L2 flushed before it (`bench_replayed`), beside the "
     "default and torch.compile timed alike",
     "python -m benchmarks.strided_rows_knobs --only group_norm --family pipelined_tiles --cold"),
    ("strided-rows-knobs-layernorm-wide-tiles-cold",
     "The row template's knobs on a layer norm over channels, L2 flushed: the row in 8-16 warps",
     "bf16; the whole 1024-channel row of 32 or 64 positions in 8-16 warps, 1-4 row tiles a "
     "program; L2 flushed before each call, as the section above",
     "python -m benchmarks.strided_rows_knobs --only layernorm --family wide_tiles --cold"),
    ("strided-rows-knobs-channel-stats-wide-parts-cold",
     "The row template's knobs on batch-norm statistics, L2 flushed: parts in 8 warps",
     "bf16; tiles of 32-64 channels by 256-512 rows in 8 warps, 33 or 66 parts; L2 flushed "
     "before each call, as the section above",
     "python -m benchmarks.strided_rows_knobs --only channel_stats --family wide_parts --cold"),
    ("strided-rows-knobs-channel-stats", "The row template's knobs on batch-norm statistics",
     "bf16; the mean and variance of 256 channels over 100352 rows, the sweep split in 33-264 "
     "parts (over 64 merged in a loop); as the section above",
     "python -m benchmarks.strided_rows_knobs --only channel_stats"),
    ("strided-rows-knobs-column-mean-weighted-pool",
     "The row template's knobs on a column mean and a weighted token pool",
     "bf16; a mean down the 65536 rows of [65536, 1024] and tokens summed with weights over "
     "[64, 4096, 1024]; as the section above",
     "python -m benchmarks.strided_rows_knobs --only column_mean,weighted_pool"),
    ("strided-rows-knobs-column-mean-weight-gradient-channel-stats-parts",
     "The row template's knobs on long sweeps of few tiles, split in parts",
     "bf16; a column mean, RMSNorm's weight gradient and batch-norm statistics over one family "
     "of candidates (32-256 rows, blocks of 32-512, 8-264 parts); as the section above",
     "python -m benchmarks.strided_rows_knobs --only column_mean,weight_gradient,channel_stats "
     "--family parts"),
    ("strided-rows-knobs-column-norm", "The row template's knobs on column norms",
     "bf16; the columns of [8192, 4096] L2-normalised (a sweep down the rows, then the outputs "
     "along it); as the section above", "python -m benchmarks.strided_rows_knobs --only "
     "column_norm"),
    ("strided-rows-knobs-strided-matvec",
     "The row template's knobs on a matrix-vector product over the strided axis",
     "bf16 `a.T @ x` over `[8192, 8192]`: tiles of 64-256 rows by 64 or 128, 4-16 parts, "
     "beside the default and torch.compile, from a CUDA graph",
     "python -m benchmarks.strided_rows_knobs --only strided_matvec"),
    ("strided-rows-knobs-weight-gradient", "The row template's knobs on a weight gradient",
     "bf16; RMSNorm's d_weight (a sum down the rows), its sweep also split into parts; as the "
     "section above", "python -m benchmarks.strided_rows_knobs --only weight_gradient"),
    ("gemm", "GEMM (the Hopper GEMM template)", "bf16; TFLOP/s", "python -m benchmarks.gemm"),
    ("contraction", "GEMMs on the contraction template (Triton tensor-core tiles)",
     "bf16; TFLOP/s and the fraction of cuBLAS's 8192³ rate; `tensorfuse template`: the "
     "template called directly, `tensorfuse`: `tf.compile`'s choice",
     "python -m benchmarks.contraction"),
    ("contraction-batched-product", "A batched product (`torch.bmm`)",
     "bf16, a short contracted axis (the output's stores bound it); TFLOP/s and the fraction of "
     "cuBLAS's 8192³ rate; `tensorfuse`: `tf.compile`'s choice (the Hopper GEMM, its batch axis "
     "on 3-D tensor maps), `tensorfuse template`: the contraction template",
     "python -m benchmarks.contraction --only batched_product"),
    ("contraction-attention-scores", "Attention's scores materialised (`q·kᵀ`)",
     "bf16, two batch axes walked as one, the head dim contracted; as the section above",
     "python -m benchmarks.contraction --only attention_scores"),
    ("contraction-knobs-batched-product", "The contraction template's knobs on a batched product",
     "bf16; as the section above", "python -m benchmarks.contraction --sweep --only "
     "batched_product"),
    ("contraction-knobs", "The contraction template's knobs",
     "bf16; TFLOP/s and the fraction of cuBLAS's 8192³ rate; every candidate checked against "
     "float64; `default`: the template's own choice", "python -m benchmarks.contraction --sweep"),
    ("contraction-pairs-knobs", "The contraction template's pairwise tiles",
     "f32 (L1 distances bf16); TFLOP/s (3 operations a pair and dimension, and 3 more a pair "
     "for the Gaussian kernel's sum) and the fraction of "
     "cuBLAS's f32 GEMM on the CUDA cores (75 % the instructions' limit); every candidate "
     "checked against float64; `default`: the template's own choice, `tf.compile`: its pick",
     "python -m benchmarks.contraction --pairs"),
    ("contraction-splits", "Outputs of few tiles: the contracted axis split into parts",
     "bf16 ``aᵀb`` over R rows; TFLOP/s and the fraction of cuBLAS's 8192³ rate; every "
     "candidate checked against float64; `default`: the template's own choice, "
     "`torch_eager`: cuBLAS", "python -m benchmarks.contraction --splits"),
    ("gemm-ffn", "FFN blocks (two Hopper GEMMs, the activation fused)",
     "bf16, K=4096, N=14336, O=4096", "python -m benchmarks.gemm --ffn"),
    ("rows", "Row reductions", "bf16; GB/s of the bytes each kernel must move",
     "python -m benchmarks.rows"),
    ("rows-operands", "Row reductions with extra operands", "bf16; GB/s",
     "python -m benchmarks.rows_operands --csv PATH"),
    ("rows-backward", "Row kernels' backward",
     "bf16; the backward alone (`torch.autograd.grad` after one recorded forward); GB/s of the "
     "inputs and incoming gradient read and the gradients written; the note says what runs "
     "tensorfuse's backward", "python -m benchmarks.rows_backward"),
    ("rows-backward-knobs", "The row template's knobs on backward kernels",
     "bf16; every candidate checked against float64, timed from a CUDA graph (L2 warm between "
     "replays); `default` is `tf.compile`'s choice", "python -m benchmarks.rows_backward --sweep"),
    ("rows-vocab", "Softmax and cross-entropy over a vocabulary",
     "bf16; GB/s of the logits read (and the softmax written); widths not a multiple of 8 start "
     "rows off 16-byte boundaries", "python -m benchmarks.rows_vocab"),
    ("rows-sweep", "The row template's settings", "bf16; the defaults against other knob sets",
     "python -m benchmarks.rows_sweep --csv PATH"),
    ("model-prefill", "A Llama-3-8B-shaped model: prefill", "bf16, random weights; tokens/s",
     "python -m benchmarks.model --csv PATH"),
    ("model-decode", "A Llama-3-8B-shaped model: decode", "bf16, random weights",
     "python -m benchmarks.model --csv PATH"),
    ("model-train", "A Llama-3-8B-shaped model: a training step",
     "bf16, its first four layers, random weights; forward + backward, tokens/s; the first "
     "layer's query-projection gradient against SDPA's in the note",
     "python -m benchmarks.model --config llama3-8b-4l --prefill-batches '' --decode-batches '' "
     "--train-batches 1 --csv PATH"),
    ("model-train-sliding-window", "A Mistral-shaped model with a sliding window: a training step",
     "bf16, Mistral 7B's widths, four layers, every layer's keys in a window of 1024 behind the "
     "query, random weights; forward + backward, tokens/s; FlexAttention's block mask the "
     "alternative", "python -m benchmarks.model --config mistral-7b-4l-sw1024 --prefill-batches "
     "'' --decode-batches '' --train-batches 1 --csv PATH"),
    ("overhead", "What a call costs the host", "small kernels, wall clock per call",
     "python -m benchmarks.overhead --csv PATH"),
    ("cpu", "CPU kernels", "2 cores; against torch on the same cores",
     "python -m benchmarks.cpu --csv PATH"),
    ("cpu-tuning", "CPU kernels, tuned", "2 cores; `tf.tune` records against the defaults",
     "python -m benchmarks.cpu_tuning --csv PATH"),
    ("tuning-gpus", "Tuning jobs on one and two GPUs", "wall clock of a job",
     "python -m benchmarks.tuning --gpus-compare --cases softmax"),
    ("tuning-gpus-together", "One tuning job of two kernels on one and two GPUs",
     "wall clock of a job of every fitting setting of a GQA decode and a softmax",
     "python -m benchmarks.tuning --gpus-compare --together --cases decode,softmax"),
    ("attention-sinks", "Attention with sinks (gpt-oss)",
     "bf16, gpt-oss-120b's heads (64 over 8 kv-heads of 64); a score per head outside the keys "
     "shares the softmax: the sink kernel the transformers integration runs (`tf.compile`'s "
     "choice) against gpt-oss's eager attention in transformers (what transformers runs for "
     "sinks) and SDPA's kernels with the sinks' share applied through their log-sum-exp "
     "(`sdpa with log-sum-exp`); `tensorfuse hopper`: the Hopper template applied by hand; "
     "TFLOP/s of the keys each query keeps. `attention_sinks_train`: forward and backward "
     "through autograd (dq, dk, dv and the sinks' gradient, checked against float64) against "
     "gpt-oss's eager code and FlexAttention with the sinks' share applied through its "
     "log-sum-exp; TFLOP/s counting the backward as 2.5 forwards",
     "python -m benchmarks.attention_sinks"),
    ("masked-attention", "Attention under a boolean mask (the transformers integration's)",
     "bf16, Llama-3-8B's heads (32 over 8 kv-heads of 128); rows the mask empties give 0; "
     "`tf.compile`'s choice and the Triton template applied by hand (`tensorfuse triton`) "
     "against SDPA with the same mask and FlexAttention with a block mask made from it; "
     "TFLOP/s of the keys each query keeps",
     "python -m benchmarks.masked_attention"),
    ("decode-grid-small", "Decode at small batches and caches, again",
     "bf16; the grid's batches 1, 4, 8 and caches of 1k, 4k and 32k keys, run alone after "
     "the cluster decode's launches were packed once (host time a call)",
     "python -m benchmarks.decode_grid --dtypes bf16 --batches 1,4,8 --lengths 1024,4096,32768"),
    ("decode-grid", "Decode over batch sizes, head layouts and cache lengths",
     "one query token, D=128; GB/s of the cache, query and output moved; against every SDPA "
     "backend that runs the shape and FlexAttention (torch.compile, dynamic shapes); "
     "`tensorfuse cluster` and `tensorfuse split update`, where present (`--routes`): the two "
     "decode kernels forced, which tf.compile's route between them is made from",
     "python -m benchmarks.decode_grid --dtypes bf16 && python -m benchmarks.decode_grid "
     "--dtypes fp16"),
    ("decode-grid-replayed", "Decode over batch sizes, head layouts and cache lengths, GPU time",
     "one query token, D=128; each call captured in a CUDA graph and replayed with L2 flushed "
     "(`bench_replayed`): the kernels' time without the host's; GB/s of the cache, query and "
     "output moved", "python -m benchmarks.decode_grid --dtypes bf16 --replayed "
     "--batches 1,4,8 --lengths 1024,4096,16384,32768"),
    ("decode-splits", "Decode: clusters per (batch, kv-head) pair",
     "one query token, D=128, bf16; every cluster size × splits of about one wave "
     "(`tensorfuse cluster=C splits=S`: the splits the launch takes at that key count) beside "
     "the default of the day (its knobs in the note) and SDPA",
     "python -m benchmarks.decode_splits"),
    ("decode-splits32k", "Decode: clusters per (batch, kv-head) pair at 32k keys",
     "as above, at 32768 keys (the run stopped after five of its shapes): one pair of 8 heads "
     "took 4 clusters of 16 faster than the 7 the GPU holds (that run's default; the defaults "
     "now take 4 there: `decode_plan.FEW_SPLITS`)",
     "python -m benchmarks.decode_splits --lengths 32768"),
    ("decode-groups", "Decode: many query heads on one cache",
     "one query token, D=128, bf16; teams of warps sharing each block (warps, stages) and the "
     "CUDA-core sweep beside the default and SDPA",
     "python -m benchmarks.decode_splits --groups"),
    ("decode-pipeline", "Decode on large caches: warps, stages and copies",
     "one query token, D=128, bf16; warps a CTA, blocks of 32 keys each warp keeps in shared "
     "memory (stages) and how they are copied (`tensorfuse warps=W stages=S copy=C`), cluster "
     "and splits as `tf.compile` chooses them, beside the default and SDPA",
     "python -m benchmarks.decode_splits --pipeline"),
    ("decode-masks", "Masked decode: sliding windows, static caches",
     "one query token, B8, D=128, bf16; GB/s of the keys and values the mask keeps; against "
     "SDPA with a boolean mask (every backend that runs it) and FlexAttention with a block mask",
     "python -m benchmarks.decode_masks"),
    ("dynamic", "New sizes on every call",
     "`tf.compile` defaults; `ms` the steady call, the note the first call's wall time at that "
     "size and the builds so far; the `all` rows sum up the first calls' cost over steady",
     "python -m benchmarks.dynamic"),
    ("dynamic-row-widths", "New row widths",
     "a softmax over 4096 rows, bf16, at random widths, as the `dynamic` section",
     "python -m benchmarks.dynamic --only row_widths"),
    ("dynamic-prefill-lengths", "New prompt lengths",
     "causal attention B1 H16 D128 bf16 at random lengths, as the `dynamic` section",
     "python -m benchmarks.dynamic --only prefill_lengths"),
    ("dynamic-growing-cache", "A decode cache that grows a key a step",
     "GQA decode B8 32/8 heads D128 bf16 from 4096 keys, as the `dynamic` section",
     "python -m benchmarks.dynamic --only growing_cache"),
    ("rows-sweep-stages", "Rows swept in blocks: the software pipeline's stages",
     "bf16; the defaults against blocks with other stage counts and hints",
     "python -m benchmarks.rows_sweep --stages --csv PATH"),
)
# The README's table: (benchmark, case prefix, a part of the shape, tensorfuse's label there)
HEADLINES = (("hopper-attention", "attention/full", "S4096", "tensorfuse"),
             ("hopper-attention", "attention/causal", "S16384", "tensorfuse"),
             ("hopper-attention", "attention/gqa_causal", "S4096", "tensorfuse"),
             ("hopper-attention", "attention/alibi", "", "tensorfuse"),
             ("hopper-attention", "attention/softcap", "", "tensorfuse"),
             ("hopper-attention", "attention/sliding_window", "", "tensorfuse"),
             ("masked-attention", "masked_attention/padded_causal", "", "tensorfuse"),
             ("attention-sinks", "attention_sinks/causal", "", "tensorfuse"),
             ("attention-sinks", "attention_sinks_train/causal", "", "tensorfuse"),
             ("attention-sinks", "attention_sinks_train/sliding_window", "", "tensorfuse"),
             ("user-kernels", "user/causal_sbhd", "", "tensorfuse"),
             ("user-kernels", "user/causal_dqk192_dv128", "", "tensorfuse"),
             ("user-kernels", "user/causal_bshd_d96", "", "tensorfuse"),
             ("user-kernels", "user/mqa_causal_one_cache", "", "tensorfuse"),
             ("pipeline-kernels-cosine-attention-gated-attention-w8a16-linear",
              "user/gated_attention", "", "tensorfuse"),
             ("user-kernels", "user/max_pool_l2", "", "tensorfuse"),
             ("user-kernels", "user/paged_decode", "", "tensorfuse"),
             ("serving-kernels", "user/packed_qkv_causal", "", "tensorfuse"),
             ("serving-kernels", "user/rope_attention_bf16_tables", "", "tensorfuse"),
             ("variant-kernels", "user/diff_attention", "", "tensorfuse"),
             ("attention-backward-kernels", "attention_bwd_kernels/causal", "S4096 D128",
              "tensorfuse hopper"),
             ("model-train", "model/train", "", "tensorfuse"),
             ("model-train-sliding-window", "model/train", "", "tensorfuse"),
             ("decode-grid", "decode/gqa", "B8 Hq32 Hkv8 N32768 D128 bf16", "tensorfuse"),
             ("decode-grid", "decode/mqa", "B1 Hq8 Hkv1 N131072 D128 bf16", "tensorfuse"),
             ("decode-masks", "decode_masks/sliding_window", "N32768", "tensorfuse"),
             ("decode-masks", "decode_masks/static_cache", "N32768", "tensorfuse"),
             ("gemm", "gemm", "8192x4096x14336/nk", "tensorfuse"),
             ("rows-operands", "rows/", "", "tensorfuse"),
             ("rows-vocab", "rows_vocab/cross_entropy", "4096x151936", "tensorfuse"),
             ("rows-vocab", "rows_vocab/softmax", "8192x50257", "tensorfuse"),
             ("cpu", "cpu/causal_attention", "S4096 D64 bf16", "tensorfuse"))


def _results(folder: str = RESULTS_DIR) -> dict:
    """benchmark → {device: the newest CSV's path} (``<date>-<device>-<benchmark>.csv``) of
    those with rows: a run whose every implementation failed its check writes the header alone
    (``common.write_csv``), and the run before it stays the current one."""
    found: dict = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".csv") or len(name) < 12 or not _has_rows(os.path.join(folder,
                                                                                      name)):
            continue
        benchmark = name[11:-4].partition("-")[2]
        if benchmark:   # sorted by name: the newest date last
            found.setdefault(benchmark, {})[_device_of(name)] = os.path.join(folder, name)
    return found


def _has_rows(path: str) -> bool:
    with open(path, newline="") as f:
        return sum(1 for _ in zip(range(2), csv.reader(f))) > 1


def _device_of(path: str) -> str:
    return os.path.basename(path)[11:].partition("-")[0]   # after the date


def _number(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return 0.0


def _rate(row: dict) -> str:
    """TFLOP/s or GB/s, whichever the row has (3 significant digits: CPU rates are small)."""
    for field, unit in (("tflops", "TFLOP/s"), ("gbps", "GB/s")):
        value = _number(row.get(field))
        if value > 0:
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"
    return ""


def _groups(rows: list) -> dict:
    """(case, shape) → its rows, in the CSV's order (the ceilings measured apart)."""
    from benchmarks.common import canonical_label

    groups: dict = {}
    for r in rows:
        r = {**r, "implementation": canonical_label(r["implementation"])}
        groups.setdefault((r["benchmark"], r["shape"]), []).append(r)
    return groups


def _best_alternative(entries: list) -> dict | None:
    from benchmarks.common import is_alternative

    timed = [r for r in entries if is_alternative(r["implementation"]) and _number(r["ms"]) > 0]
    return min(timed, key=lambda r: _number(r["ms"])) if timed else None


def standard_table(rows: list) -> str:
    """One line per (case, shape, implementation): ms, rate, tensorfuse's speed against the
    fastest alternative of its case, the fraction of the measured ceiling."""
    from benchmarks.common import is_alternative

    lines = ["| case | shape | implementation | ms | rate | × best alternative | of ceiling |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    groups = _groups(rows)
    for (case, shape), entries in groups.items():
        if case.startswith("ceiling"):
            continue
        best = _best_alternative(entries)
        for r in entries:
            ratio = ""
            ours = not is_alternative(r["implementation"]) and _number(r["ms"]) > 0
            if best is not None and ours:
                ratio = f"{_number(best['ms']) / _number(r['ms']):.2f}× {best['implementation']}"
            ceiling = _number(r.get("fraction_of_ceiling"))
            lines.append(f"| {case} | {shape} | {r['implementation']} | {_number(r['ms']):.4f} | "
                         f"{_rate(r)} | {ratio} | {f'{ceiling:.0%}' if ceiling > 0 else ''} |")
    ceilings = [f"{c}: {_rate(r) or r['ms'] + ' ms'}" for (c, _), es in groups.items()
                if c.startswith("ceiling") for r in es[:1]]
    if ceilings:
        lines += ["", "Ceilings measured in the same run: " + "; ".join(ceilings) + "."]
    summary = geomean_line(groups)
    if summary:
        lines += ["", summary]
    return "\n".join(lines)


def geomean_line(groups: dict) -> str:
    """The geometric mean (to three places: the user suite's bar is 1.2×) of ``tensorfuse``
    (``tf.compile``'s choice) — and of each
    ``tensorfuse <variant>`` (tuned, a template by hand) — against the best alternative over the
    cases that have both, and the slowest case; a label in fewer than three cases is left out."""
    import math

    from benchmarks.common import TENSORFUSE

    labels = sorted({r["implementation"] for entries in groups.values() for r in entries
                     if r["implementation"].startswith(TENSORFUSE)},
                    key=lambda label: (label != TENSORFUSE, label))
    lines = []
    for label in labels:
        ratios = []
        for (case, shape), entries in groups.items():
            best = _best_alternative(entries)
            ours = [r for r in entries if r["implementation"] == label and _number(r["ms"]) > 0]
            if best is not None and ours:
                ratios.append((_number(best["ms"]) / _number(ours[0]["ms"]), case))
        if len(ratios) < 3:
            continue
        mean = math.exp(sum(math.log(r) for r, _ in ratios) / len(ratios))
        low, case = min(ratios)
        lines.append(f"Geometric mean of `{label}` against the best alternative over "
                     f"{len(ratios)} cases: {mean:.3f}× (lowest: {case}, {low:.2f}×).")
    return "\n".join(lines)


def plain_table(rows: list) -> str:
    """Every column as it is (CSVs of their own schema: tuning jobs)."""
    columns = list(rows[0])
    return "\n".join(["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)] +
                     ["| " + " | ".join(r[c] for c in columns) + " |" for r in rows])


def _table(path: str, superseded: set = frozenset()) -> str:
    """The CSV's table, without the cases in ``superseded`` (run again since, on their own)."""
    every = load(path)
    rows = [r for r in every if r.get("benchmark") not in superseded]
    if not rows:
        return "(every case was run again since, on its own: the sections below)" if every \
            else "(no rows)"
    return standard_table(rows) if "implementation" in rows[0] else plain_table(rows)


def _superseded(found: dict, benchmark: str, device: str) -> tuple[set, list]:
    """The cases of ``benchmark``'s newest CSV on ``device`` that a newer CSV of one of its parts
    (``<benchmark>-<part>``: the same benchmark with ``--only``) has run again, and those parts."""
    path = found[benchmark][device]
    cases, parts = set(), []
    for other, devices in found.items():
        newer = devices.get(device)
        if other.startswith(benchmark + "-") and newer and \
                os.path.basename(newer)[:10] > os.path.basename(path)[:10]:
            # (plain tables — a tuning job's — have no benchmark column: nothing to supersede)
            again = ({r.get("benchmark") for r in load(newer)} &
                     {r.get("benchmark") for r in load(path)}) - {None}
            if again:
                cases |= again
                parts.append(other)
    return cases, parts


def results_markdown(found: dict) -> str:
    """RESULTS.md: per benchmark, per device, the newest run's table and plot."""
    known = [s[0] for s in SECTIONS]
    sections = list(SECTIONS) + [(b, b, "", f"(the CSV {b})") for b in sorted(found)
                                 if b not in known]
    lines = ["# Results", "",
             "The newest run of each benchmark on each device, as `python -m benchmarks.report` "
             "writes it from `benchmarks/results/` (do not edit by hand). Every benchmark checks "
             "each kernel against a float64 reference before it times it, and times the "
             "alternatives in the same process on the same GPU (medians; L2 flushed between "
             "runs). `× best alternative`: the fastest alternative's time over tensorfuse's "
             "(above 1: tensorfuse is faster). Earlier runs are in git's history.", ""]
    late = behind(found)
    if late:
        lines += ["## Where tensorfuse is behind", "",
                  f"Every case of the newest runs on each device where `tf.compile`'s "
                  f"defaults reach less than {BEHIND:.2f}× the fastest alternative's speed (a "
                  f"case in several runs: its newest), the furthest behind first; each run's "
                  f"section below has its plans and ceilings.", "",
                  behind_table(late), ""]
    for benchmark, title, what, command in sections:
        if benchmark not in found:
            continue
        lines += [f"## {title}", "", f"{what}. `{command}`" if what else f"`{command}`", ""]
        for device, path in sorted(found[benchmark].items()):
            name = os.path.basename(path)
            superseded, parts = _superseded(found, benchmark, device)
            lines += [f"### {device.replace('_', ' ')}, {name[:10]}", "",
                      f"`results/{name}`" + (f" ({', '.join(sorted(superseded))}: newer in "
                                              f"{', '.join(parts)})" if parts else ""),
                      "", _table(path, superseded), ""]
            plot_png = path[:-4] + ".png"
            if os.path.exists(plot_png):
                lines += [f"![{benchmark} on {device}](results/{os.path.basename(plot_png)})", ""]
    return "\n".join(lines).rstrip() + "\n"


def readme_table(found: dict) -> str:
    """A few lines of each benchmark's run on the device measured last (the device of the newest
    CSV; another device's newest run where it has none): tensorfuse (``tf.compile``) against the
    fastest alternative in the same run."""
    lines = ["| kernel | shape | device | tensorfuse | fastest alternative | × |",
             "| --- | --- | --- | ---: | --- | ---: |"]
    paths = [p for runs in found.values() for p in runs.values()]
    current = _device_of(max(paths, key=os.path.basename)) if paths else None
    newest = {b: runs.get(current) or max(runs.values(), key=os.path.basename)
              for b, runs in found.items()}
    grouped = {b: _groups(load(path)) for b, path in newest.items()
               if b in {h[0] for h in HEADLINES}}
    for benchmark, case, shape, label in HEADLINES:
        if benchmark not in grouped:
            continue
        device = _device_of(newest[benchmark])
        for (c, s), entries in grouped[benchmark].items():
            mine = [r for r in entries if r["implementation"] == label]
            best = _best_alternative(entries)
            if not (c.startswith(case) and shape in s and mine and best and
                    _number(mine[0]["ms"]) > 0) or c.startswith("ceiling"):
                continue
            ours, theirs = (_rate(r) or f"{_number(r['ms']):.3f} ms" for r in (mine[0], best))
            lines.append(f"| {c} | {s} | {device.replace('_', ' ')} | {ours} | "
                         f"{best['implementation']} ({theirs}) | "
                         f"{_number(best['ms']) / _number(mine[0]['ms']):.2f}× |")
    return "\n".join(lines)


# a case is "behind" below this fraction of the fastest alternative's speed: closer than 3 % is
# within the spread of repeated runs of the same kernel (the suites' reruns of unchanged cases)
BEHIND = 0.97
README_BEHIND_ROWS = 15   # the README lists the furthest behind; RESULTS.md every one


def behind(found: dict) -> list:
    """Every case of the newest runs, on every device, where ``tensorfuse`` (``tf.compile``'s
    defaults) is below :data:`BEHIND` of the fastest alternative's speed: ``(ratio, case, shape,
    device, ours, theirs, alternative, date, benchmark)``, the furthest behind first; a case and
    shape on one device in several benchmarks (a knob sweep's defaults, a suite's row) as its
    newest run says, cases run again on their own since as that run says
    (:func:`_superseded`)."""
    newest: dict = {}
    for benchmark, runs in found.items():
        for device, path in runs.items():
            superseded, _ = _superseded(found, benchmark, device)
            rows = [r for r in load(path) if r.get("benchmark") not in superseded]
            if not rows or "implementation" not in rows[0]:
                continue   # a plain table (a tuning job's) compares nothing
            date = os.path.basename(path)[:10]
            for (case, shape), entries in _groups(rows).items():
                mine = [r for r in entries if r["implementation"] == "tensorfuse"
                        and _number(r["ms"]) > 0]
                best = _best_alternative(entries)
                if case.startswith("ceiling") or not (mine and best):
                    continue
                known = newest.get((device, case, shape))
                if known is None or known[7] <= date:
                    newest[(device, case, shape)] = (
                        _number(best["ms"]) / _number(mine[0]["ms"]), case, shape,
                        device.replace("_", " "),
                        _rate(mine[0]) or f"{_number(mine[0]['ms']):.3f} ms",
                        _rate(best) or f"{_number(best['ms']):.3f} ms",
                        best["implementation"], date, benchmark)
    return sorted(e for e in newest.values() if e[0] < BEHIND)


def behind_table(entries: list) -> str:
    """:func:`behind`'s entries as a table (the run: its date and CSV's benchmark name)."""
    lines = ["| kernel | shape | device | tensorfuse | fastest alternative | × | run |",
             "| --- | --- | --- | ---: | --- | ---: | --- |"]
    lines += [f"| {case} | {shape} | {device} | {ours} | {label} ({theirs}) | {ratio:.2f}× | "
              f"{date} {benchmark} |"
              for ratio, case, shape, device, ours, theirs, label, date, benchmark in entries]
    return "\n".join(lines)


def _with_readme_table(readme: str, table: str, markers=(README_BEGIN, README_END)) -> str:
    """``readme`` with ``table`` between the ``markers`` (begin, end)."""
    begin, end = readme.index(markers[0]) + len(markers[0]), readme.index(markers[1])
    return readme[:begin] + "\n" + table + "\n" + readme[end:]


def main(argv: list[str]) -> int:
    found = _results()
    want = {RESULTS_MD: results_markdown(found)}
    with open(README) as f:
        readme = f.read()
    if README_BEGIN in readme:
        readme = _with_readme_table(readme, readme_table(found))
    if BEHIND_BEGIN in readme:
        readme = _with_readme_table(readme, behind_table(behind(found)[:README_BEHIND_ROWS]),
                                    (BEHIND_BEGIN, BEHIND_END))
    want[README] = readme
    stale = []
    for path, text in want.items():
        with open(path) as f:
            if f.read() == text:
                continue
        stale.append(os.path.relpath(path, os.path.dirname(HERE)))
        if "--check" not in argv:
            with open(path, "w") as f:
                f.write(text)
    if "--check" in argv and stale:
        print(f"not current: {', '.join(stale)} (run python -m benchmarks.report)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
