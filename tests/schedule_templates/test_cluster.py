"""cluster_distribute: CUDA for sm_90a compiled by nvcc here (PTX holds the cluster and DSM
instructions), clear refusals, and — on the H100 — correctness against float64."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

import tensorfuse as tf
from benchmarks.decode_grid import fp16_attention
from tests.helpers import needs_nvcc
from tensorfuse import dsl as T
from tensorfuse.errors import ScheduleError
from tensorfuse.kernels.attention import (attention, gqa_attention,
                                          sliding_window_attention, softcap_attention,
                                          softmax_attend)
from tensorfuse.kernels.ffn import ffn_gelu, ffn_swiglu
from tensorfuse.targets.cuda.dsm import CLUSTER_PTX

FFN = dict(M=128, K=512, N=1024, O=256)
DECODE = dict(B=2, H=8, HKV=2, M=1, N=1000, D=128)
gqa_attention_f16 = fp16_attention()   # the library's GQA attention declared over fp16 tensors
Q, KV = T.Tensor["B", "H", "M", "D", "bf16"], T.Tensor["B", "HKV", "N", "D", "bf16"]


def _ffn(kernel, **knobs):
    sch = tf.schedule(kernel, target="cuda:sm_90a")
    sch.cluster_distribute("n", **knobs)
    return sch.compile()


def _decode(kernel, **knobs):
    sch = tf.schedule(kernel, target="cuda:sm_90a")
    sch.rolling_update("m", "l", "o", axis="j")
    sch.cluster_distribute("j", **knobs)
    return sch.compile()


@needs_nvcc
@pytest.mark.parametrize("kernel", [ffn_gelu, ffn_swiglu])
@pytest.mark.parametrize("cluster, mma", [(2, "wgmma"), (4, "wgmma"), (2, "mma_sync"),
                                          (4, "mma_sync")])
def test_ffn_ptx_has_cluster_and_dsm_instructions(kernel, cluster, mma):
    ptx = _ffn(kernel, cluster=cluster, block_n=64, block_o=64, mma=mma,
               exchange="gather").ptx(**FFN)
    # each CTA stores its slice of H into its peers' shared memory
    for instruction in CLUSTER_PTX + ("st.shared::cluster.v4.b32",):
        assert instruction in ptx, instruction
    if mma == "wgmma":  # warpgroup MMA from shared-memory descriptors, one group kept in flight
        assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in ptx
        assert "wgmma.wait_group.sync.aligned 1" in ptx
        assert "fence.proxy.async" in ptx  # cp.async / DSM writes published to wgmma's proxy
        assert "mma.sync" not in ptx and "ldmatrix" not in ptx
        # the cp.async rings run on mbarriers: copies arrive on "full" as they land, and no CTA
        # barrier or wait_group per k-tile (two bar.syncs: after the barrier init, and before
        # the exchange)
        main = _main_kernel(ptx)
        assert "cp.async.mbarrier.arrive.noinc.shared::cta.b64" in main
        assert "mbarrier.try_wait.parity" in main and "cp.async.wait_group" not in main
        assert len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b", main)) == 2
    else:
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx  # tensor cores
        assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx       # weights [in, out]
    assert "cp.async.cg.shared.global" in ptx                           # the pipeline
    assert "atom.global.add.v4.f32" in _main_kernel(ptx)  # clusters meet here, 16-B atomics
    assert "st.global" not in _main_kernel(ptx)  # h never goes to global memory, only f32 sums
    if mma == "wgmma":  # H shared by peer reads: DSM loads feed wgmma's register operand
        peer = _ffn(kernel, cluster=cluster, block_n=64, block_o=64, exchange="peer").ptx(**FFN)
        assert "ld.shared::cluster.v4.b32" in peer and "st.shared::cluster" not in peer
        assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16\s*"
                         r"\{[^}]*\},\s*\{%r\d+, %r\d+, %r\d+, %r\d+\}", peer)
        assert "st.global" not in _main_kernel(peer)
    if mma == "wgmma":  # the same with TMA: a producer warp's bulk tensor copies, mbarriers
        tma = _ffn(kernel, cluster=cluster, block_n=64, block_o=64, copy="tma").ptx(**FFN)
        for instruction in ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier",
                            "mbarrier.try_wait.parity", "mbarrier.arrive.expect_tx",
                            "mbarrier.arrive.shared::cta",  # consumers release slots
                            "fence.proxy.tensormap::generic.acquire", "st.shared::cluster"):
            assert instruction in tma, instruction
        assert "cp.async.cg" not in tma and "st.global" not in _main_kernel(tma)
    if mma == "wgmma":  # a producer warpgroup: every copy, H's k-tiles from the peers too
        main = _main_kernel(_ffn(kernel, cluster=cluster, block_n=64, block_o=64,
                                 copy="producer").ptx(**FFN))
        for instruction in ("setmaxnreg.dec.sync.aligned.u32 56",   # the producer gives registers
                            "setmaxnreg.inc.sync.aligned.u32 224",  # to the consumers
                            "ld.shared::cluster.v4.b32",   # H's k-tiles from the owners,
                            "st.shared.v4.b32",            # into the local ring
                            "cp.async.mbarrier.arrive.noinc", "fence.proxy.async"):
            assert instruction in main, instruction
        # both products from shared-memory descriptors (no register A), no CTA barrier after the
        # barriers' init (the producer and the consumers meet only on mbarriers)
        assert not re.search(r"wgmma\.mma_async[^;]*\},\s*\{%r", main)
        assert len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b", main)) == 1
        assert "st.shared::cluster" not in main and "st.global" not in main
    if mma == "wgmma":  # peer reads fed by TMA: one consumer thread's bulk copies, no cp.async
        main = _main_kernel(_ffn(kernel, cluster=cluster, block_n=64, block_o=64, copy="tma",
                                 exchange="peer").ptx(**FFN))
        for instruction in ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier",
                            "mbarrier.arrive.expect_tx", "ld.shared::cluster.v4.b32"):
            assert instruction in main, instruction
        assert "cp.async.cg" not in main and "st.global" not in main


def _main_kernel(ptx: str) -> str:
    """The PTX of ``tf_chain_main`` up to the next entry (not up to the first closing brace:
    inline-asm blocks close with one too)."""
    main = ptx[ptx.index(".entry tf_chain_main"):]
    end = main.find(".entry", 1)
    return main if end < 0 else main[:end]


@needs_nvcc
@pytest.mark.parametrize("kernel", [gqa_attention, softcap_attention])
@pytest.mark.parametrize("mma", ["mma_sync", "fma"])
def test_decode_ptx_has_cluster_and_dsm_instructions(kernel, mma):
    sizes = dict(DECODE) if kernel is gqa_attention else \
        {k: v for k, v in DECODE.items() if k != "HKV"}
    f = _decode(kernel, cluster=4, mma=mma)
    ptx = f.ptx(**sizes)
    for instruction in CLUSTER_PTX + ("ld.shared::cluster",):  # states merged by DSM loads
        assert instruction in ptx, instruction
    # key/value blocks staged per warp: bulk tensor copies on an mbarrier for the tensor-core
    # sweep (its default), 16-byte cp.async for the CUDA-core one
    tma = mma == "mma_sync"
    assert ("cp.async.bulk.tensor.3d.shared::cluster.global" in ptx) == tma
    assert ("mbarrier.try_wait.parity" in ptx) == tma
    assert ("cp.async.cg.shared.global" in ptx) == (not tma)
    tensor_core_ops = ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                       "ldmatrix.sync.aligned.m8n8.x4.shared.b16",        # K rows for q·k
                       "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16")  # V rows for p·v
    for instruction in tensor_core_ops:
        assert (instruction in ptx) == (mma == "mma_sync"), instruction
    # softcap: tanh on the special-function unit
    assert ("tanh.approx.f32" in ptx) == (kernel is not gqa_attention)


@needs_nvcc
@pytest.mark.parametrize("D", [64, 128, 256])
def test_decode_copies_at_fixed_offsets_and_skips_settled_rescales(D):
    """Up to D = 128 a lane copies its 16-byte pieces of a whole block at fixed offsets from one
    shared and one global address (no index arithmetic per piece: the kernel is bound by its
    instructions, Nsight Compute, ``tools/ncu_decode.py``) and a warp votes to skip o's rescale
    where no
    row's maximum moved; a ragged block, and every block at D = 256 (where those made ptxas
    spill), takes the loop over the pieces (clamped rows), and at D = 256 o is always
    rescaled. The float64 GPU suite holds the results."""
    f = _decode(gqa_attention, copy="cp.async")
    sizes = {**DECODE, "D": D}
    source = f.source(**sizes)
    fixed = D <= 128
    assert ("if (first + 32 > j_end)" in source) == fixed   # the ragged block: the loop
    assert ("tf_cp_async16_l2_at(kd + i * STEP * KST * 2, ks + i * STEP * D)" in source) == fixed
    assert "for (int c = lane; c < 32 * D / 8; c += 32)" in source
    assert bool(re.search(r"vote\.sync\.any\.pred", f.ptx(**sizes))) == fixed


@needs_nvcc
@pytest.mark.parametrize("D", [64, 128, 256])
def test_decode_bulk_copies_read_the_swizzled_boxes(D):
    """``copy="tma"`` (the tensor-core sweep's default): lane 0 of a warp arms the stage's
    mbarrier for a block's bytes and issues D / 64 boxes of keys and as many of values; the
    warp waits on that barrier, and its ``ldmatrix`` reads address the rows through the
    128-byte swizzle (no per-lane copies, no skewed rows in the shared-memory size)."""
    from tensorfuse.schedule_templates.decode_plan import DecodeKnobs
    from tensorfuse.targets.cuda.cluster_decode import decode_shared_bytes

    f = _decode(gqa_attention)
    sizes = {**DECODE, "D": D}
    launches = f.launches(**sizes)
    assert launches.knobs.copy == "tma"
    source = f.source(**sizes)
    assert "tf_mbar_expect(ready + buf, 2 * 32 * D * 2);" in source
    assert "for (int a = 0; a < D / 64; ++a)" in source
    assert "tf_cp_async16" not in source.split("tf_decode_cluster(")[1]
    assert "ldsm_x4(kf, k_at(kblock," in source and "ldsm_x4_t(vf, v_at(vblock," in source
    ptx = f.ptx(**sizes)
    assert ptx.count("cp.async.bulk.tensor.3d.shared::cluster.global") % 2 == 0  # keys, values
    assert "cp.async.bulk.tensor.3d.shared::cluster.global" in ptx
    assert "mbarrier.arrive.expect_tx" in ptx
    # the maps are kernel parameters (by value, made per call), read through their generic address
    assert len(re.findall(r"\.param \.align 64 \.b8 tf_decode_cluster_param_\d+\[128\]", ptx)) == 2
    assert "cvta.param.u64" in ptx
    tma, skewed = (DecodeKnobs(cluster=4, warps=4, stages=2, copy=c) for c in ("tma", "cp.async"))
    assert decode_shared_bytes(skewed, D, 4) - decode_shared_bytes(tma, D, 4) == \
        4 * 2 * 32 * 2 * 16 - 1024 - 64   # skew gone; alignment slack and barriers added


@needs_nvcc
@pytest.mark.parametrize("knobs", [{}, {"copy": "cp.async"}, {"mma": "fma"}])
def test_fp16_decode_runs_the_fp16_tensor_core_product(knobs):
    """An fp16 decode is the same kernel with every bf16 type, conversion and MMA swapped for
    fp16's: no bf16 name is left, and the tensor-core sweep issues the f16 MMA."""
    f = _decode(gqa_attention_f16, **knobs)
    source = f.source(**DECODE)
    assert "bfloat" not in source and "#include <cuda_fp16.h>" in source
    ptx = f.ptx(**DECODE)
    assert ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx) == \
        (knobs.get("mma") != "fma")
    assert "bf16" not in ptx


