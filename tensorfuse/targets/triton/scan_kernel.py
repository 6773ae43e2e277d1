"""The scan template's kernels as a callable (``schedule_templates.scan``): the parts' totals
where a call cuts its rows into parts, then the scan."""
from __future__ import annotations

from dataclasses import dataclass

from ...binding import split_scalars
from .launch import interpreting
from . import band_scan
from .plan_kernel import PlanKernel
from .scan import NUM_WARPS, accumulators, blocks, layout, scan_source, totals_names

# the carry's Triton type as torch names it, and as a Triton signature does
TORCH_ACCUMULATORS = {"tl.float32": "float32", "tl.int32": "int32", "tl.int64": "int64"}
TRITON_ACCUMULATORS = {"tl.float32": "fp32", "tl.int32": "i32", "tl.int64": "i64"}

ORIGIN = "scan template (blocks scanned in order, the carry of the blocks before them)"


@dataclass(frozen=True)
class ScanKnobs:
    """The tile (what a build is keyed by beside its sizes)."""

    block_m: int
    block_n: int


class ScanKernel(PlanKernel):
    """A :class:`~tensorfuse.schedule_templates.scan.ScanPlan` as one or two Triton kernels."""

    scalar_scratch = ("scan_parts", "scan_part_blocks")
    suffix, main_kernel, num_warps = "scan", "scan", NUM_WARPS

    def __init__(self, plan, target, dynamic: "bool | None" = None):
        # the parts' totals, one buffer a component of the monoid (an arg's value and index)
        self.scratch_names = (*totals_names(plan), *self.scalar_scratch)
        super().__init__(plan, target, dynamic)
        self.description = ORIGIN
        self._layouts: dict = {}

    def _layout(self, dims: dict) -> tuple[int, int, int]:
        """:func:`.scan.layout` at ``dims``, decided once per sizes (a call reads it for its
        scratch; a build for its kernels and grids)."""
        key = tuple(sorted(dims.items()))
        if key not in self._layouts:
            self._layouts[key] = layout(self.plan, dims)
        return self._layouts[key]

    def _knobs(self, dims: dict) -> ScanKnobs:
        return ScanKnobs(*blocks(self.plan, dims))

    def _kernels(self, dims: dict) -> list[str]:
        return (["totals"] if self._layout(dims)[0] > 1 else []) + ["scan"]

    def _grids(self, dims: dict) -> list[tuple]:
        cut, _, programs = self._layout(dims)
        return [(programs, cut)] * len(self._kernels(dims))

    def _meta(self, dims: dict) -> dict:
        block_m, block_n = blocks(self.plan, dims)
        return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=1)

    def _write(self, sizes: dict, args: list[str]) -> str:
        return scan_source(self.plan, self._name, sizes, args, interpreting())

    def _scratch(self, dims: dict, device) -> dict:
        """The parts' totals (a row of the plan's ``max_parts`` per row of the result; one
        element where the rows are not cut: not read), the parts and the blocks of each."""
        import torch

        cut, each, programs = self._layout(dims)
        rows = programs * blocks(self.plan, dims)[0] if cut > 1 else 0
        size = max(1, rows * self.plan.max_parts)
        made = {name: torch.empty(size, dtype=getattr(torch, TORCH_ACCUMULATORS[acc]),
                                  device=device)
                for name, acc in zip(totals_names(self.plan), accumulators(self.plan))}
        return {**made, "scan_parts": cut, "scan_part_blocks": each}

    def _signature(self) -> dict:
        return {**{name: "*" + TRITON_ACCUMULATORS[acc] for name, acc in
                   zip(totals_names(self.plan), accumulators(self.plan))},
                "scan_parts": "i32", "scan_part_blocks": "i32"}

    def schedule_origin(self, **dims) -> str:
        """The template; at given sizes also how its rows are cut."""
        dims, _ = split_scalars(self.program, dims)
        if not dims:
            return self.description
        cut, each, programs = self._layout(dims)
        block_m, block_n = blocks(self.plan, dims)
        return (f"{self.description}; tiles of {block_m} rows × {block_n} positions, "
                f"{programs} programs along the rows" +
                (f", each row cut into {cut} parts of {each * block_n} positions (their totals "
                 "first)" if cut > 1 else ""))

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        dims, _ = split_scalars(self.program, {**dims, **(scalars or {})})
        return self.plan.describe() + (f"\n  {self.schedule_origin(**dims)}" if dims else "")


@dataclass(frozen=True)
class BandKnobs:
    """The tile: segments × the band's width to a power of two × rows side by side."""

    segments: int
    block_n: int
    rows: int


BAND_ORIGIN = "band template (each window a suffix scan and a prefix scan of segments)"


class BandKernel(PlanKernel):
    """A :class:`~tensorfuse.schedule_templates.bands.BandPlan` as one Triton kernel."""

    suffix, main_kernel, num_warps = "band", "band", band_scan.NUM_WARPS

    def __init__(self, plan, target, dynamic: "bool | None" = None):
        super().__init__(plan, target, dynamic)
        self.description = BAND_ORIGIN

    def _knobs(self, dims: dict) -> BandKnobs:
        return BandKnobs(*band_scan.blocks(self.plan))

    def _kernels(self, dims: dict) -> list[str]:
        return ["band"]

    def _grids(self, dims: dict) -> list[tuple]:
        return [band_scan.programs(self.plan, dims)]

    def _meta(self, dims: dict) -> dict:
        segments, block_n, rows = band_scan.blocks(self.plan)
        return dict(BLOCK_M=segments, BLOCK_N=block_n, BLOCK_K=rows)

    def _write(self, sizes: dict, args: list[str]) -> str:
        return band_scan.band_source(self.plan, self._name, sizes, args)

    def _scratch(self, dims: dict, device) -> dict:
        return {}

    def schedule_origin(self, **dims) -> str:
        segments, block_n, rows = band_scan.blocks(self.plan)
        return (f"{self.description}; tiles of {segments} segments × {self.plan.width} "
                f"positions (as {block_n})" + (f" × {rows} rows side by side" if rows > 1
                                               else ""))

    def describe_plan(self, scalars: dict | None = None, **dims) -> str:
        return self.plan.describe() + f"\n  {self.schedule_origin()}"
