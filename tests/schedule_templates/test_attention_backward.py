"""The attention backward template (issue 22): its plan read off the forward's, its refusals, its
kernels run in Triton's interpreter against the backward program, their code for sm_90a, and
autograd choosing it on a GPU."""
import os
import secrets
import warnings

import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.errors import ScheduleError, TargetError
from tensorfuse.schedule_templates.attention_backward import (BackwardKnobs,
                                                              plan_attention_backward)
from tensorfuse.schedule_templates.auto import choose
from tensorfuse.targets import get_target
from tensorfuse.targets.triton.attention_backward import AttentionBackwardKernels
from tests.helpers import fresh_seed, relative_error, run_interpreted

DIMS = dict(B=2, H=16, M=1024, N=1024, D=128)


def _plan(kernel, dims=DIMS):
    _, fusion = choose(kernel.program, get_target("cuda:sm_90a"))
    return plan_attention_backward(kernel.program, fusion, dims)


def test_the_plan_reads_the_score_and_its_derivative_off_the_forward():
    plan = _plan(K.softcap_attention)
    assert (plan.q.param.name, plan.k.param.name, plan.v.param.name) == ("q", "k", "v")
    assert plan.group == 1 and plan.head_dim == 128 and plan.empty is None
    text = repr(plan.d_score)
    assert "tanh" in text and "__ds" in text and "scale" in text   # cap·tanh(s/cap)' · scale
    grouped = _plan(K.gqa_causal_attention, dict(B=2, H=32, HKV=8, M=1024, N=1024, D=128))
    assert grouped.group == 4 and grouped.head.name == "h" and grouped.mask is not None


def test_an_operand_broadcast_over_a_batch_axis_sums_its_gradient_over_it():
    """q broadcast against k and v (a group's query heads as an axis of their own) makes every
    combination of that axis a member of the key/value head's dK/dV loop; latent queries shared
    by the batch give dQ a term per sequence, summed. The Hopper backward refuses both with the
    reason (its kernel reads every operand at every batch index)."""
    from benchmarks.pipeline_kernels import latent_cross_attention
    from benchmarks.user_kernels import gqa_causal_grouped_axes
    from tensorfuse.schedule_templates.hopper_attention_backward import plan_hopper_backward

    grouped = _plan(gqa_causal_grouped_axes, dict(B=2, G=8, R=4, S=1024, D=128))
    assert [a.name for a in grouped.shared] == ["r"] and grouped.members == 4
    assert not grouped.q_unread and grouped.head is None
    latent = _plan(latent_cross_attention, dict(B=2, L=256, S=1024, D=128))
    assert [a.name for a in latent.q_unread] == ["b"] and latent.members == 1
    for plan in (grouped, latent):
        with pytest.raises(TargetError, match="read every batch axis"):
            plan_hopper_backward(plan, "sm_90a")
    kernels = AttentionBackwardKernels(grouped, BackwardKnobs.for_head_dim(128))
    assert "for _g in range(4):" in kernels.source and "ax_r = _g % 4" in kernels.source
    compiled = kernels.compiled(get_target("cuda:sm_90a"), ranges=3)   # the loop on sm_90a
    assert all("mma" in c.asm["ptx"] for c in compiled[1:])


def test_the_statistics_from_a_saved_log_sum_exp_copy_no_operand():
    """Δ and the base-2 log-sum-exp from the forward's saved one read the output and its
    gradient only: q, k and v go to that kernel as the caller's views (a permuted layout's
    are not copied for the Hopper backward, which reads them by their strides); recomputing the
    log-sum-exp, or the gradients, reads them laid out as the program indexes them."""
    from benchmarks.user_kernels import bshd_causal

    plan = _plan(bshd_causal, dict(B=2, M=64, N=64, H=4, D=64))
    kernels = AttentionBackwardKernels(plan, BackwardKnobs())
    fused = torch.randn(2, 64, 12, 64).bfloat16()   # q, k, v sliced out of one projection
    tensors = dict(q=fused[:, :, :4], k=fused[:, :, 4:8], v=fused[:, :, 8:])
    out, d_out, lse = torch.randn(2, 64, 4, 64), torch.randn(2, 64, 4, 64), torch.randn(2, 4, 64)
    scalars = {"scale": 0.125}
    args, _ = kernels._arguments(tensors, scalars, out, d_out, lse, gradients=False)
    assert all(a is tensors[n] for a, n in zip(args, "qkv"))
    for lse_, gradients in ((None, False), (lse, True)):
        args, _ = kernels._arguments(tensors, scalars, out, d_out, lse_, gradients)
        assert all(a.is_contiguous() and torch.equal(a, tensors[n]) for a, n in zip(args, "qkv"))