def test_a_source_does_not_depend_on_the_order_the_sizes_come_in():
    """Two kernels asked for the same sizes in different orders (a call's binding and a tuning
    job's task list them differently) write the same source: the cubin one process built is
    the one another finds."""
    forwards = _decode(gqa_attention).source(**DECODE)
    backwards = _decode(gqa_attention).source(**dict(reversed(list(DECODE.items()))))
    assert forwards == backwards


def test_decode_takes_the_key_count_at_run_time():
    """A decode cache grows by a key per step: one kernel (one source, one set of launches)
    serves every key count, which each call passes; other sizes are compiled in. Keys whose
    head dim is not innermost are refused."""
    f = _decode(gqa_attention)
    sizes = dict(DECODE)
    sources = {f.source(**{**sizes, "N": n}) for n in (1, 1000, 4097, 32768)}
    assert len(sources) == 1
    source = sources.pop()
    assert "int n_keys" in source and "#define N_ n_keys" in source
    assert f.launches(**{**sizes, "N": 5}) is f.launches(**{**sizes, "N": 6})
    assert f.source(**{**sizes, "B": 3}) != source   # the batch is compiled in

    @tf.kernel
    def keys_last(q: T.Tensor["B", "H", "M", "D", "bf16"], k: T.Tensor["B", "H", "D", "N", "bf16"],
                  v: T.Tensor["B", "H", "N", "D", "bf16"], scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.sum(q[b, h, i, d] * k[b, h, d, j], over=d) * scale
        return softmax_attend(s, v[b, h, j, e], j)

    with pytest.raises(ScheduleError, match=r"cluster decode reads k and v in one order of "
                                            r"batch, kv-head and keys with the head dim "
                                            r"innermost.*k bhdj"):
        _decode(keys_last)


@needs_nvcc
@pytest.mark.parametrize("D, group, knobs", [(64, 4, {}), (128, 16, {"stages": 2, "warps": 4}),
                                             (256, 4, {}), (128, 24, {"mma": "fma"}),
                                             (256, 4, {"copy": "cp.async"}), (128, 64, {}),
                                             (128, 128, {"warps": 8})])
def test_decode_kernel_compiles_without_spills(D, group, knobs, tmp_path):
    """The tensor-core sweep keeps Q's fragments and the D-wide accumulator in registers for the
    whole sweep (255 at D=256): a spill would quietly cost much of the bandwidth."""
    src = _decode(gqa_attention, **knobs).source(B=2, H=2 * group, HKV=2, M=1, N=1000, D=D)
    _assert_no_spills(_ptxas_report(src, tmp_path), "tf_decode_cluster")


@needs_nvcc
@pytest.mark.parametrize("kernel", [ffn_gelu, ffn_swiglu])
@pytest.mark.parametrize("M", [64, 1024])
@pytest.mark.parametrize("knobs", [{"copy": "cp_async"}, {"copy": "tma"},
                                   {"exchange": "peer", "cluster": 8, "block_o": 256},
                                   {"copy": "producer"}, {"copy": "tma", "exchange": "peer"}])
def test_wgmma_kernel_is_not_serialized_by_ptxas(kernel, M, knobs, tmp_path):
    """ptxas serializes asynchronous MMAs (and says so, C7514/C7517) when accumulator registers are
    touched while a group is in flight, and spills when registers run out: both would silently
    cost most of the speed, so the generated kernel must compile clean."""
    out = _ptxas_report(_ffn(kernel, mma="wgmma", **knobs).source(M=M, K=4096, N=14336, O=4096),
                        tmp_path)
    assert "C7514" not in out and "C7517" not in out, out
    _assert_no_spills(out, "tf_chain_main")


def test_a_large_group_shares_each_block_between_a_team_of_warps():
    """64 heads on one kv-head: four warps of 16 heads each read every block, copied once by
    the team's first warp; two teams by default; the teams' states go over the dead buffers.
    A group of up to 16 keeps one warp a block, its source without teams."""
    from tensorfuse.schedule_templates.decode_plan import DecodeKnobs
    from tensorfuse.targets.cuda.cluster_decode import decode_shared_bytes, states_over_buffers

    made = _decode(gqa_attention)
    sizes = {**DECODE, "H": 128}
    assert made.launches(**sizes).knobs.warps == 8
    src = made.source(**sizes)
    assert "#define TILES 4" in src and "#define SWEEPERS 2" in src
    assert "if (lane == 0 && tile == 0)" in src and "row0 = tile * 16 + lane / 4" in src
    assert "tf_team_sync(sweeper);" in src and "(dsmem);   // over the buffers" in src
    assert "j_step = SWEEPERS * 32" in src
    plain = made.source(**DECODE)
    assert "TILES" not in plain and "tf_team_sync" not in plain
    # two teams' blocks (2 stages of 32 rows of keys and values, 64 KB), 1 KB of alignment, the
    # CTA's o, m and l, the teams' m and l and their barriers — the teams' o over the blocks
    teams = DecodeKnobs(warps=8, stages=2)
    blocks, cta, team_ml = 2 * 2 * 32 * 4 * 128, 4 * (64 * 128 + 2 * 64), 4 * 2 * 2 * 64
    assert decode_shared_bytes(teams, 128, 64) == blocks + 1024 + cta + team_ml + 32
    assert states_over_buffers(teams, 64)
    # 128 heads: a team's o (64 KB) is more than its two stages of blocks (32 KB); four fit it
    assert not states_over_buffers(teams, 128)
    assert states_over_buffers(DecodeKnobs(warps=8, stages=4), 128)


def test_decode_knobs_whose_shared_memory_the_driver_refuses_are_refused_by_name():
    """64 heads on one kv-head with two teams of 6 stages: 232,032 bytes of buffers and states
    fit the 227 KB a CTA may ask for, but beside the kernel's static shared memory (the split
    merge's flag, 2 KB in the bulk copies' alignment) they did not, and the driver's refusal
    said only "CUresult 1": the plan refuses them, naming the knobs and the bytes; the defaults
    keep within it, and 4 stages of two teams still fit."""
    from tensorfuse.schedule_templates.decode_plan import DecodeKnobs
    from tensorfuse.targets.cuda.cluster_decode import (STATIC_SHARED_BYTES, decode_fits,
                                                        decode_shared_bytes)

    limit = tf.get_target("cuda:sm_90a").max_shared_memory
    too_many = DecodeKnobs(warps=8, stages=6)
    assert decode_shared_bytes(too_many, 128, 64) <= limit < \
        decode_shared_bytes(too_many, 128, 64) + STATIC_SHARED_BYTES
    assert not decode_fits(too_many, 128, 64, limit)
    assert decode_fits(DecodeKnobs(warps=8, stages=4), 128, 64, limit)
    sizes = {**DECODE, "H": 128}
    with pytest.raises(ScheduleError, match=r"warps=8, stages=6 .* 64 heads per kv-head need "
                                            r"232032 bytes .* beside up to 2048 static"):
        _decode(gqa_attention, warps=8, stages=6).launches(**sizes)
    knobs = _decode(gqa_attention).launches(**sizes).knobs
    assert decode_fits(knobs, 128, 64, limit)


@pytest.mark.gpu
def test_a_kernel_asking_more_shared_memory_than_the_gpu_gives_is_refused_with_the_bytes():
    """A driver launch whose dynamic shared memory beside the kernel's static shared memory is
    more than the GPU gives a block: the error names the kernel, both amounts and the most
    this GPU allows (the driver itself says "CUresult 1")."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from tensorfuse.errors import TargetError
    from tensorfuse.targets.cuda.module import DriverLaunch

    source = """extern "C" __global__ void tf_shared_hog(float* out) {
  __shared__ float fixed[1024];
  extern __shared__ float rest[];
  fixed[threadIdx.x] = threadIdx.x; rest[threadIdx.x] = 1.f;
  __syncthreads();
  out[threadIdx.x] = fixed[threadIdx.x ^ 1] + rest[threadIdx.x ^ 1];
}"""
    launch = DriverLaunch(source, tf.get_target("cuda:sm_90a"), "tf_shared_hog", ("handle",))
    out = torch.zeros(32, device="cuda")
    with pytest.raises(TargetError, match=r"kernel tf_shared_hog asks 232448 bytes of dynamic "
                                          r"shared memory beside (4096|5120) static ones "
                                          r"\(2[0-9]+ in all\); this GPU gives a block at most "
                                          r"232448"):
        launch([out.data_ptr()], 1, 32, 1, 227 * 1024, out.device)
    launch([out.data_ptr()], 1, 32, 1, 1024, out.device)
    torch.cuda.synchronize()
    assert out.tolist() == [float(i ^ 1) + 1.0 for i in range(32)]


@needs_nvcc
@pytest.mark.parametrize("D, group, knobs", [(256, 32, {"warps": 2}), (64, 20, {})])
def test_teams_keep_their_sweep_out_of_local_memory(D, group, knobs, tmp_path):
    """At D = 256 a warp of a team (32 heads: two warps a block) keeps 255 registers, and ptxas
    parks a value or two in local memory across the sweep (at D = 64 with 20 heads, a
    predicate): stored before it, loaded after. No local access may sit inside the sweep,
    between the first and the last MMA."""
    import subprocess
    from pathlib import Path

    import triton

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    if not nvdisasm.exists():
        pytest.skip("no nvdisasm in the triton wheel")
    src = _decode(gqa_attention, **knobs).source(B=2, H=2 * group, HKV=2, M=1, N=1000, D=D)
    _ptxas_report(src, tmp_path)
    sass = subprocess.run([str(nvdisasm), "-c", str(tmp_path / "k.cubin")], capture_output=True,
                          text=True, check=True).stdout.splitlines()
    mma = [i for i, line in enumerate(sass) if "HMMA" in line]
    assert len(mma) >= 32   # the sweep: q·k and p·v of a block, at least
    inside = [line for line in sass[mma[0]:mma[-1]] if "STL" in line or "LDL" in line]
    assert not inside, inside[:5]


def _ptxas_report(source: str, tmp_path) -> str:
    """ptxas's verbose report (-v) of compiling ``source`` for sm_90a."""
    import subprocess

    (tmp_path / "k.cu").write_text(source)
    return subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-Xptxas",
                           "-v", "-o", str(tmp_path / "k.cubin"), str(tmp_path / "k.cu")],
                          capture_output=True, text=True, check=True).stderr


