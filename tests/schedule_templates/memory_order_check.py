"""Call kernels with tensors in another axis order than their programs declare — a channels-last
activation seen as ``[B, C, P]``, a transposed weight, keys passed as ``k.transpose(-1, -2)`` —
through ``tf.compile``'s kernel (its route to the program in the tensors' memory order,
:mod:`tensorfuse.memory_order`) in Triton's CPU interpreter; outputs poisoned,
against float64 references of the math as written; print, per case, the relative error, the
copies torch made of the arguments and the route's description, as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.memory_order_check SEED
"""
import json
import os
import sys
import warnings

import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.gemm import matmul_nk
from benchmarks.unlisted_kernels import attention_keys_transposed
from benchmarks.user_kernels import group_norm, layernorm_channels, log_softmax_channels
from tensorfuse.dsl.program import ProgramKernel
from tests.helpers import poisoned_call, relative_error
from tests.schedule_templates.staged_floor import interpreted
from tests.targets.views_check import _Copies, gated


def _log_softmax(gen):
    x = (torch.randn(2, 300, 37, generator=gen) * 20).bfloat16().permute(0, 2, 1)   # [B, C, P]
    return {"x": x}, torch.log_softmax(x.double(), 1)


def _layer_norm(gen):
    x = (torch.randn(3, 130, 100, generator=gen) * 8 + 3).bfloat16().permute(0, 2, 1)
    w, bias = torch.randn(100, generator=gen).bfloat16(), torch.randn(100, generator=gen).bfloat16()
    xd = x.double()
    mean = xd.mean(1, keepdim=True)
    var = ((xd - mean) ** 2).mean(1, keepdim=True)
    want = (xd - mean) / torch.sqrt(var + 1e-5) * w.double()[:, None] + bias.double()[:, None]
    return {"x": x, "w": w, "bias": bias, "eps": 1e-5}, want


def _group_norm(gen):
    B, G, C, P = 2, 4, 6, 50
    base = (torch.randn(B, P, G, C, generator=gen) * 5 - 2).bfloat16()   # channels last
    x = base.permute(0, 2, 3, 1)                                         # [B, G, C, P]
    w, bias = torch.randn(G, C, generator=gen).bfloat16(), torch.randn(G, C, generator=gen).bfloat16()
    xd = x.double()
    mean = xd.mean((2, 3), keepdim=True)
    var = ((xd - mean) ** 2).mean((2, 3), keepdim=True)
    want = (xd - mean) / torch.sqrt(var + 1e-5) * w.double()[..., None] + \
        bias.double()[..., None]
    return {"x": x, "w": w, "bias": bias, "eps": 1e-5}, want


def _project(gen):
    x = torch.randn(48, 96, generator=gen).bfloat16()
    wt = (torch.randn(96, 72, generator=gen) * 4).bfloat16()    # the weight kept [K, N]
    w = wt.t()                                                  # declared [N, K]: a view
    return {"x": x, "w": w}, x.double() @ w.double().T


def _keys_transposed(gen):
    B, H, S, D = 1, 2, 70, 32
    q, k, v = (torch.randn(B, H, S, D, generator=gen).bfloat16() for _ in range(3))
    scale = D ** -0.5
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    # kt declared [B, H, D, S]: the caller's keys [B, H, S, D], transposed (a view)
    return {"q": q, "kt": k.transpose(-1, -2), "v": v, "scale": scale}, \
        torch.softmax(s, -1) @ v.double()


@tf.kernel
def cumulative_sum_down(x: T.Tensor["T", "B", "f32"]):
    """A cumulative sum down the first axis of [T, B] (the scan template's)."""
    b = T.axis("b", "B")
    t, s = T.axis("t", "T"), T.axis("s", "T")
    return T.sum(T.where(s <= t, x[s, b], 0.0), over=s)


