"""tensorfuse inside transformers' models: the attention registered in transformers' registries and
the Llama-style RMSNorm / SwiGLU MLP replaced, checked against the same model on SDPA (CPU here;
the same tests run on the GPU with the ``gpu`` mark's device)."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from tensorfuse.integrations import huggingface as tfh  # noqa: E402
from tests.helpers import fresh_seed  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=2, vocab_size=100, max_position_embeddings=256)
# logits' relative max error against SDPA's: f32 is exact up to summation order; bf16 rounds
# every layer's output once where transformers rounds twice
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def tiny_llama(dtype, device="cpu", **overrides):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**TINY, **overrides})).to(device, dtype).eval()


def relative(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def replaced(model):
    return {type(m).__name__ for m in model.modules() if "forward" in vars(m)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_logits_match_sdpa(dtype):
    model = tiny_llama(dtype)
    ids = torch.randint(0, 100, (2, 21))
    with torch.no_grad():
        want = model(ids).logits
        tfh.use_tensorfuse(model)
        assert model.config._attn_implementation == "tensorfuse"
        assert replaced(model) == {"LlamaRMSNorm", "LlamaMLP"}
        got = model(ids).logits
    assert relative(got, want) <= TOLERANCE[dtype]


def test_padded_batch_uses_the_mask_and_matches_sdpa():
    model = tiny_llama(torch.float32)
    ids = torch.randint(0, 100, (3, 17))
    mask = torch.ones(3, 17, dtype=torch.long)
    mask[0, :6] = 0          # left padding
    mask[2, 12:] = 0         # right padding
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits
        got = tfh.use_tensorfuse(model)(ids, attention_mask=mask).logits
    keep = mask.bool()
    assert torch.isfinite(got).all()
    assert relative(got[keep], want[keep]) <= TOLERANCE[torch.float32]


def _float_mask(batch: int, length: int, seed: int, dtype=torch.bfloat16):
    """A bias per sequence with causality and left padding as transformers writes them (the
    dtype's lowest value): the padded sequence's first rows are masked whole, and weigh their
    keys equally in the math as written (SDPA's too)."""
    generator = torch.Generator().manual_seed(seed)
    lowest = torch.finfo(dtype).min
    bias = torch.randn(batch, 1, length, length, generator=generator)
    bias = bias.masked_fill(~torch.ones(length, length, dtype=torch.bool).tril(), lowest)
    bias[0, :, :, :4] = lowest
    return bias.to(dtype)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_16_bit_float_mask_is_added_to_the_scores_on_tensorfuse(device, only_tensorfuse):
    """A prepared 16-bit float mask ``[B, 1, M, N]`` (or one ``[1, 1, M, N]`` for every
    sequence) is added to the scores by tensorfuse's kernel, SDPA never called, with the SDPA
    model's logits. On the CPU on every row: SDPA's math weighs the keys of a row masked whole
    equally, as tensorfuse does. On the GPU (304 tokens, rows of whole 16 bytes: on an
    H100/H200 the Hopper template reads the mask as score tiles) on the rows the mask keeps a
    key of — SDPA's GPU kernels take a row masked whole as empty, not as the math written (the
    float64 checks of ``test_score_tiles`` hold tensorfuse's to it) — and finite everywhere."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    length = 304 if device == "cuda" else 11
    model = tiny_llama(torch.bfloat16, device, **(ON_GPU if device == "cuda" else {}))
    ids = torch.randint(0, 100, (2, length), device=device)
    biases = [_float_mask(b, length, fresh_seed()).to(device) for b in (2, 1)]
    with torch.no_grad():
        wants = [model(ids, attention_mask=bias).logits for bias in biases]
        tfh.use_tensorfuse(model)
        only_tensorfuse()
        gots = [model(ids, attention_mask=bias).logits for bias in biases]
    for got, want, bias in zip(gots, wants, biases):
        assert torch.isfinite(got).all()
        rows = torch.ones(got.shape[:2], dtype=torch.bool, device=device)
        if device == "cuda":
            rows &= (bias > torch.finfo(bias.dtype).min).any(-1)[:, 0]
        assert relative(got[rows], want[rows]) <= TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("dtype, shape", [(torch.float32, (2, 1, 11, 11)),
                                          (torch.bfloat16, (2, 4, 11, 11)),
                                          (torch.bfloat16, (2, 1, 1, 11))])
def test_float_masks_in_float32_per_head_or_broadcast_go_to_sdpa(dtype, shape, monkeypatch):
    """A float32 mask (its lowest value is the rolled maximum's identity), one per head, or one
    row broadcast over the queries runs on transformers' SDPA path: the same logits, the rows
    masked whole included."""
    from transformers.integrations import sdpa_attention

    model = tiny_llama(dtype)
    ids = torch.randint(0, 100, (2, 11))
    bias = _float_mask(2, 11, fresh_seed(), dtype)[:, :, :shape[2]].expand(shape).contiguous()
    with torch.no_grad():
        want = model(ids, attention_mask=bias).logits
        handed_back = []
        own = sdpa_attention.sdpa_attention_forward
        monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward",
                            lambda *args, **kwargs: handed_back.append(1) or own(*args, **kwargs))
        got = tfh.use_tensorfuse(model, norms=False, mlp=False)(ids, attention_mask=bias).logits
    assert len(handed_back) == TINY["num_hidden_layers"]
    assert torch.isfinite(got).all()
    assert relative(got, want) <= TOLERANCE[dtype]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generation_matches_sdpa(cache):
    """Prefill then decode through a cache (static: a fixed length and a mask of filled slots)."""
    model = tiny_llama(torch.float32)
    ids = torch.randint(0, 100, (2, 9))
    kwargs = dict(max_new_tokens=5, do_sample=False, cache_implementation=cache,
                  output_logits=True, return_dict_in_generate=True, pad_token_id=0,
                  attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        want = model.generate(ids, **kwargs)
        got = tfh.use_tensorfuse(model).generate(ids, **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.logits, want.logits):
        assert relative(a, b) <= TOLERANCE[torch.float32]


def test_restore_gives_transformers_layers_back():
    model = tfh.use_tensorfuse(tiny_llama(torch.float32))
    tfh.restore(model)
    assert replaced(model) == set()
    assert model.config._attn_implementation == "sdpa"


def test_parts_can_be_left_out_and_other_modules_are_untouched():
    model = tfh.use_tensorfuse(tiny_llama(torch.float32), attention=False, mlp=False)
    assert replaced(model) == {"LlamaRMSNorm"}
    assert model.config._attn_implementation != "tensorfuse"
    gated = tiny_llama(torch.float32, hidden_act="gelu")   # not SwiGLU: its MLP stays
    assert replaced(tfh.use_tensorfuse(gated)) == {"LlamaRMSNorm"}


def test_copies_of_llamas_layers_are_recognised_by_their_code():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**TINY)).eval()
    ids = torch.randint(0, 100, (1, 13))
    with torch.no_grad():
        want = model(ids).logits
        got = tfh.use_tensorfuse(model)(ids).logits
    assert replaced(model) == {"Qwen2RMSNorm", "Qwen2MLP"}
    assert relative(got, want) <= TOLERANCE[torch.float32]


def test_softcap_and_sliding_window_of_gemma2_match_eager():
    """Gemma 2 passes a logit soft-cap and alternates sliding-window layers (their masks come
    from the mask function); its RMSNorm scales by (1 + weight), so it is not replaced."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(**TINY, head_dim=16, sliding_window=8, attn_logit_softcapping=20.0,
                          attn_implementation="eager")
    model = Gemma2ForCausalLM(config).eval()
    ids = torch.randint(0, 100, (2, 19))
    with torch.no_grad():
        want = model(ids).logits
        got = tfh.use_tensorfuse(model, norms=False, mlp=False)(ids).logits
    assert "Gemma2RMSNorm" not in replaced(tfh.use_tensorfuse(model))
    assert relative(got, want) <= TOLERANCE[torch.float32]


def tiny_gpt_oss(**overrides):
    """Two layers of gpt-oss's shape (a sliding-window layer, then a full one; grouped heads,
    per-head sinks drawn large so that they matter) on transformers' eager attention; every
    expert taken (a rounding cannot flip a discrete routing choice, so bf16 logits compare)."""
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    config = GptOssConfig(**{**dict(
        hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_hidden_layers=2, num_local_experts=2, num_experts_per_tok=2,
        sliding_window=8, layer_types=["sliding_attention", "full_attention"], vocab_size=100,
        attn_implementation="eager"), **overrides})
    model = GptOssForCausalLM(config).eval()
    for module in model.modules():
        if hasattr(module, "sinks"):
            torch.nn.init.normal_(module.sinks, std=2.0)
    return model


@pytest.mark.parametrize("dtype, sinks", [(torch.float32, torch.float32),
                                          (torch.bfloat16, torch.bfloat16),
                                          (torch.bfloat16, torch.float32)])
def test_attention_sinks_of_gpt_oss_run_on_tensorfuse_and_match_eager(monkeypatch, dtype, sinks):
    """gpt-oss passes its sinks as ``s_aux``: tensorfuse's sink kernel takes them (its eager
    code is not called), on both layers' masks, and gives eager's logits — in bf16 too, with
    sinks kept in float32 (the output stays the activations' dtype)."""
    from transformers.models.gpt_oss import modeling_gpt_oss

    model = tiny_gpt_oss().to(dtype)
    for module in model.modules():
        if hasattr(module, "sinks"):
            module.sinks.data = module.sinks.data.to(sinks)
    ids = torch.randint(0, 100, (2, 19))
    with torch.no_grad():
        want = model(ids).logits
        tfh.use_tensorfuse(model, norms=False, mlp=False)

        def refused(*args, **kwargs):
            raise AssertionError("gpt-oss's eager attention ran")
        monkeypatch.setattr(modeling_gpt_oss, "eager_attention_forward", refused)
        got = model(ids).logits
    assert got.dtype == want.dtype and relative(got, want) <= TOLERANCE[dtype]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_gpt_oss_trains_on_tensorfuse_with_eagers_loss_and_gradients(monkeypatch, device):
    """A training step of gpt-oss — sinks on a sliding-window layer (a boolean mask) and a full
    one — runs its attention on tensorfuse's sink kernels while autograd records (gpt-oss's
    eager attention is not called) and gives the loss and every parameter's gradient, the
    sinks' among them, by value: float32 against the eager model; on the GPU bf16 (head dim 64,
    300 tokens: the Hopper forward saving its log-sum-exp, the attention backward template)
    against the same model in float32, each gradient within 2e-2 of it or no further than
    twice the eager bf16 model's (both are bf16 models: a router's bias is 1–2e-2 off in either,
    and tensorfuse's 2.2e-2 from eager's, on the CPU and the H200). A gradient that cancels to
    below ``CANCELLED`` of the largest (the router's bias) is compared at that scale."""
    from transformers.models.gpt_oss import modeling_gpt_oss

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = dict(head_dim=64) if device == "cuda" else {}
    shape = (2, 300) if device == "cuda" else IDS
    ids = torch.randint(0, 100, shape, generator=torch.Generator().manual_seed(fresh_seed()))
    ids = ids.to(device)
    eager = _training_step(tiny_gpt_oss(**config).to(device, dtype), ids)
    swapped = tfh.use_tensorfuse(tiny_gpt_oss(**config).to(device, dtype), norms=False,
                                 mlp=False)

    def refused(*args, **kwargs):
        raise AssertionError("gpt-oss's eager attention ran")
    with monkeypatch.context() as patch:
        patch.setattr(modeling_gpt_oss, "eager_attention_forward", refused)
        got = _training_step(swapped, ids)
    assert any("sinks" in name for name in got[1])
    if dtype == torch.float32:
        _same_step(got, eager, dtype)
        return
    exact = _training_step(tiny_gpt_oss(**config).to(device, dtype).float(), ids)
    assert abs(float(got[0] - exact[0])) <= 2e-2 * abs(float(exact[0]))
    floor = _cancelled_floor(exact[1])
    for name, want in exact[1].items():
        if want.abs().max() > 0:
            ours, theirs = (_norm_relative(step[1][name], want, floor) for step in (got, eager))
            assert ours <= max(2e-2, 2 * theirs), (name, ours, theirs)


@pytest.fixture
def only_tensorfuse(monkeypatch):
    """Fail any call of SDPA or of Llama's own RMSNorm forward (the swapped model's way back to
    transformers' code): the attention and the norms that run are tensorfuse's. The MLP runs
    transformers' code while autograd records (``huggingface``'s docstring says why): it is
    counted, ``calls["mlp"]``."""
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    calls = {"mlp": 0}
    own_mlp = LlamaMLP.forward

    def counted_mlp(self, x):
        calls["mlp"] += 1
        return own_mlp(self, x)

    def refused(what):
        def call(*args, **kwargs):
            raise AssertionError(f"{what} ran: the swapped model stepped aside")
        return call

    def swap():
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", refused("SDPA"))
        monkeypatch.setattr(LlamaRMSNorm, "forward", refused("LlamaRMSNorm.forward"))
        monkeypatch.setattr(LlamaMLP, "forward", counted_mlp)
        return calls
    return swap


def _norm_relative(a, b, floor: float = 0.0) -> float:
    """‖a − b‖ / ‖b‖, or relative to ``floor`` where ``b`` is smaller (:func:`_cancelled_floor`)."""
    return float((a.double() - b.double()).norm() / max(float(b.double().norm()), floor))


# A gradient that is a sum cancelling to a small remainder carries the rounding of its terms,
# not of the remainder: gpt-oss's router bias (two experts, both taken: each token's two logit
# gradients cancel) sums to 1e-4 of the largest gradient, with the same 2–6e-9 absolute error
# in eager's f32 model and in tensorfuse's against float64 — 2–9e-5 relative to itself, past
# 1e-5 for about 1 seed in 12. Such a gradient is compared at this fraction of the largest
# parameter gradient's norm instead (an error of any kernel is orders of magnitude over it).
CANCELLED = 1e-3


def _cancelled_floor(grads: dict) -> float:
    return CANCELLED * max(float(g.double().norm()) for g in grads.values())


# ‖g − g_SDPA‖ / ‖g_SDPA‖ per parameter: f32 up to the order of summation; bf16 rounds every
# layer's output once where transformers rounds twice
GRADIENT_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
IDS = (2, 11)   # one shape for the training tests: their kernels compile once


def _training_step(model, ids):
    model.train()
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n.removeprefix("_orig_mod."): p.grad   # a compiled model's names
                           for n, p in model.named_parameters() if p.requires_grad}


def _same_step(got, want, dtype=torch.float32) -> None:
    (got_loss, got), (want_loss, want) = got, want
    assert abs(float(got_loss - want_loss)) <= GRADIENT_TOLERANCE[dtype] * abs(float(want_loss))
    assert got.keys() == want.keys() and all(g is not None for g in got.values())
    floor = _cancelled_floor(want)
    worst = max((_norm_relative(got[n], want[n], floor), n)
                for n in want if want[n].abs().max() > 0)
    assert worst[0] <= GRADIENT_TOLERANCE[dtype], worst


# on the GPU: head dim 64 and 300 tokens, so that the forward is the Hopper template's (on an
# H100/H200) and its backward the attention backward template reading its log-sum-exps
ON_GPU = dict(hidden_size=256, intermediate_size=512)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_training_runs_on_tensorfuse_with_the_sdpa_models_loss_and_gradients(device, dtype,
                                                                             only_tensorfuse):
    """A training step (autograd recording) through the swapped model runs its attention and
    norms on tensorfuse's kernels — their PyTorch operators and backwards — and its MLPs on
    transformers' code, and gives the loss and every parameter's gradient of the same model on
    SDPA, by value."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    config = ON_GPU if device == "cuda" else {}
    shape = (2, 300) if device == "cuda" else IDS
    ids = torch.randint(0, 100, shape, generator=torch.Generator().manual_seed(fresh_seed()))
    ids = ids.to(device)
    want = _training_step(tiny_llama(dtype, device, **config), ids)
    swapped = tfh.use_tensorfuse(tiny_llama(dtype, device, **config))
    calls = only_tensorfuse()
    got = _training_step(swapped, ids)
    assert calls["mlp"] == TINY["num_hidden_layers"]
    _same_step(got, want, dtype)


def test_gradient_checkpointing_recomputes_on_tensorfuse(only_tensorfuse):
    """With transformers' gradient checkpointing each layer's forward runs again inside the
    backward: the recomputation goes through tensorfuse's operators too, and the step gives the
    loss and gradients of the same checkpointed model on SDPA."""
    ids = torch.randint(0, 100, IDS, generator=torch.Generator().manual_seed(fresh_seed()))

    def checkpointed(model):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model

    want = _training_step(checkpointed(tiny_llama(torch.float32)), ids)
    swapped = checkpointed(tfh.use_tensorfuse(tiny_llama(torch.float32)))
    calls = only_tensorfuse()
    got = _training_step(swapped, ids)
    assert calls["mlp"] == 2 * TINY["num_hidden_layers"]   # the forward, then its recomputation
    _same_step(got, want)


def test_a_torch_compiled_model_trains_on_tensorfuse(only_tensorfuse):
    """``torch.compile`` of the swapped model (AOT autograd: the operators' fake implementations
    and registered backwards traced into the joint graph, SDPA refused throughout) gives the
    loss and gradients of the eager SDPA model."""
    torch._dynamo.reset()
    ids = torch.randint(0, 100, IDS, generator=torch.Generator().manual_seed(fresh_seed()))
    want = _training_step(tiny_llama(torch.float32), ids)
    swapped = tfh.use_tensorfuse(tiny_llama(torch.float32))
    only_tensorfuse()
    compiled = torch.compile(swapped, backend="aot_eager")
    got = _training_step(compiled, ids)
    _same_step(got, want)


def test_fifty_training_steps_follow_the_sdpa_models_losses(only_tensorfuse):
    """AdamW on fresh batches for 50 steps: every step's loss within 1 % of the same model's on
    SDPA, started from the same weights and fed the same batches (runs of consecutive token ids
    from random starts: something to learn, so the losses fall and the two runs could part)."""
    def losses(model):
        batches = torch.Generator().manual_seed(7)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        out = []
        for _ in range(50):
            starts = torch.randint(0, 100, (IDS[0], 1), generator=batches)
            ids = (starts + torch.arange(IDS[1])) % 100
            loss = model(ids, labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            out.append(float(loss.detach()))
        return out

    want = losses(tiny_llama(torch.float32))
    swapped = tfh.use_tensorfuse(tiny_llama(torch.float32))
    only_tensorfuse()
    got = losses(swapped)
    assert want[-1] < 0.5 * want[0]   # it learns
    worst = max(abs(a - b) / b for a, b in zip(got, want))
    assert worst <= 1e-2, worst


def _generated_on_the_gpu(heads: int, prompt: int, **generate) -> None:
    """A bf16 tiny Llama (``heads`` query heads on one KV head) generating greedily after a
    ``prompt``-token prompt on SDPA and on tensorfuse: every step's logits within bf16's
    tolerance of SDPA's."""
    model = tiny_llama(torch.bfloat16, "cuda", hidden_size=256, intermediate_size=512,
                       num_attention_heads=heads, num_key_value_heads=1)
    ids = torch.randint(0, 100, (2, prompt), device="cuda")
    kwargs = dict(do_sample=False, output_logits=True, return_dict_in_generate=True,
                  pad_token_id=0, attention_mask=torch.ones_like(ids), **generate)
    with torch.no_grad():
        want = model.generate(ids, **kwargs)
        got = tfh.use_tensorfuse(model).generate(ids, **kwargs)
    for a, b in zip(got.logits, want.logits):
        assert relative(a, b) <= TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
def test_prefill_and_static_decode_on_the_gpu():
    _generated_on_the_gpu(2, 200, max_new_tokens=4, cache_implementation="static")


@pytest.mark.gpu
def test_dynamic_cache_decoding_builds_once_per_bucket_on_the_gpu():
    """generate() with transformers' default cache, which grows a key every step: the logits of
    every step match SDPA's, and the attention kernel serves the 24 cache lengths with a handful
    of sources (``cache_info()``), not one each."""
    from tensorfuse.kernels.layers import attention_kernel

    _generated_on_the_gpu(4, 150, max_new_tokens=24)
    compiled = [c for causal in (True, False) for masked in (True, False)
                for c in attention_kernel("bf16", causal, masked, False)._compiled.values()]
    builds = [b for c in dict.fromkeys(compiled) for b in c.cache_info()]
    served = sum(len(b.sizes) for b in builds)
    assert served >= 24 and len(builds) <= 4, [b.describe() for b in builds]


def test_the_model_benchmark_runs_and_checks_its_logits():
    """benchmarks/model.py end to end on the tiny config (here on the CPU): rows for every phase,
    shape and implementation, tensorfuse's logits (and a training step's gradient) within the
    benchmark's tolerance of SDPA's."""
    from benchmarks import model as bench

    rows = bench.run(lambda _: None, "tiny", prefill_batches=(2,), seq=24, decode_batches=(1,),
                     context=40, implementations=("sdpa", "tensorfuse"), train_batches=(1,))
    assert [(r.benchmark, r.shape, r.implementation) for r in rows] == [
        ("model/prefill", "tiny B2-S24", "sdpa"), ("model/prefill", "tiny B2-S24", "tensorfuse"),
        ("model/decode", "tiny B1-ctx40", "sdpa"), ("model/decode", "tiny B1-ctx40", "tensorfuse"),
        ("model/train", "tiny B1-S24", "sdpa"), ("model/train", "tiny B1-S24", "tensorfuse")]
    for r in rows:
        assert r.ms > 0 and float(r.note.split("sdpa ")[1]) <= bench.LOGITS_TOLERANCE


def test_the_model_benchmark_runs_a_sliding_window_model():
    """benchmarks/model.py's Mistral-shaped configs (a window of keys behind each query, the model
    whose alternative is FlexAttention's block mask): tensorfuse's logits and a training step's
    gradient within the benchmark's tolerance of SDPA's — and the window is in force (without it
    the same weights give other logits), so agreeing with SDPA is not the full causal model's."""
    from benchmarks import model as bench

    rows = bench.run(lambda _: None, "tiny-sw", prefill_batches=(2,), seq=24, decode_batches=(),
                     implementations=("sdpa", "tensorfuse"), train_batches=(1,))
    assert [(r.benchmark, r.implementation) for r in rows] == [
        ("model/prefill", "sdpa"), ("model/prefill", "tensorfuse"),
        ("model/train", "sdpa"), ("model/train", "tensorfuse")]
    for r in rows:
        assert r.ms > 0 and float(r.note.split("sdpa ")[1]) <= bench.LOGITS_TOLERANCE
    model = bench.build_model("tiny-sw", "cpu")
    assert type(model).__name__ == "MistralForCausalLM" and model.config.sliding_window == 8
    ids = torch.randint(0, 1000, (2, 24))
    with torch.no_grad():
        windowed = model(ids).logits
        model.config.sliding_window = None
        full = model(ids).logits
    assert bench.relative_error(full, windowed) > bench.LOGITS_TOLERANCE
    # the attention FLOPs count the keys each query keeps
    causal = bench.attention_flops(dict(bench.CONFIGS["tiny-sw"], sliding_window=None), 1, 24)
    assert bench.attention_flops(bench.CONFIGS["tiny-sw"], 1, 24) / causal == \
        (8 * 24 - 28) / (24 * 25 / 2)
