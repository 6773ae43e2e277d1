"""The library's kernels at the sizes tiles meet last (:mod:`.edge_sizes_check`): rows of one to
three elements, one row, widths one past a power of two, attention over one key or one query,
a head dim of 8, causal attention whose queries are the last of more keys — against float64
through Triton's interpreter (as ``tf.compile`` makes them for sm_90a), the CPU target and
(marked ``gpu``) the GPU at hand."""
import pytest

from tests.helpers import check_cases_compiled, check_cases_interpreted
from tests.schedule_templates import edge_sizes_check


def test_edge_sizes_match_float64_in_the_triton_interpreter():
    check_cases_interpreted(edge_sizes_check)


def test_edge_sizes_match_float64_on_the_cpu_target():
    check_cases_compiled(edge_sizes_check, "llvm")


@pytest.mark.gpu
def test_edge_sizes_match_float64_on_the_gpu():
    check_cases_compiled(edge_sizes_check, "cuda")
