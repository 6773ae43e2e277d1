"""The library's row and attention kernels at the sizes a template's tiles meet last: rows of
one to three elements, a single row, widths one past a power of two, attention over one key or
one query, a head dim of 8, causal attention with more keys than queries — on fresh inputs
(:func:`tensorfuse.inputs.random_inputs`) against the library's float64 NumPy references
(:mod:`tensorfuse.kernels.reference`), outputs poisoned: through Triton's interpreter as
``tf.compile`` makes them for sm_90a (this module's ``__main__``), the CPU target and the GPU.

    TRITON_INTERPRET=1 python -m tests.schedule_templates.edge_sizes_check SEED
"""
import numpy as np
import torch

import tensorfuse.kernels as K
from tensorfuse.inputs import random_inputs
from tensorfuse.interop import torch_dtype
from tensorfuse.kernels.reference import reference
from tests.helpers import poisoned_main
from tests.schedule_templates.staged_floor import interpreted


def _case(kernel, **sizes):
    """``case(generator)`` for the checks: ``kernel``'s inputs at ``sizes`` as torch tensors
    and its float64 reference."""
    def case(g):
        rng = np.random.default_rng(int(torch.randint(2**31, (1,), generator=g)))
        tensors, scalars = random_inputs(kernel, sizes, rng, real_tensor=lambda shape, dtype: (
            torch.randn(shape, generator=g) * 3).to(torch_dtype(dtype)))
        args = {n: torch.as_tensor(x) for n, x in tensors.items()}
        want = reference(kernel, {n: x.double().numpy() if x.is_floating_point() else x.numpy()
                                  for n, x in args.items()}, scalars)
        return {**args, **scalars}, torch.from_numpy(np.asarray(want, np.float64))
    return (kernel, case)


CASES = {
    "softmax_width_1": _case(K.softmax, M=5, N=1),
    "softmax_width_3": _case(K.softmax, M=7, N=3),
    "softmax_one_row": _case(K.softmax, M=1, N=1000),
    "softmax_width_257": _case(K.softmax, M=9, N=257),
    "softmax_width_4097": _case(K.softmax, M=3, N=4097),
    "log_softmax_width_2": _case(K.log_softmax, M=6, N=2),
    "layernorm_width_2": _case(K.layernorm, M=4, N=2),
    "layernorm_width_129": _case(K.layernorm, M=3, N=129),
    "rmsnorm_width_1": _case(K.rmsnorm, M=4, N=1),
    "rmsnorm_width_1025": _case(K.rmsnorm, M=2, N=1025),
    "cross_entropy_vocab_1": _case(K.cross_entropy, M=4, V=1),
    "cross_entropy_vocab_3": _case(K.cross_entropy, M=5, V=3),
    "cross_entropy_one_row": _case(K.cross_entropy, M=1, V=5000),
    "attention_one_key": _case(K.attention, B=1, H=2, M=5, N=1, D=32),
    "attention_one_query": _case(K.attention, B=2, H=1, M=1, N=77, D=32),
    "attention_d8": _case(K.attention, B=1, H=2, M=19, N=23, D=8),
    "causal_one_query": _case(K.causal_attention, B=1, H=2, M=1, N=40, D=16),
    "causal_more_keys": _case(K.causal_attention, B=1, H=1, M=9, N=70, D=16),
    "causal_square_odd": _case(K.causal_attention, B=2, H=1, M=33, N=33, D=16),
}


if __name__ == "__main__":
    poisoned_main(CASES, lambda name, kernel: interpreted(kernel))
