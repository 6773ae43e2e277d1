"""Features the XGBoost cost model sees for GPU template candidates.

TVM's per-store features describe loops and buffer accesses of TensorIR; a template candidate
differs from its siblings only in its knobs (tile sizes, warps, stages, split parts; for the
Hopper template consumer warpgroups of 64 rows, ring slots and its two pipelining switches),
which the emitters turn into code. So the model is given the knobs themselves (log2 of each, and the tile
area, warps per tile row and the number of programs per row tile sweep) — the quantities the
kernel's speed depends on.
"""
from __future__ import annotations

import math

import numpy as np
import tvm
from tvm.s_tir.meta_schedule.feature_extractor import PyFeatureExtractor
from tvm.ir.utils import derived_object

from .tasks import KNOB_ORDER, knobs_of

FLAGS = ("reload", "overlap", "pingpong", "copy", "stage_sides")   # knobs that are 0 or 1


def knob_features(knobs: dict[str, int]) -> list[float]:
    """One row of features for one candidate."""
    values = {name: float(knobs.get(name, 1)) for name in KNOB_ORDER}
    logs = [math.log2(max(v, 1.0)) for v in values.values()]
    block_n, splits = values["block_n"], values["splits"]
    block_m = values["block_m"] if "block_m" in knobs else 64.0 * values["consumers"]
    warps = values["num_warps"] if "num_warps" in knobs else 4.0 * (values["consumers"] + 1)
    stages = values["num_stages"] if "num_stages" in knobs else values["stages"]
    # on/off knobs as they are (their logarithms would be 0 both ways)
    flags = [float(knobs.get(name, 0)) for name in FLAGS]
    return logs + flags + [math.log2(block_m * block_n), math.log2(block_m * block_n / warps),
                           stages * math.log2(block_n), math.log2(splits * block_m)]


@derived_object
class KnobFeatures(PyFeatureExtractor):
    """:func:`knob_features` of each candidate's recorded knobs."""

    def extract_from(self, context, candidates):
        out = []
        for candidate in candidates:
            row = knob_features(knobs_of(candidate.sch.mod))
            out.append(tvm.runtime.tensor(np.asarray([row], dtype="float32")))
        return out
