"""A kernel of the packed program (:mod:`.packed_rows`) called with the caller's tensors: q and the
outputs viewed as ``[B, HKV, G·M, ·]`` (nothing copied), the sizes of the packed program derived
from the call's, and :func:`packed_attention`, the Hopper attention kernel on it."""
from __future__ import annotations

from ..errors import CallError, ScheduleError, TargetError
from ..torch_graph import GraphCallable
from .lifted_kernel import LiftedKernel, with_unit_sizes
from .packed_lift import UNIT_KV, UNIT_Q
from .packed_rows import ROWS, PackedRows, pack_group_rows


class PackedRowsKernel(LiftedKernel):
    """``inner``, a kernel of ``packed.program``, as a kernel of the original program: a call's q
    and outputs are viewed with each kv-head's query heads as rows (they must be laid out so that
    a head's rows follow each other — any layout at one query token — and be contiguous; a
    :class:`CallError` says so otherwise)."""

    who = "packed group rows"

    def __init__(self, program, packed: PackedRows, inner, target):
        super().__init__(program, dict(packed.lifted), inner, target,
                         (UNIT_Q, UNIT_KV) if packed.lifted else ())
        self.packed = packed
        self.lift = f"{self.who} ({packed.describe()})"
        self.description = f"{self.lift} on {inner.description}"

    def inner_sizes(self, sizes: dict) -> dict:
        """The packed program's sizes at the original's; a :class:`TargetError` where the heads
        do not split into groups or, for one query token, there are several."""
        sizes = with_unit_sizes(sizes, self.units)
        B, H, HKV, M = (sizes[n] for n in self.packed.chain.dims[:4])
        if H % HKV:
            raise TargetError(f"{H} query heads do not split into groups of {HKV} kv-heads")
        if self.packed.one_query and M != 1:
            raise TargetError(f"packed for one query token, called with {M}")
        names = set(self.packed.program.dim_names())
        return {**{n: v for n, v in sizes.items() if n in names}, ROWS: H // HKV * M}

    def _view(self, tensor, layout: str, dims: dict, name: str):
        """``tensor`` (lifted; laid out by roles ``layout``) as ``[B, HKV, R, …]``."""
        dims = with_unit_sizes(dims, self.units)
        B, H, HKV, M = (dims[n] for n in self.packed.chain.dims[:4])
        rows = [r for r in layout if r in "hi"]
        if rows != ["h", "i"] and M != 1 or not tensor.is_contiguous():
            raise CallError(f"{name} is viewed with each kv-head's query heads as rows: it must be "
                            "contiguous, with a head's query rows one after another "
                            f"(its axes by role: {layout})")
        rest = [tensor.shape[k] for k, r in enumerate(layout) if r not in "bhi"]
        return tensor.view(B, HKV, H // HKV * M, *rest)

    def _views(self, values: dict, outs: list, dims: dict) -> list:
        """q and the outputs with each kv-head's query heads as rows."""
        self.inner_sizes(dims)   # refuses sizes it cannot pack
        chain = self.packed.chain
        values[chain.q] = self._view(values[chain.q], chain.layouts[0], dims, chain.q)
        return [self._view(o, chain.layouts[3 + k], dims, c.name)
                for k, (c, o) in enumerate(zip(self.outputs, outs))]


def packed_attention(kernel, fusion, target, one_query: bool = True, **knobs):
    """``kernel``'s attention with each kv-head's query heads as the rows of one tile, on the
    Hopper attention kernel (``knobs``: its knobs; ``schedule`` defaults to ``"split"``, the few
    tiles cut along the keys over every CTA, where no mask is left after packing — a mask gives
    each row block its own key blocks, so a masked program keeps the kernel's own default;
    ``consumers=1`` suits groups of up to 64 rows)."""
    from .hopper_attention import hopper_attention
    from .hopper_attention_plan import plan_hopper_attention

    program = kernel.program if hasattr(kernel, "program") else kernel
    packed = pack_group_rows(program, fusion.names, fusion.axis, one_query)
    if "schedule" not in knobs and \
            plan_hopper_attention(packed.program, fusion.names, fusion.axis).mask is None:
        knobs = {**knobs, "schedule": "split"}
    return PackedRowsKernel(program, packed, hopper_attention(packed.program, fusion, target,
                                                              **knobs), target)


class PackedDecodeRoute(GraphCallable):
    """Where ``tf.compile`` runs a decode as packed group rows: calls of one query token whose
    group (query heads per kv-head) is within ``groups`` and with ``min_pairs`` (batch, kv-head)
    pairs or more — told from the sizes alone, before anything is packed — on
    :func:`packed_attention` with ``knobs``, made on the first such call (packing plans the
    chain again: about 0.2 s, which every ``tf.compile`` of an attention would pay otherwise).
    ``dims``: the names of the batch, head, kv-head and query counts (those of the unit axes
    where the program is lifted to four: 1 at every call)."""

    def __init__(self, kernel, fusion, target, dims: tuple[str, ...], groups: tuple[int, int],
                 min_pairs: int, refusal: str = "", **knobs):
        self.kernel, self.fusion, self.target, self.knobs = kernel, fusion, target, knobs
        self.program = kernel.program
        self.dims, self.groups, self.min_pairs = dims, groups, min_pairs
        sizes = str(groups[0]) if groups[0] == groups[1] else f"{groups[0]}–{groups[1]}"
        self.description = (f"packed group rows (groups of {sizes} heads, {min_pairs}+ (batch, "
                            "kv-head) pairs, one query token) on hopper_attention")
        # the PackedRowsKernel, or False where the program does not pack (or ``refusal``, the
        # router's reason not to route it here, is given)
        self._made = False if refusal else None
        self._refusal = refusal   # then why not

    def __repr__(self) -> str:
        return f"<PackedDecodeRoute {self.program.name} for {self.target.name}>"

    def routed(self, dims: dict) -> bool:
        """Whether these sizes are the ones this route takes (from the sizes alone)."""
        dims = with_unit_sizes(dims)
        B, H, HKV, M = (dims[n] for n in self.dims)
        return M == 1 and H % HKV == 0 and self.groups[0] <= H // HKV <= self.groups[1] and \
            B * HKV >= self.min_pairs

    def made(self):
        if self._made is None:
            try:
                self._made = packed_attention(self.kernel, self.fusion, self.target,
                                              **self.knobs)
            except ScheduleError as exc:
                self._made, self._refusal = False, exc.message
        return self._made

    def why_not(self, scalars: dict | None = None, **dims) -> str | None:
        """Why this route does not take these sizes, where it knows before building anything:
        not one query token of a group in its range with enough (batch, kv-head) pairs, or the
        program's refusal to be packed; else None."""
        if not self.routed(dims):
            return (f"these sizes are not one query token in groups of {self.groups[0]}–"
                    f"{self.groups[1]} heads over {self.min_pairs}+ (batch, kv-head) pairs")
        return None if self.made() else f"the program does not pack: {self._refusal}"

    def fits(self, scalars: dict | None = None, **dims) -> bool:
        return self.routed(dims) and bool(self.made()) and self.made().fits(scalars, **dims)

    def invoke(self, key, args: tuple, kwargs: dict):
        return self.made().invoke(key, args, kwargs)

    @property
    def _fast(self) -> dict:
        """The packed kernel's fast calls by signature (``tf.compile`` keeps the one a call
        made and goes straight to it next time)."""
        made = self._made
        return made._fast if made else {}

    def schedule_origin(self, **dims) -> str:
        return self.made().schedule_origin(**dims)

    def source(self, **dims) -> str:
        return self.made().source(**dims)

    def assembly(self, **dims) -> str:
        return self.made().assembly(**dims)

    def cache_info(self) -> list:
        return self.made().cache_info() if self._made else []
