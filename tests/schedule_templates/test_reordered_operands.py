"""Attention with one tensor holding its head dim outside another axis
(``schedule_templates/reordered_operands.py``): planned as the same attention declared with its
head dim innermost — the Hopper kernel of that program, byte for byte — and called with that
tensor copied into that order by a transpose on the elementwise template; more copies stay on
the Triton template. The wrapper on the CPU against float64; on the GPU against float64."""

import pytest
import torch

import tensorfuse as tf
from benchmarks.unlisted_kernels import attention_keys_transposed
from tensorfuse import dsl as T
from tensorfuse.kernels import softmax_attend
from tensorfuse.schedule_templates.hopper_attention_plan import head_dim_orders
from tensorfuse.schedule_templates.reordered_operands import (ReorderedKernel, head_dims_innermost,
                                                              reorder_program)
from tests.helpers import fresh_seed, poisoned_call, relative_error

HOPPER = "cuda:sm_90a"
CHAIN = ("m", "o", "l")   # softmax_attend's reductions
SIZES = dict(B=2, H=16, D=128, M=4096, N=4096)


@tf.kernel
def queries_first(q: T.Tensor["B", "H", "D", "M", "bf16"], k: T.Tensor["B", "H", "N", "D", "bf16"],
                  v: T.Tensor["B", "H", "N", "E", "bf16"], scale: T.f32):
    """Attention with its queries held ``[B, H, D, M]`` (a channels-first model's, projected and
    split into heads), the values of another head dim."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, d, i] * k[b, h, j, d], over=d) * scale
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def queries_transposed(q: T.Tensor["B", "H", "D", "S", "bf16"],
                       kt: T.Tensor["B", "H", "D", "S", "bf16"],
                       v: T.Tensor["B", "H", "S", "D", "bf16"], scale: T.f32):
    """``attention_keys_transposed`` with its queries held ``[B, H, D, S]`` too."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, d, i] * kt[b, h, d, j], over=d) * scale
    s = T.where(i >= j, s, -T.inf)
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def keys_head_outer(q: T.Tensor["B", "H", "M", "D", "f16"], k: T.Tensor["B", "D", "H", "N", "f16"],
                    v: T.Tensor["B", "H", "N", "D", "f16"], scale: T.f32):
    """Keys whose head dim is outside the heads: no TMA box reads them as they lie."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, d, h, j], over=d) * scale
    return softmax_attend(s, v[b, h, j, e], j)


def test_the_tensors_the_hopper_copies_cannot_read_are_the_ones_moved():
    from benchmarks.unlisted_kernels import attention_channels_first

    # q, k, v, the output by role; k may keep its keys innermost with the head dim next to them
    assert head_dim_orders(("bhid", "bhjd", "bhjd", "bhid")) == {}
    assert head_dim_orders(("bhid", "bhdj", "bhjd", "bhid")) == {}
    assert head_dim_orders(("bhid", "bhdj", "bhjd", "bhid"), reads_map=True) == {1: (0, 1, 3, 2)}
    assert head_dim_orders(("bhdi", "bdhj", "bhdj", "bhdi")) == {
        0: (0, 1, 3, 2), 1: (0, 2, 3, 1), 2: (0, 1, 3, 2), 3: (0, 1, 3, 2)}
    found = head_dims_innermost(queries_first.program, CHAIN, "j")
    assert found.orders == (("q", (0, 1, 3, 2)),)
    assert found.describe(queries_first.program) == \
        "head dims innermost for the Hopper attention's copies: q copied as [B, H, M, D]"
    assert [(p.name, p.dims) for p in found.program.tensor_params] == [
        ("q", ("B", "H", "M", "D")), ("k", ("B", "H", "N", "D")), ("v", ("B", "H", "N", "E"))]
    assert head_dims_innermost(keys_head_outer.program, CHAIN, "j").orders == \
        (("k", (0, 2, 3, 1)),)
    # layouts the Hopper template reads as they are: nothing to move
    assert head_dims_innermost(attention_keys_transposed.program, CHAIN, "j") is None
    # q, v and the output to move: three copies cost more than the Hopper template gains
    assert head_dims_innermost(attention_channels_first.program, CHAIN, "j") is None
    made = tf.compile(attention_channels_first, HOPPER)
    assert made.for_sizes(B=2, H=16, D=128, S=4096) is made.template


def test_transposed_queries_get_the_hopper_kernel_of_the_attention_declared_in_that_order():
    made = tf.compile(queries_transposed, HOPPER)
    sizes = dict(B=2, H=16, S=4096, D=128)
    chosen = made.for_sizes(**sizes, scale=0.088)
    assert isinstance(chosen, ReorderedKernel)
    assert made.schedule_origin(**sizes).startswith(
        "operands copied with their head dims innermost; hopper_attention template defaults")
    plan = made.describe_plan(**sizes)
    assert "not hopper_attention (at any sizes): hopper attention: TMA copies rows" in plan
    assert "head dims innermost for the Hopper attention's copies: q copied as [B, H, S, D]" \
        in plan
    assert made.source(**sizes) == tf.compile(attention_keys_transposed, HOPPER).source(**sizes)


def _on_the_cpu(kernel):
    """The wrapper alone, around the reordered program compiled for the CPU."""
    from tensorfuse.dsl.program import ProgramKernel

    found = head_dims_innermost(kernel.program, CHAIN, "j")
    return ReorderedKernel(kernel.program, found, tf.compile(ProgramKernel(found.program), "llvm"),
                           tf.get_target("llvm"),
                           lambda program: tf.compile(ProgramKernel(program), "llvm"))


def _reference(q, k, v, scale):
    """float64 attention of :func:`queries_first`'s layouts."""
    s = torch.einsum("bhdi,bhjd->bhij", q.double(), k.double()) * scale
    return torch.softmax(s, -1) @ v.double()


