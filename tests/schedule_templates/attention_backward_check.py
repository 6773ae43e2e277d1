"""Run the attention backward template's kernels in Triton's CPU interpreter and print their
errors against float64 gradients (torch autograd) as JSON.

Triton decides at import whether to interpret, so this runs in its own process:
    TRITON_INTERPRET=1 python -m tests.schedule_templates.attention_backward_check SEED
float32 kernels (the interpreter has no bfloat16 products): grouped heads (2 on one key/value
head), ragged sizes (M=37 queries, N=45 keys, bottom-right aligned), full, causal, causal with
soft-cap, a boolean mask tensor that empties some rows, and sizes the tiles divide (no element
masked for being out of range). Each twice: recomputing the forward's statistics and launching
dK/dV and dQ apart, and (``<variant>/saved``) from the log-sum-exp the forward program with
that second output gives, dK/dV and dQ in one launch. For masks, also which block lists were
consecutive (visited as ranges: causal's) and which not (a mask tensor's: lists). And operands
broadcast over a batch axis they do not read (a group's query heads as an axis of their own, a
cache without a head axis, latent queries shared by the batch), whose gradients sum over it.
"""
import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402

import tensorfuse as tf  # noqa: E402
from tensorfuse import dsl as T  # noqa: E402
from tensorfuse.kernels.attention import key_position, scores, softmax_attend  # noqa: E402
from tensorfuse.dsl.program import ProgramKernel  # noqa: E402
from tensorfuse.kernels.layers import attention_kernel  # noqa: E402
from tensorfuse.schedule_templates.attention_backward import (  # noqa: E402
    BackwardKnobs, plan_attention_backward)
from tensorfuse.schedule_templates.attention_chain import with_logsumexp  # noqa: E402
from tensorfuse.schedule_templates.auto import choose  # noqa: E402
from tensorfuse.targets import get_target  # noqa: E402
from tensorfuse.targets.triton.attention_backward import AttentionBackwardKernels  # noqa: E402
from tests.kernels.test_attention_sinks import sink_attention64  # noqa: E402

B, H, HKV, M_RAGGED, N_RAGGED, D = 1, 2, 1, 37, 45, 16
VARIANTS = {"full": (False, False, False), "causal": (True, False, False),
            "causal_softcap": (True, False, True), "mask_tensor": (False, True, False),
            "causal_whole_tiles": (True, False, False)}   # M, N multiples of the tiles


# head dims that are no power of two, and another one for p·v than for q·k: (q·k's, p·v's)
WIDTHS = {"head_dim_24": (24, 24), "head_dims_24_8": (24, 8)}


@tf.kernel
def two_head_dims(q: T.Tensor["B", "H", "M", "DQK", "f32"],
                  k: T.Tensor["B", "HKV", "N", "DQK", "f32"],
                  v: T.Tensor["B", "HKV", "N", "DV", "f32"], scale: T.f32):
    """Causal attention over grouped heads whose q·k and p·v run over head dims of their own."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = T.where(key_position(i) >= j, scores(q, k, b, h, hk, i, j, d, scale), -T.inf)
    return softmax_attend(s, v[b, hk, j, e], j)


def float64_gradients(tensors: dict, scalars: dict, dout, causal: bool) -> tuple:
    """dq, dk, dv of the attention as written, in float64 torch autograd: grouped heads, the
    score soft-capped where ``cap`` is given, causal bottom-right, the mask tensor's empty rows
    giving 0 (and no gradient)."""
    q, k, v = (tensors[n].double().requires_grad_() for n in ("q", "k", "v"))
    group = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(group, 1).transpose(-1, -2) * scalars["scale"]
    if "cap" in scalars:
        s = scalars["cap"] * torch.tanh(s / scalars["cap"])
    M, N = s.shape[-2:]
    keep = torch.ones(M, N, dtype=torch.bool)
    if causal:
        keep = torch.arange(M)[:, None] + N - M >= torch.arange(N)[None]
    if "mask" in tensors:
        keep = keep & tensors["mask"]
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
    l = p.sum(-1, keepdim=True)   # noqa: E741
    out = p @ v.repeat_interleave(group, 1) / torch.where(l > 0, l, torch.ones_like(l))
    return torch.autograd.grad(out, (q, k, v), dout.double())


@tf.kernel
def sinks_by_head_and_batch(q: T.Tensor["B", "H", "M", "D", "f32"],
                            k: T.Tensor["B", "H", "N", "D", "f32"],
                            v: T.Tensor["B", "H", "N", "D", "f32"],
                            sinks: T.Tensor["H", "B", "f32"], scale: T.f32):
    """Attention with a sink per head and sequence, held head-major (its gradient summed over
    nothing, permuted back to the tensor's order)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    return softmax_attend(scores(q, k, b, h, h, i, j, d, scale), v[b, h, j, e], j,
                          sink=sinks[h, b])


