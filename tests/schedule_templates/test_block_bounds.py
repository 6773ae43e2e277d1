"""Block lists of masks over positions alone, sorted on the host from each compare's extremes
(``schedule_templates/block_bounds.py``): the same lists, element for element, as evaluating the
mask on every (row, key) pair — for the library's masks and for conditions written otherwise, at
ragged sizes, odd blocks and windows narrower than a block (where the corners cannot decide and
those blocks are evaluated one by one); masks it cannot sort go to the device path."""
from __future__ import annotations

import itertools

import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse import dsl as T
from tensorfuse.kernels.attention import KV, Q, scores, softmax_attend
from tensorfuse.schedule_templates import block_bounds
from tensorfuse.schedule_templates.block_bounds import position_block_maps
from tensorfuse.schedule_templates.block_schedule import (_evaluated_lists, block_lists,
                                                          block_lists_and_counts)
from tensorfuse.schedule_templates.hopper_attention_plan import plan_hopper_attention

torch = pytest.importorskip("torch")

CHAIN = ("m", "l", "o")


def masked(condition):
    """Attention masked by ``condition(i, j)``, with an integer scalar ``w`` it may read."""
    @tf.kernel
    def written(q: Q, k: KV, v: KV, scale: T.f32, w: T.i32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = scores(q, k, b, h, h, i, j, d, scale)
        return softmax_attend(T.where(condition(i, j, w), s, -T.inf), v[b, h, j, e], j)
    return written


WRITTEN = {
    "scaled_diagonal": lambda i, j, w: 2 * i + 3 >= j,
    "not_the_diagonal": lambda i, j, w: i != j,
    "on_the_diagonal": lambda i, j, w: (i == j) | (j == 0),
    "negated_band": lambda i, j, w: ~(T.abs(i - j) > w),
    "far_apart": lambda i, j, w: w <= T.abs(j - i),
    "strided_equal": lambda i, j, w: 2 * j == i,
    "product_with_a_scalar": lambda i, j, w: (i - j) * w <= 7,
    # two compares that cut one block and, together, cover it or leave nothing of it
    "covering_halves": lambda i, j, w: (i >= j) | (j >= i),
    "disjoint_halves": lambda i, j, w: (i > j) & (j > i + w),
    "a_band_as_wide_as_the_scalar": lambda i, j, w: T.abs(i - j) < w,
}

LIBRARY = {"causal_attention": {}, "sliding_window_attention": {"window": None},
           "prefix_lm_attention": {"prefix": None}, "neighborhood_attention": {"radius": None},
           "gqa_causal_attention": {}, "softcap_attention": {"cap": 30.0}}


def plans():
    for name, scalars in LIBRARY.items():
        kernel = getattr(K, name)
        yield name, kernel, scalars
    for name, condition in WRITTEN.items():
        yield name, masked(condition), {"w": None}


@pytest.mark.parametrize("name,kernel,scalars", list(plans()), ids=lambda x: x
                         if isinstance(x, str) else "")
def test_host_lists_are_the_evaluated_ones(name, kernel, scalars):
    """Every pairing of sizes (square, ragged, one token), blocks (square, wide, narrow) and
    scalars at and beside the blocks' edges (where a compare's extreme is exactly 0)."""
    plan = plan_hopper_attention(kernel.program, CHAIN, "j")
    b, h, i, j = plan.chain.axes
    values = [0, 1, 63, 64, 129] if scalars else [None]
    for (M, N), (block_m, block_n), value in itertools.product(
            [(1, 1), (640, 640), (129, 1000), (1000, 129)], [(128, 128), (64, 176)], values):
        given = {s: (v if v is not None else value) for s, v in scalars.items()}
        sizes = dict(B=2, H=3, HKV=3, M=M, N=N, D=64)
        host, visited = block_lists_and_counts(plan.mask, [b, h], i, j, sizes, {}, given,
                                               block_m, block_n, "cpu")
        assert visited is not None, f"{name}: the host could not sort it"
        evaluated = _evaluated_lists(plan.mask, [b, h], i, j, sizes, {}, given, block_m,
                                     block_n, "cpu", None, None)
        for got, want in zip(host, evaluated):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got, want), (name, M, N, block_m, block_n, given)
        assert visited.tolist() == (evaluated[0] + evaluated[2]).tolist()
        sample = sorted({0, (M - 1) // block_m // 2, (M - 1) // block_m})   # row blocks' maps
        sampled = block_lists(plan.mask, [b, h], i, j, sizes, {}, given, block_m, block_n,
                              "cpu", row_blocks=sample)
        want = _evaluated_lists(plan.mask, [b, h], i, j, sizes, {}, given, block_m, block_n,
                                "cpu", None, sample)
        assert all(torch.equal(x, y) for x, y in zip(sampled, want))


def test_blocks_the_corners_cannot_decide_are_evaluated_and_nothing_else(monkeypatch):
    """A window narrower than a block: both of its edges cut the diagonal blocks, and only those
    go element by element; a causal mask has one edge, and none does."""
    seen = []
    original = block_bounds._elementwise
    monkeypatch.setattr(block_bounds, "_elementwise",
                        lambda *a: seen.append(len(a[-1])) or original(*a))
    sizes = dict(B=1, H=1, HKV=1, M=1024, N=1024, D=64)
    for kernel, scalars, cut in ((K.causal_attention, {}, False),
                                 (K.sliding_window_attention, {"window": 16}, True)):
        plan = plan_hopper_attention(kernel.program, CHAIN, "j")
        seen.clear()
        assert position_block_maps(plan.mask, *plan.chain.axes[2:], sizes, scalars, 128,
                                   128) is not None
        assert (sum(seen) > 0) == cut
        if cut:   # the 8 diagonal blocks and the 7 below them that the window reaches
            assert 0 < sum(seen) <= 15


def test_masks_the_host_cannot_sort_take_the_device_path(monkeypatch):
    sizes = dict(B=1, H=2, HKV=2, M=300, N=300, D=64)
    for kernel, scalars in ((K.document_attention, {}),
                            (K.neighborhood_attention_2d, dict(width=16, radius=2, dilation=1))):
        plan = plan_hopper_attention(kernel.program, CHAIN, "j")
        i, j = plan.chain.axes[2:]
        assert position_block_maps(plan.mask, i, j, sizes, scalars, 128, 128) is None
    # floats: the device evaluates them in float32, which rounds where the host would not
    plan = plan_hopper_attention(masked(lambda i, j, w: i * 0.5 >= j).program, CHAIN, "j")
    assert position_block_maps(plan.mask, *plan.chain.axes[2:], sizes, {"w": 1}, 128,
                               128) is None
    # past the budget of elements evaluated one by one, the device evaluates the whole mask
    plan = plan_hopper_attention(K.sliding_window_attention.program, CHAIN, "j")
    b, h, i, j = plan.chain.axes
    monkeypatch.setattr(block_bounds, "ELEMENT_BUDGET", 128 * 128)
    assert position_block_maps(plan.mask, i, j, sizes, {"window": 4}, 128, 128) is None
    lists, visited = block_lists_and_counts(plan.mask, [b, h], i, j, sizes, {}, {"window": 4},
                                            128, 128, "cpu")
    assert visited is None
    want = block_lists(plan.mask, [b, h], i, j, sizes, {}, {"window": 4}, 128, 128, "cpu")
    assert all(torch.equal(a, b) for a, b in zip(lists, want))


@tf.kernel
def mask_tensor_attention(q: Q, k: KV, v: KV, mask: T.Tensor["B", 1, "M", "N", "bool"],
                          scale: T.f32):
    """Attention under a boolean mask tensor, read as transformers passes it."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.where(mask[b, 0, i, j], scores(q, k, b, h, h, i, j, d, scale), -T.inf)
    return softmax_attend(s, v[b, h, j, e], j)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("M, N, block_m, block_n", [(640, 640, 128, 128), (129, 1000, 64, 176),
                                                    (1, 300, 128, 64)])
def test_a_mask_tensor_is_read_as_a_view_and_gives_the_evaluated_lists(M, N, block_m, block_n,
                                                                      transposed, monkeypatch):
    """``mask[b, 0, i, j]`` is sorted into blocks from a view of the tensor (no element
    gathered): the same lists as evaluating it element by element, rows and keys either way
    round (the backward's per-key lists), at ragged sizes, for a batch expanded from one
    sequence (stride 0) and one whose sequences differ; a mask that reads anything else is
    evaluated."""
    from tensorfuse.schedule_templates import block_schedule

    plan = plan_hopper_attention(mask_tensor_attention.program, CHAIN, "j")
    b, h, i, j = plan.chain.axes
    row, col = (j, i) if transposed else (i, j)
    sizes = dict(B=3, H=2, HKV=2, M=M, N=N, D=64)
    g = torch.Generator().manual_seed(0)
    per_sequence = torch.rand(3, 1, M, N, generator=g).lt(0.02)
    per_sequence[1, :, : M // 3] = True   # whole blocks kept: full ones
    original = block_schedule._mask_tensor_view
    for mask in (torch.rand(1, 1, M, N, generator=g).lt(0.3).expand(3, 1, M, N), per_sequence):
        tensors = {"mask": mask}
        args = (plan.mask, [b, h], row, col, sizes, tensors, {}, block_m, block_n, "cpu")
        assert original(plan.mask, [b], row, col, tensors,
                        [3, sizes[row.extent], sizes[col.extent]]) is not None
        viewed = _evaluated_lists(*args, None, None)
        with monkeypatch.context() as patch:   # element by element
            patch.setattr(block_schedule, "_mask_tensor_view", lambda *a: None)
            evaluated = _evaluated_lists(*args, None, None)
        for got, want in zip(viewed, evaluated):
            assert got.dtype == want.dtype and torch.equal(got, want), (M, N, transposed)
    shifted = plan_hopper_attention(masked(lambda i, j, w: i >= j + w).program, CHAIN, "j")
    assert block_schedule._mask_tensor_view(shifted.mask, [], i, j, {}, [M, N]) is None


def test_lists_of_a_mask_tensor_are_kept_with_it_and_made_again_when_it_may_differ():
    """The forward's and the backward's lists of a mask tensor are found again for the same
    tensor, unwritten (a training step after another with one mask), made again after an
    in-place write (torch's version counter) or for another tensor; the cache holds the tensor
    it was made from, so that its memory cannot go to a new mask of other data with a version
    of 0 (which the caching allocator would hand out at the same address) while they are
    kept."""
    import gc
    import importlib
    import weakref

    from tensorfuse.kernels.layers import attention_kernel
    from tensorfuse.schedule_templates.attention_backward import (BackwardKnobs,
                                                                  plan_attention_backward)
    from tensorfuse.schedule_templates.auto import choose
    from tensorfuse.targets import get_target

    kernel = attention_kernel("bf16", False, True, False)
    sizes = dict(B=2, H=4, HKV=2, M=200, N=300, D=64)
    _, fusion = choose(kernel.program, get_target("cuda:sm_90a"))
    backward = plan_attention_backward(kernel.program, fusion, sizes)
    launches = tf.schedule(kernel, "cuda:sm_90a").rolling_update(*CHAIN, axis="j") \
        .apply_template("hopper_attention").compile().launches(**sizes)
    forward = importlib.import_module("tensorfuse.schedule_templates.hopper_attention")._Lists(
        launches.plan, launches.knobs, None)
    makers = {"forward": lambda mask: forward({"mask": mask, "scale": 0.1}, sizes, "cpu")[0],
              "backward": lambda mask: backward.block_lists(BackwardKnobs(), {"mask": mask},
                                                            {}, True)[0]}
    g = torch.Generator().manual_seed(1)
    for name, make in makers.items():
        mask = torch.rand(2, 1, 200, 300, generator=g) < 0.5
        first = make(mask)
        assert make(mask)[0] is first[0], name    # found again
        mask[..., :128] = False                  # written in place: made again, from the data
        again = make(mask)
        assert again[0] is not first[0] and not torch.equal(again[0], first[0]), name
        held = weakref.ref(mask)
        del mask
        gc.collect()
        assert held() is not None, name          # kept with its lists
        other = torch.rand(2, 1, 200, 300, generator=g) < 0.5
        assert make(other)[0] is not again[0]
        gc.collect()
        assert held() is None, name              # released with them


def test_the_triton_templates_lists_of_a_mask_tensor_are_kept_with_it():
    """The same for the Triton attention template, run in Triton's interpreter
    (``mask_lists_check``): its lists hold the mask while kept, let it go for another's, and
    each call's output matches float64."""
    from tests.helpers import fresh_seed, run_interpreted

    pytest.importorskip("triton")
    seed = fresh_seed()
    found = run_interpreted("tests.schedule_templates.mask_lists_check", seed)
    assert found["kept"] and found["alive"] and found["released"], found
    assert max(found["first"], found["other"]) < 1e-5, (found, seed)
