"""A Llama-architecture model end to end: tensorfuse's attention, RMSNorm and SwiGLU MLP inside
transformers' ``LlamaForCausalLM`` (``MistralForCausalLM`` for the configs with a sliding
window) against the same model with ``attn_implementation="sdpa"`` and ``"flex_attention"`` — one
process, one set of random weights (nothing downloaded).

    python -m benchmarks.model --csv results/DATE-DEVICE-model.csv    # Llama-3-8B's shape, GPU
    python -m benchmarks.model --config tiny                           # a few layers, CPU or GPU

Phases (CSV rows ``model/<phase>/<shape>``):
- prefill: ``B`` sequences of ``S`` tokens (no cache; the logits of the last token), tokens/s;
- decode: one new token per sequence after a ``StaticCache`` holding ``context`` tokens (random
  keys and values written through the cache's own ``update``), tokens/s; each timed step appends
  a token, so the cache is sized for every step of the run;
- train: a training step's forward and backward (``loss.backward()`` of the next-token loss on
  ``B`` sequences of ``S`` tokens, in ``model.train()``), tokens/s; the first layer's query
  projection's gradient compared with SDPA's (it depends on every layer's backward).

    python -m benchmarks.model --config llama3-8b-4l --prefill-batches "" --decode-batches "" \
        --train-batches 1 --csv results/DATE-DEVICE-model-train.csv

Every implementation is timed in turn, ``ROUNDS`` rounds, each the median of CUDA-event timings
of whole forward calls (host work included: what a user of the model gets, eagerly). Before
timing, tensorfuse's logits are compared with SDPA's (relative max error, in the CSV note, next
to flex_attention's own distance from SDPA: the spread between two correct bf16 models).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import Row, measure_ceilings, write_csv

ROUNDS = 3
CONFIGS = {
    # Llama 3 8B's shape (GQA: 32 query heads, 8 key/value heads, head dim 128)
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, num_hidden_layers=32, vocab_size=128256,
                      max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5),
    # its first four layers: a training step's backward fits beside the prefill's kernels
    "llama3-8b-4l": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                         num_key_value_heads=8, num_hidden_layers=4, vocab_size=128256,
                         max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                 num_key_value_heads=2, num_hidden_layers=2, vocab_size=1000,
                 max_position_embeddings=4096),
    # Mistral 7B's shape with every layer's keys in a window of 1024 behind the query (as
    # Gemma 3's local layers): the model whose alternative is FlexAttention's block mask
    "mistral-7b-4l-sw1024": dict(hidden_size=4096, intermediate_size=14336,
                                 num_attention_heads=32, num_key_value_heads=8,
                                 num_hidden_layers=4, vocab_size=32768,
                                 max_position_embeddings=32768, rope_theta=1000000.0,
                                 rms_norm_eps=1e-5, sliding_window=1024),
    "tiny-sw": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                    num_key_value_heads=2, num_hidden_layers=2, vocab_size=1000,
                    max_position_embeddings=4096, sliding_window=8),
}
IMPLEMENTATIONS = ("sdpa", "flex_attention", "tensorfuse", "tensorfuse-attention")
# relative max error of the bf16 model's logits against SDPA's: 32 random layers in bf16 put two
# correct implementations ~5e-2 apart (flex_attention vs SDPA on the H100, 2026-11-24)
LOGITS_TOLERANCE = 0.1


def build_model(config: str, device: str, dtype=torch.bfloat16):
    """A ``LlamaForCausalLM`` (``MistralForCausalLM`` where the config has a sliding window)
    with random weights (seed 0) on ``device``."""
    import transformers

    family = "Mistral" if "sliding_window" in CONFIGS[config] else "Llama"
    model_class = getattr(transformers, f"{family}ForCausalLM")
    config_class = getattr(transformers, f"{family}Config")
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_class(config_class(**CONFIGS[config]))
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def select(model, implementation: str):
    """Switch ``model`` to one implementation (the same weights throughout)."""
    from tensorfuse.integrations import huggingface as tfh

    tfh.restore(model, "sdpa")
    if implementation == "flex_attention":
        model.set_attn_implementation("flex_attention")
    elif implementation == "tensorfuse":
        tfh.use_tensorfuse(model)
    elif implementation == "tensorfuse-attention":   # the other layers as transformers has them
        tfh.use_tensorfuse(model, norms=False, mlp=False)
    elif implementation == "tensorfuse-norms":   # attention and RMSNorms, transformers' MLPs
        tfh.use_tensorfuse(model, mlp=False)
    elif implementation != "sdpa":
        raise ValueError(f"unknown implementation {implementation!r}")


def timed_ms(fn, repeat: int) -> float:
    """Milliseconds per call of ``fn`` (one warm-up call, then ``repeat`` calls between events)."""
    fn()
    if not torch.cuda.is_available():
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        return (time.perf_counter() - start) * 1e3 / repeat
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / repeat


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def rewind(cache, length: int) -> None:
    """Make a ``StaticCache`` forget what was appended after ``length`` tokens (its layers count
    what they hold in ``cumulative_length``), so that every implementation's first step sees the
    same cache."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(length)


