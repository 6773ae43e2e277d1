"""tensorfuse inside Hugging Face ``transformers`` models.

``register()`` adds tensorfuse's attention to transformers' own registries — the attention-function
registry (``AttentionInterface``) and the mask registry (``AttentionMaskInterface``, where it takes
the masks SDPA takes: none when the causal structure says everything, else a boolean mask) — so
``from_pretrained(..., attn_implementation="tensorfuse")`` or
``model.set_attn_implementation("tensorfuse")`` selects it. ``use_tensorfuse(model)`` does that
and also runs the model's RMSNorms and SwiGLU MLPs on tensorfuse kernels (the modules whose
``forward`` is Llama's, recognised by its code, so Mistral's, Qwen's and the other copies are
found too); ``restore(model)`` undoes it.

Each layer is a DSL kernel from :mod:`tensorfuse.kernels.layers`, compiled with
``tensorfuse.compile`` for the tensors' device and dtype (on an H100: the Hopper attention and FFN
templates). Training stays on them where their backward is fast: while autograd records, the
attention and the RMSNorms run as their PyTorch operators, whose backwards are the attention
backward template and the norm's derived backward (:mod:`tensorfuse.autograd`); the SwiGLU MLP
runs transformers' code then — its derived backward is a staged program whose GEMM stages took
7.6 s of a training step of Llama-3-8B's first four layers (S=4096, on the H200; 66 ms without,
72 ms on SDPA; ``benchmarks.model --train-batches 1``) on TVM's default schedule; they now run
as tensor-core tiles (the contraction template, computed operands stored once: 7.42 ms against
eager autograd's 6.73 at M 4096, 4096 → 14336 → 4096, ``benchmarks.contraction``), and the MLP
stays on transformers' code until it is at least as fast. What
tensorfuse does not compute is handed back to transformers, never approximated: attention with
dropout or asking for the weights runs transformers' own code, and so does a float (additive)
mask per head, broadcast, in float32, with a soft-cap or while autograd records (a 16-bit float
mask ``[B or 1, 1, M, N]`` otherwise runs on tensorfuse, added to the scores: on an H100/H200
read as tiles of the scores). Attention sinks (gpt-oss's ``s_aux``: a score per head that shares
the softmax and attends to nothing) run on tensorfuse too, training included (the attention
backward template gives the sinks their gradient), except with dropout, a float mask or a
soft-cap, where gpt-oss's own eager code runs them (SDPA has no sinks).

A cache that grows every step (``DynamicCache``, the default) is a new shape every step: the
attention kernels read their sizes as arguments, so a new cache length reuses the kernel built
for the last one (``cache_info()`` on the compiled kernel lists the builds) and costs about a
millisecond of host time (``tools/profile_new_sizes.py``); a ``StaticCache``
(``cache_implementation="static"``) keeps one shape, and so can be replayed from a CUDA graph.
"""
from __future__ import annotations

import types

from tensorfuse.dsl import dtypes as dt
from tensorfuse.kernels.layers import (additive_mask_attention_kernel, attention_kernel,
                                       rmsnorm_kernel, swiglu_mlp_kernel)

NAME = "tensorfuse"


def _target(device) -> str:
    """The tensorfuse target for tensors on ``device`` (each kernel compiles once per target:
    :class:`tensorfuse.kernel.Kernel` keeps what it compiled)."""
    return "llvm" if device.type == "cpu" else device.type


def _recording(*tensors) -> bool:
    import torch

    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, is_causal: bool | None = None,
                      softcap: float | None = None, s_aux=None, **kwargs):
    """An attention function for transformers' registry: ``query[B, H, M, D]``,
    ``key, value[B, HKV, N, D]``, the mask made by the mask function registered beside it;
    returns ``(output[B, M, H, D], None)`` as SDPA's does."""
    additive = attention_mask is not None and attention_mask.dtype.is_floating_point
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if s_aux is not None and (dropout > 0.0 or kwargs.get("output_attentions") or additive or
                              softcap is not None):
        # sinks with what tensorfuse's sink kernel does not take: transformers' own code for
        # them, gpt-oss's (SDPA has no sinks)
        from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

        return eager_attention_forward(module, query, key, value, attention_mask,
                                       dropout=dropout, scaling=scaling, **kwargs)
    if dropout > 0.0 or kwargs.get("output_attentions") or additive and (
            softcap is not None or _recording(query, key, value, attention_mask) or
            not _tensorfuse_takes(attention_mask, query)):
        # dropout, the weights, or a float mask broadcast or per head, with a soft-cap or while
        # autograd records: transformers' SDPA path computes those
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    if additive:
        return _additive_mask_attention(query, key, value, attention_mask, float(scaling))
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    m, n = query.shape[2], key.shape[2]
    if attention_mask is None and causal and 1 < m < n:
        # keys past the queries are a static cache's unfilled tail (the mask function leaves the
        # mask out only then): causal from the top left, as SDPA's is_causal
        key, value = key[:, :, :m], value[:, :, :m]
    dtype = dt.from_any(query.dtype)
    args = [query, key, value]
    masked = attention_mask is not None
    if masked:
        args.append(attention_mask.bool().expand(query.shape[0], 1, m, n))
    if s_aux is not None:
        args.append(s_aux)
    kernel = attention_kernel(dtype, bool(causal) and not masked, masked, softcap is not None,
                              None if s_aux is None else dt.from_any(s_aux.dtype))
    extra = {"cap": float(softcap)} if softcap is not None else {}
    out = kernel(*args, scale=float(scaling), target=_target(query.device), **extra)
    return out.transpose(1, 2), None


