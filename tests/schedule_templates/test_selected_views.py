"""Tensors read at constant indices run as their slices (``schedule_templates/selected_views.py``):
attention over one packed ``qkv[B, S, 3, H, D]`` is planned as attention over three strided
``[B, S, H, D]`` tensors — the Hopper kernel of the same attention written over three tensors,
byte for byte — and called with the caller's slices (views, read by their own strides); the
wrapper on the CPU and the fast call against float64 and by the tensors they hand on; on the GPU
against float64 with the views not copied."""

import pytest
import torch

import tensorfuse as tf
from benchmarks.serving_kernels import packed_qkv_causal
from tensorfuse import dsl as T
from tensorfuse.kernels import softmax_attend
from tensorfuse.schedule_templates.selected_views import select_constant_indices
from tests.helpers import fresh_seed, poisoned_call, relative_error

HOPPER = "cuda:sm_90a"
SIZES = dict(B=2, S=4096, H=16, D=128)


@tf.kernel
def three_tensors(q: T.Tensor["B", "S", "H", "D", "bf16"], k: T.Tensor["B", "S", "H", "D", "bf16"],
                  v: T.Tensor["B", "S", "H", "D", "bf16"], scale: T.f32):
    """``packed_qkv_causal``'s attention written over three tensors."""
    b, i, j, h, d, e = T.axes("b i j h d e")
    s = T.where(j <= i, T.sum(q[b, i, h, d] * k[b, j, h, d], over=d) * scale, float("-inf"))
    return softmax_attend(s, v[b, j, h, e], j)


@tf.kernel
def mixed_reads(x: T.Tensor["M", "N", "f32"]):
    """x read at a constant column and along its columns: not a tensor of slices."""
    i, j = T.axes("i j")
    return T.sum(x[i, j] * x[i, 0], over=j)


def test_packed_qkv_is_planned_as_three_strided_tensors():
    selected = select_constant_indices(packed_qkv_causal.program)
    assert [(p.name, p.dims) for p in selected.program.tensor_params] == [
        (f"qkv_{c}", ("B", "S", "H", "D")) for c in range(3)]
    assert selected.sizes == ("THREE",)
    assert selected.describe() == ("constant indices as views: qkv_0 = qkv[:, :, 0, :, :]; "
                                   "qkv_1 = qkv[:, :, 1, :, :]; qkv_2 = qkv[:, :, 2, :, :]")
    packed = tf.compile(packed_qkv_causal, HOPPER)
    origin = packed.schedule_origin(**SIZES, THREE=3)
    assert origin.startswith("constant indices as views; hopper_attention template"), origin
    assert packed.source(**SIZES, THREE=3) == tf.compile(three_tensors, HOPPER).source(**SIZES)
    assert "each read through a 4-D tensor map of its strides" in \
        packed.describe_plan(**SIZES, THREE=3)


def test_only_tensors_a_hopper_kernel_reads_by_their_strides_are_taken_as_given():
    """The launches of a strided plan name q, k and v as read by their own strides (the caller's
    views reach the tensor maps as they are); the library's layout reads contiguous rows."""
    import tensorfuse.kernels as K

    inner = tf.compile(packed_qkv_causal, HOPPER).for_sizes(**SIZES, THREE=3).inner
    assert inner.launches(None, **SIZES).strided == ("qkv_0", "qkv_1", "qkv_2")
    library = tf.compile(K.attention, HOPPER).for_sizes(B=2, H=16, M=4096, N=4096, D=128)
    assert library.launches(None, B=2, H=16, M=4096, N=4096, D=128).strided == ()


@tf.kernel
def reads_the_slices_count(x: T.Tensor["M", "TWO", "N", "f32"]):
    """x read at constants on an axis whose size the program also reads: its slices would leave
    that size bound by nothing."""
    i, j = T.axes("i j")
    return T.sum(x[i, 0, j] - x[i, 1, j] * T.size("TWO"), over=j)


_MAPS_OF_A_CALL = """
import tensorfuse as tf
from benchmarks.serving_kernels import packed_qkv_causal
f = tf.compile(packed_qkv_causal, "cuda:sm_90a")
qkv = torch.zeros(2, 300, 3, 4, 128, dtype=torch.bfloat16)
for _ in range(3):
    f(qkv, 0.088)
print(json.dumps({"made": len(made), "maps": [[a - qkv.data_ptr(), list(s), list(st)]
                                              for a, s, st in encoded]}))
"""