def _assert_no_spills(report: str, kernel: str) -> None:
    """ptxas reports each kernel: "Compiling entry function '…'" … "N bytes spill stores": read
    the line of ``kernel`` itself (another kernel's clean line must not pass for it)."""
    own = report[report.index(f"'{kernel}'"):]
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", own)
    assert spills and spills.groups() == ("0", "0"), own[:400]


def test_activation_is_generated_from_the_dsl():
    """A user's own activation (not one the library names) appears in the kernel."""
    @tf.kernel
    def ffn_relu_sq(x: T.Tensor["M", "K", "bf16"], w1: T.Tensor["K", "N", "bf16"],
                    w2: T.Tensor["N", "O", "bf16"]):
        i, k, n, o = T.axes("i k n o")
        h = T.sum(x[i, k] * w1[k, n], over=k)
        r = T.where(h > 0.0, h, 0.0)
        return T.sum(r * r * w2[n, o], over=n)

    src = _ffn(ffn_relu_sq).source(**FFN)
    assert "((g0 > 0.0f) ? g0 : 0.0f)" in src

    @tf.kernel
    def ffn_relu(x: T.Tensor["M", "K", "bf16"], w1: T.Tensor["K", "N", "bf16"],
                 w2: T.Tensor["N", "O", "bf16"]):
        i, k, n, o = T.axes("i k n o")
        return T.sum(T.relu(T.sum(x[i, k] * w1[k, n], over=k)) * w2[n, o], over=n)

    assert "((g0 > 0.0f) ? g0 : 0.0f)" in _ffn(ffn_relu).source(**FFN)