def compare(model, implementations, run, repeat: int, log, cache=None) -> dict:
    """Logits of ``run()`` under each implementation against SDPA's (from the same ``cache``
    state, where there is one), then the implementations timed in turn:
    ``{implementation: (median ms, relative error vs SDPA)}``."""
    errors = {}
    held = int(cache.get_seq_length()) if cache is not None else 0
    with torch.no_grad():
        select(model, "sdpa")
        ref = run()
        for impl in implementations:
            select(model, impl)
            if cache is not None:
                rewind(cache, held)
            started = time.perf_counter()
            errors[impl] = relative_error(run(), ref)
            log(f"  {impl}: first call {time.perf_counter() - started:.1f} s, logits vs sdpa "
                f"{errors[impl]:.2e}")
        times = {impl: [] for impl in implementations}
        for _ in range(ROUNDS):
            for impl in implementations:
                select(model, impl)
                times[impl].append(timed_ms(run, repeat))
    select(model, "sdpa")
    return {impl: (statistics.median(times[impl]), errors[impl]) for impl in implementations}


def model_flops_per_token(config: dict) -> float:
    """Multiply-adds × 2 of the projections and MLP per token (the LM head of the last token and
    the attention scores are counted separately)."""
    h, f = config["hidden_size"], config["intermediate_size"]
    kv = h * config["num_key_value_heads"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * (2 * h * h + 2 * h * kv + 3 * h * f)


def prefill(model, config: str, batch: int, seq: int, implementations, log) -> tuple:
    """The prefill of ``batch`` sequences of ``seq`` tokens measured: the arguments of
    :func:`rows` but the ceilings."""
    c = CONFIGS[config]
    ids = torch.randint(0, c["vocab_size"], (batch, seq), device=model.device)
    run = (lambda: model(ids, use_cache=False, logits_to_keep=1).logits)
    result = compare(model, implementations, run, 2 if seq * batch >= 8192 else 5, log)
    flops = model_flops_per_token(c) * batch * seq + attention_flops(c, batch, seq)
    return "prefill", f"{config} B{batch}-S{seq}", batch * seq, flops, 0.0, result


def decode(model, config: str, batch: int, context: int, implementations, log,
           steps: int = 10) -> tuple:
    from transformers import StaticCache

    c = CONFIGS[config]
    calls = (len(implementations) + 1) * (ROUNDS + 1) * (steps + 1) + 8
    cache = StaticCache(config=model.config, max_cache_len=context + calls)
    head = c["hidden_size"] // c["num_attention_heads"]
    shape = (batch, c["num_key_value_heads"], context, head)
    for layer in range(c["num_hidden_layers"]):
        cache.update(torch.randn(shape, device=model.device, dtype=model.dtype),
                     torch.randn(shape, device=model.device, dtype=model.dtype), layer)
    token = torch.randint(0, c["vocab_size"], (batch, 1), device=model.device)
    run = (lambda: model(token, past_key_values=cache, use_cache=True).logits)
    result = compare(model, implementations, run, steps, log, cache)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) - \
        model.model.embed_tokens.weight.numel() * model.dtype.itemsize
    kv_bytes = 2 * c["num_hidden_layers"] * batch * c["num_key_value_heads"] * context * head * 2
    flops = model_flops_per_token(c) * batch
    return "decode", f"{config} B{batch}-ctx{context}", batch, flops, weights + kv_bytes, result


