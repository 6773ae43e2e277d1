"""Gradients of DSL programs (issue 22), on the CPU target: ``torch.autograd.gradcheck`` in
float64 through compiled kernels (the backward program fused by ``tf.compile``'s CPU template and
unfused), the same gradients from both, ``tf.grad`` called directly, bf16 library kernels against
PyTorch's own gradients, and the refusals."""
import numpy as np
import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.autograd import sum_parts
from tensorfuse.binding import bind_call
from tensorfuse.dsl.gradients import GradientError, gradient_program
from tests.schedule_templates.user_written_check import survival   # Π (1 − h) over steps

X = T.Tensor["M", "N", "f64"]
W = T.Tensor["N", "f64"]
Q = T.Tensor["B", "H", "M", "D", "f64"]
KV = T.Tensor["B", "H", "N", "D", "f64"]
KV_GROUPED = T.Tensor["B", "HKV", "N", "D", "f64"]


@tf.kernel
def softmax(x: X):
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    p = T.exp(x[i, j] - m)
    return p / T.sum(p, over=j)


@tf.kernel
def log_softmax(x: X):
    i, j = T.axes("i j")
    m = T.max(x[i, j], over=j)
    return x[i, j] - m - T.log(T.sum(T.exp(x[i, j] - m), over=j))


@tf.kernel
def layernorm(x: X, weight: W, bias: W, eps: T.f64):
    i, j = T.axes("i j")
    mean = T.sum(x[i, j], over=j) / T.size("N")
    centered = x[i, j] - mean
    var = T.sum(centered * centered, over=j) / T.size("N")
    return centered * T.rsqrt(var + eps) * weight[j] + bias[j]


@tf.kernel
def rmsnorm(x: X, weight: W, eps: T.f64):
    i, j = T.axes("i j")
    ms = T.sum(x[i, j] * x[i, j], over=j) / T.size("N")
    return x[i, j] * T.rsqrt(ms + eps) * weight[j]


@tf.kernel
def cross_entropy(logits: X, target: T.Tensor["M", "i32"]):
    i, j = T.axes("i j")
    m = T.max(logits[i, j], over=j)
    return m + T.log(T.sum(T.exp(logits[i, j] - m), over=j)) - logits[i, target[i]]


def _attend(s, v, b, hk, j, e):
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.sum(p * v[b, hk, j, e], over=j) / T.sum(p, over=j)


@tf.kernel
def causal_gqa(q: Q, k: KV_GROUPED, v: KV_GROUPED, scale: T.f64):
    b, h, i, j, d, e = T.axes("b h i j d e")
    hk = h // (T.size("H") // T.size("HKV"))
    s = T.sum(q[b, h, i, d] * k[b, hk, j, d], over=d) * scale
    return _attend(T.where(i + T.size("N") - T.size("M") >= j, s, -T.inf), v, b, hk, j, e)


@tf.kernel
def alibi(q: Q, k: KV, v: KV, scale: T.f64):
    b, h, i, j, d, e = T.axes("b h i j d e")
    slope = T.exp2(-8.0 * (h + 1) / T.size("H"))
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale + \
        slope * (j - (i + T.size("N") - T.size("M")))
    return _attend(s, v, b, h, j, e)


@tf.kernel
def softcap(q: Q, k: KV, v: KV, scale: T.f64, cap: T.f64):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    return _attend(cap * T.tanh(s / cap), v, b, h, j, e)


