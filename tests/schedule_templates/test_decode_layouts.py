"""Decodes written without a query axis, with heads sharing one cache, and over a paged cache
swept as one axis (``tile_plan.row_roles``/``row_fold.row_fold``, ``schedule_templates/flat_sweeps.py``,
``tensorfuse/flat_kernel.py``, ``attention.decode_knobs``): their plans, float64 checks on the
CPU target, under Triton's interpreter and on the GPU, and their sm_90a code."""
import warnings

import pytest
import torch

import tensorfuse as tf
from tensorfuse import dsl as T
from tensorfuse.algebra import plan_chain
from tensorfuse.errors import NoTemplateWarning
from tensorfuse.flat_kernel import FlatSweepKernel
from tensorfuse.schedule_templates.attention import SMS, default_knobs, is_decode
from tensorfuse.schedule_templates.flat_sweeps import flatten_sweeps, swept_together
from tensorfuse.schedule_templates.tile_plan import plan_rowtile
from tensorfuse.targets import get_target
from tests.helpers import (assert_gpu_template_matches, fresh_seed, relative_error,
                           run_interpreted, templated)
from tests.schedule_templates.decode_layouts import (CASES, mqa_case, mqa_decode, paged_decode,
                                                    paged_lengths_decode)

HOPPER = get_target("cuda:sm_90a")
PAGED = dict(B=8, H=32, HKV=8, D=128, PAGES=4096, PAGE=64, NP=512)


def plan_of(kernel, axis="j", **sizes):
    program = kernel.program
    if axis != "j":
        program = flatten_sweeps(program, sizes)
    return plan_rowtile(program, plan_chain(program, ("m", "o", "l"), axis), sizes)


def test_heads_sharing_a_kv_head_without_a_query_axis_are_the_rows_of_one_tile():
    plan = plan_of(CASES["gqa_decode"][0], B=8, H=32, HKV=8, N=4096, D=128)
    assert (plan.fold[0].name, plan.fold[1], plan.rows) == ("h", 4, 4)
    assert [n for n, _ in plan.grid_batch] == ["b", "hg"]
    # the keys and values are read by the group's index, once per tile
    assert all("__group_h" in str(c.right.key()) for c in plan.locals.values())


def test_every_head_on_its_own_keys_without_a_query_axis_is_one_row_per_program():
    plan = plan_of(CASES["mha_decode"][0], B=2, H=16, N=4096, D=64)
    assert (plan.fold[0].name, plan.fold[1], plan.rows) == ("h", 1, 1)
    assert dict(plan.grid_batch) == {"b": 2, "hg": 16}


def test_query_heads_over_one_cache_are_the_rows_and_one_tile_holds_all_of_them():
    plan = plan_of(CASES["mqa_decode"][0], B=16, H=64, N=16384, D=128)
    assert plan.row.name == "h" and plan.fold is None and plan.rows == 64
    knobs = default_knobs(plan, HOPPER)
    assert knobs.block_m == 64 and knobs.splits == round(SMS / 16)
    # 128 heads: twice the rows, still split over the keys (16 programs would idle the GPU)
    wide = plan_of(CASES["mqa_decode"][0], B=16, H=128, N=16384, D=128)
    assert is_decode(wide) and default_knobs(wide, HOPPER).block_m == 64


def test_a_paged_cache_is_swept_as_one_axis_of_pages_times_slots():
    program = paged_decode.program
    assert [a.name for a in swept_together(program)] == ["p", "t"]
    flat = flatten_sweeps(program, PAGED)
    m = flat.compute("m")
    assert [a.name for a in m.over] == ["pt"] and m.over[0].extent == 512 * 64
    text = str(flat)
    assert "table[b, pt // 64], pt % 64" in text, text
    plan = plan_of(paged_decode, axis="pt", **PAGED)
    knobs = default_knobs(plan, HOPPER)
    # gathered keys: about two programs per SM (B·HKV = 64 (batch, group) rows)
    assert (plan.fold[1], knobs.block_m, knobs.splits) == (4, 16, round(2 * SMS / 64))