def test_refusals_name_the_problem():
    with pytest.raises(ScheduleError, match="axis is 'n'"):
        tf.schedule(ffn_gelu, target="cuda:sm_90a").cluster_distribute("k")
    with pytest.raises(ScheduleError, match="Hopper"):
        tf.schedule(ffn_gelu, target="cuda:sm_80").cluster_distribute("n")
    with pytest.raises(ScheduleError, match="Hopper"):
        tf.schedule(ffn_gelu, target="llvm").cluster_distribute("n")
    with pytest.raises(ScheduleError, match="1 to 16 CTAs"):
        tf.schedule(ffn_gelu, target="cuda:sm_90a").cluster_distribute("n", cluster=17)
    with pytest.raises(ScheduleError, match="1, 2, 4, 8 or 16"):  # the FFN's tiles need 2^k:
        tf.schedule(ffn_gelu, target="cuda:sm_90a").cluster_distribute("n", cluster=3)  # at once
    @tf.kernel
    def ffn_linear_layout(x: T.Tensor["M", "K", "bf16"], w1: T.Tensor["N", "K", "bf16"],
                          w2: T.Tensor["O", "N", "bf16"]):   # as torch.nn.Linear stores them
        i, k, n, o = T.axes("i k n o")
        return T.sum(T.gelu(T.sum(x[i, k] * w1[n, k], over=k)) * w2[o, n], over=n)

    with pytest.raises(ScheduleError, match=r"\[in, out\].*weight\.t\(\)\.contiguous\(\)"):
        tf.schedule(ffn_linear_layout, target="cuda:sm_90a").cluster_distribute("n")
    with pytest.raises(ScheduleError, match="no knob"):
        tf.schedule(ffn_gelu, target="cuda:sm_90a").cluster_distribute("n", tile=3)
    with pytest.raises(ScheduleError, match="warps=12"):
        _ffn(ffn_gelu, warps=12).source(**FFN)
    with pytest.raises(ScheduleError, match="multiple of block_n×cluster"):
        _ffn(ffn_gelu, cluster=8).source(M=128, K=512, N=1000, O=256)
    with pytest.raises(ScheduleError, match="wgmma.*sm_90a"):
        tf.schedule(ffn_gelu, target="cuda:sm_90").cluster_distribute("n", mma="wgmma") \
            .compile().source(**FFN)
    with pytest.raises(ScheduleError, match="copy='tma'.*wgmma"):
        _ffn(ffn_gelu, mma="mma_sync", copy="tma").source(**FFN)
    with pytest.raises(ScheduleError, match="'wgmma' or 'mma_sync'"):
        _ffn(ffn_gelu, mma="hmma").source(**FFN)
    with pytest.raises(ScheduleError, match="exchange='peer' reads H.*mma='wgmma'"):
        _ffn(ffn_gelu, exchange="peer", mma="mma_sync").source(**FFN)
    with pytest.raises(ScheduleError, match="copy='producer'.*exchange='peer'"):
        _ffn(ffn_gelu, exchange="gather", copy="producer").source(**FFN)
    with pytest.raises(ScheduleError, match="copy='producer' lands swizzled tiles"):
        _ffn(ffn_gelu, mma="mma_sync", copy="producer").source(**FFN)
    # two CTAs per SM leave 128 registers per thread: 128 accumulators would not compile (ptxas
    # C7602), so the knobs are refused before nvcc runs
    with pytest.raises(ScheduleError, match="128 registers per thread; 128 f32 accumulators"):
        _ffn(ffn_gelu, ctas_per_sm=2, block_o=256, block_m=128, block_n=64).source(
            M=128, K=512, N=2048, O=2048)
    with pytest.raises(ScheduleError, match="three warpgroups per CTA"):
        _ffn(ffn_gelu, ctas_per_sm=2, copy="producer").source(**FFN)
    # 192 columns are 64-column multiples, but the cp.async copy plan repeats only for 8/16/32
    # chunks per row (it would copy the wrong chunks); 512 is wider than one wgmma
    with pytest.raises(ScheduleError, match="block_n and block_o of 64, 128 or 256"):
        _ffn(ffn_gelu, block_n=192, cluster=2).source(M=128, K=512, N=1536, O=256)
    with pytest.raises(ScheduleError, match="block_n and block_o of 64, 128 or 256"):
        _ffn(ffn_gelu, block_o=512).source(M=128, K=512, N=4096, O=4096)
    with pytest.raises(ScheduleError, match="even number of block_k tiles"):
        _ffn(ffn_gelu, exchange="peer", cluster=1, block_n=64).source(**FFN)
    with pytest.raises(ScheduleError, match="shared memory.*smaller cluster"):
        _ffn(ffn_gelu, cluster=16, block_m=128, exchange="gather").source(M=256, K=512, N=2048,
                                                                          O=2048)
    with pytest.raises(ScheduleError, match="shared memory"):
        _decode(gqa_attention, warps=16).source(**DECODE)
    with pytest.raises(ScheduleError, match="up to 128 query heads.*mma='fma'"):
        _decode(gqa_attention, mma="mma_sync").source(**{**DECODE, "H": 2 * 129})
    with pytest.raises(ScheduleError, match="17 heads takes 2 warps.*multiple of 2"):
        _decode(gqa_attention, warps=3).source(**{**DECODE, "H": 34})  # a group of 17
    with pytest.raises(ScheduleError, match="copy='tma'"):
        _decode(gqa_attention, warps=4, copy="cp.async").source(**{**DECODE, "H": 34})
    with pytest.raises(ScheduleError, match="stages=9"):
        _decode(gqa_attention, stages=9).source(**DECODE)
    with pytest.raises(ScheduleError, match="CUDA-core sweep"):
        _decode(gqa_attention, mma="fma", copy="tma").source(**DECODE)
    with pytest.raises(ScheduleError, match="copy='dma'"):
        _decode(gqa_attention, copy="dma").source(**DECODE)
    with pytest.raises(ScheduleError, match="no knob block_n.*stages"):
        _decode(gqa_attention, block_n=64)
    with pytest.raises(ScheduleError, match="M=1"):
        _decode(attention).source(B=1, H=2, M=64, N=256, D=128)
    # not a GEMM chain: a softmax is refused, not compiled wrongly
    from tensorfuse.kernels.rows import softmax

    with pytest.raises(ScheduleError, match="GEMM chain"):
        tf.schedule(softmax, target="cuda:sm_90a").cluster_distribute("j")