@tf.kernel
def learned_bias(q: Q, k: KV, v: KV, table: T.Tensor["H", "R", "f64"], scale: T.f64):
    """A relative-position bias table learned per head (T5/ALiBi-style), read by an index."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale + \
        table[h, i - j + T.size("N") - 1]
    return _attend(T.where(i + T.size("N") - T.size("M") >= j, s, -T.inf), v, b, h, j, e)


def _t(*shape, scale=1.0, offset=0.0):
    return (offset + scale * torch.randn(*shape, dtype=torch.float64)).requires_grad_()


def _cases():
    """(kernel, differentiable tensors, other arguments), ragged sizes."""
    x, w, bias = _t(3, 19, scale=3.0, offset=2.0), _t(19), _t(19)
    target = torch.randint(0, 19, (3,), dtype=torch.int32)
    q, k, v = _t(1, 2, 5, 8), _t(1, 2, 7, 8), _t(1, 2, 7, 8)
    return {
        "softmax": (softmax, (x,), {}),
        "log_softmax": (log_softmax, (x,), {}),
        "layernorm": (layernorm, (x, w, bias), {"eps": 1e-5}),
        "rmsnorm": (rmsnorm, (x, w), {"eps": 1e-5}),
        "cross_entropy": (cross_entropy, (x,), {"target": target}),
        "causal_gqa": (causal_gqa, (_t(1, 4, 5, 8), _t(1, 2, 7, 8), _t(1, 2, 7, 8)),
                       {"scale": 0.35}),
        "alibi": (alibi, (q, k, v), {"scale": 0.35}),
        "softcap": (softcap, (_t(1, 2, 5, 8, scale=3.0), k, v), {"scale": 0.35, "cap": 2.0}),
        "learned_bias": (learned_bias, (q, k, v, _t(2, 13)), {"scale": 0.35}),
    }


CASES = sorted(_cases())


@pytest.mark.parametrize("name", CASES)
def test_gradcheck_in_float64_fused_and_unfused(name):
    """The compiled kernel is differentiable (autograd through its custom operator) and its
    gradients match finite differences; the backward program gives the same gradients compiled
    by the CPU template (attention's backward with a chain fused) and unfused."""
    torch.manual_seed(CASES.index(name))
    kernel, tensors, others = _cases()[name]
    f = tf.compile(kernel, target="llvm")
    assert torch.autograd.gradcheck(lambda *a: f(*a, **others), tensors)
    out = f(*tensors, **others)
    seed = torch.randn_like(out)
    via_autograd = torch.autograd.grad(out, tensors, seed)
    args = [t.detach() for t in tensors]
    dims = bind_call(kernel.program, tuple(args), others, "cpu").dims
    backward = tf.grad(kernel)
    results = []
    for template in ("auto", None):
        compiled = tf.compile(backward, target="llvm", template=template)
        if template == "auto" and name in ("alibi", "softcap", "causal_gqa", "learned_bias"):
            assert "rolling_update" in compiled.schedule_origin(**dims)
        parts = compiled(*args, *others.values(), seed)
        results.append(sum_parts(backward.outputs, parts if isinstance(parts, tuple) else
                                 (parts,)))
    for k, p in enumerate(backward.wrt):
        torch.testing.assert_close(results[0][p], results[1][p], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(results[0][p], via_autograd[k], rtol=1e-10, atol=1e-12)


def test_tf_grad_matches_torch_and_adds_partial_gradients(rng):
    """``tf.grad`` called directly; a parameter read by two different indices (a Gram matrix
    ``x·xᵀ``) gets two partial gradients, added into one."""

    @tf.kernel
    def gram(x: T.Tensor["M", "K", "f64"]):
        i, j, k = T.axes("i j k")
        return T.sum(x[i, k] * T.exp(x[j, k]), over=k)

    g = tf.grad(gram)
    assert [o.param for o in g.outputs] == ["x", "x"]   # two parts
    x = rng.standard_normal((5, 3))
    seed = rng.standard_normal((5, 5))
    got = g(x, seed, target="llvm")
    xt = torch.tensor(x, requires_grad=True)
    (xt @ torch.exp(xt).T).backward(torch.tensor(seed))
    np.testing.assert_allclose(got, xt.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_the_backward_program_recomputes_and_reads_the_incoming_gradient():
    backward, outputs = gradient_program(softmax.program)
    assert [p.name for p in backward.params] == ["x", "d_out"]
    assert [(o.param, o.compute) for o in outputs] == [("x", "d_x")]
    assert not any(c.is_output for c in backward.computes if c.name in ("m", "p"))
    assert [c.name for c in backward.outputs] == ["d_x"]


def test_softmaxes_differentiate_from_their_saved_outputs_where_autograd_has_them(rng):
    """With the forward's outputs at hand (autograd saved them), softmax's backward reads its
    output, not x (no statistics, no exp: y·(dy − Σ dy·y)), log-softmax's one exp of its output;
    other programs are unchanged; the gradients those give on the CPU match torch's float64
    (temperature and all: the chain continues past the normalised argument)."""
    import tensorfuse.kernels as K
    from tensorfuse.algebra.exprs import nodes
    from tensorfuse.autograd import GradientKernel
    from tensorfuse.dsl.expr import Load, Unary

    for kernel, exps in ((K.softmax, 0), (K.log_softmax, 1)):
        saved: list = []
        backward, _ = gradient_program(kernel.program, saved=saved)
        assert saved == [0] and backward.params[-1].name == "out_saved"
        read = {n.param.name for c in backward.computes for b in c.bodies for n in nodes(b)
                if isinstance(n, Load)}
        assert read == {"d_out", "out_saved"}, read
        assert sum(isinstance(n, Unary) and n.op == "exp" for c in backward.computes
                   for b in c.bodies for n in nodes(b)) == exps
    saved = []
    assert [p.name for p in gradient_program(K.layernorm.program, saved=saved)[0].params] == \
        ["x", "weight", "bias", "eps", "d_out"] and saved == []

    @tf.kernel
    def tempered(x: X, t: T.f32):
        i, j = T.axes("i j")
        m = T.max(x[i, j], over=j)
        p = T.exp((x[i, j] - m) / t)
        return p / T.sum(p, over=j)

    x = rng.standard_normal((4, 9)) * 3
    seed = rng.standard_normal((4, 9))
    xt = torch.tensor(x, requires_grad=True)
    y = torch.softmax(xt / 0.7, -1)
    y.backward(torch.tensor(seed))
    got = GradientKernel(tempered, saved_outputs=True)(x, 0.7, seed, y.detach().numpy(),
                                                       target="llvm")
    # the temperature is an f32 scalar: its division rounds to f32 (2⁻²⁴)
    np.testing.assert_allclose(got, xt.grad.numpy(), rtol=1e-6, atol=1e-9)


def test_an_unused_input_gets_a_zero_gradient(rng):
    @tf.kernel
    def first(x: X, y: X):
        i, j = T.axes("i j")
        return T.exp(x[i, j])

    dx, dy = tf.grad(first)(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)),
                            np.ones((2, 3)), target="llvm")
    assert np.all(dy == 0.0) and dy.shape == (2, 3)
    assert np.all(dx > 0.0)


@pytest.mark.parametrize("target", ["llvm", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "cross_entropy", "rmsnorm",
                                  "layernorm", "causal_attention"])
def test_bf16_library_kernels_match_torch_gradients(name, target):
    """The library's bf16 kernels: gradients within bf16 rounding of PyTorch's on the same
    values (computed in float64), on the CPU and on the GPU (ragged sizes)."""
    torch.manual_seed(1)
    kernel = K.ALL[name]
    device = "cpu" if target == "llvm" else "cuda"

    def made(*shape):
        return torch.randn(*shape, device=device).bfloat16().requires_grad_()
    if name == "causal_attention":
        tensors, others = [made(1, 2, 9, 16), made(1, 2, 9, 16), made(1, 2, 9, 16)], \
            {"scale": 0.25}

        def reference(q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                    scale=0.25)
    elif name == "layernorm":   # its gradient's reference reads a size (1 / N) and eps
        tensors, others = [made(5, 40), made(40), made(40)], {"eps": 1e-5}

        def reference(x, w, b):
            return torch.nn.functional.layer_norm(x, (40,), w, b, 1e-5)
    elif name == "cross_entropy":   # f32 losses of bf16 logits, a gathered target
        tensors, others = [made(5, 40)], {"target": torch.randint(0, 40, (5,), device=device,
                                                                   dtype=torch.int32)}

        def reference(x):
            return torch.nn.functional.cross_entropy(x, others["target"].long(),
                                                     reduction="none")
    elif name == "log_softmax":
        tensors, others = [made(5, 40)], {}

        def reference(x):
            return torch.log_softmax(x, -1)
    elif name == "rmsnorm":
        tensors, others = [made(5, 40), made(40)], {"eps": 1e-5}

        def reference(x, w):
            return torch.nn.functional.rms_norm(x, (40,), w, 1e-5)
    else:
        tensors, others = [made(5, 40)], {}

        def reference(x):
            return torch.softmax(x, -1)
    out = tf.compile(kernel, target=target)(*tensors, **others)
    seed = torch.randn(out.shape, dtype=torch.float64, device=device)
    got = torch.autograd.grad(out, tensors, seed.to(out.dtype))
    exact = [t.detach().double().requires_grad_() for t in tensors]
    want = torch.autograd.grad(reference(*exact), exact, seed)
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16 and g.device.type == device
        error = (g.double() - w).norm() / w.norm()
        assert error < 2e-2, f"{name}: relative error {error:.1e}"


def test_inside_torch_compile_the_backward_is_traced():
    """Under torch.compile (AOT autograd, fake tensors) the backward goes through the backward
    kernel's own custom operator."""
    f = tf.compile(rmsnorm, target="llvm")
    x, w = _t(3, 11), _t(11)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def loss(x, w):
        return (f(x, w, eps=1e-5) ** 2).sum()

    loss(x, w).backward()
    got = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    ms = (x * x).mean(-1, keepdim=True)
    ((x * torch.rsqrt(ms + 1e-5) * w) ** 2).sum().backward()
    torch.testing.assert_close(got, (x.grad, w.grad))


def test_what_has_no_gradient_is_refused_with_the_reason():
    with pytest.raises(GradientError, match="target is a i32 tensor"):
        tf.grad(cross_entropy, wrt=["target"])
    with pytest.raises(GradientError, match="eps is a scalar parameter"):
        tf.grad(rmsnorm, wrt="eps")
    with pytest.raises(GradientError, match="no tensor parameter 'y'"):
        tf.grad(rmsnorm, wrt="y")

    @tf.kernel
    def best(x: X):
        i, j = T.axes("i j")
        value, index = T.max_argmax(x[i, j], over=j)
        return value * index

    with pytest.raises(GradientError, match="argmax.*an index has no gradient"):
        tf.grad(best)

    @tf.kernel
    def compounded(x: X):
        i, j = T.axes("i j")
        return T.reduce(x[i, j], over=j, monoid=COMPOUND)

    with pytest.raises(GradientError, match="compound reduction are not supported"):
        tf.grad(compounded)


# a monoid of the user's own (compound growth): no derivative rule is known for it
COMPOUND = T.Monoid("compound", lambda a, b: a + b + a * b, (0.0,))


def test_a_kernel_that_cannot_be_differentiated_says_so_in_backward():
    @tf.kernel
    def compounded(x: X):
        i, j = T.axes("i j")
        return T.reduce(x[i, j], over=j, monoid=COMPOUND) + 0.0 * x[i, 0]

    f = tf.compile(compounded, target="llvm")
    out = f(_t(2, 3))
    with pytest.raises(RuntimeError, match="cannot differentiate compounded.*compound"):
        out.sum().backward()


@pytest.mark.parametrize("zeros", [0, 1, 2])
def test_a_products_gradient_is_the_product_of_the_other_terms_zeros_included(rng, zeros):
    """Each term gets the product of the others — where terms are 0 too (a row with one zero:
    the product of the rest at the zero, 0 elsewhere; with two: 0), as torch.prod's backward —
    against float64 autograd, on the CPU target and through the Triton template as
    ``tf.compile`` makes it for sm_90a (:mod:`tests.dsl.row_backward_check`)."""
    h = torch.from_numpy(rng.uniform(-0.5, 0.9, (5, 13)).astype(np.float32))
    for k in range(zeros):
        h[1::2, 3 + 4 * k] = 1.0   # 1 − h = 0 in every other row
    d = torch.from_numpy(rng.standard_normal(5).astype(np.float32))
    exact = h.double().requires_grad_()
    (want,) = torch.autograd.grad((1.0 - exact).prod(1), [exact], d.double())
    leaf = h.clone().requires_grad_()
    (got,) = torch.autograd.grad(tf.compile(survival, "llvm")(leaf), [leaf], d)
    assert (got.double() - want).norm() <= 1e-5 * want.norm(), (got, want)
    assert ((got == 0) == (want == 0)).all()   # exactly where torch's is


def test_out_is_refused_while_autograd_records():
    f = tf.compile(rmsnorm, target="llvm")
    x, w = _t(2, 5), _t(5)
    with pytest.raises(TypeError, match="out= is not supported while autograd records"):
        f(x, w, eps=1e-5, out=torch.empty(2, 5, dtype=torch.float64))
    with torch.no_grad():   # nothing recorded: out= as usual
        out = torch.full((2, 5), float("nan"), dtype=torch.float64)
        f(x, w, eps=1e-5, out=out)
    want = x.detach() * torch.rsqrt((x.detach() ** 2).mean(-1, keepdim=True) + 1e-5) * w.detach()
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_a_backward_computes_each_repeated_sum_once():
    """The product rule's two halves of ``(x - mean) * (x - mean)`` are one sum, read twice (a
    group norm's backward had two equal sums, each a state of the row kernel's pass)."""
    from benchmarks.user_kernels import group_norm

    program = tf.grad(group_norm).program
    signatures = [(tuple(a.uid for a in c.axes), tuple(a.uid for a in c.over),
                   tuple(b.key() for b in c.bodies)) for c in program.computes]
    assert len(set(signatures)) == len(signatures)
    assert [c.name for c in program.computes if c.is_reduction] == [
        "mean_sum", "var_sum", "d_var", "d_mean_sum", "d_mean_sum_2", "d_w_sum", "d_bias_sum"]


@tf.kernel
def row_scaled_squares(x: T.Tensor["M", "N", "f32"], d: T.Tensor["M", "bf16"]):
    """Each element's square scaled by ``d[i] / Σ_j x⁴``, written as a masked sum over j (the
    form a gradient's read at another index takes): a member over (row, column) whose factor is
    a rolling sum's function, with a bf16 row factor."""
    i, j, k = T.axes("i"), T.axis("j", "N"), T.axis("k", "N")
    y = x[i, j] * x[i, j]
    scale = d[i] / T.sum(y * y, over=j)
    return T.sum(T.where(j == k, scale * y, 0.0), over=j)


def test_a_bf16_row_factor_in_a_rolling_update_on_the_cpu(rng):
    """Rows of 300 swept in chunks of 128 on the CPU: the update of a member with several states
    bound its results, and TVM's bf16 legalisation read the bf16 ``d[i]`` inside them as its
    integer bits (the output thousands of times too large). Now the old states are bound."""
    x = torch.from_numpy(rng.standard_normal((3, 300)).astype(np.float32) * 3)
    d = torch.from_numpy(rng.standard_normal(3).astype(np.float32)).bfloat16()
    got = tf.compile(row_scaled_squares, "llvm")(x, d)
    y = x.double() ** 2
    want = d.double()[:, None] / (y * y).sum(1, keepdim=True) * y
    assert (got.double() - want).norm() <= 1e-5 * want.norm()


def test_the_gradient_of_a_swiglu_over_row_halves_on_the_cpu(rng):
    """Its backward reads x at j and at j + N/2, each part a masked sum beside the rolling sum
    of squares: bf16 rows of 300 (two chunks) against float64 autograd."""
    from tests.schedule_templates.user_written_more_check import swiglu_rms

    x = torch.from_numpy(rng.standard_normal((4, 300)).astype(np.float32) * 3).bfloat16()
    leaf = x.clone().requires_grad_()
    seed = torch.from_numpy(rng.standard_normal(4).astype(np.float32)).bfloat16()
    (got,) = torch.autograd.grad(tf.compile(swiglu_rms, "llvm")(leaf), [leaf], seed)
    exact = x.double().requires_grad_()
    a, b = exact[:, :150], exact[:, 150:]
    (want,) = torch.autograd.grad((torch.nn.functional.silu(a) * b).pow(2).mean(1).sqrt(),
                                  [exact], seed.double())
    assert (got.double() - want).norm() <= 2e-2 * want.norm()