def train(model, config: str, batch: int, seq: int, implementations, log,
          on_row=lambda impl, ms, err: None, repeat: int = 3) -> tuple:
    """A training step (forward and backward) on ``batch`` sequences of ``seq`` tokens under each
    implementation in turn — its first call (compiles), the gradient check, then ``ROUNDS``
    timings — reporting each as it is measured (``on_row``): a run cut short keeps what it
    measured. The arguments of :func:`rows` but the ceilings."""
    c = CONFIGS[config]
    ids = torch.randint(0, c["vocab_size"], (batch, seq), device=model.device)
    probe = model.model.layers[0].self_attn.q_proj.weight

    def step():
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
        return probe.grad

    model.train()
    result = {}
    try:
        select(model, "sdpa")
        ref = step().clone()
        for impl in implementations:
            select(model, impl)
            started = time.perf_counter()
            err = relative_error(step(), ref)
            log(f"  {impl}: first step {time.perf_counter() - started:.1f} s, gradient vs sdpa "
                f"{err:.2e}")
            ms = statistics.median(timed_ms(step, repeat) for _ in range(ROUNDS))
            result[impl] = (ms, err)
            on_row(impl, ms, err)
    finally:
        select(model, "sdpa")
        model.eval()
    return (*train_measured(config, batch, seq), result)


def train_measured(config: str, batch: int, seq: int) -> tuple:
    """What a training step's rows are made of but the times: phase, shape, tokens, FLOPs and
    bytes (:func:`rows`' arguments before the result)."""
    return "train", f"{config} B{batch}-S{seq}", batch * seq, train_flops(config, batch, seq), 0.0


def train_flops(config: str, batch: int, seq: int) -> float:
    """A training step's FLOPs: the forward's (projections, MLP, causal attention) three times
    (the backward's products are twice the forward's)."""
    c = CONFIGS[config]
    return 3 * (model_flops_per_token(c) * batch * seq + attention_flops(c, batch, seq))


def attention_flops(config: dict, batch: int, seq: int) -> float:
    """The score and value products of every layer over the keys each query keeps: causal, and
    at most ``sliding_window`` keys where the config has one."""
    head = config["hidden_size"] // config["num_attention_heads"]
    window = config.get("sliding_window") or seq
    kept = sum(min(i + 1, window) for i in range(seq))   # (query, key) pairs
    return 2 * 2 * batch * config["num_attention_heads"] * kept * head * \
        config["num_hidden_layers"]


def rows(phase, shape, tokens, flops, bytes_moved, result, ceilings: dict) -> list[Row]:
    """CSV rows of one measured phase and shape, with the fraction of the run's ceiling (copy
    bandwidth for decode, cuBLAS GEMM rate for prefill)."""
    out = []
    for impl, (ms, err) in result.items():
        tflops = flops / ms / 1e9
        gbps = bytes_moved / ms / 1e6
        fraction = gbps / (ceilings["copy_tbps"] * 1e3) if bytes_moved else \
            tflops / ceilings["gemm_tflops"]
        what = "first layer's q_proj gradient" if phase == "train" else "logits"
        note = f"tokens/s={tokens / ms * 1e3:.0f}; {what} vs sdpa {err:.1e}"
        out.append(Row(f"model/{phase}", shape, impl, ms, tflops, gbps, fraction, note))
    return out




def summary(all_rows: list[Row]) -> str:
    """A table: tokens/s per implementation and tensorfuse's ratio to each baseline."""
    labels = list(dict.fromkeys([*IMPLEMENTATIONS, *(r.implementation for r in all_rows)]))
    lines = [f"{'phase':8} {'shape':28} " + " ".join(f"{i:>20}" for i in labels) +
             "   tf/sdpa  tf/flex"]
    by = {(r.benchmark, r.shape, r.implementation): r for r in all_rows}
    for phase, shape in dict.fromkeys((r.benchmark, r.shape) for r in all_rows):
        ms = {i: by[(phase, shape, i)].ms for i in labels if (phase, shape, i) in by}
        cells = " ".join(f"{ms[i]:18.3f}ms" if i in ms else f"{'-':>20}" for i in labels)
        ratio = (lambda b: f"{ms[b] / ms['tensorfuse']:8.3f}" if b in ms and "tensorfuse" in ms
                 else f"{'-':>8}")
        lines.append(f"{phase[6:]:8} {shape:28} {cells} {ratio('sdpa')} {ratio('flex_attention')}")
    return "\n".join(lines)