def test_what_the_template_cannot_differentiate_is_refused_with_the_reason():
    @tf.kernel
    def learned_bias(q: T.Tensor["B", "H", "M", "D", "bf16"],
                     k: T.Tensor["B", "H", "N", "D", "bf16"],
                     v: T.Tensor["B", "H", "N", "D", "bf16"],
                     table: T.Tensor["H", "R", "f32"], scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale + table[h, i - j + 1023]
        m = T.max(s, over=j)
        p = T.exp(s - m)
        return T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j)

    from tensorfuse.schedule_templates.attention_backward import frozen_refusal

    plan = _plan(learned_bias, dict(DIMS, R=2047))   # the table's gradient: a scatter of dS
    assert frozen_refusal(plan, ["q", "k", "v"]) is None
    assert "reads table, whose gradient" in frozen_refusal(plan, ["q", "k", "v", "table"])
    with pytest.raises(TargetError, match="up to 256"):
        _plan(K.causal_attention, dict(DIMS, D=512))


def test_interpreted_kernels_match_the_backward_program():
    seed = int(os.environ.get("TENSORFUSE_SEED", secrets.randbits(32)))
    errors = run_interpreted("tests.schedule_templates.attention_backward_check", seed)
    names = {"full", "causal", "causal_softcap", "mask_tensor", "causal_whole_tiles"}
    ranges = {n: errors.pop(f"{n}/ranges", None) for n in names}   # plans with block lists
    widths = {"head_dim_24", "head_dims_24_8"}   # tiles wider than the head dims
    assert all(errors.pop(f"{n}/shapes") for n in widths)
    sinks = {"sinks_causal", "sinks_mask_tensor", "sinks_by_head_and_batch"}
    sinks |= {f"{n}/saved" for n in sinks}
    assert all(errors.pop(f"{n}/count") == 4 for n in sinks)   # dq, dk, dv, d sinks
    # a row the mask empties keeps only the sink's term: its log-sum-exp is the sink
    assert errors.pop("sinks_mask_tensor/empty_row_lse") <= 1e-6
    gradients = {"grad", "grad_sinks", "grad_q"}   # tf.grad kernels through the template
    assert [errors.pop(f"{n}/count") for n in ("grad", "grad_sinks", "grad_q")] == [3, 4, 1]
    assert all(errors.pop(f"{n}/origin").startswith("attention backward template")
               for n in gradients)
    broadcast = {"grouped_axes", "one_cache", "latent_queries"}   # gradients summed over axes
    names |= broadcast
    # a score reading a bias table or a temperature: dq, dk, dv through the template
    frozen = {"frozen_table", "frozen_temperature"}
    assert all(errors.pop(f"{n}/origin").startswith("attention backward template")
               for n in frozen)
    assert set(errors) == names | {f"{n}/saved" for n in names} | widths | sinks | gradients | \
        frozen
    for name, err in errors.items():   # float32, against the backward program on the CPU
        assert err <= 1e-5, f"{name}: {err:.1e} (TENSORFUSE_SEED={seed})"
    # causal masks' blocks are consecutive (loops over ranges); a mask tensor's are listed
    assert ranges["causal"] == [[True, True], [True, True]], ranges
    assert ranges["mask_tensor"] == [[False, False], [False, False]], ranges