def test_a_reordered_kernel_copies_the_callers_queries_on_the_cpu():
    """Against float64 on large values and ragged sizes, its output made and given (poisoned);
    the caller's tensors are left as they were."""
    made = _on_the_cpu(queries_first)
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(2, 3, 16, 37, generator=g) * 4).bfloat16()
    k = (torch.randn(2, 3, 45, 16, generator=g) * 4).bfloat16()
    v = (torch.randn(2, 3, 45, 24, generator=g) * 4).bfloat16()
    kept = [t.clone() for t in (q, k, v)]
    want = _reference(q, k, v, 0.3)
    assert relative_error(made(q, k, v, 0.3), want) < 1e-2, seed
    (given,) = poisoned_call(made, queries_first.program, dict(q=q, k=k, v=v, scale=0.3), want)
    assert relative_error(given, want) < 1e-2, seed
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), kept))
    assert made.schedule_origin(B=2, H=3, D=16, E=24, M=37, N=45).startswith(
        "operands copied with their head dims innermost; ")


def test_the_copies_are_transposes_on_the_elementwise_template():
    """Each copy is a program of one read per element in the new order: the elementwise
    template's one flat pass for sm_90a (its loads along the source's contiguous axis), and on
    the CPU the permutation itself."""
    from tensorfuse.dsl.program import ProgramKernel

    program = reorder_program("q", ("B", "H", "D", "M"), "bf16", (0, 1, 3, 2))
    assert [c.name for c in program.outputs] == ["out"]
    assert [a.extent for a in program.outputs[0].axes] == ["B", "H", "M", "D"]
    made = tf.compile(ProgramKernel(program), HOPPER)
    assert made.schedule_origin(B=2, H=16, D=128, M=4096).startswith("elementwise template")
    x = torch.randn(2, 3, 5, 7).bfloat16()
    on_cpu = tf.compile(ProgramKernel(program), "llvm")
    assert torch.equal(on_cpu(x), x.transpose(2, 3))


@pytest.mark.gpu
def test_transposed_queries_run_on_the_hopper_attention():
    """On an H100/H200: queries held ``[B, H, D, M]`` against float64, on the checked path and
    the fast call, the output made and given (poisoned); and the transposed queries over
    transposed keys under a causal mask at a ragged length (784: TMA reads the keys' rows of
    784 bf16 — a multiple of 16 bytes — where 777 runs on the Triton template)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    made = tf.compile(queries_first)
    q = (torch.randn(2, 4, 128, 1000, generator=g) * 3).to("cuda", torch.bfloat16)
    k, v = ((torch.randn(2, 4, 900, 128, generator=g) * 3).to("cuda", torch.bfloat16)
            for _ in range(2))
    want = _reference(q.cpu(), k.cpu(), v.cpu(), 128 ** -0.5)
    for _ in range(3):   # the checked path, then the fast call
        assert relative_error(made(q, k, v, 128 ** -0.5), want) < 2e-2, seed
    (given,) = poisoned_call(made, queries_first.program,
                             dict(q=q, k=k, v=v, scale=128 ** -0.5), want)
    assert relative_error(given, want) < 2e-2, seed
    assert isinstance(made.for_sizes(B=2, H=4, D=128, E=128, M=1000, N=900), ReorderedKernel)
    causal = tf.compile(queries_transposed)
    S = 784
    q, kt = ((torch.randn(1, 2, 64, S, generator=g) * 3).to("cuda", torch.bfloat16)
             for _ in range(2))
    v = (torch.randn(1, 2, S, 64, generator=g) * 3).to("cuda", torch.bfloat16)
    s = torch.einsum("bhdi,bhdj->bhij", q.double(), kt.double()) * 0.125
    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    want = torch.softmax(s, -1) @ v.double()
    for _ in range(2):
        assert relative_error(causal(q, kt, v, 0.125), want) < 2e-2, seed
    assert isinstance(causal.for_sizes(B=1, H=2, D=64, S=S), ReorderedKernel)
