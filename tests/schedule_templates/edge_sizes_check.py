"""The library's row and attention kernels at the sizes a template's tiles meet last: rows of
one to three elements, a single row, widths one past a power of two, attention over one key or
one query, a head dim of 8, causal attention with fewer keys than queries' last rows need —
against float64 torch references, outputs poisoned: through Triton's interpreter as
``tf.compile`` makes them for sm_90a (this module's ``__main__``) and through the CPU target.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.edge_sizes_check SEED
"""
import torch

import tensorfuse.kernels as K
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


def _bf16(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).bfloat16()


def _softmax_case(M, N):
    def case(g):
        x = _bf16(g, M, N, scale=3.0)
        return dict(x=x), torch.softmax(x.double(), -1)
    return case


def _log_softmax_case(M, N):
    def case(g):
        x = _bf16(g, M, N, scale=3.0)
        return dict(x=x), torch.log_softmax(x.double(), -1)
    return case


def _layernorm_case(M, N):
    def case(g):
        x, w, b = _bf16(g, M, N, scale=2.0) + 1, _bf16(g, N), _bf16(g, N)
        return dict(x=x, weight=w, bias=b, eps=1e-5), torch.nn.functional.layer_norm(
            x.double(), (N,), w.double(), b.double(), 1e-5)
    return case


def _rmsnorm_case(M, N):
    def case(g):
        x, w = _bf16(g, M, N, scale=2.0), _bf16(g, N)
        xd = x.double()
        return dict(x=x, weight=w, eps=1e-5), \
            xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    return case


def _cross_entropy_case(M, V):
    def case(g):
        x = _bf16(g, M, V, scale=3.0)
        t = torch.randint(0, V, (M,), generator=g, dtype=torch.int32)
        return dict(logits=x, target=t), torch.nn.functional.cross_entropy(
            x.double(), t.long(), reduction="none")
    return case


def _attention_case(B, H, M, N, D, causal=False):
    def case(g):
        q, k, v = _bf16(g, B, H, M, D), _bf16(g, B, H, N, D), _bf16(g, B, H, N, D)
        s = q.double() @ k.double().transpose(-1, -2) * D ** -0.5
        if causal:   # aligned to the last keys, as the library's causal attention
            i = torch.arange(M)[:, None] + (N - M)
            s = s.masked_fill(torch.arange(N)[None, :] > i, float("-inf"))
        return dict(q=q, k=k, v=v, scale=D ** -0.5), torch.softmax(s, -1) @ v.double()
    return case


CASES = {
    "softmax_width_1": (K.softmax, _softmax_case(5, 1)),
    "softmax_width_3": (K.softmax, _softmax_case(7, 3)),
    "softmax_one_row": (K.softmax, _softmax_case(1, 1000)),
    "softmax_width_257": (K.softmax, _softmax_case(9, 257)),
    "softmax_width_4097": (K.softmax, _softmax_case(3, 4097)),
    "log_softmax_width_2": (K.log_softmax, _log_softmax_case(6, 2)),
    "layernorm_width_2": (K.layernorm, _layernorm_case(4, 2)),
    "layernorm_width_129": (K.layernorm, _layernorm_case(3, 129)),
    "rmsnorm_width_1": (K.rmsnorm, _rmsnorm_case(4, 1)),
    "rmsnorm_width_1025": (K.rmsnorm, _rmsnorm_case(2, 1025)),
    "cross_entropy_vocab_1": (K.cross_entropy, _cross_entropy_case(4, 1)),
    "cross_entropy_vocab_3": (K.cross_entropy, _cross_entropy_case(5, 3)),
    "cross_entropy_one_row": (K.cross_entropy, _cross_entropy_case(1, 5000)),
    "attention_one_key": (K.attention, _attention_case(1, 2, 5, 1, 32)),
    "attention_one_query": (K.attention, _attention_case(2, 1, 1, 77, 32)),
    "attention_d8": (K.attention, _attention_case(1, 2, 19, 23, 8)),
    "causal_one_query": (K.causal_attention, _attention_case(1, 2, 1, 40, 16, True)),
    "causal_more_keys": (K.causal_attention, _attention_case(1, 1, 9, 70, 16, True)),
    "causal_square_odd": (K.causal_attention, _attention_case(2, 1, 33, 33, 16, True)),
}


if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