def _gated(gen):
    base = torch.randn(2, 72, 33, generator=gen) * 8     # each slab 16-byte aligned
    x, g = base[0].t(), base[1].t()                      # [33, 72] views of [72, 33]
    return {"x": x, "gate": g}, x.double() * torch.sigmoid(g.double())


def _cumulative_sum(gen):
    x = (torch.randn(45, 300, generator=gen) * 3).t()     # [T, B] view of [B, T]
    return {"x": x}, torch.cumsum(x.double(), 0).t()     # out over (b, t)


CASES = {"log-softmax over channels, channels last": (log_softmax_channels, _log_softmax),
         "layer norm over channels, channels last": (layernorm_channels, _layer_norm),
         "group norm, channels last": (group_norm, _group_norm),
         "project, weight transposed": (matmul_nk, _project),
         "attention, keys transposed": (attention_keys_transposed, _keys_transposed),
         "gated, both transposed (elementwise)": (gated, _gated),
         "cumulative sum down a transposed view (scan)": (cumulative_sum_down, _cumulative_sum)}


def routed(kernel):
    """``tf.compile(kernel)`` for sm_90a whose routes make their kernels for the interpreter
    (a call routed to the program in its tensors' memory order never reaches what picks a
    kernel on a GPU), or, where it has no routes (a sweep over several axes flattened), the
    interpreted kernel."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = tf.compile(kernel, target="cuda:sm_90a")
        if getattr(made, "routes", None) is None:
            return interpreted(kernel)
    made.routes.make = lambda program: interpreted(ProgramKernel(program))
    return made


def _route(made, args: dict) -> str | None:
    """What the kernel's route for a call on ``args`` reads in memory order, or None."""
    route = made.routes.route((), args) if getattr(made, "routes", None) else None
    return route.lift if route else None


def _outputs(made) -> tuple:
    return made if isinstance(made, tuple) else (made,)


def _error(outs: tuple, want) -> float:
    """The worst relative error of a kernel's outputs (a tuple) against float64 ``want``."""
    return relative_error(outs if len(outs) > 1 else outs[0], want)


def _layout(t) -> tuple:
    """The order of ``t``'s axes in memory (largest stride first)."""
    return tuple(sorted(range(t.dim()), key=lambda k: -t.stride(k)))


def main(seed: int) -> dict:
    """Per case: the error into contiguous poisoned outputs (the kernel writes them in the
    program's layout), the copies made, the route; then without ``out=`` (``kept``: the error,
    and the order the output lies in memory) and into poisoned outputs laid out that way
    (``in_place``: the error, and whether those very tensors came back); through the kernel's
    custom operator (``operator``: the error, and whether its outputs are contiguous, as its
    fake implementation says)."""
    generator = torch.Generator().manual_seed(seed)
    found = {}
    for name, (kernel, case) in CASES.items():
        made = routed(kernel)
        args, want = case(generator)
        with _Copies() as copies:
            outs = poisoned_call(made, kernel.program, args, want)
        got = dict(error=_error(outs, want), copies=copies.count,
                   route=_route(made, {**args, "out": outs[0]}))
        kept = _outputs(made(**args))
        got["kept"] = dict(error=_error(kept, want), layouts=[_layout(t) for t in kept],
                           route=_route(made, args))
        laid = tuple(torch.full_like(t, float("nan")) for t in kept)   # the same strides
        back = _outputs(made(**args, out=laid if len(laid) > 1 else laid[0]))
        got["in_place"] = dict(error=_error(laid, want),
                               same=all(b is t for b, t in zip(back, laid)))
        # as torch.compile and autograd call it: its custom operator, whose fake
        # implementation says row-major outputs
        got["operator"] = None   # (the interpreted stand-in of a kernel without routes)
        if getattr(made, "torch_op", None) is not None:
            op = _outputs(made.torch_op((), args))
            got["operator"] = dict(error=_error(op, want),
                                   contiguous=all(t.is_contiguous() for t in op))
        found[name] = got
    return found


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    print(json.dumps(main(int(sys.argv[1]))))
