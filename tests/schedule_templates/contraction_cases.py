"""GEMM-shaped programs as users write them (and as the floor cuts backward passes), with their
float64 references (torch, never the project's lowering): shared by the contraction template's
tests and their check under Triton's interpreter (``python -m
tests.schedule_templates.contraction_cases SEED`` with ``TRITON_INTERPRET=1``)."""
import types

import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.contraction import (best_match, bilinear_form, gated_gradient,
                                    weight_gradient)
from tensorfuse.kernels.gemm import linear, swiglu_gate


@tf.kernel
def token_weight_gradient(x: T.Tensor["B", "S", "K", "bf16"],
                          dy: T.Tensor["B", "S", "N", "bf16"]):
    """``nn.Linear``'s weight gradient on [B, S, ·] activations: a sum over two axes, the batch
    and the tokens, swept as one contracted index."""
    b, s, n, k = T.axes("b s n k")
    return T.sum(dy[b, s, n] * x[b, s, k], over=(b, s))


@tf.kernel
def gathered_linear(emb: T.Tensor["V", "K", "bf16"], ids: T.Tensor["M", "i32"],
                    w: T.Tensor["N", "K", "bf16"], residual: T.Tensor["M", "N", "bf16"]):
    """An embedding lookup's rows through a linear layer, plus a residual: a gathered rows side
    and a load in the epilogue."""
    i, n, k = T.axes("i n k")
    return T.sum(emb[ids[i], k] * w[n, k], over=k) + residual[i, n]


@tf.kernel
def scores_bshd(q: T.Tensor["B", "M", "H", "D", "bf16"], k: T.Tensor["B", "N", "H", "D", "bf16"],
                scale: T.f32):
    """Attention scores of [B, S, H, D] tensors into [B, H, M, N]: two batch axes, both operands
    strided along the rows and columns."""
    b, h, i, j, d = T.axes("b h i j d")
    return T.sum(q[b, i, h, d] * k[b, j, h, d], over=d) * scale


@tf.kernel
def scaled_linear(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["N", "K", "bf16"],
                  w_scale: T.Tensor["N", "f32"], x_scale: T.Tensor["M", "f32"], alpha: T.f32):
    """Per-row and per-column scales inside the sum (as a dequantised GEMM writes them): they
    read no contracted axis, so they scale the accumulator once rather than round into a side."""
    i, n, k = T.axes("i n k")
    return T.sum(x[i, k] * x_scale[i] * w[n, k] * w_scale[n] * alpha, over=k)


@tf.kernel
def matmul_f32(a: T.Tensor["M", "K", "f32"], b: T.Tensor["K", "N", "f32"], scale: T.f32):
    """f32 operands: IEEE products (what torch's f32 matmul computes by default)."""
    i, j, k = T.axes("i j k")
    return T.sum(a[i, k] * b[k, j], over=k) * scale


def _bilinear_form(g, B=37, I=40, J=100):
    x, W, y = ((torch.randn(*s, generator=g) * w).to(torch.bfloat16)
               for s, w in (((B, I), 2), ((I, J), 0.5), ((B, J), 1)))
    return dict(x=x, W=W, y=y), ((x.double() @ W.double()) * y.double()).sum(-1)


def _best_match(g, M=29, N=130, D=24):
    x, y = ((torch.randn(*s, generator=g) * 2).to(torch.bfloat16) for s in ((M, D), (N, D)))
    return dict(x=x, y=y), (x.double() @ y.double().T).max(-1).values


def _linear(g, M=37, K=75, N=50, width=3.0):
    x, w = ((torch.randn(*s, generator=g) * width).to(torch.bfloat16) for s in ((M, K), (N, K)))
    bias = torch.randn(N, generator=g).to(torch.bfloat16) * 100
    return dict(x=x, weight=w, bias=bias), x.double() @ w.double().T + bias.double()


def _swiglu_gate(g, M=33, K=70, N=40):
    x, w1, w3 = ((torch.randn(*s, generator=g) * 2).to(torch.bfloat16)
                 for s in ((M, K), (N, K), (N, K)))
    a, c = x.double() @ w1.double().T, x.double() @ w3.double().T
    return dict(x=x, w1=w1, w3=w3), a * torch.sigmoid(a) * c


def _weight_gradient(g, B=3, M=45, K=20, N=36):
    x = (torch.randn(B, M, K, generator=g) * 4).to(torch.bfloat16)
    dy = (torch.randn(B, M, N, generator=g) * 0.01).to(torch.bfloat16)
    return dict(x=x, dy=dy), torch.einsum("bik,bin->bkn", x.double(), dy.double())