def test_the_hopper_kernels_tensor_maps_read_the_slices_where_they_lie():
    """The host side of a packed call, the GPU's parts stubbed (``tools/profile_host_paths``):
    each slice's map starts at its offset in the packed tensor with its strides by role (batch,
    head, token; elements) — no copy between — and repeated calls encode no map again."""
    from tests.helpers import run_with_the_gpu_stubbed

    found = run_with_the_gpu_stubbed(_MAPS_OF_A_CALL)
    assert found["made"] == 1
    strides = [300 * 3 * 4 * 128, 128, 3 * 4 * 128]
    assert found["maps"] == [[c * 4 * 128 * 2, [2, 4, 300, 128], strides] for c in range(3)]


def test_tensors_read_otherwise_are_left_as_written():
    import tensorfuse.kernels as K

    assert select_constant_indices(K.gqa_attention.program) is None
    assert select_constant_indices(mixed_reads.program) is None
    assert select_constant_indices(reads_the_slices_count.program) is None


def _selected_on_the_cpu():
    from tensorfuse.dsl.program import ProgramKernel
    from tensorfuse.schedule_templates.selected_views import SelectedKernel

    selected = select_constant_indices(packed_qkv_causal.program)
    return SelectedKernel(packed_qkv_causal.program, selected,
                          tf.compile(ProgramKernel(selected.program), "llvm"),
                          tf.get_target("llvm"))


def _reference(qkv, scale):
    """float64 causal attention over ``qkv[B, S, 3, H, D]``'s slices."""
    q, k, v = (qkv[:, :, c].double().transpose(1, 2) for c in range(3))
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    S = qkv.shape[1]
    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhij,bhjd->bhid", torch.softmax(s, -1), v).transpose(1, 2)


def test_a_selected_kernel_runs_on_the_callers_slices_on_the_cpu():
    """The wrapper alone, around the selected program compiled for the CPU: the output given
    (poisoned) and made, against float64 on large values and a ragged length; a packed tensor
    with too few slices is refused by name."""
    from tensorfuse.errors import CallError

    made = _selected_on_the_cpu()
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(2, 37, 3, 3, 16, generator=g) * 4).bfloat16()
    want = _reference(qkv, 0.25)
    (out,) = poisoned_call(made, packed_qkv_causal.program, dict(qkv=qkv, scale=0.25), want)
    assert relative_error(out, want) < 1e-2, seed
    assert relative_error(made(qkv, 0.25), want) < 1e-2, seed
    assert made.schedule_origin(B=2, S=37, THREE=3, H=3, D=16).startswith(
        "constant indices as views; ")
    with pytest.raises(CallError, match=r"qkv\[b, j, 2, h, e\] reads dimension 2 of qkv "
                       r"\(THREE=2\) at 2, outside 0…1"):
        made(qkv[:, :, :2], 0.25)


def test_a_selected_fast_call_hands_the_callers_slices_to_the_inner_fast_call():
    """A repeated signature's fast call: the packed tensor's slices — views of its storage at
    each slice's offset — handed to the inner kernel's fast call by name with the new (or given)
    output; a stale inner fast call makes it stale."""
    from tensorfuse.schedule_templates.selected_views import SelectedFastCall

    given = []

    def inner_fast(args, kwargs):
        given.append(kwargs)
        return None if inner_fast.stale else kwargs["out"]
    inner_fast.stale = False
    selected = select_constant_indices(packed_qkv_causal.program)
    fast = SelectedFastCall([("qkv", 0, True), ("scale", "scale", float)],
                            [("o", (2, 37, 3, 16), "bf16")], "cpu", [None], [],
                            selected.selections, inner_fast)
    qkv = torch.randn(2, 37, 3, 3, 16).bfloat16()
    out = fast((qkv,), {"scale": 1})
    sent = given[-1]
    assert set(sent) == {"qkv_0", "qkv_1", "qkv_2", "scale", "out"} and sent["scale"] == 1.0
    for c in range(3):
        view = sent[f"qkv_{c}"]
        assert view.shape == (2, 37, 3, 16) and view.stride() == qkv[:, :, c].stride()
        assert view.data_ptr() == qkv.data_ptr() + c * 3 * 16 * 2
    assert sent["out"] is out and out.shape == (2, 37, 3, 16)
    inner_fast.stale = True
    assert fast((qkv,), {"scale": 1}) is None and fast.stale


