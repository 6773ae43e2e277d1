"""Tensors and scalars named like a generated Triton kernel's own variables
(``targets/triton/shadowing.py``): ``tf.compile`` runs such a kernel as the same program with
those arguments named otherwise (``schedule_templates/renamed_params.py``) — on the template, not
TVM's default schedule —, a template applied to the names as written still refuses them with
the name and what to do, and every name a template writes is one :func:`template_may_write`
knows."""
import warnings

import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import TargetError
from tensorfuse.schedule_templates.renamed_params import RenamedKernel, template_safe_names
from tensorfuse.targets.triton.shadowing import (check_arguments_unshadowed, shadowed_arguments,
                                                 template_may_write, written_names)

from tests.helpers import fresh_seed, relative_error


def scaled_softmax(name: str, scalar: str = "gain"):
    """A softmax of tensor ``name``'s rows, scaled by a weight per column and the scalar
    ``scalar``."""
    source = f'''
@tf.kernel
def scaled_softmax({name}: T.Tensor["M", "N", "f32"], w: T.Tensor["N", "f32"], {scalar}: T.f32):
    i, j = T.axes("i j")
    m = T.max({name}[i, j], over=j)
    e = T.exp({name}[i, j] - m)
    return e / T.sum(e, over=j) * w[j] * {scalar}
'''
    scope = dict(tf=tf, T=T)
    exec(source, scope)
    return scope["scaled_softmax"]


@tf.kernel
def scored_attention(base: T.Tensor["B", "M", "N", "f32"], v: T.Tensor["B", "N", "D", "f32"]):
    """Attention over scores passed in, named ``base`` as the attention backward names its own."""
    b, i, j, d = T.axes("b i j d")
    m = T.max(base[b, i, j], over=j)
    p = T.exp(base[b, i, j] - m)
    return T.sum(p * v[b, j, d], over=j) / T.sum(p, over=j)


SOURCE = '''import triton
import triton.language as tl

def helper(a):
    seen = a
    return seen

@triton.jit
def kernel(x, lo, helper, n, out, BLOCK: tl.constexpr):
    n = n // 16 * 16
    offs = tl.arange(0, BLOCK)
    lo = offs * 2
    tl.store(out + offs, tl.load(x + lo), mask=offs < n)
'''


def test_arguments_a_kernel_replaces_or_a_module_name_are_found():
    """``lo`` assigned in the kernel, ``helper`` a module-level function; a helper's own
    variable (``seen``) is its own scope, and a size rounded to its divisor (``n = n // 16 *
    16``) keeps its meaning."""
    assert shadowed_arguments(SOURCE) == {"kernel": ["helper", "lo"]}
    assert shadowed_arguments(SOURCE.replace("x, lo, helper", "x, y, z")) == {}


NAMES = ["seen", "offs_m", "tl", "BLOCK_M", "ref_m", "st_m_0", "scaled_softmax_fused"]


@pytest.mark.parametrize("name", NAMES)
def test_a_template_applied_to_such_a_name_refuses_it_with_its_name(name):
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from tensorfuse.schedule_templates import TEMPLATES
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target

    kernel, spec = scaled_softmax(name), get_target("cuda:sm_90a")
    template, fusion = choose(kernel.program, spec)
    made = TEMPLATES[template](kernel, fusion, spec)
    with pytest.raises(TargetError, match=f"'{name}'.*rename it"):
        made.compiled(M=64, N=300)


@pytest.mark.parametrize("name", NAMES)
def test_tf_compile_names_it_otherwise_and_keeps_the_template(name):
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    made = tf.compile(scaled_softmax(name, "first"), target="cuda:sm_90a")
    assert isinstance(made, RenamedKernel) and set(made.renamed) == {name, "first"}
    assert made.schedule_origin(M=64, N=300) == "arguments renamed; template defaults"
    source = made.source(M=64, N=300)
    check_arguments_unshadowed(source)
    assert f"arg_{name}" in source and ".entry" in made.inner.ptx(M=64, N=300)


def test_other_names_are_kept():
    """The library's own names, names tensors commonly have (a template's variable of that name
    is namespaced: ``_t``, ``_lo``, ``_a_value``) and a name like a compute's state where no
    compute has that name are no such names."""
    import tensorfuse.kernels as K

    for kernel in (scaled_softmax("logits"), K.attention, K.softmax, K.layernorm):
        assert not template_safe_names(kernel.program), kernel.name
    for name in ("s", "t", "g", "lo", "v", "scale", "value", "idx", "ok", "k1", "out_sum",
                 "t_emb", "v_cache"):
        assert not template_safe_names(scaled_softmax(name, "gain").program), name
    assert template_safe_names(scaled_softmax("fin_m", "gain").program) == {"fin_m": "arg_fin_m"}
    made = tf.compile(scaled_softmax("logits"), target="cuda:sm_90a")
    assert not isinstance(made, RenamedKernel)


def test_the_other_names_are_free_and_written_by_no_template():
    names = template_safe_names(scaled_softmax("seen", scalar="arg_seen").program)
    assert names == {"seen": "arg_seen_"}
    assert not any(template_may_write(n) for n in names.values())


