"""GEMMs with computed sides or outer factors on sm_90a: the computed sides stored by a kernel
of their own, then the Hopper GEMM with the outer factors in its epilogue
(:mod:`tensorfuse.schedule_templates.gemm_stages`). The stages' programs run on the CPU target
against float64 (the rewrite's math and rounding); ``tf.compile``'s choice; the H200 run is
marked ``gpu``."""
import types

import pytest
import torch

import tensorfuse as tf
from tensorfuse.dsl.program import ProgramKernel
import tensorfuse.kernels as K
from benchmarks.contraction import best_match, bilinear_form
from benchmarks.unlisted_kernels import rmsnorm_linear
from tensorfuse import dsl as T
from tensorfuse.interop import torch_dtype
from tensorfuse.schedule_templates.auto import takes_stage
from tensorfuse.schedule_templates.gemm_stages import (COLUMNS_STORED_FROM, hopper_gemm_stages,
                                                       hopper_gemm_then_columns)
from tensorfuse.schedule_templates.hopper_gemm_plan import plan_hopper_gemm
from tensorfuse.schedule_templates.stages import plan_stages
from tensorfuse.targets import get_target
from tests.schedule_templates.pairwise_check import squared_distances

HOPPER = get_target("cuda:sm_90a")


@tf.kernel
def scaled_gated(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["N", "K", "bf16"],
                 s: T.Tensor["M", "f32"], c: T.Tensor["N", "bf16"]):
    """Outer factors only (a row scale, a column scale, a constant): no side to store."""
    i, j, k = T.axes("i j k")
    return T.sum(x[i, k] * w[j, k] * s[i] * c[j] * 0.5, over=k) + 1.0


@tf.kernel
def scalar_scaled(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["N", "K", "bf16"], t: T.f32):
    """A scalar argument as an outer factor: the Hopper GEMM's epilogue reads it."""
    i, j, k = T.axes("i j k")
    return T.sum(x[i, k] * w[j, k] * t, over=k)


@tf.kernel
def silu_rows(x: T.Tensor["M", "K", "bf16"], w: T.Tensor["K", "N", "bf16"]):
    """A computed rows side (an activation of the operand), weights stored [K, N]."""
    i, j, k = T.axes("i j k")
    return T.sum(T.sigmoid(x[i, k]) * x[i, k] * w[k, j], over=k)


def _gemm_stage_program():
    """rmsnorm_linear's second stage (its norm's sum first): what the floor hands on."""
    return plan_stages(rmsnorm_linear.program, lambda p: takes_stage(p, HOPPER))[1].program


def test_a_computed_side_is_stored_then_the_hopper_gemm_scales_its_accumulators():
    (sides, gemm), at = hopper_gemm_stages(_gemm_stage_program())[:2]
    assert at == 1
    assert sides.produces == ("staged_out_sum_rows",) and sides.inputs == ("x", "g")
    plan = plan_hopper_gemm(gemm.program)
    assert (plan.a, plan.weights, plan.b_k_major) == ("staged_out_sum_rows", ("w",), True)
    # the outer factor (the norm's rsqrt, stored a float a row by the floor's first stage), in
    # the epilogue
    assert "epilogue: r[i] * out_sum_product" in plan.describe()
    assert gemm.produces == ("out",)
    only_outer = hopper_gemm_stages(scaled_gated.program).stages
    assert len(only_outer) == 1 and plan_hopper_gemm(only_outer[0].program).tensors == \
        (("c", "bf16"), ("s", "f32"))
    # the Hopper GEMM takes a sum of two loads itself; a pairwise sum is no GEMM for it
    for kernel in (K.matmul, squared_distances):
        assert hopper_gemm_stages(kernel.program) is None


def test_stores_pay_where_several_tiles_read_them():
    pays = hopper_gemm_stages(_gemm_stage_program()).pays
    assert pays(dict(M=8192, K=4096, N=4096))
    assert not pays(dict(M=8192, K=4096, N=256))   # one column tile reads it
    assert hopper_gemm_stages(scaled_gated.program).pays(dict(M=64, K=64, N=64))   # none stored


