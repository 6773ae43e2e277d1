"""The Triton emitter of the elementwise plan (``schedule_templates.elementwise``): one kernel
whose programs take tiles of rows (the outputs' outer axes flattened) × columns (the innermost
axis: contiguous, vectorisable loads and stores along it) and write every output at each
element.
Its callable is the scatter-add's (:mod:`.scatter_kernel`: arguments checked, one source per
sizes, sizes as arguments with ``dynamic=``) with one kernel and no accumulator."""
from __future__ import annotations

import math

from ...algebra.exprs import nodes
from ...dsl.expr import Axis, Const, Load
from ...dsl.symbolic_sizes import size_arguments
from .expr import TL_DTYPES, TileContext, computed, dim_sizes, offset, strides, to_triton
from .view_strides import call_views
from .launch import assembly_of, compile_for, interpreting, load_kernel, signature
from ...interop import deliver
from ..signature_call import try_fast_call
from .launcher import Launches, Step, output_specs, remember_fast_call
from .tile_text import assemble_source
from .scatter import BLOCK, extent
from .scatter_kernel import ScatterKernel
from .size_builds import with_size_arguments

ORIGIN = "elementwise template (one flat pass over the outputs)"


# A program's elements: 4096 where an element reads one tensor, halved for each doubling of the
# distinct loads an element makes, at least 256. On the H200 (bf16; 4 warps; elements 1024 /
# 2048 / 4096 a program, ms): a global average pool's gradient [64, 512, 56, 56] (one load)
# 0.076 / 0.063 / 0.058; rotary embeddings [4, 4096, 32, 128] (four) 0.073 / 0.076 / 0.080; a
# 2×2 max pool written out of [32, 128, 112, 112] (four) 0.072 / 0.120 / 0.123; 8 warps no better
# (``benchmarks.unlisted_kernels`` and ``user_kernels``, the kernels' tiles varied by hand). On
# the H100, a 3×3 average pool of stride 2 written out (nine loads) of [64, 64, 112, 112] f32,
# elements 2048 / 1024 / 512 / 256 / 128: 0.457 / 0.240 / 0.131 / 0.100 / 0.100 ms
# (``benchmarks.window_kernels``; torch.compile 0.095)
ELEMENTS, MIN_ELEMENTS = 4096, 256


# Loads of one tensor that differ only in a constant innermost index covering that dimension (of
# a power-of-two extent up to this), the index before it the tile's column axis — a pooling
# window's columns written out, x[…, j, 0] and x[…, j, 1] —, are one contiguous load of
# columns × extent elements split into the terms in registers: each term alone strides by the
# extent, one element a lane (a 2×2 max pool of [32, 128, 112, 112] on the H200: 0.072 → 0.037
# ms; torch.compile 0.044 — ``benchmarks.unlisted_kernels``)
INTERLEAVED_MAX = 16
# the prefix of the kernel's own variables: a program's tensors are named as the user named
# them (a stored intermediate ``row``), and a variable of the same name would shadow one
L = "_e_"


def interleaved_loads(plan, sizes: dict) -> list[tuple[Load, int, dict]]:
    """Groups of the plan's loads that :data:`INTERLEAVED_MAX` describes: (the group's load at
    innermost index 0, the innermost extent, innermost index → load of the group)."""
    last = plan.axes[-1]
    groups: dict = {}
    for _, expr in plan.outputs:
        for n in nodes(expr):
            if not isinstance(n, Load) or len(n.indices) < 2:
                continue
            *rest, column, inner = n.indices
            extents, apart = dim_sizes(n.param, sizes), strides(n.param, sizes)
            # (the other indices neither gathered nor reading the column axis: the group's
            # base offset is one per row; the q elements of a column next to each other and
            # the columns q apart — a view's need not be)
            if not (isinstance(column, Axis) and column.uid == last.uid and
                    isinstance(inner, Const) and isinstance(extents[-1], int) and
                    apart[-1] == 1 and apart[-2] == extents[-1]) or \
                    any(isinstance(i, Load) or isinstance(i, Axis) and i.uid == last.uid
                        for index in rest for i in nodes(index)):
                continue
            key = (n.param.name, tuple(i.key() for i in rest))
            groups.setdefault(key, (n, extents[-1], {}))[2][int(inner.value)] = n
    return [(Load(n.param, n.indices[:-1] + (Const(0, "i32"),)), q, members)
            for n, q, members in groups.values()
            if 2 <= q <= INTERLEAVED_MAX and q & (q - 1) == 0 and sorted(members) == list(range(q))]


