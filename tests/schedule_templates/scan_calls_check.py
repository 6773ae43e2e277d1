"""A running mean compiled for sm_90a in Triton's interpreter: with ``dynamic=True`` called at
three row lengths (one cut into parts), and differentiated through autograd (its gradient is a
scan from the end); and discounted returns differentiated (their gradient, ``where(j >= i, g, 0)
· γ^(j − i)`` summed over ``i``, a discounted scan from the start); prints the builds, the worst
errors against float64 and what each backward runs on as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.scan_calls_check
"""
import json

import torch

import tensorfuse as tf
from tests.helpers import relative_error
from tests.schedule_templates.scan_check import _discounted, discounted_returns, running_mean


def _reference(x):
    return torch.cumsum(x, -1) / torch.arange(1, x.shape[-1] + 1)


if __name__ == "__main__":
    made = tf.compile(running_mean, target="cuda:sm_90a", dynamic=True)
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for B, N in ((3, 1000), (2, 3001), (1, 40000)):
        x = torch.randn(B, N, generator=generator) * 5
        worst = max(worst, relative_error(made(x), _reference(x.double())))
    trained = tf.compile(running_mean, target="cuda:sm_90a")
    x = (torch.randn(3, 700, generator=generator) * 5).requires_grad_()
    g = torch.randn(3, 700, generator=generator)
    (got,) = torch.autograd.grad(trained(x), x, g)
    exact = x.detach().double().requires_grad_()
    (want,) = torch.autograd.grad(_reference(exact), exact, g.double())
    backward = trained.torch_op.differentiation.backward_kernel()
    returns = tf.compile(discounted_returns, target="cuda:sm_90a")
    r = (torch.randn(2, 2500, generator=generator) * 10).requires_grad_()
    g = torch.randn(2, 2500, generator=generator)
    (got_r,) = torch.autograd.grad(returns(r, 0.99), r, g)
    print(json.dumps({"builds": len(made.cache_info()), "error": worst,
                      "gradient_error": relative_error(got, want),
                      "backward": backward.schedule_origin(),
                      "discounted_gradient_error": relative_error(
                          got_r, _discounted(g, 0.99, False)),
                      "discounted_backward": returns.torch_op.differentiation.backward_kernel()
                      .schedule_origin()}))
