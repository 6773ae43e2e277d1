"""The Hopper attention template: its plan, its refusals, the sm_90a code nvcc makes of it (the
instructions it was written for, no register spills in the consumers) and ``tf.compile``'s choice of it — on the
CPU; and every variant against float64 on an H100 (marked ``gpu``)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tests.helpers import needs_nvcc
from tensorfuse import dsl as T
from tensorfuse.algebra.exprs import has_axis, linear_in
from tensorfuse.dsl.printer import to_text
from tensorfuse.kernels.attention import KV, Q, scores, softmax_attend
from benchmarks.attention_unlisted import UNLISTED
from benchmarks.hopper_attention import causal_attention_f16
from tensorfuse.errors import ScheduleError
from tensorfuse.schedule_templates.hopper_attention_plan import (SCHEDULES, HopperKnobs,
                                                                 check_hopper, knob_choices,
                                                                 last_block_keys,
                                                                 schedule_for,
                                                                 plan_hopper_attention,
                                                                 shared_bytes, with_knobs)
from tensorfuse.targets import get_target
from tensorfuse.targets.codegen import cuda_to_ptx
from tensorfuse.targets.cuda.hopper_attention import (HOPPER_PTX, MIN_PIECE, TREE_FAN,
                                                       TREE_FROM, merge_rounds)
from tensorfuse.targets.cuda.hopper_attention_device import TAIL_HELPERS

CHAIN = ("m", "l", "o")
PREFILL = dict(B=2, H=16, M=1000, N=1000, D=128)
HOPPER = get_target("cuda:sm_90a")


@needs_nvcc
def test_rows_keep_their_maximum_below_the_margin_and_warps_skip_the_rescale():
    """A row's running maximum moves only when a block's exceeds it by more than 2^8 (the
    correction is then 1), and o's rescale is skipped by a warp vote where every row kept its
    maximum; q·kᵀ's descriptors are one per block plus constants (Nsight Compute).
    The float64 GPU suite holds the results to the references."""
    compiled = hopper(K.attention)
    source = compiled.source(**PREFILL)
    assert "#define RESCALE_MARGIN 8.0f" in source
    assert "mx[x] > m[x] + RESCALE_MARGIN" in source and "grows ? tf_exp2(m[x] - use) : 1.0f" in source
    assert "tf_desc_plus(dq, kmajor_step(BM, ks))" in source
    ptx = compiled.ptx(**PREFILL)
    assert re.search(r"vote\.sync\.any\.pred", ptx)


@needs_nvcc
def test_a_tiles_ragged_last_block_multiplies_only_its_keys():
    """The sequence's last key block, where N is not a multiple of block_n (S=4096: 176-key
    blocks hold 48 keys in the last), runs q·kᵀ at its own width (a wgmma of N=48, into
    accumulators of its own) and p·v over the 16-key steps that hold keys (3 of 11), bounded by
    a count ptxas sees as warp-uniform — so it does not serialise the kernel's wgmma (C7520, which
    a count read from the tile made it do, or C7515, which two shapes on one register array
    do) — and the consumers still spill nothing; the blocks before it run every step."""
    compiled = hopper(K.attention)
    sizes = dict(PREFILL, M=4096, N=4096)
    source = compiled.source(**sizes)
    assert "#define BN 176" in source and "#define LAST_N 48" in source
    assert "ISSUE_O(w.count - 1, LAST_STEPS(w.count - 1));" in source
    assert "STEP(w.count - 1, sn, tf_wgmma_kk_m64n48k16, LAST_N)" in source
    assert "__shfl_sync(0xffffffffu," in source.split("#define LAST_STEPS")[1][:200]
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n48k16", compiled.ptx(**sizes))
    assert_consumers_do_not_spill(source)   # ptxas's report says nothing is serialised


def test_the_last_blocks_width_is_what_is_left_of_the_keys():
    """Unmasked plans: the last block's q·kᵀ width is N mod block_n to 16 (a kernel per value,
    the same source for every N with it); block_n where N is a multiple of it or the rest rounds
    up to a whole block; masked plans keep block_n (their lists count whole blocks)."""
    plan = plan_hopper_attention(K.attention.program, CHAIN, "j")
    masked = plan_hopper_attention(K.causal_attention.program, CHAIN, "j")
    want = {4096: 48, 16384: 16, 1000: 128, 176 * 5: 176, 176 * 5 + 161: 176, 40: 48, 8: 16}
    assert {n: last_block_keys(plan, n, 176) for n in want} == want
    assert last_block_keys(plan, 4096, 128) == 128 and last_block_keys(plan, 4100, 128) == 16
    assert last_block_keys(masked, 4096, 176) == 176
    compiled = hopper(K.attention)
    assert compiled.source(**dict(PREFILL, N=4096)) == compiled.source(**dict(PREFILL, N=4096 + 176))
    assert compiled.source(**dict(PREFILL, N=4096)) != compiled.source(**dict(PREFILL, N=4096 + 32))
    assert "#define LAST_N 176" in compiled.source(**dict(PREFILL, N=176 * 20))


@needs_nvcc
@pytest.mark.parametrize("name", ["attention", "neighborhood_attention_2d"])
def test_the_next_tiles_queries_are_prefetched_into_l2(name):
    """The producer asks L2 for the next tile's queries (a TMA prefetch of the same boxes) before
    it waits for the query buffer to be free, so that their copy then reads L2: dense and map
    tiles alike."""
    sizes = dict(B=1, H=2, M=4096, N=4096, D=128) if name == "attention" else \
        dict(B=1, H=2, M=4096, N=4096, D=128, width=64, radius=3, dilation=1)
    compiled = hopper(K.ALL[name])
    source = compiled.source(**sizes)
    producer = source[source.index("// the producer"):source.index("// a consumer warpgroup")]
    assert producer.index("tf_tma_prefetch_") < producer.index("tf_mbar_wait(q_free")
    ptx = compiled.ptx(**sizes)
    assert re.search(r"cp\.async\.bulk\.prefetch\.tensor\.\dd\.L2\.global\.tile", ptx)


H100_SHARED = 227 * 1024


def plan_of(kernel):
    return plan_hopper_attention(kernel.program, CHAIN, "j")


def hopper(kernel, **knobs):
    sch = tf.schedule(kernel, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    return sch.apply_template("hopper_attention", **knobs).compile()


def sizes_for(name: str, **over) -> dict:
    sizes = {**PREFILL, **over}
    if "gqa" in name:
        sizes["HKV"] = 4
    return sizes


def test_plan_splits_mask_score_and_scale():
    causal = plan_of(K.causal_attention)
    assert causal.mask is not None and "j" in str(causal.mask)
    assert causal.scale is not None and str(causal.scale) == "scale"   # folded into exp2
    alibi = plan_of(K.alibi_attention)   # dot · scale + slope(h) · (j − i − N + M)
    assert alibi.mask is None and str(alibi.scale) == "scale"
    # the terms free of the key dropped
    assert to_text(alibi.key_bias) == "exp2(-8.0 * (h + 1) / T.size('H'))"
    assert causal.key_bias is None and "softmax does not see" in alibi.describe()
    document = plan_of(K.document_attention)
    assert document.tensors == (("doc", "i32"),) and document.mask is not None
    softcap = plan_of(K.softcap_attention)
    assert softcap.mask is not None and softcap.scale is None
    assert plan_of(K.attention).mask is None
    assert "folded into exp2" in causal.describe(HopperKnobs())


@pytest.mark.parametrize("bias, linear", [
    ("slope * (j - i)", True), ("-(j * 2 - i) / 3", True), ("slope * i", False),
    ("j * j * 0.01", False), ("T.exp(j * 0.01)", False), ("T.where(j > i, 1.0, 0.0)", False)])
def test_an_additive_bias_linear_in_the_key_is_split_from_the_score(bias, linear):
    """score = dot · scale + κ · j + (terms free of j): κ is evaluated once a tile and the scale
    folded into exp2; the terms free of j are dropped (softmax does not see a row's shift).
    Anything else — a bias free of j altogether, non-linear in it — keeps the score as written."""
    def kernel(q: Q, k: KV, v: KV, scale: T.f32, slope: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = scores(q, k, b, h, h, i, j, d, scale) + eval(bias, {"T": T, "i": i, "j": j,
                                                                  "slope": slope})
        return softmax_attend(s, v[b, h, j, e], j)

    def unscaled(q: Q, k: KV, v: KV, slope: T.f32):   # the dot product alone: a factor of 1
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) + eval(bias, {"T": T, "i": i, "j": j,
                                                                        "slope": slope})
        return softmax_attend(s, v[b, h, j, e], j)

    plan = plan_of(tf.kernel(kernel))
    assert (plan.key_bias is not None) == linear, to_text(plan.score)
    assert (plan.scale is not None) == linear
    bare = plan_of(tf.kernel(unscaled))
    assert (bare.key_bias is not None) == linear
    assert not linear or is_const_one(bare.scale)


def is_const_one(e) -> bool:
    from tensorfuse.dsl.expr import Const
    return isinstance(e, Const) and e.value == 1.0


def test_linear_in_splits_a_coefficient_and_a_rest():
    i, j = T.axes("i j")
    c, r = linear_in(2.0 * (j - i) + 3.0 * j / 4.0 - i, j)
    assert eval_const(c) == 2.75
    assert not has_axis(r, j) and has_axis(r, i)
    assert linear_in(j * j, j) is None and linear_in(i * 5, j)[0].value == 0.0


def eval_const(e):
    from tensorfuse.dsl.expr import Binary, Const
    if isinstance(e, Const):
        return e.value
    assert isinstance(e, Binary)
    a, b = eval_const(e.a), eval_const(e.b)
    return {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[e.op]


@needs_nvcc
def test_a_key_linear_bias_is_one_ffma_an_element_and_its_coefficient_once_a_tile():
    """ALiBi's slope (an exp2 and a division) is computed once a tile, not in every block's score;
    an element's score is qk · FOLD_A + (kc · column + kc at the block's first column)."""
    source = hopper(K.alibi_attention).source(**PREFILL)
    block_score = source.split("void score_block(")[1].split("\n}")[0]
    assert "fmaf(qk, fold_a_, fmaf(kc_, (float)(dj_), kc0_))" in block_score
    assert "exp2f" not in block_score
    assert "const float kc_ = tf_key_bias(w.bh / H_, w.bh % H_" in source
    assert "1.0f / (s_scale)" in source   # the scale folded where positive
    # the tile's coefficient takes a register the consumers of the 176-key kernel do not have
    # to spare through a tile: ptxas keeps two words per tile in local memory (3 loads, 1 store
    # a tile), none among the block loop's wgmma code
    assert_consumers_do_not_spill(source, per_tile=8)


def test_plan_refuses_other_chains():
    with pytest.raises(ScheduleError, match="hopper attention: .*max → sum"):
        plan_hopper_attention(K.softmax.program, ("m", "l"), "j")


def test_check_refuses_what_the_kernel_cannot_run():
    plan = plan_of(K.attention)
    with pytest.raises(ScheduleError, match="head dim D=100: .*multiples of 8"):
        check_hopper(plan, HopperKnobs(), {**PREFILL, "D": 100}, H100_SHARED)
    with pytest.raises(ScheduleError, match="head dim D=264"):
        check_hopper(plan, HopperKnobs(), {**PREFILL, "D": 264}, H100_SHARED)
    with pytest.raises(ScheduleError, match="block_n=200"):
        check_hopper(plan, HopperKnobs(block_n=200), PREFILL, H100_SHARED)
    with pytest.raises(ScheduleError, match="shared memory"):
        check_hopper(plan, HopperKnobs(block_n=256, stages=4), {**PREFILL, "D": 256},
                     H100_SHARED)
    with pytest.raises(ScheduleError, match="registers"):
        check_hopper(plan, HopperKnobs(block_n=256), {**PREFILL, "D": 64}, H100_SHARED)
    with pytest.raises(ScheduleError, match="65535"):
        check_hopper(plan, HopperKnobs(), {**PREFILL, "B": 8192, "H": 16}, H100_SHARED)
    with pytest.raises(ScheduleError, match="no knob tile_m"):
        with_knobs(plan, PREFILL, {"tile_m": 64})
    assert shared_bytes(HopperKnobs(), 128) <= H100_SHARED
    with pytest.raises(ScheduleError, match="sm_90a"):
        tf.schedule(K.attention, "cuda:sm_80").rolling_update(*CHAIN, axis="j") \
            .apply_template("hopper_attention").compile()


def _ptxas_report(source: str) -> str:
    """ptxas's resource report of ``source``."""
    return _ptxas_and_sass(source)[0]