def test_gemm_chain_defaults_fit_the_shared_memory():
    """All-gather: the cluster's H takes block_m × cluster × block_n, so at cluster 8 the default
    row block halves, and the pipeline is the deepest that still fits; wgmma on sm_90a, with 64-row
    blocks only where each warpgroup still gets 64-column multiples. Peer reads (the default with
    wgmma): one slice per CTA, so clusters of 8 keep 128-row blocks; smaller clusters and output
    tiles where the sizes need them."""
    from tensorfuse.schedule_templates.gemm_chain_plan import plan_gemm_chain, shared_bytes

    sizes = dict(M=128, K=4096, N=14336, O=4096)
    for kernel in (ffn_gelu, ffn_swiglu):
        for mma in ("wgmma", "mma_sync"):
            for cluster, block_m in ((2, 128), (4, None), (8, 64)):  # 4: depends on the kernel
                if (kernel, mma, cluster) == (ffn_swiglu, "wgmma", 8):
                    # H (128 KB) and three stages of x, w1, w3 do not fit: refused, with the sizes
                    with pytest.raises(ScheduleError, match="255136 bytes"):
                        _ffn(kernel, cluster=cluster, mma=mma, exchange="gather").launches(
                            **sizes)
                    continue
                knobs = _ffn(kernel, cluster=cluster, mma=mma,
                             exchange="gather").launches(**sizes).knobs
                assert knobs.mma == mma and knobs.block_m == (block_m or knobs.block_m)
                assert shared_bytes(plan_gemm_chain(kernel.program), knobs) <= 227 * 1024
                assert knobs.stages >= (3 if mma == "wgmma" else 2)
        knobs = _ffn(kernel).launches(**sizes).knobs
        assert (knobs.mma, knobs.exchange, knobs.cluster, knobs.block_m, knobs.block_o) == \
            ("wgmma", "peer", 8, 128, 256)
        assert shared_bytes(plan_gemm_chain(kernel.program), knobs) <= 227 * 1024
        large = _ffn(kernel).launches(**{**sizes, "M": 8192}).knobs
        # one gate and many row blocks: 128 × 256 first-product tiles in clusters of 4
        assert (large.cluster, large.block_n) == ((4, 256) if kernel is ffn_gelu else (8, 128))
        assert shared_bytes(plan_gemm_chain(kernel.program), large) <= 227 * 1024
        # O=256 cannot give 8 CTAs 64-column tiles: the largest cluster that tiles it
        small = _ffn(kernel).launches(M=128, K=512, N=1024, O=256).knobs
        assert (small.cluster, small.block_o) == (4, 64)
        assert _ffn(kernel, copy="tma").launches(**sizes).knobs.exchange == "gather"
        assert _ffn(kernel, warps=16).launches(**sizes).knobs.mma == "mma_sync"
        # one row, 64-column tiles: 64-row blocks would leave a warpgroup 32 columns
        assert _ffn(kernel, block_n=64).launches(**{**sizes, "M": 1}).knobs.block_m == 128
        assert _ffn(kernel).launches(**{**sizes, "M": 1}).knobs.block_m == 64


def test_wgmma_copies_run_deep_for_one_row_block_and_two_ahead_for_many():
    """One row block streams the weights once from DRAM: every slot but the one being read is in
    flight (W2: at most 3). Many row blocks re-read them from L2: two k-tiles ahead
    (``gemm_chain_plan.wgmma_lookahead``, written into the kernel as AHEAD1 / AHEAD2)."""
    sizes = dict(K=4096, N=14336, O=4096)
    for M in (128, 8192):
        f = _ffn(ffn_swiglu)
        stages = f.launches(M=M, **sizes).knobs.stages
        source = f.source(M=M, **sizes)
        ahead = [int(re.search(rf"#define AHEAD{i} (\d+)", source).group(1)) for i in (1, 2)]
        assert ahead == ([stages - 1, 3] if M == 128 else [2, 2]), (M, stages, ahead)


def test_decode_cluster_is_the_largest_whose_clusters_all_fit_at_once():
    """One cluster per (batch, kv-head) pair, all resident at once: the largest power-of-two
    cluster (≤ 16, ≤ one CTA per SM) of which the GPU holds that many — with the H100's counts
    (a cluster fits one GPC: 7 of 16, 15 of 8, 30 of 4, 66 of 2), B=1 at 8 kv-heads gets 8, not
    16 (8 clusters of 16 would take two waves). Clusters the pairs leave unused split a pair's
    keys (MQA at B=1: 7 clusters of 16), still in one wave. Without a GPU the SM count decides;
    a given cluster is kept, and given splits."""
    from tensorfuse.schedule_templates.cluster import decode_knobs
    from tensorfuse.targets import get_target

    h100 = {16: 7, 8: 15, 4: 30, 2: 66, 1: 132}
    asked = []

    def resident(knobs):   # records what it is asked: the warps are chosen before the cluster
        asked.append((knobs.cluster, knobs.warps))
        return h100[knobs.cluster]

    target = get_target("cuda:sm_90a")
    chosen = {}
    for B in (1, 2, 4, 8, 16, 32):
        k = decode_knobs(B, 32, 8, 128, None, {}, target, resident)
        chosen[B] = (k.cluster, k.splits)
    assert chosen == {1: (8, 1), 2: (4, 1), 4: (2, 2), 8: (2, 1), 16: (1, 1), 32: (1, 1)}
    assert asked[:2] == [(16, 4), (8, 4)]  # B=1: 16 asked and refused, then 8; four warps
    assert {w for _, w in asked} == {4}
    mqa = {B: decode_knobs(B, 8, 1, 128, None, {}, target, resident) for B in (1, 2, 4)}
    assert {B: (k.cluster, k.splits) for B, k in mqa.items()} == {1: (16, 7), 2: (16, 3),
                                                                  4: (16, 1)}
    # a group of 64 heads: teams of warps compute on every byte, so the CTAs at once decide
    # (16 pairs: 64 CTAs in clusters of 4, 128 in clusters of 2 split four ways)
    asked.clear()
    k = decode_knobs(16, 64, 1, 128, None, {}, target, resident)
    assert (k.cluster, k.splits, k.warps, k.stages) == (2, 4, 8, 3)
    assert {w for _, w in asked} == {8}   # two teams of four warps, asked so
    k = decode_knobs(1, 32, 8, 128, None, {}, target)   # no GPU: by SM count
    assert (k.cluster, k.splits) == (16, 1)
    assert decode_knobs(8, 32, 8, 128, None, {}, target, sms=114).cluster == 1  # H100 PCIe
    k = decode_knobs(1, 32, 8, 128, 4, {}, target, resident)
    assert (k.cluster, k.splits) == (4, 3)
    assert decode_knobs(1, 32, 8, 128, 4, {"splits": 2}, target, resident).splits == 2


def test_a_launch_takes_the_splits_that_give_every_warp_keys():
    """A cache too short for every warp of every split to get two blocks of 32 keys takes fewer
    splits (at least one); a long one takes them all."""
    from tensorfuse.schedule_templates.decode_plan import DecodeKnobs, splits_for

    k = DecodeKnobs(cluster=4, warps=4, splits=3)   # 1024 keys: two blocks for every warp
    assert [splits_for(k, n) for n in (1, 1023, 1024, 2048, 3071, 3072, 10 ** 6)] == \
        [1, 1, 1, 2, 2, 3, 3]


def test_the_defaults_split_a_mid_length_cache_over_at_most_four_clusters():
    """One pair's cache over the seven clusters of 16 the H200 holds: 16k-65k keys in four
    clusters (each warp's share too short for more to pay), 131k keys in all seven; splits
    given (or tuned) are taken up to the two-block rule alone."""
    from tensorfuse.schedule_templates.decode_plan import DecodeKnobs, splits_for

    k = DecodeKnobs(cluster=16, warps=4, splits=7)
    assert [splits_for(k, n, chosen=True) for n in (4096, 16384, 32768, 65536, 131072)] == \
        [1, 4, 4, 4, 7]
    assert [splits_for(k, n) for n in (4096, 16384, 32768, 65536, 131072)] == [1, 4, 7, 7, 7]