def test_row_tiles_that_fill_the_gpu_alone_sweep_their_keys_unsplit_in_128_key_blocks():
    """``benchmarks.decode_knobs --only grid`` on the H200: from about one row tile per SM the
    keys are not split and blocks are 128 keys (B64 32/8: 0.241 ms unsplit against 0.269 in two
    parts of 64-key blocks); fewer tiles keep about one program per SM; a paged cache's gathered
    keys keep 64-key blocks at many rows (where they were measured)."""
    gqa = CASES["gqa_decode"][0]
    many = default_knobs(plan_of(gqa, B=64, H=32, HKV=8, N=4096, D=128), HOPPER)
    assert (many.splits, many.block_n) == (1, 128)
    mha = default_knobs(plan_of(CASES["mha_decode"][0], B=4, H=32, N=4096, D=128), HOPPER)
    assert (mha.splits, mha.block_n) == (1, 128)   # 128 programs
    few = default_knobs(plan_of(gqa, B=8, H=32, HKV=8, N=32768, D=128), HOPPER)
    assert (few.splits, few.block_n) == (round(SMS / 64), 128)
    paged = {**PAGED, "B": 64, "PAGES": 64 * 512}
    knobs = default_knobs(plan_of(paged_decode, axis="pt", **paged), HOPPER)
    assert (knobs.block_n, knobs.splits) == (64, round(2 * SMS / 512))


def test_axes_reduced_apart_or_alone_or_written_out_of_order_are_not_flattened():
    @tf.kernel
    def apart(x: T.Tensor["B", "P", "Q", "f32"]):
        b, p, q = T.axes("b p q")
        return T.sum(x[b, p, q], over=(p, q)) + T.sum(T.max(x[b, p, q], over=q), over=p)

    @tf.kernel
    def one_axis(x: T.Tensor["B", "P", "f32"]):
        b, p = T.axes("b p")
        return T.sum(x[b, p], over=p)

    @tf.kernel
    def transposed(x: T.Tensor["B", "P", "Q", "f32"]):   # reduced (q, p), written (p, q)
        b, p, q = T.axes("b p q")
        return x[b, p, q] - T.sum(x[b, p, q], over=(q, p))

    assert swept_together(apart.program) is None and swept_together(one_axis.program) is None
    assert swept_together(transposed.program) is None
    assert flatten_sweeps(apart.program, dict(B=2, P=3, Q=4)) is None
    # sizes not given: nothing to flatten at
    assert flatten_sweeps(paged_decode.program, dict(B=2)) is None


def test_tf_compile_sweeps_a_paged_cache_as_one_axis_and_says_so():
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoTemplateWarning)   # no floor: a template takes it
        made = tf.compile(paged_lengths_decode, target="cuda:sm_90a")
    assert isinstance(made, FlatSweepKernel)
    sizes = dict(B=2, H=8, HKV=2, D=64, PAGES=40, PAGE=16, NP=8)
    origin = made.schedule_origin(**sizes)
    assert origin.startswith("p, t swept as one axis of NP × PAGE elements: template"), origin
    # one flat kernel per page size and count; other sizes are that kernel's
    assert made.for_sizes(**sizes) is made.for_sizes(**{**sizes, "B": 5, "PAGES": 99})
    assert made.for_sizes(**sizes) is not made.for_sizes(**{**sizes, "PAGE": 32})


@pytest.mark.parametrize("name", list(CASES))
def test_decodes_match_float64_on_the_cpu_target(name):
    kernel, case = CASES[name]
    seed = fresh_seed()
    args, want = case(torch.Generator().manual_seed(seed))
    out = tf.compile(kernel, target="cpu")(**args)
    assert relative_error(out, want) < 2e-2, seed   # bf16 outputs


def test_decode_templates_match_float64_in_the_interpreter():
    seed = fresh_seed()
    errors = run_interpreted("tests.schedule_templates.decode_layouts", seed)
    assert set(errors) == set(CASES), errors
    assert max(errors.values()) < 2e-2, (errors, seed)


@pytest.mark.parametrize("name", ["gqa_decode", "mqa_decode", "paged_decode"])
def test_decode_templates_compile_for_sm_90a_on_tensor_cores(name):
    kernel, _ = CASES[name]
    sizes = {"gqa_decode": dict(B=8, H=32, HKV=8, N=32768, D=128),
             "mqa_decode": dict(B=16, H=64, N=16384, D=128), "paged_decode": PAGED}[name]
    made = templated(kernel)
    template = made.for_sizes(**sizes) if isinstance(made, FlatSweepKernel) else made
    ptx = template.ptx(**sizes)
    assert "mma" in ptx and ".target sm_90a" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_decodes_match_float64_on_the_gpu(name):
    assert_gpu_template_matches(*CASES[name])