def test_the_kernels_compile_for_sm90a_on_the_tensor_cores():
    """Offline (no GPU): the kernels of a bf16 causal attention at D=128 use wgmma where they
    multiply, and fit the H100's shared memory."""
    target, plan = get_target("cuda:sm_90a"), _plan(K.causal_attention)
    apart = AttentionBackwardKernels(plan, BackwardKnobs(merged=False)).compiled(
        target, saved_lse=False)   # statistics recomputed, dK/dV and dQ launched apart
    delta, merged = AttentionBackwardKernels(plan, BackwardKnobs(merged=True)).compiled(target)
    _, ranged = AttentionBackwardKernels(plan, BackwardKnobs(merged=True)).compiled(
        target, ranges=15)   # every list visited as a range (consecutive blocks)
    assert len(apart) == 3
    for kernel in (*apart, merged, ranged):
        assert "wgmma.mma_async" in kernel.asm["ptx"]
        assert kernel.metadata.shared <= 227 * 1024
    # from the saved log-sum-exp: Δ and the base-2 statistics only, no product
    assert "wgmma" not in delta.asm["ptx"] and "mma" not in delta.asm["ptx"]
    # head dim 256 on its smaller default tiles; 96 on tiles of 128 columns (32 masked)
    for d in (256, 96):
        wide = _plan(K.causal_attention, dict(DIMS, D=d))
        assert wide.widest_tile_dim == (256 if d == 256 else 128)
        for kernel in AttentionBackwardKernels(
                wide, BackwardKnobs.for_head_dim(wide.widest_tile_dim)).compiled(
                    target, ranges=15)[1:]:
            assert "wgmma.mma_async" in kernel.asm["ptx"]
            assert kernel.metadata.shared <= 227 * 1024


def test_the_backward_accumulates_without_atomics():
    """dQ is summed over the key blocks inside one program (its own pass or launch), dK and dV
    over the query blocks inside another: no atomics, so the gradients are deterministic — the
    same bits on every run, as ``torch.use_deterministic_algorithms`` asks (a GPU test below
    compares two runs)."""
    for knobs in (BackwardKnobs(merged=True), BackwardKnobs(merged=False)):
        plan = _plan(K.gqa_causal_attention, dict(DIMS, HKV=4))
        source = AttentionBackwardKernels(plan, knobs).source
        assert "_dq +=" in source and "atomic" not in source


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [K.gqa_causal_attention, K.attention])
def test_the_gradients_are_the_same_bits_on_every_run_when_asked(kernel):
    """Under torch.use_deterministic_algorithms the gradients repeat bit for bit (the Hopper
    kernel's dQ, added by TMA in any order — by default for scores without a mask —, steps
    aside); dK and dV always do."""
    torch.manual_seed(0)
    f = tf.compile(kernel)
    heads = 2 if kernel is K.gqa_causal_attention else 8
    q = torch.randn(2, 8, 700, 128, device="cuda").bfloat16().requires_grad_()
    k, v = (torch.randn(2, heads, 700, 128, device="cuda").bfloat16().requires_grad_()
            for _ in range(2))
    out = f(q, k, v, scale=128 ** -0.5)
    seed = torch.randn_like(out)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first = torch.autograd.grad(out, (q, k, v), seed, retain_graph=True)
        for _ in range(3):
            again = torch.autograd.grad(out, (q, k, v), seed, retain_graph=True)
            assert all(torch.equal(a, b) for a, b in zip(first, again))
    finally:
        torch.use_deterministic_algorithms(before)
    free = torch.autograd.grad(out, (q, k, v), seed, retain_graph=True)
    for a, b in zip(free, first):
        assert float((a.float() - b.float()).norm() / b.float().norm()) < 1e-2
    # the repeats went straight to the compiled kernels' launchers (the first through the JIT),
    # and gave the first's bits
    from tensorfuse.autograd import _TEMPLATES

    made = [_TEMPLATES[key] for key in f.torch_op.differentiation.templates.values()]
    triton = [t if isinstance(t, AttentionBackwardKernels) else t.statistics for t in made]
    assert sum(launch.direct for t in triton for launch in t.kernels.values()) >= 3


