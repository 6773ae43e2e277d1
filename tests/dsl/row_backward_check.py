"""The backward of softmax, log-softmax and cross-entropy as ``tf.compile`` makes it for sm_90a
(one row-template kernel: their maxima only stabilise them, :mod:`tensorfuse.dsl.stabilisers`;
softmax's and log-softmax's also from their saved outputs, as autograd runs them),
run by Triton's interpreter on ragged bf16 rows with large values and tied maxima, and of a
product over float32 rows with none, one and two zero terms, against torch's float64 autograd;
prints each one's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.dsl.row_backward_check SEED
"""
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.autograd import GradientKernel
from tests.helpers import poisoned_main, templated
from tests.schedule_templates.user_written_check import survival

M, N = 7, 333


def _rows(generator) -> torch.Tensor:
    """bf16 rows of large range, each with its maximum tied three times."""
    x = torch.randn(M, N, generator=generator) * torch.tensor([1.0, 8.0, 30.0] * 3)[:M, None]
    x = x.bfloat16()
    x[:, :3] = x.max(dim=1, keepdim=True).values
    return x


def _case(kind: str):
    def case(generator):
        x = _rows(generator)
        exact = x.double().requires_grad_()
        if kind == "cross_entropy":
            target = torch.randint(0, N, (M,), generator=generator, dtype=torch.int32)
            out = torch.nn.functional.cross_entropy(exact, target.long(), reduction="none")
            seed = torch.randn(M, generator=generator)
            out.backward(seed.double())
            return dict(logits=x, target=target, d_out=seed), exact.grad
        normalise = torch.softmax if kind.startswith("softmax") else torch.log_softmax
        out = normalise(exact, -1)
        seed = torch.randn(M, N, generator=generator).bfloat16()
        out.backward(seed.double())
        if kind.endswith("_saved"):   # the forward's output as autograd saved it, in bf16
            return dict(x=x, d_out=seed, out_saved=normalise(x.float(), -1).bfloat16()), \
                exact.grad
        return dict(x=x, d_out=seed), exact.grad
    return case


CASES = {name: (tf.grad(getattr(K, name)), _case(name))
         for name in ("softmax", "log_softmax", "cross_entropy")}
# the backward autograd runs: from the saved output (y · (dy − Σ y·dy); dy − exp(y) · Σ dy)
CASES.update({f"{name}_saved": (GradientKernel(getattr(K, name), saved_outputs=True),
                                _case(f"{name}_saved")) for name in ("softmax", "log_softmax")})



def _product_case(generator):
    """1 − h over rows of 50 steps, rows 1, 4 with one zero term, rows 2, 5 with two."""
    h = (torch.rand(M, 50, generator=generator) - 0.5) * 0.2
    h[1::3, 7] = 1.0
    h[2::3, 11] = h[2::3, 40] = 1.0
    exact = h.double().requires_grad_()
    seed = torch.randn(M, generator=generator)
    (1.0 - exact).prod(1).backward(seed.double())
    return dict(h=h, d_out=seed), exact.grad


CASES["survival"] = (tf.grad(survival), _product_case)

if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: templated(kernel))