def _tensorfuse_takes(mask, query) -> bool:
    """Whether tensorfuse's kernel takes this float mask: 16-bit ``[B or 1, 1, M, ≥N]``, one
    row of scores' terms per query for every head (broadcasts over queries or over batches
    bigger than 1 would be copied out). A float32 mask comes with a float32 model, whose
    attention tensorfuse has not measured against SDPA's float32 kernels: SDPA keeps those (the
    templates compute them right, rows masked whole included: tests/schedule_templates/
    test_lowest_rows.py)."""
    return mask.ndim == 4 and mask.dtype.itemsize == 2 and \
        mask.shape[0] in (1, query.shape[0]) and mask.shape[1] == 1 and \
        mask.shape[2] == query.shape[2]


def _additive_mask_attention(query, key, value, mask, scaling: float):
    """Attention with a float mask ``[B or 1, 1, M, ≥N]`` added to the scores, cut to the keys
    as transformers' SDPA path cuts it (no causal flag: the mask holds it)."""
    mask = mask[:, :, :, :key.shape[2]]
    one = mask.shape[0] == 1
    kernel = additive_mask_attention_kernel(dt.from_any(query.dtype), dt.from_any(mask.dtype), one)
    out = kernel(query, key, value, mask, scale=scaling, target=_target(query.device))
    return out.transpose(1, 2), None


def _rmsnorm_forward(self, hidden_states):
    """Llama's RMSNorm on a tensorfuse kernel (its own forward where the dtypes differ)."""
    if hidden_states.dtype != self.weight.dtype:
        return type(self).forward(self, hidden_states)
    shape = hidden_states.shape
    out = rmsnorm_kernel(dt.from_any(hidden_states.dtype))(
        hidden_states.reshape(-1, shape[-1]), self.weight, eps=self.variance_epsilon,
        target=_target(hidden_states.device))
    return out.view(shape)


def _mlp_forward(self, x):
    """Llama's MLP ``down(silu(gate(x)) * up(x))`` as one fused tensorfuse GEMM chain (its own
    forward where the dtypes differ or autograd records: the module docstring says why)."""
    weights = (self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)
    if any(w.dtype != x.dtype for w in weights) or _recording(x, *weights):
        return type(self).forward(self, x)
    shape = x.shape
    out = swiglu_mlp_kernel(dt.from_any(x.dtype))(x.reshape(-1, shape[-1]), *weights,
                                                  target=_target(x.device))
    return out.view(*shape[:-1], out.shape[-1])


def _same_code(method, reference) -> bool:
    a, b = method.__code__, reference.__code__
    return (a.co_code, a.co_consts, a.co_names) == (b.co_code, b.co_consts, b.co_names)


def _replacement(module):
    """The tensorfuse forward for ``module`` where tensorfuse computes what its own does."""
    from torch import nn
    from transformers.activations import SiLUActivation
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    forward = getattr(type(module), "forward", None)
    if forward is None:
        return None
    if _same_code(forward, LlamaRMSNorm.forward):
        return _rmsnorm_forward
    if _same_code(forward, LlamaMLP.forward) and \
            isinstance(module.act_fn, (nn.SiLU, SiLUActivation)) and \
            all(getattr(module, p).bias is None for p in ("gate_proj", "up_proj", "down_proj")):
        return _mlp_forward
    return None


def register(name: str = NAME) -> str:
    """Make ``attn_implementation=name`` select tensorfuse's attention (and its mask function)
    in every transformers model; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def use_tensorfuse(model, attention: bool = True, norms: bool = True, mlp: bool = True):
    """Run ``model``'s attention, RMSNorms and SwiGLU MLPs on tensorfuse kernels (each part can
    be left out); returns the model. The kernels compile on first use, per shape."""
    if attention:
        model.set_attn_implementation(register())
    for module in model.modules():
        forward = _replacement(module)
        if forward is _rmsnorm_forward and norms or forward is _mlp_forward and mlp:
            module.forward = types.MethodType(forward, module)
    return model


def restore(model, attn_implementation: str = "sdpa"):
    """Undo :func:`use_tensorfuse`: transformers' own layers, and ``attn_implementation``."""
    for module in model.modules():
        if "forward" in vars(module) and getattr(module.forward, "__func__", None) in \
                (_rmsnorm_forward, _mlp_forward):
            del module.forward
    model.set_attn_implementation(attn_implementation)
    return model
