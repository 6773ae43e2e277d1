"""The Hopper attention template's token tiling on the CPU: the kernel's map arithmetic (its C++
compiled for the host), its TMA boxes (read from a NumPy view of the tensors the way the
tensor-map unit reads them: zeros past an inner edge, the next head past the outermost), its
block lists and its mask bits, put together the way the kernel puts them together and checked
against float64 — every token written once, ragged maps, dilation, 3-D, several heads; plus the
sm_90a code made of it (GPU runs: ``benchmarks.neighborhood``, ``test_every_variant…`` in
``test_hopper_attention``)."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import tensorfuse as tf
import tensorfuse.kernels as K
from tensorfuse.errors import ScheduleError
from tensorfuse.kernels.reference import random_inputs, reference, relative_error
from tensorfuse.schedule_templates.hopper_attention_plan import plan_hopper_attention
from tensorfuse.schedule_templates.hopper_tiling import choose_hopper_tiling, tiled_lists
from tensorfuse.targets.cuda.map_tiles import (corner_function, position_function, view_box,
                                               view_rank, view_sizes)
from tensorfuse.targets.cuda.wgmma import fragment_elements

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
CHAIN = ("m", "l", "o")

# (name, kernel, B, H, tokens, scalars, block_m, block_n, tile_as request or True to choose)
CASES = [
    ("2-D 16x24 dilation 2", K.neighborhood_attention_2d, 2, 2, 16 * 24,
     dict(width=24, radius=2, dilation=2), 128, 128, True),
    ("2-D ragged 13x11", K.neighborhood_attention_2d, 1, 3, 13 * 11,
     dict(width=11, radius=2, dilation=1), 64, 64, True),
    ("3-D causal 4x8x8", K.neighborhood_attention_3d, 1, 2, 4 * 8 * 8,
     dict(height=8, width=8, radius=1, causal=1), 128, 64,
     dict(patch=(2, 8, 8), key_patch=(1, 8, 8))),
    ("3-D 6x5x7, patches past every edge", K.neighborhood_attention_3d, 2, 1, 6 * 5 * 7,
     dict(height=5, width=7, radius=1, causal=0), 64, 64,
     dict(patch=(1, 8, 8), key_patch=(4, 4, 4))),
    ("2-D 20x12 dilation 2, radius 1", K.neighborhood_attention_2d, 1, 2, 20 * 12,
     dict(width=12, radius=1, dilation=2), 64, 64,
     dict(patch=(8, 8), key_patch=(4, 16), dilation=(2, 2))),
]


def _host_functions(tiling, tokens: int, heads: int, positions: int) -> tuple[dict, dict]:
    """The kernel's ``tf_map_corner`` and ``tf_row_token`` compiled for the host and run on
    every token × head and every position: ``(corners, rows)``."""
    rank = view_rank(tiling.cols.dims, tiling.cols.dilation)
    source = ("#define __host__\n#define __device__\n#define __forceinline__ inline\n"
              "#include <cstdio>\n" + corner_function("tf_map_corner", tiling.cols)
              + position_function("tf_row_token", tiling.rows) + f"""
