"""Row kernels that add sums down the rows up in their own pass (a norm's weight gradient:
:mod:`tensorfuse.schedule_templates.column_sums`), and one that sweeps several row tiles a
program without sums, generated for sm_90a and run by Triton's interpreter on ragged bf16 rows
with large values, against torch's float64; prints each case's relative error as JSON. Most
cases sweep several row tiles a program, the last program's partly past the rows.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.column_sums_check SEED
"""
import torch

import tensorfuse as tf
import tensorfuse.dsl as T
import tensorfuse.kernels as K
from tests.helpers import poisoned_main

HOPPER = "cuda:sm_90a"


@tf.kernel
def rmsnorm3(x: T.Tensor["B", "S", "D", "bf16"], w: T.Tensor["D", "bf16"], eps: T.f32):
    """RMSNorm of ``[B, S, D]``: its weight gradient sums over the batch and the tokens."""
    b, s, d = T.axes("b s d")
    ms = T.sum(x[b, s, d] * x[b, s, d], over=d) / T.size("D")
    return x[b, s, d] * T.rsqrt(ms + eps) * w[d]


@tf.kernel
def normalised_with_column_peak(x: T.Tensor["M", "N", "bf16"]):
    """Rows scaled to unit RMS, and each column's largest scaled value (a max down the rows)."""
    i, j = T.axes("i j")
    ms = T.sum(x[i, j] * x[i, j], over=j) / T.size("N")
    y = x[i, j] * T.rsqrt(ms + 1e-6)
    return T.cast(y, "bf16"), T.max(y, over=i)


def _wide(generator, *shape, scale=(1.0, 8.0, 30.0)):
    """bf16 values whose rows span several magnitudes."""
    x = torch.randn(*shape, generator=generator)
    spread = torch.tensor(scale).repeat(shape[-2] // len(scale) + 1)[:shape[-2]]
    return (x * spread[:, None]).bfloat16()


def _norm_case(kind: str, shape: tuple):
    def case(generator):
        x = _wide(generator, *shape)
        n = shape[-1]
        w = (1 + 0.3 * torch.randn(n, generator=generator)).bfloat16()
        bias = torch.randn(n, generator=generator).bfloat16()
        seed = torch.randn(*shape, generator=generator).bfloat16()
        leaves = [t.double().requires_grad_() for t in ((x, w, bias) if kind == "layernorm"
                                                        else (x, w))]
        if kind == "layernorm":
            out = torch.nn.functional.layer_norm(leaves[0], (n,), leaves[1], leaves[2], 1e-5)
        else:
            out = torch.nn.functional.rms_norm(leaves[0], (n,), leaves[1], 1e-5)
        want = torch.autograd.grad(out, leaves, seed.double())
        args = dict(x=x, weight=w, eps=1e-5, d_out=seed)
        if kind == "layernorm":
            args["bias"] = bias
        if len(shape) == 3:
            args["w"] = args.pop("weight")
        return args, want
    return case


def _softmax_backward_case(generator):
    x = _wide(generator, 19, 200)
    seed = torch.randn(19, 200, generator=generator).bfloat16()
    exact = x.double().requires_grad_()
    want, = torch.autograd.grad(torch.softmax(exact, -1), exact, seed.double())
    return dict(x=x, d_out=seed), want


def _peak_case(generator):
    x = _wide(generator, 29, 160)
    y = x.double() * torch.rsqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-6)
    return dict(x=x), (y, y.max(0).values)


def _template(kernel, dynamic: bool = False, **knobs):
    """``kernel``'s row-tile template as ``tf.compile`` chooses it for sm_90a (``dynamic``: its
    sizes read as arguments), with ``knobs``."""
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.schedule_templates.row_reduction import row_reduction
    from tensorfuse.targets import get_target

    spec = get_target(HOPPER)
    if not knobs:
        return tf.compile(kernel, target=HOPPER, dynamic=dynamic).template
    name, fusion = choose(kernel.program, spec)
    assert name == "row_reduction", name
    return row_reduction(kernel, fusion, spec, **knobs)


CASES = {
    "rmsnorm_defaults": (tf.grad(K.rmsnorm), {}, _norm_case("rmsnorm", (37, 256))),
    # the sizes as arguments: the partials' count too, read by the kernel that adds them up
    "rmsnorm_sizes_as_arguments": (tf.grad(K.rmsnorm), dict(dynamic=True),
                                   _norm_case("rmsnorm", (45, 256))),
    "rmsnorm_tiles": (tf.grad(K.rmsnorm), dict(rows=2, row_tiles=3),
                      _norm_case("rmsnorm", (37, 256))),
    # whole tiles (32 rows, 16 tiles of 2) that the programs' 3 tiles each overrun: the last
    # program's last two tiles lie past the rows
    "rmsnorm_tiles_past_the_rows": (tf.grad(K.rmsnorm), dict(rows=2, row_tiles=3),
                                    _norm_case("rmsnorm", (32, 256))),
    "layernorm_tiles": (tf.grad(K.layernorm), dict(row_tiles=4),
                        _norm_case("layernorm", (45, 96))),
    "rmsnorm_batched": (tf.grad(rmsnorm3), dict(rows=4, row_tiles=2),
                        _norm_case("rmsnorm", (3, 10, 128))),
    "column_peak": (normalised_with_column_peak, dict(rows=4, row_tiles=3), _peak_case),
    # no sums: row tiles swept by each program all the same (the last past the rows)
    "softmax_backward_tiles": (tf.grad(K.softmax), dict(rows=2, row_tiles=4),
                               _softmax_backward_case),
}

if __name__ == "__main__":
    poisoned_main({name: (kernel, case) for name, (kernel, _, case) in CASES.items()},
                  lambda name, kernel: _template(kernel, **CASES[name][1]))