@pytest.mark.parametrize("kernel", ["rmsnorm_linear", "scaled_gated", "silu_rows"])
def test_the_stages_compute_the_program_on_the_cpu(kernel):
    """Each stage's program on the CPU target, in turn, against float64 of the math as written:
    the rewrite keeps the sums, factors and outputs (the stored side rounded to bf16, as the
    tensor cores would take it)."""
    generator = torch.Generator().manual_seed(3)
    M, K, N = 70, 96, 48
    x = (torch.randn(M, K, generator=generator) * 3).bfloat16()
    if kernel == "rmsnorm_linear":
        program = _gemm_stage_program()
        g = (torch.rand(K, generator=generator) + 0.5).bfloat16()
        w = (torch.randn(N, K, generator=generator) / 8).bfloat16()
        r = (x.double() ** 2).mean(-1)
        values = dict(x=x, g=g, w=w, r=torch.rsqrt(r + 1e-6).float())
        want = (x.double() * torch.rsqrt(r + 1e-6)[:, None] * g.double()) @ w.double().T
    elif kernel == "scaled_gated":
        program = scaled_gated.program
        w = (torch.randn(N, K, generator=generator) / 8).bfloat16()
        s, c = torch.rand(M, generator=generator), (torch.rand(N, generator=generator)).bfloat16()
        values = dict(x=x, w=w, s=s, c=c)
        want = (x.double() @ w.double().T) * s.double()[:, None] * c.double() * 0.5 + 1.0
    else:
        program = silu_rows.program
        w = (torch.randn(K, N, generator=generator) / 8).bfloat16()
        values = dict(x=x, w=w)
        want = (torch.sigmoid(x.double()) * x.double()) @ w.double()
    for stage in hopper_gemm_stages(program).stages:
        part = ProgramKernel(stage.program)
        made = tf.compile(part, target="llvm")(**{n: values[n] for n in stage.inputs})
        made = made if isinstance(made, tuple) else (made,)
        values.update(zip(stage.produces, made))
    error = float((values["out"].double() - want).abs().max() / want.abs().max())
    assert error < 2e-2, error   # bf16 output and a bf16 stored side: 2⁻⁹ each


def test_tf_compile_runs_them_on_sm90a_where_storing_pays():
    made = tf.compile(rmsnorm_linear, target="cuda:sm_90a")
    origin = made.schedule_origin(M=8192, K=4096, N=4096)
    assert "staged_out_sum_rows from x, g: elementwise template" in origin
    assert "hopper_gemm template defaults" in origin
    stage = types.SimpleNamespace(program=_gemm_stage_program(), fn=None, name="stage")
    narrow = tf.compile(stage, target="cuda:sm_90a").schedule_origin(M=8192, K=4096, N=256)
    assert "hopper_gemm" not in narrow and "contraction template" in narrow   # one column tile
    assert "hopper_gemm" in tf.compile(scaled_gated, target="cuda:sm_90a").schedule_origin(
        M=4096, K=4096, N=4096)
    assert "hopper_gemm" in tf.compile(scalar_scaled, target="cuda:sm_90a").schedule_origin(
        M=4096, K=4096, N=4096)
    # other GPUs keep the contraction template's own staged sides
    assert "hopper_gemm" not in tf.compile(rmsnorm_linear, target="cuda:sm_80").schedule_origin(
        M=8192, K=4096, N=4096)


