"""Block lists for a masked chain, like FlexAttention's block masks, computed from the DSL mask.

For each batch position and block of rows, the blocks of the fused axis are sorted into *partial*
(the mask holds for some elements: evaluate it) and *full* (it holds everywhere: skip it); blocks
where it never holds are left out, so fully masked tiles cost nothing. The mask expression is
evaluated with torch on the tensors' device; lists that depend only on sizes and scalars are
cached, data-dependent ones (document ids) are recomputed when the data change.
"""
from __future__ import annotations

import math

from ..dsl.expr import Axis, Const, Expr, Load
from ..errors import TargetError
from ..interop import capturing
from .block_bounds import lists_from_maps, position_block_maps
from .mask_values import MaskEvaluator

# what a block costs relative to a fully visible one when the mask is evaluated on it
PARTIAL_COST = 1.25

def block_lists(cond: Expr, batch: list, row: Axis, col: Axis, sizes: dict, tensors: dict,
                scalars: dict, block_m: int, block_n: int, device, row_tiling=None,
                row_blocks=None):
    """``(partial_num, partial_idx, full_num, full_idx)`` as int32 tensors on ``device``: per
    (batch position, row block), how many blocks of each kind and which (row-major lists).
    ``row_tiling`` (:class:`.token_tiling.TokenTiling`): the rows are visited in that order, row
    block ``b`` holding the tokens of positions ``b·block_m …``; ``row_blocks``: only these row
    blocks (a sample, to compare tilings) — their ``(partial, full)`` block maps."""
    if row_blocks is None:
        return block_lists_and_counts(cond, batch, row, col, sizes, tensors, scalars, block_m,
                                      block_n, device, row_tiling)[0]
    if row_tiling is None:   # a sample to compare block sizes: 0.1–0.25 s evaluated at 16k
        maps = position_block_maps(cond, row, col, sizes, scalars, block_m, block_n)
        if maps is not None:
            import torch

            picked = list(row_blocks)
            return tuple(torch.from_numpy(m[picked]).unsqueeze(0).to(device) for m in maps)
    return _evaluated_lists(cond, batch, row, col, sizes, tensors, scalars, block_m, block_n,
                            device, row_tiling, row_blocks)


def block_lists_and_counts(cond: Expr, batch: list, row: Axis, col: Axis, sizes: dict,
                           tensors: dict, scalars: dict, block_m: int, block_n: int, device,
                           row_tiling=None, keep: bool = False):
    """:func:`block_lists`, and the blocks each (batch position, row block) visits as a NumPy
    array where the host sorted them (a mask over positions alone:
    :func:`.block_bounds.position_block_maps`; with ``keep``, the lists in kept memory), None
    where the device evaluated the mask."""
    extent = lambda a: a.extent if isinstance(a.extent, int) else sizes[a.extent]  # noqa: E731
    # captured copies from host memory would replay whatever that memory holds by then
    if row_tiling is None and not (_is_cuda(device) and capturing()):
        maps = position_block_maps(cond, row, col, sizes, scalars, block_m, block_n)
        if maps is not None:
            total = math.prod(extent(a) for a in batch) if batch else 1
            return lists_from_maps(*maps, total, device, keep)
    return _evaluated_lists(cond, batch, row, col, sizes, tensors, scalars, block_m, block_n,
                            device, row_tiling, None), None


def _is_cuda(device) -> bool:
    import torch

    return torch.device(device).type == "cuda"


