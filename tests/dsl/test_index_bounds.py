"""Index arithmetic out of its dimension (``tensorfuse/dsl/index_bounds.py``): a read at
``x[i, j + half]`` whose axis ``j`` took the whole row's extent from ``x[i, j]`` ran past the
row — the CPU target read the next row's values and returned a wrong result without a word.
Such a read is refused at the call's sizes, before anything runs, on every target; guarded
reads, modular indices and axes declared with the extent they run over are not."""
import numpy as np
import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.dsl.index_bounds import _bounded, affine_reads, index_range, index_scalars
from tensorfuse.dsl.printer import to_text
from tensorfuse.errors import CallError
from tensorfuse.index_checks import IndexOutOfRange
from tests.schedule_templates.user_written_more_check import swiglu_rms   # j over half the row


@tf.kernel
def swiglu_rms_overrun(x: T.Tensor["M", "N2", "f32"]):
    """SwiGLU of a row's halves with ``j`` bound to the whole row by ``x[i, j]``."""
    i, j = T.axes("i j")
    half = T.size("N2") // 2
    a, b = x[i, j], x[i, j + half]
    y = a * T.sigmoid(a) * b
    return T.sum(y * y, over=j)


@tf.kernel
def next_step_difference(x: T.Tensor["B", "L", "f32"]):
    """``x[t + 1] − x[t]`` over every t: the last step reads one past the end."""
    b, t = T.axes("b t")
    return x[b, t + 1] - x[b, t]


@tf.kernel
def guarded_difference(x: T.Tensor["B", "L", "f32"]):
    """The same with the last step's read under a guard."""
    b, t = T.axes("b t")
    return T.where(t + 1 < T.size("L"), x[b, t + 1], 0.0) - x[b, t]


@tf.kernel
def reversed_rows(x: T.Tensor["M", "N", "f32"], shift: T.i32):
    """A row read backwards and a roll by a scalar: in range whatever the sizes."""
    i, j = T.axes("i"), T.axis("j", "N")
    n = T.size("N")
    return x[i, n - 1 - j] + x[i, (j + shift) % n]


def _swiglu_rms_reference(x: np.ndarray) -> np.ndarray:
    a, b = np.split(x.astype(np.float64), 2, axis=1)
    y = a / (1 + np.exp(-a)) * b
    return np.sqrt((y * y).mean(1))


def test_an_index_past_its_dimension_is_refused_before_anything_runs(rng):
    x = rng.standard_normal((3, 12)).astype(np.float32)
    out = np.full(3, np.nan, np.float32)
    with pytest.raises(IndexOutOfRange) as info:
        tf.compile(swiglu_rms_overrun, "llvm")(x, out=out)
    text = str(info.value)
    assert "x[i, j + T.size('N2') // 2] reads dimension 1 of x (N2=12) at " in text
    assert "= 6…17, outside 0…11 (j over 0…11" in text and "T.axis(" in text, text
    assert isinstance(info.value, CallError) and isinstance(info.value, IndexError)
    assert np.isnan(out).all()   # nothing ran


def test_the_gpu_paths_refuse_it_at_the_sizes_they_plan_for():
    with pytest.raises(IndexOutOfRange, match=r"N2=300\) at .* = 150…449"):
        tf.compile(swiglu_rms_overrun, "cuda:sm_90a").describe_plan(M=4, N2=300)
    with pytest.raises(IndexOutOfRange, match=r"x\[b, t \+ 1\] reads dimension 1 of x \(L=9\) "
                       r"at t \+ 1 = 1…9, outside 0…8"):
        tf.compile(next_step_difference, "llvm")(torch.randn(2, 9))


def test_the_axis_declared_with_its_extent_runs_and_matches_float64(rng):
    x = torch.from_numpy(rng.standard_normal((5, 34)).astype(np.float32) * 3).bfloat16()
    got = tf.compile(swiglu_rms, "llvm")(x).double().numpy()
    np.testing.assert_allclose(got, _swiglu_rms_reference(x.double().numpy()), rtol=1e-2)


