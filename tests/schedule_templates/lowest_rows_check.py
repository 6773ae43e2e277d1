"""Rows whose values all sit at float32's lowest value (``finfo.min``, how a float32 mask hides a
padded row) through the Triton templates, in Triton's CPU interpreter: the running maximum's
identity is that very value, and such a row must weigh its elements equally, as the math as
written does (0/0 before the identity could be kept as the reference).

    TRITON_INTERPRET=1 python -m tests.schedule_templates.lowest_rows_check SEED
"""
import numpy as np
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels.layers import additive_mask_attention_kernel
from tests.helpers import poisoned_main

LOWEST = float(np.finfo(np.float32).min)
ROWS = T.Tensor["M", "N", "f32"]


@tf.kernel
def softmax_f32(x: ROWS):
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    p = T.exp(x[i, j] - m)
    return p / T.sum(p, over=j)


@tf.kernel
def logsumexp_f32(x: ROWS):
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    return m + T.log(T.sum(T.exp(x[i, j] - m), over=j))


def lowest_rows(generator, shape) -> torch.Tensor:
    """Random rows (scaled up to 1e4), one all at the lowest value, one half at it, one with a
    single real value among lowest ones."""
    x = torch.randn(shape, generator=generator, dtype=torch.float64) * 1e4
    x[..., 0, :] = LOWEST
    x[..., 1, : shape[-1] // 2] = LOWEST
    x[..., 2, :] = LOWEST
    x[..., 2, shape[-1] // 3] = 1.0
    return x.float()


def _row_case(kernel, softmax: bool):
    def case(generator):
        x = lowest_rows(generator, (5, 300))
        x64 = x.double()
        return {"x": x}, (torch.softmax(x64, -1) if softmax else torch.logsumexp(x64, -1))
    return kernel, case


def _attention_case(generator):
    """Attention with a float32 additive mask at the lowest value: query row 0 of each head masked
    whole, row 1 on half of the keys."""
    q, k, v = (torch.randn(s, generator=generator, dtype=torch.float64).float()
               for s in ((1, 2, 37, 16), (1, 1, 70, 16), (1, 1, 70, 16)))
    mask = torch.randn((1, 1, 37, 70), generator=generator, dtype=torch.float64).float()
    mask[..., 0, :] = LOWEST
    mask[..., 1, :35] = LOWEST
    s = torch.einsum("bhid,bhjd->bhij", q.double(), k.double().expand(1, 2, 70, 16)) * 0.25
    s = (s + mask.double()).float().double()   # the f32 sums round to the lowest value, as here
    want = torch.softmax(s, -1) @ v.double().expand(1, 2, 70, 16)
    return {"q": q, "k": k, "v": v, "mask": mask, "scale": 0.25}, want


CASES = {
    "softmax rolled": _row_case(softmax_f32, True),
    "softmax split": _row_case(softmax_f32, True),
    "logsumexp rolled": _row_case(logsumexp_f32, False),
    "attention, f32 mask": (additive_mask_attention_kernel("f32", "f32", False), _attention_case),
}


def made(name: str, kernel):
    sch = tf.schedule(kernel, "cuda:sm_90a")
    if name.startswith("attention"):
        sch.rolling_update("m", "l", "o", axis="j")
        sch.apply_template("attention", tile_m=16, tile_n=16)
    else:
        names = [c.name for c in kernel.program.computes if c.is_reduction]
        sch.rolling_update(*names, axis="j")
        sch.apply_template("row_reduction", block=128, **({"splits": 2} if "split" in name
                                                          else {}))
    return sch.compile()


if __name__ == "__main__":
    poisoned_main(CASES, made)