def test_a_renamed_kernels_fast_call_hands_the_inner_fast_call_the_other_names():
    """The fast call a renamed kernel keeps (the lifted kernels' own, given the names): the
    caller's tensors and scalars reach the inner kernel's fast call under the other names, its
    outputs the caller's."""
    from types import SimpleNamespace

    kernel = scaled_softmax("seen", "first")
    made = RenamedKernel(kernel.program, {"seen": "arg_seen", "first": "arg_first"},
                         SimpleNamespace(description="inner"), tf.get_target("cuda:sm_90a"))
    given = []

    def inner_fast(args, kwargs):
        given.append(kwargs)
        return kwargs["out"]
    x, w, out = torch.randn(4, 8), torch.randn(8), torch.empty(4, 8)
    bound = SimpleNamespace(arrays={"seen": x, "w": w}, torch_device="cpu")
    fast = made._fast_call([("seen", 0, True), ("w", 1, True), ("first", 2, float)],
                           [("out", (4, 8), "f32")], [0], [], bound,
                           {"arg_seen": x, "w": w, "arg_first": 2.0, "out": out}, inner_fast)
    got = fast((x, w, 3), {})
    assert set(given[-1]) == {"arg_seen", "w", "arg_first", "out"}
    assert given[-1]["arg_seen"] is x and given[-1]["arg_first"] == 3.0
    assert got.shape == (4, 8) and given[-1]["out"].data_ptr() == got.data_ptr()


def test_planning_speaks_of_the_arguments_by_their_own_names():
    """What planning the renamed program warns of names the caller's tensors."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        tf.compile(scored_attention, target="cuda:sm_90a")
    texts = [str(w.message) for w in said]
    assert texts and not any("arg_base" in t for t in texts), texts


def _written_names(source: str) -> set[str]:
    """The names a generated source's kernels write (:func:`written_names`) — but the integer
    helpers' (``_floordiv(a, b)``: no tensor is ever theirs); none for CUDA C++ (a native
    template's)."""
    try:
        written = written_names(source)
    except SyntaxError:
        return set()
    return set().union(*(n for k, n in written.items() if k not in ("_floordiv", "_floormod")))


def test_every_name_the_templates_write_is_one_they_may_write():
    """Over kernels of every Triton template (rows, columns, attention forward and backward,
    scans, bands, scatter-adds, GEMM tiles, the elementwise template), each name a generated
    kernel writes — a user's tensor of that name would be renamed."""
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from tests.targets.golden_sources import pinned
    from tests.targets.shadowed_names_sources import sources

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pinned():
            found = {n: where for where, source in sources() for n in _written_names(source)}
    assert len(found) > 100
    missed = {n: w for n, w in found.items() if not template_may_write(n)}
    assert not missed, missed


def _interpreted_errors() -> dict:
    """Under TRITON_INTERPRET=1: the renamed kernels' templates (the kernels tf.compile makes,
    their inner kernel the Triton template's) called positionally, by keyword, into poisoned
    outputs and again, against float64."""
    g = torch.Generator().manual_seed(fresh_seed())
    errors = {}
    made = tf.compile(scaled_softmax("seen", scalar="first"), target="cuda:sm_90a")
    run = RenamedKernel(made.program, made.renamed, made.inner.template, made.target)
    x, w = torch.randn(37, 300, generator=g) * 3, torch.rand(300, generator=g)
    want = torch.softmax(x.double(), -1) * w.double() * 2.5
    out = torch.full((37, 300), float("nan"))
    errors["softmax"] = max(relative_error(run(x, w, 2.5), want),
                            relative_error(run(seen=x, w=w, first=2.5), want),
                            relative_error(run(x, w, 2.5, out=out), want),
                            relative_error(out, want))
    made = tf.compile(scored_attention, target="cuda:sm_90a")
    run = RenamedKernel(made.program, made.renamed, made.inner.template, made.target)
    s, v = torch.randn(2, 40, 70, generator=g) * 4, torch.randn(2, 70, 32, generator=g)
    errors["attention"] = relative_error(run(base=s, v=v),
                                         torch.softmax(s.double(), -1) @ v.double())
    return errors


def test_renamed_kernels_compute_as_written_in_the_interpreter():
    pytest.importorskip("triton", reason="the templates generate Triton kernels")
    from tests.helpers import run_interpreted

    errors = run_interpreted("tests.targets.test_shadowed_names")
    assert set(errors) == {"softmax", "attention"} and max(errors.values()) < 1e-5, errors


@pytest.mark.gpu
def test_renamed_kernels_match_float64_on_the_gpu():
    """The kernels tf.compile makes, through their fast calls too."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    g = torch.Generator(device="cuda").manual_seed(fresh_seed())
    made = tf.compile(scaled_softmax("seen", scalar="first"))
    x, w = torch.randn(333, 1000, device="cuda", generator=g) * 3, \
        torch.rand(1000, device="cuda", generator=g)
    want = torch.softmax(x.double(), -1) * w.double() * 2.5
    for _ in range(3):
        out = torch.full_like(x, float("nan"))
        assert made(x, w, 2.5, out=out) is out and relative_error(out, want) < 1e-5
        assert relative_error(made(seen=x, w=w, first=2.5), want) < 1e-5
    assert made._fast
    made = tf.compile(scored_attention)
    s, v = torch.randn(2, 300, 700, device="cuda", generator=g) * 4, \
        torch.randn(2, 700, 64, device="cuda", generator=g)
    for _ in range(2):
        assert relative_error(made(s, v), torch.softmax(s.double(), -1) @ v.double()) < 1e-4
    # autograd: the gradient programs read s too (renamed in theirs)
    exact = [t.double().requires_grad_() for t in (s, v)]
    weights = torch.randn(2, 300, 64, device="cuda", generator=g, dtype=torch.float64)
    ((torch.softmax(exact[0], -1) @ exact[1]) * weights).sum().backward()
    given = [t.clone().requires_grad_() for t in (s, v)]
    (made(*given).double() * weights).sum().backward()
    for x, want in zip(given, exact):
        assert relative_error(x.grad, want.grad) < 1e-4


if __name__ == "__main__":
    import json

    print(json.dumps(_interpreted_errors()))