def test_launches_are_specialised_as_tritons_jit_specialises_them():
    """The compiled kernel a backward launch reuses is keyed by what the JIT specialises on:
    tensors' dtypes and 16-byte alignment, ints' width, ones and multiples of 16."""
    from tensorfuse.targets.triton.launcher import specialisation

    x = torch.zeros(64, dtype=torch.bfloat16)
    same = specialisation([x, 4096, 0.5]) == specialisation([torch.ones(8, dtype=x.dtype),
                                                              32, 0.25])
    assert same
    assert specialisation([x[1:], 4096, 0.5]) != specialisation([x, 4096, 0.5])   # misaligned
    assert specialisation([x, 4097, 0.5]) != specialisation([x, 4096, 0.5])
    assert specialisation([x, 1, 0.5]) != specialisation([x, 17, 0.5])
    assert specialisation([x, 2 ** 40, 0.5]) != specialisation([x, 16, 0.5])
    assert specialisation([x.float(), 16, 0.5]) != specialisation([x, 16, 0.5])
    import numpy as np   # NumPy's ints are told apart by value as Python's are

    assert specialisation([x, np.int64(17), 0.5]) == specialisation([x, 17, 0.5]) != \
        specialisation([x, np.int64(16), 0.5])
    # two arguments share a key exactly where Triton's own specialisation gives them one
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    values = [0, 1, 2, 16, 17, 48, -5, -16, 2 ** 31, 2 ** 31 + 16, 2 ** 63, 0.5, 2.0, True,
              x, x[1:], x[8:], x.float(), torch.zeros(3, dtype=torch.int32)]
    triton_key = [native_specialize_impl(BaseBackend, a, False, True, True) for a in values]
    for a, ka in zip(values, triton_key):
        for b, kb in zip(values, triton_key):
            same = ka == kb and (ka[0] != "constexpr" or a == b)
            assert (specialisation([a]) == specialisation([b])) == same, (a, b, ka, kb)


@pytest.mark.gpu
@pytest.mark.parametrize("D, causal", [(64, True), (96, True), (256, True), (128, False),
                                       (96, False)])
def test_autograd_runs_the_template_on_the_gpu(D, causal):
    """On an H100/H200 by default the Hopper kernel wherever it takes the plan (head dims 64 and
    128, 96 in tiles of 128; :func:`tensorfuse.schedule_templates.hopper_attention_backward.
    hopper_backward`), the Triton kernels elsewhere (head dim 256, other GPUs)."""
    from tensorfuse.schedule_templates.hopper_attention_backward import HopperAttentionBackward

    torch.manual_seed(0)
    f = tf.compile(K.causal_attention if causal else K.attention)
    q, k, v = ((3 * torch.randn(1, 2, 150, D, device="cuda")).bfloat16().requires_grad_()
               for _ in range(3))
    out = f(q, k, v, scale=D ** -0.5)
    seed = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), seed)
    assert f.torch_op is not None
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(
        *exact, is_causal=causal, scale=D ** -0.5), exact, seed.double())
    for g, w in zip(got, want):
        assert float((g.double() - w).norm() / w.norm()) < 2e-2
    from tensorfuse.autograd import _TEMPLATES   # the template ran, not the program

    used = f.torch_op.differentiation.templates
    hopper = D != 256 and torch.cuda.get_device_capability() == (9, 0)   # 96: tiles of 128
    assert [type(_TEMPLATES[key]) for key in used.values()] == \
        [HopperAttentionBackward if hopper else AttentionBackwardKernels]
    assert f.torch_op.training is not None   # the forward saved the log-sum-exp for it


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, D", [(150, 150, 64), (40, 300, 128), (150, 200, 256),
                                     (150, 200, 96), (130, 130, 80)])
def test_the_forward_saves_its_log_sum_exp_on_the_gpu(M, N, D):
    """The program with the log-sum-exp output on each path tf.compile takes — the Hopper
    template (prefill, D ≤ 256), the Triton template's split update (40 query rows) — against
    float64 (outputs poisoned first), and its attention output the plain kernel's."""
    torch.manual_seed(0)
    saving = _saving(K.causal_attention)
    q = torch.randn(1, 2, M, D, device="cuda").bfloat16()
    k, v = (torch.randn(1, 2, N, D, device="cuda").bfloat16() for _ in range(2))
    out = torch.full((1, 2, M, D), float("nan"), device="cuda").bfloat16()
    lse = torch.full((1, 2, M), float("nan"), device="cuda")
    saving(q, k, v, scale=D ** -0.5, out=(out, lse))
    s = torch.einsum("bhid,bhjd->bhij", q.double(), k.double()) * D ** -0.5
    keep = torch.arange(N, device="cuda")[None, :] <= torch.arange(M, device="cuda")[:, None] \
        + N - M
    want = torch.logsumexp(s.masked_fill(~keep, float("-inf")), -1)
    assert float((lse.double() - want).abs().max()) < 2e-2, (lse, want)   # bf16 inputs
    plain = tf.compile(K.causal_attention)(q, k, v, scale=D ** -0.5)
    torch.testing.assert_close(out, plain)


