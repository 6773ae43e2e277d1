"""A tensor the attention score reads by query and key — a relative-position bias ``[H, S, S]``
(T5, Swin), a float mask ``[B, S, S]`` or ``[B, 1, S, S]`` (what transformers passes SDPA) —
as *tiles of the scores' shape*: the Hopper attention kernel's producer copies each key block's
tile of it into shared memory by TMA with the block's values, and the consumers read their
fragments' elements from there beside the score (:mod:`..targets.cuda.parts.loads`,
``row_state``). Read one element at a time from global memory instead, the consumers wait on
every load: on the H200 at B2 H16 D128, S 2048/4096, 0.346/1.333 ms that way against the Triton
template's pipelined tiles' 0.222/0.828 (``benchmarks.unlisted_kernels``, biased_attention_bshd).

Recognised from the roles of the tensor's indices, not their positions: each index is the
batch, head, query or key axis of the chain, or a constant; the key axis must be the tensor's
innermost (TMA copies rows of contiguous elements) and the query axis must be among the others.

A tensor the score reads by key and not by query — a key's norm (cosine similarity), a bias per
key — is copied the same way as *key strips* (:func:`find_key_strip`): one box of the block's
keys per block, in the same ring, read a pair of columns at a time.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..algebra.exprs import nodes
from ..dsl.expr import Axis, Const, Expr, Load
from ..errors import ScheduleError
from ..targets.cuda.tma import ELEMENT_BYTES

TILE_DTYPES = ("bf16", "f16")   # two bytes an element: a 128 × 128 tile is 32 KiB a slot


@dataclass(frozen=True)
class ScoreTile:
    """The tensor (``name``, ``dtype``, its ``dims`` outermost first) and, per dimension, the
    role of its index: ``"b"``, ``"h"``, ``"i"`` (queries), ``"j"`` (keys) or a constant."""

    name: str
    dtype: str
    dims: tuple
    roles: tuple

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def strip(self) -> bool:
        """Read by key and not by query (:func:`find_key_strip`): a block's strip of keys."""
        return "i" not in self.roles

    def describe(self) -> str:
        indexed = ", ".join(str(r) for r in self.roles)
        if self.strip:
            return (f"{self.name}[{indexed}] read as each key block's strip (copied by TMA "
                    "beside the block's keys)")
        return (f"{self.name}[{indexed}] read as tiles of the scores (copied by TMA with each "
                "key block's values)")

    def extents(self, sizes: dict) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else sizes[d] for d in self.dims)

    def why_not(self, sizes: dict) -> str | None:
        """Why a tensor map cannot be made of the tensor at ``sizes`` (its rows are not a
        multiple of 16 bytes), or None."""
        keys = self.extents(sizes)[-1]
        if self.rank > 1 and keys * ELEMENT_BYTES[self.dtype] % 16:
            return (f"{self.name}'s rows of {keys} elements are not a multiple of 16 bytes, "
                    "which a TMA copy needs")
        return None

    def map_shape(self, sizes: dict, block_m: int,
                  block_n: int = 64) -> tuple[tuple, tuple, None]:
        """(sizes, box, strides) of its tensor map: the tensor as declared (row-major), boxes of
        ``block_m`` query rows × 64 keys (one 128-byte swizzle row); a strip's, the block's
        ``block_n`` keys."""
        keys = block_n if self.strip else 64
        box = tuple(block_m if r == "i" else keys if r == "j" else 1 for r in self.roles)
        return self.extents(sizes), box, None

    def coordinates(self, key0: str, row0: str, b: str, h: str) -> str:
        """C++ of a box's coordinates, innermost first: keys from ``key0``, query rows from
        ``row0``, the tile's batch ``b`` and head ``h``, constants as they are."""
        at = {"j": key0, "i": row0, "b": b, "h": h}
        return ", ".join(at.get(r, str(r)) for r in reversed(self.roles))