int main() {{
  int c[{rank - 1}];
  for (int h = 0; h < {heads}; ++h)
    for (int t = 0; t < {tokens}; ++t) {{
      tf_map_corner(t, h, c);
      printf("c %d %d", t, h);
      for (int k = 0; k < {rank - 1}; ++k) printf(" %d", c[k]);
      printf("\\n");
    }}
  for (int p = 0; p < {positions}; ++p) {{
    bool ok;
    const int t = tf_row_token(p, ok);
    printf("r %d %d %d\\n", p, t, (int)ok);
  }}
}}
""")
    with tempfile.TemporaryDirectory() as d:
        path, exe = os.path.join(d, "m.cpp"), os.path.join(d, "m")
        with open(path, "w") as f:
            f.write(source)
        built = subprocess.run(["g++", "-O1", "-o", exe, path], capture_output=True, text=True)
        assert built.returncode == 0, built.stderr[-2000:]
        lines = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split("\n")
    corners, rows = {}, {}
    for line in lines:
        parts = line.split()
        if parts and parts[0] == "c":
            corners[(int(parts[1]), int(parts[2]))] = [int(x) for x in parts[3:]]
        elif parts:
            rows[int(parts[1])] = (int(parts[2]), bool(int(parts[3])))
    return corners, rows


def _read_box(view: np.ndarray, corner: list[int], box: tuple[int, ...]) -> np.ndarray:
    """What TMA copies: the box at ``corner`` (innermost first, past the head dim's) of ``view``,
    zeros outside it, as ``[rows, D]`` in the box's row-major order."""
    starts = list(reversed(corner)) + [0]
    index, inside = [], []
    for start, n, size in zip(starts, box[:-1] + (view.shape[-1],), view.shape):
        at = np.arange(start, start + n)
        index.append(np.clip(at, 0, size - 1))
        inside.append((at >= 0) & (at < size))
    out = view[np.ix_(*index)]
    keep = np.ones(out.shape, dtype=bool)
    for k, ok in enumerate(inside):
        shape = [1] * len(inside)
        shape[k] = -1
        keep &= ok.reshape(shape)
    return np.where(keep, out, 0.0).reshape(-1, view.shape[-1])


def _emulate(plan, tiling, made, q, k, v, scale, block_m, block_n):
    """The tiled kernel's output, computed the kernel's way: for each (batch·head, row block) the
    query patch's box, each listed window's key and value boxes, the partial blocks' mask from
    the bits in the consumers' fragment order, and the rows written at their tokens (NaN where
    nothing is written)."""
    pn, pi, fn, fi, bits, offsets = (t.cpu().numpy() for t in made)
    B, H, S, D = q.shape
    HKV = k.shape[1]
    dims, dil = tiling.cols.dims, tiling.cols.dilation
    corners, rows = _host_functions(tiling, S, max(B * H, B * HKV), tiling.rows.padded)
    views = [x.reshape(view_sizes(dims, dil, x.shape[0] * x.shape[1], D)) for x in (q, k, v)]
    q_box, k_box = view_box(tiling.rows.patch, dil), view_box(tiling.cols.patch, dil)
    fr, fc = fragment_elements(block_m, block_n)
    row_blocks, bound = tiling.rows.padded // block_m, tiling.cols.bound
    out = np.full((B * H, S, D), np.nan)
    written = np.zeros((B * H, S), dtype=int)
    for bh in range(B * H):
        kv = (bh // H) * HKV + (bh % H) // (H // HKV)
        for rb in range(row_blocks):
            at = bh * row_blocks + rb
            first, _ = rows[rb * block_m]
            qt = _read_box(views[0], corners[(first, bh)], q_box)
            scores, values = [], []
            for kind, count, entries in (("partial", pn[at], pi), ("full", fn[at], fi)):
                for it in range(count):
                    origin = int(entries.reshape(-1)[at * bound + it])
                    kt = _read_box(views[1], corners[(origin, kv)], k_box)
                    vt = _read_box(views[2], corners[(origin, kv)], k_box)
                    s = qt @ kt.T * scale
                    if kind == "partial":
                        words = bits[offsets[rb] + it]          # [consumers, words, 128]
                        bit = (words[..., None].astype(np.int64) >> np.arange(32)) & 1
                        visible = np.zeros((block_m, block_n), dtype=bool)
                        sel = fr >= 0
                        visible[fr[sel], fc[sel]] = bit[sel].astype(bool)
                        s = np.where(visible, s, -np.inf)
                    scores.append(s)
                    values.append(vt)
            if not scores:
                continue
            s = np.concatenate(scores, axis=1)
            top = s.max(axis=1, keepdims=True)
            p = np.exp(s - np.where(np.isfinite(top), top, 0.0))   # padding rows see nothing
            with np.errstate(invalid="ignore"):   # padding rows: 0/0, never written
                o = (p @ np.concatenate(values)) / p.sum(axis=1, keepdims=True)
            for r in range(block_m):
                token, ok = rows[rb * block_m + r]
                if ok:
                    out[bh, token] = o[r]
                    written[bh, token] += 1
    return out.reshape(B, H, S, D), written


@needs_gxx
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_kernels_boxes_lists_and_bits_compute_the_attention(case):
    """The tiled kernel's pieces, put together the kernel's way, give the float64 attention on
    every token, each written exactly once."""
    pytest.importorskip("torch")   # the lists and bits are made with torch
    name, kernel, B, H, S, scalars, block_m, block_n, request = case
    plan = plan_hopper_attention(kernel.program, CHAIN, "j")
    sizes = dict(B=B, H=H, HKV=H, M=S, N=S, D=16)
    tiling, why = choose_hopper_tiling(plan, block_m, block_n, sizes, scalars, request)
    assert tiling is not None, why
    made = tiled_lists(plan, tiling, sizes, scalars, block_m, block_n, "cpu")
    rng = np.random.default_rng(7)
    tensors, values = random_inputs(kernel, dict(B=B, H=H, M=S, N=S, D=16), rng, scalars)
    q, k, v = (np.asarray(tensors[n], dtype=np.float64) for n in ("q", "k", "v"))
    out, written = _emulate(plan, tiling, made, q, k, v, values["scale"], block_m, block_n)
    assert (written == 1).all(), f"{name}: tokens written {np.unique(written)} times"
    want = reference(kernel, tensors, values)
    assert relative_error(out, want) < 1e-9, name


@pytest.mark.parametrize("knobs", [dict(), dict(consumers=1, block_n=64)])
def test_compile_tiles_a_neighbourhood_and_says_how(knobs):
    """``tf.compile``'s Hopper kernel for a 2-D neighbourhood visits patches (the plan says so);
    ``tile_as(enabled=False)`` keeps the flat order; a score that reads the indices keeps it
    too, saying why."""
    sch = tf.schedule(K.neighborhood_attention_2d, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    sch.apply_template("hopper_attention", **knobs)
    scalars = dict(width=64, radius=3, dilation=1)
    sizes = dict(B=1, H=2, M=4096, N=4096, D=128)
    why = sch.compile().launches(scalars, **sizes).why
    assert "visiting order: queries: 64×64 map in patches" in why, why
    assert "TMA boxes" in why
    text = sch.plan(**sizes, **scalars)   # the order and its density, in the plan
    assert "hopper attention plan" in text and "of the blocks visited" in text
    sch.tile_as(enabled=False)
    assert "patches" not in sch.compile().launches(scalars, **sizes).why


def test_tile_as_is_refused_where_the_kernel_cannot_take_it():
    """A map whose sides are not multiples of the dilation has sub-maps of different sizes: no
    box describes them, and an explicit request says so."""
    sch = tf.schedule(K.neighborhood_attention_2d, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    sch.apply_template("hopper_attention").tile_as(patch=(8, 16), key_patch=(8, 16),
                                                   dilation=(2, 2))
    with pytest.raises(ScheduleError, match="not multiples of the dilation"):
        sch.compile().launches(dict(width=33, radius=2, dilation=2), B=1, H=1, M=33 * 33,
                               N=33 * 33, D=128)
    plan = plan_hopper_attention(K.neighborhood_attention_2d.program, CHAIN, "j")
    tiling, why = choose_hopper_tiling(plan, 128, 128, dict(B=1, H=1, HKV=1, M=33 * 33,
                                                            N=33 * 33, D=128),
                                       dict(width=33, radius=2, dilation=2))
    assert tiling is None and "dilation" in why


def test_view_of_a_dilated_map_is_five_dimensional():
    """Heads merged into the outermost sub-map rows, one dimension per dilation, the head dim
    innermost; a 3-D dilated map would need seven and is refused."""
    assert view_sizes((64, 64), (2, 2), 16, 128) == (16 * 32, 2, 32, 2, 128)
    assert view_box((8, 16), (2, 2)) == (8, 1, 16, 1, 64)
    assert view_sizes((16, 32, 32), (1, 1, 1), 4, 64) == (64, 32, 32, 64)
    with pytest.raises(ScheduleError, match="at most 5"):
        view_sizes((4, 8, 8), (2, 2, 2), 1, 64)


# each case at one CTA an SM, and those of 64-row tiles with 64-key windows at two as well
GPU_CASES = [(case, 1) for case in CASES] + [(case, 2) for case in CASES if case[6:8] == (64, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("D", [128, 64])
@pytest.mark.parametrize("case, ctas_per_sm", GPU_CASES,
                         ids=[f"{c[0]}, {n} CTA/SM" for c, n in GPU_CASES])
def test_tiled_kernels_match_float64_on_the_gpu(case, ctas_per_sm, D):
    """Each case on the H100 through ``tf.compile``'s Hopper template with the case's blocks and
    order: output poisoned with NaN, called twice (the persistent schedule's counters reset
    themselves), normal and wide-range inputs, within bf16 tolerance of float64 everywhere."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from benchmarks.hopper_attention import TOLERANCE

    name, kernel, B, H, S, scalars, block_m, block_n, request = case
    sch = tf.schedule(kernel, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    sch.apply_template("hopper_attention", consumers=block_m // 64, block_n=block_n,
                       ctas_per_sm=ctas_per_sm)
    if isinstance(request, dict):
        sch.tile_as(**request)
    f = sch.compile()
    assert "visiting order: queries" in f.launches(scalars, B=B, H=H, M=S, N=S, D=D).why
    rng = np.random.default_rng(D)
    for spread in (1.0, 8.0):
        tensors, values = random_inputs(kernel, dict(B=B, H=H, M=S, N=S, D=D), rng, scalars)
        tensors = {n: x * (spread if n in ("q", "k") else 1.0) for n, x in tensors.items()}
        args = {n: torch.as_tensor(np.asarray(x, dtype=np.float32)).to("cuda", torch.bfloat16)
                for n, x in tensors.items()}
        exact = {n: np.asarray(x.float().cpu(), dtype=np.float64) for n, x in args.items()}
        want = reference(kernel, exact, values)   # of the bf16-rounded inputs
        for _ in range(2):
            out = torch.full((B, H, S, D), float("nan"), dtype=torch.bfloat16, device="cuda")
            f(**args, **values, out=out)
            torch.cuda.synchronize()
            got = out.double().cpu().numpy()
            assert not np.isnan(got).any(), f"{name}: rows left unwritten"
            assert relative_error(got, want) <= TOLERANCE["bf16"], (name, spread)


def test_tuning_tunes_the_template_tf_compile_runs_for_the_map():
    """``tf.tune``'s task for a map that tiles is the Hopper template's (its space without the
    176-key blocks no patch makes, its sources tiled for the task's scalars); a map that does not
    tile tunes the Triton template, which ``tf.compile`` runs there."""
    from tensorfuse.autotune.spaces import space_of
    from tensorfuse.autotune.tasks import make_task

    target = tf.get_target("cuda:sm_90a")
    kernel = K.neighborhood_attention_2d
    task = make_task(kernel, dict(B=1, H=2, M=4096, N=4096, D=128), target,
                     {"width": 64, "radius": 3, "dilation": 1})
    assert task.template == "hopper_attention"
    space = space_of(task)
    assert 176 not in space.choices()["block_n"]
    # 128-key blocks in three slots fit without the bits' slots, not with them
    assert "shared memory" in space.unfit({"block_n": 128, "stages": 3})
    # the job's baseline is what tf.compile runs untuned: the cost model's tile shape
    defaults = space.defaults()
    assert (defaults["consumers"], defaults["block_n"], defaults["ctas_per_sm"],
            defaults["overlap"]) == (1, 64, 2, 0)
    assert space.unfit(defaults) is None
    candidate = space.candidate({"block_n": 64, "consumers": 1})
    assert "patches of 8×8" in candidate.launches({"width": 64, "radius": 3, "dilation": 1},
                                                  B=1, H=2, M=4096, N=4096, D=128).why
    odd = make_task(kernel, dict(B=1, H=2, M=63 * 65, N=63 * 65, D=128), target,
                    {"width": 65, "radius": 3, "dilation": 2})
    assert odd.template == "attention"


def test_the_tile_shape_follows_the_key_blocks_a_tile_visits():
    """Where a tile sees few key blocks (7×7 and 15×15 kernels on a 64² map) its fixed cost
    dominates: 64-row tiles with 64-key windows, two CTAs an SM, cost least — at ~4 blocks a tile
    without the intra-warpgroup overlap (``benchmarks.neighborhood``); with many blocks a
    tile (31×31) 128-row tiles of 128-key windows do — the choices the H100 measured
    (``benchmarks.neighborhood``), and ``tf.compile``'s. Knobs given narrow the shapes: a 128-key
    block keeps one
    CTA an SM, three stages do not fit two."""
    from tensorfuse.schedule_templates.hopper_tiling import tile_shape_for_map

    plan = plan_hopper_attention(K.neighborhood_attention_2d.program, CHAIN, "j")
    sizes = dict(B=1, H=16, HKV=16, M=4096, N=4096, D=128)
    small = dict(width=64, radius=3, dilation=1)
    shape, tiling = tile_shape_for_map(plan, sizes, small)
    # ~4 key blocks a tile: no intra-warpgroup overlap (its pipeline's fill and drain cost more)
    assert shape == (64, 64, 2, False) and tiling.rows.block == 64
    assert tile_shape_for_map(plan, sizes, small, overlap=True)[0] == (64, 64, 2, True)
    assert tile_shape_for_map(plan, sizes, dict(width=64, radius=7, dilation=1))[0] == \
        (64, 64, 2, True)
    assert tile_shape_for_map(plan, sizes, dict(width=64, radius=15, dilation=1))[0] == \
        (128, 128, 1, True)
    assert tile_shape_for_map(plan, sizes, small, lambda shape: shape[1] == 128)[0] == \
        (64, 128, 1, True)
    assert tile_shape_for_map(plan, sizes, small, lambda shape: shape[1] == 128, False)[0] == \
        (64, 128, 1, False)
    f = tf.compile(K.neighborhood_attention_2d, "cuda:sm_90a")
    origin = f.schedule_origin(B=1, H=16, M=4096, N=4096, D=128, **small)
    assert "consumers=1" in origin and "block_n=64" in origin and "ctas_per_sm=2" in origin
    assert "overlap=False" in origin and "on 264 persistent CTAs" in origin
    sch = tf.schedule(K.neighborhood_attention_2d, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    kept = sch.apply_template("hopper_attention", overlap=True).compile()
    assert "overlap=True" in kept.schedule_origin(B=1, H=16, M=4096, N=4096, D=128, **small)
    sch = tf.schedule(K.neighborhood_attention_2d, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    wide = sch.apply_template("hopper_attention", block_n=128).compile()
    assert "consumers=1" in wide.schedule_origin(B=1, H=16, M=4096, N=4096, D=128, **small)
    assert "ctas_per_sm" not in wide.schedule_origin(B=1, H=16, M=4096, N=4096, D=128, **small)
    sch = tf.schedule(K.neighborhood_attention_2d, "cuda:sm_90a").rolling_update(*CHAIN, axis="j")
    deep = sch.apply_template("hopper_attention", stages=3).compile()
    assert "ctas_per_sm" not in deep.schedule_origin(B=1, H=16, M=4096, N=4096, D=128, **small)