"""Run Triton kernels on torch views — slices, strided rows, the first features of a paged cache —
in Triton's CPU interpreter against float64 references, counting the copies made of the
arguments; print, per case, the relative error and the copies, as JSON.

    TRITON_INTERPRET=1 python -m tests.targets.views_check SEED

A view whose innermost dimension is contiguous and whose start is 16-byte aligned is read where
it lies (:mod:`tensorfuse.targets.triton.view_strides`): no copy. A misaligned slice and a
transpose are still copied (one copy each).
"""
import json
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.gemm import matmul_nk as project
from benchmarks.unlisted_kernels import paged_latent_decode
from benchmarks.unlisted_kernels import router_softmax as softmax_rows
from tests.schedule_templates.staged_floor import interpreted


@tf.kernel
def gated(x: T.Tensor["M", "N", "f32"], gate: T.Tensor["M", "N", "f32"]):
    """No reduction: the elementwise template."""
    i, j = T.axes("i j")
    return x[i, j] * T.sigmoid(gate[i, j])


class _Copies(TorchDispatchMode):
    """Counts the clones and contiguous copies torch makes while it is active."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.clone.default, torch.ops.aten.contiguous.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _run(kernel, args: tuple):
    with _Copies() as copies:
        out = kernel(*args)
    return out, copies.count


def _error(out, ref) -> float:
    return float((out.double() - ref).abs().max() / ref.abs().max())


def softmax_cases(gen) -> dict:
    big = torch.randn(37, 300, generator=gen) * 20   # large values: the max subtracted matters
    made = interpreted(softmax_rows)
    views = {"column slice": big[:, 4:4 + 201],     # rows 300 apart, 16-byte aligned start
             "every other row": big[::2, :],
             "misaligned slice": big[:, 3:3 + 201],  # copied: not 16-byte aligned
             "transposed": big[:, :37].t()}          # copied: innermost not contiguous
    out = {}
    for name, x in views.items():
        got, copies = _run(made, (x,))
        out[f"softmax {name}"] = dict(error=_error(got, torch.softmax(x.double(), -1)),
                                      copies=copies)
    return out


def project_case(gen) -> dict:
    x = torch.randn(45, 3, 96, generator=gen).bfloat16()[:, 1]          # a slice of a packed input
    w = (torch.randn(70, 130, generator=gen) * 4).bfloat16()[:, 2:2 + 96]   # 4-byte start: copied
    w_aligned = (torch.randn(70, 136, generator=gen) * 4).bfloat16()[:, 8:8 + 96]
    made = interpreted(project)
    out = {}
    for name, weight in (("packed input", w), ("both views", w_aligned)):
        got, copies = _run(made, (x, weight))
        out[f"project {name}"] = dict(error=_error(got, x.double() @ weight.double().T),
                                      copies=copies)
    return out


def gated_case(gen) -> dict:
    base = torch.randn(2, 33, 260, generator=gen) * 8
    x, g = base[0, :, :200], base[1, :, 4:204]
    made = interpreted(gated)
    got, copies = _run(made, (x, g))
    ref = x.double() * torch.sigmoid(g.double())
    return {"gated views": dict(error=_error(got, ref), copies=copies)}


def paged_case(gen) -> dict:
    """The latent decode over pages of a shuffled pool, the values the first 512 of the 576
    features of the same pages (a view)."""
    B, H, DQ, DV, PAGE, NP = 2, 16, 576, 512, 16, 3
    q = torch.randn(B, H, DQ, generator=gen).bfloat16()
    pages = torch.randn(2 * B * NP, PAGE, DQ, generator=gen).bfloat16()
    table = torch.randperm(2 * B * NP, generator=gen)[:B * NP].reshape(B, NP).int()
    keys = pages[table.long()].reshape(B, NP * PAGE, DQ).double()
    scale = DQ ** -0.5
    s = torch.einsum("bhd,bnd->bhn", q.double(), keys) * scale
    ref = torch.einsum("bhn,bne->bhe", torch.softmax(s, -1), keys[..., :DV])
    got, copies = _run(interpreted(paged_latent_decode),
                       (q, pages, pages[..., :DV], table, scale))
    return {"paged latent decode": dict(error=_error(got, ref), copies=copies)}


def main(seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for case in (softmax_cases, project_case, gated_case, paged_case):
        out.update(case(gen))
    return out


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    print(json.dumps(main(int(sys.argv[1]))))
