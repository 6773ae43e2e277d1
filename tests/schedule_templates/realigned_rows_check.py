"""Row kernels whose rows start off 16-byte boundaries (widths not a multiple of a 16-byte vector,
:mod:`tensorfuse.targets.triton.row_realign`), swept in blocks through aligned windows, generated
for sm_90a and run by Triton's interpreter against torch's float64: ragged rows, every width
class modulo 8, a tensor that ends inside a vector (its tail block) and one that does not,
batched rows, f32 rows (4 a vector), large values, backward kernels, and blocks that lie inside
every row (read and written without tests) between those that hold the rows' ends. Prints each
case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.realigned_rows_check SEED
"""
import torch

import tensorfuse as tf
import tensorfuse.dsl as T
import tensorfuse.kernels as K
from tests.helpers import poisoned_main

HOPPER = "cuda:sm_90a"


@tf.kernel
def softmax3(x: T.Tensor["B", "S", "N", "bf16"]):
    """Softmax over the last axis of ``[B, S, N]``: rows of two axes, one offset per row."""
    b, s, j = T.axes("b s j")
    m = T.max(x[b, s, j], over=j)
    p = T.exp(x[b, s, j] - m)
    return p / T.sum(p, over=j)


@tf.kernel
def softmax_f32(x: T.Tensor["M", "N", "f32"]):
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    p = T.exp(x[i, j] - m)
    return p / T.sum(p, over=j)


def rows(generator, *shape, scale=6.0, offset=0.0, dtype=torch.bfloat16):
    """Random rows of ``shape``: normal, times ``scale``, plus ``offset``, in ``dtype``."""
    return (offset + scale * torch.randn(*shape, generator=generator)).to(dtype)


def softmax_case(shape, dtype=torch.bfloat16, scale=6.0):
    def case(generator):
        x = rows(generator, *shape, scale=scale, dtype=dtype)
        return dict(x=x), torch.softmax(x.double(), -1)
    return case


def _log_softmax_case(generator):
    x = rows(generator, 5, 1003, scale=20.0)
    return dict(x=x), torch.log_softmax(x.double(), -1)


def cross_entropy_case(M: int, V: int):
    """Per-row cross-entropy over ``M`` rows of ``V`` logits, against float64."""
    def case(generator):
        logits = rows(generator, M, V, scale=10.0)
        target = torch.randint(0, V, (M,), generator=generator, dtype=torch.int32)
        want = torch.nn.functional.cross_entropy(logits.double(), target.long(),
                                                 reduction="none")
        return dict(logits=logits, target=target), want
    return case


def _backward_case(forward):
    """The gradient of ``forward`` (softmax or log-softmax) over rows of 301, a tail included."""
    def case(generator):
        x = rows(generator, 7, 301, scale=6.0)
        seed = torch.randn(7, 301, generator=generator).bfloat16()
        exact = x.double().requires_grad_()
        want, = torch.autograd.grad(forward(exact, -1), exact, seed.double())
        return dict(x=x, d_out=seed), want
    return case


def _cross_entropy_backward_case(generator):
    logits = rows(generator, 7, 1001, scale=10.0)
    target = torch.randint(0, 1001, (7,), generator=generator, dtype=torch.int32)
    seed = torch.randn(7, generator=generator)
    exact = logits.double().requires_grad_()
    loss = torch.nn.functional.cross_entropy(exact, target.long(), reduction="none")
    want, = torch.autograd.grad(loss, exact, seed.double())
    return dict(logits=logits, target=target, d_out=seed), want


# name → (kernel, block of the sweep, case); widths cover 1 … 7 modulo 8, tensors ending inside
# a vector (7·301, 6·777, 7·1001) and on one (8·301, 2·3·301 with its batch)
CASES = {
    "softmax_tail": (K.softmax, 128, softmax_case((7, 301))),
    "softmax_whole": (K.softmax, 128, softmax_case((8, 301), scale=40.0)),
    "softmax_width_2_mod_8": (K.softmax, 64, softmax_case((3, 258))),
    "softmax_width_6_mod_8": (K.softmax, 64, softmax_case((5, 134))),
    # two blocks, both at the rows' ends: the first and last vectors' stores overlap the blocks'
    "softmax_two_edge_blocks": (K.softmax, 64, softmax_case((6, 67))),
    "softmax_batched": (softmax3, 128, softmax_case((2, 3, 301))),
    "softmax_f32": (softmax_f32, 64, softmax_case((5, 301), dtype=torch.float32)),
    "log_softmax": (K.log_softmax, 256, _log_softmax_case),
    "cross_entropy": (K.cross_entropy, 256, cross_entropy_case(7, 1001)),
    # backward kernels: rows of the output and its gradient, the input's gradient written
    "softmax_backward": (tf.grad(K.softmax), 128, _backward_case(torch.softmax)),
    "log_softmax_backward": (tf.grad(K.log_softmax), 128, _backward_case(torch.log_softmax)),
    "cross_entropy_backward": (tf.grad(K.cross_entropy), 256, _cross_entropy_backward_case),
    # the sizes read as arguments: the windows' bounds, the tail's presence a guard of the build
    "softmax_sizes_as_arguments": (K.softmax, 128, softmax_case((9, 299))),
}
SIZES_AS_ARGUMENTS = {"softmax_sizes_as_arguments"}


def template(kernel, block: int, rows: int = 4, num_warps: int = 1, dynamic: bool = False):
    """``kernel``'s row-tile template for sm_90a, swept in blocks of ``block`` (``rows`` rows a
    program on ``num_warps`` warps: a thread holds whole vectors of each block; ``dynamic``: the
    sizes read as arguments)."""
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.row_reduction import row_reduction
    from tensorfuse.targets import get_target

    spec = get_target(HOPPER)
    name, fusion = choose(kernel.program, spec)
    assert name == "row_reduction", name
    return row_reduction(kernel, fusion, spec, block=block, rows=rows, num_warps=num_warps,
                         dynamic=dynamic)


if __name__ == "__main__":
    poisoned_main({name: (kernel, case) for name, (kernel, _, case) in CASES.items()},
                  lambda name, kernel: template(kernel, CASES[name][1],
                                                dynamic=name in SIZES_AS_ARGUMENTS))
