"""Multi-query attention written with no head axis on its keys and values (``q[b, h, i, d]`` over
``k[b, j, d]``) run on the Hopper attention of the same program with a unit kv-head axis added
(:func:`tensorfuse.schedule_templates.packed_lift.lift_one_cache`), the caller's k and v viewed
with it: the lift and the views against float64 on the CPU, the plan for sm_90a, the H200 run
(forward and gradients) marked ``gpu``."""
import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.dsl.program import ProgramKernel
from tensorfuse.schedule_templates.lifted_kernel import LiftedKernel
from tensorfuse.schedule_templates.packed_lift import lift_one_cache
from benchmarks.user_kernels import mqa_causal_one_cache as mqa_causal
from tests.helpers import fresh_seed, relative_error

CHAIN = ("m", "l", "o")


@tf.kernel
def mqa_bshd(q: T.Tensor["B", "S", "H", "D", "bf16"], k: T.Tensor["B", "S", "D", "bf16"],
             v: T.Tensor["B", "S", "D", "bf16"], scale: T.f32):
    """The same in [B, S, H, D] queries: the mask tells the query axis from the head."""
    b, i, h, j, d, e = T.axes("b i h j d e")
    s = T.where(i >= j, T.sum(q[b, i, h, d] * k[b, j, d], over=d) * scale, -T.inf)
    return K.softmax_attend(s, v[b, j, e], j)


def _reference(q, k, v, scale, bshd=False):
    q = q.double().transpose(1, 2) if bshd else q.double()
    s = torch.einsum("bhid,bjd->bhij", q, k.double()) * scale
    S = s.shape[-1]
    s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    out = torch.einsum("bhij,bjd->bhid", torch.softmax(s, -1), v.double())
    return out.transpose(1, 2) if bshd else out


@pytest.mark.parametrize("kernel", [mqa_causal, mqa_bshd])
def test_the_lifted_program_views_the_callers_cache_on_the_cpu(kernel):
    program, inserts = lift_one_cache(kernel.program, CHAIN, "j")
    assert inserts == {"k": 1, "v": 1} and "ONE_KV" in program.dim_names()
    made = LiftedKernel(kernel.program, inserts, tf.compile(ProgramKernel(program), "llvm"),
                        tf.get_target("llvm"), ("ONE_KV",))
    g = torch.Generator().manual_seed(fresh_seed())
    B, H, S, D = 2, 3, 37, 16
    bshd = kernel is mqa_bshd
    q = (torch.randn(B, S, H, D, generator=g) if bshd else torch.randn(B, H, S, D, generator=g))
    q = (q * 3).bfloat16()
    k, v = ((torch.randn(B, S, D, generator=g) * 3).bfloat16() for _ in range(2))
    out = made(q, k, v, 0.25)
    assert relative_error(out, _reference(q, k, v, 0.25, bshd)) < 1e-2


def test_multi_query_prefill_is_planned_on_the_hopper_template():
    for kernel in (mqa_causal, mqa_bshd):
        plan = tf.compile(kernel, "cuda:sm_90a").describe_plan(B=2, H=16, S=4096, D=128)
        assert plan.splitlines()[0].endswith("lifted to four axes; hopper_attention "
                                             "(rolling_update(m, o, l, axis=j, chunk=32))"), plan
    # the head is the axis the mask does not compare with the keys
    program, _ = lift_one_cache(mqa_bshd.program, CHAIN, "j")
    k_load = [n for c in program.computes for n in _loads(c) if n.param.name == "k"][0]
    assert str(k_load.indices[1]) == "h // T.size('H')"
    # a decode's q has no query axis (the decode lift's), a grouped cache its head axis
    assert lift_one_cache(K.gqa_attention.program, CHAIN, "j") is None


def _loads(c):
    from tensorfuse.algebra.exprs import nodes
    from tensorfuse.dsl.expr import Load

    return [n for body in c.bodies for n in nodes(body) if isinstance(n, Load)]


@pytest.mark.gpu
def test_multi_query_prefill_matches_float64_on_the_gpu():
    """On the H200 through ``tf.compile``: the Hopper template on the lifted program, ragged
    length, output poisoned, against float64; then gradients through autograd (the backward
    sums the cache's gradient over the heads) against float64 autograd."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    g = torch.Generator().manual_seed(fresh_seed())
    B, H, S, D = 2, 8, 777, 128
    q = (torch.randn(B, H, S, D, generator=g) * 2).bfloat16()
    k, v = ((torch.randn(B, S, D, generator=g) * 2).bfloat16() for _ in range(2))
    made = tf.compile(mqa_causal)
    assert made.schedule_origin(B=B, H=H, S=S, D=D, scale=0.1).startswith(
        "lifted to four axes; hopper_attention")
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    made(q.cuda(), k.cuda(), v.cuda(), 0.1, out=out)
    assert relative_error(out, _reference(q, k, v, 0.1)) < 2e-2
    leaves = [t.cuda().requires_grad_() for t in (q, k, v)]
    made(*leaves, 0.1).float().backward(out.float())
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    _reference(*exact, 0.1).backward(out.double().cpu())
    for got, ref in zip(leaves, exact):
        assert relative_error(got.grad, ref.grad) < 2e-2
