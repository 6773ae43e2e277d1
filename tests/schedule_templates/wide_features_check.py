"""Attention over head dims past one tile's block (:mod:`tensorfuse.schedule_templates.
feature_chunks`), as ``tf.compile`` makes it for sm_90a, run by Triton's interpreter against
float64 references in torch: DeepSeek's absorbed latent attention at decode (every head over one
latent cache, q·k over 576 and p·v over 512, in chunks of 64) with few keys (one part), with
enough for the keys to be split over programs (the split update's merge, a chunk at a time) and
over a paged cache (its values a view of the keys' first 512 features), and
causal attention over 300 / 264 features (chunks of 32 whose last is ragged) with a per-feature
gain on the output, and a softmax of given scores applied to values of 520 features (chunks of 32,
the last ragged; no product on the rows' side). Ragged rows and keys, values over a wide range; outputs poisoned (NaN).
Prints each case's relative error as JSON.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.wide_features_check SEED
"""
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels.attention import softmax_attend
from benchmarks.unlisted_kernels import latent_attention_decode, paged_latent_decode
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


@tf.kernel
def wide_causal_gain(q: T.Tensor["B", "H", "S", "DQ", "bf16"],
                     k: T.Tensor["B", "H", "S", "DQ", "bf16"],
                     v: T.Tensor["B", "H", "S", "DV", "bf16"],
                     gain: T.Tensor["DV", "f32"], scale: T.f32):
    """Causal attention over wide head dims, each output feature scaled by its gain."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.where(j <= i, T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale, -T.inf)
    return T.cast(softmax_attend(s, v[b, h, j, e], j) * gain[e], "bf16")


@tf.kernel
def attend_scores(s: T.Tensor["B", "M", "N", "f32"], v: T.Tensor["B", "N", "DV", "bf16"]):
    """Given scores (a stage of the floor's on an A100, whose shared memory does not hold the
    query tile's chunks): the softmax over them and p·v over wide values, no product on the
    rows' side."""
    b, i, j, e = T.axes("b i j e")
    return T.cast(softmax_attend(s[b, i, j], v[b, j, e], j), "bf16")


def attend_scores_case(generator, B=2, M=19, N=45, DV=520, width=4.0):
    s = torch.randn(B, M, N, generator=generator) * width
    v = (torch.randn(B, N, DV, generator=generator) * width).bfloat16()
    return dict(s=s, v=v), torch.softmax(s.double(), -1) @ v.double()


def paged_latent_case(generator, B=2, H=16, PAGE=16, NP=5, PAGES=13, DQ=576, DV=512,
                      width=3.0):
    q = (torch.randn(B, H, DQ, generator=generator) * width).bfloat16()
    pages = (torch.randn(PAGES, PAGE, DQ, generator=generator) * width).bfloat16()
    table = torch.randperm(PAGES, generator=generator)[:B * NP].reshape(B, NP).int()
    scale = DQ ** -0.5 / width
    keys = pages[table.long()].reshape(B, NP * PAGE, DQ).double()
    s = torch.einsum("bhd,bnd->bhn", q.double(), keys) * scale
    want = torch.einsum("bhn,bne->bhe", torch.softmax(s, -1), keys[..., :DV])
    return dict(q=q, k_pages=pages, v_pages=pages[..., :DV], table=table, scale=scale), want


def latent_decode_case(generator, B=2, H=20, N=77, DQ=576, DV=512, width=3.0):
    q = (torch.randn(B, H, DQ, generator=generator) * width).bfloat16()
    k = (torch.randn(B, N, DQ, generator=generator) * width).bfloat16()
    v = (torch.randn(B, N, DV, generator=generator) * width).bfloat16()
    scale = DQ ** -0.5 / width
    s = torch.einsum("bhd,bnd->bhn", q.double(), k.double()) * scale
    want = torch.einsum("bhn,bne->bhe", torch.softmax(s, -1), v.double())
    return dict(q=q, k=k, v=v, scale=scale), want


def latent_decode_split_case(generator):
    """Keys enough for parts (300 in blocks of 32 over 5 parts: the decode's split update, the
    template's kernel and its merge kernel)."""
    return latent_decode_case(generator, B=1, H=16, N=300)


def wide_causal_case(generator, B=1, H=2, S=70, DQ=300, DV=264, width=2.0):
    q, k = ((torch.randn(B, H, S, DQ, generator=generator) * width).bfloat16() for _ in range(2))
    v = (torch.randn(B, H, S, DV, generator=generator) * width).bfloat16()
    gain = torch.rand(DV, generator=generator) * 4 - 2
    scale = DQ ** -0.5
    s = q.double() @ k.double().transpose(-1, -2) * scale
    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.softmax(s, -1) @ v.double() * gain.double()
    return dict(q=q, k=k, v=v, gain=gain, scale=scale), want


CASES = {"latent_decode": (latent_attention_decode, latent_decode_case),
         "latent_decode_split": (latent_attention_decode, latent_decode_split_case),
         "wide_causal_gain": (wide_causal_gain, wide_causal_case),
         "attend_scores": (attend_scores, attend_scores_case),
         "paged_latent_decode": (paged_latent_decode, paged_latent_case)}


def split_template(kernel, **knobs):
    """The attention template on ``kernel`` with its keys split over parts (``knobs``: the
    template's), as a tuned record runs it: the defaults leave a decode whose features are in
    chunks to the floor's stages (:func:`tensorfuse.schedule_templates.attention.
    chunked_split_refusal`)."""
    sch = tf.schedule(kernel, "cuda:sm_90a")
    sch.rolling_update("m", "out_sum", "out_sum_2", axis="j")
    sch.apply_template("attention", **knobs)
    return sch.compile()


def made(name: str, kernel):
    """The kernels checked: ``tf.compile``'s, but the split decode's template (its parts merged
    by a kernel of their own, a program per chunk of p·v's features)."""
    if name == "latent_decode_split":
        return split_template(kernel, tile_m=16, tile_n=32, splits=5)
    return interpreted(kernel)


if __name__ == "__main__":
    poisoned_main(CASES, made)
