"""Triton code generation for fused chains (DESIGN §4b): the emitter and launcher behind the
row-tile templates. Plans come from ``schedule_templates.tile_plan``; this package writes them as
Triton source, compiles and launches them."""
from .row_grid import block_k, grid
from .rowtile import kernel_source

__all__ = ["block_k", "grid", "kernel_source"]
