# %% [markdown]
# # 5. In a model: PyTorch's compiler, CUDA graphs and a transformers Llama
#
# A compiled tensorfuse kernel is a PyTorch custom operator (`torch.ops.tensorfuse.<name>_<n>`):
# `torch.compile(fullgraph=True)` puts it in its graph, `torch.library.opcheck` passes, and on a
# GPU `mode="reduce-overhead"` records it in a CUDA graph. `tensorfuse.integrations.huggingface`
# registers tensorfuse's attention in transformers' attention registry and puts tensorfuse's
# RMSNorm and SwiGLU MLP into the layers of Llama-style models. This notebook runs on the CPU
# with a tiny model; on a GPU it uses the GPU (set `SIZE = "llama3-8b"` there for the real shape —
# `python -m benchmarks.model` times it against SDPA and FlexAttention).

# %%
import time

import torch
import tensorfuse as tf
from tensorfuse import dsl as T

device = "cuda" if torch.cuda.is_available() else "cpu"
SIZE = "tiny"

# %% [markdown]
# ## A kernel inside `torch.compile`
# Any DSL kernel — here an RMSNorm with a residual add, written in four lines — compiles with
# `tf.compile`; the result is called like a function, eagerly or inside a compiled graph, next to
# ordinary torch operations.

# %%
@tf.kernel
def add_rmsnorm(x: T.Tensor["M", "N", "f32"], residual: T.Tensor["M", "N", "f32"],
                weight: T.Tensor["N", "f32"], eps: T.f32):
    i, j = T.axes("i j")
    h = x[i, j] + residual[i, j]
    ms = T.sum(h * h, over=j) / T.size("N")
    return h * T.rsqrt(ms + eps) * weight[j]


norm = tf.compile(add_rmsnorm)
print(norm.torch_op.qualname)


@torch.compile(fullgraph=True)
def block(x, residual, weight):
    return torch.nn.functional.silu(norm(x, residual, weight, eps=1e-6)) * 2.0


x, r = torch.randn(64, 256, device=device), torch.randn(64, 256, device=device)
w = torch.rand(256, device=device)
h = (x + r).double()
want = torch.nn.functional.silu(h * torch.rsqrt(h.pow(2).mean(1, keepdim=True) + 1e-6) * w) * 2
err = ((block(x, r, w) - want).abs().max() / want.abs().max()).item()
print(f"relative error against float64: {err:.1e}")
assert err < 1e-5
torch.library.opcheck(norm.torch_op.op, (x, r, w, 1e-6))

# %% [markdown]
# ## A Llama on tensorfuse kernels
# A model built from a config (random weights, nothing downloaded). `use_tensorfuse` switches
# its attention to the registered `"tensorfuse"` implementation and replaces the RMSNorm and MLP
# modules whose code is Llama's; `restore` gives transformers' layers back. Both run from the
# same weights, so their logits can be compared directly.

# %%
from transformers import LlamaConfig, LlamaForCausalLM
from tensorfuse.integrations import huggingface as tfh

CONFIGS = {   # as benchmarks/model.py has them
    "tiny": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                 num_key_value_heads=2, num_hidden_layers=2, vocab_size=1000),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                      num_key_value_heads=8, num_hidden_layers=32, vocab_size=128256,
                      rope_theta=500000.0, rms_norm_eps=1e-5),
}

dtype = torch.bfloat16 if device == "cuda" else torch.float32
torch.manual_seed(0)
with torch.device(device):
    model = LlamaForCausalLM(LlamaConfig(**CONFIGS[SIZE])).to(dtype).eval()
ids = torch.randint(0, model.config.vocab_size, (2, 64), device=device)

with torch.no_grad():
    reference = model(ids).logits.float()           # attn_implementation="sdpa"
    tfh.use_tensorfuse(model)
    print(model.config._attn_implementation,
          sorted({type(m).__name__ for m in model.modules() if "forward" in vars(m)}))
    logits = model(ids).logits.float()
err = ((logits - reference).abs().max() / reference.abs().max()).item()
print(f"logits against SDPA's: relative error {err:.1e}")
assert err < (5e-2 if dtype == torch.bfloat16 else 1e-4)

# %% [markdown]
# ## Generation
# Prefill and decode through transformers' `generate`. Use a static cache: its keys keep one
# length (the mask says which slots are filled), so every decode step runs the kernel compiled for
# the first; a `DynamicCache` grows every step, a new shape each time, and each new shape compiles.

# %%
with torch.no_grad():
    started = time.perf_counter()
    out = model.generate(ids, max_new_tokens=8, do_sample=False, cache_implementation="static",
                         pad_token_id=0, attention_mask=torch.ones_like(ids))
    print(f"tensorfuse: {time.perf_counter() - started:.2f} s (compiles included)")
    tfh.restore(model)
    same = model.generate(ids, max_new_tokens=8, do_sample=False, cache_implementation="static",
                          pad_token_id=0, attention_mask=torch.ones_like(ids))
print("new tokens:", out[0, 64:].tolist())
print("same tokens as SDPA:", torch.equal(out, same))