def _gated_gradient(g, M=50, K=24, N=35):
    x = (torch.randn(M, K, generator=g) * 3).to(torch.bfloat16)
    d_h, gate = torch.randn(M, N, generator=g) * 5, torch.randn(M, N, generator=g) * 4
    s = torch.sigmoid(gate.double())
    d_gate = d_h.double() * s * (1 + gate.double() * (1 - s))
    return dict(x=x, d_h=d_h, gate=gate), torch.einsum("in,ik->kn", d_gate, x.double())


def _token_weight_gradient(g, B=3, S=13, K=20, N=36):
    x = (torch.randn(B, S, K, generator=g) * 4).to(torch.bfloat16)
    dy = (torch.randn(B, S, N, generator=g) * 0.01).to(torch.bfloat16)
    return dict(x=x, dy=dy), torch.einsum("bsk,bsn->nk", x.double(), dy.double())


def _gathered_linear(g, V=50, M=29, K=40, N=33):
    emb, w = ((torch.randn(*s, generator=g) * 2).to(torch.bfloat16) for s in ((V, K), (N, K)))
    ids = torch.randint(0, V, (M,), generator=g).to(torch.int32)
    residual = (torch.randn(M, N, generator=g) * 30).to(torch.bfloat16)
    want = emb.double()[ids.long()] @ w.double().T + residual.double()
    return dict(emb=emb, ids=ids, w=w, residual=residual), want


def _scores_bshd(g, B=2, M=19, N=23, H=3, D=24):
    q, k = ((torch.randn(*s, generator=g) * 3).to(torch.bfloat16)
            for s in ((B, M, H, D), (B, N, H, D)))
    return dict(q=q, k=k, scale=0.2), torch.einsum("bihd,bjhd->bhij", q.double(),
                                                    k.double()) * 0.2


def _scaled_linear(g, M=21, K=50, N=34):
    x, w = ((torch.randn(*s, generator=g) * 2).to(torch.bfloat16) for s in ((M, K), (N, K)))
    w_scale, x_scale = torch.rand(N, generator=g) * 1e3, torch.rand(M, generator=g) + 0.5
    want = (x.double() @ w.double().T) * x_scale.double()[:, None] * w_scale.double() * 0.5
    return dict(x=x, w=w, w_scale=w_scale, x_scale=x_scale, alpha=0.5), want


def _matmul_f32(g, M=20, K=33, N=18):
    a, b = torch.randn(M, K, generator=g) * 1e3, torch.randn(K, N, generator=g)
    return dict(a=a, b=b, scale=0.5), (a.double() @ b.double()) * 0.5


# the gated gradient's computed side in every tile that reads it (its default at these sizes:
# stored once before the tiles, ``ContractionKnobs.stage_sides``)
IN_TILES = types.SimpleNamespace(program=gated_gradient.program, knobs=dict(stage_sides=0))


def split(kernel, parts: int, **knobs) -> types.SimpleNamespace:
    """``kernel`` with its contracted axis split into ``parts`` (``ContractionKnobs.splits``;
    with the interpreter's blocks of 16, the last part ragged or empty), and other ``knobs``
    (row blocks of 64: the parts combined in four slices of 16 rows, the last ones ragged or
    empty — :func:`tensorfuse.targets.triton.contraction.combine_slices`)."""
    return types.SimpleNamespace(program=kernel.program, knobs=dict(splits=parts, **knobs))


CASES = {"linear": (linear, _linear), "swiglu_gate": (swiglu_gate, _swiglu_gate),
         "weight_gradient": (weight_gradient, _weight_gradient),
         "gated_gradient": (gated_gradient, _gated_gradient),
         "gated_gradient_in_tiles": (IN_TILES, _gated_gradient),
         "token_weight_gradient": (token_weight_gradient, _token_weight_gradient),
         "gathered_linear": (gathered_linear, _gathered_linear),
         "scores_bshd": (scores_bshd, _scores_bshd),
         "scaled_linear": (scaled_linear, _scaled_linear),
         "matmul_f32": (matmul_f32, _matmul_f32),
         "weight_gradient_split": (split(weight_gradient, 3), _weight_gradient),
         "swiglu_gate_split": (split(swiglu_gate, 4), _swiglu_gate),
         "scaled_linear_split": (split(scaled_linear, 2), _scaled_linear),
         "scaled_linear_sliced": (split(scaled_linear, 2, block_m=64), _scaled_linear),
         "gathered_linear_split": (split(gathered_linear, 2), _gathered_linear),
         "matmul_f32_split": (split(matmul_f32, 2), _matmul_f32),
         "bilinear_form": (bilinear_form, _bilinear_form),
         "bilinear_form_split": (split(bilinear_form, 3), _bilinear_form),
         "best_match": (best_match, _best_match),
         "best_match_split": (split(best_match, 2), _best_match)}
