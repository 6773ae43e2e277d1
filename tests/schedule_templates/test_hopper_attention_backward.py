"""The sm_90a attention backward (``targets/cuda/hopper_attention_backward.py``): which plans it
takes and why it refuses the others, the code nvcc makes of it (wgmma, TMA loads, TMA
reductions into dQ, no spills, no serialised wgmma), the tensor maps of permuted layouts, and
on a GPU its gradients against float64 autograd for every variant it takes."""
import re

import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.errors import TargetError, TensorfuseError
from tensorfuse.schedule_templates.attention_backward import (BackwardKnobs,
                                                              plan_attention_backward)
from tensorfuse.schedule_templates.auto import choose
from tensorfuse.schedule_templates.hopper_attention_backward import (hopper_backward,
                                                                    plan_hopper_backward)
from tensorfuse.targets import get_target
from tensorfuse.targets.codegen import cuda_to_ptx
from tensorfuse.targets.cuda.hopper_attention_backward import BACKWARD_PTX, backward_source
from tensorfuse.targets.cuda.tma import load_helper
from tensorfuse.targets.triton.attention_backward import AttentionBackwardKernels
from tests.helpers import needs_nvcc
from benchmarks.unlisted_kernels import attention_keys_transposed
from benchmarks.user_kernels import bshd_gqa_causal, sbhd_causal
from tests.schedule_templates.test_hopper_attention import (_ptxas_and_sass,
                                                            assert_consumers_do_not_spill)

DIMS = dict(B=2, H=16, M=1000, N=1000, D=128)


def _plan(kernel, dims=DIMS):
    _, fusion = choose(kernel.program, get_target("cuda:sm_90a"))
    return plan_attention_backward(kernel.program, fusion, dims)


def _source(kernel, dims=DIMS):
    plan = _plan(kernel, dims)
    hplan = plan_hopper_backward(plan, "sm_90a")
    return backward_source(hplan, [(p.name, p.dtype) for p in plan.program.scalar_params])


def test_the_plans_it_takes_and_what_it_reads_of_them():
    grouped = plan_hopper_backward(_plan(K.gqa_causal_attention, dict(DIMS, H=32, HKV=8)),
                                   "sm_90a")
    assert grouped.masked and grouped.base.group == 4 and grouped.dtype == "bf16"
    assert "scale" in repr(grouped.factor)
    window = plan_hopper_backward(_plan(K.sliding_window_attention, dict(DIMS, D=64)), "sm_90a")
    assert window.masked and window.head_dim == 64 and window.mask_tensors == ()
    document = plan_hopper_backward(_plan(K.document_attention, DIMS), "sm_90a")
    assert document.mask_tensors != ()   # the mask's tensors are kernel arguments
    assert grouped.bias is None and document.bias is None
    # ALiBi: q·kᵀ · scale plus the head's slope times the distance, evaluated where P is
    alibi = plan_hopper_backward(_plan(K.alibi_attention, DIMS), "sm_90a")
    assert "scale" in repr(alibi.factor) and "exp2" in repr(alibi.bias)
    source = _source(K.alibi_attention)
    assert "exp2" in source.split("tf_bias2(")[1] and "+ tf_bias2(bh, i_, j_" in source
    assert "tf_bias2" not in _source(K.attention)
    # a soft-cap: the score and its derivative in q·kᵀ evaluated per element, P packed as made
    capped = plan_hopper_backward(_plan(K.softcap_attention, DIMS), "sm_90a")
    assert capped.factor is None and capped.bias is None and capped.masked
    assert "tanh" in repr(capped.score) and "tanh" in repr(capped.derivative)
    assert "__ds" not in repr(capped.derivative)   # ∂S/∂(q·k) alone, dS multiplied in the kernel
    source = _source(K.softcap_attention)
    assert "tanh" in source.split("tf_score2(")[1] and "tanh" in source.split("tf_dscore(")[1]
    assert "p * tf_dscore(qk, bh, i_, j_" in source and "tf_score2" not in _source(K.attention)


