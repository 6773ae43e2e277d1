"""Attention whose queries are shared by the batch (:mod:`tensorfuse.schedule_templates.
shared_queries`): learned latent queries over each sequence's keys, planned on the Hopper
template as the attention written with a batch (and head) axis on q — the same sm_90a source —,
the caller's q copied once per sequence; checked against float64 on the CPU (the rewritten
program's CPU kernel inside the same wrapper) and, marked ``gpu``, on the Hopper kernel."""
from __future__ import annotations

import warnings

import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.errors import NoTemplateWarning
from benchmarks.pipeline_kernels import latent_cross_attention
from tensorfuse.schedule_templates.shared_queries import SharedQueriesKernel, lift_shared_queries
from tests.helpers import fresh_seed, poisoned_call, relative_error, run_with_the_gpu_stubbed

HOPPER = "cuda:sm_90a"
CHAIN = ("m", "out_sum", "out_sum_2")


@tf.kernel
def latent_heads(q: T.Tensor["H", "L", "D", "bf16"], k: T.Tensor["B", "S", "H", "D", "bf16"],
                 v: T.Tensor["B", "S", "H", "D", "bf16"], scale: T.f32):
    """Latent queries per head (``q[h, l, d]``), shared by the batch, over ``[B, S, H, D]``
    keys and values."""
    b, h, l, j, d, e = T.axes("b h l j d e")
    s = T.sum(q[h, l, d] * k[b, j, h, d], over=d) * scale
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.cast(T.sum(p * v[b, j, h, e], over=j) / T.sum(p, over=j), "bf16")


def _reference(q, k, v, scale, heads: bool):
    """float64 softmax attention of latents ``q`` over each sequence's ``k`` and ``v``."""
    if heads:   # q [H, L, D]; k, v [B, S, H, D] -> out [B, H, L, D]
        k, v = k.double().transpose(1, 2), v.double().transpose(1, 2)
        s = torch.einsum("hld,bhjd->bhlj", q.double(), k) * scale
        return torch.einsum("bhlj,bhje->bhle", torch.softmax(s, -1), v)
    s = torch.einsum("ld,bjd->blj", q.double(), k.double()) * scale
    return torch.einsum("blj,bje->ble", torch.softmax(s, -1), v.double())


def _case(generator, heads: bool, B=3, H=2, L=37, S=77, D=32, width=3.0):
    def r(*shape):
        return (torch.randn(*shape, generator=generator) * width).bfloat16()
    if heads:
        q, k, v = r(H, L, D), r(B, S, H, D), r(B, S, H, D)
    else:
        q, k, v = r(L, D), r(B, S, D), r(B, S, D)
    scale = D ** -0.5
    return dict(q=q, k=k, v=v, scale=scale), _reference(q, k, v, scale, heads)


def test_latent_queries_are_planned_on_the_hopper_template():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoTemplateWarning)
        single = tf.compile(latent_cross_attention, HOPPER)
        headed = tf.compile(latent_heads, HOPPER)
    text = single.describe_plan(scale=0.1, L=256, B=32, S=4096, D=128)
    assert text.splitlines()[0].endswith(
        "queries shared by the batch: q copied once per sequence (B × its elements); a unit "
        "head axis on every tensor; hopper_attention (rolling_update(m, out_sum, out_sum_2, "
        "axis=j, chunk=32))")
    assert "hopper attention plan: out[B, ONE_H, L, D] from q, k, v" in text
    text = headed.describe_plan(scale=0.1, H=8, L=256, B=4, S=4096, D=128)
    assert "queries shared by the batch: q copied once per sequence (B × its elements); " \
           "hopper_attention" in text.splitlines()[0]
    assert "layouts by role" in text and "k bjhd" in text   # the keys read where they lie
    # few query rows stay on the Triton template (the Hopper route is prefill only)
    assert "attention template" in single.describe_plan(scale=0.1, L=37, B=3, S=77,
                                                         D=32).splitlines()[0]


def test_the_sm90a_source_is_that_of_the_attention_written_with_a_batch_and_head_axis():
    """The rewrite reaches the kernel the library's attention gets (``[B, H, M, D]``, one head):
    byte for byte but the names of the size macros."""
    import tensorfuse.kernels as K

    got = tf.compile(latent_cross_attention, HOPPER).source(L=256, B=32, S=4096, D=128)
    want = tf.compile(K.attention, HOPPER).source(B=32, H=1, M=256, N=4096, D=128)
    for mine, library in (("ONE_H", "H"), ("L", "M"), ("S", "N")):
        got = got.replace(f"#define TF_SIZE_{mine} ", f"#define TF_SIZE_{library} ")
    assert got == want


def test_attention_with_queries_per_sequence_is_left_as_written():
    import tensorfuse.kernels as K

    assert lift_shared_queries(K.gqa_attention.program, ("m", "o", "l"), "j") is None
    assert lift_shared_queries(K.attention.program, ("m", "o", "l"), "j") is None


