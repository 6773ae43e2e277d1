"""The scan template's kernels as a callable (``schedule_templates.scan``): the parts' totals
where a call cuts its rows into parts, then the scan."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ...binding import split_scalars
from .launch import interpreting
from . import band_scan
from .plan_kernel import PlanKernel
from .scan import (NUM_WARPS, accumulators, blocks, extent, layout, row_count, scan_kernels,
                   totals_names, warps)
from . import scan_lookback
from .tile_text import assemble_source

# the carry's Triton type as torch names it, and as a Triton signature does
TORCH_ACCUMULATORS = {"tl.float32": "float32", "tl.float64": "float64", "tl.int32": "int32",
                      "tl.int64": "int64"}
TRITON_ACCUMULATORS = {"tl.float32": "fp32", "tl.float64": "fp64", "tl.int32": "i32",
                       "tl.int64": "i64"}

ORIGIN = "scan template (blocks scanned in order, the carry of the blocks before them)"


class ScanLayout(NamedTuple):
    """How a call runs: its rows' ``parts`` of ``each`` blocks, ``programs`` along the rows of
    ``block_m`` rows × ``block_n`` positions, ``warps`` a program."""

    parts: int
    each: int
    programs: int
    block_m: int
    block_n: int
    warps: int


@dataclass(frozen=True)
class ScanKnobs:
    """What a build is keyed by beside its sizes: nothing — the source takes its tile as the
    launch's constexprs (``BLOCK_M``, ``BLOCK_N``), so one source serves every tile (with
    ``dynamic=True``, one build for rows cut into parts and rows that are not)."""


class ScanKernel(PlanKernel):
    """A :class:`~tensorfuse.schedule_templates.scan.ScanPlan` as Triton kernels: one sweep
    per row where the rows fill the GPU; rows cut into parts otherwise — one kernel whose parts
    look back at the ones before them (:mod:`.scan_lookback`) where the carry fits its
    published word, else the parts' totals first, then the scan."""

    scalar_scratch = ("scan_parts", "scan_part_blocks")
    suffix, main_kernel, num_warps = "scan", "scan", NUM_WARPS

    def __init__(self, plan, target, dynamic: "bool | None" = None):
        # the parts' totals, one buffer a component of the monoid (an arg's value and index);
        # the look-back's ticket and published words
        self.scratch_names = (*totals_names(plan), "scan_flags", *self.scalar_scratch)
        super().__init__(plan, target, dynamic)
        self.description = ORIGIN
        self.looks_back = scan_lookback.looks_back(plan)
        self._layouts: dict = {}

    def _layout(self, dims: dict) -> ScanLayout:
        """How a call at ``dims`` runs: :func:`.scan.layout` and :func:`.scan.blocks`, or where
        the rows are cut into parts and the carry fits the look-back's word, one row a program
        and :mod:`.scan_lookback`'s tile and warps (rows one such part long keep them, swept by
        the scan kernel) — decided once per sizes (a call reads it for its scratch; a build for
        its kernels and grids)."""
        key = tuple(sorted(dims.items()))
        if key not in self._layouts:
            cut, each, programs = layout(self.plan, dims)
            block_m, block_n = blocks(self.plan, dims)
            made = ScanLayout(cut, each, programs, block_m, block_n, warps(self.plan))
            if cut > 1 and self.looks_back:
                block_n = max(block_n, scan_lookback.BLOCK_N)
                count = math.ceil(extent(self.plan.axis, dims) / block_n)
                each = min(scan_lookback.PART_BLOCKS, count)
                made = ScanLayout(math.ceil(count / each), each, row_count(self.plan, dims), 1,
                                  block_n, scan_lookback.NUM_WARPS)
            self._layouts[key] = made
        return self._layouts[key]

    def _looking_back(self, dims: dict) -> bool:
        return self.looks_back and self._layout(dims).parts > 1

    def _num_warps(self, dims: dict) -> int:
        return self._layout(dims).warps

    def _knobs(self, dims: dict) -> ScanKnobs:
        return ScanKnobs()

    def _kernels(self, dims: dict) -> list[str]:
        if self._looking_back(dims):
            return ["lookback"]
        return (["totals"] if self._layout(dims).parts > 1 else []) + ["scan"]

    def _grids(self, dims: dict) -> list[tuple]:
        made = self._layout(dims)
        if self._looking_back(dims):   # programs take their (rows, part) by ticket
            return [(made.programs * made.parts,)]
        return [(made.programs, made.parts)] * len(self._kernels(dims))

    def _meta(self, dims: dict) -> dict:
        made = self._layout(dims)
        return dict(BLOCK_M=made.block_m, BLOCK_N=made.block_n, BLOCK_K=1)

    def _write(self, sizes: dict, args: list[str]) -> str:
        kernels = scan_kernels(self.plan, self._name, sizes, args, interpreting())
        if self.looks_back:
            kernels.append(scan_lookback.lookback_kernel(self.plan, self._name, sizes, args,
                                                         interpreting()))
        return assemble_source(kernels)

    def _scratch(self, dims: dict, device) -> dict:
        """The parts' totals (a row of the plan's ``max_parts`` per row of the result; one
        element where the two kernels do not run: not read), the look-back's words (zeroed:
        the ticket, then a word a part of each row; one element where it does not run), the
        parts and the blocks of each."""
        import torch

        cut, each, programs, block_m, _, _ = self._layout(dims)
        rows = programs * block_m if cut > 1 else 0
        back = self._looking_back(dims)
        size = 1 if back else max(1, rows * self.plan.max_parts)
        made = {name: torch.empty(size, dtype=getattr(torch, TORCH_ACCUMULATORS[acc]),
                                  device=device)
                for name, acc in zip(totals_names(self.plan), accumulators(self.plan))}
        flags = torch.zeros(1 + rows * cut if back else 1, dtype=torch.int64, device=device)
        return {**made, "scan_flags": flags, "scan_parts": cut, "scan_part_blocks": each}

    def _signature(self) -> dict:
        return {**{name: "*" + TRITON_ACCUMULATORS[acc] for name, acc in
                   zip(totals_names(self.plan), accumulators(self.plan))},
                "scan_flags": "*i64", "scan_parts": "i32", "scan_part_blocks": "i32"}

    def schedule_origin(self, **dims) -> str:
        """The template; at given sizes also how its rows are cut."""
        dims, _ = split_scalars(self.program, dims)
        if not dims:
            return self.description
        cut, each, programs, block_m, block_n, _ = self._layout(dims)
        return (f"{self.description}; tiles of {block_m} rows × {block_n} positions, "
                f"{programs} programs along the rows" +
                (f", each row cut into {cut} parts of {each * block_n} positions " +
                 ("(one pass: each part looks back at the ones before it)"
                  if self._looking_back(dims) else "(their totals first)") if cut > 1 else ""))

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
