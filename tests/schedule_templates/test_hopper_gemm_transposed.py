"""The Hopper GEMM's rows operand stored ``[K, M]`` (``a[k, i]``: a Gram matrix ``xᵀx``, a weight
gradient ``xᵀ·g``, ``x`` passed as ``x.t()``): the plan, the sm_90a code (TMA atoms of 64 rows,
``wgmma`` with A transposed, no spills), the sizes TMA cannot copy, and on a GPU the products
against float64."""
import re

import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import ScheduleError
from tensorfuse.schedule_templates.hopper_gemm_plan import check_gemm, plan_hopper_gemm, with_knobs
from benchmarks.contraction import transposed_product
from benchmarks.gemm import matmul_nk
from benchmarks.unlisted_kernels import gram_matrix
from tests.helpers import needs_nvcc
from tests.schedule_templates.test_hopper_attention import _ptxas_report
from tests.schedule_templates.test_hopper_gemm import (assert_poisoned_calls_match, gpu_operands,
                                                      hopper)


@tf.kernel
def transposed_rows(x: T.Tensor["K", "M", "bf16"], w: T.Tensor["N", "K", "bf16"]):
    """``xᵀ · wᵀ`` with x kept [K, M] and w as nn.Linear keeps it."""
    i, j, k = T.axes("i j k")
    return T.sum(x[k, i] * w[j, k], over=k)


@tf.kernel
def batched_transposed(x: T.Tensor["Z", "K", "M", "bf16"], w: T.Tensor["K", "N", "bf16"],
                       bias: T.Tensor["N", "bf16"]):
    """A batch of ``xᵀ · w`` with a bias, the weight shared."""
    z, i, j, k = T.axes("z i j k")
    return T.sum(x[z, k, i] * w[k, j], over=k) + bias[j]


def test_the_plan_reads_a_rows_operand_stored_k_by_m():
    gram = plan_hopper_gemm(gram_matrix.program)
    assert not gram.a_k_major and not gram.b_k_major and gram.dims == ("D", "N", "D")
    assert "x[N, D] (M-major) and x [N, D]" in gram.describe()
    rows = plan_hopper_gemm(transposed_rows.program)
    assert not rows.a_k_major and rows.b_k_major and rows.dims == ("M", "K", "N")
    batched = plan_hopper_gemm(batched_transposed.program)
    assert not batched.a_k_major and batched.a_batched and not batched.weights_batched
    assert not plan_hopper_gemm(transposed_product.program).a_k_major   # a weight gradient
    assert plan_hopper_gemm(matmul_nk.program).a_k_major   # the rows stored [M, K], as before


def test_compile_leaves_a_rows_operand_stored_k_by_m_to_the_contraction():
    """Measured slower on the Hopper GEMM than on the Triton contraction (the weight gradient
    87 µs against 52): tf.compile's choice passes it over, the template applied by hand runs
    it."""
    made = tf.compile(transposed_product, target="cuda:sm_90a")
    plan = made.describe_plan(R=16384, M=8, N=4096)
    assert plan.splitlines()[0].endswith("contraction template (GEMM tiles: rows i, columns j, "
                                         "contracted r)")
    assert "not hopper_gemm (out_sum over R): another kernel is preferred" in plan
    assert "hopper GEMM plan" in hopper(transposed_product).describe_plan(R=16384, M=8, N=4096)


def test_m_must_be_a_multiple_of_8_where_the_rows_operand_is_stored_k_by_m():
    """TMA copies rows of a multiple of 16 bytes: the [K, M] operand's rows are M long."""
    plan = plan_hopper_gemm(transposed_rows.program)
    sizes = dict(M=1001, K=520, N=776)
    knobs, _ = with_knobs(plan, dict(sizes, M=1000), {})
    check_gemm(plan, knobs, dict(sizes, M=1000))
    with pytest.raises(ScheduleError, match="M=1001"):
        check_gemm(plan, knobs, sizes)


@needs_nvcc
@pytest.mark.parametrize("kernel, sizes, knobs", [
    (gram_matrix, dict(N=1000, D=136), {}),
    (transposed_rows, dict(M=1000, K=520, N=776), {}),
    (transposed_rows, dict(M=1000, K=520, N=776), {"consumers": 1}),
    (transposed_product, dict(R=4096, M=8, N=4096), {}),
    (batched_transposed, dict(Z=3, M=304, K=136, N=264), {}),
])
def test_code_copies_atoms_of_64_rows_and_transposes_a_in_wgmma(kernel, sizes, knobs):
    f = hopper(kernel, **knobs)
    source = f.source(**sizes)
    assert "a stored [K, M]: atoms of 64 rows" in source
    ptx = f.ptx(**sizes)
    # wgmma's scale-a, scale-b, transpose-a (1: A is M-major), transpose-b
    flags = set(re.findall(r"wgmma\.mma_async[^;]*?p, (\d, \d, \d, \d);", ptx))
    b_k_major = plan_hopper_gemm(kernel.program).b_k_major
    assert flags == {f"1, 1, 1, {0 if b_k_major else 1}"}
    box = "3d" if kernel is batched_transposed else "2d"
    assert f"cp.async.bulk.tensor.{box}" in ptx
    report = _ptxas_report(source)
    assert int(re.search(r"(\d+) bytes spill stores", report).group(1)) == 0, report


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, sizes, knobs", [
    (gram_matrix, dict(N=1000, D=136), {}),
    (gram_matrix, dict(N=65536, D=1024), {}),      # few tiles: the last wave split along K
    (transposed_rows, dict(M=1000, K=520, N=776), {}),
    (transposed_rows, dict(M=1000, K=520, N=776), {"consumers": 1, "cluster": 1}),
    (transposed_product, dict(R=4096, M=8, N=4096), {}),
    (batched_transposed, dict(Z=3, M=304, K=136, N=264), {}),
])
def test_products_with_the_rows_operand_stored_k_by_m_match_float64(kernel, sizes, knobs):
    """Against float64 on the same inputs (values up to ±30 in the rows operand), the output
    poisoned with NaN, called twice (a split tile's counters are reset by the first call)."""
    args = gpu_operands(kernel, sizes, 11, ("x", "a"))
    d = {n: t.double() for n, t in args.items()}
    if kernel is gram_matrix:
        want = d["x"].T @ d["x"]
    elif kernel is transposed_rows:
        want = d["x"].T @ d["w"].T
    elif kernel is transposed_product:
        want = d["a"].T @ d["b"]
    else:
        want = d["x"].transpose(-1, -2) @ d["w"] + d["bias"]
    assert_poisoned_calls_match(hopper(kernel, **knobs), args, want,
                                f"{kernel.name} {sizes} {knobs}")