def _evaluated_lists(cond: Expr, batch: list, row: Axis, col: Axis, sizes: dict, tensors: dict,
                     scalars: dict, block_m: int, block_n: int, device, row_tiling, row_blocks):
    """:func:`block_lists` with the mask evaluated on every element, on ``device``."""
    import torch

    extent = lambda a: a.extent if isinstance(a.extent, int) else sizes[a.extent]  # noqa: E731
    rows, cols = extent(row), extent(col)
    rows_pad = row_tiling.padded if row_tiling else math.ceil(rows / block_m) * block_m
    cols_pad = math.ceil(cols / block_n) * block_n
    n_rb, n_cb = rows_pad // block_m, cols_pad // block_n
    batch_extents = [extent(a) for a in batch]
    used = {a.uid for a in cond.axes}
    dep_batch = [a for a in batch if a.uid in used]
    shape_b = [extent(a) for a in dep_batch]
    nb = math.prod(shape_b) if shape_b else 1
    chosen = list(range(n_rb)) if row_blocks is None else list(row_blocks)
    view = None if row_tiling is not None or row_blocks is not None else \
        _mask_tensor_view(cond, dep_batch, row, col, tensors, shape_b + [rows, cols])
    if view is not None:   # a boolean mask tensor (transformers' padding and windows)
        any_blocks, all_blocks = _tensor_block_flags(*view, len(dep_batch), block_m, block_n)
        any_blocks, all_blocks = (f.reshape(nb, n_rb, n_cb) for f in (any_blocks, all_blocks))
    else:
        any_blocks, all_blocks = _evaluated_block_flags(
            cond, dep_batch, row, col, sizes, tensors, scalars, block_m, block_n, device,
            row_tiling, chosen, cols_pad)
    partial = any_blocks & ~all_blocks
    full = any_blocks & all_blocks
    if row_blocks is not None:
        return partial, full
    # expand to every batch position of the grid (row-major over `batch`)
    total = math.prod(batch_extents) if batch_extents else 1
    if dep_batch and len(dep_batch) < len(batch) or (not dep_batch and total > 1):
        index = torch.zeros(batch_extents or [1], dtype=torch.long, device=device)
        stride = 1
        for a in reversed(dep_batch):
            pos = [b.uid for b in batch].index(a.uid)
            shape = [1] * len(batch)
            shape[pos] = extent(a)
            index = index + torch.arange(extent(a), device=device).view(shape) * stride
            stride *= extent(a)
        index = index.reshape(-1)
        partial, full = partial[index], full[index]

    def lists(kind):
        counts = kind.sum(dim=2).to(torch.int32).reshape(-1)
        order = torch.argsort((~kind).to(torch.int8), dim=2, stable=True).to(torch.int32)
        return counts.contiguous(), order.reshape(-1, n_cb).contiguous()

    pn, pi = lists(partial)
    fn, fi = lists(full)
    return pn, pi, fn, fi


def _mask_tensor_view(cond: Expr, dep_batch: list, row: Axis, col: Axis, tensors: dict,
                      shape: list):
    """Where the mask is a boolean tensor read as it is — ``mask[b, 0, i, j]``: plain axes (the
    rows', the columns' and batch axes', each once) and constants —, ``(view, order)``: the
    tensor's elements as a view in its own order (no element gathered; a mask that holds more
    rows or columns cut to them) and where ``[*dep_batch, rows, cols]`` (``shape``) are in it;
    else None. Evaluated element by element (gathered through index tensors, copied, reduced
    four times) it took about 1.2 ms of GPU time of a training step of gpt-oss's sliding window
    at S=4096 whose backward took 3.4 ms (the H200, torch.profiler of
    ``benchmarks.attention_sinks``' training case)."""
    if not (isinstance(cond, Load) and cond.param.dtype == "bool"):
        return None
    tensor = tensors[cond.param.name]
    wanted = [a.uid for a in dep_batch] + [row.uid, col.uid]
    held, index = [], []
    for x in cond.indices:
        if isinstance(x, Axis) and x.uid in wanted and x.uid not in held:
            held.append(x.uid)
            index.append(slice(None))
        elif isinstance(x, Const) and isinstance(x.value, int):
            index.append(int(x.value))
        else:
            return None
    if sorted(held) != sorted(wanted):
        return None
    order = [wanted.index(u) for u in held]   # the role of each of the view's dims
    view = tensor[tuple(index)]
    view = view[tuple(slice(0, shape[k]) for k in order)]
    if list(view.shape) != [shape[k] for k in order]:
        return None
    return view, order


