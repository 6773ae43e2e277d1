"""The Hopper FFN template (``apply_template("hopper_ffn")``, and ``tf.compile``'s choice for GEMM
chains ``epilogue(act(X·W1, X·W3, …)·W2)`` on sm_90a with enough rows to fill the GPU): the chain
as two persistent GEMMs on the Hopper GEMM mainloop (:mod:`.hopper_gemm`).

The first GEMM computes every first-level product of a row tile (one accumulator per weight:
SwiGLU's gate and up projections share the rows' tiles) and applies the activation in its
epilogue, so the intermediate ``H`` leaves the chip once, already activated, in bf16; the second
GEMM reads it and applies the chain's epilogue. H's buffer is kept with the kernel between calls,
one per stream (``M·N`` bf16 at the largest M called there; a CUDA graph captures its own). A
PyTorch FFN writes ``X·W1`` (and ``X·W3``),
reads it back for the activation and writes ``H`` — two to four more passes over the largest
tensor of the block. At few rows the weights' bytes dominate; from 64 rows on this template
streams them as fast as the cluster template (``cluster_distribute``) or faster — 128-column
tiles fill the GPU where the rows fit one tile (H100, ``benchmarks.gemm``: M=64/128 3–7 % faster by
``do_bench``, within 1 % in CUDA graphs; M=200/256 1.3–1.6× faster) — and at 32 rows or fewer
``tf.compile`` keeps the cluster template (M=32: within 1–4 % either way).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..dsl.expr import user_location
from ..dsl.program import Program
from ..errors import ScheduleError
from ..interop import capturing, kept_empty, stream_key
from ..targets import TargetSpec
from ..targets.cuda.kernel import ClusterKernel, Launches
from .gemm_chain_plan import GemmChainPlan, plan_gemm_chain
from .hopper_gemm import gemm_launches
from .hopper_gemm_plan import HopperGemmPlan

INTERMEDIATE = "__intermediate"   # the name the second GEMM reads H under
FEW_ROWS = 32                      # at most this many rows: another template is preferred


@dataclass(frozen=True)
class HopperFfnPlan:
    """The chain and the two GEMMs it runs as."""

    chain: GemmChainPlan
    up: HopperGemmPlan
    down: HopperGemmPlan

    def describe(self) -> str:
        i, k, n, o = self.chain.dims
        lines = [f"hopper FFN plan: {self.chain.output}[{i}, {o}] as two persistent GEMMs, the "
                 f"intermediate [{i}, {n}] written once (bf16, activated)"]
        for label, plan in (("first", self.up), ("second", self.down)):
            lines += [f"  {label}: " + plan.describe().splitlines()[0]]
            lines += ["  " + line for line in plan.describe().splitlines()[1:3]]
        return "\n".join(lines)


@dataclass(frozen=True)
class FfnKnobs:
    up: object
    down: object

    def __str__(self) -> str:
        return f"first GEMM: {self.up}; second GEMM: {self.down}"


def plan_hopper_ffn(program: Program) -> HopperFfnPlan:
    """The chain's two GEMMs, or the :class:`ScheduleError` of the GEMM-chain recognition."""
    chain = plan_gemm_chain(program)
    i, k, n, o = chain.dims
    scalars = tuple((p.name, p.dtype) for p in program.scalar_params)
    up = HopperGemmPlan(chain.x, chain.gates, chain.gates_k_major, chain.gate_sums,
                        chain.activation, INTERMEDIATE, "bf16", "bf16", (i, k, n), ("i", "n"), (),
                        scalars)
    down = HopperGemmPlan(INTERMEDIATE, (chain.w2,), chain.w2_k_major, (chain.second,),
                          chain.epilogue, chain.output, "bf16", "bf16", (i, n, o), ("i", "o"), (),
                          scalars)
    return HopperFfnPlan(chain, up, down)


def hopper_ffn(kernel, fusion, target: TargetSpec, up: dict | None = None,
               down: dict | None = None, dependent: bool = True, tuned=None,
               prefill_only: bool = False) -> ClusterKernel:
    """A callable FFN kernel for ``kernel`` (a GEMM chain; weights stored ``[in, out]`` or, as
    ``torch.nn.Linear`` keeps them, ``[out, in]``, read as stored): knobs of
    the first and second GEMM as dicts (``up``, ``down``; see :func:`.hopper_gemm.hopper_gemm`);
    ``dependent``: the second GEMM is launched as a programmatic dependent of the first (its
    CTAs start while the first finishes and wait for it before reading H).
    ``fusion`` and ``tuned`` are accepted for the template interface; ``prefill_only``:
    ``tf.compile``'s use — prefer this kernel only above :data:`FEW_ROWS` rows."""
    if target.kind != "cuda" or target.arch != "sm_90a":
        raise ScheduleError(f"the hopper_ffn template generates sm_90a code (wgmma, TMA); the "
                            f"target is {target.name}", user_location())
    program = kernel.program if hasattr(kernel, "program") else kernel
    plan = plan_hopper_ffn(program)
    workspace: dict = {}   # (device, stream) -> the intermediate's buffer (the largest asked)

    def intermediate(M: int, N: int, device):
        """H's memory, kept between calls on each stream: its address stays put, so the second
        GEMM's tensor maps are made once; calls on two streams never share it (one's first GEMM
        would overwrite what the other's second reads). While a stream captures a CUDA graph,
        the graph's own (from its pool, replayed with it)."""
        import torch

        if capturing():
            return torch.empty((M, N), dtype=torch.bfloat16, device=device)
        key = stream_key(device)
        buffer = workspace.get(key)
        if buffer is None or buffer.numel() < M * N:
            buffer = workspace[key] = kept_empty((M * N,), torch.bfloat16, device)
        return buffer[:M * N].view(M, N)

    def layout(dims: dict) -> Launches:
        first = gemm_launches(plan.up, target, dims, dict(up or {}))
        second = gemm_launches(plan.down, target, dims, dict(down or {}), dependent=dependent)
        M, N = dims[plan.chain.dims[0]], dims[plan.chain.dims[2]]

        def run(modules, values, out, device):
            h = intermediate(M, N, device)
            first.run(modules[0], values, h, device)
            second.run(modules[1], {**values, INTERMEDIATE: h}, out, device)

        return Launches(first.source, first.entries, FfnKnobs(first.knobs, second.knobs), run,
                        f"first GEMM: {first.why}; second GEMM: {second.why}", plan,
                        more=((second.source, second.entries),), parts=first.parts)

    rows = plan.chain.dims[0]
    return ClusterKernel(program, target, layout, "hopper_ffn (two persistent GEMMs)",
                         origin="hopper_ffn template defaults" if not (up or down) else
                         "hopper_ffn template",
                         preferred=(lambda dims: dims[rows] > FEW_ROWS) if prefill_only else None)


hopper_ffn.needs_fusion = False