def _saving(kernel, target="cuda"):
    """``kernel`` compiled with the log-sum-exp as its second output."""
    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.schedule_templates.attention_chain import with_logsumexp

    _, fusion = choose(kernel.program, get_target("cuda"))
    return tf.compile(ProgramKernel(with_logsumexp(kernel.program, fusion.names)),
                      target=target)


def test_the_log_sum_exp_output_is_each_rows_log_sum_exp_on_the_cpu():
    """``with_logsumexp``'s program (what autograd's forward runs on a GPU) on the CPU target,
    float64 inputs, grouped heads, ragged sizes: the second output (float32) is the log-sum-exp
    of the masked scores (−inf where the mask tensor empties a row); the first is the
    attention's output."""
    from tensorfuse.kernels.layers import attention_kernel

    torch.manual_seed(1)
    kernel = attention_kernel("f64", False, True, False)
    q, k, v = torch.randn(1, 4, 37, 16), torch.randn(1, 2, 45, 16), torch.randn(1, 2, 45, 16)
    q, k, v = (t.double() * 3 for t in (q, k, v))
    mask = torch.rand(1, 1, 37, 45) < 0.6
    mask[:, :, 5] = False
    out, lse = _saving(kernel, "llvm")(q, k, v, mask, 0.25)
    s = torch.einsum("bhid,bhjd->bhij", q, k.repeat_interleave(2, 1)) * 0.25
    want = torch.logsumexp(s.masked_fill(~mask, float("-inf")), -1)
    assert torch.equal(torch.isinf(lse), torch.isinf(want)) and bool(torch.isinf(lse[..., 5]).all())
    finite = torch.isfinite(want)
    # float32 (the output's dtype whatever the inputs'): within a few of its ulps
    assert float(((lse[finite] - want[finite]) / want[finite].abs()).abs().max()) < 4e-7
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)   # empty rows: 0
    torch.testing.assert_close(out, p @ v.repeat_interleave(2, 1), rtol=1e-12, atol=1e-12)


def test_the_hopper_template_writes_the_log_sum_exp_in_its_epilogue():
    """Offline (no GPU): the program with the log-sum-exp goes to the Hopper template on sm_90a,
    whose code stores one float per row (``LSE`` on, the log2 of the row sum); the plain
    program's kernel has it off. The cluster decode kernels do not write it: they refuse."""
    from tensorfuse.schedule_templates.attention_chain import with_logsumexp
    from tensorfuse.schedule_templates.decode_plan import plan_decode
    from tensorfuse.schedule_templates.hopper_attention import hopper_attention

    target = get_target("cuda:sm_90a")
    _, fusion = choose(K.causal_attention.program, target)
    dims = dict(B=1, H=2, M=256, N=256, D=128)
    saving = _saving(K.causal_attention, "cuda:sm_90a")
    assert "hopper_attention" in saving.for_sizes(**dims).description
    source = saving.source(**dims)
    assert "#define LSE 1" in source and "lse_out[" in source
    ptx = saving.ptx(**dims)
    assert "lg2.approx" in ptx and "st.global.f32" in ptx
    plain = hopper_attention(K.causal_attention, fusion, target)
    assert "#define LSE 0" in plain.source(**dims)
    with pytest.raises(ScheduleError, match="does not write the log-sum-exp output lse"):
        plan_decode(with_logsumexp(K.causal_attention.program, fusion.names), fusion.names,
                    fusion.axis)