def split_interleaved(w, name: str, rows: int, columns: int, q: int) -> list[str]:
    """Emit the split of ``name`` ([rows, columns · q], the innermost index fastest) into its q
    terms, each [rows, columns]; their names by innermost index."""
    if q == 1:
        return [name]
    shape = [rows, columns] + ([q // 2] if q > 2 else []) + [2]
    w(f"{name}_e, {name}_o = tl.split(tl.reshape({name}, {shape}))")
    even = split_interleaved(w, f"{name}_e", rows, columns, q // 2)
    odd = split_interleaved(w, f"{name}_o", rows, columns, q // 2)
    return [t for pair in zip(even, odd) for t in pair]


def emit_interleaved(plan, sizes: dict, tile: TileContext, rows: int, columns: int,
                     row_count, n) -> None:
    """Emit each :func:`interleaved_loads` group as one load split into its terms, which
    ``tile``'s memo then hands to the loads of the outputs' expressions."""
    w = tile.emit
    widened: set = set()
    for k, (first, q, members) in enumerate(interleaved_loads(plan, sizes)):
        index, mask = f"{L}ax_x{q}", f"{L}ok_x{q}"   # the columns × q elements, and which exist
        if q not in widened:
            widened.add(q)
            w(f"{index} = ({L}pid % {L}blocks) * {columns * q} + "
              f"tl.arange(0, {columns * q})[None, :]")
            w(f"{mask} = ({L}row < {row_count}) & ({index} < ({n}) * {q})")
        base = offset(Load(first.param, first.indices[:-2] + (Const(0, "i32"),) * 2), tile)
        w(f"_w{k} = " + computed(f"tl.load({first.param.name} + ({base} + {index}), "
                                 f"mask={mask}, other=0)", first.param.dtype))
        for at, term in enumerate(split_interleaved(w, f"_w{k}", rows, columns, q)):
            tile.memo[(members[at].key(), False)] = term


# A tensor of at most 1/REUSED_BY of the outputs' elements — a norm's statistics per group, its
# weight and bias per channel — is read again from cache by the many elements sharing each value:
# it is no stream of its own and does not shrink the programs. A channels-last group norm's
# output stage (B16 P4096 G32 C16: x and four tables of 512 elements) ran in programs of 512
# elements, the rest of the staged call's 105 µs on the H100 after its statistics stage's 29
# (``benchmarks.layout_kernels``, ``benchmarks.strided_rows_knobs --only
# group_stats_channels_last``; a copy of its bytes, about 45 at the rate measured beside it):
# it now runs in programs of 4096, as the single stream above. Rotary embeddings' cos and sin
# tables (1/128 of the outputs) stay streams (their 1024-element programs measured fastest, above)
REUSED_BY = 1024


def distinct_loads(plan, sizes: dict) -> int:
    """The distinct tensor reads an element of the outputs makes at ``sizes``, but for those of
    tensors of at most 1/:data:`REUSED_BY` of the outputs (read from cache)."""
    loads = {n.key(): n for _, expr in plan.outputs for n in nodes(expr) if isinstance(n, Load)}
    outputs = _elements(plan.axes, sizes)
    return sum(1 for n in loads.values()
               if outputs is None or (own := _elements(n.param.dims, sizes)) is None or
               own * REUSED_BY > outputs)


def _elements(dims, sizes: dict):
    """The product of ``dims`` (axes or a tensor's dimensions, ints or size names) at ``sizes``
    (a size passed as an argument is symbolic: comparing it records a guard); None where one is
    not given."""
    total = 1
    for d in dims:
        value = getattr(d, "extent", d)
        value = value if isinstance(value, int) else sizes.get(value)
        if value is None:
            return None
        total = value * total
    return total


def tile_shape(plan, sizes: dict, argument: bool = False) -> tuple[int, int]:
    """(rows, columns) of a program's tile: the innermost axis's extent rounded up to a power of
    two (128 where the extent is an argument of the source, ``argument``) as columns — loads and
    stores along it contiguous —, as many rows of the other axes as fill the program's elements
    (:data:`ELEMENTS`, fewer for elements that stream several tensors)."""
    streams = distinct_loads(plan, sizes)
    elements = max(MIN_ELEMENTS, ELEMENTS >> (max(1, streams) - 1).bit_length())
    last = extent(plan.axes[-1], sizes)
    argument = argument or not isinstance(last, int)
    columns = 128 if argument else min(elements, 1 << (last - 1).bit_length())
    return max(1, elements // columns), columns


def last_is_argument(plan, args: list[str]) -> bool:
    """Whether the innermost axis's extent is an argument of a source taking ``args``."""
    from ...dsl.symbolic_sizes import PREFIX

    ext = plan.axes[-1].extent
    return isinstance(ext, str) and PREFIX + ext in args


def elementwise_source(plan, name: str, sizes: dict, args: list[str]) -> str:
    """The Python source of ``name``, taking ``args``: each output at every element of the
    plan's axes, a tile of rows (the outer axes flattened) × columns (the innermost) a
    program."""
    from .source_writer import SourceWriter

    *outer, last = plan.axes
    rows, columns = tile_shape(plan, sizes)
    row_count = math.prod(extent(a, sizes) for a in outer) if outer else 1
    n = extent(last, sizes)
    # a comparison of sizes that are arguments records a guard: a larger call gets its own build
    wide = row_count * n >= 2**31
    w = SourceWriter(False)
    w(f"{L}pid = tl.program_id(0)" + (".to(tl.int64)" if wide else ""))
    w(f"{L}blocks = (({n}) + {columns - 1}) // {columns}")
    w(f"{L}row = ({L}pid // {L}blocks) * {rows} + tl.arange(0, {rows})[:, None]")
    w(f"{L}ax_{last.name} = ({L}pid % {L}blocks) * {columns} + tl.arange(0, {columns})[None, :]")
    w(f"{L}ok = ({L}row < {row_count}) & ({L}ax_{last.name} < {n})")
    w(f"{L}rest = {L}row")
    names = {last.uid: f"{L}ax_{last.name}"}
    for a in reversed(outer):
        names[a.uid] = f"{L}ax_{a.name}"
        w(f"{L}ax_{a.name} = {L}rest % {extent(a, sizes)}")
        w(f"{L}rest = {L}rest // {extent(a, sizes)}")
    # each load and operation bound to a variable once: a value read twice (rotary's partner
    # feature, in both branches of its where) is loaded once
    tile = TileContext(axes=names, valid={a.uid: f"{L}ok" for a in plan.axes}, sizes=sizes,
                       interpreter=interpreting(), emit=w, memo={})
    emit_interleaved(plan, sizes, tile, rows, columns, row_count, n)
    for c, expr in plan.outputs:   # outputs are contiguous over the plan's axes
        w(f"tl.store(out_{c.name} + ({L}row * ({n}) + {L}ax_{last.name}), "
          f"({to_triton(expr, tile)}).to({TL_DTYPES[c.dtypes[0]]}), mask={L}ok)")
    return assemble_source([(name, args, w.lines)])


def grid(plan, sizes: dict, argument: bool = False) -> tuple[int]:
    """The programs at ``sizes`` (ints) of a source whose innermost extent is an argument or
    not."""
    rows, columns = tile_shape(plan, sizes, argument)
    *outer, last = plan.axes
    row_count = math.prod(extent(a, sizes) for a in outer) if outer else 1
    return (max(1, math.ceil(row_count / rows) * math.ceil(extent(last, sizes) / columns)),)


class ElementwiseKernel(ScatterKernel):
    """An :class:`~tensorfuse.schedule_templates.elementwise.ElementwisePlan` run as one Triton
    kernel, a tile of :func:`tile_shape` a program."""

    scratch_names = ()   # no accumulator: every output element written once

    def __init__(self, plan, target, dynamic: "bool | None" = None):
        super().__init__(plan, target, dynamic)
        self.outputs = [c for c, _ in plan.outputs]
        self.description = ORIGIN
        self.args = [p.name for p in self.program.tensor_params] + \
            [p.name for p in self.program.scalar_params] + \
            [f"out_{c.name}" for c in self.outputs]
        self._fast: dict = {}   # signature key -> FastCall (a repeated call's launch, unbound)

    def __repr__(self) -> str:
        return f"<ElementwiseKernel {self.program.name} for {self.target.name}>"

    def invoke(self, key, args: tuple, kwargs: dict):
        """A call whose signature key the caller made (``False``: not made): a signature seen
        before runs on its :class:`~.launcher.FastCall`, as the row template's kernels do;
        otherwise the checked path, keeping a fast call for next time where one applies."""
        key, fast, done = try_fast_call(self._fast, key, args, kwargs)
        if done is not None:
            return done
        routed, out = self._route_call(key, args, kwargs)
        if routed:
            return out
        launches, values, outs, given, bound = self._prepare(args, kwargs)
        launches(values)
        # (a fast call that declined this call — another layout's, a route's — is replaced)
        if key is not None and (fast is None or fast.declined):
            remember_fast_call(self._fast, key, self.program, args, bound, self._calls,
                               output_specs(self.outputs, bound.dims), launches,
                               views=call_views(self.program, bound.arrays))
        made = [deliver(o, g, bound.framework) for o, g in zip(outs, given)]
        return made[0] if len(made) == 1 else tuple(made)

    @property
    def _name(self) -> str:
        return f"{self.program.name}_elementwise"

    def _assembled(self, made, dims: dict) -> tuple:
        """(source, [kernel], launches, argument names): :meth:`build`'s answer."""
        programs = grid(self.plan, dims, last_is_argument(self.plan, made.args))
        launches = Launches([Step(made.fn, programs, made.args, self._pointers)],
                            dict(BLOCK_M=BLOCK, BLOCK_N=1, BLOCK_K=1), 4, 1)
        return made.source, [made.fn], launches, made.args

    def _emit(self, sizes: dict) -> tuple:
        args = self.args + size_arguments(sizes)
        source = elementwise_source(self.plan, self._name, sizes, args)
        return source, load_kernel(source, self._name), args

    def compiled(self, **dims):
        """The kernel compiled without a GPU (``.asm``: ptx/cubin or amdgcn)."""
        from ...binding import split_scalars

        dims, _ = split_scalars(self.program, dims)
        _, fns, _, args = self.build(**dims)
        sig = signature(self.program, self.outputs, [])
        sig, divisible = with_size_arguments({n: sig.get(n, "*fp32") for n in self.args}, dims,
                                             args)
        return compile_for(fns[0], sig, dict(BLOCK_M=BLOCK, BLOCK_N=1, BLOCK_K=1),
                           self.target, 4, 1, divisible)

    def assembly(self, **dims) -> str:
        return assembly_of(self.compiled(**dims), self.target)

    def schedule_origin(self, **dims) -> str:
        return self.description

    def _scratch(self, dims: dict, device) -> dict:
        return {}