def test_head_dims_up_to_64_visit_128_queries_a_block():
    """Up to head dim 64 a visit takes 128 queries (Sᵀ and dPᵀ as m64n128 products, each
    warpgroup's dQ its 64 of the queries over both warpgroups' keys); above, and for a
    pointwise score (its packed P beside P · ∂S/∂(q·k)), 64."""
    def hplan(kernel, D):
        return plan_hopper_backward(_plan(kernel, dict(DIMS, D=D)), "sm_90a")

    assert hplan(K.causal_attention, 64).block_queries == 128
    assert hplan(K.attention, 40).block_queries == 128   # held in tiles of 64
    assert hplan(K.attention, 128).block_queries == 64
    assert hplan(K.attention, 96).block_queries == 64
    assert hplan(K.softcap_attention, 64).block_queries == 64
    source = _source(K.causal_attention, dict(DIMS, D=64))
    assert "#define BM 128" in source and "#define SPLIT_M 1" in source
    assert "tf_wgmma_kk_m64n128k16(st" in source
    wide = _source(K.attention)
    assert "#define BM 64" in wide and "#define SPLIT_M 0" in wide and "#define SPLIT_N 1" in wide


@pytest.mark.parametrize("kernel, dims, side_by_side", [
    (K.attention, dict(DIMS, M=4096, N=4096), True),       # 32 heads' dQ: 64 MiB
    (K.attention, dict(DIMS, M=1024, N=1024), False),      # 16 MiB stay in L2
    (K.attention, dict(DIMS, M=4096, N=4096, D=64), False),
    (K.causal_attention, dict(DIMS, M=16384, N=16384), True),
    (K.causal_attention, dict(DIMS, M=4096, N=4096), False),   # 1024 uneven CTAs: the tail
    (K.gqa_causal_attention, dict(DIMS, H=32, HKV=8, M=16384, N=16384), True),
    (K.gqa_causal_attention, dict(DIMS, H=32, HKV=8, M=4096, N=4096), False),
    (K.attention, dict(DIMS, B=4096, H=32, M=4096, N=4096), False),   # past the grid's y
])
def test_a_heads_key_blocks_run_side_by_side_where_its_dq_would_leave_l2(kernel, dims,
                                                                          side_by_side):
    """The grid walks a head's key blocks side by side (the CTAs running at once add into one
    head's dQ) where the heads side by side would add into more float32 dQ than L2 holds —
    under a mask only where there are enough CTAs that the longest starting late costs little —
    and never past the bound of a grid's y."""
    hplan = plan_hopper_backward(_plan(kernel, dims), "sm_90a")
    assert hplan.keys_fastest == side_by_side
    order = "kb = blockIdx.x, bhk = blockIdx.y" if side_by_side else \
        "kb = blockIdx.y, bhk = blockIdx.x"
    assert order in backward_source(hplan, [(p.name, p.dtype)
                                            for p in hplan.base.program.scalar_params])


@pytest.mark.parametrize("kernel, dims, arch, reason", [
    (K.causal_attention, DIMS, "sm_80", "runs on sm_90a"),
    (K.causal_attention, dict(DIMS, D=256), "sm_90a", r"head dims \(64, 128\) and .*, not 256"),
    (K.causal_attention, dict(DIMS, D=100), "sm_90a", r"multiples of 8 .*, not 100"),
    (attention_keys_transposed, dict(B=2, H=4, S=1000, D=128), "sm_90a",
     "reads kt with its head dim innermost"),
])
def test_what_it_does_not_take_is_refused_with_the_reason(kernel, dims, arch, reason):
    with pytest.raises(TargetError, match=reason):
        plan_hopper_backward(_plan(kernel, dims), arch)


