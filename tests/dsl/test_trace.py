"""Tracing turns a function into computes named after its variables, with the right axes and types."""
import numpy as np

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.dsl.evaluate import run_program
from tests.helpers import line_of


def test_attention_traces_to_named_computes():
    @tf.kernel
    def attention(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                  v: T.Tensor["B", "H", "N", "D", "bf16"], scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
        m = T.max(s, over=j)
        p = T.exp(s - m)
        l = T.sum(p, over=j)  # noqa: E741
        return T.sum(p * v[b, h, j, e], over=j) / l

    prog = attention.program
    by_name = {c.name: c for c in prog.computes}
    assert {"s", "m", "p", "l", "out"} <= set(by_name)
    assert [a.name for a in by_name["m"].axes] == ["b", "h", "i"]
    assert [a.name for a in by_name["m"].over] == ["j"]
    assert by_name["m"].monoid is T.MAX
    assert [a.name for a in by_name["out"].axes] == ["b", "h", "i", "e"]
    assert by_name["out"].dtypes == ("bf16",)       # stored like the inputs
    assert by_name["l"].dtypes == ("f32",)          # accumulated in f32
    assert prog.outputs == [by_name["out"]]
    assert prog.dim_names() == ["B", "H", "M", "D", "N"]
    assert by_name["m"].loc.lineno == line_of(attention.fn, "m = T.max")


def test_helper_function_names_are_kept():
    def normalise(x, j):
        total = T.sum(x, over=j)
        return x / total

    @tf.kernel
    def k(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        return normalise(T.exp(x[i, j]), j)

    assert "total" in [c.name for c in k.program.computes]


def test_output_axis_order_follows_declaration_order():
    @tf.kernel
    def transpose_sum(x: T.Tensor["M", "N", "K", "f32"]):
        j, i, k = T.axes("j i k")
        return T.sum(x[i, j, k], over=k)

    out = transpose_sum.program.outputs[0]
    assert [a.name for a in out.axes] == ["j", "i"]
    x = np.random.default_rng(0).standard_normal((3, 4, 5))
    np.testing.assert_allclose(run_program(transpose_sum.program, {"x": x})[0], x.sum(2).T)


def test_several_outputs_and_integer_results():
    @tf.kernel
    def stats(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        top, where_top = T.max_argmax(x[i, j], over=j)
        return top, where_top

    prog = stats.program
    assert [c.dtypes[0] for c in prog.outputs] == ["f32", "i32"]
    x = np.random.default_rng(1).standard_normal((6, 9))
    top, idx = run_program(prog, {"x": x})
    np.testing.assert_allclose(top, x.max(1))
    np.testing.assert_array_equal(idx, x.argmax(1))


def test_index_arithmetic_and_lookups_are_inlined_not_stored():
    @tf.kernel
    def k(x: T.Tensor["B", "N", "f32"], doc: T.Tensor["B", "N", "i32"]):
        b, i, j = T.axes("b i j")
        same = doc[b, i] == doc[b, j]
        near = T.abs(i - j) <= 2
        return T.sum(T.where(same & near, x[b, j], 0.0), over=j)

    names = [c.name for c in k.program.computes]
    assert "same" not in names and "near" not in names


def test_user_monoid_reduction_matches_numpy():
    def larger_magnitude(a, b):  # signed value of largest magnitude; ties go to the larger value
        return T.where((T.abs(a) > T.abs(b)) | ((T.abs(a) == T.abs(b)) & (a >= b)), a, b)

    absmax = T.Monoid("absmax", larger_magnitude, 0.0)

    @tf.kernel
    def k(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        return T.reduce(x[i, j], over=j, monoid=absmax)

    x = np.random.default_rng(2).standard_normal((5, 7))
    ref = x[np.arange(5), np.abs(x).argmax(1)]
    np.testing.assert_allclose(run_program(k.program, {"x": x})[0], ref)


def test_weak_literals_take_the_type_of_the_tensor():
    @tf.kernel
    def k(x: T.Tensor["N", "f64"]):
        i = T.axes("i")
        return x[i] * 0.1 + 1

    assert k.program.outputs[0].dtypes == ("f64",)