def test_decode_asks_the_driver_when_a_gpu_is_present(monkeypatch):
    """The layout's wiring, with the driver stood in for: the query sees the kernel's threads and
    shared memory, the choice is explained by schedule_origin, and a failing query warns and
    falls back to the SM count instead of failing the call."""
    import tensorfuse.schedule_templates.cluster as template
    from tensorfuse.errors import TargetError

    h100, seen = {16: 7, 8: 15, 4: 30, 2: 66, 1: 132}, []

    def driver(cubin, name, cluster, threads, shared_bytes, device):
        seen.append((name, cluster, threads, shared_bytes, device))
        return h100[cluster]

    built = []
    monkeypatch.setattr(template, "local_gpu", lambda: (0, 132))
    monkeypatch.setattr(template, "cubin_for", lambda source, target: built.append(source) or b"")
    monkeypatch.setattr(template, "max_active_clusters", driver)
    dims = dict(B=1, H=32, HKV=8, M=1, N=32768, D=128)
    f = _decode(gqa_attention)
    knobs = f.launches(**dims).knobs
    assert (knobs.cluster, knobs.splits) == (8, 1)
    assert [c for _, c, _, _, _ in seen] == [16, 8]
    assert len(built) == 1 and "#define CLUSTER 1\n" in built[0]  # one probe for every size
    assert all(name == "tf_decode_cluster" and threads == 128 and smem > 100_000 and dev == 0
               for name, _, threads, smem, dev in seen)
    assert f.schedule_origin(**dims).endswith(
        "8 clusters (batch × kv-heads); the GPU holds 7 of 16, 15 of 8 at once")
    assert f.schedule_origin(**{**dims, "B": 1, "HKV": 1, "H": 8}).endswith(
        "1 clusters (batch × kv-heads), each pair's keys split over up to 7; the GPU holds "
        "7 of 16 at once")

    def broken(*args):
        raise TargetError("cuModuleLoadData failed (CUresult 209)")

    monkeypatch.setattr(template, "max_active_clusters", broken)
    with pytest.warns(UserWarning, match="by the SM count instead"):
        assert _decode(gqa_attention).launches(**dims).knobs.cluster == 16


def test_no_gpu_gives_a_clear_error():
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("a GPU is present")
    f = _ffn(ffn_gelu)
    x = np.ones((128, 512), np.float32)
    with pytest.raises(Exception, match="GPU"):
        f(x, np.ones((512, 1024), np.float32), np.ones((1024, 256), np.float32))


def test_attention_without_its_rolling_update_is_told_how_to_roll_it():
    """cluster_distribute on attention before rolling it first reads as a GEMM chain; the refusal
    names the call that makes it a cluster decode, with the chain and the keys' axis."""
    sch = tf.schedule(tf.kernels.gqa_attention, target="cuda")
    with pytest.raises(ScheduleError, match=r"m is a max reduction.*rolling_update\('m', 'o', "
                                            r"'l', axis='j'\)"):
        sch.cluster_distribute("j")
    sch.rolling_update("m", "o", "l", axis="j")   # what it says works
    sch.cluster_distribute("j")