# attention sinks (gpt-oss): the sink per head (summed over the batch) with a causal mask, under
# a mask tensor that empties rows (their log-sum-exp is the sink's alone), per head and sequence
SINKS = {"sinks_causal": (attention_kernel("f32", True, False, False, "f32"), False),
         "sinks_mask_tensor": (attention_kernel("f32", False, True, False, "f32"), True),
         "sinks_by_head_and_batch": (sinks_by_head_and_batch, False)}


def _kept(tensors: dict, causal: bool):
    M, N = tensors["q"].shape[2], tensors["k"].shape[2]
    keep = torch.ones(M, N, dtype=torch.bool)
    if causal:
        keep = torch.arange(M)[:, None] + N - M >= torch.arange(N)[None]
    return keep & tensors["mask"] if "mask" in tensors else keep


def float64_sink_gradients(tensors: dict, scale: float, dout, causal: bool) -> tuple:
    """dq, dk, dv and d sinks in float64 autograd (sinks ``[H]``, or ``[H, B]``: head-major)."""
    q, k, v, g = (tensors[n].double().requires_grad_() for n in ("q", "k", "v", "sinks"))
    out = sink_attention64(q, k, v, g if g.dim() == 1 else g.t(), _kept(tensors, causal), scale)
    return torch.autograd.grad(out, (q, k, v, g), dout.double())


def sink_gradient_magnitude(tensors: dict, scale: float, dout, causal: bool):
    """The sum of the magnitudes of the terms a sink's gradient adds up, ``Σ_rows |p_sink ·
    (dO·O)|`` in float64, shaped as the sinks. The gradient is their signed sum, which can
    cancel to far less (a sink of −7.7 whose gradient is 1e-4): a float32 sum is exact to a
    few ulps of this magnitude, not of the sum — the measure of its error."""
    q, k, v, g = (tensors[n].double() for n in ("q", "k", "v", "sinks"))
    B, H, M, _ = q.shape
    group = H // k.shape[1]
    s = q @ k.repeat_interleave(group, 1).transpose(-1, -2) * scale
    sink = g.view(1, H, 1, 1) if g.dim() == 1 else g.t().reshape(B, H, 1, 1)
    logits = torch.cat([s.masked_fill(~_kept(tensors, causal), float("-inf")),
                        sink.expand(B, H, M, 1)], -1)
    p = torch.softmax(logits, -1)
    out = p[..., :-1] @ v.repeat_interleave(group, 1)
    terms = (p[..., -1] * (dout.double() * out).sum(-1)).abs().sum(-1)   # [B, H]
    return terms.sum(0) if g.dim() == 1 else terms.t()


def _sink_errors(got: tuple, want: tuple, magnitude) -> float:
    """The worst of dq, dk, dv (relative to their norms) and d sinks (to the magnitude of the
    terms it sums: :func:`sink_gradient_magnitude`)."""
    *grads, d_sinks = zip(got, want)
    return max([float((a - b).norm() / b.norm()) for a, b in grads] +
               [float((d_sinks[0] - d_sinks[1]).norm() / magnitude.norm())])


