"""Where a template's choice is written on the TensorIR: annotations on the function's root block.

A schedule step that applies a template (``apply_template``, ``cluster_distribute``) records the
template's name and the knobs given on the root block, so the TensorIR a user shows in a notebook
says what will be generated from it; tuning records carry the knobs they chose the same way
(``tensorfuse.knob.<name>``), which is how ``compile`` reads them back.
"""
from __future__ import annotations

import tvm

TEMPLATE_ATTR = "tensorfuse.template"
KNOB_PREFIX = "tensorfuse.knob."


def annotate_template(sch: tvm.s_tir.Schedule, name: str, knobs: dict) -> None:
    """Write ``name`` and the knobs whose values are numbers or names on ``sch``'s root block."""
    root = sch.get_sblock("root")
    sch.annotate(root, TEMPLATE_ATTR, name)
    for key, value in knobs.items():
        if isinstance(value, (bool, int, str)):
            sch.annotate(root, KNOB_PREFIX + key, int(value) if isinstance(value, bool) else value)
