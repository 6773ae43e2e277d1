"""The CPU template: row programs get the vectorised row schedule, f32 exp is generated as a
polynomial LLVM vectorises (and is as exact as exp), the llvm target compiles for this CPU."""
import numpy as np
import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.kernels.reference import TOLERANCE, random_inputs, reference, relative_error
from tensorfuse.schedule_templates import lower_program, tvm_schedule
from tensorfuse.schedule_templates.cpu import row_schedule


def scheduled(kernel, **dims):
    sch = tvm_schedule(lower_program(kernel.program, (), dims, accumulate="f64",
                                     vector_math=True))
    return row_schedule(sch), sch.mod.script()


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm", "rmsnorm",
                                  "cross_entropy"])
def test_row_programs_get_the_row_schedule(name):
    applied, script = scheduled(K.ALL[name], M=64, N=256, V=256)
    assert applied
    assert "T.parallel" in script and "T.vectorized(16)" in script
    assert script.count("T.parallel") == 1       # one parallel loop over the rows


def test_attention_rows_read_a_transposed_copy_of_the_keys():
    """q·k over d per query row: the keys copied once per head with the key axis last, so the
    loop over keys reads consecutive elements; rows in parallel within a head."""
    applied, script = scheduled(K.causal_attention, B=1, H=2, M=32, N=32, D=16)
    assert applied
    assert 'T.sblock("k_global")' in script and "k_global = T.sblock_alloc_buffer((1, 2, 16, 32)" \
        in script
    assert script.count("T.parallel") == 1


def test_programs_whose_blocks_do_not_share_their_rows_keep_the_default_schedule():
    """An FFN: the intermediate's rows run over N, the output's over O."""
    applied, _ = scheduled(K.ffn_swiglu, M=8, K=16, N=32, O=16)
    assert not applied


@tf.kernel
def running_row_sums(x: T.Tensor["B", "N", "C", "f32"]):
    b, j, l = T.axes("b j l")
    i = T.axis("i", "N")
    rows = T.sum(x[b, j, l], over=l)
    return T.sum(T.where(j <= i, rows, 0.0), over=j)


def test_a_producer_read_off_its_row_is_not_a_row_program(rng):
    """Row sums ``rows[b, j]`` summed over ``j <= i``: both blocks loop over rows of one size,
    (b, j) and (b, i), but the second reads the first along its reduction, not at its row.
    Placed at the consumer's row it was recomputed whole at every i (N² work, an N-lane vector:
    32 s of LLVM at N = 500); it keeps the default schedule and stays correct."""
    applied, script = scheduled(running_row_sums, B=3, N=500, C=8)
    assert not applied and "T.vectorized(500)" not in script
    x = rng.standard_normal((3, 500, 8)).astype(np.float32)
    out = tf.compile(running_row_sums, target="llvm")(x)
    expected = x.astype(np.float64).sum(2).cumsum(1)
    assert np.abs(np.asarray(out) - expected).max() <= 1e-4 * np.abs(expected).max()


def test_ragged_rows_are_scheduled_without_vectors_and_stay_correct(rng):
    applied, script = scheduled(K.softmax, M=5, N=333)
    assert applied and "T.vectorized" not in script
    tensors, scalars = random_inputs(K.softmax, dict(M=5, N=333), rng)
    out = tf.compile(K.softmax, target="llvm")(**tensors, **scalars)
    assert relative_error(out, reference(K.softmax, tensors, scalars)) <= TOLERANCE["bf16"]


@tf.kernel
def exponential(x: T.Tensor["N", "f32"]):
    i = T.axes("i")
    return T.exp(x[i])


def test_exp_polynomial_is_within_an_ulp_and_keeps_the_special_values():
    x = np.concatenate([np.linspace(-87, 88.3, 200_001, dtype=np.float32),
                        np.float32([-np.inf, np.inf, np.nan, 0.0, -200.0, 200.0, 1e-30])])
    got = tf.compile(exponential, target="llvm")(x)
    want = np.exp(x.astype(np.float64))
    finite = np.isfinite(want) & (want > 1.2e-38) & (want < 3e38)
    assert np.max(np.abs(got[finite] - want[finite]) / want[finite]) < 1.2e-7   # one f32 ulp
    assert got[-7] == 0.0 and got[-6] == np.inf and np.isnan(got[-5])
    assert got[-4] == 1.0 and got[-3] == 0.0 and got[-2] == np.inf and got[-1] == 1.0


@tf.kernel
def nested_exponentials(x: T.Tensor["N", "f32"], y: T.Tensor["N", "bf16"]):
    i = T.axes("i")
    return T.exp(T.exp(x[i] - 1.0) * 0.5 + T.where(x[i] > 0.0, x[i], -x[i])), T.exp(y[i] * 2.0)


def test_an_exp_argument_is_computed_once_unless_it_reads_a_16_bit_float(rng):
    """Bound (``vector_math="bound"``, the CPU's fused chains), an f32 argument is computed once
    (``Let``), so nested exponentials stay linear in size (written out, each polynomial repeats
    its argument ~30 times: an inner exp inside an outer one would be there ~900 times); an
    argument that reads bf16 is written out (TVM's bf16 legalisation does not enter a Let's
    value: bound there, the load would be read as its integer bits). Both match float64."""
    import ml_dtypes
    import tvm

    mod = lower_program(nested_exponentials.program, (), dict(N=1000), vector_math="bound")
    script = mod.script()
    assert "T.Let" in script and len(script) < 12_000, len(script)
    bf16_line = next(line for line in script.splitlines() if "y[" in line and "=" in line)
    assert "T.Let" not in bf16_line
    x = rng.standard_normal(1000).astype(np.float32)
    y = rng.standard_normal(1000).astype(ml_dtypes.bfloat16)
    outs = [tvm.runtime.tensor(np.full(1000, np.nan, dtype)) for dtype in
            (np.float32, ml_dtypes.bfloat16)]
    tvm.compile(mod, target=tf.get_target("llvm").tvm_target)[nested_exponentials.name](
        tvm.runtime.tensor(x), tvm.runtime.tensor(y), *outs)
    got_x, got_y = (o.numpy().astype(np.float64) for o in outs)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    want_x = np.exp(np.exp(x64 - 1.0) * 0.5 + np.abs(x64))
    assert np.max(np.abs(got_x - want_x) / want_x) < 1e-6
    assert np.max(np.abs(got_y - np.exp(2.0 * y64)) / np.exp(2.0 * y64)) < 1e-2


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            return {w for line in f if line.startswith("flags") for w in line.split()}
    except OSError:
        return set()


@pytest.mark.skipif("avx2" not in _cpu_flags(), reason="an x86 CPU with AVX2 (reads /proc/cpuinfo)")
def test_the_cpu_target_compiles_for_this_cpus_vector_units():
    """Code for the host CPU, not for x86-64's baseline: the softmax's vector loops use 256-bit
    (AVX2) or 512-bit (AVX-512) registers, which baseline x86-64 code never does."""
    lib = tf.compile(K.softmax, target="llvm")._executable(dict(M=64, N=256), "int32")
    asm = lib.mod.inspect_source("asm")
    assert "%ymm" in asm or "%zmm" in asm
