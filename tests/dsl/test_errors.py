"""Every mistake a kernel author can make raises a tensorfuse error naming the problem and the line."""
import pytest

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import (AxisError, DSLError, DTypeError, ShapeError,
                               UnsupportedConstructError)
from tests.helpers import line_of


def expect_error(fn, error, marker: str, *words: str):
    with pytest.raises(error) as info:
        tf.kernel(fn)
    exc = info.value
    assert exc.location is not None, "the error must name a source location"
    assert exc.location.filename == fn.__code__.co_filename
    assert exc.location.lineno == line_of(fn, marker), str(exc)
    text = str(exc)
    assert f"{exc.location.filename}:{exc.location.lineno}" in text
    for w in words:
        assert w in text, text
    return exc


def test_axis_bound_to_two_different_sizes_is_a_shape_error():
    def bad(q: T.Tensor["M", "D", "f32"], k: T.Tensor["N", "D", "f32"]):
        i, d = T.axes("i d")
        return T.sum(q[i, d] * k[i, d], over=d)  # <- here

    expect_error(bad, ShapeError, "# <- here", "axis i", "'N'", "'M'")


def test_wrong_number_of_indices():
    def bad(x: T.Tensor["M", "N", "f32"]):
        i = T.axes("i")
        return x[i] * 2.0  # <- here

    expect_error(bad, ShapeError, "# <- here", "x has 2 dimensions", "indexed with 1")


def test_reused_axis_in_one_access():
    def bad(x: T.Tensor["N", "N", "f32"]):
        i = T.axes("i")
        return x[i, i] + 1.0  # <- here

    expect_error(bad, AxisError, "# <- here", "axis i is used twice")


def test_axis_declared_twice():
    def bad(x: T.Tensor["N", "f32"]):
        i, j = T.axes("i i")  # <- here
        return x[i]

    expect_error(bad, AxisError, "# <- here", "declared twice")


def test_undeclared_axis_names_the_line():
    def bad(x: T.Tensor["N", "f32"]):
        return x[undeclared_axis] * 2.0  # noqa: F821  <- here

    expect_error(bad, AxisError, "<- here", "undeclared_axis", "T.axes")


def test_reducing_over_an_axis_the_operand_lacks():
    def bad(x: T.Tensor["M", "N", "f32"]):
        i, j, k = T.axes("i j k")
        return T.sum(x[i, j], over=k)  # <- here

    expect_error(bad, AxisError, "# <- here", "cannot reduce over axis k", "i, j")


@pytest.mark.parametrize("reduction, alias", [(T.max, "axis"), (T.sum, "dim"), (T.mean, "dim"),
                                              (T.logsumexp, "axes"), (T.argmax, "dim")])
def test_axes_given_as_numpy_or_torch_name_them_are_answered_with_over(reduction, alias):
    def bad(x: T.Tensor["M", "N", "f32"]):
        i, j = T.axes("i j")
        return reduction(x[i, j], **{alias: j})  # <- here

    expect_error(bad, DSLError, "# <- here", f"T.{reduction.__name__} takes the axes",
                 "over=", f"not {alias}=")


def test_a_mean_over_an_axis_of_no_known_size_says_how_to_give_it_one():
    def bad(x: T.Tensor["N", "f32"]):
        i, j = T.axes("i j")
        return T.mean(x[i] * j, over=j)  # <- here

    expect_error(bad, AxisError, "# <- here", "T.mean over axis j", "T.axis('j', 16)")


def test_a_size_no_tensor_has_is_refused_naming_axis_size_and_how_to_bind_it():
    def bad(x: T.Tensor["M", "f32"]):
        i = T.axes("i")
        j = T.axis("j", "N")  # <- here
        return T.sum(x[i] * j, over=j)

    expect_error(bad, AxisError, "# <- here", "axis j has size 'N'", "no tensor parameter",
                 "T.axis('j', 16)", "the named ones here: M")


def test_t_size_of_a_dimension_no_tensor_has_is_refused():
    def bad(x: T.Tensor["M", "f32"]):
        i = T.axes("i")
        return x[i] * T.size("N")  # <- here

    expect_error(bad, AxisError, "# <- here", "T.size('N')", "no tensor parameter")


def test_axis_without_a_size():
    def bad(x: T.Tensor["N", "f32"]):
        i, g = T.axes("i g")
        return x[i] * g  # <- here

    expect_error(bad, AxisError, "T.axes", "size of axis g is unknown")


