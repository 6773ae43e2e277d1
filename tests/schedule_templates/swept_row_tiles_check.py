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

HOPPER = "cuda:sm_90a"


@tf.kernel
def group_norm_flat(x: T.Tensor["B", "G", "N", "bf16"], eps: T.f32):
    """A group norm's [B, G, C/G·P] view: normalised over the flat last axis."""
    b, g, j = T.axes("b g j")
    mean = T.sum(x[b, g, j], over=j) / T.size("N")
    var = T.sum((x[b, g, j] - mean) * (x[b, g, j] - mean), over=j) / T.size("N")
    return (x[b, g, j] - mean) * T.rsqrt(var + eps)


def _rows(generator, *shape, scale=4.0, offset=0.0):
    return (offset + scale * torch.randn(*shape, generator=generator)).to(torch.bfloat16)


def _softmax(generator):
    x = _rows(generator, 7, 512, scale=20.0)
    return dict(x=x), torch.softmax(x.double(), -1)


def _layernorm(generator):
    x = _rows(generator, 5, 384, offset=30.0)
    w, b = _rows(generator, 384, scale=1.0), _rows(generator, 384, scale=1.0)
    want = torch.nn.functional.layer_norm(x.double(), (384,), w.double(), b.double(), 1e-5)
    return dict(x=x, weight=w, bias=b, eps=1e-5), want


def _cross_entropy(generator):
    logits = _rows(generator, 9, 1024, scale=10.0)
    target = torch.randint(0, 1024, (9,), generator=generator, dtype=torch.int32)
    want = torch.nn.functional.cross_entropy(logits.double(), target.long(), reduction="none")
    return dict(logits=logits, target=target), want


def _group_norm(generator):
    x = _rows(generator, 2, 3, 640, offset=-7.0)
    flat = x.double()
    mean = flat.mean(-1, keepdim=True)
    var = flat.var(-1, unbiased=False, keepdim=True)
    return dict(x=x, eps=1e-5), (flat - mean) / torch.sqrt(var + 1e-5)


# name → (kernel, block of the sweep, row tiles a program, case); the rows (7, 5, 9, 3 per
# batch) are not a multiple of the tiles a program takes, every row is several blocks
CASES = {
    "softmax": (K.softmax, 128, 2, _softmax),
    "layernorm": (K.layernorm, 128, 4, _layernorm),
    "cross_entropy": (K.cross_entropy, 256, 2, _cross_entropy),
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