@pytest.mark.gpu
def test_torch_compile_traces_the_template_backward():
    """AOT autograd traces the backward with fake tensors: the template runs behind its own
    operator, and the compiled graph's gradients are the eager ones."""
    torch.manual_seed(0)
    f = tf.compile(K.causal_attention)
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda").bfloat16().requires_grad_()
               for _ in range(3))

    def loss(q, k, v):
        return f(q, k, v, scale=0.125).float().square().sum()

    eager = torch.autograd.grad(loss(q, k, v), (q, k, v))
    graphed = torch.autograd.grad(torch.compile(loss, fullgraph=True)(q, k, v), (q, k, v))
    for a, b in zip(graphed, eager):
        torch.testing.assert_close(a, b)


def test_the_template_operator_gives_shapes_to_fake_tensors():
    """What AOT autograd sees of the template while it traces a graph's backward: dq, dk, dv,
    and with attention sinks their gradient, in the sinks' shape and dtype."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tensorfuse.autograd import _TEMPLATES, _template_backward_op
    from tensorfuse.kernels.layers import attention_kernel

    dims = dict(B=2, H=8, HKV=4, M=33, N=40, D=64)
    keys = []
    for kernel in (attention_kernel("bf16", True, False, False),
                   attention_kernel("bf16", True, False, False, "f32")):
        _TEMPLATES.append(AttentionBackwardKernels(_plan(kernel, dims), BackwardKnobs()))
        keys.append(len(_TEMPLATES) - 1)
    with FakeTensorMode():
        q, kv = torch.empty(2, 8, 33, 64), torch.empty(2, 4, 40, 64)
        plain = _template_backward_op()(keys[0], q, kv, kv, q, q, None, [], [], [0.125])
        sinks = torch.empty(8, dtype=torch.float32)
        with_sinks = _template_backward_op()(keys[1], q, kv, kv, q, q, None, [sinks], [],
                                             [0.125])
    shapes = [(2, 8, 33, 64), (2, 4, 40, 64), (2, 4, 40, 64)]
    assert [tuple(g.shape) for g in plain] == shapes
    assert [tuple(g.shape) for g in with_sinks] == shapes + [(8,)]
    assert with_sinks[3].dtype == torch.float32


def test_an_eager_backward_runs_the_template_directly_and_anything_tracing_the_operator():
    """Eager backwards skip the dispatcher; fake tensors, a dispatch mode, a functorch transform,
    recorded gradients (a double backward) and a profiler (its traces name the operator) keep
    the operator."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tensorfuse.autograd import _runs_directly

    plain = [torch.randn(2, 3), None]
    with torch.no_grad():
        assert _runs_directly(plain)
        with torch.profiler.profile():
            assert not _runs_directly(plain)
        with FakeTensorMode() as mode:
            assert not _runs_directly(plain)
        assert not _runs_directly([mode.from_tensor(plain[0])])
        seen = []
        torch.vmap(lambda x: seen.append(_runs_directly([x])) or x)(plain[0])
        assert seen == [False]
    with torch.enable_grad():
        assert not _runs_directly(plain)


def test_the_forward_that_saves_the_log_sum_exp_uses_the_plain_forwards_tuning(monkeypatch):
    """Autograd's forward (the program with the log-sum-exp output) looks its tuning records up
    as the user's kernel: the same loops and knobs, one more store per row."""
    import tensorfuse.api as api
    from tensorfuse.autograd import Differentiation

    asked = []
    real = api.template_records
    monkeypatch.setattr(api, "template_records",
                        lambda program, *rest, **options: asked.append(program.name) or
                        real(program, *rest, **options))
    compiled = tf.compile(K.causal_attention, target="cuda:sm_90a")
    differentiation = Differentiation(compiled)
    assert differentiation.training_op("tensorfuse::tuned_as_test", "cuda") is not None
    asked.clear()
    saving = differentiation._saving()
    assert [c.name for c in saving.program.outputs] == ["out", "lse"]
    assert asked and set(asked) == {K.causal_attention.program.name}, asked


