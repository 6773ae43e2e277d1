"""The score of the warp-specialised attention kernel (:mod:`.hopper_attention`) as C++: the
program's expression on a fragment's elements (or, where the plan split it, ``qk`` and a bias
linear in the key index), the mask of a partial block, the factor that takes scores to base 2,
and a key-linear bias's once-a-tile coefficient."""
from __future__ import annotations

from ...algebra.exprs import nodes
from ...dsl.expr import Load
from .expr import converted_indices, to_cuda


def _names(plan) -> tuple[dict, dict]:
    """The score's axis names → the kernel's C++ names (``b``, ``h``, ``i_``, ``j_``), and the
    tensors it reads → theirs."""
    axes = {name: {"b": "b", "h": "h", "0": "i_", "j": "j_"}[role]
            for name, role in plan.chain.score_axes}
    return axes, {t: f"t_{t}" for t, _ in plan.tensors}


def _factor(plan) -> str:
    """C++ of the scale the plan folds into exp2."""
    axes, loads = _names(plan)
    return to_cuda(plan.scale, {}, "the scale", axes=axes, loads=loads, wide=plan.wide)


def score_expressions(plan) -> tuple[str, str, str, str, str]:
    """C++ for the score before its scale (of ``qk``, ``b``, ``h``, ``i_``, ``j_``), the
    statement masking it (``v``) in a partial block, the once-per-CTA factor ``scale2`` that
    takes the score to base 2 (the program's scale times log2 e where the plan folded it, else
    log2 e), which the softmax applies in the exponent's FFMA, and the statement a block's score
    begins with. With a key-linear bias (``plan.key_bias``, κ) the score is written
    ``qk · FOLD_A + κ · FOLD_C · j`` — ``FOLD_A = 1, FOLD_C = 1 / scale`` and the scale in
    ``scale2`` where the scale is positive (else ``FOLD_A = scale``, ``FOLD_C = 1``, ``scale2 =
    log2 e``): κ · FOLD_C once a tile (``tf_key_bias``), its value at the block's first column
    once a block, an FFMA an element."""
    chain = plan.chain
    axes, loads = _names(plan)
    begin = ""
    if plan.key_bias is not None:
        scale = f"({_factor(plan)} > 0.0f ? ({_factor(plan)}) * TF_LOG2E : TF_LOG2E)"
        begin = ("  const float kc0_ = kc_ * (float)(j0_), fold_a_ = FOLD_A;   // the bias at the "
                 "fragment's first column (kc_: its coefficient times FOLD_C, once a tile)")
        score = "fmaf(qk, fold_a_, fmaf(kc_, (float)(dj_), kc0_))"
    elif plan.scale is not None:
        scale = f"({_factor(plan)} * TF_LOG2E)"
        score = "qk"
    else:
        scale = "TF_LOG2E"
        offsets = {name: {"i_": "di_", "j_": "dj_"}[v] for name, v in axes.items()
                   if v in ("i_", "j_")}
        at_base = {name: {"i_": "i0_", "j_": "j0_"}.get(v, v) for name, v in axes.items()}
        converted = converted_indices(plan.score, offsets, at_base, {}, loads)
        tile = plan.score_tile or plan.key_strip
        if tile is not None:   # read from the block's tile (or strip) in shared memory
            converted.update({id(n): "tb_" for n in nodes(plan.score) if isinstance(n, Load)
                              and n.param.name == tile.name})
        written = to_cuda(plan.score, {chain.dot: "qk"}, "the score", axes, loads=loads,
                          written=converted, clamp_loads=True, wide=plan.wide)
        score = f"({written})"
    if plan.mask is not None and any(isinstance(n, Load) for n in nodes(plan.mask)):
        # a mask reading tensors (document ids) at indices clamped into them (``clamp_loads``),
        # and evaluated for every element — not behind `j_ < N_`, which kept the compiler from
        # sharing the loads of one row's or one column's ids between the fragment's elements
        mask = to_cuda(plan.mask, {}, "the mask", axes, loads=loads, clamp_loads=True,
                       wide=plan.wide)
        masked = f"    if (MASKED) v = ((j_ < N_) & ({mask})) ? v : -INFINITY;"
    else:
        mask = "true" if plan.mask is None else to_cuda(plan.mask, {}, "the mask", axes,
                                                         loads=loads, wide=plan.wide)
        masked = f"    if (MASKED) v = (j_ < N_ && ({mask})) ? v : -INFINITY;"
    return score, masked, scale, begin, _fold_factors(plan)


def key_bias_function(plan, extra_params: str) -> str:
    """``tf_key_bias(b, h, …)``: the key-linear bias's coefficient times ``FOLD_C``, which
    the consumers compute once a tile (in the block loop its exp2 and division — ALiBi's slope —
    held up every block's score); 0 without one."""
    axes, loads = _names(plan)
    kappa = "0.0f" if plan.key_bias is None else to_cuda(plan.key_bias, {}, "the score",
                                                         axes=axes, loads=loads, wide=plan.wide)
    return (f"__device__ __forceinline__ float tf_key_bias(int b, int h{extra_params}) {{\n"
            f"  return ({kappa}) * FOLD_C;\n}}\n")


def _fold_factors(plan) -> str:
    """``#define``s of ``FOLD_A``, ``FOLD_C`` (:func:`score_expressions`; 1 and 1 without a
    key-linear bias), written of the kernel's scalar arguments where they are used rather than
    kept in registers through the loop (the consumers have none to spare)."""
    if plan.key_bias is None:
        return "#define FOLD_A 1.0f\n#define FOLD_C 1.0f"
    factor = _factor(plan)
    return (f"#define FOLD_A ({factor} > 0.0f ? 1.0f : ({factor}))\n"
            f"#define FOLD_C ({factor} > 0.0f ? 1.0f / ({factor}) : 1.0f)")
