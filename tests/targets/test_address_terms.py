"""A read's mixed-radix digits merged back into one index (``targets.address_terms``): checked by
value against the address written term by term, over every position of a flat axis, and left
alone where the dimensions do not nest or an index reads a tensor."""
import numpy as np
import pytest

from tensorfuse.dsl.expr import Axis, Const, Load, binary
from tensorfuse.dsl.program import TensorParam
from tensorfuse.targets.address_terms import address_terms


def _digits(flat: Axis, extents: list[int]) -> list:
    """``flat``'s row-major digits over ``extents`` (what flat_sweeps reads the axes as)."""
    out, inner = [], 1
    for i, extent in reversed(list(enumerate(extents))):
        at = flat if inner == 1 else binary("floordiv", flat, Const(inner, "i32"))
        out.append(at if i == 0 else binary("mod", at, Const(extent, "i32")))
        inner *= extent
    return out[::-1]


def _value(e, j: int) -> int:
    """An index at ``j``: Python's own floor division and modulo, not the project's."""
    if isinstance(e, Axis):
        return j
    if isinstance(e, Const):
        return e.value
    a, b = _value(e.a, j), _value(e.b, j)
    return {"floordiv": a // b, "mod": a % b}[e.op]


def _address(terms, j: int) -> int:
    return sum(_value(index, j) * stride for index, stride in terms)


def _row_major(extents):
    return [int(np.prod(extents[i + 1:])) for i in range(len(extents))]


@pytest.mark.parametrize("extents", [[16, 4096], [3, 5, 7], [2, 3, 4, 5]])
def test_digits_on_nested_dimensions_are_one_index_of_the_same_address(extents):
    flat = Axis("j", int(np.prod(extents)))
    indices, strides = _digits(flat, extents), _row_major(extents)
    merged = address_terms(indices, strides)
    assert len(merged) == 1 and merged[0][0] is flat and merged[0][1] == 1
    for j in range(0, flat.extent, max(1, flat.extent // 97)):
        assert _address(merged, j) == _address(list(zip(indices, strides)), j)


def test_an_inner_digit_merges_with_its_neighbour_and_keeps_the_outer_modulus():
    """x[j // 35, (j // 7) % 5, j % 7] read with a padded outer stride: the two inner digits
    merge into j % 35; the outer one keeps its own term."""
    flat = Axis("j", 3 * 5 * 7)
    indices = _digits(flat, [3, 5, 7])
    strides = [64, 7, 1]
    merged = address_terms(indices, strides)
    assert len(merged) == 2 and merged[1][1] == 1
    for j in range(flat.extent):
        assert _address(merged, j) == _address(list(zip(indices, strides)), j)


@pytest.mark.parametrize("strides", [[4097, 1], [4096, 2], [1, 16]])
def test_digits_on_dimensions_that_do_not_nest_are_left_as_written(strides):
    flat = Axis("j", 16 * 4096)
    indices = _digits(flat, [16, 4096])
    assert [s for _, s in address_terms(indices, strides)] == strides


def test_a_gathered_index_keeps_its_own_term():
    """A page table's page and a slot: the page is data (clamped into its dimension by the
    emitters), never merged with the slot."""
    flat = Axis("j", 8 * 64)
    table = TensorParam("table", ("P",), "i32")
    page = Load(table, (binary("floordiv", flat, Const(64, "i32")),))
    slot = binary("mod", flat, Const(64, "i32"))
    merged = address_terms([page, slot], [64, 1])
    assert [s for _, s in merged] == [64, 1] and merged[0][0] is page


def test_the_group_norm_of_the_suite_reads_its_flat_row_contiguously():
    """The emitted Triton source reads x at the flat axis, not through floor divisions."""
    import tensorfuse as tf
    from benchmarks.user_kernels import group_norm

    compiled = tf.compile(group_norm, target="cuda:sm_90a")
    source = compiled.for_sizes(B=2, G=4, C=8, P=64).template.source(B=2, G=4, C=8, P=64)
    x_reads = [line for line in source.splitlines() if "tl.load(x + (" in line]
    assert x_reads and all("_floordiv" not in line.split("tl.load(x + (")[1].split(")")[0]
                           for line in x_reads)