@pytest.mark.parametrize("kernel", [bilinear_form, best_match])
def test_a_gemm_whose_columns_are_reduced_is_stored_first_where_it_is_deep(kernel):
    """A bilinear form (``Σ_j (x·W)[b, j] · y[b, j]``) or a GEMM's row maxima: the GEMM a stage
    of its own that the Hopper GEMM takes (its f32 values stored), then the reductions over its
    columns; computed on the CPU target in turn against float64. Stored from a contracted
    extent of COLUMNS_STORED_FROM (below it the contraction template's one pass is cheaper)."""
    (gemm, rows), at, pays, _ = hopper_gemm_then_columns(kernel.program, HOPPER)
    assert at == 0
    plan = plan_hopper_gemm(gemm.program)
    assert plan.out_dtype == "f32" and gemm.produces == rows.inputs[-1:]
    assert rows.produces == tuple(c.name for c in kernel.program.outputs)
    generator = torch.Generator().manual_seed(4)
    B, I_, J = 37, 80, 51
    x = (torch.randn(B, I_, generator=generator) * 3).bfloat16()
    if kernel is bilinear_form:
        W, y = (torch.randn(I_, J, generator=generator) / 8).bfloat16(), \
            torch.randn(B, J, generator=generator).bfloat16()
        values, sizes = dict(x=x, W=W, y=y), dict(B=B, I=I_, J=J)
        want = ((x.double() @ W.double()) * y.double()).sum(-1)
    else:
        y = torch.randn(J, I_, generator=generator).bfloat16()
        values, sizes = dict(x=x, y=y), dict(M=B, D=I_, N=J)
        want = (x.double() @ y.double().T).max(-1).values
    for stage in (gemm, rows):
        part = ProgramKernel(stage.program)
        made = tf.compile(part, target="llvm")(**{n: values[n] for n in stage.inputs})
        values.update(zip(stage.produces, made if isinstance(made, tuple) else (made,)))
    out = values[kernel.program.outputs[0].name]
    error = float((out.double() - want).abs().max() / want.abs().max())
    assert error < 1e-2, error   # the bf16 output: 2⁻⁹
    contracted = "I" if kernel is bilinear_form else "D"
    assert pays({**sizes, contracted: COLUMNS_STORED_FROM})
    assert not pays({**sizes, contracted: COLUMNS_STORED_FROM // 2})
    made = tf.compile(kernel, target="cuda:sm_90a")
    large = dict.fromkeys(sizes, 4096)
    assert "hopper_gemm" in made.schedule_origin(**large)
    assert "hopper_gemm" not in made.schedule_origin(**{**large, contracted: 1024})
    for other in (K.matmul, scaled_gated):   # no reduction over the columns
        assert hopper_gemm_then_columns(other.program, HOPPER) is None


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [bilinear_form, best_match])
def test_a_gemm_whose_columns_are_reduced_matches_float64_on_the_gpu(kernel):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    generator = torch.Generator(device="cuda").manual_seed(6)
    B, I_, J = 1000, 2056, 776   # ragged tiles, deep enough to be stored
    x = (torch.randn(B, I_, device="cuda", generator=generator) * 3).bfloat16()
    made = tf.compile(kernel)
    if kernel is bilinear_form:
        W = (torch.randn(I_, J, device="cuda", generator=generator) / 8).bfloat16()
        y = torch.randn(B, J, device="cuda", generator=generator).bfloat16()
        args, sizes = dict(x=x, W=W, y=y), dict(B=B, I=I_, J=J)
        want = ((x.double() @ W.double()) * y.double()).sum(-1)
    else:
        y = torch.randn(J, I_, device="cuda", generator=generator).bfloat16()
        args, sizes = dict(x=x, y=y), dict(M=B, D=I_, N=J)
        want = (x.double() @ y.double().T).max(-1).values
    assert "hopper_gemm" in made.schedule_origin(**sizes)
    out = torch.full((B,), float("nan"), device="cuda",
                     dtype=torch_dtype(made.program.outputs[0].dtypes[0]))
    assert made(**args, out=out) is out
    error = float((out.double() - want).abs().max() / want.abs().max())
    assert error < 1e-2, error


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["rmsnorm_linear", "scaled_gated", "silu_rows"])
def test_the_stages_match_float64_on_the_gpu(kernel):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    generator = torch.Generator(device="cuda").manual_seed(5)
    M, K, N = 1000, 1032, 776   # ragged tiles
    x = (torch.randn(M, K, device="cuda", generator=generator) * 3).bfloat16()
    if kernel == "rmsnorm_linear":
        g = (torch.rand(K, device="cuda", generator=generator) + 0.5).bfloat16()
        w = (torch.randn(N, K, device="cuda", generator=generator) / 8).bfloat16()
        args, made = dict(x=x, g=g, w=w), tf.compile(rmsnorm_linear)
        r = (x.double() ** 2).mean(-1, keepdim=True)
        want = (x.double() * torch.rsqrt(r + 1e-6) * g.double()) @ w.double().T
    elif kernel == "scaled_gated":
        w = (torch.randn(N, K, device="cuda", generator=generator) / 8).bfloat16()
        s = torch.rand(M, device="cuda", generator=generator)
        c = torch.rand(N, device="cuda", generator=generator).bfloat16()
        args, made = dict(x=x, w=w, s=s, c=c), tf.compile(scaled_gated)
        want = (x.double() @ w.double().T) * s.double()[:, None] * c.double() * 0.5 + 1.0
    else:
        w = (torch.randn(K, N, device="cuda", generator=generator) / 8).bfloat16()
        args, made = dict(x=x, w=w), tf.compile(silu_rows)
        want = (torch.sigmoid(x.double()) * x.double()) @ w.double()
    assert "hopper_gemm" in made.schedule_origin(M=M, K=K, N=N)
    dtype = torch_dtype(made.program.outputs[0].dtypes[0])   # f32 where an f32 scale reads in
    out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
    assert made(**args, out=out) is out
    error = float((out.double() - want).abs().max() / want.abs().max())
    assert error < 2e-2, error