def test_float_index_is_a_dtype_error():
    def bad(x: T.Tensor["N", "f32"], y: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return x[y[i]]  # <- here

    expect_error(bad, DTypeError, "# <- here", "indices must be integers")


def test_where_needs_a_condition():
    def bad(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return T.where(x[i], 1.0, 0.0)  # <- here

    expect_error(bad, DTypeError, "# <- here", "condition")


def test_arithmetic_on_booleans_is_rejected():
    def bad(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return (x[i] > 0.0) + 1.0  # <- here

    expect_error(bad, DTypeError, "# <- here", "boolean")


def test_data_dependent_if_is_rejected():
    def bad(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        if x[i] > 0:  # <- here
            return x[i]
        return -x[i]

    expect_error(bad, UnsupportedConstructError, "# <- here", "T.where")


def test_python_and_on_conditions_is_rejected():
    def bad(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return T.where((x[i] > 0.0) and (x[i] < 1.0), x[i], 0.0)  # <- here

    expect_error(bad, UnsupportedConstructError, "# <- here", "&")


def test_iterating_over_a_tensor_is_rejected():
    def bad(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return sum(v for v in x[i])  # <- here

    expect_error(bad, UnsupportedConstructError, "# <- here", "iterate")


def test_unpacking_the_one_axis_of_t_axes_says_it_is_the_axis_itself():
    def bad(x: T.Tensor["N", "f32"]):
        j, = T.axes("j")  # <- here
        return x[j] * 2.0

    expect_error(bad, UnsupportedConstructError, "# <- here", "write j = T.axes('j')")


def test_python_max_of_a_tensor_value_points_to_where_and_relu():
    def bad(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return max(x[i], 0.0)  # <- here

    expect_error(bad, UnsupportedConstructError, "# <- here", "max()", "T.relu")


def test_math_functions_on_a_tensor_value_point_to_the_dsl():
    import math

    def bad(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return math.exp(x[i])  # <- here

    expect_error(bad, UnsupportedConstructError, "# <- here", "math.exp", "T.exp")


def test_numpy_functions_are_refused_and_numpy_scalars_combine():
    import numpy as np

    def bad(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return np.exp(x[i])  # <- here

    expect_error(bad, UnsupportedConstructError, "# <- here", "NumPy's exp", "T.exp")

    def with_array(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return np.ones(3) * x[i]  # <- here

    expect_error(with_array, UnsupportedConstructError, "# <- here", "T.Tensor argument")

    @tf.kernel
    def scaled(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return np.float32(0.5) * x[i] - x[i] / np.float64(4.0) + np.int64(1)

    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(tf.compile(scaled, "llvm")(x), 0.25 * x + 1)


def test_division_by_the_constant_zero():
    def bad(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return x[i] / 0  # <- here

    expect_error(bad, DTypeError, "# <- here", "division by the constant 0")


def test_missing_annotation():
    def bad(x):  # <- here
        return x

    expect_error(bad, DSLError, "# <- here", "parameter x needs a type annotation")


def test_returning_nothing():
    def bad(x: T.Tensor["N", "f32"]):  # <- here
        i = T.axes("i")
        x[i] * 2.0

    expect_error(bad, DSLError, "# <- here", "returns nothing")


def test_output_without_axes_that_reduces_nothing():
    def bad(x: T.Tensor["N", "f32"], scale: T.f32):
        i = T.axes("i")
        T.sum(x[i], over=i)
        return scale * 2.0  # <- here

    expect_error(bad, DSLError, "# <- here", "no axes and reduces nothing")


def test_bad_tensor_annotation():
    with pytest.raises(DSLError, match="element type"):
        T.Tensor["M", "N"]
    with pytest.raises(DSLError, match="element type"):
        T.Tensor["M", "N", "float8"]


def test_modulo_of_floats_is_rejected():
    def bad(x: T.Tensor["N", "f32"]):
        i = T.axes("i")
        return x[i] % 2.0  # <- here

    expect_error(bad, DTypeError, "# <- here", "integers")


def test_user_monoid_that_is_not_associative_is_refused():
    with pytest.raises(DSLError, match="associative"):
        T.Monoid("mean_of_two", lambda a, b: (a + b) / 2.0, 0.0)


def test_user_monoid_with_wrong_identity_is_refused():
    with pytest.raises(DSLError, match="identity"):
        T.Monoid("sum_from_one", lambda a, b: a + b, 1.0)


def test_monoid_law_failure_names_the_definition_line():
    def define():
        return T.Monoid("absmax", lambda a, b: T.max(T.abs(a), T.abs(b)), 0.0)  # <- here

    with pytest.raises(DSLError, match="identity law") as info:
        define()
    assert info.value.location.lineno == line_of(define, "# <- here")