def precompile(config: str, seq: int, prefill_batches, decode_batches) -> None:
    """nvcc, here and without a GPU, the Hopper kernels the tensorfuse model will launch (cached
    by source in TENSORFUSE_CACHE): attention and MLP at every prefill shape, the MLP at the
    decode batches (decode attention and the norms are Triton kernels, compiled where they run)."""
    import tensorfuse as tf
    from benchmarks.gemm import precompile as nvcc_all
    from tensorfuse.kernels.layers import attention_kernel, swiglu_mlp_kernel

    c = CONFIGS[config]
    heads = dict(H=c["num_attention_heads"], HKV=c["num_key_value_heads"],
                 D=c["hidden_size"] // c["num_attention_heads"])
    attention = tf.compile(attention_kernel("bf16", True, False, False), target="cuda:sm_90a")
    nvcc_all([attention], [dict(B=b, M=seq, N=seq, **heads) for b in prefill_batches])
    mlp = tf.compile(swiglu_mlp_kernel("bf16"), target="cuda:sm_90a")
    nvcc_all([mlp], [dict(M=m, K=c["hidden_size"], N=c["intermediate_size"], O=c["hidden_size"])
                     for m in [b * seq for b in prefill_batches] + list(decode_batches)])


def run(log, config: str = "llama3-8b", prefill_batches=(1, 2, 4, 8), seq: int = 4096,
        decode_batches=(1, 8), context: int = 32768, implementations=IMPLEMENTATIONS,
        csv_path: str | None = None, train_batches=()) -> list[Row]:
    """Every phase and shape in turn (``benchmarks.run --only model`` calls this); the CSV is
    rewritten after every shape, so a run cut short keeps what it measured."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ceilings = measure_ceilings() if device == "cuda" else \
        {"copy_tbps": float("nan"), "gemm_tflops": float("nan")}
    model = build_model(config, device)
    out: list[Row] = []
    for phase, batches, length in (("prefill", prefill_batches, seq),
                                   ("decode", decode_batches, context)):
        for b in batches:
            log(f"{phase} B={b} {'S' if phase == 'prefill' else 'context'}={length}")
            measure = prefill if phase == "prefill" else decode
            out += rows(*measure(model, config, b, length, implementations, log), ceilings)
            if csv_path:
                write_csv(out, csv_path)
    for b in train_batches:
        log(f"train B={b} S={seq}")
        done: dict = {}
        measured = train_measured(config, b, seq)

        def keep(impl, ms, err):   # each implementation's row as soon as it is timed
            done[impl] = (ms, err)
            if csv_path:
                write_csv(out + rows(*measured, dict(done), ceilings), csv_path)

        train(model, config, b, seq, implementations, log, keep)
        out += rows(*measured, done, ceilings)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="llama3-8b", choices=sorted(CONFIGS))
    parser.add_argument("--prefill-batches", default="1,2,4,8")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--decode-batches", default="1,8")
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--train-batches", default="",
                        help="batches of --seq tokens to time a training step at (e.g. 1)")
    parser.add_argument("--implementations", default=",".join(IMPLEMENTATIONS))
    parser.add_argument("--csv", default=None)
    parser.add_argument("--precompile", action="store_true",
                        help="only compile the Hopper kernels (no GPU needed) into TENSORFUSE_CACHE")
    args = parser.parse_args(argv)
    prefill_batches = [int(x) for x in args.prefill_batches.split(",") if x]
    decode_batches = [int(x) for x in args.decode_batches.split(",") if x]
    if args.precompile:
        precompile(args.config, args.seq, prefill_batches, decode_batches)
        return
    out = run(lambda text: print(text, flush=True), args.config, prefill_batches, args.seq,
              decode_batches, args.context, [i for i in args.implementations.split(",") if i],
              args.csv, [int(x) for x in args.train_batches.split(",") if x])
    print(summary(out))
    bad = [r for r in out if "inf" in r.note or float(r.note.split("sdpa ")[1]) > LOGITS_TOLERANCE]
    for r in bad:
        print(f"LOGITS DIFFER: {r.benchmark} {r.shape} {r.implementation}: {r.note}")


if __name__ == "__main__":
    main()
