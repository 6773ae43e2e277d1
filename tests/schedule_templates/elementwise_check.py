"""Programs without reductions as ``tf.compile`` makes them for sm_90a — the elementwise
template (:mod:`tensorfuse.schedule_templates.elementwise`) — run by Triton's interpreter against
float64 references in torch (never the project's lowering), outputs poisoned first, at ragged
sizes and large value ranges: the gradients of a global average pool and of a mean over tokens
(broadcasts), a tanh-GELU, a transposing scale and shift, two outputs of one pass, sizes as
arguments, rotary embeddings (a feature read at (d + D/2) % D), and pooling windows written out
(a 2×2 max of named sizes, a 3×3 mean of literal ones, maxout over 4 and 16 consecutive features and a
complex magnitude over (real, imaginary) pairs: terms read as one contiguous load). Prints each case's relative error as
JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.elementwise_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from benchmarks.unlisted_kernels import max_pool_2x2, maxout, rotary
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


@tf.kernel
def global_avg_pool(x: T.Tensor["B", "C", "H", "W", "bf16"]):
    b, c, h, w = T.axes("b c h w")
    return T.sum(x[b, c, h, w], over=(h, w)) / (T.size("H") * T.size("W"))


@tf.kernel
def token_mean(x: T.Tensor["B", "S", "D", "bf16"]):
    b, s, d = T.axes("b s d")
    return T.sum(x[b, s, d], over=s) / T.size("S")


@tf.kernel
def gelu_tanh(x: T.Tensor["M", "N", "bf16"]):
    i, j = T.axes("i j")
    v = x[i, j]
    return 0.5 * v * (1 + T.tanh(0.7978845608 * (v + 0.044715 * v * v * v)))


@tf.kernel
def scale_shift_transposed(x: T.Tensor["M", "N", "bf16"], w: T.Tensor["N", "bf16"],
                           shift: T.f32):
    j, i = T.axes("j i")   # the output's axes in their order of declaration: [N, M]
    return x[i, j] * w[j] + shift


@tf.kernel
def two_outputs(x: T.Tensor["M", "N", "bf16"], bias: T.Tensor["N", "bf16"]):
    i, j = T.axes("i j")
    h = x[i, j] + bias[j]
    return h * T.sigmoid(h), T.cast(h, "f32")


@tf.kernel
def avg_pool_3x3(x: T.Tensor["B", "C", "H", 3, "W", 3, "bf16"]):
    """A 3×3 average pool (stride 3) with the window's extents written as literals."""
    b, c, i, j, p, q = T.axes("b c i j p q")
    return T.sum(x[b, c, i, p, j, q], over=(p, q)) / 9.0


@tf.kernel
def complex_magnitude(z: T.Tensor["M", "N", 2, "f32"]):
    """|z| of complex numbers stored as (real, imaginary) pairs, the torch.view_as_real layout."""
    i, j, c = T.axes("i j c")
    return T.sqrt(T.sum(z[i, j, c] * z[i, j, c], over=c))


def _random(generator, *shape, width=4.0):
    return (torch.randn(*shape, generator=generator) * width).to(torch.bfloat16)


def avg_pool_case(generator, B=3, C=5, H=7, W=9):
    x, d_out = _random(generator, B, C, H, W), _random(generator, B, C, width=50.0)
    want = (d_out.double() / (H * W))[:, :, None, None].expand(B, C, H, W)
    return dict(x=x, d_out=d_out), [want]


def token_mean_case(generator, B=2, S=37, D=19):
    x, d_out = _random(generator, B, S, D), _random(generator, B, D, width=50.0)
    return dict(x=x, d_out=d_out), [(d_out.double() / S)[:, None, :].expand(B, S, D)]


def gelu_case(generator, M=33, N=70):
    x = _random(generator, M, N)
    v = x.double()
    return dict(x=x), [0.5 * v * (1 + torch.tanh(0.7978845608 * (v + 0.044715 * v ** 3)))]


def scale_shift_case(generator, M=29, N=45):
    x, w = _random(generator, M, N), _random(generator, N)
    return dict(x=x, w=w, shift=1.5), [(x.double() * w.double() + 1.5).T]


def two_outputs_case(generator, M=31, N=50):
    x, bias = _random(generator, M, N), _random(generator, N)
    h = x.double() + bias.double()
    return dict(x=x, bias=bias), [h * torch.sigmoid(h), h]


def max_pool_case(generator, B=2, C=3, H=5, W=7):
    x = _random(generator, B, C, 2 * H, 2 * W)
    return dict(x=x.view(B, C, H, 2, W, 2)), [torch.nn.functional.max_pool2d(x.double(), 2)]


def avg_pool_3x3_case(generator, B=2, C=3, H=4, W=5):
    x = _random(generator, B, C, 3 * H, 3 * W, width=50.0)
    return dict(x=x.view(B, C, H, 3, W, 3)), [torch.nn.functional.avg_pool2d(x.double(), 3)]


def maxout_case(generator, M=6, N=37, K=4):
    x = _random(generator, M, N * K, width=30.0)
    return dict(x=x.view(M, N, K)), [x.double().view(M, N, K).amax(-1)]


def complex_magnitude_case(generator, M=5, N=43):
    z = torch.randn(M, N, 2, generator=generator) * 1e3
    return dict(z=z), [torch.view_as_complex(z.double()).abs()]


def rotary_case(generator, B=2, S=5, H=3, D=12):
    x = _random(generator, B, S, H, D)
    cos, sin = torch.rand(S, D, generator=generator), torch.rand(S, D, generator=generator)
    xd, half = x.double(), D // 2
    rotated = torch.cat([-xd[..., half:], xd[..., :half]], -1)
    return dict(x=x, cos=cos, sin=sin), [xd * cos.double()[:, None] +
                                         rotated * sin.double()[:, None]]


CASES = {"avg_pool_backward": (tf.grad(global_avg_pool), avg_pool_case),
         "token_mean_backward": (tf.grad(token_mean), token_mean_case),
         "gelu_tanh": (gelu_tanh, gelu_case),
         "scale_shift_transposed": (scale_shift_transposed, scale_shift_case),
         "two_outputs": (two_outputs, two_outputs_case),
         "max_pool_2x2": (max_pool_2x2, max_pool_case),
         "avg_pool_3x3": (avg_pool_3x3, avg_pool_3x3_case),
         "maxout": (maxout, maxout_case),
         "maxout_of_16": (maxout, lambda generator: maxout_case(generator, M=3, N=21, K=16)),
         "complex_magnitude": (complex_magnitude, complex_magnitude_case),
         "rotary": (rotary, rotary_case),
         # every size an argument from the first call (tf.compile's dynamic=True)
         "token_mean_backward_sizes_as_arguments": (tf.grad(token_mean), token_mean_case)}

if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(
        kernel, dynamic=True if name.endswith("sizes_as_arguments") else None))
