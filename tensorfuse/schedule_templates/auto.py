"""Pick a template for a kernel when the user asks for none: fuse the reductions that share the
most-reduced axis and use the GPU template that fits (a native CUDA C++ one first where the GPU
has one for the chain); otherwise keep the default schedule."""
from __future__ import annotations

from collections import Counter

from ..algebra import plan_chain
from ..dsl.program import Program
from ..errors import RollingUpdateError, ScheduleError, TargetError
from ..targets import TargetSpec
from .fusion import Fusion
from .hopper_attention import hopper_attention
from .rolling_update import DEFAULT_CHUNK
from .tile_plan import plan_rowtile


def choose(program: Program, target: TargetSpec):
    """``(template name, fusion)`` for ``program`` on ``target``, or ``None``."""
    if not target.is_gpu:
        return None
    counts = Counter(c.over[0].uid for c in program.computes
                     if c.is_reduction and len(c.over) == 1)
    for uid, _ in counts.most_common():
        members = [c for c in program.computes if c.is_reduction and len(c.over) == 1
                   and c.over[0].uid == uid]
        axis = members[0].over[0]
        fusion = Fusion(tuple(m.name for m in members), axis.name, DEFAULT_CHUNK)
        try:
            chain = plan_chain(program, fusion.names, axis)
            plan_rowtile(program, chain, {d: 64 for d in program.dim_names()})
        except (RollingUpdateError, TargetError):
            continue
        name = "attention" if chain.local_reductions or any(
            len(m.axes) > len(chain.common_axes) for m in chain.members) else "row_reduction"
        return name, fusion
    return None


def native_templates(kernel, name: str, fusion, spec: TargetSpec) -> tuple:
    """Templates generated as CUDA C++ for this GPU that ``tf.compile`` tries before the Triton
    one: on sm_90a, softmax attention gets the warp-specialised Hopper template for prefill
    (more than 64 query rows; fewer go to the Triton template's split update), measured faster
    than the Triton template on every library variant (benchmarks/RESULTS.md)."""
    if name != "attention" or spec.kind != "cuda" or spec.arch != "sm_90a":
        return ()
    try:
        return (hopper_attention(kernel, fusion, spec, prefill_only=True),)
    except ScheduleError:   # not softmax attention in the layout the kernel indexes
        return ()