# relative to the output's largest magnitude, the project's bf16 tolerance: bf16 outputs round at
# 2⁻⁹ — under Triton's interpreter, which truncates f32 to bf16 instead of rounding to nearest
# (1.0049 becomes 1.0, not 1.0078) and multiplies in f32, up to 2⁻⁸ (measured 0.003–0.006); f32
# outputs of IEEE products are f32-exact. On the GPU a computed side's rounding to bf16 for the
# tensor cores adds up to 2⁻⁹ (the GPU tests' 1e-2)
BF16_INTERPRETED = 2e-2
TOLERANCE = {"linear": BF16_INTERPRETED, "swiglu_gate": BF16_INTERPRETED,
             "weight_gradient": BF16_INTERPRETED, "gated_gradient": BF16_INTERPRETED,
             "gated_gradient_in_tiles": BF16_INTERPRETED,
             "token_weight_gradient": BF16_INTERPRETED, "gathered_linear": BF16_INTERPRETED,
             "scores_bshd": BF16_INTERPRETED, "scaled_linear": BF16_INTERPRETED,
             "matmul_f32": 1e-5, "weight_gradient_split": BF16_INTERPRETED,
             "swiglu_gate_split": BF16_INTERPRETED, "scaled_linear_split": BF16_INTERPRETED,
             "scaled_linear_sliced": BF16_INTERPRETED,
             "gathered_linear_split": BF16_INTERPRETED, "matmul_f32_split": 1e-5,
             "bilinear_form": BF16_INTERPRETED, "bilinear_form_split": BF16_INTERPRETED,
             "best_match": BF16_INTERPRETED, "best_match_split": BF16_INTERPRETED}


def swiglu_backward_case(g, M=40, K=24, N=56, O=20):
    """SwiGLU's MLP backward (``tf.grad``): its floor's stages, GEMMs on the contraction
    template; the reference is torch's autograd of the forward in float64."""
    x, gate_proj, up_proj, down_proj = ((torch.randn(*s, generator=g) * w).to(torch.bfloat16)
                                        for s, w in (((M, K), 2), ((N, K), 0.3), ((N, K), 0.3),
                                                     ((O, N), 0.3)))
    d_out = torch.randn(M, O, generator=g).to(torch.bfloat16)
    leaves = [t.double().requires_grad_() for t in (x, gate_proj, up_proj, down_proj)]
    xd, gd, ud, dd = leaves
    a = xd @ gd.T
    (torch.nn.functional.silu(a) * (xd @ ud.T) @ dd.T).backward(d_out.double())
    return (dict(x=x, gate_proj=gate_proj, up_proj=up_proj, down_proj=down_proj, d_out=d_out),
            tuple(t.grad for t in leaves))


def on_contraction(kernel):
    """``kernel`` as ``tf.compile`` makes it for sm_90a, every GEMM (a stage of its floor, or
    the whole program) on the contraction template and the rest on the row-tile template, run by
    Triton's interpreter (the Hopper GEMM and the choice by sizes need a GPU)."""
    import warnings

    from tensorfuse.errors import NoTemplateWarning
    from tensorfuse.targets.triton.contraction_kernel import ContractionKernel

    def pick(made):
        gemm = [k for k in getattr(made, "ahead", ()) if isinstance(k, ContractionKernel)]
        return gemm[0] if gemm else made.template

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        made = tf.compile(kernel, target="cuda:sm_90a")
    if hasattr(made, "kernels"):
        made.kernels = tuple(pick(k) for k in made.kernels)
        return made
    return pick(made)


def contraction(kernel):
    from tensorfuse.schedule_templates.contraction import triton_contraction
    from tensorfuse.targets import get_target

    return triton_contraction(kernel, get_target("cuda:sm_90a"), **{
        **dict(block_m=16, block_n=32, block_k=16), **getattr(kernel, "knobs", {})})


if __name__ == "__main__":
    import json
    import sys

    from tensorfuse.autograd import grad
    from tensorfuse.kernels.layers import swiglu_mlp_kernel
    from tests.helpers import poisoned_main, relative_error

    if sys.argv[2:] == ["swiglu_backward"]:
        args, want = swiglu_backward_case(torch.Generator().manual_seed(int(sys.argv[1])))
        got = on_contraction(grad(swiglu_mlp_kernel("bf16")))(**args)
        print(json.dumps([relative_error(o, w) for o, w in zip(got, want, strict=True)]))
    else:
        poisoned_main(CASES, lambda name, kernel: contraction(kernel))
