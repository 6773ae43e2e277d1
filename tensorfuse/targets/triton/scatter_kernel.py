"""The scatter-add template's kernels as a callable (``schedule_templates.scatter``): an
accumulator (f32, or the integer sum's own type) zeroed per call, the terms added into it, the
outputs written from it (a :class:`~.plan_kernel.PlanKernel`)."""
from __future__ import annotations

from dataclasses import dataclass

from ...binding import split_scalars
from ...interop import torch_dtype
from .launch import TL_SIGNATURE
from .plan_kernel import PlanKernel
from .scatter import (BINNED_BLOCK, BLOCK, bins, block, compacts, extent, grids,
                      scatter_source, scratch_shapes, slots)

ORIGIN = "scatter-add template (atomic adds into an {} accumulator)"


@dataclass(frozen=True)
class ScatterKnobs:
    """The template's one setting (what a build is keyed by beside its sizes)."""

    block: int = BLOCK


class ScatterKernel(PlanKernel):
    """A :class:`~tensorfuse.schedule_templates.scatter.ScatterPlan` run as two Triton kernels:
    the terms added into the accumulator, then the outputs written from it (a first one claims
    the slots where the plan compacts)."""

    scratch_names = ("acc",)
    suffix, main_kernel = "scatter", "terms"

    def __init__(self, plan, target, dynamic: "bool | None" = None):
        super().__init__(plan, target, dynamic)
        # (a subclass without the accumulator — the elementwise template — has no sum to type)
        self.accumulator = plan.accumulator if "acc" in self.scratch_names else None
        self.description = ORIGIN.format(self.accumulator)
        self._scratch_shapes: dict = {}

    def _knobs(self, dims: dict) -> ScatterKnobs:
        # (the elementwise template, without an accumulator, keeps its block)
        return ScatterKnobs(block(self.plan, dims)) if self.accumulator else ScatterKnobs()

    def _kernels(self, dims: dict) -> list[str]:
        return (["claims"] if compacts(self.plan, dims) else []) + ["terms", "outputs"]

    def _grids(self, dims: dict) -> list[tuple]:
        return grids(self.plan, dims)

    def _meta(self, dims: dict) -> dict:
        return dict(BLOCK_M=self._knobs(dims).block, BLOCK_N=1, BLOCK_K=1)

    @property
    def _pointers(self) -> set:
        return super()._pointers | {"owner"}

    def _arguments(self, sizes: dict) -> list[str]:
        return self.args + (["owner"] if compacts(self.plan, sizes) else [])

    def _write(self, sizes: dict, args: list[str]) -> str:
        return scatter_source(self.plan, self._name, sizes, args)

    def _signature(self) -> dict:
        return {"acc": "*" + TL_SIGNATURE[self.accumulator], "owner": "*i32"}

    def compiled(self, which: str = "terms", **dims):
        return super().compiled(which, **dims)

    def assembly(self, which: str = "terms", **dims) -> str:
        return super().assembly(which, **dims)

    def schedule_origin(self, **dims) -> str:
        """The template; at given sizes also whether its sums go through slots, or are
        counted into bins a program first."""
        dims, _ = split_scalars(self.program, dims)
        if dims and bins(self.plan, dims):
            return (f"{self.description}; each program counts {BINNED_BLOCK} terms into "
                    f"{extent(self.plan.axis, dims)} bins of its own, then adds them")
        if not dims or not compacts(self.plan, dims):
            return self.description
        return (f"{self.description}; slots for the {slots(self.plan, dims)} positions "
                f"{self.plan.index} takes, of {self.plan.axis.name}'s "
                f"{extent(self.plan.axis, dims)} elements")

    def _scratch(self, dims: dict, device) -> dict:
        """The call's buffers beside its arguments and outputs (``scatter.scratch_shapes``)."""
        import torch

        key = tuple(sorted(dims.items()))
        if key not in self._scratch_shapes:   # decided once per sizes, not on every call
            self._scratch_shapes[key] = scratch_shapes(self.plan, dims)
        shapes = self._scratch_shapes[key]
        made = {"acc": torch.zeros(shapes["acc"], device=device,
                                   dtype=torch_dtype(self.accumulator))}
        if "owner" in shapes:   # no slot claimed: the slots' count, the accumulator's rows
            made["owner"] = torch.full(shapes["owner"], shapes["acc"][0], dtype=torch.int32,
                                       device=device)
        return made