def test_it_is_chosen_where_it_takes_the_plan_unless_asked_not_to(monkeypatch):
    """By default (and ``hopper``) wherever it takes the plan — it measured faster than the
    Triton kernels under every mask and head dim it takes —, ``triton`` never; another value
    is an error naming the ones there are."""
    target = get_target("cuda:sm_90a")

    def chosen(kernel, dims=DIMS):
        plan = _plan(kernel, dims)
        made = hopper_backward(plan, target, AttentionBackwardKernels(plan, BackwardKnobs()))
        assert made is None or made.plan is plan
        return made is not None

    for choice in ("auto", "hopper"):
        monkeypatch.setenv("TENSORFUSE_ATTENTION_BACKWARD", choice)
        assert chosen(K.attention) and chosen(K.attention, dict(DIMS, D=96))   # tiles of 128
        assert chosen(K.causal_attention) and chosen(K.attention, dict(DIMS, D=64))
        assert chosen(K.gqa_causal_attention, dict(DIMS, H=32, HKV=8))
        assert chosen(K.alibi_attention) and chosen(K.softcap_attention)
        assert not chosen(K.attention, dict(DIMS, D=256))
    monkeypatch.delenv("TENSORFUSE_ATTENTION_BACKWARD")
    assert chosen(K.sliding_window_attention)   # the default is auto
    monkeypatch.setenv("TENSORFUSE_ATTENTION_BACKWARD", "triton")
    assert not chosen(K.attention)
    monkeypatch.setenv("TENSORFUSE_ATTENTION_BACKWARD", "cudnn")
    with pytest.raises(TensorfuseError, match="one of auto, hopper, triton"):
        chosen(K.attention)


@needs_nvcc
@pytest.mark.parametrize("kernel, dims", [
    (K.attention, DIMS), (K.causal_attention, dict(DIMS, D=64)),
    (K.gqa_causal_attention, dict(DIMS, H=32, HKV=8)), (K.sliding_window_attention, DIMS),
    (K.alibi_attention, DIMS), (K.softcap_attention, DIMS), (K.softcap_attention, dict(DIMS, D=64)),
    (bshd_gqa_causal, dict(B=2, M=1000, N=1000, H=32, HKV=8, D=128)),
])
def test_the_sm90a_code_has_the_instructions_meant_and_does_not_spill(kernel, dims):
    source = _source(kernel, dims)
    ptx = cuda_to_ptx(source, get_target("cuda:sm_90a"))
    permuted = kernel is bshd_gqa_causal   # loads from 4-D maps
    for instruction in BACKWARD_PTX:
        if permuted and instruction == "cp.async.bulk.tensor.3d":
            instruction = "cp.async.bulk.tensor.4d"
        assert instruction in ptx, instruction
    assert "red.global" not in ptx   # dQ is added by TMA, not element by element
    # a value kept for the last dK/dV stores may be stored once outside the block loop
    assert_consumers_do_not_spill(source, per_tile=4)
    # shared memory read and written as shared (LDS/STS), not through generic addresses: the
    # rows' statistics read generically stalled the consumers on the L1 path (ncu, H200)
    sass = _ptxas_and_sass(source)[1]
    assert not re.findall(r"\b(?:LD|ST)\.E\b", sass)
    assert re.search(r"\bLDS\b", sass) and re.search(r"\bSTS\b", sass)


