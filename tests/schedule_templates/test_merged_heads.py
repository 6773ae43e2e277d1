"""Grouped-query attention written with its query heads as two axes (``q[b, g, r, i, d]`` over
``k[b, g, j, d]``) merged into one head axis read by the keys at ``h // R``
(:mod:`tensorfuse.schedule_templates.merged_heads`): the rewritten program and the views on the
CPU target against float64, the Hopper template's plan for sm_90a, what is left alone; the H200
run is marked ``gpu``."""
import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.dsl.program import ProgramKernel
from tensorfuse.errors import CopiedArgumentWarning
from tensorfuse.schedule_templates.lifted_kernel import MergedHeadsKernel
from tensorfuse.schedule_templates.merged_heads import merge_head_axes
from tensorfuse.targets import get_target
from benchmarks.user_kernels import gqa_causal_grouped_axes
from tests.helpers import fresh_seed, relative_error



def _merged(kernel):
    """:func:`merge_head_axes` of ``kernel``'s attention chain, as ``tf.compile`` fuses it."""
    from tensorfuse.schedule_templates.auto import choose

    _, fusion = choose(kernel.program, get_target("cuda:sm_90a"))
    return merge_head_axes(kernel.program, fusion.names, fusion.axis)


@tf.kernel
def slopes_per_head(q: T.Tensor["B", "G", "R", "S", "D", "bf16"],
                    k: T.Tensor["B", "G", "S", "D", "bf16"],
                    v: T.Tensor["B", "G", "S", "D", "bf16"], slope: T.Tensor["G", "R", "f32"]):
    """ALiBi with a slope per (g, r): a term that needs the heads apart."""
    b, g, r, i, j, d, e = T.axes("b g r i j d e")
    s = T.sum(q[b, g, r, i, d] * k[b, g, j, d], over=d) - slope[g, r] * (i - j)
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.cast(T.sum(p * v[b, g, j, e], over=j) / T.sum(p, over=j), "bf16")


def _reference(q, k, v, scale):
    B, G, R, S, D = q.shape
    s = q.double() @ k.double()[:, :, None].transpose(-1, -2) * scale
    s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v.double()[:, :, None]


def test_the_merged_program_and_views_compute_the_attention_as_written_on_the_cpu():
    """The rewritten program (compiled for the CPU) under the merging views, ragged sizes, wide
    scores, output poisoned, against float64 of the 5-D math; a q whose strides do not merge is
    copied, said once by name and reason (a CopiedArgumentWarning), and the result is right."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    merged = _merged(gqa_causal_grouped_axes)
    assert merged.describe() == ("query heads merged: G × R as GR, keys and values read at the "
                                 "group") and merged.at == {"q": 1, "out": 1}
    cpu = get_target("llvm")
    inner = tf.compile(ProgramKernel(merged.program), target=cpu)
    made = MergedHeadsKernel(gqa_causal_grouped_axes.program, merged, inner, cpu)
    B, G, R, S, D = 2, 3, 2, 37, 16
    q = (torch.randn(B, G, R, S, D, generator=g) * 3).bfloat16()
    k, v = ((torch.randn(B, G, S, D, generator=g) * 3).bfloat16() for _ in range(2))
    out = torch.full((B, G, R, S, D), float("nan"), dtype=torch.bfloat16)
    made(q, k, v, 0.25, out=out)
    assert relative_error(out, _reference(q, k, v, 0.25)) < 2e-2, seed
    assert relative_error(made(q, k, v, 0.25), _reference(q, k, v, 0.25)) < 2e-2, seed
    apart = q.transpose(1, 2).contiguous().transpose(1, 2)   # R outside G in memory
    with pytest.warns(CopiedArgumentWarning, match=r"argument q .* G and R axes are read as one"):
        got = made(apart, k, v, 0.25)
    assert relative_error(got, _reference(q, k, v, 0.25)) < 2e-2, seed


def test_tf_compile_plans_it_on_the_hopper_template_and_leaves_a_term_per_head_alone():
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    dims = dict(B=2, G=4, R=4, S=4096, D=128)
    made = tf.compile(gqa_causal_grouped_axes, target="cuda:sm_90a")
    origin = made.schedule_origin(**dims, scale=0.1)
    assert origin.startswith("query heads merged; hopper_attention"), origin
    plan = made.describe_plan(**dims, scale=0.1)
    assert "query heads merged: G × R as GR" in plan.splitlines()[0], plan
    assert _merged(slopes_per_head) is None
    # four-axis attention has nothing to merge (its query axis is never taken for a head)
    assert _merged(K.attention) is None and _merged(K.gqa_attention) is None


@pytest.mark.gpu
def test_the_merged_heads_match_float64_on_the_gpu():
    """On the H200 through ``tf.compile``: the Hopper template on the merged view, ragged length,
    outputs poisoned, against float64 (bf16: 2e-2); the gradients of q, k and v through
    autograd against float64 autograd."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    B, G, R, S, D = 2, 2, 4, 777, 128
    q = (torch.randn(B, G, R, S, D, generator=g) * 3).bfloat16()
    k, v = ((torch.randn(B, G, S, D, generator=g) * 3).bfloat16() for _ in range(2))
    want = _reference(q, k, v, 0.1)
    made = tf.compile(gqa_causal_grouped_axes)
    assert made.schedule_origin(B=B, G=G, R=R, S=S, D=D, scale=0.1).startswith(
        "query heads merged; hopper_attention")
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    made(q.cuda(), k.cuda(), v.cuda(), 0.1, out=out)
    assert relative_error(out, want) < 2e-2, seed
    # training: the forward with its log-sum-exps on the merged view, then the backward
    leaves = [t.cuda().requires_grad_() for t in (q, k, v)]
    made(*leaves, 0.1).float().backward(out.float())
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    _reference(*exact, 0.1).backward(out.double().cpu())
    for got, ref in zip(leaves, exact):
        assert relative_error(got.grad, ref.grad) < 2e-2, seed


_APART_CALLS = """
import warnings
warnings.simplefilter("ignore")
import tensorfuse as tf
from benchmarks.user_kernels import gqa_causal_grouped_axes
f = tf.compile(gqa_causal_grouped_axes, "cuda:sm_90a")
q = torch.randn(2, 4, 4, 256, 128).bfloat16()
apart = q.transpose(1, 2).contiguous().transpose(1, 2)   # R outside G in memory
k, v = (torch.randn(2, 4, 256, 128).bfloat16() for _ in range(2))
made = [tuple(f(apart, k, v, 0.088).shape) for _ in range(3)]
chosen = f.for_sizes({"scale": 0.088}, B=2, G=4, R=4, S=256, D=128)
print(json.dumps({"kernel": type(chosen).__name__, "shapes": made,
                  "maps": sorted({tuple(s) for a, s, _ in encoded if a != apart.data_ptr()})}))
"""


def test_a_q_copied_to_merge_its_heads_is_copied_on_every_call():
    """The host side of repeated calls with a q whose heads' axes do not merge as a view (the
    GPU's parts stubbed): every call hands the kernel a merged copy — its 2 · 16 heads in one
    contiguous tensor map, not one of the caller's memory — and a repeated call's fast path
    declines the signature rather than viewing it (its view would raise)."""
    from tests.helpers import run_with_the_gpu_stubbed

    found = run_with_the_gpu_stubbed(_APART_CALLS)
    assert found["kernel"] == "MergedHeadsKernel", found
    assert found["shapes"] == [[2, 4, 4, 256, 128]] * 3, found
    assert found["maps"] == [[8, 256, 128], [32, 256, 128]], found
