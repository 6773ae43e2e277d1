"""Row kernels whose programs sweep several row tiles in turn while each row is swept in blocks
(``Knobs.row_tiles`` over rows wider than a block: fewer rows held between a row's two passes),
generated for sm_90a and run by Triton's interpreter against torch's float64: the last program's
tiles past the rows, rows read twice (softmax, layer norm) and once (cross-entropy), a group
norm's two reduced axes. Prints each case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.swept_row_tiles_check SEED
"""
import torch

import tensorfuse as tf
import tensorfuse.dsl as T
import tensorfuse.kernels as K
from tests.helpers import poisoned_main
from tests.schedule_templates.realigned_rows_check import cross_entropy_case, rows, softmax_case

HOPPER = "cuda:sm_90a"


@tf.kernel
def group_norm_flat(x: T.Tensor["B", "G", "N", "bf16"], eps: T.f32):
    """A group norm's [B, G, C/G·P] view: normalised over the flat last axis."""
    b, g, j = T.axes("b g j")
    mean = T.sum(x[b, g, j], over=j) / T.size("N")
    var = T.sum((x[b, g, j] - mean) * (x[b, g, j] - mean), over=j) / T.size("N")
    return (x[b, g, j] - mean) * T.rsqrt(var + eps)


def _layernorm(generator):
    x = rows(generator, 5, 384, offset=30.0)
    w, b = rows(generator, 384, scale=1.0), rows(generator, 384, scale=1.0)
    want = torch.nn.functional.layer_norm(x.double(), (384,), w.double(), b.double(), 1e-5)
    return dict(x=x, weight=w, bias=b, eps=1e-5), want


def _group_norm(generator):
    x = rows(generator, 2, 3, 640, offset=-7.0)
    flat = x.double()
    mean = flat.mean(-1, keepdim=True)
    var = flat.var(-1, unbiased=False, keepdim=True)
    return dict(x=x, eps=1e-5), (flat - mean) / torch.sqrt(var + 1e-5)


# name → (kernel, block of the sweep, row tiles a program, case); the rows (7, 5, 9, 3 per
# batch) are not a multiple of the tiles a program takes, every row is several blocks
CASES = {
    "softmax": (K.softmax, 128, 2, softmax_case((7, 512), scale=20.0)),
    "layernorm": (K.layernorm, 128, 4, _layernorm),
    "cross_entropy": (K.cross_entropy, 256, 2, cross_entropy_case(9, 1024)),
    "group_norm": (group_norm_flat, 128, 2, _group_norm),
}


def template(kernel, block: int, row_tiles: int):
    """``kernel``'s row template for sm_90a, one row a tile swept in blocks of ``block``, each
    program taking ``row_tiles`` tiles in turn."""
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.row_reduction import row_reduction
    from tensorfuse.targets import get_target

    spec = get_target(HOPPER)
    name, fusion = choose(kernel.program, spec)
    assert name == "row_reduction", name
    return row_reduction(kernel, fusion, spec, block=block, rows=1, num_warps=1,
                         row_tiles=row_tiles)


if __name__ == "__main__":
    poisoned_main({name: (kernel, case) for name, (kernel, _, _, case) in CASES.items()},
                  lambda name, kernel: template(kernel, *CASES[name][1:3]))