def sink_errors(found: dict) -> None:
    """The sink variants' errors (ragged sizes, two sequences, grouped heads but for the last
    variant; sinks large enough to take most of some rows), recomputed and saved statistics."""
    for name, (kernel, masked) in SINKS.items():
        hkv = H if kernel is sinks_by_head_and_batch else HKV
        dims = dict(B=2, H=H, HKV=hkv, M=M_RAGGED, N=N_RAGGED, D=D)
        _, fusion = choose(kernel.program, get_target("cuda"))
        plan = plan_attention_backward(kernel.program, fusion, dims)
        apart = AttentionBackwardKernels(plan, BackwardKnobs(16, 16, 16, 16))
        merged = AttentionBackwardKernels(plan, BackwardKnobs(16, 16, 16, 16, merged=True))
        q, dout = torch.randn(2, H, M_RAGGED, D), torch.randn(2, H, M_RAGGED, D)
        k, v = torch.randn(2, hkv, N_RAGGED, D), torch.randn(2, hkv, N_RAGGED, D)
        sinks = torch.randn(H) * 4 if kernel is not sinks_by_head_and_batch else \
            torch.randn(H, 2) * 4
        tensors = {"q": q, "k": k, "v": v, "sinks": sinks}
        if masked:
            tensors["mask"] = torch.rand(2, 1, M_RAGGED, N_RAGGED) < 0.6
            tensors["mask"][1, :, 3] = False   # an empty row: only the sink's share
        scalars = {"scale": D ** -0.5}
        saving = ProgramKernel(with_logsumexp(kernel.program, fusion.names))
        out, lse = tf.compile(saving, target="llvm")(**tensors, **scalars)
        causal = kernel is not sinks_by_head_and_batch and not masked
        want = float64_sink_gradients(tensors, scalars["scale"], dout, causal)
        magnitude = sink_gradient_magnitude(tensors, scalars["scale"], dout, causal)
        for label, got in ((name, apart(tensors, scalars, out, dout)),
                           (f"{name}/saved", merged(tensors, scalars, out, dout, lse))):
            found[label] = _sink_errors(got, want, magnitude)
            found[f"{label}/count"] = len(got)
        if masked:   # the empty row's saved log-sum-exp: the sink's value
            found[f"{name}/empty_row_lse"] = float((lse[1, :, 3] - sinks).abs().max())


def _gradient_kernel(kernel, wrt, dims: dict, found: dict, name: str):
    """``tf.grad(kernel, wrt)`` compiled for a GPU, what runs it at ``dims`` recorded as
    ``found[name/origin]``, its forward with the log-sum-exp compiled for the CPU (the
    interpreter runs no Hopper kernel): the backward template's kernels run interpreted."""
    made = tf.compile(tf.grad(kernel, wrt), "cuda")
    found[f"{name}/origin"] = made.schedule_origin(**dims)
    _, fusion = choose(kernel.program, get_target("cuda"))
    made._saving = tf.compile(ProgramKernel(with_logsumexp(kernel.program, fusion.names), None),
                              target="llvm")
    return made