def _tensor_block_flags(view, order: list, batch_dims: int, block_m: int, block_n: int):
    """Per (batch position, row block, column block) whether the boolean ``view`` (its dims'
    roles in ``order``: the batch axes' ``0 … batch_dims - 1``, then the rows', the columns')
    holds somewhere and everywhere, ``[*batch, row blocks, column blocks]``: its elements
    counted block by block in one integer sum in the tensor's own order (so a per-key list
    transposes the counts, not the mask), past the edges nowhere and no matter."""
    import torch

    blocks = {batch_dims: block_m, batch_dims + 1: block_n}
    values = view.view(torch.uint8)
    pads = [(-n) % blocks.get(k, 1) for n, k in zip(values.shape, order)]
    if any(pads):
        padded = torch.zeros([n + p for n, p in zip(values.shape, pads)], dtype=torch.uint8,
                             device=view.device)
        padded[tuple(slice(0, n) for n in values.shape)] = values
        values = padded
    split = []
    for n, k in zip(values.shape, order):
        split += [n // blocks.get(k, 1), blocks.get(k, 1)]
    counts = values.reshape(split).sum(dim=tuple(range(1, 2 * len(order), 2)))
    counts = counts.permute([order.index(k) for k in range(len(order))])
    extent = dict(zip(order, view.shape))

    def inside(k):   # elements of each block along the rows (k = batch_dims) or the columns
        starts = torch.arange(0, extent[k], blocks[k], device=view.device)
        return torch.clamp(extent[k] - starts, max=blocks[k])
    within = inside(batch_dims).view(-1, 1) * inside(batch_dims + 1).view(1, -1)
    return counts > 0, counts == within


def _evaluated_block_flags(cond: Expr, dep_batch: list, row: Axis, col: Axis, sizes: dict,
                           tensors: dict, scalars: dict, block_m: int, block_n: int, device,
                           row_tiling, chosen: list, cols_pad: int):
    """:func:`_tensor_block_flags` of any mask, evaluated on every element of the chosen row
    blocks (in chunks of about 2^24 elements)."""
    import torch

    extent = lambda a: a.extent if isinstance(a.extent, int) else sizes[a.extent]  # noqa: E731
    rows, cols = extent(row), extent(col)
    n_cb = cols_pad // block_n
    shape_b = [extent(a) for a in dep_batch]
    nb = math.prod(shape_b) if shape_b else 1
    any_blocks = torch.zeros((nb, len(chosen), n_cb), dtype=torch.bool, device=device)
    all_blocks = torch.zeros((nb, len(chosen), n_cb), dtype=torch.bool, device=device)
    col_token, col_in = _tokens(torch.arange(cols_pad, device=device), cols, None)
    per = max(1, (1 << 24) // max(1, cols_pad * nb) // block_m)
    nd = len(dep_batch) + 2
    for s0 in range(0, len(chosen), per):
        picked = torch.tensor(chosen[s0:s0 + per], device=device)
        row_pos = (picked.view(-1, 1) * block_m + torch.arange(block_m, device=device)).view(-1)
        row_token, row_in = _tokens(row_pos, rows, row_tiling)
        grids = {}
        for k, a in enumerate(dep_batch):
            shape = [1] * nd
            shape[k] = extent(a)
            grids[a.uid] = torch.arange(extent(a), device=device).view(shape)
        grids[row.uid] = row_token.view([1] * len(dep_batch) + [-1, 1])
        grids[col.uid] = col_token.view([1] * len(dep_batch) + [1, -1])
        inside = row_in.view(-1, 1) & col_in.view(1, -1)
        value = MaskEvaluator(grids, tensors, scalars, sizes)(cond)
        value = torch.as_tensor(value, device=device)
        full_shape = shape_b + [row_pos.numel(), cols_pad]
        count = picked.numel()
        value = torch.broadcast_to(value, full_shape).reshape(nb, count, block_m, n_cb, block_n)
        inside = torch.broadcast_to(inside, full_shape).reshape(nb, count, block_m, n_cb, block_n)
        hit = value & inside
        any_blocks[:, s0:s0 + count] = hit.any(dim=4).any(dim=2)
        all_blocks[:, s0:s0 + count] = (value | ~inside).all(dim=4).all(dim=2)
    return any_blocks, all_blocks


def _check_covered(held, seen) -> None:
    """Every key a row block sees (``seen``, booleans over the keys) lies in exactly one of its
    windows (``held``: the keys they hold) — or the schedule is wrong (a kernel would silently
    skip or repeat keys): refuse it."""
    import torch

    count = torch.bincount(held.clamp(min=0), minlength=seen.numel())
    if bool((count[:seen.numel()][seen] != 1).any()) or bool((held < 0).any()):
        raise TargetError("the key windows of a row block do not cover its visible keys exactly "
                          "once (a bug in tensorfuse's block schedule; tile_as(enabled=False) "
                          "avoids it)")


def _tokens(positions, extent: int, tiling):
    """The tokens at ``positions`` of an axis's visiting order (clamped into range, so that a
    mask may index tensors with them) and whether each is a token at all."""
    import torch

    if tiling is None:
        token, valid = positions, positions < extent
    else:
        token, valid = tiling.position(positions)
        if valid is None:
            valid = torch.ones_like(positions, dtype=torch.bool)
    return token.clamp(max=extent - 1), valid


def window_lists(cond: Expr, batch: list, row: Axis, col: Axis, sizes: dict, scalars: dict,
                 block_m: int, device, row_tiling, windows, row_blocks=None):
    """Block lists whose entries are key-block *origins* (tokens) of ``windows``
    (:class:`.token_tiling.KeyWindows`) rather than block indices: per row block, the box of its
    visible keys in each sub-map, covered by windows from the box's corner or on a grid through
    the row block's first query, whichever costs less (lined up with the queries, more windows
    can be wholly visible: a 31×31 neighbourhood's patches). A block is full where every key in it
    is a token and visible from every row. The mask may read sizes and scalars only (not the
    batch axes, not tensors). Same layout as :func:`block_lists`, ``windows.bound`` entries a
    row; with ``row_blocks``, ``(partial, full)`` block counts of those row blocks."""
    import torch

    extent = lambda a: a.extent if isinstance(a.extent, int) else sizes[a.extent]  # noqa: E731
    rows, cols = extent(row), extent(col)
    rows_pad = row_tiling.padded if row_tiling else math.ceil(rows / block_m) * block_m
    n_rb, bn, bound = rows_pad // block_m, windows.block, windows.bound
    chosen = list(range(n_rb)) if row_blocks is None else list(row_blocks)
    keys = torch.arange(cols, device=device)
    at = torch.stack(windows.coordinates(keys), dim=1)
    dil = torch.tensor(windows.dilation, device=device)
    residue = at % dil
    within = torch.arange(bn, device=device)
    partial_n = torch.zeros(len(chosen), dtype=torch.int32)
    full_n = torch.zeros(len(chosen), dtype=torch.int32)
    partial_at = torch.zeros((len(chosen), bound), dtype=torch.int32)
    full_at = torch.zeros((len(chosen), bound), dtype=torch.int32)
    grids0 = {a.uid: 0 for a in batch}
    step = torch.tensor([p * d for p, d in zip(windows.patch, windows.dilation)], device=device)

    def classify(origin, row_token, row_in):
        """The blocks at ``origin`` that some row sees a key of: (partial, full) origins, and
        the keys those blocks hold."""
        token, valid = windows.position(origin.view(-1, 1), within.view(1, -1))
        valid = torch.ones_like(token, dtype=torch.bool) if valid is None else valid
        value = MaskEvaluator({**grids0, row.uid: row_token.view(-1, 1, 1),
                            col.uid: token.clamp(max=cols - 1).view(1, *token.shape)}, {},
                           scalars, sizes)(cond)
        value = torch.broadcast_to(torch.as_tensor(value, device=device),
                                   (block_m, *token.shape))
        hit = (value & valid & row_in.view(-1, 1, 1)).any(dim=2).any(dim=0)
        whole = (value | ~row_in.view(-1, 1, 1)).all(dim=0).all(dim=1) & valid.all(dim=1)
        return origin[hit & ~whole], origin[hit & whole], token[hit][valid[hit]]

    for n, rb in enumerate(chosen):
        row_token, row_in = _tokens(rb * block_m + torch.arange(block_m, device=device), rows,
                                    row_tiling)
        value = MaskEvaluator({**grids0, row.uid: row_token.view(-1, 1),
                            col.uid: keys.view(1, -1)}, {}, scalars, sizes)(cond)
        seen = (torch.as_tensor(value, device=device) & row_in.view(-1, 1)).any(dim=0)
        if not bool(seen.any()):
            continue
        row_at = torch.stack(windows.coordinates(row_token[row_in]), dim=1)
        placements = ([], [])   # windows from each box's corner; on a grid through the queries
        for res in torch.unique(residue[seen], dim=0):
            mine = at[seen & (residue == res).all(dim=1)]
            lo, hi = mine.min(dim=0).values, mine.max(dim=0).values
            anchor = row_at.min(dim=0).values
            anchor = anchor + (res - anchor) % dil
            through = anchor - (anchor - lo + step - 1) // step * step
            # a grid through the queries that would start before the map's edge starts at the
            # box instead (a negative coordinate would wrap into another row of the map)
            through = torch.where(through < 0, lo, through)
            for made, start in zip(placements, (lo, through)):
                axes = [torch.arange(int(start[k]), int(hi[k]) + 1, int(step[k]), device=device)
                        for k in range(len(windows.dims))]
                corners = torch.cartesian_prod(*axes).view(-1, len(axes))
                made.append(windows.token(list(corners.unbind(dim=1))))
        best = None
        for made in placements:
            part, full, held = classify(torch.cat(made), row_token, row_in)
            cost = part.numel() * PARTIAL_COST + full.numel()
            if best is None or cost < best[0]:
                best = (cost, part, full, held)
        _, part, full, held = best
        _check_covered(held, seen)
        partial_n[n], full_n[n] = part.numel(), full.numel()
        partial_at[n, :part.numel()] = part.to(torch.int32).cpu()
        full_at[n, :full.numel()] = full.to(torch.int32).cpu()
    if row_blocks is not None:
        return partial_n, full_n
    total = math.prod(extent(a) for a in batch) if batch else 1
    out = [partial_n, partial_at, full_n, full_at]
    return tuple(t.repeat(total, *([1] * (t.dim() - 1))).contiguous().to(device) for t in out)