def find_score_tile(used: list[Expr], chain) -> ScoreTile | None:
    """The floating tensor the score reads by query and key (None where it reads none); a
    refusal, with the reason, where its tiles cannot be copied so (its indices, dtype or layout),
    or where two such tensors (or one at two sets of indices) would need two tiles a block."""
    roles = {a.uid: r for a, r in zip(chain.axes, "bhij") if a is not None}
    both = {chain.axes[2].uid, chain.axes[3].uid}
    found: dict = {}
    for e in used:
        for n in (n for n in nodes(e) if isinstance(n, Load)):
            plain = {i.uid for i in n.indices if isinstance(i, Axis)}
            if n.param.dtype.startswith(("f", "bf")) and both <= plain:
                found.setdefault((n.param.name, n.key()), n)
    if not found:
        return None
    if len(found) > 1:
        raise _refuse("the score reads " + " and ".join(sorted({n.param.name for n in
                                                                 found.values()}))
                      + " by query and key at different indices: one tile a key block is "
                      "copied; the attention template takes more")
    load = next(iter(found.values()))
    name = load.param.name
    if load.param.dtype not in TILE_DTYPES:
        raise _refuse(f"the score reads {name} ({load.param.dtype}) by query and key: its tiles "
                      f"are copied as {' or '.join(TILE_DTYPES)} (a {load.param.dtype} tile "
                      "would take the key/value ring's shared memory); the attention template "
                      "takes it")
    tile_roles = _index_roles(load, roles)
    if tile_roles is None:
        raise _refuse(f"the score reads {name} by query and key with an index that is "
                      "neither an axis of the chain nor a constant: its tiles are copied "
                      "by the roles of plain indices; the attention template takes it")
    if len(set(r for r in tile_roles if isinstance(r, str))) < sum(
            isinstance(r, str) for r in tile_roles):
        raise _refuse(f"the score reads {name} with an axis at two of its indices (a diagonal): "
                      "its tiles are copied as boxes; the attention template takes it")
    if tile_roles[-1] != "j":
        raise _refuse(f"the score reads {name} by query and key with the key axis not its "
                      "innermost: TMA copies rows of contiguous keys; the attention template "
                      "takes it")
    if len(tile_roles) > 5:
        raise _refuse(f"{name} has {len(tile_roles)} dimensions: a tensor map has at most 5")
    return ScoreTile(name, load.param.dtype, tuple(load.param.dims), tuple(tile_roles))


def _index_roles(load: Load, roles: dict) -> list | None:
    """The role of each index of ``load`` (an axis of the chain by ``roles``, or an integer
    constant as itself), or None where an index is neither."""
    found = []
    for index in load.indices:
        if isinstance(index, Axis) and index.uid in roles:
            found.append(roles[index.uid])
        elif isinstance(index, Const) and isinstance(index.value, int) and \
                not isinstance(index.value, bool):
            found.append(int(index.value))
        else:
            return None
    return found


STRIP_DTYPES = ("f32", "bf16", "f16")


def find_key_strip(score: Expr, chain) -> ScoreTile | None:
    """The floating tensor the score reads by key and not by query — a key's norm (cosine
    similarity), a bias per key — as each key block's strip, which the producer copies beside
    the block's keys and the consumers read from shared memory: read element by element from
    global memory, every block's score waits on the loads (cosine-similarity attention at
    280 TFLOP/s on the H200, ``benchmarks.pipeline_kernels``). None where the score reads no
    such tensor, or more than one, or one whose indices are not plain axes of the chain and
    constants with the key innermost (then it is read as it is)."""
    roles = {a.uid: r for a, r in zip(chain.axes, "bhij") if a is not None}
    found = {}
    for n in (n for n in nodes(score) if isinstance(n, Load)):
        plain = {i.uid for i in n.indices if isinstance(i, Axis)}
        if n.param.dtype in STRIP_DTYPES and chain.axes[3].uid in plain and \
                chain.axes[2].uid not in plain:
            found.setdefault((n.param.name, n.key()), n)
    if len(found) != 1:
        return None
    load = next(iter(found.values()))
    strip_roles = _index_roles(load, roles)
    if strip_roles is None:
        return None
    named = [r for r in strip_roles if isinstance(r, str)]
    if len(set(named)) < len(named) or strip_roles[-1] != "j" or len(strip_roles) > 5:
        return None
    return ScoreTile(load.param.name, load.param.dtype, tuple(load.param.dims),
                     tuple(strip_roles))


def strip_bytes(block_n: int, dtype: str) -> int:
    """Shared memory a slot's strip takes: the block's keys, in 1024-byte multiples (a strip of
    128 bytes is copied in the 128-byte swizzle, whose boxes start at 1 KiB; any other
    unswizzled, at 128-byte aligned addresses)."""
    return -(-block_n * ELEMENT_BYTES[dtype] // 1024) * 1024


def tile_bytes(block_m: int, block_n: int) -> int:
    """Shared memory a slot's tile takes (16-bit elements)."""
    return block_m * block_n * 2


def _refuse(message: str) -> ScheduleError:
    return ScheduleError(f"hopper attention: {message}")
