"""Casts in the CUDA C++ the templates write from the DSL: a cast to bf16 or f16 rounds to that
type (to nearest even, as a store and as torch do) and the math goes on in f32 — a C++ cast to
int there would truncate a GEMM output written ``T.cast(..., "bf16")`` to whole numbers; the
output's own cast is left to the store. The emitted expressions are compiled as host code by nvcc (cuda_bf16.h's conversions
run on the host too) and compared with torch's rounding of the same floats."""
from __future__ import annotations

import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.dsl.expr import Cast, Scalar
from tensorfuse.errors import ScheduleError
from tensorfuse.targets.cuda.cluster_decode import _in_dtype
from tensorfuse.targets.cuda.expr import scalar_name, to_cuda
from tests.helpers import needs_nvcc, run_host_program

# ties at bf16's and f16's last bit, values past f16's range, below its normals, negative
VALUES = (1.0, 1.00390625, 1.01171875, -3.14159265, 65504.0, 65520.0, 1e5, 3e38, 1e-6, 6e-8,
          -2.5e-3, 0.1, 333.3, 1 + 2 ** -11, 1 + 3 * 2 ** -11)


@tf.kernel
def linear_cast(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["N", "K", "bf16"],
                s: T.Tensor["M", "f32"]):
    i, j, k = T.axes("i j k")
    return T.cast(T.sum(x[i, k] * w[j, k], over=k) * s[i], "bf16")


@tf.kernel
def batched_divided(p: T.Tensor["B", "H", "N", "bf16"], v: T.Tensor["B", "N", "E", "bf16"],
                    l: T.Tensor["B", "H", "f32"]):
    """An attention's p·v over one shared cache per batch, divided by each row's sum (the latent
    decode's second GEMM, as the floor runs it)."""
    b, h, j, e = T.axes("b h j e")
    return T.cast(T.sum(p[b, h, j] * v[b, j, e], over=j) / l[b, h], "bf16")


def test_casts_emit_a_rounding_to_the_type_not_an_integer_conversion():
    x = Scalar("x", "f32")
    assert to_cuda(Cast(x, "bf16"), {}, "t") == \
        f"__bfloat162float(__float2bfloat16_rn({scalar_name('x')}))"
    assert "__float2half_rn" in to_cuda(Cast(x, "f16"), {}, "t")
    assert to_cuda(Cast(x, "f32"), {}, "t").startswith("((float)")
    assert to_cuda(Cast(x, "i32"), {}, "t").startswith("((int)")
    assert to_cuda(Cast(x, "bool"), {}, "t") == f"((int)({scalar_name('x')} != 0))"   # 0.5: true


@tf.kernel
def inner_cast(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["N", "K", "bf16"],
               s: T.Tensor["M", "f32"]):
    """The product rounded to bf16 before it is scaled (a cast inside the epilogue)."""
    i, j, k = T.axes("i j k")
    return T.cast(T.cast(T.sum(x[i, k] * w[j, k], over=k), "bf16") * s[i], "bf16")


def _epilogue_value(kernel) -> str:
    source = tf.compile(kernel, target="cuda:sm_90a").source(M=512, N=512, K=256)
    return next(line for line in source.splitlines() if line.strip().startswith("return") and
                "g0" in line)


def test_a_gemm_epilogue_rounds_a_cast_inside_and_leaves_the_outputs_to_the_store():
    """The output's own cast is the store's rounding (doing it twice made ptxas spill a GELU
    epilogue); a cast inside the expression rounds there. Neither is an integer conversion."""
    outer, inner = _epilogue_value(linear_cast), _epilogue_value(inner_cast)
    assert "(int)" not in outer and "bfloat16" not in outer, outer
    assert "__bfloat162float(__float2bfloat16_rn(g0))" in inner and "(int)" not in inner, inner


def test_a_bf16_cast_in_a_decode_of_f16_tensors_is_refused_not_renamed():
    """The cluster decode is written for bf16 and renames bf16 names for f16: a cast's
    conversion must not silently become f16's."""
    with pytest.raises(ScheduleError, match="cast to bf16"):
        _in_dtype("float s = __bfloat162float(__float2bfloat16_rn(qk));", "f16")
    assert "__float2half" in _in_dtype("__float2bfloat16(x)", "f16")


@needs_nvcc
def test_16_bit_casts_round_as_torch_does(tmp_path):
    x = Scalar("x", "f32")
    casts = {dtype: to_cuda(Cast(x * 1.0, dtype), {}, "t") for dtype in ("bf16", "f16")}
    values = ", ".join(f"{v!r}f" for v in VALUES)
    printed = run_host_program(
        "#include <cstdio>\n#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n"
        f"int main() {{ const float V[] = {{{values}}};\n"
        f"  for (float {scalar_name('x')} : V) printf(\"%.9g %.9g\\n\", "
        f"{casts['bf16']}, {casts['f16']});\n  return 0; }}\n", tmp_path, "nvcc")
    got = torch.tensor([[float(t) for t in line.split()] for line in printed])
    v = torch.tensor(VALUES, dtype=torch.float32)
    want = torch.stack([v.to(torch.bfloat16).float(), v.to(torch.float16).float()], 1)
    assert torch.equal(got, want), (got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, sizes", [(linear_cast, dict(M=1000, N=776, K=520)),
                                           (inner_cast, dict(M=1000, N=776, K=520)),
                                           (batched_divided, dict(B=3, H=128, N=1000, E=512))])
def test_gemm_outputs_cast_to_bf16_match_float64_on_the_gpu(kernel, sizes):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    gen = torch.Generator(device="cuda").manual_seed(11)
    args = {p.name: (torch.randn([sizes[str(d)] for d in p.dims], device="cuda", generator=gen)
                     * 3).to(torch.bfloat16 if p.dtype == "bf16" else torch.float32)
            for p in kernel.program.tensor_params}
    d = {n: t.double() for n, t in args.items()}
    if kernel is linear_cast:
        want = d["x"] @ d["w"].T * d["s"][:, None]
    elif kernel is inner_cast:
        want = (d["x"] @ d["w"].T).to(torch.bfloat16).double() * d["s"][:, None]
    else:
        args["l"] = args["l"].abs() + 1
        want = d["p"] @ d["v"] / (d["l"].abs() + 1)[..., None]
    out = torch.full(want.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    made = tf.compile(kernel)
    assert made(**args, out=out) is out
    error = float((out.double() - want).abs().max() / want.abs().max())
    assert error < 1e-2, (made.schedule_origin(**sizes), error)