def test_guarded_reversed_and_modular_reads_are_not_refused(rng):
    x = rng.standard_normal((2, 9)).astype(np.float32)
    want = np.concatenate([x[:, 1:], np.zeros((2, 1), np.float32)], 1) - x
    np.testing.assert_allclose(tf.compile(guarded_difference, "llvm")(x), want, rtol=1e-6)
    y = rng.standard_normal((3, 7)).astype(np.float32)
    got = tf.compile(reversed_rows, "llvm")(y, -10)
    want = y[:, ::-1] + y[:, (np.arange(7) - 10) % 7]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_the_reads_checked_and_their_ranges():
    """Which reads are checked (neither an axis alone nor a gather, each axis once, not under a
    T.where branch), which of them have a range (a scalar's read has none at sizes alone, one
    at a call's value), and the exact extremes of arithmetic over axes; an axis read twice is
    left out."""
    axes = {a.uid: 7 for a in reversed_rows.program.axes}
    ranges = {to_text(r.load.indices[1]): index_range(r.load.indices[1], axes, {"N": 7})
              for r in affine_reads(reversed_rows.program)}
    assert ranges == {"T.size('N') - 1 - j": (0, 6), "(j + shift) % T.size('N')": None}
    assert [index_range(r.load.indices[1], axes, {"N": 7}, {"shift": 3})
            for r in affine_reads(reversed_rows.program)] == [(0, 6), (0, 6)]
    assert index_scalars(affine_reads(reversed_rows.program)) == ("shift",)
    assert index_scalars(affine_reads(next_step_difference.program)) == ()
    assert affine_reads(guarded_difference.program) == []
    (read,) = affine_reads(next_step_difference.program)
    axes = {a.uid: 9 for a in next_step_difference.program.axes}
    assert index_range(read.load.indices[1], axes, {"L": 9}) == (1, 9)
    i, j = T.axes("i j")
    sizes = {i.uid: 10, j.uid: 4}
    for index, want in [(2 * i + j - 3, (-3, 18)), ((i + 7) % 5, (0, 4)), ((i + 20) % 64, (20, 29)),
                        ((j + 3) // 2, (1, 3)), (T.maximum(i - 5, 0), (0, 4))]:
        assert index_range(index, sizes, {}) == want, index
    assert not _bounded(i + i) and _bounded(i * 2 + j)


@tf.kernel
def leading_columns_dot(x: T.Tensor["M", "N", "f32"], w: T.Tensor["K", "f32"]):
    """Each row's first K columns against a weight of K: an axis of K reading x's dimension N."""
    i, k = T.axes("i"), T.axis("k", "K")
    return T.sum(x[i, k] * w[k], over=k)


def test_an_axis_declared_over_part_of_a_dimension_reads_its_first_part(rng):
    x, w = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    f = tf.compile(leading_columns_dot, "llvm")
    terms = x[:, :5].astype(np.float64) * w
    # a float32 sum of 5 terms errs by up to 5·eps of its terms' magnitudes (relative to the
    # sum itself, unbounded where they cancel)
    bound = 5 * np.finfo(np.float32).eps * np.abs(terms).sum(1)
    assert (np.abs(f(x, w) - terms.sum(1)) <= bound).all()
    with pytest.raises(IndexOutOfRange, match=r"reads dimension 1 of x \(N=8\) at k \+ 0 = 0…8"):
        f(x, rng.standard_normal(9).astype(np.float32))


@tf.kernel
def shifted_window_sum(x: T.Tensor["B", "N", "f32"], shift: T.i32):
    """The sum of N − 8 consecutive values of each row from column ``shift``."""
    b, j = T.axis("b", "B"), T.axis("j", T.size("N") - 8)
    return T.sum(x[b, j + shift], over=j)


def _window_sums(x: np.ndarray, shift: int) -> np.ndarray:
    return x[:, shift:shift + x.shape[1] - 8].astype(np.float64).sum(1)


def test_an_index_reading_a_scalar_is_checked_at_every_calls_value(rng):
    """``x[b, j + shift]`` is in range for some values of ``shift`` only: a call whose value
    takes it out is refused — also after calls of the same sizes took another value (they
    are bound once per signature: the check is not) — where it read the next row's values."""
    f = tf.compile(shifted_window_sum, "llvm")
    x = rng.standard_normal((3, 100)).astype(np.float32)
    for shift in (5, 8, 0, 5):   # torch tensors: bound in full once per signature
        got = f(torch.from_numpy(x), shift).numpy()
        # f32 sums of 92 values: an absolute term too, for a sum that cancels to near 0 (a
        # row summing to -0.2065 was 3e-6 off, 1.4e-5 relative)
        np.testing.assert_allclose(got, _window_sums(x, shift), rtol=1e-5, atol=1e-5)
    checks = f._calls.checks
    with pytest.raises(IndexOutOfRange, match=r"x\[b, j \+ shift\] reads dimension 1 of x "
                       r"\(N=100\) at j \+ shift = 9…100, outside 0…99 \(j over 0…91, "
                       r"shift = 9: .*Call it with shift keeping the index inside"):
        f(torch.from_numpy(x), 9)   # the signature of the calls at 5 and 8
    assert f._calls.checks == checks   # refused by the per-call check, not a full binding
    out = torch.full((3,), float("nan"))
    with pytest.raises(IndexOutOfRange, match="shift = 9"):
        f(torch.from_numpy(x), 9, out=out)
    assert out.isnan().all()   # nothing ran
    with pytest.raises(IndexOutOfRange, match=r"= -1…90, outside 0…99"):
        f(x, shift=-1)   # NumPy arrays: bound in full on every call


def test_a_fast_call_guards_the_scalars_index_arithmetic_reads():
    """A GPU fast call (a signature's launches kept) is laid out with ``shift`` guarded: a call
    with another value takes the checked path (GPU-marked below, through the GPU's calls)."""
    from tensorfuse.binding import bind_call
    from tensorfuse.targets.signature_call import call_layout

    args = (torch.randn(2, 50), 5)
    bound = bind_call(shifted_window_sum.program, args, {}, "cpu")
    _, _, guards = call_layout(shifted_window_sum.program, args, bound, {"shift": int},
                               [("out", (2,), "f32")])
    assert guards == [(1, 5)]


@pytest.mark.gpu
def test_an_index_reading_a_scalar_is_checked_on_the_gpus_fast_path():
    """The GPU's fast calls (a signature's launches kept) take another value of a scalar that
    index arithmetic reads through the checked path."""
    f = tf.compile(shifted_window_sum, "cuda")
    x = torch.randn(64, 4096, device="cuda")
    for shift in (5, 5, 8):
        want = torch.from_numpy(_window_sums(x.cpu().numpy(), shift))
        assert torch.allclose(f(x, shift).double().cpu(), want, rtol=1e-4, atol=1e-3)
    with pytest.raises(IndexOutOfRange, match="shift = 9"):
        f(x, 9)


@tf.kernel
def label_of_max(s: T.Tensor["B", "C", "f32"], labels: T.Tensor["C", "i32"]):
    """Each row's label: the labels' entry at the row's argmax."""
    b, c = T.axes("b c")
    return labels[T.argmax(s[b, c], over=c)]


@tf.kernel
def next_label_of_max(s: T.Tensor["B", "C", "f32"], labels: T.Tensor["C", "i32"]):
    """The label after the argmax's: past the labels where the argmax is the last class."""
    b, c = T.axes("b c")
    return labels[T.argmax(s[b, c], over=c) + 1]


@tf.kernel
def next_label_clamped(s: T.Tensor["B", "C", "f32"], labels: T.Tensor["C", "i32"]):
    b, c = T.axes("b c")
    return labels[T.minimum(T.argmax(s[b, c], over=c) + 1, T.size("C") - 1)]


@tf.kernel
def mirrored_label(s: T.Tensor["B", "C", "f32"], labels: T.Tensor["C", "i32"]):
    """The argmax's position read three times: in range, though interval arithmetic over each
    reading alone would say -9…18."""
    b, c = T.axes("b c")
    am = T.argmax(s[b, c], over=c)
    return labels[T.size("C") - 1 - am + am - am]


@tf.kernel
def bucket_of_count(x: T.Tensor["B", "C", "f32"], table: T.Tensor["K", "f32"]):
    """A table's entry at each row's count of positive values: data no bound holds."""
    b, c = T.axes("b c")
    return table[T.sum(T.where(x[b, c] > 0.0, 1, 0), over=c)]


def test_an_index_from_an_argmax_takes_the_range_of_the_axis_it_reduced(rng):
    """An argmax's position is one of the reduced axis's: ``labels[idx]`` is in range, and
    ``labels[idx + 1]`` can read one past the labels — refused before anything runs (the CPU
    target read the memory after the tensor: 65 and 113 where the labels hold 0…63)."""
    s = torch.from_numpy(rng.standard_normal((4, 10)).astype(np.float32))
    s[2, 9] = 100.0   # the last class wins row 2
    labels = torch.arange(10, dtype=torch.int32) * 7
    best = s.argmax(1)
    assert torch.equal(tf.compile(label_of_max, "llvm")(s, labels), labels[best])
    with pytest.raises(IndexOutOfRange, match=r"labels\[.* \+ 1\] reads dimension 0 of "
                       r"labels \(C=10\) at .*, which can be 1…10 \(.*computed in the kernel\), "
                       r"outside 0…9. Keep the index inside"):
        tf.compile(next_label_of_max, "llvm")(s, labels)
    got = tf.compile(next_label_clamped, "llvm")(s, labels)
    assert torch.equal(got, labels[(best + 1).clamp(max=9)])
    # a position read more than once is left unchecked (clamped), never refused on a range
    # interval arithmetic widened
    assert torch.equal(tf.compile(mirrored_label, "llvm")(s, labels), labels[9 - best])


def test_a_computed_index_no_bound_holds_is_clamped_into_its_dimension(rng):
    """A count used as an index can exceed the table: no check sees it before the kernel runs,
    so every emitter clamps it (the CPU target read past the table: 0 where 70 is the last
    entry), as gathered indices are (docs/dsl.md)."""
    x = torch.from_numpy(rng.standard_normal((6, 12)).astype(np.float32))
    x[0], x[1] = 1.0, -1.0   # counts of 12 and 0
    table = torch.arange(8, dtype=torch.float32) * 10
    got = tf.compile(bucket_of_count, "llvm")(x, table)
    assert torch.equal(got, table[(x > 0).sum(1).clamp(max=7)])
    source = tf.compile(bucket_of_count, "cuda:sm_90a").source(B=64, C=4096, K=64)
    assert "tl.load(table + (tl.minimum(tl.maximum(" in source, source
