"""What the kernels made of other kernels share (:class:`~tensorfuse.staged.StagedKernel`,
:class:`~tensorfuse.flat_kernel.FlatSweepKernel`): where a call's arrays must be, and filling the
user's ``out=`` arrays from the results."""
from __future__ import annotations

from .targets import TargetSpec
from .targets.triton.launch import interpreting


def call_device(target: TargetSpec) -> str:
    """Where a call's arrays must be: Triton's interpreter runs a GPU target's kernels on CPU
    arrays; else a missing GPU is the first thing to report."""
    device = "cpu" if target.kind == "llvm" or interpreting() else target.kind
    if device != "cpu":
        target.device()
    return device


def filled(outs: list, results) -> object:
    """The user's ``out=`` arrays, each filled from its result (one array or a tuple, as the
    kernel returns them) unless the kernel wrote it in place (the result is the array)."""
    results = results if isinstance(results, (tuple, list)) else (results,)
    for out, result in zip(outs, results):
        if result is not out:
            out[...] = result
    return outs[0] if len(outs) == 1 else tuple(outs)
