"""The score's parts of the sm_90a attention backward
(:mod:`tensorfuse.targets.cuda.hopper_attention_backward`): the mask, the score's bias or its
pointwise function and derivative as device functions, and a fragment's ``P`` and ``dS`` — what
the kernel's source says of the program's score and mask, apart from its fixed pipeline."""
from __future__ import annotations

from .expr import to_cuda, wide_tensors


def mask_code(hplan) -> str:
    """C++ of the mask at query ``i_``, key ``j_`` and the batch axes' values (``ax<k>``)."""
    base = hplan.base
    if base.mask is None:
        return "true"
    axes = element_axes(base)
    read = [(p.name, p.dims) for p in base.program.tensor_params if p.name in hplan.mask_tensors]
    return to_cuda(base.mask, {}, "the mask", axes=axes, sizes=base.sizes,
                   loads={n: f"t_{n}" for n in hplan.mask_tensors}, clamp_loads=True,
                   wide=wide_tensors(read, base.sizes))


def element_axes(base) -> dict:
    """The C++ names of a fragment element's axes: the batch axes' values (``ax<k>``), its query
    ``i_`` and key ``j_``."""
    axes = {a.name: f"ax{k}" for k, a in enumerate(base.batch)}
    axes.update({base.row.name: "i_", base.col.name: "j_"})
    return axes


def batch_values(base) -> str:
    """The batch axes' values (``ax<k>``) of the flattened query batch index ``bh``."""
    lines, rest = [], "bh"
    for k in reversed(range(len(base.batch))):
        n = base.extent(base.batch[k])
        lines.append(f"    const int ax{k} = ({rest}) % {n};\n    (void)ax{k};")
        rest = f"({rest}) / {n}"
    return "\n".join(lines)


def pointwise_code(hplan, e) -> str:
    """C++ of an expression of ``q·kᵀ`` (``qk``), the axes, scalars and sizes."""
    base = hplan.base
    return to_cuda(e, {base.qk: "qk"}, "the score", axes=element_axes(base), sizes=base.sizes)


def score_functions(c) -> str:
    """``tf_bias2``: the score's bias at query ``i_``, key ``j_``, in base 2 — where the plan
    has one (the kernel without is the same source as before there were biases); or, for a
    pointwise score, ``tf_score2`` (the score in base 2) and ``tf_dscore`` (its derivative)."""
    if c.hplan.score is not None:
        return f"""// The score of q·kᵀ at query i_, key j_, in base 2, and its derivative in q·kᵀ.
__device__ __forceinline__ float tf_score2(float qk, int bh, int i_, int j_{c.extra_params}) {{
{batch_values(c.base)}
  return ({pointwise_code(c.hplan, c.hplan.score)}) * 1.4426950408889634f;
}}
__device__ __forceinline__ float tf_dscore(float qk, int bh, int i_, int j_{c.extra_params}) {{
{batch_values(c.base)}
  return {pointwise_code(c.hplan, c.hplan.derivative)};
}}
"""
    if c.hplan.bias is None:
        return ""
    bias = to_cuda(c.hplan.bias, {}, "the score's bias", axes=element_axes(c.base),
                   sizes=c.base.sizes)
    return f"""// The score's bias at query i_, key j_, in base 2 (the part of a head's that does not depend
// on the element is computed once a visit: the compiler hoists it out of the fragment's loop).
__device__ __forceinline__ float tf_bias2(int bh, int i_, int j_{c.extra_params}) {{
{batch_values(c.base)}
  return ({bias}) * 1.4426950408889634f;
}}
"""


# a fragment element's key and query (of its register r and query column c)
_INDEX = "const int j_ = key_lo + 8 * ((r % 4) / 2), i_ = mb * BM + c;"


def _dropped(c) -> str:
    """P made 0 where the mask drops the element or it is past the keys."""
    return f"if (j_ >= N_ || !tf_kept(bh, i_, j_{c.extra_args})) p = 0.0f;"