@pytest.mark.gpu
def test_packed_qkv_runs_on_the_hopper_attention_without_copies(monkeypatch):
    """On an H100/H200: the packed tensor's slices reach the kernel as they are (no clone: the
    tensor maps read their strides) and the output matches float64, at a ragged length too."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")
    made = tf.compile(packed_qkv_causal)
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    clones = []
    real_clone = torch.Tensor.clone
    for S in (1000, 2048):
        qkv = (torch.randn(2, S, 3, 4, 128, generator=g) * 3).to("cuda", torch.bfloat16)
        want = _reference(qkv.cpu(), 128 ** -0.5)
        out = torch.full((2, S, 4, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
        with monkeypatch.context() as patch:
            patch.setattr(torch.Tensor, "clone", lambda self, *a, **k: clones.append(
                tuple(self.shape)) or real_clone(self, *a, **k))
            for _ in range(2):   # the checked path, then the fast call
                assert made(qkv, 128 ** -0.5, out=out) is out
        assert relative_error(out, want) < 2e-2, (S, seed)
        assert made.schedule_origin(B=2, S=S, THREE=3, H=4, D=128).startswith(
            "constant indices as views; hopper_attention")
    assert clones == []


@pytest.mark.gpu
def test_views_of_other_strides_reach_the_hopper_kernel_uncopied(monkeypatch):
    """On an H100/H200: attention over three [B, S, H, D] tensors called with a packed tensor's
    ``unbind`` slices and with transposed views of [B, H, S, D] tensors — neither contiguous —
    reads them as they are (no clone) and matches float64; a view whose head dim is not
    contiguous is copied, and still right."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")
    made = tf.compile(three_tensors)
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(2, 700, 3, 4, 128, generator=g) * 3).to("cuda", torch.bfloat16)
    heads_first = [(torch.randn(2, 4, 700, 128, generator=g) * 3).to("cuda", torch.bfloat16)
                   for _ in range(3)]
    real_clone, clones = torch.Tensor.clone, []
    for views in (qkv.unbind(2), [t.transpose(1, 2) for t in heads_first]):
        want = _reference(torch.stack([t.cpu() for t in views], 2), 128 ** -0.5)
        with monkeypatch.context() as patch:
            patch.setattr(torch.Tensor, "clone", lambda self, *a, **k: clones.append(
                tuple(self.shape)) or real_clone(self, *a, **k))
            for _ in range(2):   # the checked path, then the fast call
                out = made(*views, 128 ** -0.5)
        assert relative_error(out, want) < 2e-2, seed
    assert clones == []
    swapped = [t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in qkv.unbind(2)]
    want = _reference(torch.stack([t.cpu() for t in swapped], 2), 128 ** -0.5)
    assert relative_error(made(*swapped, 128 ** -0.5), want) < 2e-2, seed


def test_tensor_maps_take_a_views_own_strides_by_role():
    """``role_strides``: the element strides a strided plan's tensor map gets for a view — the
    view's own, by the roles of its axes; the declared (contiguous) stride on an axis of one
    element, whose stride torch leaves arbitrary."""
    from tensorfuse.schedule_templates.hopper_attention import role_strides

    qkv = torch.zeros(2, 5, 3, 4, 64)
    q = qkv[:, :, 0]                                      # [B, S, H, D] by roles "bihd"
    declared = {"b": 5 * 4 * 64, "h": 64, "i": 4 * 64, "d": 1}
    assert role_strides(q, "bihd", ("b", "h", "i"), declared) == (5 * 3 * 4 * 64, 64, 3 * 4 * 64)
    one = qkv[:1, :, 0].as_strided((1, 5, 4, 64), (7, 3 * 4 * 64, 64, 1))
    assert role_strides(one, "bihd", ("b", "h", "i"), declared)[0] == declared["b"]