@needs_nvcc
def test_a_bias_a_user_writes_is_evaluated_where_p_is():
    """A score written as q·kᵀ · scale minus a decay times the distance (a scalar argument): the
    bias is ``−decay · (i + N − M − j)`` in the kernel, read from its scalar, and compiles."""
    import tensorfuse as tf
    from tensorfuse import dsl as T
    from tensorfuse.kernels.attention import KV, Q, key_position, scores, softmax_attend

    @tf.kernel
    def decayed_causal(q: Q, k: KV, v: KV, scale: T.f32, decay: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = scores(q, k, b, h, h, i, j, d, scale) - decay * (key_position(i) - j)
        s = T.where(key_position(i) >= j, s, -T.inf)
        return softmax_attend(s, v[b, h, j, e], j)

    dims = dict(B=2, H=4, M=300, N=300, D=64)
    hplan = plan_hopper_backward(_plan(decayed_causal, dims), "sm_90a")
    assert "scale" in repr(hplan.factor) and "decay" in repr(hplan.bias) and hplan.masked
    source = _source(decayed_causal, dims)
    assert "return ((-(s_decay * ((((i_) + 300) - 300) - (j_))))) * 1.4426950408889634f;" in \
        source
    assert "ex2.approx" in cuda_to_ptx(source, get_target("cuda:sm_90a"))


def test_tensor_maps_stride_by_their_element_size():
    """The bytes a map steps per outer dimension: row-major or given strides, times the element
    size — f32 (dQ's accumulator) as well as bf16. (A loop variable once overwrote the element
    size here: every map got the strides of another tensor, found only on the GPU.)"""
    from tensorfuse.targets.cuda.tma import byte_strides

    assert byte_strides((32, 4096, 128), (1, 64, 64), "bf16") == (4096 * 128 * 2, 128 * 2)
    assert byte_strides((32, 4096, 128), (1, 64, 32), "f32") == (4096 * 128 * 4, 128 * 4)
    assert byte_strides((8, 16, 64), (1, 32, 64), "f16", strides=(64, 512)) == (128, 1024)
    with pytest.raises(ValueError, match="128 bytes .32 f32 elements., not 64"):
        byte_strides((32, 4096, 128), (1, 64, 64), "f32")
    # a box of one row (a key strip): any multiple of 16 bytes, unswizzled
    assert byte_strides((2, 4, 1000), (1, 1, 176), "f32") == (4 * 1000 * 4, 1000 * 4)
    with pytest.raises(ValueError, match="not 6 "):
        byte_strides((2, 1000), (1, 6), "bf16")
    with pytest.raises(TargetError, match="multiple of 16 bytes"):
        byte_strides((4, 3), (1, 64), "bf16", strides=(3,))


def test_permuted_layouts_are_read_through_their_own_strides():
    """``[B, S, H, D]`` and ``[S, B, H, D]`` programs get the kernel of the ``[B, H, S, D]``
    one: the same source but for the loads of q, k, v and dO, which read boxes of 4-D maps
    (head dim, tokens, head, batch) at the head and batch of the flattened index."""
    dims = dict(B=2, M=1000, N=1000, H=32, HKV=8, D=128)
    library = plan_hopper_backward(_plan(K.gqa_causal_attention, dims), "sm_90a")
    permuted = plan_hopper_backward(_plan(bshd_gqa_causal, dims), "sm_90a")
    assert not library.strided and permuted.strided
    assert permuted.orders == ((0, 2, 1, 3),) * 4   # [b, s, h, d] by role: b, h, s, d
    sequence_first = plan_hopper_backward(_plan(sbhd_causal, dict(dims, H=8, HKV=8)), "sm_90a")
    assert sequence_first.orders == ((1, 2, 0, 3),) * 4
    lines = _source(K.gqa_causal_attention, dims).splitlines()
    other = _source(bshd_gqa_causal, dims)
    changed = [line for line in other.splitlines() if line not in lines]
    loads = [line for line in changed if "tf_tma_load_4d(" in line]
    assert len(loads) == 5   # the helper, k, v, q, dO
    assert "#define H_ 32" in changed and "#define HKV_ 8" in changed
    coordinates = [line.strip() for line in changed if "a * 64," in line]
    assert coordinates == ["a * 64, n0, bhk % HKV_, bhk / HKV_, kv_full);"] * 2 + \
        ["a * 64, mb * BM, bh % H_, bh / H_, full + s);"] * 2
    helper = set(load_helper(4).splitlines())
    assert len([line for line in changed if line not in helper]) == 2 + 4 * 2   # nothing else


def _mapped(view, sizes, strides):
    """What a tensor map of ``sizes`` and element ``strides`` (None: row-major; the innermost
    contiguous) reads from ``view``'s address."""
    import math

    if strides is None:
        strides = tuple(math.prod(sizes[k + 1:]) for k in range(len(sizes) - 1))
    return view.as_strided(sizes, (*strides, 1))


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
def test_the_maps_read_each_tensor_in_the_roles_order(layout):
    """Emulated on the CPU: every element a map reads at (batch, head, token, d) — 4-D maps of
    permuted tensors, 3-D ones of ``[batch·heads, tokens, D]`` — is the tensor's element of those
    roles; k and v at their key/value head. Views TMA can read are read in place (no copy);
    those it cannot (a head dim that is not contiguous) are copied first. dK and dV, written in
    the roles' order, are given back as views in k's and v's own."""
    from tensorfuse.schedule_templates.hopper_attention_backward import (in_order,
                                                                        map_shapes,
                                                                        role_extents)

    B, S, H, HKV, D = 2, 40, 8, 2, 64
    kernel = {"bshd": bshd_gqa_causal, "bhsd": K.gqa_causal_attention}.get(layout, sbhd_causal)
    heads = H if layout == "sbhd" else HKV
    dims = dict(B=B, M=S, N=S, H=H, HKV=heads, D=D)
    hplan = plan_hopper_backward(_plan(kernel, dims), "sm_90a")
    shape = {"bshd": lambda h: (B, S, h, D), "sbhd": lambda h: (S, B, h, D),
             "bhsd": lambda h: (B, h, S, D)}[layout]
    # by role [b, h, s, d], from each layout
    to_roles = {"bshd": lambda t: t.permute(0, 2, 1, 3), "sbhd": lambda t: t.permute(1, 2, 0, 3),
                "bhsd": lambda t: t}[layout]
    g = torch.Generator().manual_seed(0)
    q, do = (torch.randn(*shape(H), generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(*shape(heads), generator=g).bfloat16() for _ in range(2))
    v = torch.randn(*shape(heads)[:-1], 2 * D, generator=g).bfloat16()[..., :D]   # a slice
    batch, kv = role_extents(hplan)
    assert batch == [B, H] and kv == [B, heads]
    shapes = map_shapes(hplan, (q, k, v, do))
    for t, (view, sizes, box, strides), n in zip((q, k, v, do), shapes, (H, heads, heads, H)):
        want = to_roles(t)
        read = _mapped(view, sizes, strides)
        assert torch.equal(read.reshape(want.shape), want)
        rank = 3 if layout == "bhsd" else 4
        assert len(sizes) == rank and box[:-2] == (1,) * (rank - 2) and box[-1] == 64
        if rank == 4:
            assert sizes == (B, n, S, D)
            assert view.data_ptr() == t.data_ptr()   # in place, the slice of v too
    dk = torch.randn(*kv, S, D, generator=g)
    back = in_order(dk, hplan.orders[1])
    assert back.shape == k.shape and torch.equal(to_roles(back), dk)
    # a head dim TMA cannot read by its strides: a copy of the view the map reads
    strided_d = torch.randn(*shape(H)[:-1], 2 * D, generator=g).bfloat16()[..., ::2]
    view, sizes, _, strides = map_shapes(hplan, (strided_d, k, v, do))[0]
    assert view.data_ptr() != strided_d.data_ptr() or layout == "bhsd"
    assert torch.equal(_mapped(view, sizes, strides).reshape(B, H, S, D), to_roles(strided_d))


def _float64_grads(q, k, v, dout, scale, mask, bias=None, cap=None):
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    s = torch.einsum("bhid,bhjd->bhij", q, k.repeat_interleave(group, 1)) * scale
    if bias is not None:
        s = s + bias
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    out = torch.einsum("bhij,bhjd->bhid", torch.softmax(s, -1), v.repeat_interleave(group, 1))
    return torch.autograd.grad(out, (q, k, v), dout.double())


@needs_nvcc
@pytest.mark.parametrize("kernel, D, tile", [(K.attention, 96, 128),
                                             (K.causal_attention, 40, 64)])
def test_head_dims_below_a_tile_are_held_in_it(kernel, D, tile):
    """A head dim between the tiles' (96, 40) runs in tiles of the next (128, 64): the tensors'
    rows beside the tiles' dims, dK and dV not stored past a row (dQ is added by TMA through a
    map of the tensor's rows); the same instructions, no spill in the consumers."""
    source = _source(kernel, dict(DIMS, D=D))
    assert f"#define D_ {tile}\n#define ROW_D_ {D}" in source
    assert "if (key < N_ && c < ROW_D_) {" in source and "* N_ + key) * ROW_D_ + c" in source
    whole = _source(kernel, dict(DIMS, D=tile))
    assert "ROW_D_" not in whole
    ptx = cuda_to_ptx(source, get_target("cuda:sm_90a"))
    for instruction in BACKWARD_PTX:
        assert instruction in ptx, instruction
    assert_consumers_do_not_spill(source, per_tile=4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["full", "causal", "gqa_causal", "sliding_window", "document",
                                  "alibi", "softcap"])
@pytest.mark.parametrize("D, S", [(64, 200), (128, 333), (96, 300), (40, 177)])
def test_the_gradients_match_float64_on_the_gpu(name, D, S):
    """Large value ranges, ragged sizes (the last key and query blocks partial)."""
    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.schedule_templates.attention_chain import with_logsumexp
    import tensorfuse as tf

    kernel = {"full": K.attention, "causal": K.causal_attention,
              "gqa_causal": K.gqa_causal_attention,
              "sliding_window": K.sliding_window_attention,
              "document": K.document_attention, "alibi": K.alibi_attention,
              "softcap": K.softcap_attention}[name]
    hq, hkv = (8, 2) if name == "gqa_causal" else (4, 4)
    g = torch.Generator(device="cuda").manual_seed(S + D)
    # a mask that reads a tensor: 3 documents of random lengths per batch row
    cuts = torch.sort(torch.randperm(S - 1, device="cuda", generator=g)[:2] + 1).values
    doc = torch.bucketize(torch.arange(S, device="cuda"), cuts, right=True).to(torch.int32)
    doc = doc[None].expand(2, S).contiguous()
    # a cap the scores reach (3·N(0, 1) operands): tanh's derivative far from 1
    extra = {"sliding_window": {"window": 48}, "document": {"doc": doc},
             "softcap": {"cap": 4.0}}.get(name, {})
    q, dout = (3 * torch.randn(2, hq, S, D, device="cuda", generator=g).bfloat16()
               for _ in range(2))
    k, v = (3 * torch.randn(2, hkv, S, D, device="cuda", generator=g).bfloat16()
            for _ in range(2))
    i, j = torch.arange(S, device="cuda").view(-1, 1), torch.arange(S, device="cuda")
    mask = {"full": None, "causal": i >= j, "gqa_causal": i >= j,
            "sliding_window": (i >= j) & (i - j < 48),
            "document": doc[:, None, :, None] == doc[:, None, None, :], "alibi": None,
            "softcap": i >= j}[name]
    target = get_target("cuda")
    _, fusion = choose(kernel.program, target)
    saving = tf.compile(ProgramKernel(with_logsumexp(kernel.program, fusion.names)))
    out, lse = saving(q, k, v, *([doc] if name == "document" else []), D ** -0.5,
                      *(v_ for n, v_ in extra.items() if n != "doc"))
    dims = dict(B=2, H=hq, M=S, N=S, D=D, **({"HKV": hkv} if hkv != hq else {}))
    plan = plan_attention_backward(kernel.program, fusion, dims)
    hopper = hopper_backward(plan, target, AttentionBackwardKernels(plan, BackwardKnobs()),
                              chosen=True)
    tensors = {"q": q, "k": k, "v": v, **({"doc": doc} if name == "document" else {})}
    scalars = {"scale": D ** -0.5, **{n: v_ for n, v_ in extra.items() if n != "doc"}}
    got = hopper(tensors, scalars, out, dout, lse)
    slopes = torch.exp2(-8.0 * torch.arange(1, hq + 1, device="cuda").double() / hq)
    bias = slopes.view(-1, 1, 1) * (j - i).double() if name == "alibi" else None
    want = _float64_grads(q, k, v, dout, D ** -0.5, mask, bias, extra.get("cap"))
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        assert float((a.double() - b).norm() / b.norm()) < 2e-2   # bf16 operands


@tf.kernel
def float32_output_attention(q: T.Tensor["B", "H", "M", "D", "bf16"],
                             k: T.Tensor["B", "H", "N", "D", "bf16"],
                             v: T.Tensor["B", "H", "N", "D", "bf16"], scale: T.f32):
    """Attention whose output a user asks in float32: its gradient dO is float32."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    m = T.max(s, over=j)
    p = T.exp(s - m)
    return T.cast(T.sum(p * v[b, h, j, e], over=j) / T.sum(p, over=j), "f32")


@pytest.mark.gpu
def test_a_float32_outputs_gradient_is_read_as_float32_on_the_gpu():
    """The sm_90a backward of a float32 output: dO arrives float32 and goes to the kernel's bf16
    tiles converted (its bytes read as bf16 were other numbers); the forward stores float32
    from the Hopper template. Autograd through tf.compile against float64."""
    from tensorfuse.schedule_templates.hopper_attention_plan import plan_hopper_attention

    assert plan_hopper_attention(float32_output_attention.program, ("m", "out_sum", "out_sum_2"),
                                 "j").chain.out_dtype == "f32"
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (3 * torch.randn(2, 4, 333, 64, device="cuda", generator=g).bfloat16()
               .requires_grad_() for _ in range(3))
    dout = torch.randn(2, 4, 333, 64, device="cuda", generator=g)
    out = tf.compile(float32_output_attention)(q, k, v, 0.125)
    assert out.dtype == torch.float32
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = _float64_grads(q, k, v, dout, 0.125, None)
    for a, b in zip(got, want):
        assert float((a.double() - b).norm() / b.norm()) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_permuted_layouts_gradients_match_float64_on_the_gpu(layout, monkeypatch):
    """``[B, S, H, D]`` q, k, v sliced out of one fused projection (read in place through their
    strides) and ``[S, B, H, D]`` ones: autograd through ``tf.compile`` runs the Hopper backward
    and its gradients match float64 (ragged length, large values)."""
    from tensorfuse.schedule_templates import hopper_attention_backward as backward

    ran = []
    call = backward.HopperAttentionBackward.__call__
    monkeypatch.setattr(backward.HopperAttentionBackward, "__call__",
                        lambda self, *a, **kw: ran.append(self) or call(self, *a, **kw))
    B, S, D = 2, 333, 128
    H, HKV = (8, 2) if layout == "bshd" else (4, 4)
    g = torch.Generator(device="cuda").manual_seed(11)
    if layout == "bshd":
        qkv = 3 * torch.randn(B, S, H + 2 * HKV, D, device="cuda", generator=g).bfloat16()
        q, k, v = (qkv[:, :, a:b].detach().requires_grad_()
                   for a, b in ((0, H), (H, H + HKV), (H + HKV, H + 2 * HKV)))
        roles = (lambda t: t.transpose(1, 2))
        kernel = bshd_gqa_causal
    else:
        q, k, v = (3 * torch.randn(S, B, H, D, device="cuda", generator=g).bfloat16()
                   .requires_grad_() for _ in range(3))
        roles = (lambda t: t.permute(1, 2, 0, 3))
        kernel = sbhd_causal
    dout = torch.randn(*q.shape, device="cuda", generator=g).bfloat16()
    out = tf.compile(kernel)(q, k, v, D ** -0.5)
    got = torch.autograd.grad(out, (q, k, v), dout)
    assert ran and ran[0].hplan.strided
    i, j = torch.arange(S, device="cuda").view(-1, 1), torch.arange(S, device="cuda")
    want = _float64_grads(*(roles(t) for t in (q, k, v, dout)), D ** -0.5, i >= j)
    for a, b, t in zip(got, want, (q, k, v)):
        assert a.shape == t.shape and torch.isfinite(a).all()
        assert float((roles(a).double() - b).norm() / b.norm()) < 2e-2   # bf16 operands