def test_decode_refuses_chains_its_merge_would_get_wrong():
    """The cluster merge corrects by exp(m_part - m): a chain whose weights are not exp(s - m), or
    whose kv-heads are not grouped the way the kernel groups them, must be refused — before this
    check both compiled and would have been silently wrong."""
    @tf.kernel
    def sharper(q: Q, k: KV, v: KV, scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        s = T.sum(q[b, h, i, d] * k[b, h // (T.size("H") // T.size("HKV")), j, d], over=d) * scale
        m = T.max(s, over=j)
        p = T.exp(2.0 * (s - m))   # a valid rolling update, with a different correction
        o = T.sum(p * v[b, h // (T.size("H") // T.size("HKV")), j, e], over=j)
        l = T.sum(p, over=j)  # noqa: E741
        return o / l

    with pytest.raises(ScheduleError, match="exp\\(s - m\\)"):
        _decode(sharper)

    @tf.kernel
    def interleaved(q: Q, k: KV, v: KV, scale: T.f32):
        b, h, i, j, d, e = T.axes("b h i j d e")
        hk = h % T.size("HKV")     # kv-head h mod HKV, not h // group
        s = T.sum(q[b, h, i, d] * k[b, hk, j, d], over=d) * scale
        m = T.max(s, over=j)
        p = T.exp(s - m)
        o = T.sum(p * v[b, hk, j, e], over=j)
        l = T.sum(p, over=j)  # noqa: E741
        return o / l

    f = _decode(interleaved)
    with pytest.raises(ScheduleError, match="kv-head"):
        f.source(**DECODE)
    f = _decode(gqa_attention)   # the library's grouping is accepted
    assert "tf_decode_cluster" in f.source(**DECODE)


def test_gemm_chain_refuses_an_output_it_does_not_write():
    @tf.kernel
    def ffn_f32(x: T.Tensor["M", "K", "bf16"], w1: T.Tensor["K", "N", "bf16"],
                w2: T.Tensor["N", "O", "bf16"]):
        i, k, n, o = T.axes("i k n o")
        h = T.gelu(T.sum(x[i, k] * w1[k, n], over=k))
        return T.cast(T.sum(h * w2[n, o], over=n), "f32")

    with pytest.raises(ScheduleError, match="writes bf16"):
        _ffn(ffn_f32)


# -- on the H100 ---------------------------------------------------------------------------------
def _bf16(torch, *shape, scale=1.0, gen=None):
    return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [ffn_gelu, ffn_swiglu])
@pytest.mark.parametrize("M, knobs", [
    # wgmma (the default on sm_90a); M=1 and 64-row blocks split the columns over warpgroups
    (1, {}), (200, {}), (1, {"cluster": 2, "block_n": 128, "block_o": 128}),
    (200, {"cluster": 2, "block_m": 64, "block_n": 128, "block_o": 128}),
    (200, {"stages": 3}),
    (600, {"group_m": 2}),  # 5 row blocks, rasterized in groups of 2: the last group is ragged
    # wgmma fed by TMA (rows past M arrive as zeros)
    (1, {"copy": "tma"}), (200, {"copy": "tma"}), (600, {"copy": "tma", "group_m": 2}),
    (200, {"copy": "tma", "cluster": 2, "block_m": 64, "block_n": 128, "block_o": 128}),
    # mma.sync
    (1, {"mma": "mma_sync"}), (200, {"mma": "mma_sync"}), (200, {"warps": 16}),
    (200, {"mma": "mma_sync", "cluster": 2, "block_o": 64}),
    (200, {"mma": "mma_sync", "cluster": 4, "block_m": 64}),
    (600, {"mma": "mma_sync", "group_m": 2}), (600, {"mma": "mma_sync", "group_m": 1})])
def test_ffn_matches_float64_on_the_gpu(kernel, M, knobs):
    _check_ffn_on_the_gpu(kernel, M, knobs)


@pytest.mark.gpu
@pytest.mark.parametrize("copy", ["cp_async", "producer", "tma"])
@pytest.mark.parametrize("kernel", [ffn_gelu, ffn_swiglu])
@pytest.mark.parametrize("M, knobs, sizes", [
    (1, {}, {}), (200, {}, {}), (600, {"group_m": 2}, {}),
    (1, {"cluster": 8, "block_n": 128}, dict(O=1024)),
    (200, {"cluster": 2, "block_m": 64, "block_n": 128, "block_o": 128}, dict(O=512)),
    (300, {"cluster": 8, "block_n": 128, "block_o": 256}, dict(K=1024, N=4096, O=2048)),
    (300, {"cluster": 4, "block_n": 128, "block_o": 128, "stages": 4},
     dict(K=1024, N=4096, O=2048)),
    (100, {}, dict(K=2048, N=1024, O=2048)),   # one row block; both rings wrap many times
    (300, {}, dict(K=2048, N=1024, O=2048))])
def test_ffn_peer_exchange_matches_float64_on_the_gpu(kernel, M, knobs, sizes, copy):
    """exchange='peer': each CTA keeps its slice of H and the second product reads it from the
    peers' shared memory — as A fragments into registers (cp.async, or TMA copies issued by one
    consumer thread), or, with copy='producer', as whole k-tiles copied into the local ring by a
    producer warpgroup that issues every copy and meets the consumers only on mbarriers."""
    _check_ffn_on_the_gpu(kernel, M, {"exchange": "peer", "copy": copy, **knobs}, **sizes)


@pytest.mark.gpu
@pytest.mark.parametrize("copy", ["cp_async", "producer"])
@pytest.mark.parametrize("M", [1, 300])
def test_ffn_wide_first_product_tiles_match_float64_on_the_gpu(M, copy):
    """128 × 256 first-product tiles (the GELU default at large M): 256-column wgmma, a 64 KB
    slice of H per CTA read by 16 k-tiles of peer loads."""
    _check_ffn_on_the_gpu(ffn_gelu, M, {"exchange": "peer", "cluster": 4, "block_n": 256,
                                        "block_o": 256, "copy": copy}, K=1024, N=4096, O=2048)


@pytest.mark.gpu
@pytest.mark.parametrize("copy, M", [("cp_async", 300), ("tma", 300), ("cp_async", 100)])
def test_ffn_pipelines_wrap_many_times_on_the_gpu(copy, M):
    """Long k loops and many output tiles: every pipeline slot is reused many times in both
    phases (a slot released twice, or never, shows up only here — as a hang or wrong sums).
    M=100 is one row block, where the cp.async rings copy as far ahead as they have slots; M=300
    has three, where they copy two k-tiles ahead."""
    _check_ffn_on_the_gpu(ffn_swiglu, M, {"copy": copy}, K=2048, N=1024, O=2048)


@pytest.mark.gpu
@pytest.mark.parametrize("copy", ["cp_async", "tma"])
def test_ffn_takes_views_that_start_mid_line_on_the_gpu(copy):
    """x and out as views two bytes into their storage: the 16-byte copies and stores need
    16-byte-aligned rows, so such inputs are copied and such outputs written through a copy."""
    import torch

    M, K, N, O = 100, 512, 2048, 256
    g = torch.Generator(device="cuda").manual_seed(7)
    x = _bf16(torch, M * K + 1, gen=g)[1:].view(M, K)
    w1 = _bf16(torch, K, N, scale=K ** -0.5, gen=g)
    w2 = _bf16(torch, N, O, scale=N ** -0.5, gen=g)
    out = torch.full((M * O + 1,), float("nan"), device="cuda", dtype=torch.bfloat16)[1:]
    out = out.view(M, O)
    assert x.data_ptr() % 16 and out.data_ptr() % 16
    _ffn(ffn_gelu, cluster=4, block_n=64, copy=copy)(x, w1, w2, out=out)
    ref = _ffn_reference(ffn_gelu, (x, w1, w2))
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err


def _ffn_reference(kernel, args):
    """The FFN in float64: tanh GELU (as the DSL's T.gelu) or SwiGLU."""
    import torch

    d = [a.double() for a in args]
    if kernel is ffn_gelu:
        h = d[0] @ d[1]
        return (0.5 * h * (1 + torch.tanh(0.7978845608028654 * (h + 0.044715 * h ** 3)))) @ d[2]
    return (torch.nn.functional.silu(d[0] @ d[1]) * (d[0] @ d[2])) @ d[3]


def _check_ffn_on_the_gpu(kernel, M, knobs, K=512, N=2048, O=256):
    import torch

    g = torch.Generator(device="cuda").manual_seed(M)
    ws = [_bf16(torch, K, N, scale=K ** -0.5, gen=g)
          for _ in range(1 if kernel is ffn_gelu else 2)]
    args = (_bf16(torch, M, K, gen=g), *ws, _bf16(torch, N, O, scale=N ** -0.5, gen=g))
    ref = _ffn_reference(kernel, args)
    out = torch.full((M, O), float("nan"), device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()   # launches follow torch's current stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _ffn(kernel, **{"cluster": 4, "block_n": 64, **knobs})(*args, out=out)
    torch.cuda.current_stream().wait_stream(side)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err  # bf16 tolerance (the intermediate is rounded to bf16, as in torch)


GPU_DECODES = [   # (D, group, knobs) on B=2, HKV=2 and 2777 keys, cluster 4 unless given
    (128, 4, {"cluster": 2}), (128, 4, {"cluster": 8}), (128, 1, {}), (128, 5, {}),
    (128, 16, {"warps": 4, "stages": 2}), (64, 4, {"stages": 4}), (256, 4, {"warps": 1}),
    (128, 4, {"mma": "fma", "stages": 3}), (64, 20, {"cluster": 2}),
    (128, 4, {"cluster": 16, "warps": 1}), (128, 4, {"cluster": 3}), (64, 2, {"cluster": 5}),
    (128, 4, {"copy": "cp.async"}), (256, 4, {"warps": 1, "copy": "cp.async"}),
    (128, 4, {"cluster": 2, "splits": 3}), (128, 8, {"cluster": 2, "splits": 5}),
    (64, 20, {"cluster": 1, "splits": 7, "mma": "fma"}), (256, 1, {"warps": 1, "splits": 9}),
    (128, 64, {}), (128, 64, {"warps": 4, "stages": 3}), (128, 128, {"cluster": 2}),
    (256, 32, {"warps": 2}), (64, 40, {"cluster": 1, "warps": 6, "splits": 3})]
GPU_DECODE_KEYS = 2777


def test_the_gpu_decodes_that_ask_for_splits_take_them():
    """Each GPU case that gives ``splits`` launches exactly that many clusters per pair at its
    key count (a launch takes fewer on a short cache: the case would test one cluster)."""
    from tensorfuse.schedule_templates.decode_plan import splits_for

    for D, group, knobs in GPU_DECODES:
        if "splits" in knobs:
            made = _decode(gqa_attention, **{"cluster": 4, **knobs})
            k = made.launches(B=2, H=2 * group, HKV=2, M=1, N=GPU_DECODE_KEYS, D=D).knobs
            assert splits_for(k, GPU_DECODE_KEYS) == knobs["splits"], (D, group, knobs)


@pytest.mark.gpu
@pytest.mark.parametrize("D, group, knobs", GPU_DECODES)
def test_cluster_decode_matches_float64_on_the_gpu(D, group, knobs):
    """Both sweeps (tensor cores with the group's heads as MMA rows, padded past G — past 16
    heads in teams of warps sharing each block; CUDA cores) across clusters, group sizes, head
    dims, warps and pipeline depths, on a key count that leaves every warp a ragged last
    block."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(D + group)
    B, HKV, N = 2, 2, GPU_DECODE_KEYS
    H = HKV * group
    q, k, v = _bf16(torch, B, H, 1, D, gen=g), _bf16(torch, B, HKV, N, D, gen=g), \
        _bf16(torch, B, HKV, N, D, gen=g)
    scale = 1 / math.sqrt(D)
    kk = k.double().repeat_interleave(group, 1)
    vv = v.double().repeat_interleave(group, 1)
    ref = torch.softmax(q.double() @ kk.transpose(-1, -2) * scale, -1) @ vv
    out = torch.full_like(q, float("nan"))
    _decode(gqa_attention, **{"cluster": 4, **knobs})(q, k, v, scale=scale, out=out)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err  # bf16 output (and bf16 weights p on the tensor-core path)


@pytest.mark.gpu
@pytest.mark.parametrize("D, knobs", [(128, {}), (64, {"copy": "cp.async"}),
                                      (256, {"warps": 1}), (128, {"mma": "fma"})])
def test_fp16_cluster_decode_matches_float64_on_the_gpu(D, knobs):
    """fp16 through both sweeps and both copies, on values up to ±60 (scores far from 0: the
    exponentials are taken in f32, p rounded to fp16 for p·v)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(D)
    B, HKV, N, group = 3, 2, 2777, 4
    H = HKV * group
    q, k, v = (torch.randn(*shape, device="cuda", generator=g) * scale for shape, scale in
               (((B, H, 1, D), 2.0), ((B, HKV, N, D), 3.0), ((B, HKV, N, D), 20.0)))
    q, k, v = (x.to(torch.float16) for x in (q, k, v))
    scale = 1 / math.sqrt(D)
    kk = k.double().repeat_interleave(group, 1)
    vv = v.double().repeat_interleave(group, 1)
    ref = torch.softmax(q.double() @ kk.transpose(-1, -2) * scale, -1) @ vv
    out = torch.full_like(q, float("nan"))
    made = _decode(gqa_attention_f16, **{"cluster": 4, **knobs})
    made(q, k, v, scale=scale, out=out)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 5e-3, err  # fp16 output and p (10-bit mantissa)
    assert "cluster_decode" in tf.compile(gqa_attention_f16, "cuda").schedule_origin(
        B=B, H=H, HKV=HKV, M=1, N=N, D=D)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 2, 4])
def test_cluster_decode_defaults_run_in_one_wave_on_the_gpu(B):
    """The default cluster size and splits ask the driver: every cluster of every (batch,
    kv-head) pair is resident at once, the next larger cluster would not be, and the default
    kernel is correct."""
    import torch

    from tensorfuse.targets.cuda.cluster_decode import decode_shared_bytes
    from tensorfuse.targets.cuda.module import cubin_for, max_active_clusters

    g = torch.Generator(device="cuda").manual_seed(B)
    H, HKV, N, D = 32, 8, 4096, 128
    q, k, v = _bf16(torch, B, H, 1, D, gen=g), _bf16(torch, B, HKV, N, D, gen=g), \
        _bf16(torch, B, HKV, N, D, gen=g)
    f = _decode(gqa_attention)
    launches = f.launches(B=B, H=H, HKV=HKV, M=1, N=N, D=D)
    knobs, sms = launches.knobs, torch.cuda.get_device_properties(0).multi_processor_count

    def resident(cluster):
        source = _decode(gqa_attention, cluster=cluster, warps=knobs.warps).source(
            B=B, H=H, HKV=HKV, M=1, N=N, D=D)
        return max_active_clusters(cubin_for(source, f.target), "tf_decode_cluster", cluster,
                                   32 * knobs.warps, decode_shared_bytes(knobs, D, H // HKV))

    assert 1 <= resident(knobs.cluster) <= sms // knobs.cluster
    assert resident(knobs.cluster) >= B * HKV * knobs.splits   # every split's cluster at once
    if knobs.cluster < 16 and 2 * knobs.cluster * B * HKV <= sms:
        assert resident(2 * knobs.cluster) < B * HKV
    scale = 1 / math.sqrt(D)
    ref = torch.softmax(q.double() @ k.double().repeat_interleave(H // HKV, 1).transpose(-1, -2)
                        * scale, -1) @ v.double().repeat_interleave(H // HKV, 1)
    out = torch.full_like(q, float("nan"))
    f(q, k, v, scale=scale, out=out)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err


@pytest.mark.gpu
def test_compiled_decode_serves_a_growing_cache_with_one_kernel_on_the_gpu():
    """``tf.compile``'s decode (the cluster kernel on sm_90a, under 32 (batch, kv-head) pairs:
    ``decode_plan.cluster_decode_pays``) at a key count that grows by one per step, as a KV
    cache does, and then jumps, with a large score range: each step against
    float64, with its output poisoned first; every step runs the one kernel built for the
    first (the key count is an argument), and the sliding window's mask, which reads the key
    count, moves with it."""
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the cluster decode kernel is tf.compile's decode on sm_90 only")
    from tensorfuse.targets.cuda.kernel import ClusterKernel

    g = torch.Generator(device="cuda").manual_seed(36)
    B, H, HKV, D, window = 2, 12, 4, 128, 70   # 8 and 24 pairs (the window's heads each own)
    cache_k, cache_v = _bf16(torch, B, HKV, 5000, D, gen=g), _bf16(torch, B, HKV, 5000, D, gen=g)
    q = _bf16(torch, B, H, 1, D, scale=30.0, gen=g)   # scores of std ~30: exp's range tested
    scale = 1 / math.sqrt(D)
    f = tf.compile(gqa_attention, target="cuda")
    window_f = tf.compile(sliding_window_attention, target="cuda")
    built = set()
    for N in (1, 2, 3, 31, 32, 33, 97, 4097, 5000):
        k, v = cache_k[:, :, :N].contiguous(), cache_v[:, :, :N].contiguous()
        kk = k.double().repeat_interleave(H // HKV, 1)
        vv = v.double().repeat_interleave(H // HKV, 1)
        s = q.double() @ kk.transpose(-1, -2) * scale
        for fn, scores, scalars in ((f, s, {}), (window_f, torch.where(
                N - 1 - torch.arange(N, device="cuda") < window, s, -torch.inf),
                {"window": window})):
            kernel = fn.for_sizes(B=B, H=H, HKV=HKV, M=1, N=N, D=D) if fn is f else \
                fn.for_sizes(B=B, H=H, M=1, N=N, D=D)
            assert isinstance(kernel, ClusterKernel), kernel
            ref = torch.softmax(scores, -1) @ vv
            out = torch.full_like(q, float("nan"))
            if fn is f:
                fn(q, k, v, scale=scale, out=out)
                built.add(id(kernel.launches(B=B, H=H, HKV=HKV, M=1, N=N, D=D)))
            else:
                fn(q, kk.to(torch.bfloat16), vv.to(torch.bfloat16), scale=scale, out=out,
                   **scalars)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (N, fn, err)
    assert len(built) == 1


@pytest.mark.gpu
def test_cluster_decode_with_a_mask_and_fully_masked_parts_on_the_gpu():
    """Sliding window: whole CTAs of the cluster see only masked keys (their state stays at
    −inf and must drop out of the merge), and with six clusters per pair whole clusters do (out
    of the merge through the workspace); softcap: tanh in the score."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(7)
    B, H, N, D, window, cap = 2, 4, 3001, 128, 700, 20.0
    q, k, v = _bf16(torch, B, H, 1, D, gen=g), _bf16(torch, B, H, N, D, gen=g), \
        _bf16(torch, B, H, N, D, gen=g)
    scale = 1 / math.sqrt(D)
    s = q.double() @ k.double().transpose(-1, -2) * scale
    j = torch.arange(N, device="cuda")
    sliding = torch.where((N - 1 - j < window), s, -torch.inf)
    capped = cap * torch.tanh(s / cap)
    for kernel, scores, scalars in ((sliding_window_attention, sliding, {"window": window}),
                                    (softcap_attention, capped, {"cap": cap})):
        ref = torch.softmax(scores, -1) @ v.double()
        for knobs in ({"cluster": 8}, {"cluster": 2, "splits": 6}):
            out = torch.full_like(q, float("nan"))
            _decode(kernel, **knobs)(q, k, v, scale=scale, out=out, **scalars)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (kernel.name, knobs, err)