def test_keys_whose_batch_axis_is_not_first_are_looked_up_by_identity():
    """Tensors lying in reversed order route the call to the program in their memory order,
    whose keys index the batch last: its size was looked up with ``list.index``, which compares
    DSL axes with ``==`` (an expression) and raised 'a tensor value was used where Python needs
    True/False'; now the route plans."""
    made = tf.compile(latent_cross_attention, target="cuda:sm_90a")
    q = torch.randn(64, 64).to(torch.bfloat16).t().contiguous().t()
    k, v = (torch.randn(64, 256, 2).to(torch.bfloat16).permute(2, 1, 0) for _ in range(2))
    plan = made.describe_call(q, k, v, 0.125)
    assert "read in memory order: q as [D, L]; k as [D, S, B]; v as [D, S, B]" in plan, plan


@pytest.mark.parametrize("heads", [False, True])
def test_shared_queries_match_float64_on_the_cpu(heads):
    """The wrapper's views and copies around the rewritten program's CPU kernel: fresh inputs,
    outputs poisoned, against float64 (bf16: 2e-2)."""
    from tensorfuse.dsl.program import ProgramKernel

    kernel = latent_heads if heads else latent_cross_attention
    shared = lift_shared_queries(kernel.program, CHAIN, "j")
    made = SharedQueriesKernel(kernel.program, shared,
                               tf.compile(ProgramKernel(shared.program), "llvm"),
                               tf.get_target("llvm"))
    seed = fresh_seed()
    args, want = _case(torch.Generator().manual_seed(seed), heads)
    (out,) = poisoned_call(made, kernel.program, args, want)
    assert relative_error(out, want) < 2e-2, seed
    assert relative_error(made(**args), want) < 2e-2, seed


_A_CALL = """
from tensorfuse.schedule_templates import shared_queries
copies = []
copy = shared_queries.per_sequence
shared_queries.per_sequence = lambda *a: copies.append(copy(*a)) or copies[-1]
import tensorfuse as tf
from benchmarks.pipeline_kernels import latent_cross_attention
f = tf.compile(latent_cross_attention, "cuda:sm_90a")
q = torch.randn(256, 128).bfloat16()
k, v = (torch.randn(2, 1000, 128).bfloat16() for _ in range(2))
for _ in range(3):
    f(q, k, v, 0.088)
chosen = f.for_sizes(L=256, B=2, S=1000, D=128)
print(json.dumps({"kernel": type(chosen).__name__,
                  "fast_calls": [c.calls for c in chosen._fast.values()],
                  "copies": [[list(c.shape), list(c.stride()), bool((c == q).all())]
                             for c in copies],
                  "maps": sorted({(("k" if a == k.data_ptr() else "v" if a == v.data_ptr()
                                    else "q copy" if a in {c.data_ptr() for c in copies}
                                    else "other"), tuple(s)) for a, s, _ in encoded})}))
"""


def test_a_call_copies_the_queries_per_sequence_and_reads_the_keys_where_they_lie():
    """The host side of calls on the Hopper kernel, the GPU's parts stubbed
    (``tools/profile_host_paths``): every call (the first checked, the next two on the fast
    call) gives the kernel q once per sequence, contiguous, and maps of the keys and values at
    their own addresses (the unit head merged into the batch: one map axis of
    (batch, head) pairs)."""
    found = run_with_the_gpu_stubbed(_A_CALL)
    assert found["kernel"] == "SharedQueriesKernel"
    assert found["fast_calls"] == [2]
    assert found["copies"] == [[[2, 1, 256, 128], [256 * 128, 256 * 128, 128, 1], True]] * 3
    assert found["maps"] == [["k", [2, 1000, 128]], ["q copy", [2, 256, 128]],
                             ["v", [2, 1000, 128]]]


@pytest.mark.gpu
@pytest.mark.parametrize("heads, D", [(False, 128), (True, 64)])
def test_shared_queries_on_the_hopper_kernel_match_float64(heads, D):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper template needs an sm_90 GPU")
    kernel = latent_heads if heads else latent_cross_attention
    seed = fresh_seed()
    args, want = _case(torch.Generator().manual_seed(seed), heads, L=150, S=333, D=D)
    args = {n: a.cuda() if isinstance(a, torch.Tensor) else a for n, a in args.items()}
    made = tf.compile(kernel)
    sizes = dict(L=150, B=3, S=333, D=D, **({"H": 2} if heads else {}))
    assert type(made.for_sizes(**sizes)).__name__ == "SharedQueriesKernel"
    for _ in range(2):   # the checked call, then the fast one
        (out,) = poisoned_call(made, kernel.program, args, want)
        assert relative_error(out, want) < 2e-2, seed
