"""Token tiling: visiting a map-shaped mask's sequence in patches and key windows — the
arithmetic, the block schedule (every visible pair visited exactly once), the choice, the
schedule primitive, and the kernels in Triton's interpreter against float64."""
import math
import os
import secrets
import subprocess

import pytest
import torch

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.algebra import plan_chain
from tensorfuse.errors import ScheduleError
from tensorfuse.kernels.reference import TOLERANCE
from tensorfuse.schedule_templates.block_schedule import window_lists
from tensorfuse.schedule_templates.mask_values import MaskEvaluator
from tensorfuse.schedule_templates.tile_plan import TilePlanner
from tensorfuse.schedule_templates.token_tiling import (TokenTiling, choose_tiling,
                                                        map_dims)
from tests.helpers import run_interpreted


def _plan(kernel, S):
    chain = plan_chain(kernel.program, ("m", "l", "o"), "j")
    return TilePlanner(kernel.program, chain).plan(dict(B=1, H=2, M=S, N=S, D=16))


@pytest.mark.parametrize("extent, dims, dilation, patch", [
    (4096, (64, 64), (1, 1), (8, 16)), (4096, (64, 64), (2, 2), (16, 8)),
    (143, (13, 11), (1, 1), (4, 4)), (87, (9, 10), (2, 1), (4, 4)),
    (210, (5, 6, 7), (1, 2, 1), (2, 2, 4)), (16384, (16, 32, 32), (1, 1, 1), (2, 8, 8))])
def test_tiled_order_visits_every_token_once(extent, dims, dilation, patch):
    t = TokenTiling(extent, dims, dilation, patch)
    token, valid = t.position(torch.arange(t.padded))
    kept = token if valid is None else token[valid]
    assert t.padded % t.block == 0
    assert sorted(kept.tolist()) == list(range(extent))
    assert (valid is None) == t.exact


def test_map_is_read_from_the_index_arithmetic():
    plan = _plan(K.neighborhood_attention_2d, 4096)
    assert map_dims([plan.map_mask], plan.row, 4096, plan.sizes, {"width": 64}) == (64, 64)
    assert map_dims([plan.map_mask], plan.row, 4096, plan.sizes, {}) is None   # width unknown
    video = _plan(K.neighborhood_attention_3d, 16384)
    assert map_dims([video.map_mask], video.col, 16384, video.sizes,
                    {"height": 32, "width": 32}) == (16, 32, 32)
    flat = _plan(K.sliding_window_attention, 256)
    assert map_dims([flat.map_mask], flat.row, 256, flat.sizes, {"window": 8}) is None


