"""Triton code generation for fused chains (DESIGN §4b): the GPU backend of the templates."""
from .rowtile import Knobs, RowTilePlan, block_k, grid, kernel_source, plan_rowtile

__all__ = ["Knobs", "RowTilePlan", "block_k", "grid", "kernel_source", "plan_rowtile"]
