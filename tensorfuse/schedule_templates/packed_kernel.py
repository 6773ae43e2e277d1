"""A kernel of the packed program (:mod:`.packed_rows`) called with the caller's tensors: q and the
outputs viewed as ``[B, HKV, G·M, ·]`` (nothing copied), the sizes of the packed program derived
from the call's, and :func:`packed_attention`, the Hopper attention kernel on it."""
from __future__ import annotations

from ..binding import CallBinder, output_shape, split_scalars
from ..errors import CallError, ScheduleError, TargetError
from ..interop import deliver, torch_output
from ..torch_graph import GraphCallable
from .packed_lift import UNIT_KV, UNIT_Q
from .packed_rows import ROWS, PackedRows, pack_group_rows


class PackedRowsKernel(GraphCallable):
    """``inner``, a kernel of ``packed.program``, as a kernel of the original program: a call's q
    and outputs are viewed with each kv-head's query heads as rows (they must be laid out so that
    a head's rows follow each other — any layout at one query token — and be contiguous; a
    :class:`CallError` says so otherwise)."""

    def __init__(self, program, packed: PackedRows, inner, target,
                 groups: tuple[int, int] | None = None, min_pairs: int = 1):
        self.program, self.packed, self.inner, self.target = program, packed, inner, target
        # where tf.compile routes decodes here: the group sizes (query heads per kv-head) and
        # the fewest (batch, kv-head) pairs it is measured faster at; ``fits`` refuses others
        self.groups, self.min_pairs = groups, min_pairs
        self.outputs = list(program.outputs)
        sizes = "" if groups is None else str(groups[0]) if groups[0] == groups[1] else \
            f"{groups[0]}–{groups[1]}"
        taken = sizes and f", groups of {sizes} heads, {min_pairs}+ (batch, kv-head) pairs"
        self.description = (f"packed group rows ({packed.describe()}{taken}) on "
                            f"{inner.description}")
        self._calls = None

    def __repr__(self) -> str:
        return f"<PackedRowsKernel {self.program.name} for {self.target.name}>"

    def packed_sizes(self, dims: dict) -> dict:
        """The packed program's sizes at the original's ``dims``; a :class:`TargetError` where the
        heads do not split into groups or, for one query token, there are several."""
        dims = self._with_units(dims)
        B, H, HKV, M = (dims[n] for n in self.packed.chain.dims[:4])
        if H % HKV:
            raise TargetError(f"{H} query heads do not split into groups of {HKV} kv-heads")
        if self.packed.one_query and M != 1:
            raise TargetError(f"packed for one query token, called with {M}")
        names = set(self.packed.program.dim_names())
        return {**{n: v for n, v in dims.items() if n in names}, ROWS: H // HKV * M}

    def _with_units(self, dims: dict) -> dict:
        """``dims`` with the unit axes a lift added (a decode written with three axes)."""
        return {**dims, UNIT_Q: 1, UNIT_KV: 1} if self.packed.lifted else dims

    def fits(self, scalars: dict | None = None, **dims) -> bool:
        try:
            sizes = self.packed_sizes(dims)
        except (ScheduleError, TargetError):
            return False
        if self.groups is not None:
            B, H, HKV = (self._with_units(dims)[n] for n in self.packed.chain.dims[:3])
            if not self.groups[0] <= H // HKV <= self.groups[1] or B * HKV < self.min_pairs:
                return False
        try:
            return self.inner.fits(scalars, **sizes)
        except (ScheduleError, TargetError):
            return False

    def schedule_origin(self, **dims) -> str:
        sizes, scalars = split_scalars(self.program, dims)
        return f"packed group rows; {self.inner.schedule_origin(**self.packed_sizes(sizes), **(scalars or {}))}"

    def source(self, **dims) -> str:
        sizes, scalars = split_scalars(self.program, dims)
        return self.inner.source(**self.packed_sizes(sizes), **(scalars or {}))

    def ptx(self, **dims) -> str:
        sizes, scalars = split_scalars(self.program, dims)
        return self.inner.ptx(**self.packed_sizes(sizes), **(scalars or {}))

    def cache_info(self) -> list:
        return self.inner.cache_info()

    def benchmark(self, *args, repeat: int = 100, **kwargs) -> float:
        """Median milliseconds of a call, the views included (triton.testing.do_bench)."""
        import triton

        return float(triton.testing.do_bench(lambda: self.invoke(False, args, kwargs),
                                             rep=repeat, return_mode="median"))

    def _lifted(self, tensor, name: str):
        """``tensor`` with the unit axis a lift added to ``name`` (itself where none)."""
        at = dict(self.packed.lifted).get(name)
        return tensor if at is None else tensor.unsqueeze(at)

    def _view(self, tensor, layout: str, dims: dict, name: str):
        """``tensor`` (lifted; laid out by roles ``layout``) as ``[B, HKV, R, …]``."""
        dims = self._with_units(dims)
        B, H, HKV, M = (dims[n] for n in self.packed.chain.dims[:4])
        rows = [r for r in layout if r in "hi"]
        if rows != ["h", "i"] and M != 1 or not tensor.is_contiguous():
            raise CallError(f"{name} is viewed with each kv-head's query heads as rows: it must be "
                            "contiguous, with a head's query rows one after another "
                            f"(its axes by role: {layout})")
        rest = [tensor.shape[k] for k, r in enumerate(layout) if r not in "bhi"]
        return tensor.view(B, HKV, H // HKV * M, *rest)

    def invoke(self, key, args: tuple, kwargs: dict):
        import torch

        if self._calls is None:
            self._calls = CallBinder(self.program, "cuda" if self.target.is_gpu else "cpu")
        bound = self._calls(args, kwargs, False)
        self.packed_sizes(bound.dims)   # refuses sizes it cannot pack
        chain = self.packed.chain
        given = list(bound.outs) if bound.outs is not None else [None] * len(self.outputs)
        device = bound.torch_device or torch.device("cpu")
        outs = [torch_output(output_shape(c, bound.dims), c.dtypes[0], g, device)
                for c, g in zip(self.outputs, given)]
        values = {**bound.scalars, **{n: self._lifted(torch.as_tensor(t), n)
                                      for n, t in bound.arrays.items()}}
        values[chain.q] = self._view(values[chain.q], chain.layouts[0], bound.dims, chain.q)
        views = [self._view(self._lifted(o, c.name), chain.layouts[3 + k], bound.dims, c.name)
                 for k, (c, o) in enumerate(zip(self.outputs, outs))]
        self.inner(**values, out=views[0] if len(views) == 1 else tuple(views))
        made = [deliver(o, g, bound.framework) for o, g in zip(outs, given)]
        return made[0] if len(made) == 1 else tuple(made)


def packed_attention(kernel, fusion, target, one_query: bool = True,
                     groups: tuple[int, int] | None = None, min_pairs: int = 1,
                     split_only: bool = False, **knobs):
    """``kernel``'s attention with each kv-head's query heads as the rows of one tile, on the
    Hopper attention kernel (``knobs``: its knobs; ``schedule`` defaults to ``"split"``, the few
    tiles cut along the keys over every CTA, where no mask is left after packing — a mask gives
    each row block its own key blocks, so a masked program keeps the kernel's own default;
    ``consumers=1`` suits groups of up to 64 rows). ``groups`` and ``min_pairs``: the calls it
    fits (:class:`PackedRowsKernel`), all where not given. ``split_only``: refuse a program that
    keeps a mask (a :class:`ScheduleError`), where only the split schedule is wanted."""
    from .hopper_attention import hopper_attention
    from .hopper_attention_plan import plan_hopper_attention

    program = kernel.program if hasattr(kernel, "program") else kernel
    packed = pack_group_rows(program, fusion.names, fusion.axis, one_query)
    masked = plan_hopper_attention(packed.program, fusion.names, fusion.axis).mask is not None
    if masked and split_only:
        raise ScheduleError(f"{packed.describe()}: the mask stays after packing, and the split "
                            "schedule takes no mask")
    inner = hopper_attention(packed.program, fusion, target,
                             **{**({} if masked else {"schedule": "split"}), **knobs})
    return PackedRowsKernel(program, packed, inner, target, groups, min_pairs)
