"""Axes whose sizes a kernel derives from the tensors' sizes (``T.axis("o", (T.size("L") - 3)
// 2 + 1)``: pooling with a stride, a convolution without padding): computed at each call, checked
against a tensor dimension of the same name, refused with the reason where they cannot be
sizes; the results against float64 on the CPU target, in Triton's interpreter
(:mod:`tests.schedule_templates.derived_sizes_check`) and on the GPU."""
import re

import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.binding import bind_call
from tensorfuse.errors import AxisError, CallError
from tests.helpers import (check_interpreted, fresh_seed, gpu_error, poisoned_call,
                           relative_error)
from tests.schedule_templates.derived_sizes_check import CASES, max_pool_stride_2


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_matches_float64_on_the_cpu(name):
    kernel, case = CASES[name]
    args, want = case(torch.Generator().manual_seed(fresh_seed()))
    (out,) = poisoned_call(tf.compile(kernel, target="llvm"), kernel.program, args, want)
    assert out.shape == want.shape
    assert relative_error(out, want) < 2e-2 if out.dtype == torch.bfloat16 else \
        relative_error(out, want) < 1e-6


def test_the_triton_kernels_match_float64_in_the_interpreter():
    check_interpreted("tests.schedule_templates.derived_sizes_check", CASES, tolerance=1e-6)


def test_a_size_derived_from_its_own_name_is_named_apart():
    """``T.axis("h", T.size("H") * 2)``: the axis' size is ``H_``, not ``H`` (which it reads)."""
    from tests.schedule_templates.derived_sizes_check import upsample_nearest_2x

    program = upsample_nearest_2x.program
    assert program.dim_names() == ["B", "C", "H", "W", "H_", "W_"]
    x = torch.randn(1, 2, 5, 7).bfloat16()
    assert bind_call(program, (x,), {}, "cpu").dims == dict(B=1, C=2, H=5, W=7, H_=10, W_=14)


def test_a_derived_size_is_computed_at_each_call_and_named_after_its_axis():
    program = max_pool_stride_2.program
    assert program.dim_names() == ["B", "C", "L", "O"]
    for L, O in ((3, 1), (4, 1), (5, 2), (1000, 499)):
        x = torch.randn(1, 2, L).bfloat16()
        assert bind_call(program, (x,), {}, "cpu").dims == dict(B=1, C=2, L=L, O=O)
    made = tf.compile(max_pool_stride_2, target="cuda:sm_90a")
    assert ".visible .entry" in made.ptx(B=4, C=8, L=1001)   # O computed from L, not given
    assert "O=500" in made.describe_plan(B=4, C=8, L=1001)


def test_sizes_it_cannot_be_are_refused_with_the_reason():
    with pytest.raises(CallError, match=r"size O = \(T.size\('L'\) - 3\) // 2 \+ 1 = 0 at L=2: "
                                        r"it must be positive"):
        tf.compile(max_pool_stride_2, target="llvm")(torch.randn(1, 1, 2).bfloat16())
    with pytest.raises(CallError, match="size O is 7 here, but the kernel derives it as"):
        tf.compile(max_pool_stride_2, target="cuda:sm_90a").source(B=1, C=1, L=21, O=7)

    @tf.kernel
    def pooled_into(x: T.Tensor["L", "f32"], into: T.Tensor["O", "f32"]):
        """A tensor dimension of the derived size's name must have that size."""
        o = T.axis("o", T.size("L") // 2)
        k = T.axis("k", 2)
        return T.max(x[o * 2 + k], over=k) + into[o]
    run = tf.compile(pooled_into, target="llvm")
    assert run(torch.arange(8.0), torch.zeros(4)).tolist() == [1.0, 3.0, 5.0, 7.0]
    with pytest.raises(CallError, match="size O is 3 here, but the kernel derives it as"):
        run(torch.arange(8.0), torch.zeros(3))


@pytest.mark.parametrize("extent, message", [
    (lambda: T.size("Q") + 1, "size O reads T.size('Q'), which no tensor parameter has"),
    (lambda: T.size("L") * 0.5, "must be an integer expression of T.size"),
    (lambda: T.size("L") // 2 + T.size("L") // 2 * T.where(T.size("L") > 4, 1, 0),
     "must be an integer expression of T.size"),
])
def test_expressions_that_are_not_sizes_are_refused_where_the_kernel_is_defined(extent,
                                                                                 message):
    with pytest.raises((AxisError, tf.errors.DSLError), match=re.escape(message)):
        @tf.kernel
        def pooled(x: T.Tensor["L", "f32"]):
            o = T.axis("o", extent())
            k = T.axis("k", 2)
            return T.max(x[o * 2 + k], over=k)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_matches_float64_on_the_gpu(name):
    error, _, seed = gpu_error(*CASES[name])
    assert error < 2e-2, f"{name} (TENSORFUSE_SEED={seed})"


def test_a_program_rewritten_whole_keeps_its_derived_sizes():
    """The rewrites that lift or merge a program's axes (merged heads, packed rows, shared
    queries) rebuild it through one helper: the sizes it derives go with it."""
    from tensorfuse.algebra.exprs import rewrite_computes, rewritten_program

    program = max_pool_stride_2.program
    rebuilt = rewritten_program(program, program.params, rewrite_computes(program, lambda n: None))
    assert rebuilt.dim_names() == ["B", "C", "L", "O"]
    assert {n: str(e.key()) for n, e in rebuilt.derived_sizes().items()} == \
        {n: str(e.key()) for n, e in program.derived_sizes().items()}