def gradient_kernel_errors(found: dict) -> None:
    """``tf.grad`` of attention compiled for a GPU (grouped heads, causal, with and without
    sinks; then with respect to q alone): its gradients through the backward template, its
    forward with the log-sum-exp compiled for the CPU (the interpreter runs no Hopper kernel)."""
    for name, sinks, wrt in (("grad", None, None), ("grad_sinks", "f32", None),
                             ("grad_q", None, "q")):
        kernel = attention_kernel("f32", True, False, False, sinks)
        made = _gradient_kernel(kernel, wrt, dict(B=2, H=H, HKV=HKV, M=M_RAGGED, N=N_RAGGED,
                                                  D=D), found, name)
        q, dout = torch.randn(2, H, M_RAGGED, D), torch.randn(2, H, M_RAGGED, D)
        k, v = torch.randn(2, HKV, N_RAGGED, D), torch.randn(2, HKV, N_RAGGED, D)
        tensors = {"q": q, "k": k, "v": v, **({"sinks": torch.randn(H) * 4} if sinks else {})}
        got = made(**tensors, scale=D ** -0.5, d_out=dout)
        got = got if isinstance(got, tuple) else (got,)
        with_sinks = {**tensors, "sinks": tensors.get("sinks", torch.full((H,), -torch.inf))}
        want = float64_sink_gradients(with_sinks, D ** -0.5, dout, True)
        found[name] = _sink_errors(got, want, sink_gradient_magnitude(
            with_sinks, D ** -0.5, dout, True)) if sinks else \
            max(float((a - b).norm() / b.norm()) for a, b in zip(got, want))
        found[f"{name}/count"] = len(got)


@tf.kernel
def grouped_axes(q: T.Tensor["B", "G", "R", "M", "D", "f32"],
                 k: T.Tensor["B", "G", "N", "D", "f32"], v: T.Tensor["B", "G", "N", "D", "f32"],
                 scale: T.f32):
    """Causal GQA with a group's query heads as an axis k and v do not read."""
    b, g, r, i, j, d, e = T.axes("b g r i j d e")
    s = T.where(key_position(i) >= j, T.sum(q[b, g, r, i, d] * k[b, g, j, d], over=d) * scale,
                -T.inf)
    return softmax_attend(s, v[b, g, j, e], j)


@tf.kernel
def one_cache(q: T.Tensor["B", "H", "M", "D", "f32"], k: T.Tensor["B", "N", "D", "f32"],
              v: T.Tensor["B", "N", "D", "f32"], scale: T.f32):
    """Multi-query attention written with the cache's head axis left out."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    return softmax_attend(T.sum(q[b, h, i, d] * k[b, j, d], over=d) * scale, v[b, j, e], j)


@tf.kernel
def latent_queries(q: T.Tensor["H", "M", "D", "f32"], k: T.Tensor["B", "H", "N", "D", "f32"],
                   v: T.Tensor["B", "H", "N", "D", "f32"], scale: T.f32):
    """Latent queries shared by every sequence of the batch (Perceiver)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    return softmax_attend(T.sum(q[h, i, d] * k[b, h, j, d], over=d) * scale, v[b, h, j, e], j)


@tf.kernel
def table_bias(q: T.Tensor["B", "H", "M", "D", "f32"], k: T.Tensor["B", "H", "N", "D", "f32"],
               v: T.Tensor["B", "H", "N", "D", "f32"], table: T.Tensor["H", "R", "f32"],
               scale: T.f32):
    """Causal attention with a T5 bias per head and clamped distance read from a table."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    bucket = T.minimum(key_position(i) - j, T.size("R") - 1)
    s = T.where(key_position(i) >= j, T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
                + table[h, bucket], -T.inf)
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def sequence_temperature(q: T.Tensor["B", "H", "M", "D", "f32"],
                         k: T.Tensor["B", "H", "N", "D", "f32"],
                         v: T.Tensor["B", "H", "N", "D", "f32"], tau: T.Tensor["B", "f32"]):
    """Causal attention whose scores are divided by a temperature per sequence."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) / tau[b]
    return softmax_attend(T.where(key_position(i) >= j, s, -T.inf), v[b, h, j, e], j)


