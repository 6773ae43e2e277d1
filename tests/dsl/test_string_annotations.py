"""Kernels in a module with ``from __future__ import annotations`` (every annotation a string):
defined inside a function, their annotations may name that function's local imports and names,
as their bodies may; a name found nowhere is an error naming the parameter and the line."""
from __future__ import annotations

import numpy as np
import pytest

import tensorfuse as tf
from tensorfuse.errors import DSLError


def test_annotations_see_the_defining_functions_names():
    from tensorfuse import dsl as DSL   # a local import, under another name than the module's

    width, element = "N", "f32"   # names only the annotations use

    def make(scale: float):   # DSL reaches the kernel through its body's closure
        @tf.kernel
        def scaled(x: DSL.Tensor["M", "N", "f32"], s: DSL.f32):
            i, j = DSL.axes("i j")
            return x[i, j] * s * scale
        return scaled

    kernel = make(2.0)
    assert [p.dtype for p in kernel.program.tensor_params] == ["f32"]
    x = np.random.default_rng(0).standard_normal((3, 5)).astype("f4")
    np.testing.assert_allclose(tf.compile(kernel, "llvm")(x, 1.5), x * 3.0, rtol=1e-6)

    @tf.kernel(name="named")   # width and element: from the scope it is defined in
    def named(x: DSL.Tensor["M", width, element]):
        i, j = DSL.axes("i j")
        return x[i, j] + 1.0
    assert named.name == "named" and named.program.tensor_params[0].dims == ("M", "N")


def test_a_name_found_nowhere_is_an_error_at_its_parameter():
    from tensorfuse import dsl as DSL

    with pytest.raises(DSLError, match="parameter x: cannot evaluate annotation .*nowhere"):
        @tf.kernel
        def bad(x: DSL.Tensor["N", nowhere]):  # noqa: F821 - the name the test leaves undefined
            i = DSL.axes("i")
            return x[i]
