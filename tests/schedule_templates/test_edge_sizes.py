"""The library's kernels at the sizes tiles meet last (:mod:`.edge_sizes_check`): rows of one to
three elements, one row, widths one past a power of two, attention over one key or one query,
a head dim of 8, causal attention whose queries are the last of more keys — against float64
through Triton's interpreter (as ``tf.compile`` makes them for sm_90a) and the CPU target."""
import warnings

import pytest
import torch

import tensorfuse as tf
from tests.helpers import fresh_seed, poisoned_call, relative_error, run_interpreted
from tests.schedule_templates import edge_sizes_check

# bf16 outputs: their rounding alone is 4e-3; cross-entropy's float32 losses: 1e-5
TOLERANCE = {name: 1e-5 if name.startswith("cross_entropy") else 2e-2
             for name in edge_sizes_check.CASES}


def test_edge_sizes_match_float64_in_the_triton_interpreter():
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    seed = fresh_seed()
    errors = run_interpreted(edge_sizes_check.__name__, seed)
    assert set(errors) == set(TOLERANCE), errors
    too_far = {n: e for n, e in errors.items() if not e < TOLERANCE[n]}
    assert not too_far, f"{too_far} (TENSORFUSE_SEED={seed})"


def test_edge_sizes_match_float64_on_the_cpu_target():
    seed = fresh_seed()
    generator = torch.Generator().manual_seed(seed)
    errors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (kernel, case) in edge_sizes_check.CASES.items():
            args, want = case(generator)
            out, = poisoned_call(tf.compile(kernel, "llvm"), kernel.program, args, want)
            errors[name] = relative_error(out, want)
    too_far = {n: e for n, e in errors.items() if not e < TOLERANCE[n]}
    assert not too_far, f"{too_far} (TENSORFUSE_SEED={seed})"