def probability(c) -> str:
    """A fragment element's P: ``exp2(S₂ − LSE₂)``, 0 where the mask drops it or past the keys;
    with a bias, ``S₂`` is ``q·kᵀ · scale2 + tf_bias2(…)``."""
    index, kept = _INDEX, _dropped(c)
    if c.hplan.bias is None:   # the element's indices only where the mask is evaluated
        return f"""        float p = tf_exp2(st[r] * scale2 - ls[c]);
        if ((LISTS && partial) || edge) {{
          {index}
          {kept}
        }}"""
    return f"""        {index}
        float p = tf_exp2(st[r] * scale2 + tf_bias2(bh, i_, j_{c.extra_args}) - ls[c]);
        if ((LISTS && partial) || edge) {{
          {kept}
        }}"""


def probabilities_and_ds(c) -> str:
    """P of the visit's fragment (``st``), then, once dPᵀ is in, ``dS_raw`` (``dp``), both
    packed for the products. A pointwise score packs P as it is made and keeps
    ``P · ∂S/∂(q·k)`` in its place (its derivative needs ``q·kᵀ``, which P overwrites)."""
    ds_of = "st[r] * (dp[r] - dl[c]) * factor"
    if c.hplan.score is None:
        made = f"""      #pragma unroll
      for (int r = 0; r < BM / 2; ++r) {{
        const int c = 8 * (r / 4) + col_lo + (r % 2);
{probability(c)}
        st[r] = p;
      }}"""
    else:
        ds_of = "st[r] * (dp[r] - dl[c])"
        made = f"""      uint4 pa[BM / 16];
      #pragma unroll
      for (int u = 0; u < BM / 16; ++u) {{
        float pr[8];
        #pragma unroll
        for (int e = 0; e < 8; ++e) {{
          const int r = 8 * u + e, c = 8 * (r / 4) + col_lo + (r % 2);
          {_INDEX}
          const float qk = st[r];
          float p = tf_exp2(tf_score2(qk, bh, i_, j_{c.extra_args}) - ls[c]);
          if ((LISTS && partial) || edge) {{
            {_dropped(c)}
          }}
          pr[e] = p;
          st[r] = p == 0.0f ? 0.0f : p * tf_dscore(qk, bh, i_, j_{c.extra_args});
        }}
        pa[u] = make_uint4(tf_pack(pr[0], pr[1]), tf_pack(pr[2], pr[3]), tf_pack(pr[4], pr[5]),
                           tf_pack(pr[6], pr[7]));
      }}"""
    packed = "uint4 pa[BM / 16], da[BM / 16];" if c.hplan.score is None else "uint4 da[BM / 16];"
    pack_p = "" if c.hplan.score is not None else packed_pairs("pa", "st")
    return f"""      const float* ls = lse_s + s * BM;
      const float* dl = delta_s + s * BM;
{made}
      tf_wgmma_wait<0>();
      tf_fence_regs(dp);
      {packed}
      #pragma unroll
      for (int r = 0; r < BM / 2; ++r) {{
        const int c = 8 * (r / 4) + col_lo + (r % 2);
        // a masked element's P is 0; keep its dS at 0 even where Δ is not a number (a row
        // the mask empties: its output is 0/0)
        dp[r] = st[r] == 0.0f ? 0.0f : {ds_of};
      }}
      #pragma unroll
      for (int u = 0; u < BM / 16; ++u) {{
{pack_p}{packed_pairs("da", "dp")}      }}
"""


def packed_pairs(dst: str, src: str) -> str:
    """``dst[u]``: the eight 16-bit pairs of ``src``'s elements ``8u…8u + 7``."""
    return (f"        {dst}[u] = make_uint4(tf_pack({src}[8 * u], {src}[8 * u + 1]), "
            f"tf_pack({src}[8 * u + 2], {src}[8 * u + 3]),\n"
            f"                           tf_pack({src}[8 * u + 4], {src}[8 * u + 5]),\n"
            f"                           tf_pack({src}[8 * u + 6], {src}[8 * u + 7]));\n")