def test_tf_grad_of_attention_runs_the_template_and_the_floor_where_it_refuses():
    """``tf.grad`` of attention compiled for a GPU runs the forward with its log-sum-exp and the
    backward template (checked in the interpreter above); at a head dim the template refuses,
    the floor's stages, saying why; the CPU and other programs' gradients as before."""
    from tensorfuse.attention_gradient import AttentionGradientKernel

    made = tf.compile(tf.grad(K.gqa_causal_attention), "cuda:sm_90a")
    assert isinstance(made, AttentionGradientKernel)
    assert made.schedule_origin(**dict(DIMS, H=32, HKV=8)).startswith(
        "attention backward template")
    assert "tf_hopper_attention_backward" in made.source(**dict(DIMS, H=32, HKV=8))
    on_sm80 = tf.compile(tf.grad(K.gqa_causal_attention), "cuda:sm_80")
    assert "(AttentionBackwardKernels)" in on_sm80.schedule_origin(**dict(DIMS, H=32, HKV=8))
    assert "_tf_bwd_dkdv" in on_sm80.source(**dict(DIMS, H=32, HKV=8))
    with pytest.warns(tf.errors.NoTemplateWarning):
        refused = made.schedule_origin(**dict(DIMS, H=32, HKV=8, D=512))
    assert refused.startswith("staged") and \
        "the attention backward template refuses these sizes: the attention backward holds " \
        "head dims up to 256, not [512]" in refused
    assert not isinstance(tf.compile(tf.grad(K.causal_attention), "llvm"),
                          AttentionGradientKernel)
    assert not isinstance(tf.compile(tf.grad(K.softmax), "cuda:sm_90a"), AttentionGradientKernel)
    # a chain the attention template rolls that is no softmax attention (SwiGLU's MLP)
    from tensorfuse.kernels.layers import swiglu_mlp_kernel

    assert not isinstance(tf.compile(tf.grad(swiglu_mlp_kernel("bf16")), "cuda:sm_90a"),
                          AttentionGradientKernel)


