"""Small cases of the block-sparse and strided-neighbourhood kernels with float64 references made
from the masks' definitions (not from the DSL): inputs, scalars and the expected output."""
from __future__ import annotations

import torch


def _attend(q, k, v, keep, scale):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v.double()


def block_sparse_case(generator, S: int = 70, layout_block: int = 32):
    """``block_sparse_attention`` (blocks of ``LAYOUT_BLOCK``; here its kernel made for
    ``layout_block``): a random layout with its diagonal kept, a ragged length."""
    from tests.schedule_templates.test_block_sparse import kernel_for_block, random_layout

    blocks = -(-S // layout_block)
    layout = random_layout(blocks, generator)
    keep = layout.repeat_interleave(layout_block, 0).repeat_interleave(layout_block, 1)
    keep = keep[:S, :S].bool()
    q, k, v = (4.0 * torch.randn(1, 2, S, 16, generator=generator) for _ in range(3))
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    scale = 16 ** -0.5
    return kernel_for_block(layout_block), dict(q=q, k=k, v=v, layout=layout), \
        dict(scale=scale), _attend(q, k, v, keep, scale)


def strided_case(generator, width: int = 9, rows: int = 7, radius: int = 1, stride: int = 2):
    """``strided_neighborhood_2d`` on a map whose sides the stride does not divide."""
    from tests.schedule_templates.test_strided_neighborhood import keep, strided_neighborhood_2d

    S = width * rows
    q, k, v = (4.0 * torch.randn(1, 2, S, 16, generator=generator) for _ in range(3))
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    scale = 16 ** -0.5
    return strided_neighborhood_2d, dict(q=q, k=k, v=v), \
        dict(scale=scale, width=width, radius=radius, stride=stride), \
        _attend(q, k, v, keep(width, radius, stride, S), scale)
