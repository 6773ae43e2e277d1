"""A running mean compiled for sm_90a in Triton's interpreter: with ``dynamic=True`` called at
three row lengths (one cut into parts), and differentiated through autograd (its gradient is a
scan from the end); and discounted returns differentiated (their gradient, ``where(j >= i, g, 0)
· γ^(j − i)`` summed over ``i``, a discounted scan from the start) and a gated recurrence
(its gradients three scans of decays that vary); prints the builds, the worst
errors against float64 and what each backward runs on as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.scan_calls_check
"""
import json

import torch

import tensorfuse as tf
from tests.helpers import relative_error
from tests.schedule_templates.scan_check import (_discounted, discounted_returns, gated_recurrence,
                                                 running_mean)


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
    # a decay that varies: each gradient (by c at the output's position and at the term's, by
    # u) a discounted scan of its own, against autograd of the dense sum in float64
    gated = tf.compile(gated_recurrence, target="cuda:sm_90a")
    c = torch.log(0.5 + 0.5 * torch.rand(2, 300, 3, generator=generator)).cumsum(1)
    c.requires_grad_()
    u = torch.randn(2, 300, 3, generator=generator).requires_grad_()
    dh = torch.randn(2, 300, 3, generator=generator)
    got_c, got_u = torch.autograd.grad(gated(c, u), (c, u), dh)
    cd, ud = (t.detach().double().requires_grad_() for t in (c, u))
    keep = torch.ones(300, 300, dtype=torch.bool).tril()   # [i, j]: j <= i
    weights = torch.where(keep[None, :, :, None], (cd[:, :, None] - cd[:, None, :]).exp(), 0.0)
    want_c, want_u = torch.autograd.grad((weights * ud[:, None]).sum(2), (cd, ud), dh.double())
    gated_backward = gated.torch_op.differentiation.backward_kernel().schedule_origin()
    print(json.dumps({"builds": len(made.cache_info()), "error": worst,
                      "gated_gradient_error": max(relative_error(got_c, want_c),
                                                  relative_error(got_u, want_u)),
                      "gated_backward": gated_backward,
                      "gradient_error": relative_error(got, want),
                      "backward": backward.schedule_origin(),
                      "discounted_gradient_error": relative_error(
                          got_r, _discounted(g, 0.99, False)),
                      "discounted_backward": returns.torch_op.differentiation.backward_kernel()
                      .schedule_origin()}))