@pytest.mark.parametrize("kernel, S, scalars, asked, block", [
    (K.neighborhood_attention_2d, 24 * 20, dict(width=20, radius=2, dilation=2), None, 16),
    (K.neighborhood_attention_2d, 13 * 11, dict(width=11, radius=3, dilation=1),
     dict(patch=(4, 4), key_patch=(2, 8)), 16),
    (K.neighborhood_attention_3d, 5 * 6 * 7, dict(height=6, width=7, radius=1, causal=1), None,
     16),
    # windows larger than the neighbourhood near the map's edges (a grid through the queries
    # would start before the map: wrong keys on the H100 before origins were kept inside)
    (K.neighborhood_attention_2d, 64 * 64, dict(width=64, radius=7, dilation=2),
     dict(patch=(8, 16), key_patch=(16, 8), dilation=(2, 2)), 128),
    (K.neighborhood_attention_2d, 64 * 64, dict(width=64, radius=7, dilation=2), None, 128),
])
def test_key_windows_cover_every_visible_pair_exactly_once(kernel, S, scalars, asked, block):
    plan = _plan(kernel, S)
    choice = choose_tiling(plan.map_mask, plan.batch, plan.row, plan.col, plan.sizes, scalars,
                           block, block, asked)
    assert choice.cols is not None
    pn, pi, fn, fi = window_lists(plan.map_mask, plan.batch, plan.row, plan.col, plan.sizes,
                                  scalars, block, "cpu", choice.rows, choice.cols)
    rows = choice.rows.padded if choice.rows else math.ceil(S / block) * block
    keys = torch.arange(S)
    visible = MaskEvaluator({a.uid: 0 for a in plan.batch} | {plan.row.uid: keys.view(-1, 1),
                                                            plan.col.uid: keys.view(1, -1)},
                         {}, scalars, plan.sizes)(plan.map_mask)
    within = torch.arange(block)
    for rb in range(rows // block):
        if choice.rows:
            tokens, ok = choice.rows.position(rb * block + within)
            tokens = tokens if ok is None else tokens[ok]
        else:
            tokens = (rb * block + within)[rb * block + within < S]
        covered = torch.zeros(S, dtype=torch.int64)
        for num, at, whole in ((pn, pi, False), (fn, fi, True)):
            for origin in at[rb, :num[rb]].tolist():
                assert all(int(c) >= 0 for c in choice.cols.coordinates(torch.tensor(origin)))
                token, ok = choice.cols.position(torch.tensor(origin), within)
                ok = torch.ones(block, dtype=torch.bool) if ok is None else ok
                covered.index_add_(0, token[ok], torch.ones(int(ok.sum()), dtype=torch.int64))
                if whole:   # a full block: every key a token and visible from every row
                    assert bool(ok.all()) and bool(visible[tokens][:, token].all())
        needed = visible[tokens].any(dim=0)
        assert bool((covered[needed] == 1).all()), f"row block {rb}: a visible key missed or twice"
        assert int(covered.max()) <= 1


def test_the_choice_tiles_dilated_neighbourhoods_and_keeps_flat_masks_flat():
    plan = _plan(K.neighborhood_attention_2d, 4096)
    choice = choose_tiling(plan.map_mask, plan.batch, plan.row, plan.col, plan.sizes,
                           dict(width=64, radius=3, dilation=2), 128, 64)
    assert choice.rows.dilation == (2, 2) and choice.cols.dilation == (2, 2)
    assert choice.cost * 2 <= choice.flat_cost, choice.describe()
    flat = _plan(K.sliding_window_attention, 512)
    kept = choose_tiling(flat.map_mask, flat.batch, flat.row, flat.col, flat.sizes, {"window": 64},
                         64, 64)
    assert kept.rows is None and kept.cols is None


def test_tile_as_refuses_what_it_cannot_do():
    sch = tf.schedule(K.sliding_window_attention, "cuda:sm_90a")
    sch.rolling_update("m", "l", "o", axis="j").apply_template("attention", tile_m=64, tile_n=64)
    sch.tile_as(patch=(8, 8))
    with pytest.raises(ScheduleError, match="does not read the query or key axis as a map"):
        sch.compile().build({"window": 8}, B=1, H=1, M=256, N=256, D=16)
    sch = tf.schedule(K.neighborhood_attention_2d, "cuda:sm_90a")
    sch.rolling_update("m", "l", "o", axis="j").apply_template("attention", tile_m=64, tile_n=64)
    sch.tile_as(patch=(8, 16))
    with pytest.raises(ScheduleError, match="multiply to the block size"):
        sch.compile().build(dict(width=16, radius=1, dilation=1), B=1, H=1, M=256, N=256, D=16)
    assert sch.undo().startswith("tile_as") and sch.tiling is True
    sch.tile_as(patch=(8, 8), key_patch=(2, 4, 8))     # a 2-D map: two sides, not three
    with pytest.raises(ScheduleError, match="2-D map needs a dilation and a patch of 2"):
        sch.compile().build(dict(width=16, radius=1, dilation=1), B=1, H=1, M=256, N=256, D=16)
    gemm = tf.schedule(K.matmul, "cuda:sm_90a").apply_template("hopper_gemm")
    with pytest.raises(ScheduleError, match="attention template"):
        gemm.tile_as(patch=(8, 8))


def test_plan_shows_the_visiting_order_and_compile_prefers_the_tiled_template():
    from tensorfuse.schedule_templates.auto import choose, native_templates
    from tensorfuse.targets import get_target

    sch = tf.schedule(K.neighborhood_attention_2d, "cuda:sm_90a")
    sch.rolling_update("m", "l", "o", axis="j").apply_template("attention")
    text = sch.plan(B=1, H=2, M=1024, N=1024, D=64, width=32, radius=2, dilation=2)
    assert "visiting order: queries: 32×32 map in patches of" in text and "dilation 2×2" in text
    sch.tile_as(patch=(8, 8))       # fixed by hand: the plan (and its knobs' origin) follow it
    text = sch.plan(B=1, H=2, M=1024, N=1024, D=64, width=32, radius=2, dilation=2)
    assert "patches of 8×8" in text and "knobs from: template defaults" in text
    spec = get_target("cuda:sm_90a")
    for kernel in (K.neighborhood_attention_2d, K.causal_attention):
        name, fusion = choose(kernel.program, spec)
        made = native_templates(kernel, name, fusion, spec)
        assert any("hopper" in m.description.lower() for m in made), kernel.name


def test_compile_takes_the_hopper_template_where_the_map_tiles_and_triton_elsewhere():
    """``tf.compile`` on sm_90a runs a map's mask on the Hopper template in patches — decided
    per call by the map's scalars: a width the dilation does not divide (sub-maps of different
    sizes, no TMA box) goes to the Triton template's gathers, which visit it in patches too."""
    f = tf.compile(K.neighborhood_attention_2d, "cuda:sm_90a")
    sizes = dict(B=1, H=2, M=4096, N=4096, D=128)
    tiled = f.for_sizes(dict(width=64, radius=3, dilation=2), **sizes)
    assert "hopper_attention" in tiled.description
    assert "patches of" in f.schedule_origin(**sizes, width=64, radius=3, dilation=2)
    odd = dict(B=1, H=2, M=63 * 65, N=63 * 65, D=128)
    assert "hopper" not in f.for_sizes(dict(width=65, radius=3, dilation=2), **odd).description
    assert "hopper" not in f.for_sizes(**sizes).description   # no scalars: nothing to tile by


def test_tiled_kernels_match_float64_in_the_interpreter():
    seed = int(os.environ.get("TENSORFUSE_SEED", secrets.randbits(32)))
    results = run_interpreted("tests.schedule_templates.tiling_check", seed, timeout=600)
    for name, r in results.items():
        assert r["error"] <= TOLERANCE["bf16"], f"{name}: {r} (TENSORFUSE_SEED={seed})"
        assert r["tiled"], f"{name}: ran in the flat order ({r['order']})"


def test_congruences_become_remainders_of_index_vectors_and_mean_the_same():
    """``(a - b) % d == 0`` is emitted as ``a % d == b % d`` (no modulo of every element) and
    the rewritten mask selects the same pairs as the written one."""
    plan = _plan(K.neighborhood_attention_2d, 24 * 20)
    assert plan.written_mask is not None and plan.mask.key() != plan.written_mask.key()
    keys = torch.arange(24 * 20)
    scalars = dict(width=20, radius=2, dilation=3)
    grids = {a.uid: 0 for a in plan.batch} | {plan.row.uid: keys.view(-1, 1),
                                               plan.col.uid: keys.view(1, -1)}
    written = MaskEvaluator(grids, {}, scalars, plan.sizes)(plan.written_mask)
    emitted = MaskEvaluator(grids, {}, scalars, plan.sizes)(plan.mask)
    assert bool(written.any()) and torch.equal(written, emitted)
    sch = tf.schedule(K.neighborhood_attention_2d, "cuda:sm_90a")
    source = sch.rolling_update("m", "l", "o", axis="j").apply_template("attention").compile() \
        .source(B=1, H=2, M=4096, N=4096, D=128)
    import re

    differences = set(re.findall(r"(_t\d+) = \(_t\d+ - _t\d+\)", source))
    assert differences, source
    modded = set(re.findall(r"_floormod\((_t\d+),", source))
    assert not differences & modded, "a tile-wide difference is taken modulo"


def test_the_scalars_a_tiled_kernel_is_built_for_are_compiled_in():
    sch = tf.schedule(K.neighborhood_attention_3d, "cuda:sm_90a")
    f = sch.rolling_update("m", "l", "o", axis="j").apply_template("attention").compile()
    sizes = dict(B=1, H=2, M=2048, N=2048, D=64, scale=0.1, radius=2, causal=1)
    wide = f.source(**sizes, height=16, width=32)
    narrow = f.source(**sizes, height=32, width=16)
    assert "(tok_m[:, None] // 32)" in wide and "(tok_m[:, None] // 16)" in narrow
    assert "causal" not in wide.split("BLOCK_K: tl.constexpr):", 1)[1]


@pytest.mark.parametrize("kernel, scalars", [
    (K.neighborhood_attention_2d, dict(width=64, radius=3, dilation=2)),
    (K.neighborhood_attention_3d, dict(height=32, width=32, radius=3, causal=1))])
def test_tiled_kernels_do_not_spill_at_the_template_defaults(kernel, scalars):
    """ptxas (sm_90a) on the tiled kernel at D=128: a 128×128 score tile beside the mask's index
    arithmetic spilled 288–624 bytes; the defaults for map-shaped masks must not."""
    import re
    import tempfile

    import triton

    sch = tf.schedule(kernel, "cuda:sm_90a")
    f = sch.rolling_update("m", "l", "o", axis="j").apply_template("attention").compile()
    S = 4096 if "2d" in kernel.name else 16384
    ptx = f.compiled(B=1, H=16, M=S, N=S, D=128, scale=0.1, **scalars).asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as out:
            out.write(ptx)
        done = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "k.o")],
                              capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    assert spills and spills.groups() == ("0", "0"), done.stderr[-600:]
