"""Attention with sinks (gpt-oss: a score per head outside the keys that shares the softmax and
attends to nothing; ``tensorfuse.kernels.layers.attention_kernel(..., sinks=dtype)``) against
the float64 math as gpt-oss's eager code writes it — the sink appended to every row's logits,
the softmax over both, the sink's column dropped — causal and under a mask that empties rows,
grouped heads, sinks large enough to take most of a row."""
import re

import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.kernels.attention import scores, softmax_attend
from tensorfuse.kernels.layers import attention_kernel
from tests.helpers import fresh_seed, needs_nvcc, relative_error

SIZES = dict(B=1, H=64, HKV=8, M=4096, N=4096, D=64)


@tf.kernel
def batch_sinks(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                v: T.Tensor["B", "H", "N", "D", "bf16"], sinks: T.Tensor["B", "H", "f32"],
                scale: T.f32):
    """A sink per sequence and head."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    return T.cast(softmax_attend(scores(q, k, b, h, h, i, j, d, scale), v[b, h, j, e], j,
                                 sink=sinks[b, h]), "bf16")


def hopper(kernel, **knobs):
    """``kernel`` on the Hopper template applied by hand (tf.compile keeps sinks off it)."""
    return tf.schedule(kernel, "cuda:sm_90a").rolling_update("m", "o", "l", axis="j") \
        .apply_template("hopper_attention", **knobs).compile()


def sink_case(generator, masked: bool, B=2, H=8, HKV=2, M=37, N=53, D=64, causal=True):
    """(arguments, float64 output): rows of the mask emptied whole give 0; without a mask,
    causal from the bottom right or (``causal=False``) every key."""
    q = torch.randn(B, H, M, D, generator=generator).to(torch.bfloat16)
    k, v = (torch.randn(B, HKV, N, D, generator=generator).to(torch.bfloat16) for _ in range(2))
    sinks = (torch.randn(H, generator=generator) * 4).to(torch.bfloat16)
    if masked:
        keep = torch.rand(B, 1, M, N, generator=generator) > 0.5
        keep[1, 0, :3] = False
    else:   # bottom-right causal, or every key
        keep = torch.ones(M, N, dtype=torch.bool).tril(N - M if causal else N)
    want = sink_attention64(q.double(), k.double(), v.double(), sinks.double(), keep, D ** -0.5)
    args = [q, k, v] + ([keep] if masked else []) + [sinks]
    return args, want


def sink_attention64(q, k, v, sinks, keep, scale: float):
    """Attention with sinks as gpt-oss's eager code writes it, in the inputs' dtype (float64
    here, differentiable): each row's scores where ``keep`` (broadcast to ``[B, H, M, N]``) with
    the sink appended, the softmax over both, the sink's column dropped; grouped heads; sinks
    ``[H]`` or ``[B, H]``."""
    B, H, M, _ = q.shape
    group = H // k.shape[1]
    s = q @ k.repeat_interleave(group, 1).transpose(-1, -2) * scale
    sink = sinks.view(1, H, 1, 1) if sinks.dim() == 1 else sinks.view(B, H, 1, 1)
    logits = torch.cat([s.masked_fill(~keep, float("-inf")), sink.expand(B, H, M, 1)], -1)
    return torch.softmax(logits, -1)[..., :-1] @ v.repeat_interleave(group, 1)


@pytest.mark.parametrize("masked", [False, True])
def test_sinks_match_float64_on_the_cpu(masked):
    seed = fresh_seed()
    args, want = sink_case(torch.Generator().manual_seed(seed), masked)
    kernel = attention_kernel("bf16", not masked, masked, False, "bf16")
    assert relative_error(kernel(*args, scale=64 ** -0.5, target="llvm"), want) < 2e-2, seed


@pytest.mark.parametrize("masked", [False, True])
def test_tf_compile_runs_sink_prefill_on_the_hopper_template_and_says_why_not_packing(masked):
    """Prefill with sinks (causal, or gpt-oss's sliding layers as a boolean mask) on the Hopper
    template; a decode with them off the packed routes, which say why."""
    made = tf.compile(attention_kernel("bf16", not masked, masked, False, "bf16"), "cuda:sm_90a")
    assert made.schedule_origin(**SIZES).startswith("hopper_attention template defaults")
    decode = {**SIZES, "B": 8, "M": 1}
    plan = made.describe_plan(**decode)
    assert not plan.splitlines()[0].split(": ")[1].startswith("packed"), plan


@pytest.mark.parametrize("kernel, at", [(attention_kernel("bf16", True, False, False, "bf16"),
                                         "w.bh % H_"), (batch_sinks, "w.bh")])
def test_the_hopper_epilogue_adds_each_rows_sink_share_after_the_merge(kernel, at):
    """m and l are in base 2 of the score: l + exp(sink − m) is l + 2^(sink·log2 e − m), added
    once the split pieces are merged, before the division."""
    sizes = SIZES if kernel is not batch_sinks else {n: v for n, v in SIZES.items() if n != "HKV"}
    source = hopper(kernel).source(**sizes)
    sink = next(line for line in source.splitlines() if "the sink's share" in line)
    assert f"t_sinks[{at}] * 1.4426950408889634f - m[x]" in sink
    assert source.index("merge_piece(o, m, l") < source.index(sink.strip()) < \
        source.index("const float inv = 1.0f / l[x];")


@needs_nvcc
def test_the_hopper_sink_kernel_compiles_with_the_plain_kernels_registers():
    from tests.schedule_templates.test_hopper_attention import _ptxas_report

    def registers(kernel):   # registers, and the bytes spilled (ptxas says 0 where none)
        report = _ptxas_report(hopper(kernel).source(**SIZES))
        return re.findall(r"Used (\d+) registers|(\d+) bytes spill stores", report)
    plain = registers(attention_kernel("bf16", True, False, False))
    assert len(plain) == 2 and registers(attention_kernel("bf16", True, False, False, "bf16")) \
        == plain, plain


def test_sinks_with_a_soft_cap_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="sinks with a soft-cap"):
        attention_kernel("bf16", True, False, True, "bf16")


@pytest.mark.gpu
@pytest.mark.parametrize("masked, sizes", [(False, {}), (True, {}),
                                           (False, dict(M=1, N=4099)), (True, dict(M=1))])
def test_sinks_match_float64_on_the_gpu(masked, sizes):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    seed = fresh_seed()
    args, want = sink_case(torch.Generator().manual_seed(seed), masked, **sizes)
    kernel = attention_kernel("bf16", not masked, masked, False, "bf16")
    out = torch.full(want.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    kernel(*(a.cuda() for a in args), scale=64 ** -0.5, out=out)
    assert relative_error(out, want) < 2e-2, seed


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, knobs", [
    (attention_kernel("bf16", True, False, False, "bf16"), {}),
    (attention_kernel("bf16", False, False, False, "bf16"), {"schedule": "split"}),
    (attention_kernel("bf16", False, True, False, "bf16"), {}),
    (batch_sinks, {})])
def test_the_hopper_sink_kernel_matches_float64_on_the_gpu(kernel, knobs):
    """The template applied by hand with its knobs (tf.compile's route); causal with ragged
    lengths, and every key with the
    tiles split along the keys (the sink's share added once the pieces are merged); a boolean
    mask emptying rows whole (gpt-oss's sliding layers: those rows give 0)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    if kernel is batch_sinks:
        B, H, M, N = 2, 4, 333, 333
        q, k, v = (torch.randn(B, H, n, 64, generator=g).to(torch.bfloat16) for n in (M, N, N))
        sinks = torch.randn(B, H, generator=g) * 4
        s = q.double() @ k.double().transpose(-1, -2) * 0.125
        logits = torch.cat([s, sinks.double().view(B, H, 1, 1).expand(B, H, M, 1)], -1)
        want = torch.softmax(logits, -1)[..., :-1] @ v.double()
        args = [q, k, v, sinks]
    else:
        masked = "masked" in kernel.program.name
        args, want = sink_case(g, masked, B=2, H=8, HKV=2, M=1000, N=1000,
                               causal="schedule" not in knobs)
    out = torch.full(want.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    hopper(kernel, **knobs)(*(a.cuda() for a in args), scale=0.125, out=out)
    assert relative_error(out, want) < 2e-2, seed


def test_one_kernel_per_variant_however_it_is_asked_for():
    """The integration passes ``sinks=None`` where a caller leaves it out: one kernel (its builds
    and ``cache_info()`` shared), not two."""
    assert attention_kernel("bf16", True, False, False) is \
        attention_kernel("bf16", 1, False, False, None) is \
        attention_kernel(dtype="bf16", causal=True, masked=False, softcap=False)
    assert attention_kernel("bf16", True, False, False, "bf16") is not \
        attention_kernel("bf16", True, False, False)


def _saving(kernel):
    """``kernel``'s program with the log-sum-exp as a second output, as autograd's forward
    compiles it (:meth:`tensorfuse.autograd.Differentiation.training_op`)."""
    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.schedule_templates.attention_chain import with_logsumexp
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target

    _, fusion = choose(kernel.program, get_target("cuda"))
    return ProgramKernel(with_logsumexp(kernel.program, fusion.names))


def _float64_logsumexp(q, k, sinks, keep, scale: float):
    """Each row's log-sum-exp of its kept scores and the sink, float64."""
    H = q.shape[1]
    s = q.double() @ k.double().repeat_interleave(H // k.shape[1], 1).transpose(-1, -2) * scale
    s = s.masked_fill(~keep, float("-inf"))
    sink = sinks.double().view(1, H, 1, 1).expand(*s.shape[:3], 1)
    return torch.logsumexp(torch.cat([s, sink], -1), -1)


@pytest.mark.parametrize("masked", [False, True])
def test_the_saved_log_sum_exp_has_the_sinks_term_on_the_cpu(masked):
    """What the backward reads as each row's log-sum-exp is that of the softmax's whole
    denominator, the sink's term in it; a row the mask empties has the sink's alone (not
    −inf + inf). The program with it still takes the Hopper template."""
    kernel = attention_kernel("bf16", not masked, masked, False, "bf16")
    saving = _saving(kernel)
    text = repr(saving.program.outputs[1].bodies[0])
    assert text == "where(l > 0.0, m + log(l + exp(sinks[h] - m)), sinks[h].astype('f32'))"
    assert tf.compile(saving, "cuda:sm_90a").schedule_origin(**SIZES) \
        .startswith("hopper_attention template defaults")
    seed = fresh_seed()
    args, want = sink_case(torch.Generator().manual_seed(seed), masked)
    out, lse = tf.compile(saving, target="llvm")(*args, scale=64 ** -0.5)
    keep = args[3] if masked else torch.ones(37, 53, dtype=torch.bool).tril(53 - 37)
    want_lse = _float64_logsumexp(args[0], args[1], args[-1], keep, 64 ** -0.5)
    assert float((lse.double() - want_lse).abs().max()) < 1e-4, seed
    assert relative_error(out, want) < 2e-2, seed


def test_the_hopper_epilogue_writes_the_log_sum_exp_with_the_sinks_term():
    """m and l in base 2: (m + log2 l)·ln 2 with the sink's share in l, or the sink where the
    row kept no key."""
    source = hopper(_saving(attention_kernel("bf16", False, True, False, "bf16"))) \
        .source(**SIZES)
    lines = [line.strip() for line in source.splitlines()]
    share = lines.index("l[x] += exp2f(g2 - m[x]);   // the sink's share")
    kept = lines.index("const bool kept = l[x] > 0.0f;")
    lse = lines.index("pending_lse[x] = (kept ? m[x] + log2f(l[x]) : g2) * 0.6931471805599453f;")
    assert kept < share < lse


def test_the_backward_plan_takes_the_sink_and_refuses_one_read_by_the_rows():
    from tensorfuse.errors import TargetError
    from tensorfuse.schedule_templates.attention_backward import plan_attention_backward
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target

    def plan(kernel, dims):
        _, fusion = choose(kernel.program, get_target("cuda:sm_90a"))
        return plan_attention_backward(kernel.program, fusion, dims)

    made = plan(attention_kernel("bf16", True, False, False, "bf16"), SIZES)
    assert made.sink.param.name == "sinks" and made.group == 8

    @tf.kernel
    def row_sinks(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                  v: T.Tensor["B", "H", "N", "D", "bf16"], sinks: T.Tensor["M", "bf16"],
                  scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        return softmax_attend(scores(q, k, b, h, h, i, j, d, scale), v[b, h, j, e], j,
                              sink=sinks[i])

    with pytest.raises(TargetError, match="sink by batch axes"):
        plan(row_sinks, {n: v for n, v in SIZES.items() if n != "HKV"})


@pytest.mark.gpu
@pytest.mark.parametrize("masked, backward", [(False, "auto"), (True, "auto"),
                                              (False, "triton")])
def test_autograd_through_the_sink_kernel_matches_float64_on_the_gpu(monkeypatch, masked,
                                                                     backward):
    """tf.compile's sink kernel under autograd: its forward saves the log-sum-exp with the
    sink's term (the Hopper template on an H100/H200), the attention backward template gives dq,
    dk, dv and the sinks' gradient — causal, and a boolean mask emptying rows (gpt-oss's sliding
    layers); the Hopper backward kernel by default on an H100/H200, the Triton kernels where
    asked (and on other GPUs)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from tensorfuse.autograd import _TEMPLATES
    from tensorfuse.schedule_templates.hopper_attention_backward import HopperAttentionBackward

    monkeypatch.setenv("TENSORFUSE_ATTENTION_BACKWARD", backward)
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    D = 128 if backward == "triton" else 64
    args, _ = sink_case(g, masked, B=2, H=8, HKV=2, M=300, N=300, D=D)
    f = tf.compile(attention_kernel("bf16", not masked, masked, False, "bf16"))
    leaves = [a.cuda().requires_grad_(a.is_floating_point()) for a in args]
    out = f(*leaves, scale=D ** -0.5)
    d_out = torch.randn(out.shape, generator=g).to(out)
    wrt = [x for x in leaves if x.requires_grad]
    got = torch.autograd.grad(out, wrt, d_out)
    exact = [x.detach().double().requires_grad_() for x in wrt]
    keep = leaves[3] if masked else torch.ones(300, 300, dtype=torch.bool, device="cuda").tril()
    want = torch.autograd.grad(sink_attention64(*exact[:3], exact[3], keep, D ** -0.5), exact,
                               d_out.double())
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, want):
        assert relative_error(a, b) < 2e-2, (name, seed)
    kinds = [type(_TEMPLATES[key]) for key in f.torch_op.differentiation.templates.values()]
    hopper = backward != "triton" and torch.cuda.get_device_capability() == (9, 0)
    assert kinds and all((k is HopperAttentionBackward) == hopper for k in kinds), kinds


@pytest.mark.gpu
@pytest.mark.parametrize("masked", [False, True])
def test_the_saved_log_sum_exp_has_the_sinks_term_on_the_gpu(masked):
    """The forward autograd runs (the Hopper template on an H100/H200), outputs poisoned."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    seed = fresh_seed()
    args, want = sink_case(torch.Generator().manual_seed(seed), masked, M=300, N=300)
    args = [a.cuda() for a in args]
    out = torch.full(want.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full(want.shape[:3], float("nan"), device="cuda")
    tf.compile(_saving(attention_kernel("bf16", not masked, masked, False, "bf16")))(
        *args, scale=0.125, out=(out, lse))
    keep = args[3] if masked else torch.ones(300, 300, dtype=torch.bool, device="cuda").tril()
    want_lse = _float64_logsumexp(args[0], args[1], args[-1], keep, 0.125)
    assert float((lse.double() - want_lse).abs().max()) < 2e-2, seed   # bf16 inputs
    assert relative_error(out, want) < 2e-2, seed


@tf.kernel
def bshd_sinks(q: T.Tensor["B", "M", "H", "D", "bf16"], k: T.Tensor["B", "N", "H", "D", "bf16"],
               v: T.Tensor["B", "N", "H", "D", "bf16"], sinks: T.Tensor["H", "bf16"],
               scale: T.f32):
    """Causal attention with sinks on ``[B, S, H, D]`` tensors (the Hopper template's strided
    epilogue: the output and the log-sum-exps where the layout puts them)."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.where(i >= j, T.sum(q[b, i, h, d] * k[b, j, h, d], over=d) * scale, -T.inf)
    return softmax_attend(s, v[b, j, h, e], j, sink=sinks[h])


@needs_nvcc
def test_a_permuted_layouts_log_sum_exp_has_the_sinks_term_and_compiles_as_without_it():
    """In the strided epilogue too the log-sum-exp line is the sink's (at the layout's
    address); ptxas gives the kernel the registers and spills of the kernel without it."""
    from tests.schedule_templates.test_hopper_attention import _ptxas_report

    sizes = dict(B=2, H=8, M=1024, N=1024, D=64)
    saving = tf.compile(_saving(bshd_sinks), "cuda:sm_90a")
    assert saving.schedule_origin(**sizes).startswith("hopper_attention template defaults")
    source = saving.source(**sizes)
    lines = [line.strip() for line in source.splitlines()]
    assert "pending_lse[x] = (kept ? m[x] + log2f(l[x]) : g2) * 0.6931471805599453f;" in lines
    assert "pending_lse_at[x] = LSE_AT(w.bh / H_, w.bh % H_, row);" in lines

    def registers(text):
        return re.findall(r"Used (\d+) registers|(\d+) bytes spill stores", _ptxas_report(text))
    assert registers(source) == registers(tf.compile(bshd_sinks, "cuda:sm_90a").source(**sizes))