def test_a_page_pool_past_two_giga_elements_is_addressed_in_64_bits():
    """A page number read from an i32 table times the page stride wraps past 2³¹ elements (a
    4 GiB bf16 pool): the emitter widens the gathered index first."""
    made = templated(paged_decode)
    big = {**PAGED, "PAGES": 2**31 // (64 * 8 * 128) + 1}
    small = made.for_sizes(**PAGED).source(**PAGED)
    assert ".to(tl.int64)" not in small
    line = next(ln for ln in made.for_sizes(**big).source(**big).splitlines()
                if "tl.load(k_pages" in ln)
    # the second pool size makes PAGES a kernel argument (tf.compile's dynamic=None): the clamp
    # reads it there, and the guard that widened the index keeps this build to pools this large
    assert "), 0), (size_PAGES - 1)).to(tl.int64) * 65536" in line, line
    exact = tf.compile(paged_decode, "cuda:sm_90a", dynamic=False).for_sizes(**big)
    line = next(ln for ln in exact.source(**big).splitlines() if "tl.load(k_pages" in ln)
    assert "), 0), 32768).to(tl.int64) * 65536" in line, line


def test_a_head_read_by_the_keys_both_as_itself_and_by_its_group_is_not_folded():
    """k[b, h // 2, j, d] and v[b, h, j, e]: no fold of h serves both reads (one by one would
    read k's h // 2 as h); the batch axis, read only as itself, is folded by one instead."""
    from tensorfuse.kernels import softmax_attend

    @tf.kernel
    def mixed(q: T.Tensor["B", "H", "D", "bf16"], k: T.Tensor["B", "HK", "N", "D", "bf16"],
              v: T.Tensor["B", "H", "N", "D", "bf16"]):
        b, h, j, d, e = T.axes("b h j d e")
        s = T.sum(q[b, h, d] * k[b, h // 2, j, d], over=d)
        return softmax_attend(s, v[b, h, j, e], j)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the fused precision note of softmax_attend
        plan = plan_of(mixed, B=2, H=4, HK=2, N=64, D=32)
    assert (plan.fold[0].name, plan.fold[1]) == ("b", 1)
    right = [str(c.right.key()) for c in plan.locals.values()]
    assert "'floordiv'" in right[0] and "__group_b" in right[0], right


@pytest.mark.gpu
def test_a_split_decode_replays_from_a_cuda_graph_and_runs_on_a_second_stream():
    """The last part of each row tile merges and sets its arrival counter back: a decode
    captured in a CUDA graph and replayed on new queries and caches, and the same kernel on
    another stream, each match float64 (a counter left behind would merge a tile early)."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    generator = torch.Generator().manual_seed(fresh_seed())
    f = tf.compile(mqa_decode)
    # 32 batches of 16 heads: the Triton split update (32 or more heads on one cache are packed
    # rows; fewer (batch, kv-head) pairs take the cluster decode)
    args, _ = mqa_case(generator, B=32, H=16, N=4096, D=128)
    live = {n: v.cuda() if isinstance(v, torch.Tensor) else v for n, v in args.items()}
    assert f.for_sizes(B=32, H=16, N=4096, D=128).build(B=32, H=16, N=4096, D=128)[1].splits > 1
    f(**live)   # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(**live)
    for _ in range(3):
        fresh, want = mqa_case(generator, B=32, H=16, N=4096, D=128)
        for n in ("q", "k", "v"):
            live[n].copy_(fresh[n])
        out.fill_(float("nan"))
        graph.replay()
        assert relative_error(out.cpu(), want) <= 2e-2
    fresh, want = mqa_case(generator, B=32, H=16, N=4096, D=128)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        got = f(**{n: v.cuda() if isinstance(v, torch.Tensor) else v for n, v in fresh.items()})
    side.synchronize()
    assert relative_error(got.cpu(), want) <= 2e-2