def test_a_gradient_of_a_tensor_the_score_reads_takes_the_program_and_says_why():
    """A relative-position bias table the score reads: its gradient is a scatter of dS, which
    the template does not compute — asked for, the gradient program runs (the refusal said);
    not asked for (``wrt``, or autograd where it does not require grad), the template."""
    from tensorfuse.autograd import _asks_frozen
    from tensorfuse.schedule_templates.attention_backward import plan_attention_backward
    from tests.schedule_templates.user_written_forms_check import relative_bias_attention

    dims = dict(B=2, H=16, S=4096, D=128, R=128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        every = tf.compile(tf.grad(relative_bias_attention), "cuda:sm_90a").schedule_origin(**dims)
    assert "the score reads table, whose gradient the attention backward does not compute" \
        in every, every
    some = tf.compile(tf.grad(relative_bias_attention, ["q", "k", "v"]), "cuda:sm_90a")
    assert some.schedule_origin(**dims).startswith("attention backward template")
    program = relative_bias_attention.program
    _, fusion = choose(program, get_target("cuda:sm_90a"))
    plan = plan_attention_backward(program, fusion, dims)
    assert plan.frozen == ("table",)
    assert _asks_frozen(plan, program.params, (True, True, True, True, False))
    assert not _asks_frozen(plan, program.params, (True, True, True, False, False))


@pytest.mark.gpu
@pytest.mark.parametrize("learned", [False, True])
def test_autograd_of_attention_with_a_bias_table_matches_float64_on_the_gpu(learned):
    """A frozen table: the backward template; a learned one: the gradient program, the
    table's gradient too."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from tests.schedule_templates.user_written_forms_check import relative_bias_attention

    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    S, D, R = 200, 64, 16
    q, k, v = (torch.randn(2, 3, S, D, generator=g, dtype=torch.float64).cuda()
               for _ in range(3))
    table, weights = torch.randn(3, R, generator=g, dtype=torch.float64).cuda(), \
        torch.randn(2, 3, S, D, generator=g, dtype=torch.float64).cuda()
    i, j = torch.arange(S, device="cuda")[:, None], torch.arange(S, device="cuda")
    exact = [t.clone().requires_grad_() for t in (q, k, v, table)]
    s = exact[0] @ exact[1].transpose(-1, -2) * 0.2 + exact[3][:, (i - j).clamp(0, R - 1)]
    ((torch.softmax(s.masked_fill(j > i, float("-inf")), -1) @ exact[2]) * weights).sum() \
        .backward()
    inputs = [t.bfloat16().requires_grad_() for t in (q, k, v)] + \
        [table.float().requires_grad_(learned)]
    out = tf.compile(relative_bias_attention)(*inputs, 0.2)
    (out.double() * weights).sum().backward()
    for x, want in zip(inputs if learned else inputs[:3], exact):
        assert relative_error(x.grad, want.grad) < 3e-2, seed


@pytest.mark.gpu
@pytest.mark.parametrize("sinks", [None, "bf16"])
def test_tf_grad_of_attention_matches_float64_on_the_gpu(sinks):
    """``tf.grad`` of causal attention over grouped heads (with gpt-oss's sinks or not), bf16,
    ragged sizes: the forward (the Hopper template on an H100/H200) and the backward template,
    every gradient against float64 autograd, the results poisoned first."""
    from tensorfuse.kernels.layers import attention_kernel
    from tests.kernels.test_attention_sinks import sink_attention64

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    made = tf.compile(tf.grad(attention_kernel("bf16", True, False, False, sinks)))
    g = torch.Generator().manual_seed(0)
    B, H, HKV, M, N, D = 2, 8, 2, 300, 333, 64
    q, d_out = (torch.randn(B, H, M, D, generator=g).bfloat16().cuda() for _ in range(2))
    k, v = (torch.randn(B, HKV, N, D, generator=g).bfloat16().cuda() for _ in range(2))
    tensors = dict(q=q, k=k, v=v)
    if sinks:
        tensors["sinks"] = (torch.randn(H, generator=g) * 4).bfloat16().cuda()
    outs = tuple(torch.full_like(t, float("nan")) for t in tensors.values())
    got = made(**tensors, scale=D ** -0.5, d_out=d_out, out=outs)
    exact = [t.double().requires_grad_() for t in tensors.values()]
    keep = torch.ones(M, N, dtype=torch.bool, device="cuda").tril(N - M)
    sink = exact[3] if sinks else torch.full((H,), -torch.inf, device="cuda",
                                             dtype=torch.float64)
    want = torch.autograd.grad(sink_attention64(*exact[:3], sink, keep, D ** -0.5), exact,
                               d_out.double())
    for a, b in zip(got, want):
        assert float((a.double() - b).norm() / b.norm()) < 2e-2


@pytest.mark.gpu
def test_broadcast_operands_gradients_match_float64_on_the_gpu():
    """Training through ``tf.compile`` where an operand lacks a batch axis: latent queries shared
    by the batch (Perceiver) and one key/value cache under every head (MQA written with
    ``k[b, j, d]``), bf16, ragged lengths, autograd against float64 autograd."""
    from benchmarks.pipeline_kernels import latent_cross_attention

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")

    @tf.kernel
    def one_cache(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "N", "D", "bf16"],
                  v: T.Tensor["B", "N", "D", "bf16"], scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.sum(q[b, h, i, d] * k[b, j, d], over=d) * scale
        return K.softmax_attend(s, v[b, j, e], j)

    g = torch.Generator().manual_seed(1)
    cases = {latent_cross_attention: (("L", "D"), ("B", "S", "D"), "ld,bsd->bls", "bls,bsd->bld"),
             one_cache: (("B", "H", "M", "D"), ("B", "N", "D"), "bhid,bjd->bhij",
                         "bhij,bjd->bhid")}
    sizes = dict(L=77, D=64, B=3, S=1000, H=4, M=300, N=333)
    for kernel, (q_dims, kv_dims, scores, attend) in cases.items():
        q = torch.randn(*(sizes[d] for d in q_dims), generator=g).bfloat16().cuda()
        k, v = (torch.randn(*(sizes[d] for d in kv_dims), generator=g).bfloat16().cuda()
                for _ in range(2))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = tf.compile(kernel)(*leaves, 0.125)
        d_out = torch.randn(out.shape, generator=g).bfloat16().cuda()
        out.float().backward(d_out.float())
        exact = [t.double().requires_grad_() for t in (q, k, v)]
        p = torch.softmax(torch.einsum(scores, *exact[:2]) * 0.125, -1)
        want = torch.autograd.grad(torch.einsum(attend, p, exact[2]), exact, d_out.double())
        for leaf, w in zip(leaves, want):
            err = float((leaf.grad.double() - w).norm() / w.norm())
            assert err < 2e-2, (kernel.program.name, err)