def _ptxas_and_sass(source: str) -> tuple[str, str]:
    """ptxas's resource report and the SASS (nvdisasm from the triton wheel) of ``source``:
    ptxas on the PTX tensorfuse's nvcc makes (kept from the test's own ``ptx()`` call, so nvcc's
    front end runs once), as nvcc -cubin would run it."""
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ptxas = shutil.which("ptxas") or os.path.join(tools, "ptxas")   # the toolkit's, else Triton's
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(ptx, "w") as f:
            f.write(cuda_to_ptx(source, HOPPER))
        done = subprocess.run([ptxas, "-arch=sm_90a", "-O3", "-v", "-o", cubin, ptx],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", cubin], capture_output=True,
                              text=True).stdout
    return done.stderr, sass


def assert_consumers_do_not_spill(source: str, per_tile: int = 0) -> str:
    """No local-memory spill in the consumers' code; the producer — one thread issuing copies on
    the 24 registers ``setmaxnreg`` leaves it — may spill a few words (≤ 128 bytes). ptxas lays
    the producer's branch out after its ``USETMAXREG.DEALLOC``, the consumers' between their
    ``USETMAXREG.TRY_ALLOC`` and it (before that: the prologue every thread runs once, where a
    value the producer needs later may be stored). ``per_tile``: that many spill instructions
    are let through outside the consumers' wgmma code (a tile's start and end, once in ~24 key
    blocks), never among it. Returns ptxas's report."""
    report, sass = _ptxas_and_sass(source)
    assert "serializ" not in report.lower(), report
    stores = re.search(r"(\d+) bytes spill stores", report)
    assert stores and int(stores.group(1)) <= 128, report
    lines = sass.splitlines()
    alloc = next(i for i, line in enumerate(lines) if "USETMAXREG.TRY_ALLOC" in line)
    dealloc = next(i for i, line in enumerate(lines) if "USETMAXREG.DEALLOC" in line)
    spills = [i for i, line in enumerate(lines) if re.search(r"\b(STL|LDL)\b", line)]
    mma = [i for i, line in enumerate(lines) if "HGMMA" in line and alloc < i < dealloc]
    inside = [lines[i] for i in spills if alloc < i < dealloc]
    among = [lines[i] for i in spills if mma[0] < i < mma[-1]]
    assert alloc < dealloc and not among and len(inside) <= per_tile, inside
    return report


