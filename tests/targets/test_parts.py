"""The Hopper kernels' parts (``targets/cuda/parts``): each part's ``reads`` names fields its
kernel's context or plan has (so ``tensorfuse show --parts`` stays true as plans change), every
fragment a kernel's source is made of belongs to one of its parts, and a plan naming a part its
kernel lacks is refused with the parts it has."""
from __future__ import annotations

import fnmatch

import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.targets.cuda import (gemm_chain_wgmma, hopper_attention,
                                     hopper_attention_device, hopper_gemm)
from tensorfuse.targets.cuda.parts import named_parts

ATTENTION = dict(B=2, H=16, M=4096, N=4096, D=128)
GEMM = dict(M=1024, K=1024, N=1024)
FFN = dict(M=128, K=4096, N=14336, O=4096)


def _resolves(context, path: str) -> bool:
    """``path`` (``a.b``, ``*`` a wildcard of the last name) on the context or its plan."""
    for obj in (context, context.plan):
        *head, last = path.split(".")
        for name in head:
            obj = getattr(obj, name, None)
        if obj is not None and any(fnmatch.fnmatch(n, last) for n in dir(obj)):
            return True
    return False


def _contexts():
    hopper = tf.compile(K.causal_attention, "cuda:sm_90a").for_sizes(**ATTENTION)
    made = hopper.launches(**ATTENTION)
    yield hopper_attention, hopper_attention.AttentionSource(made.plan, made.knobs, 128, True)
    from tests.schedule_templates.permuted_layouts import bshd_causal   # the strided parts

    strided = tf.compile(bshd_causal, "cuda:sm_90a").for_sizes(**ATTENTION).launches(**ATTENTION)
    yield hopper_attention, hopper_attention.AttentionSource(strided.plan, strided.knobs, 128,
                                                             True)
    gemm = tf.compile(K.matmul, "cuda:sm_90a").for_sizes(**GEMM).launches(**GEMM)
    yield hopper_gemm, hopper_gemm.GemmSource(gemm.plan, gemm.knobs)
    sch = tf.schedule(K.ffn_gelu, target="cuda:sm_90a")
    sch.cluster_distribute("n")
    chain = sch.compile().launches(**FFN)
    from tensorfuse.schedule_templates.gemm_chain_plan import wgmma_layout
    from tensorfuse.targets.cuda.gemm_chain import activation_code

    yield gemm_chain_wgmma, gemm_chain_wgmma.ChainSource(
        chain.plan, chain.knobs, wgmma_layout(chain.plan, chain.knobs, FFN["M"]),
        activation_code(chain.plan))


@pytest.mark.parametrize("module, context", list(_contexts()),
                         ids=["attention", "attention_strided", "gemm", "gemm_chain"])
def test_parts_read_what_their_kernel_has_and_cover_its_source(module, context):
    for part in module.PARTS:
        missing = [r for r in part.reads if not _resolves(context, r)]
        assert not missing, (part.name, missing)
        assert all(fragment(context) for fragment in part.fragments)   # each emits text
    owned = {f for part in module.PARTS for f in part.fragments}
    fragments = getattr(module, "KERNEL", None) or module.BODY
    if module is hopper_attention:
        fragments += hopper_attention_device.FUNCTIONS
    in_parts = [f for f in fragments if ".parts." in f.__module__]
    assert in_parts and set(in_parts) == owned   # every part's fragment placed, none unowned
    named = named_parts(module.PARTS, context.plan.parts)   # one part of each role the kernel has
    assert [p.role for p in named] == list(dict.fromkeys(p.role for p in module.PARTS))


def test_a_part_the_kernel_lacks_is_refused_with_the_parts_it_has():
    with pytest.raises(ValueError, match="no part load 'strided_cp_async'.*tma_boxes"):
        named_parts(hopper_attention.PARTS, (("load", "strided_cp_async"),))
