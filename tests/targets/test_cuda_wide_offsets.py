"""Element offsets past 2^31 in the CUDA C++ templates' tensor reads (``targets/cuda/expr.py``):
a tensor the score or mask reads element by element — a boolean mask ``[B, 1, S, S]`` at B3
S32k has 1.5 · 2^31 elements — gets 64-bit offsets at such sizes (``wide_tensors``), computed exactly
(the offset compiled as host C++ against Python's), and a source of its own: below them the
kernel's source is the one it always was."""
from __future__ import annotations

import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels.layers import attention_kernel
from tensorfuse.targets.cuda.expr import INT32_ELEMENTS, to_cuda, wide_tensors
from tests.helpers import host_compiler, run_host_program


@tf.kernel
def _read(mask: T.Tensor["B", 1, "M", "N", "bool"]):
    b, i, j = T.axes("b i j")
    return T.where(mask[b, 0, i, j], 1.0, 0.0)


def _mask_load():
    return next(c for c in _read.program.computes if c.is_output).bodies[0].cond


def test_only_tensors_past_32_bit_offsets_are_wide():
    params = [(p.name, p.dims) for p in _read.program.tensor_params]
    assert wide_tensors(params, dict(B=3, M=32768, N=32768)) == {"mask"}
    # 2^31 elements: the last offset, 2^31 − 1, is an int's
    assert wide_tensors(params, dict(B=2, M=32768, N=32768)) == frozenset()
    assert 3 * 32768 * 32768 > INT32_ELEMENTS == 2 * 32768 * 32768


def test_a_wide_offset_is_exact_where_a_32_bit_one_is_not(tmp_path):
    """The offset of mask[2, 0, 32767, 32767] in [3, 1, 32768, 32768] as the templates write it,
    compiled as host code: 64-bit where the tensor is wide, the exact element."""
    load = _mask_load()
    sizes = {"B": 3, "M": 32768, "N": 32768}
    axes = {"b": "b", "i": "i", "j": "j"}
    wide = to_cuda(load, {}, "the mask", axes=axes, sizes=sizes, loads={"mask": "at"},
                   wide=frozenset({"mask"}))
    narrow = to_cuda(load, {}, "the mask", axes=axes, sizes=sizes, loads={"mask": "at"})
    assert "(long long)" in wide and "(long long)" not in narrow
    source = ("#include <cstdio>\nstruct Offset { long long operator[](long long o) const "
              "{ return o; } };\nint main() {\n  Offset at;\n  volatile int b = 2, i = 32767, "
              f"j = 32767;\n  printf(\"%lld\\n\", (long long){wide});\n}}\n")
    got = run_host_program(source, tmp_path, host_compiler())
    assert int(got[0]) == ((2 * 1 + 0) * 32768 + 32767) * 32768 + 32767 > INT32_ELEMENTS


def test_the_hopper_mask_reads_past_2_31_elements_at_64_bit_offsets():
    made = tf.compile(attention_kernel("bf16", False, True, False), "cuda:sm_90a")

    def source(B, S):
        return made.source(B=B, H=8, HKV=8, M=S, N=S, D=128, scale=0.1)

    def mask_line(text):
        return next(line for line in text.splitlines() if "t_mask[" in line and "v =" in line)
    assert "(long long)" in mask_line(source(3, 32768))
    assert "(long long)" not in mask_line(source(2, 32768))
    assert source(2, 4096) == source(2, 32768)   # below: the one source of every length


@pytest.mark.gpu
def test_a_boolean_mask_past_2_31_elements_on_the_gpu():
    """B3 S32k through the integration's masked kernel: a few query rows' outputs against
    float64 (with 32-bit offsets the third sequence's mask was read from outside the tensor)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from tests.helpers import fresh_seed

    seed = fresh_seed()
    g = torch.Generator(device="cuda").manual_seed(seed)
    B, H, S, D = 3, 1, 32768, 64
    q, k, v = (torch.randn(B, H, S, D, device="cuda", generator=g).bfloat16() for _ in range(3))
    keep = torch.rand(B, 1, S, S, device="cuda", generator=g) > 0.5
    out = torch.full_like(q, float("nan"))
    attention_kernel("bf16", False, True, False)(q, k, v, keep, scale=D ** -0.5, out=out)
    rows = torch.tensor([0, 1, S // 2, S - 1], device="cuda")
    s = q[:, :, rows].double() @ k.double().transpose(-1, -2) * D ** -0.5
    s = s.masked_fill(~keep[:, :, rows], float("-inf"))
    want = torch.softmax(s, -1) @ v.double()
    error = (out[:, :, rows].double() - want).abs().max() / want.abs().max()
    assert error < 2e-2, seed


@tf.kernel
def _linear_plus_residual(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["N", "K", "bf16"],
                          r: T.Tensor["M", "N", "bf16"]):
    i, j, k = T.axes("i j k")
    return T.cast(T.sum(x[i, k] * w[j, k], over=k) + r[i, j], "bf16")


def test_a_hopper_gemm_epilogue_reads_a_vocabularys_residual_at_64_bit_offsets():
    """Logits over a 151936-word vocabulary plus a residual ``[M, N]``: 2.5 · 10^9 elements at
    M=16384 (64-bit offsets), 6.2 · 10^8 at M=4096 (the GEMM's one source)."""
    made = tf.compile(_linear_plus_residual, "cuda:sm_90a")

    def read(M):
        source = made.source(M=M, K=4096, N=151936)
        assert made.describe_plan(M=M, K=4096, N=151936).splitlines()[0].split(": ")[1] \
            .startswith("hopper_gemm")
        return next(line for line in source.splitlines() if "t_r[" in line)
    assert "(long long)" in read(16384) and "(long long)" not in read(4096)
