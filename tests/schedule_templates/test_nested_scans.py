"""Reductions over ranges of several axes written as nested reductions, a scan an axis
(``schedule_templates/nested_scans.py``): the stages the rewrite makes and what it leaves
alone, the numbers on the CPU target and, for sm_90a, in Triton's interpreter
(:mod:`tests.schedule_templates.nested_scans_check`) against float64, and on a GPU."""
import warnings

import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.dsl.program import ProgramKernel
from tensorfuse.errors import NoTemplateWarning
from tensorfuse.schedule_templates.nested_scans import nested_scans
from tests.helpers import fresh_seed, gpu_error, poisoned_call, relative_error, run_interpreted
from tests.schedule_templates.nested_scans_check import (CASES, cumulative_row_sums,
                                                         integral_image, prefix_sum_3d)

BF16, F32 = 2e-2, 1e-5


def _names(axes) -> list[str]:
    return [a.name for a in axes]


def test_an_integral_image_is_a_scan_along_the_rows_then_one_down_them():
    """The innermost stage reduces the axis compared with the result's innermost axis (a scan
    along the rows of the intermediate ``[B, H, W]``), the next the other one over it; both
    stages are the scan template's on sm_90a."""
    program, note = nested_scans(integral_image.program)
    inner, outer = program.computes
    assert (_names(inner.axes), _names(inner.over)) == (["b", "j", "k"], ["l"])
    assert (_names(outer.axes), _names(outer.over)) == (["b", "i", "k"], ["j"])
    assert outer.name == "out" and outer.is_output and inner.dtypes == ("f32",)
    assert "out over j, l written as one reduction an axis" in note
    with warnings.catch_warnings(record=True) as caught:   # stages by design: no floor warning
        warnings.simplefilter("always")
        made = tf.compile(integral_image, target="cuda:sm_90a")
    assert not [w for w in caught if issubclass(w.category, NoTemplateWarning)], \
        [str(w.message) for w in caught]
    origin = made.schedule_origin(B=2, H=64, W=4096)
    assert origin.startswith("out over j, l written") and origin.count("scan template") == 2


def test_axes_compared_with_nothing_are_reduced_first_and_three_axes_nest_twice():
    program, _ = nested_scans(cumulative_row_sums.program)
    rows, scan = program.computes
    assert _names(rows.over) == ["l"] and _names(rows.axes) == ["b", "j"]
    assert _names(scan.over) == ["j"]
    program, _ = nested_scans(prefix_sum_3d.program)
    assert [_names(c.over) for c in program.computes] == [["l"], ["j"], ["a"]]
    assert _names(program.computes[0].axes) == ["a", "j", "k"]
    assert _names(program.computes[1].axes) == ["a", "i", "k"]


def _kernel(condition, value=None):
    def body(x: T.Tensor["H", "W", "f32"], n: T.Tensor["H", "i32"]):
        j, l = T.axes("j l")
        i, k = T.axis("i", "H"), T.axis("k", "W")
        term = x[j, l] if value is None else value(x, i, j, l)
        return T.sum(T.where(condition(i, j, k, l, n), term, 0.0), over=(j, l))
    return tf.kernel(body)


@pytest.mark.parametrize("kernel", [
    # a condition reading both reduced axes: no product of ranges
    _kernel(lambda i, j, k, l, n: (j <= i) & (l <= k) & (l <= j)),
    # a condition on l comparing it with no result axis
    _kernel(lambda i, j, k, l, n: (j <= i) & (l < n[j])),
    # terms weighted by the distance to the output's position
    _kernel(lambda i, j, k, l, n: (j <= i) & (l <= k), lambda x, i, j, l: (i - j) * x[j, l]),
    # nothing compared with a result axis: a plain reduction over two axes
    _kernel(lambda i, j, k, l, n: (j >= 0) & (l >= 0))])
def test_what_is_no_product_of_ranges_is_left_as_written(kernel):
    assert nested_scans(kernel.program) is None


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rewritten_program_matches_float64_on_the_cpu(name):
    """The nested program (the GPU's: the CPU target runs the user's as written) through the
    CPU target."""
    kernel, case = CASES[name]
    args, want = case(torch.Generator().manual_seed(fresh_seed()))
    nested = ProgramKernel(nested_scans(kernel.program)[0])
    (out,) = poisoned_call(tf.compile(nested, target="cpu"), kernel.program, args, want)
    tolerance = BF16 if out.dtype == torch.bfloat16 else F32
    assert relative_error(out, want) < tolerance, name


def test_the_triton_kernels_match_float64_in_the_interpreter():
    pytest.importorskip("triton", reason="the stages are Triton kernels")
    errors = run_interpreted("tests.schedule_templates.nested_scans_check", fresh_seed())
    for name, error in errors.items():
        assert error < (BF16 if name.endswith("bf16") else F32), name


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_matches_float64_on_the_gpu(name):
    error, dtype, seed = gpu_error(*CASES[name])
    assert error < (BF16 if dtype == torch.bfloat16 else F32), f"{name} (TENSORFUSE_SEED={seed})"
