"""GEMMs with computed sides or outer factors, handed to the Hopper GEMM as two stages.

The Hopper GEMM copies its operands from memory with TMA and multiplies them as stored, so it
takes a sum of two loads (:mod:`.hopper_gemm_plan`). A GEMM a user writes often multiplies more:
a normalised row (``Σ_k x[i, k] · rsqrt(ms[i]) · g[k] · w[j, k]``: RMSNorm written into the
linear layer), a scaled operand, an activation's derivative. The contraction template takes
those (:mod:`.contraction_plan`): the factors that read no contracted axis leave the sum (an
outer factor: one multiply of the accumulator), and a computed side is stored once before the
tiles, rounded to the tensor cores' type (its staged plan) — then runs its own Triton tiles,
which trail the Hopper GEMM on sm_90a (a norm then a linear layer of 8192 × 4096 × 4096 in one
sum: 0.85× ``torch.compile``, ``benchmarks.unlisted_kernels``).

:func:`hopper_gemm_stages` makes that staged plan two programs instead: one writing the
computed sides (an elementwise kernel), and the GEMM of the stored sides with the outer factors
and the outputs' expressions in its epilogue — a program :func:`.hopper_gemm_plan.plan_hopper_gemm`
takes. Both are stages (:class:`.stages.Stage`) that ``tf.compile`` runs in turn, each with its
own template; the same rounding as the contraction template's staged sides.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

from ..algebra import inline_elementwise
from ..algebra.exprs import mul, substitute
from ..dsl.expr import Expr, Ref
from ..dsl.monoid import SUM
from ..dsl.program import Compute, Program
from ..errors import ScheduleError
from .contraction import contracted_depth
from .contraction_plan import ContractionPlan, plan_contraction
from .hopper_gemm_plan import plan_hopper_gemm
from .stages import NotStageable, Stage, plan_stages, program_of


class GemmStagePlan(NamedTuple):
    """Stages around the Hopper GEMM: the ``stages`` in order, ``gemm`` the index of the one the
    Hopper GEMM runs, ``pays(sizes)``: whether storing between them pays at those sizes, and
    ``why`` the program is staged (for ``schedule_origin()``)."""

    stages: tuple[Stage, ...]
    gemm: int
    pays: Callable[[dict], bool]
    why: str


def hopper_gemm_stages(program: Program) -> GemmStagePlan | None:
    """The stages (computed sides, then the GEMM on the Hopper GEMM) of a GEMM-shaped
    ``program`` with computed sides or outer factors (storing pays where :func:`stores_pay`
    says); None where the contraction plan has pairwise reductions or reductions over the
    columns, where the program needs neither stage (the Hopper GEMM takes it whole), or where
    the Hopper GEMM does not take the GEMM stage."""
    try:
        plan = plan_contraction(program)
    except ScheduleError:
        return None
    if plan.pairwise or plan.over_columns:
        return None
    staged = plan.staging or plan
    if plan.staging is None and all(p.outer is None for p in plan.products):
        return None   # sums of two loads: the Hopper GEMM plans the program itself
    try:
        gemm = _gemm_program(program, staged)
        if not _chosen_hopper_gemm(gemm):
            return None
        sides = _sides_program(program, staged) if staged.staged else None
    except (ScheduleError, NotStageable):
        return None
    stages = []
    if sides is not None:
        stages.append(Stage(sides, tuple(p.name for p in sides.params),
                            tuple(c.name for c in sides.outputs), templated=True))
    stages.append(Stage(gemm, tuple(p.name for p in gemm.params),
                        tuple(c.name for c in gemm.outputs), templated=True))
    return GemmStagePlan(tuple(stages), len(stages) - 1, functools.partial(stores_pay, plan),
                         "its GEMM reads computed or scaled sides: those stored first, for the "
                         "Hopper GEMM")


def _chosen_hopper_gemm(gemm: Program) -> bool:
    """Whether tf.compile would run ``gemm`` on the Hopper GEMM (a :class:`ScheduleError` where
    the Hopper GEMM does not take it; :func:`.hopper_gemm.chosen_automatically`): a stage it
    would leave to the contraction is no reason to cut the program, which the contraction takes
    whole."""
    from .hopper_gemm import chosen_automatically

    return chosen_automatically(plan_hopper_gemm(gemm))


# The contraction template runs a GEMM whose columns it then reduces at ~0.7× the Hopper GEMM's
# rate (a bilinear form of 4096 rows, 4096² weights: 482 TFLOP/s, torch.compile's cuBLAS GEMM
# 681 on the H200, ``benchmarks.unlisted_kernels``). Storing the GEMM's f32 columns instead costs
# 8 bytes an element (written, read) against its 2·K flops: at 4 TB/s and 680 TFLOP/s it pays
# from K ≈ 1600.
COLUMNS_STORED_FROM = 2048


def hopper_gemm_then_columns(program: Program, target) -> GemmStagePlan | None:
    """The stages of a GEMM whose columns are then reduced (``Σ_j (Σ_k x[i, k] · w[k, j]) ·
    y[i, j]``: a bilinear form per row) — the GEMM as a stage of its own, its f32 values stored
    (the Hopper GEMM takes it), then the reductions over its columns (the floor's cut,
    :func:`.stages.plan_stages`: the row template takes them) — and ``pays(sizes)``: the
    contracted extent is at least :data:`COLUMNS_STORED_FROM`. None where the contraction plan
    reduces no columns, or the Hopper GEMM does not take the first stage."""
    from .auto import takes_stage

    try:
        plan = plan_contraction(program)
    except ScheduleError:
        return None
    if not plan.over_columns or plan.pairwise:
        return None
    try:
        stages = plan_stages(program, lambda sub: sub is not program and takes_stage(sub, target))
        if not _chosen_hopper_gemm(stages[0].program):
            return None
    except (ScheduleError, NotStageable):
        return None
    if not all(s.templated for s in stages):
        return None
    return GemmStagePlan(stages, 0, lambda sizes: contracted_depth(plan, sizes) >=
                         COLUMNS_STORED_FROM, "its GEMM's columns are reduced after it: the GEMM "
                         "stored by the Hopper GEMM first")


# the Hopper GEMM's tiles are 128 rows × 256 columns (its defaults at these sizes): a stored
# rows side is read again by each column tile, a columns side by each row tile — by side, the
# extent of a tile along the other side's free axis
TILE = {"rows": 256, "cols": 128}


def stores_pay(plan: ContractionPlan, sizes: dict) -> bool:
    """Whether storing the computed sides pays at ``sizes``: each is read by several tiles along
    the other side's free axis (a side read by one — a GEMM of a few columns — is cheaper
    computed in the contraction template's tiles, as it chooses there); true where nothing is
    stored (outer factors only)."""
    if plan.staging is None:
        return True
    rows, cols = (plan.extent(a, sizes) for a in (plan.rows, plan.cols))
    other = {"rows": cols, "cols": rows}
    return all(other[s.side] > TILE[s.side] for s in plan.staging.staged)


def _sides_program(program: Program, plan: ContractionPlan) -> Program:
    """The computed sides as outputs of one elementwise program, each in its tensor-core type
    and its tile's layout (:class:`.contraction_plan.StagedSide`)."""
    outputs = [Compute(s.param.name, s.axes, (s.value,), (s.param.dtype,), is_output=True)
               for s in plan.staged]
    return program_of(f"{program.name}_sides", program, outputs, outputs)


def _gemm_program(program: Program, plan: ContractionPlan) -> Program:
    """Each product's sum of its two stored sides (f32), and the program's outputs computed
    from them: a sum that was an output becomes ``outer · sum`` under its own name; outputs
    that read sums read ``outer · sum`` in their place."""
    sums = {p.name: Compute(f"{p.name}_product", c.axes, (mul(p.rows_side, p.cols_side),),
                            ("f32",), SUM, c.over, c.loc)
            for p in plan.products for c in [program.compute(p.name)]}
    scaled = {p.name: mul(p.outer, Ref(sums[p.name])) if p.outer is not None
              else Ref(sums[p.name]) for p in plan.products}

    def read(node: Expr):
        return scaled.get(node.compute.name) if isinstance(node, Ref) else None

    outputs = []
    for out in program.outputs:
        body = Ref(out) if out.name in scaled else inline_elementwise(out.bodies[0])
        outputs.append(Compute(out.name, out.axes, (substitute(body, read),), out.dtypes,
                               loc=out.loc, is_output=True))
    return program_of(f"{program.name}_gemm", plan.program, [*sums.values(), *outputs],
                      outputs)