@needs_nvcc
@pytest.mark.parametrize("name", sorted(K.ATTENTION_VARIANTS))
def test_every_variant_compiles_to_the_hopper_instructions(name):
    """PTX holds wgmma, TMA bulk-tensor copies, mbarriers, setmaxnreg and ex2; the consumers
    spill nothing and ptxas reports no serialised wgmma."""
    compiled = hopper(K.ATTENTION_VARIANTS[name])
    sizes = sizes_for(name)
    ptx = compiled.ptx(**sizes)
    for instruction in HOPPER_PTX:
        assert instruction in ptx, f"{name}: no {instruction} in the PTX"
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16", ptx)
    # a key-linear bias (ALiBi) keeps two words a tile in local memory, outside the loop's wgmma
    # code (test_a_key_linear_bias_is_one_ffma_an_element_and_its_coefficient_once_a_tile)
    keyed = plan_of(K.ATTENTION_VARIANTS[name]).key_bias is not None
    assert_consumers_do_not_spill(compiled.source(**sizes), per_tile=8 if keyed else 0)


@needs_nvcc
@pytest.mark.parametrize("D, knobs", [(64, {}), (256, {}), (128, {"block_n": 176}),
                                      (128, {"stages": 3, "overlap": False}),
                                      (64, {"consumers": 3, "block_n": 64}), (128, {"pingpong": False})])
def test_head_dims_knobs_and_f16(D, knobs):
    compiled = hopper(causal_attention_f16, **knobs)
    sizes = dict(B=1, H=4, M=300, N=517, D=D)
    ptx = compiled.ptx(**sizes)
    assert ".f32.f16.f16" in ptx and "cp.async.bulk.tensor.3d" in ptx
    n = knobs.get("block_n", {64: 192, 256: 64}.get(D, 128))   # causal: 192 at D64 (wide)
    assert f"m64n{n}k16" in ptx and f"m64n{D}k16" in ptx
    assert_consumers_do_not_spill(compiled.source(**sizes))


@pytest.mark.parametrize("name, S, scalars, want", [
    ("causal_attention", 16384, {}, 176), ("gqa_causal_attention", 16384, {}, 176),
    ("causal_attention", 4096, {}, 128),       # a tie at this length: the narrower blocks
    ("sliding_window_attention", 16384, {"window": 1024}, 128),   # its blocks are mostly cut
    ("sliding_window_attention", 16384, {}, 128),                 # the window not known
    ("document_attention", 16384, {}, 128)])                      # lists that change per call
def test_masked_plans_take_wide_blocks_where_their_schedule_is_cheaper(name, S, scalars, want):
    sizes = sizes_for(name, M=S, N=S)
    assert with_knobs(plan_of(K.ALL[name]), sizes, {}, scalars).block_n == want
    assert with_knobs(plan_of(K.ALL[name]), sizes, {"block_n": 64}, scalars).block_n == 64


@pytest.mark.parametrize("name, scalars, want", [
    ("causal_attention", {}, 192),      # a block's fixed costs weigh twice as much at D64
    ("attention", {}, 192), ("alibi_attention", {}, 192),
    ("softcap_attention", {"cap": 50.0}, 128),   # its own score function: 192 spills
    ("sliding_window_attention", {"window": 1024}, 128)])
def test_head_dim_64_takes_192_key_blocks_where_they_pay(name, scalars, want):
    sizes = sizes_for(name, M=4096, N=4096, D=64)
    assert with_knobs(plan_of(K.ALL[name]), sizes, {}, scalars).block_n == want


@pytest.mark.parametrize("name", ["attention", "causal_attention"])
def test_wide_default_blocks_give_way_to_given_stages(name):
    """Three ring slots of 176-key blocks do not fit sm_90's shared memory: a default of wide
    blocks narrows back instead of refusing the knob the user gave (``block_n`` given: refused)."""
    sizes = sizes_for(name, M=16384, N=16384)
    assert with_knobs(plan_of(K.ALL[name]), sizes, {}).block_n == 176
    knobs = with_knobs(plan_of(K.ALL[name]), sizes, {"stages": 3})
    assert (knobs.block_n, knobs.stages) == (128, 3)
    check_hopper(plan_of(K.ALL[name]), knobs, sizes, H100_SHARED)
    with pytest.raises(ScheduleError, match="shared memory"):
        check_hopper(plan_of(K.ALL[name]),
                     with_knobs(plan_of(K.ALL[name]), sizes, {"stages": 3, "block_n": 176}),
                     sizes, H100_SHARED)


@needs_nvcc
def test_every_schedule_runs_one_cubin():
    """How CTAs take tiles is a launch argument: the source is the same for every schedule, and
    its PTX holds the counter claim of the dynamic one."""
    sources = {hopper(K.causal_attention, schedule=s).source(**PREFILL)
               for s in ("grid", "dynamic", "snake", "auto")}
    assert len({hopper(K.attention, schedule=s).source(**PREFILL)
                for s in ("grid", "split", "auto")}) == 1
    assert len(sources) == 1
    assert "atom.global.add" in hopper(K.causal_attention).ptx(**PREFILL)


@pytest.mark.parametrize("consumers, ctas_per_sm", [(1, 1), (2, 1), (3, 1), (1, 2)])
def test_setmaxnreg_never_asks_for_more_than_the_pool(consumers, ctas_per_sm):
    """setmaxnreg moves registers within the CTA's launch pool: consumers asking for more than
    the producer gave back wait forever (a hang, not an error); the CTAs an SM holds share its
    65536 registers."""
    knobs = HopperKnobs(consumers=consumers, ctas_per_sm=ctas_per_sm)
    pool = knobs.threads * knobs.launch_registers
    assert 128 * knobs.producer_registers + 128 * consumers * knobs.consumer_registers <= pool
    assert knobs.consumer_registers % 8 == 0 and knobs.producer_registers % 8 == 0
    assert knobs.launch_registers * knobs.threads * ctas_per_sm <= 65536


