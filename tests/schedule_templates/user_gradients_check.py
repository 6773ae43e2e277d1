"""Gradients of kernels as users write them (:mod:`.user_written_check`,
:mod:`.user_written_more_check`): ``tf.grad`` of each — its parts added — against torch's
float64 autograd of the same math on fresh inputs, the incoming gradients random: a SwiGLU over
a row's halves (two reads of one tensor at different indices), a group norm (w and b per group
and channel), a masked variance over long left-padded rows, a product with zeros, cross-entropy
with ignored targets, an unbiased variance far from 0, a residual sum and its RMS norm (two
outputs), a KL divergence of two logit rows, a dot of each row with a column read transposed
and attention pooling (gradients over different axes: a stage each). Through Triton's interpreter as ``tf.compile``
makes the backward for sm_90a (this module's ``__main__``) and through the CPU target
(:mod:`tests.schedule_templates.test_user_written`).

    TRITON_INTERPRET=1 python -m tests.schedule_templates.user_gradients_check SEED
"""
import torch

import tensorfuse as tf
from benchmarks.user_kernels import group_norm
from tensorfuse.autograd import sum_parts
from tensorfuse.interop import torch_dtype
from tests.schedule_templates import user_written_check as U
from tests.schedule_templates import user_written_more_check as M
from tests.schedule_templates.user_written_extra_check import attention_pool, transposed_dot
from tests.schedule_templates.user_written_check import _randn

def _group_norm(x, w, bias, eps):
    mean = x.mean((2, 3), keepdim=True)
    var = ((x - mean) ** 2).mean((2, 3), keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w[None, :, :, None] + bias[None, :, :, None]


def _masked_variance(x, mask):
    count = mask.sum(1)
    mean = (x * mask).sum(1) / count
    return (mask * (x - mean[:, None]) ** 2).sum(1) / count


def _left_padded(g):
    """Rows of 40000 around 50, their first 9000 masked."""
    mask = (torch.rand(2, 40000, generator=g) > 0.3).float()
    mask[:, :9000] = 0
    return dict(x=torch.randn(2, 40000, generator=g) + 50, mask=mask)


def _with_zeros(g):
    x = torch.rand(37, 20, generator=g) + 0.5
    x[3, 4] = x[5, 1] = x[5, 7] = 0.0   # rows with one zero and with two
    return dict(x=x)


def _ignored_targets(g):
    target = torch.randint(0, 300, (37,), generator=g)
    target[::3] = -100
    return dict(x=_randn(g, 37, 300), t=target)


# name → (kernel, its arguments from a generator, the math in torch)
CASES = {
    "swiglu_rms": (M.swiglu_rms, lambda g: dict(x=_randn(g, 37, 300)), lambda x: (
        torch.nn.functional.silu(x[:, :150]) * x[:, 150:]).pow(2).mean(1).sqrt()),
    "group_norm": (group_norm, lambda g: dict(x=_randn(g, 2, 3, 5, 67) + 3,
                                              w=_randn(g, 3, 5, scale=1),
                                              bias=_randn(g, 3, 5, scale=1), eps=1e-5),
                   _group_norm),
    "masked_var_rows": (U.masked_var_rows, _left_padded, _masked_variance),
    "product": (M.product, _with_zeros, lambda x: x.prod(1)),
    "ce_ignore_index": (M.ce_ignore_index, _ignored_targets,
                        lambda x, t: torch.nn.functional.cross_entropy(
                            x, t, reduction="none", ignore_index=-100)),
    "unbiased_var": (M.unbiased_var,
                     lambda g: dict(x=_randn(g, 37, 300, dtype=torch.float32) * 100 + 1000),
                     lambda x: x.var(1)),
    "add_rmsnorm": (M.add_rmsnorm, lambda g: dict(x=_randn(g, 37, 300), r=_randn(g, 37, 300),
                                                  w=_randn(g, 300, scale=1)),
                    lambda x, r, w: (x + r, (x + r) * torch.rsqrt(
                        (x + r).pow(2).mean(1, keepdim=True) + 1e-6) * w)),
    "kl_logits": (U.kl_logits, lambda g: dict(p=_randn(g, 37, 300), q=_randn(g, 37, 300)),
                  lambda p, q: (p.softmax(1) * (p.log_softmax(1) - q.log_softmax(1))).sum(1)),
    "transposed_dot": (transposed_dot, lambda g: dict(x=_randn(g, 45, 70, dtype=torch.float32),
                                                      y=_randn(g, 70, 45, dtype=torch.float32)),
                       lambda x, y: (x * y.T).sum(1)),
    # scores of ~5: float32's rounding of a score of ~20 moved the gradient 3e-5 (by norm)
    "attention_pool": (attention_pool, lambda g: dict(
        x=_randn(g, 3, 77, 40, dtype=torch.float32),
        w=_randn(g, 40, scale=0.25, dtype=torch.float32)),
        lambda x, w: (torch.softmax((x * w).sum(-1), 1)[..., None] * x).sum(1)),
}


def tolerance(kernel) -> float:
    """The relative error (by norm) a gradient may have: 2e-2 where the kernel reads a 16-bit
    float (its gradient is one), 1e-5 where every input is float32."""
    return 2e-2 if any(p.dtype in ("bf16", "f16") for p in kernel.program.tensor_params) \
        else 1e-5


def gradient_errors(g, make, device: str = "cpu") -> dict:
    """name → the worst relative error (by norm) of a parameter's gradient, ``make(kernel)``
    making the backward kernel that runs (on tensors on ``device``): each case's ``tf.grad``
    against float64 autograd, random incoming gradients in the outputs' dtypes."""
    errors = {}
    for name, (kernel, arguments, math) in CASES.items():
        args = arguments(g)
        diff = [n for n, a in args.items() if isinstance(a, torch.Tensor) and
                a.is_floating_point()]
        exact = {n: a.double().requires_grad_() if n in diff else a for n, a in args.items()}
        outs = math(**exact)
        outs = outs if isinstance(outs, tuple) else (outs,)
        seeds = [torch.randn(o.shape, generator=g).to(torch_dtype(c.dtypes[0]))
                 for o, c in zip(outs, kernel.program.outputs)]
        want = torch.autograd.grad(outs, [exact[n] for n in diff], [s.double() for s in seeds])
        backward = tf.grad(kernel)
        got = make(backward)(**{n: a.to(device) if isinstance(a, torch.Tensor) else a
                                for n, a in args.items()},
                             **{f"d_{c.name}": s.to(device)
                                for c, s in zip(kernel.program.outputs, seeds)})
        parts = sum_parts(backward.outputs, got if isinstance(got, tuple) else (got,))
        errors[name] = max(float((parts[n].double().cpu() - w).norm() / w.norm())
                           for n, w in zip(diff, want))
    return errors


if __name__ == "__main__":
    import json
    import sys
    import warnings

    from tests.schedule_templates.staged_floor import interpreted

    warnings.simplefilter("ignore")
    print(json.dumps(gradient_errors(torch.Generator().manual_seed(int(sys.argv[1])),
                                     interpreted)))
