"""How the cluster decode's warps stage their blocks of 32 key and value rows in shared memory
(the copy knob): 16-byte ``cp.async`` copies by every lane into skewed rows, or bulk tensor copies
(TMA) into the 128-byte swizzle — the CUDA C++ parts :func:`.cluster_decode.decode_source`
assembles."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

SWIZZLE_ATOM = 32 * 128   # bytes of one 128-byte-swizzled box: 32 rows of 64 bf16 columns


def zero_tail(D: int, team: bool = False) -> str:
    """Zero the value rows past ``j_end`` in a block that straddles it (TMA copies read the key
    tensor past the mask's upper bound, where a static cache may hold anything: a NaN there
    would survive its weight 0 in p·v). Only a warp's last block straddles, and no copy into its
    buffers follows, so the generic stores cannot race a later bulk copy. A ``team`` of warps
    sharing the block zeroes it together, then waits for the whole team before reading it."""
    first, step, done = ("lane + tile * 32", "TILES * 32", "tf_team_sync(sweeper)") if team \
        else ("lane", "32", "__syncwarp()")
    return f"""    if (j0 + 32 > j_end) {{   // the warp's last block (warp-uniform)
      char* vrows = reinterpret_cast<char*>(vbuf + (it % STAGES) * 32 * VST);
      for (int c = (j_end - j0) * 8 + {first}; c < 32 * 8 * (D / 64); c += {step}) {{
        // 16-byte piece c % 8 of row (c / 8) % 32 in box c / 256: a whole row, swizzled or not
        const int r = (c / 8) % 32, a = c / 256;
        if (r >= j_end - j0)
          *reinterpret_cast<uint4*>(vrows + a * {SWIZZLE_ATOM} + r * 128 + (c % 8) * 16) =
              make_uint4(0u, 0u, 0u, 0u);
      }}
      {done};
    }}
"""


# Warps of a team (``TILES`` of them, each with 16 of the group's heads) share their blocks: a
# named barrier per team (ids from 1; 0 is __syncthreads')
TEAM_SYNC = """__device__ __forceinline__ void tf_team_sync(int team) {
  asm volatile("bar.sync %0, %1;" :: "r"(team + 1), "r"(TILES * 32) : "memory");
}
"""


@dataclass(frozen=True)
class Copy:
    """How a warp stages its blocks of 32 key and value rows in shared memory: the row layout
    (``macros``: ``KST``/``VST``, row strides in elements; ``address``: ``k_at``/``v_at``, the
    element at a block's row and column), where the buffers start (``base``), ``load`` (the
    ``load_keys(buf, first)`` lambda), what follows each block's copies (``commit``) and how
    the warp waits for a block before computing on it (``wait``)."""

    macros: str
    address: str
    base: str
    load: str
    commit: str
    wait: str


def cp_async_copy(D: int, tensor_cores: bool, row: str = "D") -> Copy:
    """Every lane copies 16-byte pieces (``cp.async``, :func:`_copy_code`) into rows skewed by
    16 bytes (conflict-free for ``ldmatrix`` and the CUDA-core sweep's row reads; the CUDA-core
    sweep reads value rows whole, unskewed); ``row``: C++ of the distance between a pair's
    keys in the cache, in elements."""
    return Copy(
        macros="#define KST (D + 8)   // key rows in shared memory: 16-byte skew, conflict-free "
               "reads\n" + ("#define VST (D + 8)   // value rows (skewed for ldmatrix)\n"
                            if tensor_cores else "#define VST D   // value rows\n"),
        address="""__device__ __forceinline__ const __nv_bfloat16* k_at(const __nv_bfloat16* blk, int r,
                                                        int d) {
  return blk + r * KST + d;
}
#define v_at k_at
""",
        base="  extern __shared__ __align__(16) char dsmem[];\n",
        load=_copy_code(D, row), commit="    tf_cp_async_commit();\n",
        wait="    tf_cp_async_wait<STAGES - 1>();   // this block's group is complete\n"
             "    __syncwarp();\n")


def tma_copy(team: bool = False, paired: bool = True) -> Copy:
    """Lane 0 of each warp copies a block with bulk tensor copies (TMA): ``D / 64`` boxes of 32
    rows × 64 columns each of keys and values, in the 128-byte swizzle (16-byte piece ``c`` of
    row ``r`` at piece ``c ^ (r % 8)``: ``ldmatrix`` reads stay conflict-free without the skew),
    counted on the warp's mbarrier for that stage. The copy engine moves a block with four
    instructions where ``cp.async`` took two a 16-byte piece, and streamed the decode's keys at
    3.0 TB/s from 64 CTAs where ``cp.async`` reached 2.3-2.7 (H100,
    ``tools/probe_decode_stream.py``). Rows past the keys arrive as zeros (their scores are
    masked). In a ``team``, the first warp (``tile`` 0) copies the team's blocks and every warp
    of it waits on the same barriers. ``paired``: the maps are 3-D with (batch, kv-head) pairs
    as one axis, else 4-D (:func:`.cluster_decode.decode_tensor_maps`)."""
    at = "pair" if paired else "hk, b"
    rank = 3 if paired else 4
    leader, sw, ready = ("lane == 0 && tile == 0", "sweeper", "__syncthreads()") if team else \
        ("lane == 0", "warp", "__syncwarp()")
    return Copy(
        macros="#define KST D   // rows unpadded: the 128-byte swizzle keeps ldmatrix "
               "conflict-free\n#define VST D\n",
        address=f"""// element (r, d) of a block stored as D / 64 swizzled boxes of 32 rows × 64 columns (d % 8 == 0)