def frozen_errors(found: dict) -> None:
    """dq, dk, dv of attention whose score reads a tensor besides q·kᵀ (a bias table, a
    temperature per sequence), through ``tf.grad(kernel, ["q", "k", "v"])`` on the backward
    template (its forward with the log-sum-exp on the CPU), against float64 autograd."""
    R = 8
    i, j = torch.arange(M_RAGGED)[:, None] + N_RAGGED - M_RAGGED, torch.arange(N_RAGGED)
    keep = i >= j
    table, tau = torch.randn(H, R), torch.rand(2) * 3 + 1
    cases = {"frozen_table": (table_bias, {"table": table}, {"scale": 0.3},
                              lambda s: s * 0.3 + table.double()[:, (i - j).clamp(0, R - 1)]),
             "frozen_temperature": (sequence_temperature, {"tau": tau}, {},
                                    lambda s: s / tau.double()[:, None, None, None])}
    for name, (kernel, others, scalars, score_of) in cases.items():
        dims = dict(B=2, H=H, M=M_RAGGED, N=N_RAGGED, D=D, **({"R": R} if "table" in others
                                                              else {}))
        made = _gradient_kernel(kernel, ["q", "k", "v"], dims, found, name)
        q, dout = torch.randn(2, H, M_RAGGED, D), torch.randn(2, H, M_RAGGED, D)
        k, v = torch.randn(2, H, N_RAGGED, D), torch.randn(2, H, N_RAGGED, D)
        got = made(q=q, k=k, v=v, **others, **scalars, d_out=dout)
        exact = [t.double().requires_grad_() for t in (q, k, v)]
        s = score_of(exact[0] @ exact[1].transpose(-1, -2)).masked_fill(~keep, float("-inf"))
        want = torch.autograd.grad(torch.softmax(s, -1) @ exact[2], exact, dout.double())
        found[name] = max(float((a - b).norm() / b.norm()) for a, b in zip(got, want))


# operands broadcast over a batch axis they do not read: its gradient sums over that axis
# (einsum of the scores, of the output; the shapes of q, k and v; causal or not)
BROADCAST = {
    "grouped_axes": (grouped_axes, "bgrid,bgjd->bgrij", "bgrij,bgjd->bgrid", True,
                     ((2, 2, 3, M_RAGGED, D), (2, 2, N_RAGGED, D), (2, 2, N_RAGGED, D))),
    "one_cache": (one_cache, "bhid,bjd->bhij", "bhij,bjd->bhid", False,
                  ((2, 3, M_RAGGED, D), (2, N_RAGGED, D), (2, N_RAGGED, D))),
    "latent_queries": (latent_queries, "hid,bhjd->bhij", "bhij,bhjd->bhid", False,
                       ((2, M_RAGGED, D), (2, 2, N_RAGGED, D), (2, 2, N_RAGGED, D)))}


def broadcast_errors(found: dict) -> None:
    """dq, dk, dv of the :data:`BROADCAST` kernels against float64 autograd of their einsums,
    recomputed and from the saved log-sum-exp."""
    for name, (kernel, scores_of, out_of, causal, shapes) in BROADCAST.items():
        q, k, v = (torch.randn(s) for s in shapes)
        dims = {n: x for p, t in zip(kernel.program.tensor_params, (q, k, v))
                for n, x in zip(p.dims, t.shape)}
        _, fusion = choose(kernel.program, get_target("cuda"))
        plan = plan_attention_backward(kernel.program, fusion, dims)
        saving = ProgramKernel(with_logsumexp(kernel.program, fusion.names))
        out, lse = tf.compile(saving, target="llvm")(q, k, v, 0.3)
        exact = [t.double().requires_grad_() for t in (q, k, v)]
        s = torch.einsum(scores_of, *exact[:2]) * 0.3
        if causal:
            s = s.masked_fill(~(torch.arange(M_RAGGED)[:, None] + N_RAGGED - M_RAGGED >=
                                torch.arange(N_RAGGED)[None]), float("-inf"))
        dout = torch.randn(out.shape)
        want = torch.autograd.grad(torch.einsum(out_of, torch.softmax(s, -1), exact[2]), exact,
                                   dout.double())
        tensors = {"q": q, "k": k, "v": v}
        for label, merged, saved in ((name, False, None), (f"{name}/saved", True, lse)):
            kernels = AttentionBackwardKernels(plan, BackwardKnobs(16, 16, 16, 16, merged=merged))
            got = kernels(tensors, {"scale": 0.3}, out, dout, saved)
            found[label] = max(float((a - b).norm() / b.norm()) for a, b in zip(got, want))