@needs_nvcc
def test_two_ctas_an_sm_fit_its_registers_and_shared_memory():
    """``ctas_per_sm=2`` (64 query rows, 64-key blocks): launched for two CTAs an SM (ptxas held
    to 128 registers a thread; the consumer's 232 come from the producer by setmaxnreg), its
    consumers spill nothing, twice its shared memory fits the SM, and the persistent schedule
    counts two CTAs per SM; 128-key blocks in two slots are refused (twice 148 KB)."""
    knobs = dict(consumers=1, block_n=64, ctas_per_sm=2)
    compiled = hopper(K.causal_attention, **knobs)
    source = compiled.source(**PREFILL)
    assert "#define CTAS_PER_SM 2" in source and "__launch_bounds__(THREADS, CTAS_PER_SM)" in source
    report = assert_consumers_do_not_spill(source)
    assert re.search(r"Used 128 registers", report), report
    assert "setmaxnreg.inc.sync.aligned.u32 232" in compiled.ptx(**PREFILL)
    plan = plan_of(K.causal_attention)
    made = HopperKnobs(**knobs)
    assert 2 * shared_bytes(made, 128) <= H100_SHARED
    assert schedule_for(made, 4096, 132)[1] == 264
    with pytest.raises(ScheduleError, match="× 2 CTAs per SM"):
        check_hopper(plan, HopperKnobs(consumers=1, ctas_per_sm=2), PREFILL, H100_SHARED)
    with pytest.raises(ScheduleError, match="ctas_per_sm=3"):
        check_hopper(plan, HopperKnobs(ctas_per_sm=3), PREFILL, H100_SHARED)


def test_auto_schedule_is_persistent_from_two_tiles_per_sm():
    knobs = HopperKnobs()
    assert schedule_for(knobs, 200, 132) == ("grid", 200)      # under two tiles per SM
    assert schedule_for(knobs, 264, 132) == ("dynamic", 132)
    assert schedule_for(HopperKnobs(schedule="snake"), 100, 132) == ("snake", 100)
    assert schedule_for(HopperKnobs(schedule="dynamic", ctas=3), 1000, 132) == ("dynamic", 3)
    assert schedule_for(HopperKnobs(schedule="grid", ctas=3), 1000, 132) == ("grid", 1000)
    f = hopper(K.causal_attention)
    assert "tiles: dynamic schedule on" in f.schedule_origin(B=4, H=32, M=4096, N=4096, D=128)


TAIL_CHECK = r"""
#include <cstdio>
#include <algorithm>
#include <vector>
#define MIN_PIECE %d
#define TREE_FROM %d
#define TREE_FAN %d
static const int ROUNDS[] = {%s};   // merge_rounds(ctas), ctas = 0 … 140
%s
// Split tile tl's pieces arriving in a shuffled order, merged round by round as merge_piece does
// (merge_round's groups and counters; each slot's contents as the pieces summed into it): 1 unless
// exactly one merger ends with every piece once, no counter is used twice at once, and the
// counters stay within the ctas · (1 + 2 · merge_rounds) the host allocates past the first two.
// The pieces a slot holds, a bit each (pieces <= CTAs <= 140); adding a piece held twice fails.
struct Pieces {
  unsigned long long w[3] = {0, 0, 0};
  bool add(const Pieces& o) {
    for (int i = 0; i < 3; ++i) { if (w[i] & o.w[i]) return false; w[i] |= o.w[i]; }
    return true;
  }
  bool all(int n) const {
    for (int i = 0; i < 3; ++i) {
      const int k = std::min(std::max(n - 64 * i, 0), 64);
      if (w[i] != (k == 64 ? ~0ull : (1ull << k) - 1)) return false;
    }
    return true;
  }
};
int merge_all(const Tail& s, int tl, int ctas, int rounds, unsigned seed) {
  const int lo = first_piece(s, tl), hi = last_piece(s, tl), n = hi - lo + 1;
  const int fan = merge_fan(s, tl);
  if (fan < 2 || (n < TREE_FROM && fan != n)) return 1;
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = lo + i;
  for (int i = n - 1; i > 0; --i) {
    seed = seed * 1103515245u + 12345u;
    std::swap(order[i], order[(seed >> 8) %% (i + 1)]);
  }
  if (n > 192) return 1;
  std::vector<Pieces> slot(2 * ctas + 2);
  std::vector<int> count(ctas * (1 + 2 * rounds), 0);
  int mergers = 0;
  for (int p : order) {
    Pieces mine;
    mine.w[(p - lo) / 64] = 1ull << ((p - lo) %% 64);
    slot[piece_slot(s, tl, p)] = mine;
    for (int span = 1, round = 0;; span *= fan, ++round) {
      const MergeRound r = merge_round(s, tl, p, span, round, ctas);
      if (r.g0 > p || p > r.g1 || r.g1 > hi || r.counter < 0 ||
          r.counter >= (int)count.size() || (!r.last && round >= rounds))
        return 1;
      if (++count[r.counter] < r.arrivals) break;
      count[r.counter] = 0;
      mine = Pieces();   // every run of the group from its slot, the merger's own too
      for (int q = r.g0; q <= r.g1; q += span)
        if (!mine.add(slot[piece_slot(s, tl, q)])) return 1;
      if (r.last) {
        ++mergers;
        if (!mine.all(n)) return 1;
        break;
      }
      slot[piece_slot(s, tl, r.g0)] = mine;
    }
  }
  for (int c : count) if (c) return 1;   // every counter left at 0
  return mergers != 1;
}
// every (tiles, CTAs, key blocks per tile): 1 on the first failure, printing it
int main() {
  for (int tiles = 1; tiles <= 300; tiles += 7)
  for (int ctas = 1; ctas <= 140; ctas += 3)
  for (int C = 1; C <= 40; ++C) {
    const Tail s = tail_of(tiles, ctas, C, true);
    const int r = tiles - s.tile0;
#define FAIL(why) { printf("tiles %%d ctas %%d C %%d: %%s\n", tiles, ctas, C, why); return 1; }
    if (s.pieces > ctas || (s.pieces && (r >= ctas || s.L >= C || s.L < MIN_PIECE)))
      FAIL("more pieces than CTAs, tiles than counters, or pieces of the wrong length");
    if (!s.pieces && r) FAIL("split tiles without pieces");
    std::vector<int> seen(tiles * C, 0), arrived(r, 0), slot(2 * s.pieces + 2, 0);
    for (int c = 0; c < s.tile0 + s.pieces; ++c) {
      int t, f, n, x = 0;
      for (; item_at(c, s, x, t, f, n); ++x) {
        if (x >= 2 || n < 1 || f < 0 || f + n > C || t < 0 || t >= tiles) FAIL("bad item");
        for (int u = f; u < f + n; ++u) seen[t * C + u] += 1;
        if (t < s.tile0) { if (f || n != C || c != t) FAIL("a whole tile cut"); continue; }
        const int tl = t - s.tile0, p = (tl * C + f) / s.L;
        if (f == 0 && n == C) FAIL("a split tile in one piece (its rows would not be merged)");
        if (p != c - s.tile0 || p < first_piece(s, tl) || p > last_piece(s, tl))
          FAIL("a piece outside its tile's pieces");
        if (piece_slot(s, tl, p) >= 2 * s.pieces || slot[piece_slot(s, tl, p)]++)
          FAIL("two parts in one workspace slot");
        arrived[tl] += 1;
      }
      if (x == 0) FAIL("a claim with no item");
    }
    for (int u = 0; u < tiles * C; ++u) if (seen[u] != 1) FAIL("a key block not covered once");
    for (int tl = 0; tl < r; ++tl) {
      if (arrived[tl] != last_piece(s, tl) - first_piece(s, tl) + 1) FAIL("arrivals miscounted");
      if (merge_all(s, tl, ctas, ROUNDS[ctas], (unsigned)(tiles * 131 + ctas * 7 + C)))
        FAIL("a bad merge");
    }
  }
  printf("ok\n");
  return 0;
}
"""