__device__ __forceinline__ const __nv_bfloat16* k_at(const __nv_bfloat16* blk, int r, int d) {{
  return reinterpret_cast<const __nv_bfloat16*>(
      reinterpret_cast<const char*>(blk) + (d / 64) * {SWIZZLE_ATOM} + r * 128 +
      ((((d % 64) / 8) ^ (r % 8)) << 4));
}}
#define v_at k_at
""",
        base="""  extern __shared__ __align__(1024) char dsmem_raw[];
  char* dsmem = reinterpret_cast<char*>((reinterpret_cast<unsigned long>(dsmem_raw) + 1023) &
                                        ~1023ul);   // the swizzle's boxes start at 1 KB
""",
        load=f"""  unsigned long long* ready = kv_bars + {sw} * STAGES;   // a stage's block has landed
  if ({leader}) {{
    for (int s = 0; s < STAGES; ++s) tf_mbar_init(ready + s, 1);
    tf_mbar_init_fence();
  }}
  {ready};
  auto load_keys = [&](int buf, int first) {{
    if ({leader}) {{
      tf_mbar_expect(ready + buf, 2 * 32 * D * 2);
      #pragma unroll
      for (int a = 0; a < D / 64; ++a) {{
        tf_tma_load_{rank}d(reinterpret_cast<char*>(kbuf + buf * 32 * KST) + a * {SWIZZLE_ATOM},
                       &k_map, a * 64, first, {at}, ready + buf);
        tf_tma_load_{rank}d(reinterpret_cast<char*>(vbuf + buf * 32 * VST) + a * {SWIZZLE_ATOM},
                       &v_map, a * 64, first, {at}, ready + buf);
      }}
    }}
  }};
""",
        commit="",
        wait="    tf_mbar_wait(ready + it % STAGES, (it / STAGES) & 1);   // this block has landed\n")


def _copy_code(D: int, row: str = "D") -> str:
    """``load_keys(buf, first)``: the warp copies a block of 32 key and value rows, coalesced,
    into its buffers ``buf`` (cp.async), rows past the end (a ragged last block) clamped. Up to
    D = 128 a whole block is copied at fixed offsets from one address — lane l takes the 16-byte
    piece l % P of rows l / P, l / P + 32 / P, … (P = D / 8 pieces a row), two instructions a
    piece: a warp of this kernel issues an instruction only every ~4 cycles, and the copies'
    index arithmetic had cost about as much as the block's MMAs (Nsight Compute,
    ``tools/ncu_decode.py``).
    A ragged block, and every block at D = 256 (where the sweep keeps 255 registers and those
    addresses spilled), takes the loop over the pieces with the index arithmetic. ``row``: C++
    of the distance between keys in the cache (the head dim where a pair's keys are
    contiguous)."""
    pieces = f"""    for (int c = lane; c < 32 * D / 8; c += 32) {{
      const int r = c / (D / 8), col = (c % (D / 8)) * 8;
      const long row = min(first + r, j_end - 1);
      tf_cp_async16_l2(kbuf + (buf * 32 + r) * KST + col, kb + row * {row} + col);
      tf_cp_async16_l2(vbuf + (buf * 32 + r) * VST + col, vb + row * {row} + col);
    }}
"""
    if D > 128:
        return "  auto load_keys = [&](int buf, int first) {\n" + pieces + "  };\n"
    return """  auto load_keys = [&](int buf, int first) {
    if (first + 32 > j_end) {   // a ragged last block (warp-uniform)
""" + textwrap.indent(pieces, "  ") + """      return;
    }
    constexpr int P = D / 8, STEP = 32 / P;
    const int r0 = lane / P, col = (lane % P) * 8;
    const unsigned kd = tf_smem_addr(kbuf + (buf * 32 + r0) * KST + col),
                   vd = tf_smem_addr(vbuf + (buf * 32 + r0) * VST + col);
    const __nv_bfloat16* ks = kb + (long)(first + r0) * """ + row + """ + col;
    const __nv_bfloat16* vs = vb + (long)(first + r0) * """ + row + """ + col;
    #pragma unroll
    for (int i = 0; i < P; ++i) {
      tf_cp_async16_l2_at(kd + i * STEP * KST * 2, ks + i * STEP * """ + row + """);
      tf_cp_async16_l2_at(vd + i * STEP * VST * 2, vs + i * STEP * """ + row + """);
    }
  };
"""