def errors(seed: int) -> dict:
    torch.manual_seed(seed)
    found = {}
    for name, (causal, masked, softcap) in VARIANTS.items():
        kernel = attention_kernel("f32", causal, masked, softcap)
        M, N = (32, 48) if name.endswith("whole_tiles") else (M_RAGGED, N_RAGGED)
        dims = dict(B=B, H=H, HKV=HKV, M=M, N=N, D=D)
        _, fusion = choose(kernel.program, get_target("cuda"))
        plan = plan_attention_backward(kernel.program, fusion, dims)
        apart = AttentionBackwardKernels(plan, BackwardKnobs(16, 16, 16, 16))
        merged = AttentionBackwardKernels(plan, BackwardKnobs(16, 16, 16, 16, merged=True))
        q, dout = torch.randn(B, H, M, D), torch.randn(B, H, M, D)
        k, v = torch.randn(B, HKV, N, D), torch.randn(B, HKV, N, D)
        tensors = {"q": q, "k": k, "v": v}
        if masked:
            tensors["mask"] = torch.rand(B, 1, M, N) < 0.6
            tensors["mask"][:, :, 3] = False   # an empty row: output 0, gradients 0
        scalars = {"scale": D ** -0.5, **({"cap": 1.5} if softcap else {})}
        saving = ProgramKernel(with_logsumexp(kernel.program, fusion.names))
        out, lse = tf.compile(saving, target="llvm")(**tensors, **scalars)
        want = float64_gradients(tensors, scalars, dout, causal)
        for label, got in ((name, apart(tensors, scalars, out, dout)),
                           (f"{name}/saved", merged(tensors, scalars, out, dout, lse))):
            found[label] = max(float((a - b).norm() / b.norm()) for a, b in zip(got, want))
        if plan.mask is not None:   # which lists the kernels visited as ranges
            found[f"{name}/ranges"] = [plan.block_lists(apart.knobs, tensors, scalars, t)[1]
                                       for t in (False, True)]
    for name, (dqk, dv) in WIDTHS.items():   # the tiles wider than the dims: masked columns
        dims = dict(B=B, H=H, HKV=HKV, M=M_RAGGED, N=N_RAGGED, DQK=dqk, DV=dv)
        _, fusion = choose(two_head_dims.program, get_target("cuda"))
        plan = plan_attention_backward(two_head_dims.program, fusion, dims)
        kernels = AttentionBackwardKernels(plan, BackwardKnobs(16, 16, 16, 16))
        q = torch.randn(B, H, M_RAGGED, dqk)
        k = torch.randn(B, HKV, N_RAGGED, dqk)
        v, dout = torch.randn(B, HKV, N_RAGGED, dv), torch.randn(B, H, M_RAGGED, dv)
        tensors, scalars = {"q": q, "k": k, "v": v}, {"scale": dqk ** -0.5}
        out = tf.compile(two_head_dims, target="llvm")(**tensors, **scalars)
        want = float64_gradients(tensors, scalars, dout, True)
        got = kernels(tensors, scalars, out, dout)
        found[name] = max(float((a - b).norm() / b.norm()) for a, b in zip(got, want))
        found[f"{name}/shapes"] = [list(g.shape) for g in got] == [list(t.shape) for t in
                                                                   (q, k, v)]
    sink_errors(found)
    gradient_kernel_errors(found)
    broadcast_errors(found)
    frozen_errors(found)
    return found


if __name__ == "__main__":
    print(json.dumps(errors(int(sys.argv[1]))))