@needs_nvcc
@pytest.mark.parametrize("fan", [TREE_FAN, 2, 3])
def test_split_tiles_cover_every_key_block_once_and_merge_every_piece(fan):
    """The ``split`` schedule's tail, run on the CPU from the kernel's own helpers: for many
    (tiles, CTAs, key blocks per tile) the claims' items cover each tile's key blocks exactly
    once, a claim is one or two items, pieces are MIN_PIECE or more blocks and no more than the
    CTAs, a split tile is never one piece (its merge would be skipped), and each split tile's
    arrivals are exactly its pieces, each in a workspace slot of its own — and, merged in a
    shuffled order as ``merge_piece`` merges them (in groups from ``TREE_FROM`` pieces), exactly
    one merger ends with every piece once, for the emitted fan of a merge round and others."""
    with tempfile.TemporaryDirectory() as d:
        path, exe = os.path.join(d, "tail.cu"), os.path.join(d, "tail")
        with open(path, "w") as f:
            rounds = ", ".join(str(merge_rounds(c)) for c in range(141))   # the host's counts
            f.write(TAIL_CHECK % (MIN_PIECE, TREE_FROM, fan, rounds, TAIL_HELPERS))
        built = subprocess.run(["nvcc", "-O1", "-o", exe, path], capture_output=True, text=True)
        assert built.returncode == 0, built.stderr[-2000:]
        ran = subprocess.run([exe], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.strip() == "ok", ran.stdout


def test_split_is_the_unmasked_persistent_schedule():
    """Without a mask the persistent default splits the last round's tiles where that round
    would leave most CTAs idle; a mask keeps the counter (its tiles differ in length), and asking
    it to split is refused with the reason."""
    knobs = HopperKnobs()
    assert schedule_for(knobs, 4096, 132, masked=False) == ("split", 132)   # 4 in the last round
    assert schedule_for(knobs, 4096, 132, masked=True) == ("dynamic", 132)
    assert schedule_for(knobs, 1024, 132, masked=False) == ("dynamic", 132)  # 100: most busy
    assert schedule_for(knobs, 1056, 132, masked=False) == ("dynamic", 132)  # whole rounds
    assert schedule_for(knobs, 200, 132, masked=False) == ("grid", 200)
    # asked for with fewer tiles than CTAs: every tile cut, over the CTAs its pieces fill
    split = HopperKnobs(schedule="split", consumers=1)
    assert schedule_for(split, 16, 132, False, 128) == ("split", 132)
    assert schedule_for(split, 4, 132, False, 20) == ("split", 20)   # pieces of MIN_PIECE
    # auto, without a mask, where one CTA a tile would leave half the SMs idle or more: every
    # tile cut too — where a tile has two pieces of MIN_PIECE key blocks at least
    assert schedule_for(HopperKnobs(), 16, 132, False, 128) == ("split", 132)
    assert schedule_for(HopperKnobs(), 66, 132, False, 24) == ("split", 132)
    assert schedule_for(HopperKnobs(), 16, 132, False, 7) == ("grid", 16)   # too few keys
    assert schedule_for(HopperKnobs(), 67, 132, False, 128) == ("grid", 67)   # most SMs busy
    assert schedule_for(HopperKnobs(), 16, 132, True, 128) == ("grid", 16)   # masked
    full = hopper(K.attention)
    assert "split schedule on 132" in full.schedule_origin(B=2, H=16, M=16384, N=16384, D=128)
    with pytest.raises(ScheduleError, match="split.*mask"):
        check_hopper(plan_of(K.causal_attention), HopperKnobs(schedule="split"), PREFILL,
                     H100_SHARED)
    # the tuning space offers it only where it runs
    split = SCHEDULES.index("split")
    assert split in knob_choices(plan_of(K.attention), PREFILL)["schedule"]
    assert split not in knob_choices(plan_of(K.causal_attention), PREFILL)["schedule"]


def test_bad_schedules_are_refused():
    plan = plan_of(K.causal_attention)
    with pytest.raises(ScheduleError, match="schedule='fifo'"):
        check_hopper(plan, HopperKnobs(schedule="fifo"), PREFILL, H100_SHARED)
    with pytest.raises(ScheduleError, match="ctas=-1"):
        check_hopper(plan, HopperKnobs(ctas=-1), PREFILL, H100_SHARED)
    with pytest.raises(ScheduleError, match="schedule=7"):
        hopper(K.causal_attention, schedule=7).source(**PREFILL)


def test_one_source_serves_every_sequence_length():
    """Sizes are kernel arguments: the same source for other batch, head and sequence sizes
    (at the same knobs: a masked plan's default block size depends on its sizes)."""
    compiled = hopper(K.causal_attention, block_n=128)
    assert compiled.source(**PREFILL) == compiled.source(B=1, H=8, M=4096, N=333, D=128)
    assert compiled.source(**PREFILL) != compiled.source(**{**PREFILL, "D": 64})


def test_new_lengths_share_the_kept_scratch(monkeypatch):
    """The scratch a launch keeps (counters, split workspace) is one set per layout: a new prompt
    length with the same knobs allocates none (each set costs driver allocations on the first
    call at a length); another layout gets its own."""
    import importlib

    module = importlib.import_module("tensorfuse.schedule_templates.hopper_attention")
    made = []
    monkeypatch.setattr(module, "StreamScratch",
                        lambda layout: made.append(layout) or object())
    compiled = hopper(K.causal_attention, block_n=128)
    for n in (4096, 4100, 4200, 5000):
        compiled.launches(**dict(PREFILL, M=n, N=n))
    compiled.launches(**dict(PREFILL, M=4096, N=4096, D=64))   # the same layout too
    assert len(made) == 1
    compiled.launches(B=1, H=1, M=256, N=256, D=128)   # 2 tiles: 2 persistent CTAs, not 264
    assert len(made) == 2 and made[1] != made[0]


def test_compile_prefers_it_for_prefill_on_sm90a():
    f = tf.compile(K.causal_attention, "cuda:sm_90a")
    assert f.schedule_origin(**PREFILL).startswith("hopper_attention template defaults")
    decode = dict(PREFILL, M=1, H=8)   # one query token, 16 (batch, head) pairs: the cluster
    assert f.schedule_origin(**decode).startswith("cluster_decode template defaults (")
    # 32 pairs: the split update (decode_plan.cluster_decode_pays)
    assert f.schedule_origin(**dict(PREFILL, M=1)) == "template defaults"
    few = dict(PREFILL, M=4)      # a few: the Triton split update
    assert f.schedule_origin(**few) == "template defaults"
    assert "wgmma" not in f.source(**{**PREFILL, "D": 100})     # a head dim it does not take
    other = tf.compile(K.causal_attention, "cuda:sm_80")
    assert "hopper" not in other.description
    assert "hopper" not in tf.compile(K.softmax, "cuda:sm_90a").description


def test_the_compiled_kernel_says_which_template_runs_and_why_not_the_others():
    """``tf.compile``'s kernel names the kernel at each sizes and each one passed over with its
    reason: a head dim the Hopper template does not take (300: the Triton template's features
    in chunks), a prefill shape for the decode kernel, a feature axis too wide for the Triton
    template even in chunks (the floor's stages then)."""
    f = tf.compile(K.causal_attention, "cuda:sm_90a")
    odd = f.describe_plan(**{**PREFILL, "D": 100})
    first, *passed = odd.splitlines()
    assert first.endswith(f.template.description) and "D=100" in first
    assert any(line.startswith("  not hopper_attention") and "head dim D=100" in line
               for line in passed)
    assert "row-tile plan of causal_attention" in odd
    native = f.describe_plan(**PREFILL)
    assert native.splitlines()[0].endswith(f.ahead[0].description)
    assert "  not " not in native and "hopper attention plan" in native
    wide = f.describe_plan(**{**PREFILL, "D": 300})   # the row tile's features in chunks
    assert wide.splitlines()[0].endswith(f.template.description), wide
    assert "head dim D=300: the Hopper template handles multiples of 8 from 32 to 256" in wide
    assert "feature in chunks of 64: 300" in wide
    wider = f.describe_plan(**{**PREFILL, "D": 1024})   # the floor's stages run it
    assert f"  not the {f.template.description}: the feature axis has 1024 elements" in wider
    assert wider.splitlines()[0].endswith("3 stage kernels (no template takes causal_attention "
                                          "whole): s_sum from q, k; m, l from scale, s_sum; out "
                                          "from v, scale, s_sum, m, l"), wider


def test_plan_is_printable_from_a_schedule():
    sch = tf.schedule(K.document_attention, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    sch.apply_template("hopper_attention", block_n=64)
    text = sch.plan(**PREFILL)
    assert "hopper attention plan" in text and "doc[b, " in text and "block_n=64" in text


@tf.kernel
def alibi_f32_slopes(q: Q, k: KV, v: KV, slopes: T.Tensor["H", "f32"], scale: T.f32):
    """ALiBi with float32 slopes as a user writes it: the score and so the output are float32."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale - slopes[h] * T.cast(i - j, "f32")
    return softmax_attend(s, v[b, h, j, e], j)


@tf.kernel
def alibi_f32_slopes_cast(q: Q, k: KV, v: KV, slopes: T.Tensor["H", "f32"], scale: T.f32):
    """The same, its output cast to the inputs' bf16 — what the Hopper template stores."""
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale - slopes[h] * T.cast(i - j, "f32")
    return T.cast(softmax_attend(s, v[b, h, j, e], j), "bf16")


def test_a_float32_output_is_stored_from_the_float32_accumulators():
    """A float32 term in the score (a user's float32 slopes) makes the output float32: the
    Hopper template takes it — q, k, v stay bf16 on the tensor cores, the output is stored
    as float32 from the accumulators (8 bytes a lane, not packed to 16 bits) —, as it takes
    the output cast to bf16. Operands of other dtypes are still refused."""
    plan = plan_hopper_attention(alibi_f32_slopes.program, CHAIN, "j")
    assert plan.dtype == "bf16" and plan.chain.out_dtype == "f32"
    assert "bf16; the output f32)" in plan.describe().splitlines()[0]
    for kernel in (alibi_f32_slopes, alibi_f32_slopes_cast):
        made = tf.compile(kernel, "cuda:sm_90a")
        assert made.describe_plan(**PREFILL, scale=0.1).splitlines()[0].split(": ")[1] \
            .startswith("hopper_attention"), made.describe_plan(**PREFILL, scale=0.1)
    assert plan_hopper_attention(alibi_f32_slopes_cast.program, CHAIN, "j").chain.out_dtype == ""
    source = tf.compile(alibi_f32_slopes, "cuda:sm_90a").source(**PREFILL, scale=0.1)
    assert "make_float2(o[4 * n + 2 * x] * inv" in source and "pending[x][g]" not in source
    with pytest.raises(ScheduleError, match=r"q, k and v are f32; this template reads bf16"):
        plan_hopper_attention(float32_operands.program, CHAIN, "j")


@tf.kernel
def float32_operands(q: T.Tensor["B", "H", "M", "D", "f32"], k: T.Tensor["B", "H", "N", "D", "f32"],
                     v: T.Tensor["B", "H", "N", "D", "f32"], scale: T.f32):
    b, h, i, j, d, e = T.axes("b h i j d e")
    s = T.sum(q[b, h, i, d] * k[b, h, j, d], over=d) * scale
    return softmax_attend(s, v[b, h, j, e], j)


@needs_nvcc
@pytest.mark.parametrize("kernel", [alibi_f32_slopes, alibi_f32_slopes_cast])
def test_an_attention_output_of_either_dtype_compiles_for_sm90a_on_wgmma(kernel):
    made = tf.compile(kernel, "cuda:sm_90a")
    assert "wgmma.mma_async" in made.ptx(**PREFILL, scale=0.1)
    # as much as the bf16 library kernel keeps outside its block loop, no more
    assert_consumers_do_not_spill(made.source(**PREFILL, scale=0.1), per_tile=8)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [alibi_f32_slopes, alibi_f32_slopes_cast])
def test_an_attention_output_of_either_dtype_matches_float64_on_the_gpu(kernel):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from tests.helpers import fresh_seed, relative_error

    seed = fresh_seed()
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = ((torch.randn(2, 4, 300, 128, device="cuda", generator=g) * 2).bfloat16()
               for _ in range(3))
    slopes = torch.rand(4, device="cuda", generator=g) * 0.1
    made = tf.compile(kernel)
    wide = kernel is alibi_f32_slopes
    out = torch.full(q.shape, float("nan"), device="cuda",
                     dtype=torch.float32 if wide else torch.bfloat16)
    made(q, k, v, slopes, 0.09, out=out)
    assert made.describe_plan(B=2, H=4, M=300, N=300, D=128, scale=0.09).splitlines()[0] \
        .split(": ")[1].startswith("hopper_attention")
    pos = torch.arange(300, device="cuda", dtype=torch.float64)
    s = q.double() @ k.double().transpose(-1, -2) * 0.09 - \
        slopes.double()[:, None, None] * (pos[:, None] - pos[None, :])
    want = torch.softmax(s, -1) @ v.double()
    # float32 stores: only the bf16 operands' products round (bf16 stores round once more)
    assert relative_error(out, want) < (1e-2 if wide else 2e-2), seed


@pytest.mark.gpu
def test_every_variant_matches_float64_on_the_gpu():
    """Every library variant, ragged sizes (M ≠ N), GQA, f16, head dims 64 and 128, normal and
    wide-range inputs, output poisoned with NaN: within bf16/f16 tolerance of float64, and rows
    with no visible key NaN exactly where the reference's are."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from benchmarks.hopper_attention import check

    assert check(log=lambda line: None) == 0


@pytest.mark.gpu
def test_a_swapped_source_runs_after_forget_built():
    """``benchmarks.hopper_ab`` times another revision's source on the same launches: after
    ``forget_built`` the next call builds and runs the source now in the launches — the fast call
    of the first call kept its module before (every 'other' timed that way was this
    revision's kernel)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    f = hopper(K.attention)
    q, k, v = (torch.randn(1, 2, 256, 128, device="cuda").to(torch.bfloat16) for _ in range(3))
    first = f(q, k, v, scale=0.1)
    again = f(q, k, v, scale=0.1)   # the fast path
    for launches in f._launches.values():
        assert "const float inv = 1.0f / l[x];" in launches.source
        launches.source = launches.source.replace("const float inv = 1.0f / l[x];",
                                                  "const float inv = 2.0f / l[x];")
    f.forget_built()
    doubled = f(q, k, v, scale=0.1)
    torch.testing.assert_close(again, first)
    torch.testing.assert_close(doubled.float(), 2 * first.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["dynamic", "snake", "split"])
def test_persistent_schedules_replay_in_a_cuda_graph(schedule):
    """Persistent CTAs on few SMs (many tiles each) in a captured graph, replayed with fresh
    inputs: the dynamic schedule's counters are the graph's own and reset on every replay; the
    split one (full attention: 56 tiles on 5 CTAs, the last one cut in two pieces) merges its
    pieces through the graph's own workspace."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from benchmarks.attention import reference
    from benchmarks.common import relative_error

    causal = schedule != "split"
    f = hopper(K.causal_attention if causal else K.attention, schedule=schedule,
               ctas=4 if causal else 5)
    B, H, M, D = 2, 4, 777, 128

    def fresh():
        return [torch.randn(B, H, M, D, device="cuda").to(torch.bfloat16) for _ in range(3)]

    q, k, v = fresh()
    f(q, k, v, scale=D ** -0.5)   # built and compiled outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(q, k, v, scale=D ** -0.5)
    for _ in range(2):
        for x, y in zip((q, k, v), fresh()):
            x.copy_(y)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference(q, k, v, D ** -0.5, None, (lambda b, h, i, j: i >= j) if causal else None)
        assert relative_error(out.double(), ref) <= 2e-2


@pytest.mark.gpu
def test_few_tiles_over_many_keys_split_over_every_sm_merge_in_two_rounds():
    """Two 128-row tiles of 70k keys on the split schedule: each cut into ~57 pieces, merged in
    groups and then the groups (``TREE_FROM``), by each consumer warpgroup's own counters;
    called twice with fresh inputs (the counters left at zero), outputs poisoned; a repeated
    call gives the same bits (the pieces merged in their order, whichever finishes last)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from benchmarks.attention import reference
    from tests.helpers import fresh_seed, relative_error

    seed = fresh_seed()
    g = torch.Generator(device="cuda").manual_seed(seed)
    f = hopper(K.attention, schedule="split")
    B, H, M, N, D = 1, 2, 100, 70001, 128
    assert "split schedule" in f.schedule_origin(B=B, H=H, M=M, N=N, D=D)
    for _ in range(2):
        q = (torch.randn(B, H, M, D, device="cuda", generator=g) * 3).bfloat16()
        k, v = ((torch.randn(B, H, N, D, device="cuda", generator=g) * 3).bfloat16()
                for _ in range(2))
        out = torch.full_like(q, float("nan"))
        f(q, k, v, scale=D ** -0.5, out=out)
        assert relative_error(out, reference(q, k, v, D ** -0.5, None, None)) <= 2e-2, seed
        assert all(torch.equal(f(q, k, v, scale=D ** -0.5), out) for _ in range(3)), seed


def test_index_terms_used_as_floats_are_converted_once_per_fragment():
    """``(j − i)`` used as a float (ALiBi's ``slope · (j − i)``, a squared distance): the integer
    difference is converted at the fragment's first row and column (loop-invariant) plus a
    per-register constant, not once per score element; integer uses (the mask, a tensor's
    indices) keep their integers."""
    from tensorfuse.algebra.exprs import nodes
    from tensorfuse.dsl.expr import Axis
    from tensorfuse.targets.cuda.expr import converted_indices

    def squared_distance(q: Q, k: KV, v: KV, scale: T.f32):   # not linear in j: as written
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = scores(q, k, b, h, h, i, j, d, scale) - 0.001 * (j - i) * (j - i)
        return softmax_attend(s, v[b, h, j, e], j)

    src = hopper(tf.kernel(squared_distance)).source(**PREFILL)
    assert "(float)(((j0_) - (i0_))) + (float)(1 * (dj_) + -1 * (di_))" in src
    plan = plan_of(K.alibi_attention)
    axes = {n: {"0": "i_", "j": "j_"}.get(r, r) for n, r in plan.chain.score_axes}
    offsets = {n: {"i_": "di_", "j_": "dj_"}[v] for n, v in axes.items() if v in ("i_", "j_")}
    base = {n: {"i_": "i0_", "j_": "j0_"}.get(v, v) for n, v in axes.items()}
    assert len(converted_indices(plan.score, offsets, base, {}, {})) == 1
    j = next(a for a in nodes(plan.score) if isinstance(a, Axis) and axes[a.name] == "j_")
    scaled = converted_indices((j * 2 + 3) * 0.5, offsets, base, {}, {})
    assert len(scaled) == 1 and next(iter(scaled.values())).endswith("(float)(2 * (dj_)))")
    assert converted_indices((j // 2) * 0.5, offsets, base, {}, {}) == {}   # not affine
    assert converted_indices(j * 2 + 1 > 3, offsets, base, {}, {}) == {}    # an integer use
    plain = plan_of(K.causal_attention)
    assert converted_indices(plain.score, offsets, base, {}, {}) == {}


@needs_nvcc
def test_a_score_reading_a_table_gets_its_size_and_stays_inside_it():
    """A bias table ``table[h, i − j + N − 1]`` of its own length R: R is a kernel argument (the
    source used an undefined ``TF_SIZE_R`` and did not compile), and the index is clamped into
    the table — the kernel evaluates the score at the padding keys of a ragged last block, where
    ``i − j + N − 1`` is negative (masked afterwards, but it was read)."""
    from benchmarks.attention_unlisted import table_bias_attention

    plan = plan_of(table_bias_attention)
    assert plan.extra_sizes == ("R",)
    compiled = hopper(table_bias_attention)
    sizes = dict(B=1, H=4, M=200, N=517, D=128, R=1033)
    src = compiled.source(**sizes)
    assert "int TF_SIZE_R" in src
    assert re.search(r"t_table\[\(min\(max\(\(h\), 0\), TF_SIZE_H - 1\)\) \* TF_SIZE_R \+ "
                     r"min\(max\(.*, 0\), TF_SIZE_R - 1\)\]", src)
    assert "wgmma.mma_async" in compiled.ptx(**sizes)


@needs_nvcc
@pytest.mark.parametrize("name", sorted(UNLISTED))
def test_unlisted_variants_compile_to_the_hopper_instructions(name):
    """Variants no issue lists (a key-padding mask, causal with padding, a bias table with and
    without causal, soft-capping in a sliding window, ALiBi on grouped heads, a scale read per
    batch row and head): planned, generated and compiled for sm_90a at a short and a long key
    sequence (176-key blocks where the mask's schedule favours them); their values are checked
    on the GPU with the library's (``benchmarks.hopper_attention.check``). Some spill
    registers at 176 keys — softcap's 308 bytes still ran 3.5 % faster than 128-key blocks
    (``benchmarks.hopper_attention``) — so spills are not asserted here."""
    kernel, _, (hq, hkv) = UNLISTED[name]
    for S in (517, 16384):
        sizes = dict(B=2, H=hq, HKV=hkv, M=300, N=S, D=128, R=2 * S - 1)
        sizes = {n: v for n, v in sizes.items() if n in kernel.program.dim_names()}
        ptx = hopper(kernel).ptx(**sizes)
        for instruction in HOPPER_PTX:
            assert instruction in ptx, f"{name}: no {instruction} in the PTX"


@needs_nvcc
def test_the_output_is_written_in_16_byte_pieces():
    """The four lanes of a row trade their pairs and each writes 16 bytes (STG.E.128); no 4-byte
    stores of the output remain (they cost the tile's end 4–6 % on the H100:
    ``benchmarks.hopper_attention``). Without a log-sum-exp output the kernel stores nothing else
    to global memory
    (the persistent schedule's counters use atomics)."""
    _, sass = _ptxas_and_sass(hopper(K.causal_attention).source(**PREFILL))
    stores = re.findall(r"\bSTG\.E(\.\w+)*", sass)
    assert stores and all(".128" in "".join(s) for s in stores), stores


def test_the_source_is_the_same_in_every_process():
    """Cubins are cached by the source's hash: generating it must not depend on Python's
    per-process hash seed (set order), or every process would build again."""
    code = ("import hashlib, tensorfuse.kernels as K\n"
            "from tests.schedule_templates.test_hopper_attention import PREFILL, hopper\n"
            "print(hashlib.sha256(hopper(K.alibi_attention).source(**PREFILL).encode())"
            ".hexdigest())")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=root, env={**os.environ, "PYTHONHASHSEED": seed},
                              check=True).stdout.strip() for seed in ("1", "2", "3")}
    assert len(digests) == 1, digests


def test_a_new_length_inside_a_bucket_chooses_its_key_blocks_without_sampling_the_mask(
        monkeypatch):
    """Whether 176-key blocks pay is decided per power-of-two bucket of lengths: causal at 8191
    tokens samples the block schedule once (at 8192) and 8000 reuses the answer — the same
    block size, no mask evaluated — while 4096 keeps 128-key blocks."""
    from tensorfuse.schedule_templates import block_schedule, hopper_attention_plan as hp

    monkeypatch.setattr(hp, "_WIDE_PAYS", {})
    sampled = []
    real = block_schedule.block_lists
    monkeypatch.setattr(block_schedule, "block_lists",
                        lambda *a, **k: sampled.append(a[4]) or real(*a, **k))
    made = tf.compile(K.causal_attention, target="cuda:sm_90a")

    def block_n(n):
        sizes = dict(B=1, H=16, M=n, N=n, D=128)
        return made.for_sizes(**sizes).launches(**sizes).knobs.block_n

    assert block_n(8191) == hp.WIDE_BLOCK_N and len(sampled) == 2   # 128 and 176 keys
    assert all(s["N"] == 8192 and s["M"] == 8192 for s in sampled)
    assert block_n(8000) == hp.WIDE_BLOCK_N and len(sampled) == 2
    assert block_n(4096) == 128 and len(sampled) == 4


def test_a_log_sum_exp_output_in_bf16_is_refused_with_the_cast_that_takes_it():
    """Written without a cast, the log-sum-exp is stored in bf16, which the Hopper template does
    not write: the reason names the output and the cast; cast to float32 the template takes it
    (the Triton template runs the bf16 one meanwhile; both checked in the interpreter:
    :mod:`tests.schedule_templates.unlisted_check`)."""
    from tests.schedule_templates.unlisted_check import attention_and_logsumexp

    dims = dict(PREFILL, scale=0.1)
    bf16 = tf.compile(attention_and_logsumexp(None), "cuda:sm_90a").describe_plan(**dims)
    assert "log-sum-exp output lse is bf16" in bf16 and "T.cast(m + T.log(l), 'f32')" in bf16
    assert bf16.splitlines()[0].split(": ")[1].startswith("attention template"), bf16
    f32 = tf.compile(attention_and_logsumexp("f32"), "cuda:sm_90a").describe_plan(**dims)
    assert f32.splitlines()[0].split(": ")[1].startswith("hopper_attention"), f32


@pytest.mark.gpu
def test_a_log_sum_exp_output_the_user_wrote_matches_float64_on_the_gpu():
    """The Hopper template writing a user's float32 log-sum-exp beside the output (ragged sizes,
    wide scores, outputs poisoned) against float64: bf16 output 2e-2, the log-sum-exp 1e-5 of
    its largest magnitude (float32 state, bf16 operands' products exact in it)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from tests.helpers import fresh_seed, relative_error
    from tests.schedule_templates.unlisted_check import attention_and_logsumexp

    seed = fresh_seed()
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(2, 4, 300, 128, device="cuda", generator=g) * 3).bfloat16()
    k, v = ((torch.randn(2, 4, 777, 128, device="cuda", generator=g) * 3).bfloat16()
            for _ in range(2))
    made = tf.compile(attention_and_logsumexp("f32"))
    assert "hopper_attention" in made.schedule_origin(B=2, H=4, M=300, N=777, D=128, scale=0.1)
    out = torch.full(q.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((2, 4, 300), float("nan"), device="cuda")
    made(q, k, v, 0.1, out=(out, lse))
    s = q.double() @ k.double().transpose(-1, -2) * 0.1
    assert relative_error(out, torch.softmax(s, -1) @ v.double()) < 2e-2, seed
    assert relative_error(lse, torch.logsumexp(s, -1)) < 1e-5, seed
