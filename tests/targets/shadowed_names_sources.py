"""Generated Triton sources of every Triton template, for the check that each name a template
writes is one ``template_may_write`` knows (``test_shadowed_names.py``): the golden row,
attention and backward cases (every other one: their variants write the same names), and kernels
of the check modules on the other templates — scans, bands, scatter-adds, GEMM tiles with states
over their columns, column sums, the elementwise template and the floor's stages."""
from __future__ import annotations

import importlib
from typing import Iterator

# (check module, its cases): the kernels of each template, its states and kernels apart
CHECKED = {
    "scan_check": ("cumulative_sum", "long_cumulative_sum", "running_argmax", "linear_recurrence"),
    "bands_check": ("rolling_max", "centred_argmax"),
    "scatter_check": ("embedding", "embedding_large_vocabulary", "byte_histogram",
                      "segment_mean"),
    "contraction_cases": ("linear", "swiglu_gate", "bilinear_form", "best_match"),
    "staged_floor": ("head_logsumexp", "layernorm_backward", "latent_attention",
                     "mean_nearest_distance", "segment_mean", "log_softmax_vocab_major"),
    "elementwise_check": ("gelu_tanh", "two_outputs", "max_pool_2x2"),
    "chain_scans_check": ("prefix_softmax", "causal_attention_pool"),
    "nested_scans_check": ("integral_image", "box_filter_5"),
    "pipeline_check": ("attention_pool", "mean_absolute_deviation", "min_p_mass"),
    "held_rows_check": ("masked_mad",),
}


def sources() -> Iterator[tuple[str, str]]:
    """``(where, source)`` pairs (call inside ``golden_sources.pinned()``)."""
    import torch

    import tensorfuse as tf
    from tensorfuse.binding import bind_call

    from tests.targets.golden_sources import _interpreter_cases, _triton_cases

    for k, (name, make) in enumerate(list(_triton_cases()) + list(_interpreter_cases())):
        if k % 2 == 0 or name.startswith("interpreter"):
            yield name, make()
    for module, names in CHECKED.items():
        cases = importlib.import_module(f"tests.schedule_templates.{module}").CASES
        for name in names:
            kernel, case = cases[name][:2]
            made = case(torch.Generator().manual_seed(0))
            args = made[0] if isinstance(made, tuple) else made
            bound = bind_call(kernel.program, (), {n: v for n, v in args.items() if n != "out"},
                              "cpu")
            yield f"{module}:{name}", tf.compile(kernel, "cuda:sm_90a").source(
                **bound.dims, **bound.scalars)
